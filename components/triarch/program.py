"""The Pulumi program: config -> validated model -> matrix check -> platform. `__main__.py` only calls `main`."""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi.runtime.config import CONFIG, get_config_env

from triarch.catalog import catalog
from triarch.components.platform import Platform
from triarch.config import NAMESPACE, StackConfig, from_pulumi_config
from triarch.errors import TriarchError
from triarch.matrix import require_compatible
from triarch.planners.models import ModelPlan, plan_models


class StackError(pulumi.RunError):
    """A TriarchError raised through the engine: the CLI prints only its sentence; `triarch plan` exits 2."""


def pulumi_config_values() -> dict[str, Any]:
    """Every config value of the running stack ("ns:key" -> value), as the Pulumi engine passed them."""
    return {**get_config_env(), **CONFIG.get()}


def load_stack() -> tuple[StackConfig, list[ModelPlan]]:
    """Validate config, the driver/CUDA matrix and every model's sizing before any resource exists; a mistake is
    one sentence."""
    stack = from_pulumi_config(pulumi_config_values())
    for verdict in require_compatible(stack, catalog()):
        if verdict.level == "warning":
            pulumi.log.warn(verdict.message)
    return stack, plan_models(stack, catalog())


def main() -> Platform:
    try:
        stack, models = load_stack()
    except TriarchError as error:
        # RunError prints the sentence without a traceback under the Pulumi CLI.
        raise StackError(str(error)) from None
    hf_token = pulumi.Config(NAMESPACE).get_secret("hfToken")
    platform = Platform("triarch", stack, catalog(), models, hf_token)
    pulumi.export("pools", [p.name for p in platform.pools])
    pulumi.export("models", {p.name: {"engine": p.config.engine, "tensorParallelSize": p.sizing.tensor_parallel_size,
                                      "kvCacheTokens": p.sizing.kv_cache_tokens} for p in models})
    return platform
