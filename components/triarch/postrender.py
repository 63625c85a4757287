"""`triarch-restrict-pods`: a Helm post-renderer that gives every pod template of a rendered chart the restricted Pod
Security context Triarch's own pods run with (non-root uid 1000, RuntimeDefault seccomp, no privilege escalation,
every capability dropped), where the chart takes none from its values: llm-d-router's standalone chart (v0.10.0)
renders the endpoint picker's container and pod with no securityContext, which a namespace enforcing `restricted`
refuses. Helm pipes the rendered manifests in and applies what comes out (helm.sh/helm/v3 pkg/postrender)."""

from __future__ import annotations

import sys
from typing import Any

import yaml

from triarch.planners import pods

WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job")


def restrict(document: dict[str, Any]) -> dict[str, Any]:
    """The object with each pod template's context set (kept where the chart already set one, field by field)."""
    if document.get("kind") not in WORKLOADS:
        return document
    spec = document.get("spec", {}).get("template", {}).get("spec")
    if not isinstance(spec, dict):
        return document
    spec["securityContext"] = {**pods.pod_security(), **(spec.get("securityContext") or {})}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        container["securityContext"] = {**pods.container_security(read_only_root=False),
                                        **(container.get("securityContext") or {})}
    return document


def main() -> None:
    documents = [d for d in yaml.safe_load_all(sys.stdin) if d]
    yaml.safe_dump_all([restrict(d) for d in documents], sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
