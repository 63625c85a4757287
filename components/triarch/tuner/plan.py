"""One candidate configuration: the memory budget, the KV layout and the block pool at one tensor-parallel size
with one batch, and what vLLM's start-up checks say fits in it."""

from __future__ import annotations

from dataclasses import dataclass

from triarch.tuner.arch import ModelArch, Task
from triarch.tuner.kv import KvLayout, kv_bytes_per_token, kv_layout
from triarch.tuner.lora import LoraSlots
from triarch.tuner.memory import MemoryBudget, memory_budget
from triarch.tuner.releases import Spread, VllmRelease
from triarch.tuner.units import GIB

DEFAULT_CONTEXT_TARGET = 8192
"""When ``max_model_len`` is not given: the TP choice asks for room for one sequence of
min(model max, this) tokens; ``max_model_len`` is then raised to the most that fits, up to the model's maximum."""


GENERATE_MAX_NUM_SEQS = 256
"""vLLM's default ``max_num_seqs`` for online serving; the tuner lowers it when the KV cache holds fewer."""

EMBED_MAX_NUM_SEQS = 256
LARGE_GPU_BYTES = 40 * GIB
"""GPUs at least this big get 8192 batched tokens per step for generation, smaller ones 2048 (vLLM's defaults
for the OpenAI server by GPU class are of the same order)."""


@dataclass(frozen=True)
class Plan:
    tp: int
    budget: MemoryBudget
    kv_per_token: int
    layout: KvLayout
    blocks: int
    max_num_batched_tokens: int
    max_num_seqs_cap: int
    release: VllmRelease
    enforce_eager: bool = False
    """Whether the plan runs without CUDA graphs (their memory is then not taken out)."""

    @property
    def in_flight(self) -> int:
        """Tokens a sliding/chunked layer keeps beyond its window: one step's batch (0.19.0), two with the async
        scheduling 0.29+ counts (vllm/config/vllm.py max_in_flight_tokens)."""
        return self.max_num_batched_tokens * self.release.in_flight_batches

    def usable_blocks(self) -> int:
        """Blocks a request may take: all, less the null block where the release reserves it."""
        return max(0, self.blocks - (1 if self.release.null_block_reserved else 0))

    def fits(self, length: int) -> bool:
        """vLLM's start-up check: one request of ``length`` tokens fits the block pool."""
        return self.blocks > 0 and self.layout.blocks_per_request(length, self.in_flight) <= self.usable_blocks()

    def concurrency(self, length: int) -> float:
        """vLLM's "Maximum concurrency": blocks over the pages one request of ``length`` holds in every group."""
        return self.blocks / self.layout.blocks_per_request(length, self.in_flight)

    def longest(self, ceiling: int) -> int:
        """The longest request (at most ``ceiling``) that fits; 0 if not even one block does."""
        if self.fits(ceiling):
            return ceiling
        low, high = 0, ceiling  # fits(low) (or low == 0), not fits(high)
        while high - low > 1:
            mid = (low + high) // 2
            if self.fits(mid):
                low = mid
            else:
                high = mid
        return low

    def reported_tokens(self, length: int | None) -> int:
        """"GPU KV cache size: N tokens" as the release computes it."""
        if self.release.kv_tokens_reported == "concurrency" and length:
            return int(self.concurrency(length) * length)
        return self.blocks // len(self.layout.groups) * self.layout.block_size


def plan_for(
    arch: ModelArch,
    total: int,
    tp: int,
    *,
    release: VllmRelease,
    pp: int,
    util: float,
    kv_cache_dtype: str,
    kv_cache_memory_bytes: int | None,
    task: Task,
    block_size: int,
    longest: int | None,
    enforce_eager: bool,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    spread: Spread | None = None,
    lora: LoraSlots | None = None,
) -> Plan:
    if task == "embed":
        # Pooling runs without chunked prefill: a whole request (up to the longest max_model_len this plan may
        # choose) must fit in one step, and the activation estimate must cover that.
        batched = max(DEFAULT_CONTEXT_TARGET, longest or 0)
        seqs_cap = EMBED_MAX_NUM_SEQS
    else:
        batched = 8192 if total >= LARGE_GPU_BYTES else 2048
        seqs_cap = GENERATE_MAX_NUM_SEQS
    batched = max_num_batched_tokens or batched
    seqs_cap = max_num_seqs or seqs_cap
    budget = memory_budget(
        arch, total, release=release, tensor_parallel_size=tp, pipeline_parallel_size=pp,
        gpu_memory_utilization=util, max_num_batched_tokens=batched, max_num_seqs=seqs_cap, task=task,
        kv_cache_memory_bytes=kv_cache_memory_bytes, enforce_eager=enforce_eager, spread=spread, lora=lora,
    )
    per_token = kv_bytes_per_token(arch, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                                   kv_cache_dtype=kv_cache_dtype)
    layout = kv_layout(arch, tensor_parallel_size=tp, pipeline_parallel_size=pp, kv_cache_dtype=kv_cache_dtype,
                       block_size=block_size)
    blocks = layout.blocks(budget.available_kv)
    if kv_cache_memory_bytes is not None and budget.spare < 0:
        blocks = 0  # the given KV cache does not fit next to the weights
    return Plan(tp, budget, per_token, layout, blocks, batched, seqs_cap, release, enforce_eager)
