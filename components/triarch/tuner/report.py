"""The tuner's answer, and the start-up lines vLLM would print for it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from triarch.tuner.arch import Task
from triarch.tuner.memory import MemoryBudget
from triarch.tuner.units import GIB


@dataclass(frozen=True)
class Sizing:
    """The tuner's answer for one model on one GPU type: the numbers and the vLLM engine args they give."""

    model: str
    gpu: str
    task: Task
    num_parameters: int
    weights_bytes: int
    """Whole model; per GPU it is ``memory.weights``."""
    kv_bytes_per_token: int
    """Per GPU (after TP/PP sharding)."""
    kv_cache_blocks: int
    kv_bytes_per_block: int
    """What one block costs on one GPU: a page in every layer of a KV cache group (all layers, without hybrid
    grouping)."""
    kv_cache_tokens: int
    block_size: int
    max_model_len: int | None
    max_concurrency: float | None
    """``kv_cache_tokens / max_model_len``; None when ``max_model_len`` is unknown."""
    tensor_parallel_size: int
    pipeline_parallel_size: int
    available_kv_bytes: int
    memory: MemoryBudget
    engine_args: dict[str, Any]
    """vLLM ``EngineArgs`` names (0.33) -> values."""
    notes: tuple[str, ...] = field(default=())
    """Adjustments the tuner made (capped lengths, ...), one sentence each."""
    context_limit: int | None = None
    """The longest context the release derives from the model's files (None: the config names none)."""
    context_derivation: str = ""
    """How: the key, and the rope or sentence-transformers step that changed it."""
    vllm_version: str = ""
    """The vLLM release whose start-up rules sized this (see :mod:`triarch.tuner.releases`)."""
    combined_kv_line: bool = True
    """vLLM 0.29+ prints the KV cache size and the concurrency on one line; 0.19 on two."""
    nodes: int = 1
    """Nodes one replica spans (tensor x pipeline GPUs over ``gpus_per_node``): a replica beyond one node takes
    whole nodes."""
    gpus_per_node: int = 0
    """The pool's GPUs per node the replica was sized for (0: not sized for a pool)."""
    stage_weights: tuple[int, ...] = ()
    """Weights on one GPU of each pipeline stage (the first holds the embedding, the last the LM head)."""
    kv_cache_tokens_low: int = 0
    """``kv_cache_tokens`` at the pessimistic end of the memory estimate (every component at its worst calibrated
    underestimate; templates/compat/vllm-releases.yaml estimateSpread): what the engine args were chosen to start
    with."""
    available_kv_bytes_low: int = 0
    moe: bool = False
    """Whether the model routes tokens to experts (its start warms up the MoE kernels too)."""
    sized_for: str = "pessimistic"
    """Which end of the memory estimate one request of ``max_model_len`` fits at: ``pessimistic`` (both) or
    ``nominal`` (only there: vLLM may refuse to start, and `triarch plan` refuses it)."""
    fits_instead: tuple[tuple[str, int | str], ...] = ()
    """When sized for the nominal end only: each change (a tuner argument and its value) with which one request
    fits at the pessimistic end too; empty when none within reach does (more GPUs per replica, then)."""

    def shortfall(self) -> str:
        """Why a configuration sized for the nominal end only may not start, in the tuner's words."""
        what = f"one request of max_model_len {self.max_model_len}" if self.max_model_len else "one KV block"
        return (f"at the pessimistic end of the memory estimate {what} does not fit ({self.kv_cache_tokens_low:,} "
                f"tokens of KV cache at tensor_parallel_size={self.tensor_parallel_size}): vLLM may refuse to start")

    def stage_lines(self) -> list[str]:
        """How a multi-stage replica splits: where the stages run and what each GPU of them holds."""
        if self.pipeline_parallel_size == 1 or not self.stage_weights:
            return []
        per_node = self.gpus_per_node or self.tensor_parallel_size * self.pipeline_parallel_size
        stages_per_node = max(1, per_node // self.tensor_parallel_size)
        lines = [f"{self.nodes} node(s) of {per_node} GPU(s): tensor_parallel_size={self.tensor_parallel_size} "
                 f"within a node, pipeline_parallel_size={self.pipeline_parallel_size} "
                 f"({stages_per_node} stage(s) per node)"]
        last = len(self.stage_weights) - 1
        for i, weights in enumerate(self.stage_weights):
            holds = " + embedding" if i == 0 else (" + LM head" if i == last else "")
            lines.append(f"stage {i} (node {i // stages_per_node}): {weights / GIB:.2f} GiB of weights per GPU"
                         f" (its layers{holds})")
        lines.append(f"vLLM gives every stage the KV cache of the fullest GPU ({self.memory.weights / GIB:.2f} GiB of "
                     "weights): the lines below are that GPU's")
        return lines

    def log_lines(self) -> list[str]:
        """The start-up lines vLLM (V1) would print for this configuration."""
        lines = [
            f"Model loading took {self.memory.weights / GIB:.2f} GiB memory",
            f"Available KV cache memory: {self.available_kv_bytes / GIB:.2f} GiB",
        ]
        size = f"GPU KV cache size: {self.kv_cache_tokens:,} tokens"
        if self.max_model_len is None or self.max_concurrency is None:
            return [*lines, size]
        concurrency = f"Maximum concurrency for {self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x"
        return [*lines, f"{size}, {concurrency}"] if self.combined_kv_line else [*lines, size, concurrency]
