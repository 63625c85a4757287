"""What a verify finding is, the check more than one layer makes (a Helm release's workloads ready), and the
report that prints findings layer by layer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class Finding:
    layer: str
    subject: str
    ok: bool
    message: str
    fix: str = ""


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def check_ready(workloads: list[dict[str, Any]], release: str, layer: str, what: str) -> Finding:
    """A Helm release's DaemonSets and Deployments all ready (matched by app.kubernetes.io/instance)."""
    mine = [w for w in workloads if labels_of(w).get("app.kubernetes.io/instance") == release]
    if not mine:
        return Finding(layer, what, False, f"no DaemonSet or Deployment of release {release}",
                       "pulumi up (the release is in the plan)")
    for w in mine:
        status = w.get("status") or {}
        if w["kind"] == "DaemonSet":
            want, have = status.get("desiredNumberScheduled", 0), status.get("numberReady", 0)
        else:
            want, have = (w.get("spec") or {}).get("replicas", 1), status.get("readyReplicas", 0)
        if have < want:
            return Finding(layer, what, False, f"{w['kind']} {w['metadata']['name']}: {have} of {want} ready",
                           f"kubectl -n {w['metadata']['namespace']} describe {w['kind'].lower()} "
                           f"{w['metadata']['name']}")
    return Finding(layer, what, True, f"{len(mine)} workload(s) ready")


def report(findings: list[Finding]) -> str:
    lines = []
    for layer, title in (("where", "Where (Kubernetes)"), ("how", "How (Ray)"), ("when", "When (vLLM)")):
        mine = [f for f in findings if f.layer == layer]
        if not mine:
            continue
        lines.append(title)
        for f in mine:
            lines.append(f"  {'ok  ' if f.ok else 'FAIL'} {f.subject}: {f.message}" + (f" -> {f.fix}" if f.fix else ""))
    failed = sum(not f.ok for f in findings)
    lines.append(f"{len(findings) - failed} ok, {failed} failing")
    return "\n".join(lines)
