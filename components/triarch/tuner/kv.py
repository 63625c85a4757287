"""KV-cache pages: bytes per token per GPU for each attention kind, and the blocks an amount of memory holds."""

from __future__ import annotations

import math
from dataclasses import dataclass

from triarch.tuner.arch import ModelArch, TuneError
from triarch.tuner.layers import LayerKind

KV_CACHE_DTYPES: dict[str, int | None] = {
    "auto": None, "bfloat16": 2, "float16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "fp8_ds_mla": 1,
}
"""vLLM ``--kv-cache-dtype`` choices -> bytes per element (None: the model's serving dtype)."""

DEFAULT_BLOCK_SIZE = 16
"""vLLM's default KV block size on CUDA (tokens per page)."""


def kv_dtype_bytes(arch: ModelArch, kv_cache_dtype: str = "auto") -> int:
    """Bytes per KV element: the serving dtype for "auto", 1 for any fp8 variant."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise TuneError(f"kv_cache_dtype {kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
    size = KV_CACHE_DTYPES[kv_cache_dtype]
    return arch.serving_dtype_bytes if size is None else size


def kv_heads_per_gpu(arch: ModelArch, tensor_parallel_size: int = 1) -> int:
    """KV heads each TP rank caches: ``max(1, num_kv_heads // tp)``; 1 latent for MLA on every rank."""
    if arch.is_mla:
        return 1
    return max(1, arch.num_key_value_heads // tensor_parallel_size)


def layers_per_gpu(arch: ModelArch, pipeline_parallel_size: int = 1) -> int:
    """Decoder layers on one pipeline stage (rounded up: the biggest stage decides)."""
    return math.ceil(arch.num_hidden_layers / pipeline_parallel_size)


def kv_bytes_per_token(
    arch: ModelArch,
    *,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    kv_cache_dtype: str = "auto",
) -> int:
    """KV-cache bytes one token takes on one GPU, as vLLM pages it.

    Per layer: ``2 x kv_heads_per_gpu x head_dim x dtype_bytes`` (K and V); MLA: ``(kv_lora_rank +
    qk_rope_head_dim) x dtype_bytes`` (one compressed latent, no x2, not sharded by TP). Times the layers on the GPU.
    """
    dtype = kv_dtype_bytes(arch, kv_cache_dtype)
    if arch.is_mla:
        per_layer = ((arch.kv_lora_rank or 0) + arch.qk_rope_head_dim) * dtype
    else:
        per_layer = 2 * kv_heads_per_gpu(arch, tensor_parallel_size) * arch.head_dim * dtype
    return per_layer * layers_per_gpu(arch, pipeline_parallel_size)


def kv_cache_capacity(available_bytes: int, kv_bytes_per_token_: int, block_size: int = DEFAULT_BLOCK_SIZE) -> tuple[
    int, int
]:
    """(blocks, tokens) vLLM allocates from ``available_bytes``: ``blocks = available // (block_size x
    bytes/token)``, ``tokens = blocks x block_size``; (0, 0) when nothing is available."""
    if available_bytes <= 0:
        return 0, 0
    blocks = available_bytes // (block_size * kv_bytes_per_token_)
    return blocks, blocks * block_size


@dataclass(frozen=True)
class KvGroup:
    """Layers of one attention kind whose KV pages share one block table (vLLM's KV cache group)."""

    kind: LayerKind
    layers: int


@dataclass(frozen=True)
class KvLayout:
    """How vLLM's hybrid KV-cache manager groups one GPU's layers, and what a request needs from the block pool.

    Layers are bucketed by kind; the group size is the smallest bucket (the largest when it is under 1.5 times the
    smallest), each bucket is split into groups of that size (padded), and the i-th layer of every group shares one
    tensor: a block costs ``group_size x page`` bytes (vllm/v1/core/kv_cache_utils.py, 0.19.0 :1081-1157 and
    ``_get_kv_cache_groups_uniform_page_size``; 0.33.0 kv_cache_planning.py :574-741).
    """

    groups: tuple[KvGroup, ...]
    group_size: int
    page_bytes: int
    """One layer's page: ``block_size x`` bytes per token per layer."""
    block_size: int
    sliding_window: int | None = None
    chunk_size: int | None = None

    @property
    def bytes_per_block(self) -> int:
        return self.group_size * self.page_bytes

    def blocks(self, available_bytes: int) -> int:
        return max(0, available_bytes // self.bytes_per_block)

    def blocks_per_request(self, length: int, in_flight_tokens: int) -> int:
        """Pages one request of ``length`` tokens holds, summed over the groups (``max_memory_usage_bytes`` per
        spec: full ``cdiv(L, bs)``; sliding ``cdiv(min(W - 1 + T, L), bs) + 1``; chunked ``cdiv(min(C + T, L),
        bs)``; T the tokens in flight, vllm/v1/kv_cache_interface.py)."""
        bs = self.block_size
        total = 0
        for group in self.groups:
            if group.kind == "sliding" and self.sliding_window:
                total += -(-min(self.sliding_window - 1 + in_flight_tokens, length) // bs) + 1
            elif group.kind == "chunked" and self.chunk_size:
                total += -(-min(self.chunk_size + in_flight_tokens, length) // bs)
            else:
                total += -(-length // bs)
        return total


def kv_layout(
    arch: ModelArch,
    *,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    kv_cache_dtype: str = "auto",
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> KvLayout:
    """The groups of the layers on one GPU (the first, largest, pipeline stage)."""
    per_layer = kv_bytes_per_token(arch, tensor_parallel_size=tensor_parallel_size, kv_cache_dtype=kv_cache_dtype)
    per_layer //= arch.num_hidden_layers
    kinds = arch.layout.kinds[: layers_per_gpu(arch, pipeline_parallel_size)]
    buckets: dict[LayerKind, int] = {}
    for kind in kinds:
        buckets[kind] = buckets.get(kind, 0) + 1
    sizes = list(buckets.values())
    group_size = max(sizes) if len(sizes) == 1 or max(sizes) < 1.5 * min(sizes) else min(sizes)
    groups = tuple(KvGroup(kind, min(group_size, count - i * group_size))
                   for kind, count in buckets.items() for i in range(math.ceil(count / group_size)))
    return KvLayout(groups, group_size, block_size * per_layer, block_size,
                    arch.layout.sliding_window, arch.layout.chunk_size)
