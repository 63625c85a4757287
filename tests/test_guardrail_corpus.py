"""The guardrails on public-shaped manifests Triarch did not write (bench/guardrail-corpus): every finding labelled by
hand, no mandatory finding wrong, nine in ten known real problems found."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from conftest import bench_module
from triarch.guardrails.check import evaluate
from triarch.guardrails.manifests import read_manifests

BENCH = Path(__file__).resolve().parents[1] / "bench"


def corpus() -> ModuleType:
    return bench_module("guardrail_corpus")


def test_every_finding_is_labelled_and_no_mandatory_one_is_wrong() -> None:
    result = corpus().run()
    assert [f"{f.rule.name}: {f.message}" for f in result.unlabelled] == []
    real, wrong = result.counts("mandatory")
    assert wrong == 0 and real >= 20
    found = real + result.counts("advisory")[0]
    assert found / (found + len(result.missed)) >= 0.9


def test_a_node_agent_needs_its_exemption() -> None:
    """Without policy-config.json's exemption the DCGM exporter's SYS_ADMIN is a mandatory finding: the pack is
    tuned for a platform by naming its node agents, not by lowering the rule."""
    manifests = read_manifests([str(BENCH / "guardrail-corpus" / "manifests" / "08-dcgm-exporter.yaml")])
    assert [(f.rule.name, f.enforcement) for f in evaluate(manifests)] == [("no-privileged-pods", "mandatory")]
