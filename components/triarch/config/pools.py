"""What a stack's GPU pools are (their GPU, driver and what brings their nodes up) and the checks of each pool
against the catalog and the cluster."""

from __future__ import annotations

import difflib
import re
from typing import Literal

from pydantic.alias_generators import to_camel

from triarch.catalog import Catalog, version_tuple
from triarch.coldfacts import cold_start_facts
from triarch.config.base import NAMESPACE, key_path, required_when
from triarch.config.schema import ClusterConfig, NodeGroupConfig, PoolProvisioner, StackConfig
from triarch.errors import ConfigError
from triarch.pricelist import PRICE_TABLE_NAME, types_listed

EKS_NODE_GROUP_NAME_MAX = 63
"""EKS refuses a managed node group name longer than 63 characters (pulumi-aws eks.NodeGroup nodeGroupName)."""
NODE_GROUP_NAME_HASH = 6
"""The hash suffix of a managed node group's name (triarch.planners.nodegroups.managed_node_group_name)."""
SYSTEM_RELEASE_TABLE = "AL2023_x86_64_NVIDIA"
"""Where the system nodes' release is looked up: each AL2023 release ships every variant (standard, NVIDIA, ...)
with one release_version per Kubernetes minor, so the NVIDIA table also dates the standard AMI of the release."""

def check_node_group(stack: StackConfig, group: NodeGroupConfig, path: str, facts: Catalog) -> None:
    cluster = stack.cluster
    if group.min > group.max:
        raise ConfigError(f"{path}.min", group.min, f"is greater than max ({group.max})", f"0..{group.max}")
    if cluster.create:
        for key in ("gpu", "gpus_per_node", "driver_version"):
            if getattr(group, key) is not None:
                alias = to_camel(key)
                raise ConfigError(f"{path}.{alias}", getattr(group, key),
                                  "is derived from instanceType and amiRelease on an EKS node group",
                                  "remove it")
        if group.nodes:
            raise ConfigError(f"{path}.nodes", group.nodes, "only applies to existing nodes", "remove it")
        gpu_types = sorted(n for n, i in facts.instances.items() if i.gpu)
        if group.instance_type is None:
            raise ConfigError(f"{path}.instanceType", None, f"{required_when(f'{path}.instanceType')}: the GPU "
                              "instance type of the pool's nodes", ", ".join(gpu_types))
        refusal = facts.refusal(group.instance_type)
        if refusal is not None:
            raise ConfigError(f"{path}.instanceType", group.instance_type, f"is not planned by Triarch: {refusal}",
                              "an NVIDIA GPU instance type of templates/compat/instances.yaml")
        if group.instance_type not in gpu_types:
            raise unknown(f"{path}.instanceType", group.instance_type, "GPU instance type", gpu_types,
                          "templates/compat/instances.yaml")
        check_ami_release(stack, group.ami_type, group.ami_release, f"{path}.amiRelease", facts)
        for i, zone in enumerate(group.zones or []):
            if zone not in cluster.zones:
                raise ConfigError(f"{path}.zones[{i}]", zone, "is not one of the cluster's zones",
                                  ", ".join(cluster.zones))
        if group.max == 0:
            raise ConfigError(f"{path}.max", group.max, "leaves the node group without nodes", ">= 1")
        provisioner = pool_provisioner(cluster, group)
        if provisioner == "karpenter" and cluster.provisioner != "karpenter":
            raise ConfigError(f"{path}.provisioner", group.provisioner,
                              f"needs Karpenter, but triarch:cluster.nodeProvisioner is {cluster.provisioner!r}",
                              "managedNodeGroup, or nodeProvisioner: karpenter")
        if provisioner == "karpenter" and group.min != 0:
            raise ConfigError(f"{path}.min", group.min,
                              "has no meaning for a Karpenter pool: Karpenter launches nodes for pending pods and "
                              "keeps no idle ones", "0, or provisioner: managedNodeGroup for nodes that always run")
        longest = EKS_NODE_GROUP_NAME_MAX - len(cluster.name) - 2 - NODE_GROUP_NAME_HASH
        if provisioner == "managedNodeGroup" and len(group.name) > longest:
            raise ConfigError(f"{path}.name", group.name,
                              f"makes the EKS node group name {cluster.name}-{group.name}-<hash of "
                              f"{NODE_GROUP_NAME_HASH}>, longer than the {EKS_NODE_GROUP_NAME_MAX} characters EKS "
                              "allows",
                              f"at most {longest} characters")
        if provisioner == "managedNodeGroup" and group.min != group.max:
            raise ConfigError(f"{path}.min", group.min,
                              f"differs from max ({group.max}), but nothing scales a managed node group "
                              "(Triarch installs no cluster-autoscaler)",
                              f"min == max == {group.max} (a fixed-size pool), or provisioner: karpenter")
        _check_efa(stack, group, path, provisioner, facts)
        _check_image_pull(group, path, facts)
        _check_reservations(group, path, provisioner)
    else:
        if group.reservations or group.reserved_only:
            key, value = ("reservations", [r.id or r.tags for r in group.reservations]) if group.reservations \
                else ("reservedOnly", True)
            raise ConfigError(f"{path}.{key}", value,
                              "only applies when triarch:cluster.create is true (Triarch plans reservations as a "
                              "Karpenter pool's EC2NodeClass; an adopted cluster's nodes are launched by others)",
                              "remove it")
        for key in ("efa", "placement_group", "fast_image_pull", "instance_store", "disk_throughput_mib_s"):
            if getattr(group, key) is not None and getattr(group, key) is not False:
                alias = "diskThroughputMiBps" if key == "disk_throughput_mib_s" else to_camel(key)
                raise ConfigError(f"{path}.{alias}", getattr(group, key), "only applies when triarch:cluster.create "
                                  "is true (an adopted cluster's nodes come with their own interfaces, placement, "
                                  "disks and container runtime)", "remove it")
        if group.provisioner is not None:
            raise ConfigError(f"{path}.provisioner", group.provisioner,
                              "only applies when triarch:cluster.create is true",
                              "remove it; declare what scales the adopted cluster in triarch:cluster.nodeProvisioner")
        if group.min == 0 and cluster.provisioner == "none":
            raise ConfigError(f"{path}.min", group.min,
                              "lets the pool be empty, but triarch:cluster.nodeProvisioner is 'none': nothing "
                              "would add a node for a GPU pod",
                              "min >= 1, or nodeProvisioner: karpenter | cluster-autoscaler")
        if group.zones is not None and len(set(group.zones)) != len(group.zones):
            raise ConfigError(f"{path}.zones", group.zones, "lists a zone twice", "distinct zones")
        for key in ("instance_type", "ami_release"):
            if getattr(group, key) is not None:
                raise ConfigError(f"{path}.{to_camel(key)}", getattr(group, key),
                                  "only applies when triarch:cluster.create is true",
                                  "for existing nodes set gpu, gpusPerNode and driverVersion")
        if group.gpu is None:
            raise ConfigError(f"{path}.gpu", None, f"{required_when(f'{path}.gpu')}: the nodes' GPU decides the "
                              "memory the tuner sizes vLLM for", ", ".join(sorted(facts.gpus)))
        if group.gpu not in facts.gpus:
            raise unknown(f"{path}.gpu", group.gpu, "GPU", sorted(facts.gpus), "templates/compat/gpus.yaml")
        if group.driver_version is None:
            raise ConfigError(f"{path}.driverVersion", None,
                              f"{required_when(f'{path}.driverVersion')}: the nodes' NVIDIA driver (nvidia-smi "
                              "prints it)", "e.g. 580.95.05")
        if version_tuple(group.driver_version) < (400,):
            raise ConfigError(f"{path}.driverVersion", group.driver_version, "is not an NVIDIA driver version",
                              "e.g. 580.95.05")


TAGS_PER_TERM = 20
"""Karpenter 1.14.1's CRD: a capacity reservation term's tags have at most 20 entries, none of them empty."""


def _check_reservations(group: NodeGroupConfig, path: str, provisioner: str) -> None:
    """Capacity reservations only on a Karpenter pool, each term what the EC2NodeClass CRD accepts (an id, or tags
    with an optional owner), a Capacity Block with the price the user pays, and no term twice."""
    if group.reserved_only and not group.reservations:
        raise ConfigError(f"{path}.reservedOnly", True, "leaves the pool no capacity: it has no reservations",
                          "reservations: [{id: cr-...}], or reservedOnly: false")
    if group.reservations and provisioner != "karpenter":
        raise ConfigError(f"{path}.reservations", [r.id or r.tags for r in group.reservations],
                          "needs a Karpenter pool (Karpenter launches into reservations by id or tags, ahead of "
                          "on-demand; Triarch writes no launch template that targets one for a managed node group)",
                          "provisioner: karpenter, or remove reservations")
    seen: dict[str, int] = {}
    for i, term in enumerate(group.reservations):
        where = f"{path}.reservations[{i}]"
        if (term.id is None) == (term.tags is None):
            shown = {"id": term.id, "tags": term.tags} if term.id else {}
            raise ConfigError(where, shown, "names a reservation by id or by tags, not both and not neither (Karpenter "
                              "refuses a term with id and other fields)", "{id: cr-...} or {tags: {key: value}}")
        if term.owner_id is not None and term.id is not None:
            raise ConfigError(f"{where}.ownerID", term.owner_id, "only narrows a tags term (an id names one "
                              "reservation already)", "remove it, or select by tags")
        if term.tags is not None:
            if not term.tags or len(term.tags) > TAGS_PER_TERM:
                raise ConfigError(f"{where}.tags", term.tags, f"must have 1 to {TAGS_PER_TERM} tags", "e.g. {team: ml}")
            empty = sorted(k for k, v in term.tags.items() if not k or not v)
            if empty:
                raise ConfigError(f"{where}.tags", term.tags, "has an empty key or value, which Karpenter refuses",
                                  "a value, or `*` for any value of the key")
        if term.type == "capacityBlock" and term.count is None:
            raise ConfigError(f"{where}.count", None, "is required for a Capacity Block: the instances you bought in "
                              "it, which its price is paid for whether they run or not", "e.g. 2")
        if term.type == "capacityBlock" and term.hourly_usd is None:
            raise ConfigError(f"{where}.hourlyUsd", None, "is required for a Capacity Block: what you paid per "
                              "instance-hour (its upfront price / hours / instances), which the cost report counts",
                              "e.g. 31.464")
        if term.type == "odcr" and term.hourly_usd is not None:
            raise ConfigError(f"{where}.hourlyUsd", term.hourly_usd, "only applies to a Capacity Block: an On-Demand "
                              "Capacity Reservation bills at the on-demand rate, used or not",
                              "remove it, or type: capacityBlock")
        key = term.id or repr((sorted((term.tags or {}).items()), term.owner_id))
        if key in seen:
            raise ConfigError(where, term.id or term.tags, f"repeats reservations[{seen[key]}]", "each reservation "
                              "once")
        seen[key] = i


def _check_image_pull(group: NodeGroupConfig, path: str, facts: Catalog) -> None:
    """Parallel image pull only where the AMI release ships it and the node is big enough for nodeadm to turn it on
    (it ignores the gate silently otherwise); the instance store only where the type has one."""
    assert group.instance_type is not None and group.ami_release is not None
    cold = cold_start_facts()
    instance = facts.instances[group.instance_type]
    if group.fast_image_pull:
        if group.ami_release < cold.fast_pull_min_release:
            raise ConfigError(f"{path}.fastImagePull", True,
                              f"needs the SOCI snapshotter's parallel mode, which AMI release {group.ami_release} "
                              f"predates (it came after {cold.fast_pull_min_release})",
                              f"an amiRelease from {cold.fast_pull_min_release} on, or fastImagePull: false")
        if instance.vcpus < cold.fast_pull_min_vcpus or instance.memory_gib < cold.fast_pull_min_memory_gib:
            raise ConfigError(f"{path}.fastImagePull", True,
                              f"is ignored by nodeadm on {group.instance_type} ({instance.vcpus} vCPUs, "
                              f"{instance.memory_gib:g} GiB): it needs {cold.fast_pull_min_vcpus}+ vCPUs and "
                              f"{cold.fast_pull_min_memory_gib:g}+ GiB", "a larger instance type, or remove it")
    if group.instance_store and not instance.nvme_gb:
        with_store = sorted(n for n, i in facts.instances.items() if i.gpu and i.nvme_gb)
        raise ConfigError(f"{path}.instanceStore", True, f"asks for the instance store of {group.instance_type}, "
                          "which has none", f"an instance type with one ({', '.join(with_store)}), or remove it")


def _check_efa(stack: StackConfig, group: NodeGroupConfig, path: str, provisioner: str, facts: Catalog) -> None:
    """EFA only where the instance type has it and Karpenter attaches it (it adds one interface per
    vpc.amazonaws.com/efa a pod asks for); a cluster placement group only with EFA, in one zone."""
    assert group.instance_type is not None
    if group.efa:
        with_efa = sorted(n for n, i in facts.instances.items() if i.efa)
        if not facts.instances[group.instance_type].efa:
            raise ConfigError(f"{path}.efa", True, f"asks for EFA on {group.instance_type}, which has none",
                              f"an instance type with EFA ({', '.join(with_efa)}), or efa: false")
        if provisioner != "karpenter":
            raise ConfigError(f"{path}.efa", True,
                              "needs a Karpenter pool (Karpenter attaches the interfaces a pod asks for; Triarch "
                              "writes no launch template with them for a managed node group)",
                              "provisioner: karpenter, or efa: false")
    if group.placement_group:
        if not group.efa:
            raise ConfigError(f"{path}.placementGroup", True, "only serves nodes that talk over EFA", "efa: true")
        zones = group.zones or stack.cluster.zones
        if len(zones) != 1:
            raise ConfigError(f"{path}.zones", zones,
                              f"spread the pool over {len(zones)} zones, but a cluster placement group lives in one "
                              "(EC2 places its instances in a single zone)",
                              f"one zone, e.g. zones: [{zones[0]}], or placementGroup: false")


def check_ami_release(stack: StackConfig, ami_type: str, release_name: str | None, path: str,
                       facts: Catalog, shown: str | None = None) -> None:
    """A release Triarch knows (so its NVIDIA driver is known), with an AMI for the cluster's Kubernetes minor."""
    kubernetes = stack.cluster.kubernetes_version
    releases = facts.amis.get(ami_type, {})
    if release_name is None:
        raise ConfigError(path, None, f"{required_when(path)}: the AMI release pins the NVIDIA driver the nodes "
                          "boot, which the driver/CUDA matrix checks", ", ".join(sorted(releases)))
    if release_name not in releases:
        raise ConfigError(path, release_name,
                          f"is not a known {shown or ami_type} release in templates/compat/amis.yaml "
                          "(the driver it ships must be known)", ", ".join(sorted(releases)))
    if kubernetes not in releases[release_name].release_versions:
        fitting = sorted(r for r, a in releases.items() if kubernetes in a.release_versions)
        known = sorted({v for a in releases.values() for v in a.release_versions}, key=lambda v: tuple(
            int(part) for part in v.split(".")))
        if not fitting:  # no release has that Kubernetes: the version is the mistake, not the release
            raise ConfigError("triarch:cluster.kubernetesVersion", kubernetes,
                              f"has no {shown or ami_type} release in templates/compat/amis.yaml (the AMI that "
                              "pins the nodes' NVIDIA driver)", f"{', '.join(known)}, or add a release for it with "
                              "its source")
        raise ConfigError(path, release_name, f"has no AMI for Kubernetes {kubernetes}",
                          f"a release for {kubernetes}: " + ", ".join(fitting))


def check_sold_in_region(stack: StackConfig, facts: Catalog) -> None:
    """A created cluster's node types (its pools' and its system nodes') against what its region sells: the price
    table lists, per region, every GPU and system type of instances.yaml the catalog sells there, so a type with no
    row in a listed region could never launch there (no node group or Karpenter NodePool would ever get a node),
    and is refused here instead of being priced as unknown. A region the table does not list is not judged."""
    region = stack.aws_region
    listed = types_listed()
    sold = listed.get(region or "")
    if not stack.cluster.create or sold is None:
        return
    types = [(key_path(f"{NAMESPACE}:nodeGroups", i, "instanceType"), group.instance_type)
             for i, group in enumerate(stack.node_groups) if group.instance_type is not None]
    types.append((f"{NAMESPACE}:cluster.systemNodeGroup.instanceType", stack.cluster.system_node_group.instance_type))
    for path, name in types:
        if name in sold:
            continue
        gpu = facts.instances[name].gpu if name in facts.instances else None
        kin = sorted(t for t in sold if t in facts.instances and facts.instances[t].gpu == gpu)
        what = facts.gpus[gpu].product if gpu in facts.gpus else "CPU"
        elsewhere = sorted(r for r, rows in listed.items() if name in rows)
        allowed = f"the {what} types {region} sells: {', '.join(kin)}" if kin else \
            f"a region that sells {name}: {', '.join(elsewhere) or 'none listed'} ({region} sells no {what} type)"
        raise ConfigError(path, name, f"is not sold in {region} ({PRICE_TABLE_NAME} lists every type the "
                          "region sells, and not this one): no node of it could ever launch there", allowed)


def _family(name: str) -> str:
    """What a catalog name is a variant of: before its first '-' or '.' (h100-80gb: h100; p5.48xlarge: p5)."""
    return re.split(r"[-.]", name.lower(), maxsplit=1)[0]


def nearest(value: str, known: list[str]) -> str | None:
    """The known name nearest ``value``, of its own family first: `h100` means an h100-80gb, not the h200 a
    character closer; `p5.48xl` a p5, not a p4d. Otherwise the closest by spelling, if any is close."""
    kin = [k for k in known if _family(k) == _family(value)]
    near = difflib.get_close_matches(value.lower(), kin or known, n=1, cutoff=0.0 if kin else 0.5)
    return near[0] if near else None


def unknown(path: str, value: str, what: str, known: list[str], data_file: str) -> ConfigError:
    """A name the catalog lacks: the nearest known one, every known one, and how to add one."""
    near = nearest(value, known)
    hint = f" (did you mean {near!r}?)" if near else ""
    return ConfigError(path, value, f"is not a known {what}{hint}; to add one, add it to {data_file} with the "
                       "source of each figure", ", ".join(known))


def pool_provisioner(cluster: ClusterConfig, group: NodeGroupConfig) -> Literal[PoolProvisioner, "existing"]:
    """What brings up a pool's nodes: a Karpenter NodePool, an EKS managed node group, or (adopted clusters)
    the nodes that are there, labelled by Triarch or by the cluster's own provisioner."""
    if not cluster.create:
        return "existing"
    if group.provisioner is not None:
        return group.provisioner
    return "karpenter" if cluster.provisioner == "karpenter" else "managedNodeGroup"


def gpu_of(group: NodeGroupConfig, facts: Catalog) -> str:
    """The GPU catalog key of a node group: from its instance type, or as declared for existing nodes."""
    if group.instance_type is not None:
        gpu = facts.instances[group.instance_type].gpu
        assert gpu is not None
        return gpu
    assert group.gpu is not None
    return group.gpu


def gpus_per_node(group: NodeGroupConfig, facts: Catalog) -> int:
    if group.instance_type is not None:
        return facts.instances[group.instance_type].gpus
    return group.gpus_per_node or 1


def driver_of(group: NodeGroupConfig, facts: Catalog) -> str:
    """The NVIDIA driver a node group's nodes run: the AMI release's, or as declared for existing nodes."""
    if group.ami_release is not None:
        return facts.amis[group.ami_type][group.ami_release].nvidia_driver
    assert group.driver_version is not None
    return group.driver_version
