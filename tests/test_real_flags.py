"""Every engine arg Triarch emits exists in the pinned vLLM releases (0.33.0 for vllm/vllm-openai, 0.29.0 inside
Ray 2.60's ray[llm]). The name lists come from the reference cache (`triarch refdata fill`); without it these tests
skip (fail under CI), saying so in one line."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import reference_file
from triarch.catalog import catalog
from triarch.tuner import TuneError, catalog_models, load_arch
from triarch.tuner.nodes import tune_nodes

RELEASES = ("vllm-0.33.0", "vllm-0.29.0")


def engine_arg_names(release: str) -> set[str]:
    return set(reference_file(release, "engine-args.txt").read_text(encoding="utf-8").split())


VARIANTS: list[dict[str, Any]] = [
    {},
    {"kv_cache_dtype": "fp8"},
    {"kv_cache_memory_bytes": 4 * 1024**3},
    {"enforce_eager": True, "pipeline_parallel_size": 2},
]


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("model", catalog_models())
def test_tuned_engine_args_exist_in_the_pinned_vllm(release: str, model: str) -> None:
    names = engine_arg_names(release)
    arch = load_arch(model)
    task = "embed" if "embedding" in model.lower() else "generate"
    emitted: set[str] = set()
    for variant in VARIANTS:
        try:
            # on up to four 8 x H100 nodes: a model one node cannot hold spans several (DeepSeek-V3)
            sizing = tune_nodes(arch, catalog().gpus["h100-80gb"], gpus_per_node=8, max_nodes=4, task=task,
                                **variant)
        except TuneError:
            continue  # a refusal emits nothing
        emitted |= set(sizing.engine_args)
    assert emitted, f"no variant of {model} produced engine args"
    unknown = emitted - names
    assert not unknown, f"{model}: {sorted(unknown)} are not EngineArgs fields of {release}"
