"""The triarch-guardrails rules against real-world resource shapes (tests/policy_fixtures/<policy>.yaml), their
per-policy configuration, and `triarch check` end to end on the shipped stacks."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from conftest import ROOT, stack_document, write_stack_file
from triarch.cli import main
from triarch.errors import ConfigError
from triarch.guardrails.base import Resource, Rule
from triarch.guardrails.check import Finding, evaluate
from triarch.guardrails.registry import RULES
from triarch.guardrails.unknowns import judge_resource, judge_stack

FIXTURES = Path(__file__).resolve().parent / "policy_fixtures"
RULES_BY_NAME = {r.name: r for r in RULES}
LAYERS = {"Kubernetes", "Ray", "vLLM"}


def load_fixture(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{path.name}: expected a mapping"
    return data


def fixture_cases() -> list[Any]:
    params = []
    for path in sorted(FIXTURES.glob("*.yaml")):
        data = load_fixture(path)
        for kind in ("compliant", "violating", "unjudged"):
            for i, case in enumerate(data.get(kind) or []):
                params.append(pytest.param(data["policy"], kind, case, id=f"{path.stem}-{kind}-{i}-{case['case']}"))
    return params


def resources_of(case: dict[str, Any]) -> list[Resource]:
    return [Resource(r["type"], r["name"], r.get("props") or {}, f"urn:pulumi:test::triarch::{r['type']}::{r['name']}")
            for r in case["resources"]]


def messages(rule: Rule, resources: list[Resource]) -> list[str]:
    return [m for m, advisory in judged(rule, resources) if not advisory]


def judged(rule: Rule, resources: list[Resource]) -> list[tuple[str, bool]]:
    """The rule's messages, each with whether it is the advisory note of a value it could not see."""
    settings = rule.settings(None)
    if rule.check_stack is not None:
        found, unjudged = judge_stack(rule, resources, settings)
        return [(m, False) for _, m in found] + ([(unjudged[1], True)] if unjudged else [])
    out: list[tuple[str, bool]] = []
    for resource in resources:
        found_here, note = judge_resource(rule, resource, settings)
        out += [(m, False) for m in found_here] + ([(note, True)] if note else [])
    return out


# --- fixtures ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("policy", "kind", "case"), fixture_cases())
def test_fixture_case(policy: str, kind: str, case: dict[str, Any]) -> None:
    assert policy in RULES_BY_NAME, f"fixture for unknown policy {policy}"
    found = judged(RULES_BY_NAME[policy], resources_of(case))
    if kind == "compliant":
        assert found == [], f"{policy} flagged a compliant case ({case['case']}): {found}"
    elif kind == "unjudged":  # nothing wrong seen, and a note that a value it reads was not there to see
        assert [advisory for _, advisory in found] == [True], found
        assert case["expect"] in found[0][0], found
    else:
        found = [(m, advisory) for m, advisory in found if not advisory]
        expect = case["expect"]
        assert any(expect in m for m, _ in found), f"{policy} on {case['case']}: none contains {expect!r}: {found}"


def test_every_rule_has_fixtures_of_both_kinds() -> None:
    files = {p.stem: load_fixture(p) for p in FIXTURES.glob("*.yaml")}
    missing, stray = sorted(set(RULES_BY_NAME) - set(files)), sorted(set(files) - set(RULES_BY_NAME))
    assert not missing and not stray, f"policies without fixtures: {missing}; fixtures without a policy: {stray}"
    for name, data in files.items():
        assert data.get("policy") == name, f"{name}.yaml declares policy {data.get('policy')!r}"
        assert set(data) <= {"policy", "compliant", "violating", "unjudged"}, f"{name}.yaml: {sorted(data)}"
        for kind in ("compliant", "violating"):
            cases = data.get(kind) or []
            assert cases, f"{name}.yaml has no {kind} case"
            for case in cases:
                assert case.get("case") and case.get("resources"), f"{name}.yaml {kind}: case without resources"
                assert all({"type", "name", "props"} <= set(r) for r in case["resources"]), f"{name}: {case['case']}"
                if kind == "violating":
                    assert case.get("expect"), f"{name}.yaml: violating case {case['case']!r} has no expect"
        for case in data.get("unjudged") or []:
            assert case.get("expect") and case.get("resources"), f"{name}.yaml unjudged: {case.get('case')!r}"


# --- the rules themselves ----------------------------------------------------------------------------------


def test_rule_catalogue() -> None:
    assert len(RULES) >= 12
    assert len(RULES_BY_NAME) == len(RULES), "duplicate policy names"
    for rule in RULES:
        assert rule.description.strip(), f"{rule.name}: empty description"
        assert rule.layer in LAYERS, f"{rule.name}: layer {rule.layer}"
        assert rule.enforcement in ("mandatory", "advisory", "disabled"), rule.name
        assert (rule.check_resource is None) != (rule.check_stack is None), f"{rule.name}: needs exactly one check"
        for key, schema in rule.config.items():
            assert "type" in schema and "default" in schema, f"{rule.name}.{key}: schema without type/default"
            jsonschema.validate(schema["default"], schema)
        assert rule.settings(None) == {k: s["default"] for k, s in rule.config.items()}
    assert {r.layer for r in RULES} == LAYERS


def test_the_registry_notes_each_rules_layer_and_enforcement() -> None:
    """The registry is where a reader sees every rule: the note beside each entry stays its layer and default
    enforcement."""
    source = (ROOT / "components" / "triarch" / "guardrails" / "registry.py").read_text(encoding="utf-8")
    notes = re.findall(r"^ +\w+\.[A-Z0-9_]+, +# (\S+) +(\S+)$", source, re.MULTILINE)
    assert notes == [(r.layer, r.enforcement) for r in RULES]


def violating_resources(policy: str) -> list[Resource]:
    data = load_fixture(FIXTURES / f"{policy}.yaml")
    return [r for case in data["violating"] for r in resources_of(case)]


def of(findings: list[Finding], policy: str) -> list[Finding]:
    return [f for f in findings if f.rule.name == policy]


def test_disabled_policy_is_silenced() -> None:
    resources = violating_resources("gpu-zone-spread")
    assert of(evaluate(resources), "gpu-zone-spread")
    assert not of(evaluate(resources, {"gpu-zone-spread": "disabled"}), "gpu-zone-spread")
    assert not of(evaluate(resources, {"gpu-zone-spread": {"enforcementLevel": "disabled"}}), "gpu-zone-spread")


def test_threshold_config_is_honoured() -> None:
    data = load_fixture(FIXTURES / "vllm-memory-utilization.yaml")
    resources = resources_of(next(c for c in data["violating"] if "0.98" in c["case"]))
    assert of(evaluate(resources), "vllm-memory-utilization")
    assert not of(evaluate(resources, {"vllm-memory-utilization": {"max": 0.99}}), "vllm-memory-utilization")
    assert of(evaluate(resources, {"vllm-memory-utilization": {"max": 0.97}}), "vllm-memory-utilization")


def test_enforcement_level_config_is_honoured() -> None:
    resources = violating_resources("prestop-drain")
    default = of(evaluate(resources), "prestop-drain")
    assert default and {f.enforcement for f in default} == {"mandatory"}
    advisory = of(evaluate(resources, {"prestop-drain": {"enforcementLevel": "advisory"}}), "prestop-drain")
    assert len(advisory) == len(default) and {f.enforcement for f in advisory} == {"advisory"}


@pytest.mark.parametrize("config", [{"gpu-zone-sprad": "disabled"},
                                    {"no-such-policy": {"enforcementLevel": "advisory"}}])
def test_unknown_policy_in_config_is_rejected(config: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=next(iter(config))):
        evaluate([], config)


def test_bad_enforcement_level_is_rejected() -> None:
    with pytest.raises(ConfigError, match="enforcementLevel"):
        evaluate([], {"prestop-drain": {"enforcementLevel": "mandetory"}})


# --- `triarch check` end to end ----------------------------------------------------------------------------


def check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["check", *argv])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("stack", ["local", "dev"])
def test_shipped_stack_passes(stack: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = check(capsys, "--stack", stack)
    assert code == 0, out
    assert "[mandatory]" not in out
    assert "no violations" in out or " 0 mandatory" in f" {out}", out


def test_shipped_prod_passes_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = check(capsys, "--stack", "prod", "--format", "json")
    assert code == 0, out
    report = json.loads(out[out.index("{"):])
    assert report["stack"] == "prod"
    assert isinstance(report["violations"], list)
    assert [v for v in report["violations"] if v["enforcementLevel"] == "mandatory"] == []


def test_local_with_pack_config(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = check(capsys, "--stack", "local", "--policy-config", str(ROOT / "policies" / "config.local.json"))
    assert code == 0, out
    assert "[mandatory]" not in out


@pytest.fixture(scope="module")
def untainted_dev(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = stack_document("dev")
    groups = config["triarch:nodeGroups"]
    assert groups, "dev has no node group"
    for group in groups:
        group["taint"] = False
    return write_stack_file(tmp_path_factory.mktemp("untainted") / "Pulumi.dev.yaml", config)


def test_untainted_node_group_fails_check(untainted_dev: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = check(capsys, "--stack-file", str(untainted_dev))
    assert code == 1, out
    line = next((x for x in out.splitlines() if "gpu-nodegroup-labels-taint" in x), None)
    assert line is not None, out
    assert "[mandatory]" in line and "NodePool l4: no nvidia.com/gpu NoSchedule taint" in line, line


def test_untainted_node_group_markdown(untainted_dev: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = check(capsys, "--stack-file", str(untainted_dev), "--format", "markdown")
    assert code == 1, out
    lines = out.splitlines()
    assert any(x.startswith("| layer") for x in lines), out
    assert any("`gpu-nodegroup-labels-taint`" in x and "taint in its template; add it" in x for x in lines), out


def test_untainted_node_group_json(untainted_dev: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = check(capsys, "--stack-file", str(untainted_dev), "--format", "json")
    assert code == 1, out
    report = json.loads(out[out.index("{"):])
    assert isinstance(report["violations"], list)
    hits = [v for v in report["violations"] if v["policy"] == "gpu-nodegroup-labels-taint"]
    assert hits and all(v["enforcementLevel"] == "mandatory" and v["layer"] == "Kubernetes" for v in hits), report
    assert any("taint in its template; add it" in v["message"]
               and v["resource"]["type"] == "kubernetes:karpenter.sh/v1:NodePool" for v in hits), hits
