"""The GPU scheduling contract: label keys and the taint shared by node groups, workloads and policies.

Kubernetes decides *where* a replica runs from these. Node groups set them, the device plugin and every GPU
workload select and tolerate them, and the policy pack checks them; nothing else spells these strings.
"""

import json
from collections.abc import Mapping
from typing import Any, Final

GPU_PRESENT_LABEL: Final = "nvidia.com/gpu.present"
"""Set to "true" on GPU nodes at creation; the device plugin chart's default affinity also keys on it."""

POOL_LABEL: Final = "triarch.dev/pool"
"""The Triarch node group a node belongs to (EKS node group, or a declared pool of existing nodes)."""

SYSTEM_POOL: Final = "system"
"""The pool name of a created cluster's CPU nodes (add-ons, operators, Ray heads)."""

GPU_LABEL: Final = "triarch.dev/gpu"
"""The GPU catalog key (e.g. "l4", "a100-80gb"); present from boot, unlike GPU feature discovery's labels."""

DEVICE_PLUGIN_CONFIG_LABEL: Final = "nvidia.com/device-plugin.config"
"""Selects a named device plugin config (e.g. time-slicing) for the node; read by the plugin's config manager."""

GPU_RESOURCE: Final = "nvidia.com/gpu"
"""The extended resource the device plugin advertises."""

GPU_TAINT_KEY: Final = "nvidia.com/gpu"
GPU_TAINT_VALUE: Final = "present"
"""The value the device plugin chart's node-feature-discovery worker tolerates by default."""
GPU_TAINT_EFFECT: Final = "NoSchedule"

CAPACITY_TYPE_LABEL: Final = "karpenter.sh/capacity-type"
RESERVED_CAPACITY: Final = "reserved"
"""Karpenter's capacity type of a node launched into a capacity reservation (sigs.k8s.io/karpenter v1.14.1,
pkg/apis/v1/labels.go CapacityTypeReserved): with the ReservedCapacity feature gate, on by default in 1.14.1
(pkg/operator/options/options.go), a NodePool that allows it beside on-demand fills its reservations first."""
RESERVED_NODES_ANNOTATION: Final = "triarch.dev/reserved-nodes"
"""On a NodePool: the instances its reservations hold, where the stack gives every reservation's count, so the
placement proof (which reads the plan alone) counts reserved nodes apart."""


def gpu_node_labels(pool: str, gpu: str) -> dict[str, str]:
    """Labels every GPU node of a pool carries."""
    return {GPU_PRESENT_LABEL: "true", POOL_LABEL: pool, GPU_LABEL: gpu}


def gpu_taint() -> dict[str, str]:
    """The taint in Kubernetes form (a node's spec.taints entry)."""
    return {"key": GPU_TAINT_KEY, "value": GPU_TAINT_VALUE, "effect": GPU_TAINT_EFFECT}


def gpu_toleration() -> dict[str, str]:
    """The toleration GPU pods carry: matches the taint whatever its value."""
    return {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": GPU_TAINT_EFFECT}


EFA_RESOURCE: Final = "vpc.amazonaws.com/efa"
"""What the EFA device plugin advertises (one per interface), and Karpenter's capacity of an EFA instance type."""

ACCELERATOR_RESOURCE_PREFIX: Final = "accelerator_type:"
"""Ray's resource naming a node's accelerator type, which a Serve replica's accelerator_type asks for."""


def ray_start_resources(accelerator: str) -> str:
    """A worker group's rayStartParams.resources advertising its accelerator type: a JSON object in quotes, as
    KubeRay and the autoscaler parse it."""
    return '"' + json.dumps({f"{ACCELERATOR_RESOURCE_PREFIX}{accelerator}": 1}).replace('"', '\\"') + '"'


def read_ray_start_resources(params: Any) -> dict[str, Any]:
    """The custom Ray resources of a worker group's rayStartParams (ray_start_resources' form); {} where it is not
    that."""
    text = str(params.get("resources", "")) if isinstance(params, Mapping) else ""
    try:
        found = json.loads(text.strip().strip('"').replace('\\"', '"')) if text else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}
