"""The policy cases' baseline (tests/policy_cases/baseline.yaml) against the plans it is generated from, and the cases
program (tests/policy_cases/program.py) offline, under Pulumi's mocks as `triarch plan` runs Triarch's own: what
tests/test_real_policy.py expects of the real CLI, in seconds, where the mocks can make the engine's shapes.

The baseline holds prod's EKS Cluster and add-ons, so the placement proof judges it in its created-stack mode: every
pod on a pool of the stack, each node's room less the add-ons' DaemonSets."""

from __future__ import annotations

import difflib
import json
import runpy
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT
from policy_cases.generate import BASELINE, REGENERATE, baseline_items, render
from test_real_policy import EXPECTED_VIOLATIONS, L4_FREE_CPU_M, L4_INSTANCE, case
from triarch.guardrails.base import Resource
from triarch.guardrails.check import Finding, evaluate, load_policy_config, resources_of_plan
from triarch.guardrails.placement import prove
from triarch.offline import plan_document, run_program

PROGRAM = ROOT / "tests" / "policy_cases" / "program.py"
CREATED_STACK = ("aws:eks/cluster:Cluster", "aws:eks/addon:Addon")


def test_the_baseline_is_what_the_plans_generate() -> None:
    """A change to prod's plan (or large's, fresh's) that the cases do not see yet fails here, with the command."""
    written, generated = BASELINE.read_text(encoding="utf-8"), render(baseline_items())
    drift = list(difflib.unified_diff(written.splitlines(), generated.splitlines(), "baseline.yaml", "the plans",
                                      lineterm="", n=1))
    assert not drift, f"tests/policy_cases/baseline.yaml has drifted from the plans; regenerate it: {REGENERATE}\n" \
        + "\n".join(drift[:60])


@pytest.fixture(scope="module")
def mocked() -> dict[str, list[Resource]]:
    """Both sets of the cases program, registered under Pulumi's mocks (a preview of a new stack); the Deployment
    holding a Pulumi secret is left out (the mocks mask its whole spec, where the engine hands the pack the value)."""
    def body() -> None:
        runpy.run_path(str(PROGRAM), run_name="__main__")

    found = {}
    for stack in ("compliant", "violating"):
        config = {"cases:set": stack, "cases:charts": str(ROOT / "no-charts-offline"), "aws:region": "us-east-1"}
        resources = resources_of_plan(plan_document(run_program(stack, config, [], program=body)))
        found[stack] = [r for r in resources if "[secret]" not in json.dumps(r.props)]
    return found


def _findings(resources: list[Resource]) -> list[Finding]:
    return evaluate(resources, load_policy_config(ROOT / "policies" / "config.json"))


def test_the_compliant_set_is_prods_created_stack_and_draws_nothing(mocked: dict[str, list[Resource]]) -> None:
    resources = mocked["compliant"]
    items: list[dict[str, Any]] = yaml.safe_load(BASELINE.read_text(encoding="utf-8"))
    assert sorted(r.name for r in resources) == sorted(i["name"] for i in items)
    assert {r.type for r in resources} >= set(CREATED_STACK)
    assert [f.message for f in _findings(resources)] == []
    proof = prove(resources)
    placed = {p.workload.where: p for p in proof.placements}
    # Nothing is left to the cluster's other nodes: the operator and Karpenter's controller, which ask no GPU, land on
    # prod's system node group, as every pod of a created stack must land on a pool.
    assert [w for w, p in placed.items() if p.elsewhere] == []
    for where in ("Helm release kuberay-operator (operator)", "Helm release karpenter (controller)",
                  "RayService llm head"):
        pool = placed[where].pool
        assert pool is not None and pool.name == "system", where
    l4 = next(p for p in proof.pools if p.name == "l4")
    assert l4.instance is not None and l4.instance.name == L4_INSTANCE
    assert l4.free is not None and l4.free.cpu_m == L4_FREE_CPU_M  # less the add-ons' DaemonSets


def _name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


ENGINE_ONLY = {case("kubernetes:apps/v1:Deployment", "secret-token")}
"""A Pulumi secret (the mocks mask the object around it); and each "can't run" note, which Pulumi words itself."""


def test_each_case_draws_what_the_real_cli_is_expected_to(mocked: dict[str, list[Resource]]) -> None:
    """EXPECTED_VIOLATIONS (tests/test_real_policy.py) but the engine's own shapes, matched on the resource's type
    and name (the mocks' project is Triarch's), and nothing else."""
    findings = _findings(mocked["violating"])
    wanted = [e for e in EXPECTED_VIOLATIONS if e[2] not in ENGINE_ONLY and "can't run" not in e[3]]
    got = [(f.rule.name, f.enforcement, f.resource.type, f.resource.name, f.message) for f in findings
           if "is known only after apply" not in f.message]

    def matches(found: tuple[str, str, str, str, str], expected: tuple[str, str, str, str]) -> bool:
        policy, level, urn, fragment = expected
        type_ = urn.split("::")[2].rsplit("$", 1)[-1]
        text = found[4]
        return found[:4] == (policy, level, type_, _name(urn)) and (
            text.endswith(fragment[:-1]) if fragment.endswith("$") else fragment in text)

    unmatched = [e for e in wanted if not any(matches(g, e) for g in got)]
    unexpected = [g for g in got if not any(matches(g, e) for e in wanted)]
    assert (unmatched, unexpected) == ([], []), "\n".join(["missing:", *map(str, unmatched), "unexpected:",
                                                           *map(str, unexpected)])
    assert len(got) == len(wanted)


def test_the_created_stack_cases_draw_nothing_on_an_adopted_cluster(mocked: dict[str, list[Resource]]) -> None:
    """The same inputs without the Cluster and the add-ons (an adopted cluster's stack): cpu-proxy may run on the
    cluster's other nodes, and addon-share fits an l4 node once the add-ons' share is not taken."""
    adopted = [r for r in mocked["violating"] if r.type not in CREATED_STACK]
    names = {f.resource.name for f in _findings(adopted)}
    assert names & {"cpu-proxy", "addon-share"} == set()
    placed = {p.workload.where: p for p in prove(adopted).placements}
    assert placed["Deployment cpu-proxy"].elsewhere


def test_the_generated_baseline_says_how_to_regenerate_it() -> None:
    assert REGENERATE in BASELINE.read_text(encoding="utf-8").split("\n- ", 1)[0]
    assert Path(ROOT / REGENERATE.rsplit(" ", 1)[-1]).is_file()
