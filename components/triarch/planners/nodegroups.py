"""What a GPU pool is: labels, taint, AMI pin, instance shape and launch template, as plain data."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from triarch.catalog import Catalog, Gpu
from triarch.coldfacts import cold_start_facts
from triarch.config import (
    NODE_GROUP_NAME_HASH,
    CapacityReservationConfig,
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
class ImagePull:
    """Where a pool's nodes unpack images and how: decided once, read by the node class or launch template that
    sets it up and by the cold-start prediction that counts on it."""

    parallel: bool
    """containerd's SOCI snapshotter in parallel-pull mode (nodeadm's FastImagePull)."""
    instance_store: bool
    """The local NVMe, as one RAID0 array, under containerd and the kubelet."""
    root_mib_s: int
    """The gp3 root volume's throughput."""
    root_iops: int

    def node_config(self, local_storage: bool = True) -> dict[str, Any] | None:
        """The nodeadm NodeConfig these settings need (None: the AMI's defaults); `local_storage`: whether it sets
        up the instance store itself (Karpenter does from its node class). Karpenter and EKS merge it with the one
        they write; their own values win where both set a field."""
        spec: dict[str, Any] = {}
        if self.parallel:
            spec["featureGates"] = {"FastImagePull": True}
        if self.instance_store and local_storage:
            spec["instance"] = {"localStorage": {"strategy": "RAID0"}}
        return {"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig", "spec": spec} if spec else None


BASELINE_PULL = ImagePull(parallel=False, instance_store=False, root_mib_s=125, root_iops=3000)
"""An EBS gp3 root volume at its included baseline, images unpacked one layer at a time: the AMI's defaults."""

MIME_BOUNDARY = "//"


def user_data(node_config: dict[str, Any] | None) -> str | None:
    """A NodeConfig as the MIME multipart user data nodeadm reads (its part typed application/node.eks.aws)."""
    if node_config is None:
        return None
    body = json.dumps(node_config, sort_keys=True)
    return (f'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="{MIME_BOUNDARY}"\n\n'
            f"--{MIME_BOUNDARY}\nContent-Type: application/node.eks.aws\n\n{body}\n--{MIME_BOUNDARY}--\n")


def image_pull(group: NodeGroupConfig, facts: Catalog) -> ImagePull:
    """A created pool's image pull: parallel where the AMI release and the instance allow it, on the instance store
    where the type has one, else on a root volume fast enough for parallel unpacking (each unless the stack says
    otherwise; templates/compat/cold-start.yaml has the sources)."""
    assert group.instance_type is not None and group.ami_release is not None
    cold = cold_start_facts()
    instance = facts.instances[group.instance_type]
    parallel_possible = (group.ami_release >= cold.fast_pull_min_release and instance.vcpus >= cold.fast_pull_min_vcpus
                         and instance.memory_gib >= cold.fast_pull_min_memory_gib)
    parallel = parallel_possible if group.fast_image_pull is None else group.fast_image_pull
    store = instance.nvme_gb > 0 if group.instance_store is None else group.instance_store
    on_root = parallel and not store
    mib_s = group.disk_throughput_mib_s or (cold.root_fast_pull_mibps if on_root else cold.root_baseline_mibps)
    return ImagePull(parallel=parallel, instance_store=store, root_mib_s=mib_s, root_iops=cold.root_baseline_iops)


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
    pull: ImagePull = BASELINE_PULL
    placement_group: str | None = None
    """The cluster placement group Triarch creates for the pool (its name), where the stack asks for one."""
    reservations: tuple[CapacityReservationConfig, ...] = ()
    """The capacity reservations and Capacity Blocks the pool's nodes launch into first (a Karpenter pool's)."""
    reserved_only: bool = False
    """Launch into the reservations only: no node beyond them."""

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


def launch_template(cluster: str, name: str, disk_gib: int, pull: ImagePull = BASELINE_PULL) -> dict[str, Any]:
    """Launch template data (pulumi_aws argument names): IMDSv2 only, one hop, encrypted gp3 root volume at the
    pool's throughput, and the NodeConfig of its image pull as user data.

    No image id: the managed node group picks the AMI from ami_type + release_version, so the pin stays visible
    to EKS (and to the matrix check) rather than hidden in an AMI id.
    """
    ebs: dict[str, Any] = {"volume_size": disk_gib, "volume_type": "gp3", "encrypted": "true",
                           "delete_on_termination": "true"}
    if pull.root_mib_s != BASELINE_PULL.root_mib_s:
        ebs.update(throughput=pull.root_mib_s, iops=pull.root_iops)
    data = user_data(pull.node_config())
    extra = {"user_data": base64.b64encode(data.encode()).decode()} if data else {}
    return {**extra,
        "metadata_options": {
            "http_endpoint": "enabled",
            "http_tokens": "required",
            "http_put_response_hop_limit": IMDS_HOP_LIMIT,
            "instance_metadata_tags": "disabled",
        },
        "block_device_mappings": [{"device_name": "/dev/xvda", "ebs": ebs}],
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
    pull = image_pull(group, facts)
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
        launch_template=launch_template(cluster, group.name, group.disk_gib, pull),
        pull=pull,
        placement_group=placement_group_name(cluster, group.name) if group.placement_group else None,
        reservations=tuple(group.reservations),
        reserved_only=group.reserved_only,
    )


def placement_group_name(cluster: str, pool: str) -> str:
    return f"{cluster}-{pool}"


def node_patch(node: str, pool: PoolPlan) -> dict[str, Any]:
    """A server-side-apply patch that makes an existing node a member of the pool."""
    spec: dict[str, Any] = {"taints": pool.taints} if pool.taints else {}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": pool.labels}, "spec": spec}
