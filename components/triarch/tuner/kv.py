"""KV-cache pages: bytes per token per GPU for each attention kind, and the blocks an amount of memory holds."""

from __future__ import annotations

import math

from triarch.tuner.arch import ModelArch, TuneError

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
