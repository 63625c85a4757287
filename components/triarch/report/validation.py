"""Everything that can be wrong with a stack's input, found before Pulumi's engine starts: the stack file read as
the engine passes config, validated, matrix-checked, and its models and Kubernetes objects planned."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from triarch.catalog import catalog
from triarch.config import StackConfig, from_pulumi_config
from triarch.matrix import Verdict, require_compatible
from triarch.offline import read_stack_config
from triarch.planners.model_plan import ModelPlan
from triarch.planners.models import plan_models
from triarch.planners.objects import KubernetesPlan, plan_kubernetes


@dataclass(frozen=True)
class ValidatedStack:
    """A stack file read the way the engine passes config, validated, and matrix-checked."""

    name: str
    config: dict[str, str]
    secret_keys: list[str]
    stack: StackConfig
    verdicts: list[Verdict]
    models: list[ModelPlan]
    objects: KubernetesPlan


def validate_stack_file(name: str, path: Path) -> ValidatedStack:
    """Everything that can be wrong with a stack's input, checked before the engine starts (raises TriarchError)."""
    config, secret_keys = read_stack_config(path)
    stack = from_pulumi_config(config)
    verdicts = require_compatible(stack, catalog())
    models = plan_models(stack, catalog())
    given = [key.split(":", 1)[1] for key in config if key.startswith("triarch:")]
    objects = plan_kubernetes(stack, models, catalog(), given)
    return ValidatedStack(name, config, secret_keys, stack, verdicts, models, objects)
