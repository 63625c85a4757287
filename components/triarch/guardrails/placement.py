"""The placement and capacity proof: every pod template a stack creates can run, on the pools the stack declares.

Read from the plan's resources alone (so `triarch check` and the policy pack run the same code): the pools
(placement_pools) and the workloads (placement_workloads). For each workload:
- some pool's nodes match its node selector and required affinity, and it tolerates their taints;
- one pod fits a node's allocatable resources: the instance's capacity less what the EKS AMI reserves
  (templates/compat/node-overhead.yaml) less the DaemonSets that land on the node;
- at its largest (maximum replicas, a rollout's surge, a RayService upgrade's second cluster) the pool's nodes hold
  it, its zone spread can be met with the pool's zones and nodes, and a pool that may be empty has a provisioner.
The findings name the rule they belong to (pod-placement, pool-capacity, pool-scale-from-zero).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from triarch.guardrails.placement_pools import ZONE, Amounts, Pool, cpu_millicores, memory_mib, overhead, pools_of
from triarch.guardrails.placement_workloads import Workload, workloads_of
from triarch.guardrails.workloads import required_node_terms


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
    elsewhere: bool = False
    """On the adopted cluster's other nodes: it asks no GPU, no pool of the stack takes it, and those nodes are the
    cluster's own, not in the plan (so not a finding)."""


@dataclass
class Proof:
    pools: list[Pool] = field(default_factory=list)
    placements: list[Placement] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)


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
    shown = ", ".join(f"{k}={v}" for k, v in sorted(selector.items())) or "no nodeSelector"
    return shown + (" and a required node affinity" if (spec.get("affinity") or {}).get("nodeAffinity") else "")


# --- the proof --------------------------------------------------------------------------------------------------

def prove(resources: list[Any]) -> Proof:
    # In name order: the engine hands resources over in the order the program registered them, which varies.
    pools = sorted(pools_of(resources), key=lambda p: p.name)
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
            proof.placements.append(Placement(w, [], elsewhere=True))  # on nodes the plan does not see
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
        # A hard zone spread fails only where no pool it may land on can meet it (the first such pool named).
        spreads = [_spread_findings(w, p) for p in fitting]
        if all(spreads):
            proof.findings += spreads[0]
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


def _spread_findings(w: Workload, pool: Pool) -> list[Finding]:
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


def _reserved_limit(pool: Pool) -> int | None:
    """The nodes a pool on its reservations only can have, where that is fewer than its max: Karpenter launches
    nothing beyond the instances its reservations hold."""
    if not pool.reserved_only or pool.reserved_nodes is None:
        return None
    return pool.reserved_nodes if pool.max_nodes is None or pool.reserved_nodes < pool.max_nodes else None


def _capacity_findings(pool: Pool, placed: list[tuple[Workload, int]]) -> list[Finding]:
    reserved = _reserved_limit(pool)
    if reserved is not None and placed:
        return _over(pool, placed, reserved, f"pool {pool.name} ({pool.what}) runs on its capacity reservations "
                     f"only, which hold {reserved} {_instance(pool)} node(s)", "reserve more, let the pool fall back "
                     "to on-demand (reservedOnly: false) or lower the replicas")
    if pool.max_nodes is None or not placed:
        return []
    return _over(pool, placed, pool.max_nodes, f"pool {pool.name} ({pool.what}) holds at most {pool.max_nodes} "
                 f"{_instance(pool)} node(s)", "raise the pool's max to {needed} or lower the replicas")


def _over(pool: Pool, placed: list[tuple[Workload, int]], limit: int, holds: str, fix: str) -> list[Finding]:
    """A finding where the pool's workloads at their largest need more than `limit` nodes."""
    # Node-equivalents (pods of different workloads share nodes), and what each workload needs on its own.
    free = pool.free
    share = sum(w.peak * _node_share(w.requests, free) for w, _ in placed) if free is not None else 0.0
    alone = max((_nodes_for(w, pool, per) for w, per in placed if per), default=0)
    needed = max(math.ceil(share - 1e-9), alone)
    if needed <= limit:
        return []
    parts = "; ".join(_peak_line(w, per) for w, per in placed)
    first = placed[0][0]
    return [Finding("pool-capacity", first.resource_type, first.resource_name, first.urn,
                    f"{holds}, but its workloads at their largest need {needed}: {parts}; "
                    + fix.format(needed=needed))]


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
        if placement.elsewhere:
            lines.append(f"{w.where}: on the cluster's other nodes (it asks no GPU and no pool of the stack takes "
                         "it; the adopted cluster's nodes outside its pools are not in the plan)")
            continue
        if not placement.pools:
            lines.append(f"{w.where}: NOT PLACED (see the pod-placement finding)")
            continue
        pool = placement.pool
        if pool is None or pool.free is None:
            lines.append(f"{w.where}: on {', '.join(placement.pools)} (node size unknown)")
            continue
        room = (f"{placement.nodes_needed} node(s) at its peak of {w.peak} pod(s)"
                + (f", pool max {pool.max_nodes}" if pool.max_nodes is not None else "")
                + (f", {pool.reserved_nodes} of them reserved" + (" (reservations only)" if pool.reserved_only
                                                                  else ", the rest on-demand")
                   if pool.reserved_nodes is not None else ""))
        lines.append(f"{w.where}: on {pool.name} ({_instance(pool)}); asks {w.requests.show()}, a node has "
                     f"{pool.free.show()} free -> {placement.per_node} per node; {room}")
    return lines
