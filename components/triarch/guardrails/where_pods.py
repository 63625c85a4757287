"""Where, for the pods: the Kubernetes scheduling a GPU workload asks for. Replicas spread over zones, accelerators
come through limits, NVIDIA pods tolerate the GPU taint, accelerator pods select their nodes, and none selects a
driver by a moving name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from triarch.guardrails.base import Config, Resource, rule
from triarch.guardrails.common import gpu_templates
from triarch.guardrails.workloads import (
    LWS_KIND,
    containers,
    gpu_count,
    is_vllm,
    kind_of,
    llm_configs,
    nvidia_gpu_count,
    pod_templates,
    required_node_terms,
)
from triarch.scheduling import GPU_TAINT_EFFECT, GPU_TAINT_KEY, POOL_LABEL

ZONE = "topology.kubernetes.io/zone"


def _largest_ray_replica(resource: Resource) -> int:
    """GPUs of the largest Ray Serve model replica of a RayService (tensor x pipeline parallel), 0 without one."""
    sizes = [int((llm.get("engine_kwargs") or {}).get("tensor_parallel_size", 1) or 1)
             * int((llm.get("engine_kwargs") or {}).get("pipeline_parallel_size", 1) or 1)
             for _, llm in llm_configs(resource.props)]
    return max(sizes, default=0)


def zone_spread(resource: Resource, config: Config) -> list[str]:
    limit = int(config["maxSkew"])
    messages = []
    largest = _largest_ray_replica(resource)
    for template in gpu_templates(resource):
        if template.replicas < 2 or template.ray_head:
            continue
        if kind_of(resource.type) == LWS_KIND and template.where.endswith(" workers"):
            continue  # a group's workers are stages of one replica, placed together; the leaders spread
        pod_gpus = max((gpu_count(c) or 0 for c in containers(template.spec)), default=0)
        if template.ray and largest > pod_gpus:
            continue  # these workers are pipeline stages of one replica: spreading them splits the replica
        spreads = [c for c in template.spec.get("topologySpreadConstraints") or [] if c.get("topologyKey") == ZONE]
        if not spreads:
            messages.append(f"{template.where}: {template.replicas} GPU replicas with no topologySpreadConstraint on "
                            f"{ZONE}; add one with maxSkew <= {limit} and whenUnsatisfiable DoNotSchedule")
        elif any(int(c.get("maxSkew", 1)) > limit for c in spreads):
            messages.append(f"{template.where}: zone spread maxSkew above {limit}; set maxSkew <= {limit}")
        elif not any(c.get("whenUnsatisfiable") == "DoNotSchedule" for c in spreads):
            messages.append(f"{template.where}: {template.replicas} GPU replicas spread over zones only with "
                            "ScheduleAnyway, which a pool scaling from zero defeats; set whenUnsatisfiable "
                            "DoNotSchedule (and minDomains: the zones the replicas may use)")
    return messages


GPU_ZONE_SPREAD = rule(
    "gpu-zone-spread", "Kubernetes",
    "Replicated GPU workloads spread over zones with DoNotSchedule, so one zone's outage or GPU shortage leaves "
    "replicas serving. ScheduleAnyway is not enough: when a pool scales from zero the scheduler sees only the "
    "first node's zone, and every replica lands there. Per model replica: the workers of one LeaderWorkerSet group "
    "or the pipeline stages of one Ray Serve replica stay together. (A one-zone cluster sets this advisory.)",
    zone_spread, config={"maxSkew": {"type": "integer", "minimum": 1, "default": 1}})


def gpu_limits(resource: Resource, config: Config) -> list[str]:
    messages = []
    for template in pod_templates(resource.type, resource.props, resource.name):
        for c in containers(template.spec):
            limit, request = gpu_count(c, "limits"), gpu_count(c, "requests")
            if request is not None and limit is None:
                messages.append(f"{template.where} container {c.get('name')}: an accelerator requested but not "
                                "limited; set it under resources.limits (nvidia.com/gpu, amd.com/gpu, ...)")
            elif request is not None and limit is not None and request != limit:
                messages.append(f"{template.where} container {c.get('name')}: accelerator request {request} != "
                                f"limit {limit}; make them equal")
            elif limit == 0 and is_vllm(c):
                messages.append(f"{template.where} container {c.get('name')}: a vLLM server without GPUs; set "
                                "resources.limits['nvidia.com/gpu']")
    return messages


GPU_LIMITS = rule(
    "gpu-limits", "Kubernetes",
    "Accelerators (nvidia.com/gpu, amd.com/gpu, aws.amazon.com/neuron*, google.com/tpu) are only scheduled "
    "through limits, and a request different from the limit is rejected or misleading: a device plugin cannot "
    "overcommit.",
    gpu_limits)


def _tolerates_gpu_taint(pod: Mapping[str, Any]) -> bool:
    for toleration in pod.get("tolerations") or []:
        if toleration.get("operator") == "Exists" and not toleration.get("key"):
            return True
        if toleration.get("key") == GPU_TAINT_KEY and toleration.get("effect") in (None, "", GPU_TAINT_EFFECT):
            return True
    return False


GKE_LABEL_PREFIX = "cloud.google.com/gke-"
"""Pods selecting GKE node labels run on GKE, whose ExtendedResourceToleration admission adds the GPU toleration."""


def gpu_scheduling(resource: Resource, config: Config) -> list[str]:
    if not config["requireToleration"]:
        return []
    return [f"{template.where}: requests NVIDIA GPUs but does not tolerate the {GPU_TAINT_KEY}:{GPU_TAINT_EFFECT} "
            f"taint; add a toleration for key {GPU_TAINT_KEY}"
            for template in gpu_templates(resource) if any((nvidia_gpu_count(c) or 0) > 0 for c in containers(
                template.spec)) and not _tolerates_gpu_taint(template.spec) and not _on_gke(template.spec)]


GPU_SCHEDULING = rule(
    "gpu-scheduling", "Kubernetes",
    "NVIDIA GPU pods must tolerate the GPU nodes' nvidia.com/gpu taint where the nodes carry it (Triarch's pools, "
    "EKS's GPU node groups), else they stay Pending. Advisory by default, since untainted GPU nodes need none "
    "(Triarch's own stacks make it mandatory); pods selecting GKE labels are exempt (GKE adds the toleration); "
    "requireToleration false turns it off on platforms that add it.",
    gpu_scheduling, enforcement="advisory", config={"requireToleration": {"type": "boolean", "default": True}})


def _on_gke(pod: Mapping[str, Any]) -> bool:
    keys = set(pod.get("nodeSelector") or {})
    for term in required_node_terms(pod):
        keys |= {str(e.get("key")) for e in term.get("matchExpressions") or []}
    return any(k.startswith(GKE_LABEL_PREFIX) for k in keys)


def gpu_node_selection(resource: Resource, config: Config) -> list[str]:
    return [f"{template.where}: requests accelerators without selecting their nodes; add a nodeSelector or a "
            f"required node affinity (e.g. {POOL_LABEL}, nvidia.com/gpu.product, node.kubernetes.io/instance-type)"
            for template in gpu_templates(resource) if not _selects_nodes(template.spec)]


GPU_NODE_SELECTION = rule(
    "gpu-node-selection", "Kubernetes",
    "Accelerator pods should select their nodes (a pool, a GPU product, an instance type, any label), else they "
    "may land on another GPU model than the one their engine args were sized for. Advisory: a cluster with one "
    "kind of GPU node needs no selector.",
    gpu_node_selection, enforcement="advisory")


def _selects_nodes(pod: Mapping[str, Any]) -> bool:
    return bool(pod.get("nodeSelector")) or bool(required_node_terms(pod))


FLOATING_DRIVER_SELECTORS = {"cloud.google.com/gke-gpu-driver-version": ("latest", "default")}
"""Node labels that pick a driver by a moving name (GKE installs the newest or the default driver it has)."""


def pinned_gpu_driver(resource: Resource, config: Config) -> list[str]:
    messages = []
    for template in gpu_templates(resource):
        selector = template.spec.get("nodeSelector") or {}
        for key, moving in FLOATING_DRIVER_SELECTORS.items():
            if str(selector.get(key)) in moving:
                messages.append(f"{template.where}: nodeSelector {key}: {selector.get(key)} floats with the "
                                "platform; pin a driver version the image's CUDA is checked against")
    return messages


PINNED_GPU_DRIVER = rule(
    "pinned-gpu-driver", "Kubernetes",
    "A pod that selects nodes by a moving driver name (GKE's gke-gpu-driver-version: latest) gets whatever driver "
    "the platform ships that day: a new driver can break the serving image's CUDA (the forward-compatibility "
    "trap). Pin the driver version the image was checked against.",
    pinned_gpu_driver)
