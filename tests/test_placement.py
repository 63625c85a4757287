"""The placement and capacity proof (`triarch check`, the policy pack's stack rules), the stack files of public
failures it must refuse, and property tests over benign edits of the shipped stacks: no edit replaces a
stateful resource or renames a resource it does not concern, and any stack `triarch plan` accepts places."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT, StackPlan, plan_config, stack_document
from triarch import cli
from triarch.catalog import catalog, charts
from triarch.diff import diff_plans
from triarch.guardrails.base import Resource
from triarch.guardrails.placement import prove
from triarch.guardrails.placement_pools import reserved
from triarch.offline import plan_document
from triarch.program import StackError

FAILURES = ROOT / "tests" / "failures"
CASES = yaml.safe_load((FAILURES / "cases.yaml").read_text(encoding="utf-8"))["cases"]


def resources(plan: StackPlan) -> list[Resource]:
    return [Resource(r.type, r.name, r.inputs, r.urn) for r in sorted(plan.resources, key=lambda r: r.urn)
            if r.custom]


# --- what a node keeps for itself ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("instance", "cpu_m", "memory_mib"), [
    # nodeadm (amazon-eks-ami v20260714): CPU 6% + 1% + 2 x 0.5% + 0.25% per further core; memory 11 x maxPods + 255
    # MiB, plus the 100 Mi eviction threshold. maxPods from the ENI table (m7i.large 29, g6.2xlarge 58,
    # g6.12xlarge 234, p4de.24xlarge 737, p5.48xlarge 100).
    ("m7i.large", 70, 29 * 11 + 255 + 100),
    ("g6.2xlarge", 90, 58 * 11 + 255 + 100),
    ("g6.12xlarge", 190, 234 * 11 + 255 + 100),
    ("p4de.24xlarge", 310, 737 * 11 + 255 + 100),
    ("p5.48xlarge", 550, 100 * 11 + 255 + 100),
])
def test_the_kubelet_reserve_follows_the_eks_ami(instance: str, cpu_m: int, memory_mib: int) -> None:
    kept = reserved(instance, catalog().instances[instance])
    assert (kept.cpu_m, kept.memory_mib) == (cpu_m, memory_mib)


# --- the proof on the shipped stacks ------------------------------------------------------------------------------

@pytest.mark.parametrize("stack", ["local", "dev", "prod"])
def test_every_pod_template_of_a_shipped_stack_is_placed(shipped: dict[str, StackPlan], stack: str) -> None:
    proof = prove(resources(shipped[stack]))
    assert proof.findings == []
    placed = {p.workload.where: p for p in proof.placements}
    deployments = {f"Deployment {d['metadata']['name']}" for d in shipped[stack].objects("Deployment")}
    assert deployments <= set(placed)
    for placement in proof.placements:
        assert placement.pools, placement.workload.where
    if stack != "local":
        for placement in proof.placements:
            if not placement.workload.daemon:
                assert placement.per_node and placement.per_node >= 1, placement.workload.where
                pool = placement.pool
                assert pool is not None and pool.max_nodes is not None
                assert placement.nodes_needed is not None and placement.nodes_needed <= pool.max_nodes


def test_check_prints_where_each_pod_template_runs(capsys: pytest.CaptureFixture[str]) -> None:
    with contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(["check", "--stack", "prod"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    start = lines.index("Placement (where each pod template runs, and the room it has)")
    rows = [x.strip() for x in lines[start + 1:] if x.startswith("  ")]
    assert any(r.startswith("Deployment embed: on l4 (g6.2xlarge); asks 7000m CPU") for r in rows), rows
    assert any(r.startswith("RayService llm worker group a100-2gpu: on a100 (p4de.24xlarge)") for r in rows)
    assert any(r.startswith("RayService llm head: on system (m7i.xlarge)") for r in rows)
    assert not [r for r in rows if "NOT PLACED" in r]
    with contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(["check", "--stack", "prod", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["placement"] and report["violations"] == []


def test_on_an_adopted_cluster_what_no_pool_takes_is_said_to_run_on_its_other_nodes(
        capsys: pytest.CaptureFixture[str]) -> None:
    """fresh adopts its cluster: the operator, the picker and Ray's head ask no GPU and tolerate no GPU taint, so they
    run on the cluster's own nodes outside the stack's pools; the check says so, not a bare NOT PLACED."""
    with contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(["check", "--stack", "fresh"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("Placement (where each pod template runs, and the room it has)")
    rows = [x.strip() for x in lines[start + 1:] if x.startswith("  ")]
    elsewhere = ("on the cluster's other nodes (it asks no GPU and no pool of the stack takes it; the adopted "
                 "cluster's nodes outside its pools are not in the plan)")
    assert f"RayService llm head: {elsewhere}" in rows, rows
    assert f"Helm release kuberay-operator (operator): {elsewhere}" in rows
    assert not [r for r in rows if "NOT PLACED" in r]


def test_a_pool_short_of_nodes_is_named_with_the_numbers(shipped: dict[str, StackPlan]) -> None:
    """The policy pack sees what a hand-edited stack would: here the L4 NodePool's limit cut to five nodes."""
    edited = []
    for r in resources(shipped["prod"]):
        props = r.props
        if r.type == "kubernetes:karpenter.sh/v1:NodePool" and props["metadata"]["name"] == "l4":
            props = copy.deepcopy(dict(props))
            props["spec"]["limits"]["nvidia.com/gpu"] = "5"
        edited.append(Resource(r.type, r.name, props, r.urn))
    [finding] = [f for f in prove(edited).findings if f.rule == "pool-capacity"]
    assert finding.message.startswith("pool l4 (NodePool l4) holds at most 5 g6.2xlarge node(s), but its workloads "
                                      "at their largest need 6"), finding.message
    assert "raise the pool's max to 6" in finding.message


# --- public failures ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", sorted(CASES))
def test_a_public_failure_is_refused_with_its_sentence(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    expected = CASES[case]
    code = cli.main(["check", "--stack-file", str(FAILURES / case)])
    captured = capsys.readouterr()
    assert code == expected["exit"], captured.out + captured.err
    text = captured.err if code == 2 else captured.out
    assert expected["expect"] in text, text
    if code == 2:
        assert len(captured.err.splitlines()) == 1


def test_every_failure_stack_is_indexed() -> None:
    files = sorted(p.name for p in FAILURES.glob("*.yaml") if p.name != "cases.yaml")
    assert files == sorted(CASES)
    assert all(entry.get("source") for entry in CASES.values())


# --- properties -----------------------------------------------------------------------------------------------------

def _document(name: str, config: dict[str, Any], directory: Path) -> dict[str, Any]:
    return json.loads(json.dumps(plan_document(plan_config(name, config, directory).run)))


EDITS = ("reorder zones", "reorder pools", "reorder models", "add a zone", "add a model", "remove a model",
         "toggle time slicing", "change an instance type", "resize a root volume", "bump a chart")


def apply(edit: str, config: dict[str, Any], pick: int) -> set[str]:
    """Apply one benign edit; returns the names (models, pools) whose resources the edit concerns."""
    cluster, groups, models = config["triarch:cluster"], config["triarch:nodeGroups"], config["triarch:models"]
    if edit == "reorder zones":
        cluster["zones"] = cluster["zones"][pick % len(cluster["zones"]):] + cluster["zones"][:pick % len(
            cluster["zones"])]
    elif edit == "reorder pools":
        groups.reverse()
    elif edit == "reorder models":
        models.reverse()
    elif edit == "add a zone":
        cluster["zones"].append(next(f"us-east-1{z}" for z in "abcdef" if f"us-east-1{z}" not in cluster["zones"]))
    elif edit == "add a model":
        pool = groups[pick % len(groups)]["name"]
        models.append({"name": "extra", "model": "Qwen/Qwen3-Embedding-0.6B", "engine": "vllm", "nodeGroup": pool})
        return {"extra"}
    elif edit == "remove a model" and len(models) > 1:
        removed = models.pop(pick % len(models))
        engine = removed.get("engine", "vllm")
        # The last model of an engine takes the engine's shared objects with it (the vLLM PodMonitor, say).
        return {removed["name"], *([engine] if all(m.get("engine", "vllm") != engine for m in models) else [])}
    elif edit == "toggle time slicing":
        group = groups[pick % len(groups)]
        if group.pop("timeSlicing", None) is None:
            group["timeSlicing"] = {"replicas": 2}
    elif edit == "change an instance type":
        group = groups[pick % len(groups)]
        same_gpu = {"g6.xlarge": "g6.2xlarge", "g6.2xlarge": "g6.4xlarge", "p4de.24xlarge": "p4de.24xlarge"}
        group["instanceType"] = same_gpu.get(group["instanceType"], group["instanceType"])
    elif edit == "resize a root volume":
        groups[pick % len(groups)]["diskGiB"] = 300
    return set()


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return {name: _document(name, stack_document(name), tmp_path_factory.mktemp(f"base-{name}"))
            for name in ("dev", "prod")}


@settings(max_examples=24, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stack=st.sampled_from(["dev", "prod"]), edits=st.lists(st.sampled_from(EDITS), min_size=1, max_size=3),
       pick=st.integers(min_value=0, max_value=7))
def test_benign_edits_replace_nothing_stateful_and_keep_urns(bases: dict[str, dict[str, Any]],
                                                             tmp_path_factory: pytest.TempPathFactory, stack: str,
                                                             edits: list[str], pick: int) -> None:
    config = stack_document(stack)
    concerned: set[str] = set()
    for edit in edits:
        concerned |= apply(edit, config, pick)
    bumped = {name: replace(chart, version=f"{chart.version}.{pick + 1}") if "bump a chart" in edits else chart
              for name, chart in charts().items()}
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("triarch.planners.registry.charts", lambda: bumped)
            head = _document(stack, config, tmp_path_factory.mktemp("edit"))
    except StackError as error:  # a refused edit is one sentence naming a key (e.g. a GPU slice too small)
        message = str(error)
        assert "\n" not in message and message.startswith("triarch:"), message
        return
    result = diff_plans(bases[stack], head)
    # Only a removed model's own cache goes (which the gate counts, so the reviewer marks it intended).
    unexpected = [d for d in result.blocking if not (d.kind == "removed" and any(n in d.name for n in concerned))]
    assert unexpected == [], [(d.name, d.cause) for d in unexpected]
    if "bump a chart" in edits:  # a chart bump upgrades its release in place
        releases = [d for d in result.differences if d.type == "kubernetes:helm.sh/v3:Release"]
        assert releases and all(d.kind == "changed" and "version" in d.inputs for d in releases)
    removed = {d.urn for d in result.of("removed")}
    assert all(any(name in urn for name in concerned) for urn in removed), (edits, sorted(removed))
    # Any stack the plan accepts places: every pod template lands on a pool and fits it.
    placed = prove([Resource(r["type"], r["name"], r["inputs"], r["urn"]) for r in head["resources"]
                    if not r["type"].startswith(("triarch:", "pulumi:"))])
    assert placed.findings == [], [f.message for f in placed.findings]


# --- the proof does not depend on the order resources come in ---------------------------------------------------
# The Pulumi engine hands the pack resources in the order the program registered them, which varies from run to run
# (tests/test_real_policy.py found both of these under the real CLI). Triarch's prod objects with the h100 pool and
# LeaderWorkerSet of the large stack (tests/policy_cases/baseline.yaml): pool l4 spans three zones, h100 one.

CASES_BASELINE = ROOT / "tests" / "policy_cases" / "baseline.yaml"


def _baseline_with(*extra: dict[str, Any]) -> list[Resource]:
    items = [*yaml.safe_load(CASES_BASELINE.read_text()), *extra]
    return [Resource(i["type"], i["name"], i["props"], f"urn:pulumi:t::p::{i['type']}::{i['name']}") for i in items]


def _embed_copy(name: str, selector: dict[str, str] | None, pools: list[str] | None = None) -> dict[str, Any]:
    item = next(i for i in yaml.safe_load(CASES_BASELINE.read_text()) if i["name"] == "deployment-llm-embed")
    props = copy.deepcopy(item["props"])
    props["metadata"]["name"] = name
    pod = props["spec"]["template"]["spec"]
    if selector is None:
        del pod["nodeSelector"]
    else:
        pod["nodeSelector"] = selector
    if pools is not None:  # a required node affinity: any of these pools
        pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "triarch.dev/pool", "operator": "In", "values": pools}]}]}}}
    return {"type": item["type"], "name": name, "props": props}


def _messages(resources: list[Resource]) -> list[str]:
    return sorted(f.message for f in prove(resources).findings)


def test_a_hard_zone_spread_fails_only_where_no_pool_it_may_land_on_meets_it() -> None:
    """embed asks minDomains 2: allowed on h100 (one zone) or l4 (three) it can spread on l4, so nothing is wrong, in
    either order; pinned to h100 it can never spread, and the finding names h100."""
    loose = _baseline_with(_embed_copy("anywhere", None, ["l4", "h100"]))
    assert [m for m in _messages(loose) if "anywhere" in m] == []
    assert [m for m in _messages(list(reversed(loose))) if "anywhere" in m] == []
    pinned = _baseline_with(_embed_copy("on-h100", {"triarch.dev/pool": "h100"}))
    assert [m for m in _messages(pinned) if "on-h100" in m] == [
        "Deployment on-h100 spreads over at least 2 zones (minDomains), but pool h100 reaches 1 (1 zone(s), at most 8 "
        "node(s)): its replicas would wait forever; lower minDomains to 1 or add zones or nodes to the pool"]


def test_a_pod_no_pool_takes_is_told_the_pools_in_name_order_whatever_order_they_come_in() -> None:
    resources = _baseline_with(_embed_copy("nowhere", {"triarch.dev/pool": "h200"}))
    forward, backward = _messages(resources), _messages(list(reversed(resources)))
    nowhere = [m for m in forward if m.startswith("Deployment nowhere: no pool's nodes take it")]
    assert forward == backward and len(nowhere) == 1
    assert re.findall(r"(?:^ |\); )([\w.-]+) \(", nowhere[0].split("pools:")[1]) == ["a100", "h100", "l4", "system"]
