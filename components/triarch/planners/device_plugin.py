"""Helm values for the NVIDIA device plugin: only on GPU nodes, tolerating their taint, GFD on, time-slicing.

Every key set here exists in the chart's values.yaml (0.20.0); a test holds that against the upstream file.
"""

from __future__ import annotations

from typing import Any

import yaml

from triarch.planners.nodegroups import PoolPlan, device_plugin_config_name
from triarch.scheduling import GPU_PRESENT_LABEL, GPU_RESOURCE, gpu_toleration

NAMESPACE = "nvidia-device-plugin"
RELEASE = "nvidia-device-plugin"
DEFAULT_CONFIG = "default"


def _time_slicing_config(replicas: int) -> str:
    """Each GPU advertised `replicas` times; a pod asking for more than one slice is refused rather than handed
    slices of one GPU it would mistake for several (failRequestsGreaterThanOne)."""
    config = {
        "version": "v1",
        "sharing": {"timeSlicing": {"failRequestsGreaterThanOne": True,
                                    "resources": [{"name": GPU_RESOURCE, "replicas": replicas}]}},
    }
    return yaml.safe_dump(config, sort_keys=False)


def device_plugin_values(pools: list[PoolPlan], image_tag: str, gpu_feature_discovery: bool) -> dict[str, Any]:
    gpu_nodes_only = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": GPU_PRESENT_LABEL, "operator": "In", "values": ["true"]}]},
        ]}},
    }
    values: dict[str, Any] = {
        "image": {"tag": image_tag},
        "affinity": gpu_nodes_only,
        "tolerations": [gpu_toleration(), {"key": "CriticalAddonsOnly", "operator": "Exists"}],
        "priorityClassName": "system-node-critical",
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "gfd": {"enabled": gpu_feature_discovery},
    }
    if gpu_feature_discovery:
        # GFD publishes its labels through node-feature-discovery: its worker must run on the tainted GPU nodes.
        values["nfd"] = {"worker": {"tolerations": [gpu_toleration()]}}
    if any(p.efa_interfaces for p in pools):
        # Since 0.19 the plugin mounts every /dev/infiniband/uverbs* into GPU pods unless told not to, which takes
        # the EFA plugin's devices (EKS User Guide, "Manage EFA devices on Amazon EKS").
        values["mofedEnabled"] = False
    sliced = [p for p in pools if p.time_slicing_replicas]
    if sliced:
        config_map = {DEFAULT_CONFIG: yaml.safe_dump({"version": "v1"})}
        for pool in sliced:
            assert pool.time_slicing_replicas is not None
            config_map[device_plugin_config_name(pool.name)] = _time_slicing_config(pool.time_slicing_replicas)
        values["config"] = {"map": config_map, "default": DEFAULT_CONFIG}
    return values
