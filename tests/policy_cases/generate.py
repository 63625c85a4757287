"""tests/policy_cases/baseline.yaml, generated: what `triarch plan --stack prod` registers (plan.json's resources, in
its order), less what the policy pack reads nothing of or a preview here cannot take (LEFT_OUT, each with its
reason), plus the named additions from other stacks' plans (ADDITIONS), with the few edits a preview here needs
(each a function below, saying why). tests/test_policy_baseline.py regenerates it and fails on drift.

Regenerate: `uv run python tests/policy_cases/generate.py` (it rewrites baseline.yaml)."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from triarch.offline import plan_document, run_program, stack_file
from triarch.report.validation import validate_stack_file

BASELINE = Path(__file__).resolve().parent / "baseline.yaml"
REGENERATE = "uv run python tests/policy_cases/generate.py"
RELEASE = "kubernetes:helm.sh/v3:Release"
REFERENCE_CHART = "<reference chart>"
"""A Helm release's chart as the baseline writes it: program.py points it at the reference cache's archive."""

# --- what of prod's plan the cases leave out, and why ------------------------------------------------------------

AWS_READ = ("aws:eks/cluster:Cluster", "aws:eks/addon:Addon", "aws:eks/nodeGroup:NodeGroup",
            "aws:ec2/launchTemplate:LaunchTemplate")
"""The AWS resources the pack reads: the cluster (with it in view the placement proof runs its created-stack mode:
every pod must land on a pool of the stack), the add-ons (their DaemonSets' share of every node), the node groups
(pools) and their launch templates (IMDSv2). No rule reads the others (IAM, VPC, KMS, SQS, EFS, CloudWatch, access
entries): left out."""

LEFT_OUT_TYPES = {
    "kubernetes:yaml/v2:ConfigFile": "KubeRay's CRDs, read from the chart's files; the bare plane installs every CRD",
}
LEFT_OUT_RELEASES = {
    "karpenter-crd": "CRDs only, which the bare plane has",
    "prometheus-operator-crds": "CRDs only, which the bare plane has",
    "kube-prometheus-stack": "the largest chart by far (its preview costs the most), whose pods the placement proof "
                             "does not read; its admin Secret is a RandomPassword's result, made by no program here",
}
LEFT_OUT_NAMESPACES = {
    "monitoring": "kube-prometheus-stack's (left out): its Grafana admin Secret and Triarch's dashboards ConfigMap, "
                  "which no rule reads",
}


def kept(resource: dict[str, Any]) -> bool:
    type_, inputs = resource["type"], resource["inputs"]
    if not type_.startswith(("kubernetes:", "aws:")):  # Triarch's components, providers, random
        return False
    if type_.startswith("aws:"):
        return type_ in AWS_READ
    if type_ in LEFT_OUT_TYPES or (type_ == RELEASE and inputs.get("name") in LEFT_OUT_RELEASES):
        return False
    metadata = inputs.get("metadata") or {}
    namespace = metadata.get("name") if type_ == "kubernetes:core/v1:Namespace" else metadata.get("namespace")
    return namespace not in LEFT_OUT_NAMESPACES


# --- the edits a preview here needs ----------------------------------------------------------------------------

def reference_chart(item: dict[str, Any]) -> None:
    """A Helm release's chart from the reference cache (program.py makes it `<name>-<version>.tgz` there): the
    preview runs in a network namespace of its own, with no chart repository to fetch from."""
    if item["type"] == RELEASE:
        item["props"]["chart"] = REFERENCE_CHART
        item["props"].pop("repositoryOpts", None)


EDITS: tuple[Callable[[dict[str, Any]], None], ...] = (reference_chart,)
"""Values the cloud assigns stay the plan's marker (`<known after apply>`): program.py registers each as a value
unknown at preview, which is what the engine hands the pack for a stack not yet created."""


# --- additions from other stacks, for the kinds prod does not make ---------------------------------------------

def large_group(plans: dict[str, list[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    """The large stack's LeaderWorkerSet (a multi-node group) and the h100 pool it runs on, as large plans them."""
    wanted = ("ec2nodeclass-h100", "nodepool-h100", "leaderworkerset-llm-deepseek")
    yield from (r for r in plans["large"] if r["name"] in wanted)


def fresh_scaler_on_embed(plans: dict[str, list[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    """The fresh stack's KEDA ScaledObject (it scales fresh's chat Deployment), pointed at prod's embed Deployment:
    its name, target and queries say embed, and its minimum is embed's replicas (KEDA's floor is the Deployment's
    size; below it the scaler would shrink what prod planned)."""
    [scaler] = [r for r in plans["fresh"] if r["type"] == "kubernetes:keda.sh/v1alpha1:ScaledObject"]
    [embed] = [r for r in plans["prod"] if r["name"] == "deployment-llm-embed"]
    inputs = copy.deepcopy(scaler["inputs"])
    spec = inputs["spec"]
    source, target = spec["scaleTargetRef"]["name"], embed["inputs"]["metadata"]["name"]
    inputs["metadata"]["name"] = spec["scaleTargetRef"]["name"] = target
    for trigger in spec["triggers"]:
        query = trigger["metadata"]["query"]
        trigger["metadata"]["query"] = query.replace(f'model_name="{source}"', f'model_name="{target}"')
    spec["minReplicaCount"] = embed["inputs"]["spec"]["replicas"]
    yield {**scaler, "name": scaler["name"].replace(source, target), "inputs": inputs}


ADDITIONS = (large_group, fresh_scaler_on_embed)


# --- the baseline ------------------------------------------------------------------------------------------------

def planned(stack: str) -> list[dict[str, Any]]:
    """plan.json's resources, as `triarch plan --stack <stack>` writes them (the same validation, the same run)."""
    validated = validate_stack_file(stack, stack_file(stack))
    run = run_program(validated.name, validated.config, validated.secret_keys)
    resources: list[dict[str, Any]] = plan_document(run)["resources"]
    return resources


def baseline_items() -> list[dict[str, Any]]:
    plans = {stack: planned(stack) for stack in ("prod", "large", "fresh")}
    chosen = [r for r in plans["prod"] if kept(r)]
    for addition in ADDITIONS:
        chosen += list(addition(plans))
    items = []
    for r in chosen:
        item = {"type": r["type"], "name": r["name"], "props": copy.deepcopy(r["inputs"])}
        for edit in EDITS:
            edit(item)
        items.append(item)
    return items


HEADER = f"""\
# GENERATED by tests/policy_cases/generate.py from `triarch plan --stack prod` (plus the large stack's LeaderWorkerSet
# and its h100 pool, and the fresh stack's ScaledObject pointed at prod's embed Deployment); do not edit by hand.
# Regenerate: {REGENERATE}
# tests/test_policy_baseline.py fails when it drifts from the plans. What of prod is left out and why, and the one
# edit (Helm charts from the reference cache), are in generate.py; a value the cloud assigns stays the plan's
# `<known after apply>`, which program.py registers as unknown at preview.
"""


def render(items: list[dict[str, Any]]) -> str:
    return HEADER + yaml.safe_dump(items, sort_keys=True, width=120, allow_unicode=True)


if __name__ == "__main__":
    BASELINE.write_text(render(baseline_items()), encoding="utf-8")
    sys.stdout.write(f"wrote {BASELINE}\n")
