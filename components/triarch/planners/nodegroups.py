"""What a GPU pool is: labels, taint, AMI pin, instance shape and launch template, as plain data."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from triarch.catalog import Catalog, Gpu
from triarch.config import (
    NODE_GROUP_NAME_HASH,
    NodeGroupConfig,
    PoolProvisioner,
    StackConfig,
    gpu_of,
    gpus_per_node,
    pool_provisioner,
)
from triarch.scheduling import (
    DEVICE_PLUGIN_CONFIG_LABEL,
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
    zones: tuple[str, ...] | None
    """The zones the pool's nodes come up in; None where Triarch does not know (existing nodes)."""
    max_nodes: int
    efa_interfaces: int = 0
    """EFA interfaces a pod of a replica across nodes asks for (all of its node's); 0 where the pool has no EFA."""


@dataclass(frozen=True)
class EksPoolPlan:
    """A GPU pool of a created cluster, whatever brings its nodes up: a Karpenter NodePool or a managed node group."""

    pool: PoolPlan
    provisioner: PoolProvisioner
    node_group_name: str
    instance_type: str
    vcpus: int
    memory_gib: float
    ami_type: str
    ami_release: str
    release_version: str
    nvidia_driver: str
    capacity_type: str
    min: int
    max: int
    zones: list[str]
    disk_gib: int
    launch_template: dict[str, Any]
    placement_group: str | None = None
    """The cluster placement group Triarch creates for the pool (its name), where the stack asks for one."""

    @property
    def eks_taints(self) -> list[dict[str, str]]:
        return [{**t, "effect": EKS_TAINT_EFFECT[t["effect"]]} for t in self.pool.taints]


def plan_pool(stack: StackConfig, group: NodeGroupConfig, facts: Catalog) -> PoolPlan:
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
        zones=tuple(group.zones or stack.cluster.zones) if stack.cluster.create else (
            tuple(group.zones) if group.zones else None),
        max_nodes=group.max,
        efa_interfaces=facts.instances[group.instance_type].efa if group.efa and group.instance_type else 0,
    )


def managed_node_group_name(cluster: str, pool: str, *, instance_type: str, ami_type: str, capacity_type: str,
                            zones: list[str]) -> str:
    """`<cluster>-<pool>-<hash>`: the hash covers the inputs EKS cannot change in place (instance type, AMI type,
    capacity type, subnets by zone), so a change that replaces the group also renames it, and the new group is
    created before the old one goes instead of colliding with its name. Other edits keep the name."""
    forcing = "|".join([instance_type, ami_type, capacity_type, ",".join(sorted(zones))])
    return f"{cluster}-{pool}-{hashlib.sha256(forcing.encode()).hexdigest()[:NODE_GROUP_NAME_HASH]}"


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


def plan_eks_pool(stack: StackConfig, group: NodeGroupConfig, facts: Catalog) -> EksPoolPlan:
    assert group.instance_type is not None and group.ami_release is not None
    cluster = stack.cluster.name
    release = facts.amis[group.ami_type][group.ami_release]
    instance = facts.instances[group.instance_type]
    provisioner = pool_provisioner(stack.cluster, group)
    assert provisioner != "existing"
    return EksPoolPlan(
        pool=plan_pool(stack, group, facts),
        provisioner=provisioner,
        node_group_name=managed_node_group_name(cluster, group.name, instance_type=group.instance_type,
                                                ami_type=group.ami_type, capacity_type=group.capacity_type,
                                                zones=list(group.zones or stack.cluster.zones)),
        instance_type=group.instance_type,
        vcpus=instance.vcpus,
        memory_gib=instance.memory_gib,
        ami_type=group.ami_type,
        ami_release=group.ami_release,
        release_version=release.release_versions[stack.cluster.kubernetes_version],
        nvidia_driver=release.nvidia_driver,
        capacity_type=group.capacity_type,
        min=group.min,
        max=group.max,
        zones=list(group.zones or stack.cluster.zones),
        disk_gib=group.disk_gib,
        launch_template=launch_template(cluster, group.name, group.disk_gib),
        placement_group=placement_group_name(cluster, group.name) if group.placement_group else None,
    )


def placement_group_name(cluster: str, pool: str) -> str:
    return f"{cluster}-{pool}"


def node_patch(node: str, pool: PoolPlan) -> dict[str, Any]:
    """A server-side-apply patch that makes an existing node a member of the pool."""
    spec: dict[str, Any] = {"taints": pool.taints} if pool.taints else {}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": pool.labels}, "spec": spec}
