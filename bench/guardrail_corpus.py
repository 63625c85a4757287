"""How right the guardrails are on manifests Triarch did not write: precision and the real problems found.

    uv run --extra test python bench/guardrail_corpus.py

Runs the pack over bench/guardrail-corpus/manifests (written from the shapes of public LLM-serving manifests; each
file names its source) with bench/guardrail-corpus/policy-config.json, and compares every finding with its hand label
in bench/guardrail-corpus/labels.yaml. Prints findings by enforcement, true and false, precision, and the real
problems found out of those known (the labelled true findings and the `missed` ones). Exit 1 on an unlabelled
finding or a mandatory false positive.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from triarch.guardrails.check import Finding, evaluate
from triarch.guardrails.manifests import read_manifests

CORPUS = Path(__file__).resolve().parent / "guardrail-corpus"


@dataclass(frozen=True)
class Result:
    labelled: list[tuple[Finding, dict[str, Any]]]
    unlabelled: list[Finding]
    missed: list[dict[str, Any]]

    def counts(self, enforcement: str) -> tuple[int, int]:
        mine = [label for f, label in self.labelled if f.enforcement == enforcement]
        return sum(bool(label["real"]) for label in mine), sum(not label["real"] for label in mine)


def file_of(finding: Finding) -> str:
    return Path(finding.resource.urn.split("#", 1)[0]).name


def run() -> Result:
    config = json.loads((CORPUS / "policy-config.json").read_text(encoding="utf-8"))
    labels = yaml.safe_load((CORPUS / "labels.yaml").read_text(encoding="utf-8"))
    findings = evaluate(read_manifests([str(CORPUS / "manifests")]), config)
    labelled, unlabelled = [], []
    for finding in findings:
        match = [label for label in labels["findings"] if label["file"] == file_of(finding)
                 and label["policy"] == finding.rule.name and label["match"] in finding.message]
        if len(match) == 1:
            labelled.append((finding, match[0]))
        else:
            unlabelled.append(finding)
    return Result(labelled, unlabelled, list(labels.get("missed") or []))


def main() -> int:
    result = run()
    print(f"{len(list((CORPUS / 'manifests').glob('*.yaml')))} manifests, {len(result.labelled)} findings labelled")
    for enforcement in ("mandatory", "advisory"):
        real, wrong = result.counts(enforcement)
        total = real + wrong
        precision = f"{real / total:.0%}" if total else "-"
        print(f"  {enforcement:9} {total:3} findings: {real} real, {wrong} wrong (precision {precision})")
    real = sum(bool(label["real"]) for _, label in result.labelled)
    known = real + len(result.missed)
    print(f"  real problems found: {real} of {known} known ({real / known:.0%})")
    for missed in result.missed:
        print(f"    missed: {missed['file']}: {missed['problem']}")
    for finding in result.unlabelled:
        print(f"  UNLABELLED: {file_of(finding)} {finding.rule.name}: {finding.message}")
    mandatory_wrong = result.counts("mandatory")[1]
    return 1 if result.unlabelled or mandatory_wrong else 0


if __name__ == "__main__":
    sys.exit(main())
