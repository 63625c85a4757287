"""`triarch-restrict-pods`: a Helm post-renderer that gives every pod template of a rendered chart the restricted Pod
Security context Triarch's own pods run with (non-root uid 1000, RuntimeDefault seccomp, no privilege escalation,
every capability dropped), where the chart takes none from its values: llm-d-router's standalone chart (v0.10.0)
renders the endpoint picker's container and pod with no securityContext, which a namespace enforcing `restricted`
refuses. Helm pipes the rendered manifests in and applies what comes out (helm.sh/helm/v3 pkg/postrender).

`triarch-restrict-pods-pulling` does the same and names the registry's pull Secret in every pod template, for a
stack whose registry takes credentials: the chart has no value for imagePullSecrets. Helm runs a post-renderer with
no arguments (the provider's Release takes a command alone), so the choice is the command's name."""

from __future__ import annotations

import sys
from typing import Any

import yaml

from triarch.planners import pods

WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job")


def restrict(document: dict[str, Any], pull_secret: str | None = None) -> dict[str, Any]:
    """The object with each pod template's context set (kept where the chart already set one, field by field), and
    `pull_secret` added to its imagePullSecrets where given (after any the chart names)."""
    if document.get("kind") not in WORKLOADS:
        return document
    spec = document.get("spec", {}).get("template", {}).get("spec")
    if not isinstance(spec, dict):
        return document
    if pull_secret is not None:
        named = list(spec.get("imagePullSecrets") or [])
        if {"name": pull_secret} not in named:
            named.append({"name": pull_secret})
        spec["imagePullSecrets"] = named
    spec["securityContext"] = {**pods.pod_security(), **(spec.get("securityContext") or {})}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        container["securityContext"] = {**pods.container_security(read_only_root=False),
                                        **(container.get("securityContext") or {})}
    return document


def _render(pull_secret: str | None) -> None:
    documents = [d for d in yaml.safe_load_all(sys.stdin) if d]
    yaml.safe_dump_all([restrict(d, pull_secret) for d in documents], sys.stdout, sort_keys=False)


def main() -> None:
    """`triarch-restrict-pods`."""
    _render(None)


def main_pulling() -> None:
    """`triarch-restrict-pods-pulling`: also the registry's pull Secret (planners/pods.py PULL_SECRET)."""
    _render(pods.PULL_SECRET)


if __name__ == "__main__":
    main()
