"""Where: node repair as the cluster runs it. Karpenter's NodeRepair gate is on, the EKS node monitoring agent's
DaemonSets are ready, and each GPU node carries the agent's AcceleratedHardwareReady condition; a node where it is
False is named with the time Karpenter terminates it (templates/compat/node-repair.yaml: the Xids, the minutes)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any

from triarch.planners import karpenter
from triarch.planners.nodegroups import PoolPlan
from triarch.planners.repair import facts, xids_text
from triarch.scheduling import POOL_LABEL
from triarch.verify.base import Finding, labels_of


def condition_of(node: Mapping[str, Any]) -> dict[str, Any] | None:
    """The node monitoring agent's GPU condition on a node, or None where no agent reports it."""
    wanted = facts().condition
    return next((dict(c) for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == wanted),
                None)


def _since(condition: Mapping[str, Any]) -> datetime | None:
    stamp = condition.get("lastTransitionTime")
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")) if stamp else None
    except ValueError:
        return None


def check_repair_nodes(nodes: list[dict[str, Any]], pools: Iterable[PoolPlan],
                       repaired: Iterable[str]) -> Iterator[Finding]:
    """Each GPU node's AcceleratedHardwareReady: True (watched), False (failed: when it goes, or that nothing
    repairs it), or absent (no agent reports on it). `repaired`: the pools node repair replaces nodes of."""
    f = facts()
    repaired = set(repaired)
    for pool in pools:
        for node in (n for n in nodes if labels_of(n).get(POOL_LABEL) == pool.name):
            name = f"node {node['metadata']['name']} (pool {pool.name})"
            condition = condition_of(node)
            planned = pool.name in repaired
            if condition is None:
                if planned:
                    yield Finding("where", name, False,
                                  f"has no {f.condition} condition: the EKS node monitoring agent does not report on "
                                  "it, so node repair cannot see its GPUs fail",
                                  f"kubectl -n {f.namespace} get daemonset {' '.join(f.daemon_sets)} (dcgm-server "
                                  "must tolerate the GPU taint: the add-on's dcgmAgent.tolerations)")
                else:
                    yield Finding("where", name, True,
                                  f"no {f.condition} condition (no node monitoring agent reports on it): a failed "
                                  "GPU is not repaired; drain and replace the node by hand")
                continue
            if str(condition.get("status")) != f.status:
                yield Finding("where", name, True, f"{f.condition} {condition.get('status')}: "
                              + (f"repaired {f.toleration_minutes} minutes after it turns {f.status}" if planned
                                 else "not repaired if it fails (cluster.nodeRepair)"))
                continue
            since = _since(condition)
            reason = condition.get("reason") or "no reason given"
            when = (f"at {(since + timedelta(minutes=f.toleration_minutes)).isoformat()} " if since else "")
            if planned:
                yield Finding("where", name, False,
                              f"{f.condition}={f.status} since {condition.get('lastTransitionTime')} ({reason}): "
                              f"Karpenter terminates it {when}({f.toleration_minutes} minutes after) without a "
                              f"drain, unless more than {f.max_unhealthy_percent}% of pool {pool.name} is unhealthy "
                              f"(the agent's Xids: {xids_text()})",
                              f"kubectl describe node {node['metadata']['name']}; kubectl get events -A "
                              "--field-selector reason=NodeRepairBlocked")
            else:
                yield Finding("where", name, False,
                              f"{f.condition}={f.status} since {condition.get('lastTransitionTime')} ({reason}): "
                              "nothing repairs it here",
                              f"drain and replace the node (kubectl drain {node['metadata']['name']} "
                              "--ignore-daemonsets)")


def _gates(deployment: Mapping[str, Any]) -> dict[str, str]:
    """The controller's FEATURE_GATES (`Name=value,...`) as the chart renders them into its container."""
    for container in (deployment.get("spec") or {}).get("template", {}).get("spec", {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == "FEATURE_GATES":
                return dict(part.split("=", 1) for part in str(env.get("value", "")).split(",") if "=" in part)
    return {}


def check_repair_controller(deployments: list[dict[str, Any]], daemon_sets: list[dict[str, Any]]) -> list[Finding]:
    """Karpenter runs with NodeRepair on, and the node monitoring agent's DaemonSets are all ready (where the stack
    plans node repair)."""
    f = facts()
    found = []
    controller = next((d for d in deployments if labels_of(d).get("app.kubernetes.io/instance") == karpenter.RELEASE
                       and (d.get("metadata") or {}).get("name") == karpenter.RELEASE), None)
    gate = _gates(controller).get(f.gate_in_deployment) if controller is not None else None
    found.append(Finding("where", "Karpenter node repair", gate == "true",
                         f"{f.gate_in_deployment}={gate}" if gate is not None else
                         "no Karpenter Deployment with FEATURE_GATES",
                         "" if gate == "true" else
                         f"pulumi up (the karpenter release's settings.featureGates.{f.feature_gate})"))
    by_name = {(d.get("metadata") or {}).get("name"): d for d in daemon_sets}
    for name in f.daemon_sets:
        daemon = by_name.get(name)
        if daemon is None:
            found.append(Finding("where", f"node monitoring agent {name}", False,
                                 f"no DaemonSet {name} in {f.namespace}",
                                 f"pulumi up (the EKS add-on {f.addon})"))
            continue
        status = daemon.get("status") or {}
        want, have = status.get("desiredNumberScheduled", 0), status.get("numberReady", 0)
        found.append(Finding("where", f"node monitoring agent {name}", have >= want,
                             f"{have} of {want} ready",
                             "" if have >= want else f"kubectl -n {f.namespace} describe daemonset {name}"))
    return found
