"""The pools of the placement proof, read from the plan's resources: Karpenter NodePools, EKS node groups and
patched existing nodes, each with the labels and taints its nodes carry, its instance type and the room a node
offers (the instance's capacity less what the EKS AMI reserves, templates/compat/node-overhead.yaml), and how far
it can grow."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import yaml

from triarch.catalog import InstanceType, catalog
from triarch.datafiles import read_yaml
from triarch.guardrails.workloads import kind_of, name_of
from triarch.paths import COMPAT_DIR
from triarch.scheduling import (
    CAPACITY_TYPE_LABEL,
    DEVICE_PLUGIN_CONFIG_LABEL,
    GPU_RESOURCE,
    RESERVED_CAPACITY,
    RESERVED_NODES_ANNOTATION,
)

ZONE = "topology.kubernetes.io/zone"
EKS_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}


@dataclass(frozen=True)
class Amounts:
    cpu_m: int = 0
    memory_mib: int = 0
    gpus: int = 0

    def __add__(self, other: Amounts) -> Amounts:
        return Amounts(self.cpu_m + other.cpu_m, self.memory_mib + other.memory_mib, self.gpus + other.gpus)

    def __sub__(self, other: Amounts) -> Amounts:
        return Amounts(self.cpu_m - other.cpu_m, self.memory_mib - other.memory_mib, self.gpus - other.gpus)

    def fits_in(self, other: Amounts) -> bool:
        return self.cpu_m <= other.cpu_m and self.memory_mib <= other.memory_mib and self.gpus <= other.gpus

    def per_node(self, node: Amounts) -> int:
        """How many pods of these requests a node of `node` allocatable holds."""
        counts = [node.cpu_m // self.cpu_m if self.cpu_m else math.inf,
                  node.memory_mib // self.memory_mib if self.memory_mib else math.inf,
                  node.gpus // self.gpus if self.gpus else math.inf]
        least = min(counts)
        return int(least) if least != math.inf else 110

    def show(self) -> str:
        parts = [f"{self.cpu_m}m CPU", f"{self.memory_mib} MiB"]
        if self.gpus:
            parts.append(f"{self.gpus} GPU")
        return ", ".join(parts)


@dataclass(frozen=True)
class Pool:
    """A pool of identical nodes as the plan declares it."""

    name: str
    what: str
    """How the plan declares it, for messages: `NodePool l4`, `node group gpu-a100`, `existing node ws`."""
    labels: dict[str, str]
    taints: list[dict[str, str]]
    instance: InstanceType | None
    capacity: Amounts | None
    """A node's capacity, GPUs as the device plugin advertises them (time slices counted); None when unknown."""
    allocatable: Amounts | None
    """Capacity less the kubelet's reserve and eviction threshold (DaemonSets not yet taken off)."""
    max_nodes: int | None
    min_nodes: int
    zones: tuple[str, ...] | None
    scales: bool
    """Something in the stack adds nodes for pending pods (a Karpenter NodePool)."""
    daemons: Amounts = Amounts()
    daemon_names: tuple[str, ...] = ()
    reserved_nodes: int | None = None
    """Nodes its capacity reservations hold (a NodePool's triarch.dev/reserved-nodes); None where unknown or none."""
    reserved_only: bool = False
    """The NodePool launches into its reservations only (karpenter.sh/capacity-type: reserved alone)."""

    @property
    def free(self) -> Amounts | None:
        return None if self.allocatable is None else self.allocatable - self.daemons


# --- reading amounts ------------------------------------------------------------------------------------------

def cpu_millicores(value: Any) -> int:
    text = str(value)
    return int(float(text[:-1])) if text.endswith("m") else int(float(text) * 1000)


MEMORY_UNITS = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024, "k": 1000 / 1024 / 1024,
                "M": 1000 * 1000 / 1024 / 1024, "G": 1000**3 / 1024 / 1024}


def memory_mib(value: Any) -> int:
    text = str(value)
    for unit, factor in MEMORY_UNITS.items():
        if text.endswith(unit):
            return math.ceil(float(text[: -len(unit)]) * factor)
    return math.ceil(float(text) / 1024 / 1024)


@cache
def overhead() -> dict[str, Any]:
    data: dict[str, Any] = read_yaml(COMPAT_DIR / "node-overhead.yaml")
    return data


def reserved(instance_type: str, instance: InstanceType) -> Amounts:
    """What the kubelet keeps of a node: kube-reserved CPU and memory, and the hard eviction threshold."""
    data = overhead()
    millicores, cores = 0.0, instance.vcpus
    for count, per_core in data["kubeReserved"]["cpuTiers"]:
        taken = cores if count is None else min(cores, count)
        millicores += taken * per_core
        cores -= taken
    max_pods = data["maxPods"].get(instance_type, data["defaultMaxPods"])
    memory = max_pods * data["kubeReserved"]["memoryPerPodMiB"] + data["kubeReserved"]["memoryBaseMiB"]
    return Amounts(math.ceil(millicores), memory + data["evictionHardMemoryMiB"], 0)


def node_capacity(instance_type: str, slices: int = 1) -> tuple[InstanceType | None, Amounts | None, Amounts | None]:
    instance = catalog().instances.get(instance_type)
    if instance is None:
        return None, None, None
    capacity = Amounts(instance.vcpus * 1000, int(instance.memory_gib * 1024), instance.gpus * slices)
    return instance, capacity, capacity - reserved(instance_type, instance)


# --- pools ------------------------------------------------------------------------------------------------------

def _slices(labels: Mapping[str, str], resources: list[Any]) -> int:
    """Time-slicing replicas of a node's GPUs: its device plugin config label, looked up in the plugin's values."""
    config_name = labels.get(DEVICE_PLUGIN_CONFIG_LABEL)
    if not config_name:
        return 1
    for r in resources:
        if r.type == "kubernetes:helm.sh/v3:Release":
            text = (((r.props.get("values") or {}).get("config") or {}).get("map") or {}).get(config_name)
            if isinstance(text, str):
                sharing = ((yaml.safe_load(text) or {}).get("sharing") or {}).get("timeSlicing") or {}
                return max([int(x.get("replicas", 1)) for x in sharing.get("resources") or []] or [1])
    return 1


def _quantity(value: Any) -> float:
    text = str(value)
    if text.endswith(tuple(MEMORY_UNITS)):
        return float(memory_mib(text))
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def pools_of(resources: list[Any]) -> list[Pool]:
    pools: list[Pool] = []
    for r in resources:
        props = r.props
        if kind_of(r.type) == "karpenter.sh/v1:NodePool":
            template = (props.get("spec") or {}).get("template") or {}
            spec = template.get("spec") or {}
            requirements = {q.get("key"): q for q in spec.get("requirements") or []}
            labels = {**((template.get("metadata") or {}).get("labels") or {})}
            for key, q in requirements.items():
                if q.get("operator") == "In" and len(q.get("values") or []) == 1:
                    labels[str(key)] = str(q["values"][0])
            name = name_of(props, r.name)
            labels.setdefault("karpenter.sh/nodepool", name)
            labels.setdefault("kubernetes.io/os", "linux")
            types = (requirements.get("node.kubernetes.io/instance-type") or {}).get("values") or []
            instance, capacity, allocatable = _smallest([str(t) for t in types], _slices(labels, resources))
            limits = (props.get("spec") or {}).get("limits") or {}
            bounds = []
            if instance is not None:
                per_node = {GPU_RESOURCE: instance.gpus, "cpu": instance.vcpus, "memory": instance.memory_gib * 1024}
                bounds = [int(_quantity(v) // per_node[k]) for k, v in limits.items() if per_node.get(k)]
            zones = (requirements.get(ZONE) or {}).get("values")
            capacity_types = [str(v) for v in (requirements.get(CAPACITY_TYPE_LABEL) or {}).get("values") or []]
            annotations = (props.get("metadata") or {}).get("annotations") or {}
            pools.append(Pool(str(labels.get("triarch.dev/pool", name)), f"NodePool {name}", labels,
                              list(spec.get("taints") or []), instance, capacity, allocatable,
                              min(bounds) if bounds else None, 0, tuple(zones) if zones else None, True,
                              reserved_nodes=as_int(annotations.get(RESERVED_NODES_ANNOTATION)),
                              reserved_only=capacity_types == [RESERVED_CAPACITY]))
        elif r.type == "aws:eks/nodeGroup:NodeGroup":
            labels = {**(props.get("labels") or {}), "kubernetes.io/os": "linux"}
            taints = [{**t, "effect": EKS_EFFECTS.get(str(t.get("effect")), t.get("effect"))}
                      for t in props.get("taints") or []]
            types = [str(t) for t in props.get("instanceTypes") or []]
            instance, capacity, allocatable = node_capacity(types[0], _slices(labels, resources)) if types else (
                None, None, None)
            scaling = props.get("scalingConfig") or {}
            pools.append(Pool(str(labels.get("triarch.dev/pool", r.name)), f"node group {r.name}", labels, taints,
                              instance, capacity, allocatable, as_int(scaling.get("maxSize")),
                              as_int(scaling.get("minSize")) or 0, None, False))
        elif r.type == "kubernetes:core/v1:NodePatch":
            metadata = props.get("metadata") or {}
            labels = {**(metadata.get("labels") or {}), "kubernetes.io/os": "linux"}
            node = str(metadata.get("name", r.name))
            pools.append(Pool(str(labels.get("triarch.dev/pool", node)), f"existing node {node}", labels,
                              list((props.get("spec") or {}).get("taints") or []), None, None, None, None, 1, None,
                              False))
    return _merge_existing(pools)


def _smallest(types: list[str], slices: int) -> tuple[InstanceType | None, Amounts | None, Amounts | None]:
    """Of several instance types, the smallest node: it decides what a pod can count on."""
    shapes = [node_capacity(t, slices) for t in types]
    known = [(i, c, a) for i, c, a in shapes if i is not None and c is not None and a is not None]
    if not known:
        return None, None, None
    return min(known, key=lambda shape: (shape[2].cpu_m, shape[2].memory_mib) if shape[2] else (0, 0))


def _merge_existing(pools: list[Pool]) -> list[Pool]:
    """Existing nodes of one pool are one pool of that many nodes."""
    merged: dict[str, Pool] = {}
    for pool in pools:
        if pool.what.startswith("existing") and pool.name in merged:
            first = merged[pool.name]
            merged[pool.name] = replace(first, min_nodes=first.min_nodes + 1)
        else:
            merged[pool.name] = pool
    return list(merged.values())


def as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
