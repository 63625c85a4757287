"""The serving layers as Pulumi components: the namespace and token (where), the KubeRay operator and the
RayService (how), one vLLM server per model (when). Each registers what its planner returned."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from triarch.catalog import Chart
from triarch.components.manifests import register
from triarch.planners import pods
from triarch.planners.models import ModelPlan
from triarch.planners.ray import ray_manifests
from triarch.planners.serving import KUBERAY_NAMESPACE, network_policies
from triarch.planners.vllm import vllm_manifests
from triarch.scheduling import POOL_LABEL


def kuberay_values(system_pool: str | None) -> dict[str, Any]:
    """Operator on CPU nodes with its resources fixed; every key exists in the chart's values.yaml (1.7.0).

    Only limits: the chart's values declare no `requests`, and Kubernetes sets requests equal to limits.
    """
    values: dict[str, Any] = {"resources": {"limits": {"cpu": "500m", "memory": "512Mi"}}}
    if system_pool is not None:
        values["nodeSelector"] = {POOL_LABEL: system_pool}
    return values


class ServingNamespace(pulumi.ComponentResource):
    def __init__(self, name: str, settings: pods.ServingSettings, hf_token: pulumi.Output[str] | None,
                 with_ray: bool, provider: k8s.Provider, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:serving:ServingNamespace", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        self.namespace = register(pods.namespace(settings.namespace, "restricted",
                                                 "inference pods run as non-root with no added capabilities"), child)
        in_namespace = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[self.namespace])
        self.network_policies = [register(p, in_namespace) for p in network_policies(settings, with_ray)]
        self.token: k8s.core.v1.Secret | None = None
        if hf_token is not None:
            self.token = k8s.core.v1.Secret(
                f"{name}-hf-token", metadata={"name": pods.HF_TOKEN_SECRET, "namespace": settings.namespace},
                type="Opaque", string_data={pods.HF_TOKEN_KEY: hf_token},
                opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[self.namespace]))
        self.register_outputs({"namespace": settings.namespace})


class KubeRayOperator(pulumi.ComponentResource):
    def __init__(self, name: str, chart: Chart, system_pool: str | None, provider: k8s.Provider,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:ray:KubeRayOperator", name, None, opts)
        self.namespace = register(pods.namespace(KUBERAY_NAMESPACE, "restricted",
                                                 "the operator runs non-root, read-only, with no capabilities"),
                                  pulumi.ResourceOptions(parent=self, provider=provider))
        # The chart installs the RayService/RayCluster CRDs; Ray resources depend on this release.
        self.release = k8s.helm.v3.Release(
            name, name=chart.name, chart=chart.name, version=chart.version,
            repository_opts={"repo": chart.repository}, namespace=KUBERAY_NAMESPACE, create_namespace=False,
            atomic=True, cleanup_on_fail=True, values=kuberay_values(system_pool),
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[self.namespace]))
        self.register_outputs({"status": self.release.status})


class VllmServer(pulumi.ComponentResource):
    def __init__(self, name: str, plan: ModelPlan, settings: pods.ServingSettings, provider: k8s.Provider,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:vllm:VllmServer", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        self.objects = [register(obj, child) for obj in vllm_manifests(plan, settings)]
        self.register_outputs({"model": plan.config.model})


class RayServing(pulumi.ComponentResource):
    def __init__(self, name: str, plans: list[ModelPlan], image: str, settings: pods.ServingSettings,
                 operator: KubeRayOperator, provider: k8s.Provider, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:ray:RayServing", name, None, opts)
        after_operator = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[operator.release])
        self.objects = [register(obj, after_operator) for obj in ray_manifests(plans, image, settings)]
        self.register_outputs({"models": [p.name for p in plans if p.config.engine == "ray-serve"]})
