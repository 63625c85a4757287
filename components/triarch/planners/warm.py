"""Warm capacity: GPU nodes kept up for a model's next replica, so a scale-up or a replacement skips the node's
launch. Kubernetes decides *where* that capacity sits; the model's own pods take it when they come.

Two ways, by what brings the pool's nodes up:
- Karpenter 1.14 (the release Triarch installs on a created cluster): a CapacityBuffer over a PodTemplate shaped
  like one of the model's pods. Karpenter keeps room for the template's virtual pods (never created in the API),
  launches nodes for them and does not consolidate a node it keeps for them; a real pod that needs the room takes
  it, and Karpenter launches the next. Alpha, behind the controller's CapacityBuffer feature gate. The node is up,
  but nothing pulled the image on it.
- Any other autoscaler (an adopted cluster's Karpenter of an unknown release, cluster-autoscaler): placeholder pods
  of a negative priority, shaped the same and running the model's image (which pulls it). The scheduler preempts
  them for any pod of the default priority; the autoscaler then launches a node for the evicted placeholder.
"""

from __future__ import annotations

from typing import Any, Literal

from triarch.config import StackConfig, pool_provisioner
from triarch.planners import pods
from triarch.planners.model_plan import ModelPlan
from triarch.planners.models import pod_resources
from triarch.scheduling import POOL_LABEL, gpu_toleration

PRIORITY_CLASS = "triarch-warm-capacity"
PLACEHOLDER_PRIORITY = -10
"""Below every pod of the default priority (0), so any of them preempts a placeholder; close to it, because
Karpenter counts a node holding only pods of a priority far below zero as empty and would remove it (research on
Karpenter 1.14.1's disruption: a node of placeholders at about -33.5 million counts as empty)."""
BUFFER_API = "autoscaling.x-k8s.io/v1beta1"
"""The version Karpenter 1.14.1's CapacityBuffer CRD serves (its docs still say v1alpha1)."""
WARM_LABEL = "triarch.dev/warm-for"

Strategy = Literal["buffer", "placeholder"]


def strategy(stack: StackConfig, plan: ModelPlan) -> Strategy:
    """A CapacityBuffer where Triarch's own Karpenter brings the pool's nodes, placeholder pods elsewhere."""
    karpenter = pool_provisioner(stack.cluster, stack.node_group(plan.pool.name)) == "karpenter"
    return "buffer" if karpenter and stack.cluster.create else "placeholder"


def warm_name(plan: ModelPlan) -> str:
    return f"{plan.name}-warm"


def chunks(plan: ModelPlan) -> int:
    """Pods of warm capacity: one per node of each warm replica (a replica across nodes is a pod per node)."""
    return plan.config.warm_replicas * plan.nodes_per_replica


def _pod(plan: ModelPlan, placeholder: bool, settings: pods.ServingSettings) -> dict[str, Any]:
    """One chunk: the model pod's requests on its pool. A placeholder sleeps in the model's image (so the node pulls
    it, with the registry's pull Secret where the model's pods have it) and leaves at once when preempted."""
    container: dict[str, Any] = {
        "name": "warm", "image": plan.image, "resources": pod_resources(plan),
        "securityContext": pods.container_security(read_only_root=True),
    }
    spec: dict[str, Any] = {
        "nodeSelector": {POOL_LABEL: plan.pool.name},
        "tolerations": [gpu_toleration()],
        "automountServiceAccountToken": False,
        "securityContext": pods.pod_security(),
        **pods.pull_secrets(settings),
        "containers": [container],
    }
    if placeholder:
        container["command"] = ["sleep", "infinity"]
        spec.update(priorityClassName=PRIORITY_CLASS, terminationGracePeriodSeconds=0)
    labels = {WARM_LABEL: plan.name, "app.kubernetes.io/name": "warm-capacity", **pods.MANAGED_BY}
    return {"metadata": {"labels": labels}, "spec": spec}


def priority_class() -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": PRIORITY_CLASS, "labels": dict(pods.MANAGED_BY)},
            "value": PLACEHOLDER_PRIORITY, "globalDefault": False, "preemptionPolicy": "Never",
            "description": "Triarch's warm-capacity placeholders: any serving pod preempts them."}


def warm_manifests(stack: StackConfig, plan: ModelPlan, settings: pods.ServingSettings) -> list[dict[str, Any]]:
    """The objects that keep a model's warm capacity (none without warmReplicas). Like the model's own workload,
    they say the release a mirrored or digest-pinned image is (triarch.dev/image-release)."""
    if not plan.config.warm_replicas:
        return []
    name, namespace = warm_name(plan), settings.namespace
    labels = {WARM_LABEL: plan.name, **pods.MANAGED_BY}
    release = pods.image_release(plan.image, plan.release)
    if strategy(stack, plan) == "buffer":
        template = {"apiVersion": "v1", "kind": "PodTemplate",
                    "metadata": {"name": name, "namespace": namespace, "labels": labels,
                                 **({"annotations": release} if release else {})},
                    "template": _pod(plan, placeholder=False, settings=settings)}
        buffer = {"apiVersion": BUFFER_API, "kind": "CapacityBuffer",
                  "metadata": {"name": name, "namespace": namespace, "labels": labels},
                  "spec": {"podTemplateRef": {"name": name}, "replicas": chunks(plan)}}
        return [template, buffer]
    pod = _pod(plan, placeholder=True, settings=settings)
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels,
                     # Placeholders are never awaited: a pool at its limit leaves them Pending, by design.
                     "annotations": {"pulumi.com/skipAwait": "true", **release, **pods.scanner_exceptions(plan.image)}},
        "spec": {"replicas": chunks(plan), "selector": {"matchLabels": {WARM_LABEL: plan.name}},
                 "template": pod},
    }
    return [deployment]


def uses_buffers(stack: StackConfig, models: list[ModelPlan]) -> bool:
    """Whether Karpenter's CapacityBuffer feature gate must be on."""
    return any(m.config.warm_replicas and strategy(stack, m) == "buffer" for m in models)


def uses_placeholders(stack: StackConfig, models: list[ModelPlan]) -> bool:
    return any(m.config.warm_replicas and strategy(stack, m) == "placeholder" for m in models)
