"""The memory model of vLLM's start-up profile: what it subtracts from ``total x gpu_memory_utilization`` before
the KV cache (weights, non-torch memory, the activation peak of the profile run, CUDA graphs)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from triarch.tuner.arch import ModelArch, Task
from triarch.tuner.kv import kv_heads_per_gpu, layers_per_gpu
from triarch.tuner.lora import LoraSlots, lora_slot_bytes
from triarch.tuner.releases import Spread, VllmRelease
from triarch.tuner.units import MIB
from triarch.tuner.weights import stage_weight_bytes, weight_bytes

NON_TORCH_BYTES_TP1 = 256 * MIB
"""Non-torch memory the profile adds on one GPU (cuBLAS workspaces, attention-backend buffers): vLLM 0.19.0 logs
"non-torch forward increase memory" of 0.24-0.27 GiB on H100 at TP=1 for every model of llm-d-planner's runs
(bench/llmd-vllm-0.19.0.yaml). What the CUDA context and NCCL hold before vLLM's init snapshot is not charged."""

NON_TORCH_BYTES_PER_TP_GROUP = 1900 * MIB
"""Extra non-torch memory once TP > 1 (NCCL and custom all-reduce buffers allocated during the profile): 2.06-2.21
GiB in all at TP=2/4 on H100 in the same 0.19.0 logs (pipeline parallelism alone adds none: 0.07 GiB at PP=2/4).
Earlier V1 releases logged 0.54 GiB at TP=2 (llm-d-benchmark empirical results): the newer, larger figure is kept."""

CUDA_GRAPH_BASE_BYTES = 300 * MIB
CUDA_GRAPH_BYTES_PER_LAYER = 17 * MIB
"""CUDA-graph estimate per GPU: vLLM 0.19.0 logs "Estimated CUDA graph memory: X GiB total" (51 piecewise and 51
full graphs up to 512 tokens) of 0.84 GiB at 32 layers, 1.02-1.24 at 48, 1.63-1.82 at 80 and 0.52-0.76 at 26-28 on
H100 (bench/llmd-vllm-0.19.0.yaml); 300 MiB + 17 MiB per layer on the GPU follows them within about 0.2 GiB.
Zero with ``enforce_eager``. 0.29+ takes its estimate by capturing the graphs once (same order of size)."""

ACTIVATION_SLACK = 1.1
"""Factor on the modelled forward-pass tensors for allocator fragmentation and temporaries not modelled (the
modelled forward of a 16k-token LLaVA-7B profile was 2.13 GiB against 1.97 GiB logged: little slack needed)."""

SAMPLER_BYTES_PER_LOGIT = 16
"""Peak bytes of vLLM's dummy sampler run per (sequence, vocabulary entry): the float32 logits and a few working
copies. vLLM 0.19.0 logs a "torch peak memory increase" of 15.2-15.8 x max_num_seqs x vocab bytes wherever the
sampler dominates (Llama-3.1-8B 1.89 GiB, Qwen3-8B 2.21 GiB, gemma-3-12b 3.94 GiB at 1024 sequences;
bench/llmd-vllm-0.19.0.yaml). Releases before it logged 38.4-39.6 (llm-d-benchmark empirical results, V1 of early
2025); 0.29+'s V2 runner is not measured and is taken as 0.19.0."""


@dataclass(frozen=True)
class MemoryBudget:
    """One GPU's memory as vLLM's start-up profile splits it (bytes)."""

    total: int
    gpu_memory_utilization: float
    requested: int
    """``total x gpu_memory_utilization`` (or, with ``kv_cache_memory_bytes``, the whole GPU)."""
    weights: int
    non_torch: int
    activation_peak: int
    cuda_graphs: int
    available_kv: int
    """What is left for the KV cache (negative: does not fit); equals ``kv_cache_memory_bytes`` when given."""
    kv_cache_memory_bytes: int | None = None
    graphs_before_kv: bool = True
    """Whether the release took ``cuda_graphs`` out before sizing the KV cache (else they come out of the
    headroom above ``requested``, captured after the KV cache is allocated)."""
    lora_slots: int = 0
    """The LoRA adapter slots' buffers (tuner/lora.py), allocated with the weights."""

    @property
    def overhead(self) -> int:
        """Everything but weights and KV cache that comes out of ``requested``."""
        return (self.non_torch + self.activation_peak + (self.cuda_graphs if self.graphs_before_kv else 0)
                + self.lora_slots)

    @property
    def spare(self) -> int:
        """Unclaimed memory when ``kv_cache_memory_bytes`` is given (negative: over the GPU's total)."""
        return self.requested - self.weights - self.overhead - self.available_kv


def activation_peak_bytes(
    arch: ModelArch,
    *,
    tensor_parallel_size: int = 1,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    task: Task = "generate",
) -> int:
    """Peak activation memory of vLLM's profiling run on one GPU (an estimate).

    vLLM's ``profile_run`` runs a dummy forward of ``max_num_batched_tokens`` tokens and, for generation, a dummy
    sampler pass over ``max_num_seqs`` rows. Layers run one after another, so the peak is one layer's tensors:
    about four hidden-size buffers (residual, normed input, attention output, MLP output), the QKV projection, and
    the MLP's gate/up output plus its activation (for MoE, the fused-MoE caches of ``tokens x top_k`` rows). The
    sampler's peak is :data:`SAMPLER_BYTES_PER_LOGIT` per sequence and vocabulary entry.
    """
    a = arch
    tp = tensor_parallel_size
    b = a.serving_dtype_bytes
    t = max_num_batched_tokens
    hidden = 4 * a.hidden_size
    if a.is_mla:
        heads = max(1, a.num_attention_heads // tp)
        attn = heads * (2 * (a.qk_nope_head_dim + a.qk_rope_head_dim) + a.qk_nope_head_dim + 2 * a.v_head_dim)
        attn += (a.kv_lora_rank or 0) + a.qk_rope_head_dim
    else:
        q_heads = max(1, a.num_attention_heads // tp)
        attn = (2 * q_heads + 2 * kv_heads_per_gpu(a, tp)) * a.head_dim  # q, k, v and the attention output
    dense = 3 * a.intermediate_size // tp
    moe = 0
    if a.is_moe:
        rows = max(1, a.num_experts_per_tok)
        moe = rows * (3 * a.moe_intermediate_size // tp + a.hidden_size) + 3 * a.shared_expert_intermediate_size // tp
    forward = t * (hidden + attn + max(dense, moe)) * b
    sampler = 0
    if task == "generate":
        sampler = int(max_num_seqs * a.vocab_size * SAMPLER_BYTES_PER_LOGIT)
    return max(int(forward * ACTIVATION_SLACK), sampler)


def non_torch_bytes(tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1) -> int:
    """Non-torch memory per GPU: see :data:`NON_TORCH_BYTES_TP1` and :data:`NON_TORCH_BYTES_PER_TP_GROUP`."""
    extra = NON_TORCH_BYTES_PER_TP_GROUP if tensor_parallel_size > 1 else 0
    return NON_TORCH_BYTES_TP1 + extra


def cuda_graph_bytes(arch: ModelArch, *, pipeline_parallel_size: int = 1, enforce_eager: bool = False) -> int:
    """CUDA-graph memory per GPU: see :data:`CUDA_GRAPH_BASE_BYTES`."""
    if enforce_eager:
        return 0
    return CUDA_GRAPH_BASE_BYTES + CUDA_GRAPH_BYTES_PER_LAYER * layers_per_gpu(arch, pipeline_parallel_size)


def weights_per_gpu(arch: ModelArch, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1, *,
                    task: Task = "generate") -> int:
    """One GPU's share of the weights on the heaviest pipeline stage (:func:`stage_weight_bytes`: the layers vLLM
    gives each stage, the embedding on the first, the LM head on the last), split over the TP ranks. vLLM 0.19.0
    logs 7.51 and 4.26 GiB on the first stage of Llama-3.1-8B at PP=2 and 4 (an even split would be 7.50 and
    3.75)."""
    if pipeline_parallel_size == 1:
        return math.ceil(weight_bytes(arch, task=task) / tensor_parallel_size)
    stages = stage_weight_bytes(arch, pipeline_parallel_size, task=task)
    return math.ceil(max(stages) / tensor_parallel_size)


def memory_budget(
    arch: ModelArch,
    gpu_memory_bytes: int,
    *,
    release: VllmRelease,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    gpu_memory_utilization: float = 0.92,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    task: Task = "generate",
    kv_cache_memory_bytes: int | None = None,
    enforce_eager: bool = False,
    spread: Spread | None = None,
    lora: LoraSlots | None = None,
) -> MemoryBudget:
    """``available = ceil(total x gpu_memory_utilization) - (weights/(tp x pp) + non-torch + activation peak)``,
    minus the CUDA-graph estimate where ``release`` takes it out before the KV cache; ``total`` is torch's device
    total. Or ``kv_cache_memory_bytes`` as given (vLLM then ignores the utilization). With ``spread``, each
    component at the pessimistic end of the estimate. With ``lora``, the adapter slots come out too (exact: vLLM
    allocates them with the weights, tuner/lora.py)."""
    weights = weights_per_gpu(arch, tensor_parallel_size, pipeline_parallel_size, task=task)
    non_torch = non_torch_bytes(tensor_parallel_size, pipeline_parallel_size)
    activation = activation_peak_bytes(
        arch,
        tensor_parallel_size=tensor_parallel_size,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        task=task,
    )
    graphs = cuda_graph_bytes(arch, pipeline_parallel_size=pipeline_parallel_size, enforce_eager=enforce_eager)
    adapters = lora_slot_bytes(arch, lora, tensor_parallel_size=tensor_parallel_size,
                               pipeline_parallel_size=pipeline_parallel_size)
    if spread is not None:  # the pessimistic end: every component at its worst calibrated underestimate
        estimated = arch.quant_method is not None or arch.tower_parameters > 0
        weights = math.ceil(weights * (spread.weights_estimated if estimated else spread.weights))
        non_torch = math.ceil(non_torch * spread.non_torch)
        activation = math.ceil(activation * spread.activation_peak)
        graphs = math.ceil(graphs * spread.cuda_graphs)
    if kv_cache_memory_bytes is not None:
        return MemoryBudget(gpu_memory_bytes, 1.0, gpu_memory_bytes, weights, non_torch, activation, graphs,
                            kv_cache_memory_bytes, kv_cache_memory_bytes, graphs_before_kv=False,
                            lora_slots=adapters)
    requested = math.ceil(gpu_memory_bytes * gpu_memory_utilization)
    before_kv = release.cuda_graphs_before_kv_cache
    available = requested - weights - adapters - non_torch - activation - (graphs if before_kv else 0)
    return MemoryBudget(gpu_memory_bytes, gpu_memory_utilization, requested, weights, non_torch, activation, graphs,
                        available, graphs_before_kv=before_kv, lora_slots=adapters)
