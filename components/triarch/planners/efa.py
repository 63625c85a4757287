"""EFA between the nodes of a replica across nodes: the EFA device plugin, which advertises each EFA pool node's
interfaces as vpc.amazonaws.com/efa (Karpenter attaches as many as a pod asks for), and what else a node needs.
The pods' side is in planners/models (their requests) and the node classes' in planners/karpenter."""

from __future__ import annotations

from typing import Any

from triarch.catalog import carries_efa_libraries
from triarch.config import StackConfig
from triarch.disaggregation import facts as pd_facts
from triarch.planners import pods
from triarch.planners.model_plan import ModelPlan
from triarch.planners.models import uses_efa
from triarch.planners.nodegroups import PoolPlan
from triarch.scheduling import POOL_LABEL, gpu_toleration

EFA_CHART = "aws-efa-k8s-device-plugin"
EFA_RELEASE = "aws-efa-k8s-device-plugin"
EFA_NAMESPACE = "aws-efa"
EKS_IMAGE_ACCOUNT = "602401143452"
"""EKS's ECR account for its add-on images in the commercial regions outside the opt-in ones (EKS User Guide,
"View Amazon container image registries for Amazon EKS add-ons")."""
OPT_IN_REGIONS = {"af-south-1": "877085696533", "ap-east-1": "800184023465"}
"""Regions whose EKS images live in another account (same page); the others Triarch prices use the one above."""


def efa_pools(pools: list[PoolPlan]) -> list[PoolPlan]:
    return [p for p in pools if p.efa_interfaces]


def efa_namespace() -> dict[str, Any]:
    return pods.namespace(EFA_NAMESPACE, "privileged",
                          "the EFA device plugin runs privileged on the host network as its chart ships it "
                          "(v0.5.16+: it reads the GPU and EFA topology to allocate close interfaces), with the "
                          "device-plugin socket and /dev/infiniband mounted from the host")


def efa_repository(stack: StackConfig) -> str:
    """The device plugin's image repository in the stack's region (EKS keeps a copy per region)."""
    region = stack.aws_region or "us-west-2"
    account = OPT_IN_REGIONS.get(region, EKS_IMAGE_ACCOUNT)
    return f"{account}.dkr.ecr.{region}.amazonaws.com/eks/aws-efa-k8s-device-plugin"


def efa_values(stack: StackConfig, pools: list[PoolPlan]) -> dict[str, Any]:
    """Only on the EFA pools' nodes (the chart's affinity on the pool label), tolerating their GPU taint, the image
    from the stack's region. Every key exists in the chart's values.yaml (v0.5.30)."""
    return {
        "image": {"repository": efa_repository(stack)},
        "supportedInstanceLabels": {"keys": [POOL_LABEL], "values": sorted(p.name for p in efa_pools(pools))},
        "tolerations": [gpu_toleration()],
    }


def efa_image_warnings(stack: StackConfig, models: list[ModelPlan]) -> list[str]:
    """A replica across nodes over EFA, or a split's KV cache over UCX between EFA pools, whose image is not known
    to carry the EFA libraries: NCCL, or UCX, would use TCP between the nodes and say so only in its log (`triarch
    verify` reads NCCL's)."""
    pins = {"vllm": stack.images.vllm.image, "ray-serve": stack.images.ray_llm.image}
    found = []
    for plan in models:
        image = pins[plan.config.engine]
        carries = carries_efa_libraries(image)
        if plan.role == "decode" and plan.kv_over_efa and plan.kv_backend == pd_facts().default_backend \
                and not carries:
            found.append(f"model '{plan.name}' hands its KV cache between EFA pools over NIXL's {plan.kv_backend} "
                         f"backend, but {image} is not known to carry libefa (templates/compat/efa-images.yaml): "
                         f"{pd_facts().ucx_efa_library}; pin an image with the EFA installer as "
                         "triarch:images.rayLlm {image, release}")
        if plan.multi_node and uses_efa(plan) and not carries:
            key = "vllm" if plan.config.engine == "vllm" else "rayLlm"
            found.append(f"model '{plan.name}' spans {plan.nodes_per_replica} nodes over EFA on pool "
                         f"'{plan.pool.name}', but {image} is not known to carry libfabric and the aws-ofi-nccl "
                         "plugin (templates/compat/efa-images.yaml): NCCL would fall back to TCP between the nodes; "
                         f"pin an image with them as triarch:images.{key} {{image, release}}")
    return found
