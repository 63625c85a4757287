"""vLLM engine-arg tuner: from a model's config.json and a GPU to the engine args that fit, with the arithmetic shown.

Pure Python: no GPU, no torch, no network. The numbers follow how vLLM (V1 engine) sizes its KV cache at start-up:

1. **Weights.** ``Model loading took X GiB`` is the checkpoint's parameters x bytes per parameter, split over
   ``tensor_parallel_size x pipeline_parallel_size`` GPUs (:func:`count_parameters`, :func:`weight_bytes`).
2. **Memory profile.** vLLM requests ``total x gpu_memory_utilization`` per GPU, runs a dummy forward pass of
   ``max_num_batched_tokens`` tokens (and, for generation, a dummy sampler pass of ``max_num_seqs`` rows) and
   subtracts weights, non-torch memory (CUDA context, NCCL buffers) and the activation peak; a CUDA-graph estimate
   comes off too. What is left is ``Available KV cache memory`` (:func:`memory_budget`). Passing vLLM's own
   ``kv_cache_memory_bytes`` skips all of that and is taken as is.
3. **Paging.** One token of KV cache on one GPU costs, per layer held by that GPU, ``2 x kv_heads_per_gpu x
   head_dim x dtype_bytes`` with ``kv_heads_per_gpu = max(1, num_kv_heads // tp)`` (heads replicate once TP
   exceeds them). MLA (DeepSeek-V2/V3) caches one latent of ``kv_lora_rank + qk_rope_head_dim`` per layer, no x2,
   replicated on every TP rank (:func:`kv_bytes_per_token`). ``blocks = available // (block_size x that)``,
   ``tokens = blocks x block_size`` and ``Maximum concurrency = tokens / max_model_len``.

:func:`tune` wraps this: it picks the smallest tensor-parallel size that holds the weights and at least one
``max_model_len`` sequence, caps ``max_model_len`` to what fits, and returns a :class:`Sizing` whose
``engine_args`` use vLLM 0.33's ``EngineArgs`` names. When nothing fits it raises :class:`TuneError` with numbers.
"""

from __future__ import annotations

from triarch.tuner.arch import DTYPE_BYTES, TASKS, LengthRefused, ModelArch, Task, TuneError, arch_from_hf_config
from triarch.tuner.kv import (
    DEFAULT_BLOCK_SIZE,
    KV_CACHE_DTYPES,
    kv_bytes_per_token,
    kv_cache_capacity,
    kv_dtype_bytes,
    kv_heads_per_gpu,
    layers_per_gpu,
)
from triarch.tuner.memory import (
    ACTIVATION_SLACK,
    CUDA_GRAPH_BASE_BYTES,
    CUDA_GRAPH_BYTES_PER_LAYER,
    NON_TORCH_BYTES_PER_TP_GROUP,
    NON_TORCH_BYTES_TP1,
    SAMPLER_BYTES_PER_LOGIT,
    MemoryBudget,
    activation_peak_bytes,
    cuda_graph_bytes,
    memory_budget,
    non_torch_bytes,
)
from triarch.tuner.model_files import MODELS_DIR, catalog_models, find_arch, load_arch, load_model_config
from triarch.tuner.plan import DEFAULT_CONTEXT_TARGET, EMBED_MAX_NUM_SEQS, GENERATE_MAX_NUM_SEQS, LARGE_GPU_BYTES
from triarch.tuner.remedies import TYPICAL_CHAT_TOKENS
from triarch.tuner.report import Sizing
from triarch.tuner.search import MIN_CONCURRENCY, TYPICAL_EMBED_TOKENS, tune
from triarch.tuner.units import GIB, MIB
from triarch.tuner.weights import ParameterCount, count_parameters, parameter_breakdown, weight_bytes

__all__ = [
    "ACTIVATION_SLACK", "CUDA_GRAPH_BASE_BYTES", "CUDA_GRAPH_BYTES_PER_LAYER",
    "DEFAULT_BLOCK_SIZE", "DEFAULT_CONTEXT_TARGET", "DTYPE_BYTES", "EMBED_MAX_NUM_SEQS", "GENERATE_MAX_NUM_SEQS",
    "GIB", "KV_CACHE_DTYPES", "LARGE_GPU_BYTES", "MIB", "MIN_CONCURRENCY", "MODELS_DIR",
    "NON_TORCH_BYTES_PER_TP_GROUP", "NON_TORCH_BYTES_TP1", "SAMPLER_BYTES_PER_LOGIT", "TASKS", "TYPICAL_CHAT_TOKENS",
    "TYPICAL_EMBED_TOKENS",
    "LengthRefused", "MemoryBudget", "ModelArch", "ParameterCount", "Sizing", "Task", "TuneError",
    "activation_peak_bytes", "arch_from_hf_config", "catalog_models", "count_parameters", "cuda_graph_bytes",
    "find_arch", "kv_bytes_per_token", "kv_cache_capacity", "kv_dtype_bytes", "kv_heads_per_gpu", "layers_per_gpu",
    "load_arch", "load_model_config", "memory_budget", "non_torch_bytes", "parameter_breakdown", "tune",
    "weight_bytes",
]
