"""The GPU memory of vLLM's LoRA adapter slots (models[].adapters), as vLLM 0.29.0 allocates it: taken out of the
budget before the KV cache, like the weights.

vLLM wraps the model for LoRA inside ``load_model`` (v1/worker/gpu_model_runner.py ``GPUModelRunner.load_model``
calls ``load_lora_model`` under the ``DeviceMemoryProfiler`` whose ``consumed_memory`` is ``model_memory_usage``),
so the slots' buffers are part of what ``Worker.determine_available_memory`` (v1/worker/gpu_worker.py) subtracts
from ``total x gpu_memory_utilization`` before it sizes the KV cache. The profile run then runs with ``max_loras``
dummy adapters (lora_model_runner_mixin.py ``maybe_setup_dummy_loras``) in those same buffers.

Each wrapped layer holds, per slot, a LoRA A of ``max_lora_rank x input`` and a LoRA B of ``output x max_lora_rank``
per output slice, in the model's dtype (``lora_dtype: auto``), zeroed for ``max_loras`` slots
(lora/layers/base_linear.py ``BaseLinearLayerWithLoRA.create_lora_weights``, column_parallel_linear.py
``MergedColumnParallelLinearWithLoRA.create_lora_weights``):
- column-parallel layers (qkv_proj as three slices q, k, v; gate_up_proj as two): A over the whole input, B over the
  rank's share of the output;
- row-parallel layers (o_proj, down_proj): A over the rank's share of the input, B over the whole output;
- the embedding (lora/layers/vocab_parallel_embedding.py: A ``vocab x rank``, B ``hidden x rank``) and the LM head
  (lora/layers/logits_processor.py: A ``rank x hidden``, B ``vocab x rank``), both whole on every rank; every
  linear layer and both embeddings are LoRA modules by default (lora/utils.py ``get_supported_lora_modules``).
The punica wrapper's index buffers (a few int tensors of max_num_batched_tokens) are left out: kilobytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from triarch.tuner.arch import ModelArch, TuneError

MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM's --max-lora-rank takes (vllm/config/lora.py ``MaxLoRARanks``, 0.29.0; engine-args list of 0.33.0
has the same flag). An adapter of a smaller rank fits a larger slot."""
MAX_LORA_VOCAB = 258048
"""vLLM refuses LoRA on a model whose vocabulary is larger (lora/layers/logits_processor.py, 0.29.0)."""


def slot_rank(largest: int) -> int:
    """The --max-lora-rank holding an adapter of rank ``largest``: the smallest value vLLM takes at least as large."""
    for rank in MAX_LORA_RANKS:
        if rank >= largest:
            return rank
    raise TuneError(f"LoRA rank {largest} is above vLLM's largest --max-lora-rank {MAX_LORA_RANKS[-1]}")


@dataclass(frozen=True)
class LoraSlots:
    """vLLM's --max-loras and --max-lora-rank: the adapter slots every replica reserves."""

    max_loras: int
    max_lora_rank: int


def lora_slot_bytes(arch: ModelArch, slots: LoraSlots | None, *, tensor_parallel_size: int = 1,
                    pipeline_parallel_size: int = 1) -> int:
    """Bytes of LoRA slots on one GPU of the heaviest pipeline stage (see the module's notes). Dense attention
    models only: vLLM wraps a mixture of experts' and an MLA model's layers differently, which Triarch does not
    model yet (TuneError)."""
    if slots is None:
        return 0
    if arch.is_moe or arch.is_mla:
        raise TuneError("LoRA slots are sized for dense attention models only; this model is a mixture of experts "
                        "or uses MLA")
    if arch.vocab_size > MAX_LORA_VOCAB:
        raise TuneError(f"vLLM refuses LoRA for a vocabulary above {MAX_LORA_VOCAB} ({arch.vocab_size})")
    tp = tensor_parallel_size
    h, d = arch.hidden_size, arch.head_dim
    q = arch.num_attention_heads * d // tp
    kv = max(1, arch.num_key_value_heads // tp) * d
    inter = arch.intermediate_size // tp
    # (input + output) per slice, for A (rank x input) and B (output x rank).
    qkv = 3 * h + q + 2 * kv  # three slices of the whole input, each its share of the output
    o_proj = q + h  # the rank's share of the input, the whole output
    gate_up = 2 * h + 2 * inter
    down = inter + h
    per_layer = qkv + o_proj + gate_up + down
    layers = math.ceil(arch.num_hidden_layers / pipeline_parallel_size)
    # The embedding lives on the first stage, the LM head on the last: one of them on a stage of a split model.
    vocab = (1 if pipeline_parallel_size > 1 else 2) * (arch.vocab_size + h)
    elements = (layers * per_layer + vocab) * slots.max_lora_rank * slots.max_loras
    return elements * arch.serving_dtype_bytes
