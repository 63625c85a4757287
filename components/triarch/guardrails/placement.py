"""The placement and capacity proof: every pod template a stack creates can run, on the pools the stack declares.

Read from the plan's resources alone (so `triarch check` and the policy pack run the same code): the pools are
Karpenter NodePools, EKS node groups and patched existing nodes; the workloads are Deployments, Ray heads and
worker groups, and the pods the Helm releases run (from their values). For each workload:
- some pool's nodes match its node selector and required affinity, and it tolerates their taints;
- one pod fits a node's allocatable resources: the instance's capacity less what the EKS AMI reserves
  (templates/compat/node-overhead.yaml) less the DaemonSets that land on the node;
- at its largest (maximum replicas, a rollout's surge, a RayService upgrade's second cluster) the pool's nodes hold
  it, its zone spread can be met with the pool's zones and nodes, and a pool that may be empty has a provisioner.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any

import yaml

from triarch.catalog import InstanceType, catalog
from triarch.guardrails.workloads import LWS_KIND, kind_of, name_of, pod_templates, required_node_terms
from triarch.paths import COMPAT_DIR
from triarch.scheduling import DEVICE_PLUGIN_CONFIG_LABEL, GPU_RESOURCE

ZONE = "topology.kubernetes.io/zone"
EKS_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
POD_KINDS = ("apps/v1:Deployment", "apps/v1:StatefulSet", "ray.io/v1:RayService", "ray.io/v1:RayCluster",
             LWS_KIND)


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

    @property
    def free(self) -> Amounts | None:
        return None if self.allocatable is None else self.allocatable - self.daemons


@dataclass(frozen=True)
class Workload:
    where: str
    resource_type: str
    resource_name: str
    urn: str
    spec: Mapping[str, Any]
    requests: Amounts
    replicas: int
    surge: int = 0
    upgrade: int = 0
    """Pods a RayService upgrade starts beside these (its new cluster at its smallest)."""
    daemon: bool = False

    @property
    def peak(self) -> int:
        return self.replicas + self.surge + self.upgrade


@dataclass(frozen=True)
class Finding:
    rule: str
    resource_type: str
    resource_name: str
    urn: str
    message: str


@dataclass(frozen=True)
class Placement:
    """Where a workload lands and with how much room."""

    workload: Workload
    pools: list[str]
    per_node: int | None = None
    nodes_needed: int | None = None
    pool: Pool | None = None


@dataclass
class Proof:
    pools: list[Pool] = field(default_factory=list)
    placements: list[Placement] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)


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


def requests_of(containers: Iterable[Mapping[str, Any]]) -> Amounts:
    """A pod's requests: its containers' requests (a limit stands in for a missing request, as Kubernetes
    defaults it)."""
    total = Amounts()
    for container in containers:
        resources = container.get("resources") or {}
        amounts = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        total += Amounts(cpu_millicores(amounts["cpu"]) if "cpu" in amounts else 0,
                         memory_mib(amounts["memory"]) if "memory" in amounts else 0,
                         int(amounts.get(GPU_RESOURCE, 0) or 0))
    return total


@cache
def overhead() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((COMPAT_DIR / "node-overhead.yaml").read_text(encoding="utf-8"))
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
            pools.append(Pool(str(labels.get("triarch.dev/pool", name)), f"NodePool {name}", labels,
                              list(spec.get("taints") or []), instance, capacity, allocatable,
                              min(bounds) if bounds else None, 0, tuple(zones) if zones else None, True))
        elif r.type == "aws:eks/nodeGroup:NodeGroup":
            labels = {**(props.get("labels") or {}), "kubernetes.io/os": "linux"}
            taints = [{**t, "effect": EKS_EFFECTS.get(str(t.get("effect")), t.get("effect"))}
                      for t in props.get("taints") or []]
            types = [str(t) for t in props.get("instanceTypes") or []]
            instance, capacity, allocatable = node_capacity(types[0], _slices(labels, resources)) if types else (
                None, None, None)
            scaling = props.get("scalingConfig") or {}
            pools.append(Pool(str(labels.get("triarch.dev/pool", r.name)), f"node group {r.name}", labels, taints,
                              instance, capacity, allocatable, _int(scaling.get("maxSize")),
                              _int(scaling.get("minSize")) or 0, None, False))
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


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


# --- workloads ------------------------------------------------------------------------------------------------

CHART_WORKLOADS = ("nvidia-device-plugin", "karpenter", "kuberay-operator")


def workloads_of(resources: list[Any]) -> list[Workload]:
    found: list[Workload] = []
    for r in resources:
        kind = kind_of(r.type)
        if kind in POD_KINDS:
            found += _pod_workloads(r, kind)
        elif r.type == "kubernetes:helm.sh/v3:Release" and r.props.get("name") in CHART_WORKLOADS:
            found += _chart_workloads(r)
    return found


def _pod_workloads(r: Any, kind: str) -> list[Workload]:
    spec = r.props.get("spec") or {}
    found = []
    if kind.endswith(("Deployment", "StatefulSet")):
        [template] = list(pod_templates(r.type, r.props, r.name))
        strategy = (spec.get("strategy") or {}).get("rollingUpdate") or {}
        surge = _surge(strategy.get("maxSurge", "25%"), template.replicas) if kind.endswith("Deployment") else 0
        found.append(Workload(template.where, r.type, r.name, r.urn, template.spec,
                              requests_of(template.spec.get("containers") or []), template.replicas, surge))
        return found
    if kind == LWS_KIND:
        # A rolling update adds whole groups (maxSurge of them): a leader and its workers each.
        rolling = (spec.get("rolloutStrategy") or {}).get("rollingUpdateConfiguration") or {}
        sets = _int(spec.get("replicas")) or 1
        extra = _surge(rolling.get("maxSurge", 0), sets)
        for template in pod_templates(r.type, r.props, r.name):
            per_group = template.replicas // sets
            found.append(Workload(template.where, r.type, r.name, r.urn, template.spec,
                                  requests_of(template.spec.get("containers") or []), template.replicas,
                                  extra * per_group))
        return found
    cluster = spec.get("rayClusterConfig") if kind.endswith("RayService") else spec
    strategy = ((spec.get("upgradeStrategy") or {}).get("type") or "NewCluster") if kind.endswith("RayService") else ""
    groups = {str(g.get("groupName")): g for g in (cluster or {}).get("workerGroupSpecs") or []}
    for template in pod_templates(r.type, r.props, r.name):
        group = groups.get(template.where.rsplit(" ", 1)[-1]) if not template.ray_head else None
        low = _int((group or {}).get("minReplicas")) or 0 if group else 1
        upgrade = (low if strategy == "NewCluster" else 0)
        found.append(Workload(template.where, r.type, r.name, r.urn, template.spec,
                              requests_of(template.spec.get("containers") or []), template.replicas, 0, upgrade))
    return found


def _surge(value: Any, replicas: int) -> int:
    text = str(value)
    if text.endswith("%"):
        return math.ceil(replicas * float(text[:-1]) / 100)
    return _int(text) or 0


def _chart_workloads(r: Any) -> list[Workload]:
    """The pods a Helm release runs, placed as the chart places them with these values."""
    values = r.props.get("values") or {}
    name = str(r.props.get("name"))
    label = f"Helm release {name}"
    if name == "nvidia-device-plugin":
        spec = {"affinity": values.get("affinity") or {}, "tolerations": values.get("tolerations") or []}
        requests = requests_of([{"resources": values.get("resources") or {}}])
        pods = [Workload(f"{label} DaemonSet (device plugin)", r.type, r.name, r.urn, spec, requests, 1, daemon=True)]
        if (values.get("gfd") or {}).get("enabled"):
            pods.append(replace(pods[0], where=f"{label} DaemonSet (GPU feature discovery)"))
            worker = (values.get("nfd") or {}).get("worker") or {}
            nfd = overhead()["nfdWorker"]
            pods.append(Workload(f"{label} DaemonSet (node-feature-discovery worker)", r.type, r.name, r.urn,
                                 {"tolerations": worker.get("tolerations") or []},
                                 Amounts(cpu_millicores(nfd["cpu"]), memory_mib(nfd["memory"])), 1, daemon=True))
        return pods
    if name == "karpenter":
        # The chart's own placement (values.yaml 1.14.1): Linux nodes Karpenter did not make, one replica per host,
        # plus the values' node selector.
        affinity = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "karpenter.sh/nodepool", "operator": "DoesNotExist"}]}]}},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname"}]},
        }
        spec = {"nodeSelector": {"kubernetes.io/os": "linux", **(values.get("nodeSelector") or {})},
                "affinity": affinity, "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}]}
        requests = requests_of([{"resources": (values.get("controller") or {}).get("resources") or {}}])
        return [Workload(f"{label} (controller)", r.type, r.name, r.urn, spec, requests,
                         _int(values.get("replicas")) or 2)]
    spec = {"nodeSelector": values.get("nodeSelector") or {}, "tolerations": values.get("tolerations") or []}
    requests = requests_of([{"resources": values.get("resources") or {}}])
    return [Workload(f"{label} (operator)", r.type, r.name, r.urn, spec, requests, 1)]


# --- scheduling -----------------------------------------------------------------------------------------------

def selects(spec: Mapping[str, Any], pool: Pool) -> bool:
    if any(pool.labels.get(str(k)) != str(v) for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    terms = required_node_terms(spec)
    return not terms or any(all(_matches(e, pool.labels) for e in t.get("matchExpressions") or []) for t in terms)


def _matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    value, operator = labels.get(str(expression.get("key"))), expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    if operator == "In":
        return value in values
    if operator == "NotIn":
        return value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and values:
        try:
            return int(value) > int(values[0]) if operator == "Gt" else int(value) < int(values[0])
        except ValueError:
            return False
    return False


def tolerates(spec: Mapping[str, Any], pool: Pool) -> bool:
    return all(any(_tolerated(t, taint) for t in spec.get("tolerations") or [])
               for taint in pool.taints if taint.get("effect") != "PreferNoSchedule")


def _tolerated(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if toleration.get("effect") not in (None, "", taint.get("effect")):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration.get("key") == taint.get("key")
    return toleration.get("key") == taint.get("key") and str(toleration.get("value", "")) == str(taint.get("value", ""))


def _describe_selector(spec: Mapping[str, Any]) -> str:
    selector = spec.get("nodeSelector") or {}
    shown = ", ".join(f"{k}={v}" for k, v in selector.items()) or "no nodeSelector"
    return shown + (" and a required node affinity" if (spec.get("affinity") or {}).get("nodeAffinity") else "")


# --- the proof --------------------------------------------------------------------------------------------------

def prove(resources: list[Any]) -> Proof:
    pools = pools_of(resources)
    workloads = workloads_of(resources)
    addons = {str(r.props.get("addonName")) for r in resources if r.type == "aws:eks/addon:Addon"}
    pools = [_with_daemons(p, workloads, addons) for p in pools]
    proof = Proof(pools)
    if not pools:
        return proof
    # With the EKS cluster in view every node group is too (Triarch creates them all); otherwise (an adopted
    # cluster, bare manifests) nodes outside the pools may run pods that need no accelerator.
    every_node_known = any(r.type == "aws:eks/cluster:Cluster" for r in resources)
    by_name = {p.name: p for p in pools}
    load: dict[str, list[tuple[Workload, int]]] = {}
    for w in workloads:
        candidates = [p for p in pools if selects(w.spec, p) and tolerates(w.spec, p)]
        if w.daemon:
            proof.placements.append(Placement(w, [p.name for p in candidates]))
            continue
        if not candidates and not every_node_known and not w.requests.gpus:
            proof.placements.append(Placement(w, []))  # on nodes the plan does not see
            continue
        if not candidates:
            proof.findings.append(Finding("pod-placement", w.resource_type, w.resource_name, w.urn,
                                          f"{w.where}: no pool's nodes take it ({_describe_selector(w.spec)}); pools: "
                                          + "; ".join(_pool_line(p) for p in pools)
                                          + "; select a pool's labels and tolerate its taints"))
            proof.placements.append(Placement(w, []))
            continue
        fitting = [p for p in candidates if p.free is None or w.requests.fits_in(p.free)]
        if not fitting:
            pool = candidates[0]
            assert pool.free is not None and pool.instance is not None
            proof.findings.append(Finding(
                "pod-placement", w.resource_type, w.resource_name, w.urn,
                f"{w.where} asks {w.requests.show()} per pod, but a {pool.instance.name} node of pool {pool.name} "
                f"has {pool.free.show()} after the kubelet's reserve and {len(pool.daemon_names)} DaemonSet(s); "
                "lower the requests or choose a larger instance type"))
            proof.placements.append(Placement(w, [p.name for p in candidates]))
            continue
        pool = fitting[0]
        per_node = w.requests.per_node(pool.free) if pool.free is not None else None
        needed = _nodes_for(w, pool, per_node) if per_node else None
        proof.placements.append(Placement(w, [p.name for p in fitting], per_node, needed, pool))
        if len(fitting) == 1:
            load.setdefault(pool.name, []).append((w, per_node or 0))
        proof.findings += _spread_findings(w, pool, per_node)
    for name, placed in sorted(load.items()):
        proof.findings += _capacity_findings(by_name[name], placed)
        proof.findings += _scaling_findings(by_name[name], placed)
    return proof


def _pool_line(pool: Pool) -> str:
    labels = ", ".join(f"{k}={v}" for k, v in sorted(pool.labels.items()) if k.startswith(("triarch.dev/", "nvidia")))
    taints = ", ".join(f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}" for t in pool.taints) or "no taint"
    return f"{pool.name} ({labels or 'no Triarch labels'}; {taints})"


def _with_daemons(pool: Pool, workloads: list[Workload], addons: set[str]) -> Pool:
    """A pool's per-node overhead: the EKS add-on DaemonSets (every node, where the stack creates the cluster)
    and the Helm DaemonSets whose placement takes its nodes."""
    total, names = Amounts(), []
    if pool.instance is not None:
        for addon, entry in (overhead()["addonDaemonSets"] or {}).items():
            if addon in addons and entry:
                total += Amounts(cpu_millicores(entry["cpu"]) if "cpu" in entry else 0,
                                 memory_mib(entry["memory"]) if "memory" in entry else 0)
                names.append(addon)
    for w in workloads:
        if w.daemon and selects(w.spec, pool) and tolerates(w.spec, pool):
            total += w.requests
            names.append(w.where)
    return replace(pool, daemons=total, daemon_names=tuple(names))


def _zone_spread(spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return next((c for c in spec.get("topologySpreadConstraints") or []
                 if c.get("topologyKey") == ZONE and c.get("whenUnsatisfiable") == "DoNotSchedule"), None)


def _nodes_for(w: Workload, pool: Pool, per_node: int) -> int:
    """Nodes this workload needs at its peak on its own: a hard spread over `d` zones splits the pods as evenly
    as it can (a zone's pods need nodes in that zone), and a required anti-affinity per host puts one per node."""
    if _one_per_host(w.spec):
        per_node = 1
    spread = _zone_spread(w.spec)
    domains = 1
    if spread is not None and pool.zones:
        domains = max(1, min(len(pool.zones), w.peak, int(spread.get("minDomains", 1) or 1)))
    each, extra = divmod(w.peak, domains)
    return extra * math.ceil((each + 1) / per_node) + (domains - extra) * math.ceil(each / per_node)


def _one_per_host(spec: Mapping[str, Any]) -> bool:
    terms = ((spec.get("affinity") or {}).get("podAntiAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or []
    return any(t.get("topologyKey") == "kubernetes.io/hostname" for t in terms)


def _node_share(requests: Amounts, free: Amounts) -> float:
    """The largest fraction of a node's free CPU, memory or GPUs one pod takes."""
    return max(requests.cpu_m / free.cpu_m if free.cpu_m > 0 else 0.0,
               requests.memory_mib / free.memory_mib if free.memory_mib > 0 else 0.0,
               requests.gpus / free.gpus if free.gpus > 0 else 0.0)


def _spread_findings(w: Workload, pool: Pool, per_node: int | None) -> list[Finding]:
    spread = _zone_spread(w.spec)
    if spread is None or pool.zones is None:
        return []
    wanted = int(spread.get("minDomains", 1) or 1)
    reachable = min(len(pool.zones), pool.max_nodes if pool.max_nodes is not None else len(pool.zones))
    if wanted > reachable:
        return [Finding("pool-capacity", w.resource_type, w.resource_name, w.urn,
                        f"{w.where} spreads over at least {wanted} zones (minDomains), but pool {pool.name} reaches "
                        f"{reachable} ({len(pool.zones)} zone(s), at most {pool.max_nodes} node(s)): its replicas "
                        f"would wait forever; lower minDomains to {reachable} or add zones or nodes to the pool")]
    return []


def _capacity_findings(pool: Pool, placed: list[tuple[Workload, int]]) -> list[Finding]:
    if pool.max_nodes is None or not placed:
        return []
    # Node-equivalents (pods of different workloads share nodes), and what each workload needs on its own.
    free = pool.free
    share = sum(w.peak * _node_share(w.requests, free) for w, _ in placed) if free is not None else 0.0
    alone = max((_nodes_for(w, pool, per) for w, per in placed if per), default=0)
    needed = max(math.ceil(share - 1e-9), alone)
    if needed <= pool.max_nodes:
        return []
    parts = "; ".join(_peak_line(w, per) for w, per in placed)
    first = placed[0][0]
    return [Finding("pool-capacity", first.resource_type, first.resource_name, first.urn,
                    f"pool {pool.name} ({pool.what}) holds at most {pool.max_nodes} {_instance(pool)} node(s), but its "
                    f"workloads at their largest need {needed}: {parts}; raise the pool's max to {needed} or lower "
                    "the replicas")]


def _peak_line(w: Workload, per_node: int) -> str:
    extra = []
    if w.surge:
        extra.append(f"{w.surge} rollout surge")
    if w.upgrade:
        extra.append(f"{w.upgrade} in a RayService upgrade's new cluster")
    detail = f" ({w.replicas} + {' + '.join(extra)})" if extra else ""
    return f"{w.where} {w.peak} pod(s){detail}, {per_node} per node"


def _instance(pool: Pool) -> str:
    return pool.instance.name if pool.instance else "existing"


def _scaling_findings(pool: Pool, placed: list[tuple[Workload, int]]) -> list[Finding]:
    if pool.scales or pool.min_nodes > 0 or pool.what.startswith("existing"):
        return []
    first = placed[0][0]
    return [Finding("pool-scale-from-zero", first.resource_type, first.resource_name, first.urn,
                    f"pool {pool.name} ({pool.what}) may have no node (minimum {pool.min_nodes}) and nothing in the "
                    f"stack adds one for a pending pod, so {first.where} can stay Pending; give the pool a minimum "
                    "of 1 or more, or let Karpenter provision it")]


def headroom(proof: Proof) -> list[str]:
    """One line per workload: where it lands, what a pod asks and what a node has, and the pool's room."""
    lines = []
    for placement in sorted(proof.placements, key=lambda p: p.workload.where):
        w = placement.workload
        if w.daemon:
            lines.append(f"{w.where}: on {', '.join(placement.pools) or 'no pool'}")
            continue
        if not placement.pools:
            lines.append(f"{w.where}: NOT PLACED")
            continue
        pool = placement.pool
        if pool is None or pool.free is None:
            lines.append(f"{w.where}: on {', '.join(placement.pools)} (node size unknown)")
            continue
        room = (f"{placement.nodes_needed} node(s) at its peak of {w.peak} pod(s)"
                + (f", pool max {pool.max_nodes}" if pool.max_nodes is not None else ""))
        lines.append(f"{w.where}: on {pool.name} ({_instance(pool)}); asks {w.requests.show()}, a node has "
                     f"{pool.free.show()} free -> {placement.per_node} per node; {room}")
    return lines

