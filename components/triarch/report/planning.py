"""A validated stack registered under Pulumi's mock engine and written out: plan.json and the manifests, with
capacity.json and the mirror list beside them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triarch.catalog import catalog
from triarch.config import StackConfig
from triarch.cost import CAPACITY_FILE, capacity_report
from triarch.errors import TriarchError
from triarch.existing import trusted_note
from triarch.matrix import Verdict
from triarch.offline import PlanRun, plan_document, run_program, write_plan
from triarch.planners.model_plan import ModelPlan
from triarch.planners.registry import MIRROR_FILE, mirror_list
from triarch.program import StackError
from triarch.report.validation import ValidatedStack


@dataclass(frozen=True)
class PlanResult:
    stack: StackConfig
    verdicts: list[Verdict]
    models: list[ModelPlan]
    run: PlanRun
    manifest_paths: list[Path]
    capacity: dict[str, Any]
    """capacity.json: GPUs and monthly cost per pool, GPUs per model (triarch.cost)."""
    trusted: str | None = None
    """What the plan takes on trust about the cluster (triarch.existing), said in the summary."""


def plan_stack(validated: ValidatedStack, out: Path) -> PlanResult:
    try:
        run = run_program(validated.name, validated.config, validated.secret_keys)
    except StackError as error:
        raise TriarchError(str(error)) from None
    manifests = write_plan(run, out)
    capacity = capacity_report(validated.name, validated.stack, validated.models, catalog())
    (out / CAPACITY_FILE).write_text(json.dumps(capacity, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    mirrored = mirror_list(plan_document(run), validated.stack)
    (out / MIRROR_FILE).write_text(json.dumps(mirrored, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return PlanResult(validated.stack, validated.verdicts, validated.models, run, manifests, capacity,
                      trusted_note(validated.stack, validated.objects))
