"""What a GPU node group is: labels, taint, AMI pin, launch template and autoscaler hints, as plain data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from triarch.catalog import Catalog, Gpu
from triarch.config import NodeGroupConfig, StackConfig, gpu_of, gpus_per_node
from triarch.scheduling import (
    DEVICE_PLUGIN_CONFIG_LABEL,
    GPU_RESOURCE,
    GPU_TAINT_EFFECT,
    GPU_TAINT_KEY,
    GPU_TAINT_VALUE,
    POOL_LABEL,
    gpu_node_labels,
    gpu_taint,
)

EKS_TAINT_EFFECT = {"NoSchedule": "NO_SCHEDULE", "NoExecute": "NO_EXECUTE", "PreferNoSchedule": "PREFER_NO_SCHEDULE"}
"""The EKS API spells taint effects differently from Kubernetes."""

IMDS_HOP_LIMIT = 1
"""One hop: the node reaches the instance metadata service, pods (one hop further) do not."""


@dataclass(frozen=True)
class PoolPlan:
    """A GPU pool as every layer sees it, EKS-managed or existing."""

    name: str
    gpu: Gpu
    gpus_per_node: int
    schedulable_gpus_per_node: int
    """What the device plugin advertises: physical GPUs x time-slicing replicas."""
    labels: dict[str, str]
    taints: list[dict[str, str]]
    time_slicing_replicas: int | None


@dataclass(frozen=True)
class EksNodeGroupPlan:
    pool: PoolPlan
    node_group_name: str
    instance_type: str
    ami_type: str
    release_version: str
    nvidia_driver: str
    capacity_type: str
    min: int
    max: int
    zones: list[str]
    launch_template: dict[str, Any]
    autoscaler_tags: dict[str, str] = field(default_factory=dict)

    @property
    def eks_taints(self) -> list[dict[str, str]]:
        return [{**t, "effect": EKS_TAINT_EFFECT[t["effect"]]} for t in self.pool.taints]


def plan_pool(group: NodeGroupConfig, facts: Catalog) -> PoolPlan:
    gpu_key = gpu_of(group, facts)
    labels = gpu_node_labels(group.name, gpu_key)
    replicas = group.time_slicing.replicas if group.time_slicing else None
    if replicas:
        labels[DEVICE_PLUGIN_CONFIG_LABEL] = device_plugin_config_name(group.name)
    per_node = gpus_per_node(group, facts)
    return PoolPlan(
        name=group.name,
        gpu=facts.gpus[gpu_key],
        gpus_per_node=per_node,
        schedulable_gpus_per_node=per_node * (replicas or 1),
        labels=labels,
        taints=[gpu_taint()] if group.taint else [],
        time_slicing_replicas=replicas,
    )


def device_plugin_config_name(pool: str) -> str:
    """The device plugin config entry a time-sliced pool selects through its node label."""
    return f"{pool}-time-slicing"


def launch_template(cluster: str, name: str, disk_gib: int) -> dict[str, Any]:
    """Launch template data (pulumi_aws argument names): IMDSv2 only, one hop, encrypted gp3 root volume.

    No image id: the managed node group picks the AMI from ami_type + release_version, so the pin stays visible
    to EKS (and to the matrix check) rather than hidden in an AMI id.
    """
    return {
        "metadata_options": {
            "http_endpoint": "enabled",
            "http_tokens": "required",
            "http_put_response_hop_limit": IMDS_HOP_LIMIT,
            "instance_metadata_tags": "disabled",
        },
        "block_device_mappings": [{
            "device_name": "/dev/xvda",
            "ebs": {"volume_size": disk_gib, "volume_type": "gp3", "encrypted": "true",
                    "delete_on_termination": "true"},
        }],
        "tag_specifications": [
            {"resource_type": kind, "tags": {"Name": f"{cluster}-{name}", POOL_LABEL: name}}
            for kind in ("instance", "volume")
        ],
    }


def autoscaler_tags(cluster: str, pool: PoolPlan) -> dict[str, str]:
    """Cluster-autoscaler node-template tags, so a group at zero nodes can still be chosen for a GPU pod.

    Managed node group tags do not reach the Auto Scaling group, so these are set on the ASG itself.
    """
    prefix = "k8s.io/cluster-autoscaler/node-template"
    tags = {
        "k8s.io/cluster-autoscaler/enabled": "true",
        f"k8s.io/cluster-autoscaler/{cluster}": "owned",
        f"{prefix}/resources/{GPU_RESOURCE}": str(pool.schedulable_gpus_per_node),
    }
    tags.update({f"{prefix}/label/{key}": value for key, value in pool.labels.items()})
    if pool.taints:
        tags[f"{prefix}/taint/{GPU_TAINT_KEY}"] = f"{GPU_TAINT_VALUE}:{GPU_TAINT_EFFECT}"
    return tags


def plan_eks_node_group(stack: StackConfig, group: NodeGroupConfig, facts: Catalog) -> EksNodeGroupPlan:
    assert group.instance_type is not None and group.ami_release is not None
    cluster = stack.cluster.name
    release = facts.amis[group.ami_type][group.ami_release]
    pool = plan_pool(group, facts)
    return EksNodeGroupPlan(
        pool=pool,
        node_group_name=f"{cluster}-{group.name}",
        instance_type=group.instance_type,
        ami_type=group.ami_type,
        release_version=release.release_versions[stack.cluster.kubernetes_version],
        nvidia_driver=release.nvidia_driver,
        capacity_type=group.capacity_type,
        min=group.min,
        max=group.max,
        zones=list(group.zones or stack.cluster.zones),
        launch_template=launch_template(cluster, group.name, group.disk_gib),
        autoscaler_tags=autoscaler_tags(cluster, pool),
    )


def node_patch(node: str, pool: PoolPlan) -> dict[str, Any]:
    """A server-side-apply patch that makes an existing node a member of the pool."""
    spec: dict[str, Any] = {"taints": pool.taints} if pool.taints else {}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": pool.labels}, "spec": spec}
