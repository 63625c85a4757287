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

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from triarch.catalog import Gpu
from triarch.errors import TriarchError
from triarch.paths import TEMPLATES_DIR

MODELS_DIR = TEMPLATES_DIR / "models"
"""The model catalog: one ``<org>--<name>.json`` per Hugging Face repo (architecture fields of its config.json)."""

GIB = 1 << 30
MIB = 1 << 20

Task = Literal["generate", "embed"]
TASKS: tuple[str, ...] = ("generate", "embed")

DTYPE_BYTES: dict[str, int] = {
    "float32": 4, "float": 4, "fp32": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "fp16": 2,
    "float8": 1, "fp8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}
"""Bytes per element of the dtype names found in config.json (``torch_dtype`` / ``dtype``)."""

KV_CACHE_DTYPES: dict[str, int | None] = {
    "auto": None, "bfloat16": 2, "float16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "fp8_ds_mla": 1,
}
"""vLLM ``--kv-cache-dtype`` choices -> bytes per element (None: the model's serving dtype)."""

DEFAULT_BLOCK_SIZE = 16
"""vLLM's default KV block size on CUDA (tokens per page)."""

DEFAULT_CONTEXT_TARGET = 8192
"""When ``max_model_len`` is not given: the TP choice asks for room for one sequence of
min(model max, this) tokens; ``max_model_len`` is then raised to the most that fits, up to the model's maximum."""

NON_TORCH_BYTES_TP1 = 192 * MIB
"""Non-torch memory on one GPU (cuBLAS workspaces, allocator slack). V1-engine logs show 0.07-0.14 GiB on H100 and
0.02 GiB on A100-40GB at TP=1 (llm-d/llm-d-benchmark config_explorer/empirical-vllm-memory-results.md;
vllm-project/vllm#12330 logs 0.10 GiB); 192 MiB sits just above them."""

NON_TORCH_BYTES_PER_TP_GROUP = 576 * MIB
"""Extra non-torch memory once TP or PP > 1 (NCCL communicators, custom all-reduce buffers): V1 logs show
0.54-0.55 GiB per GPU at TP=2 on H100 (same llm-d source); up to 1.38 GiB was seen on H200 TP=2."""

CUDA_RESERVED_BYTES = 460 * MIB
"""What the CUDA context keeps from the GPU total nvidia-smi reports: vLLM (torch.cuda.mem_get_info) sees an H100
80GB as 79.18-79.25 GiB against nvidia-smi's 81559 MiB (79.65 GiB), an A100-40GB as 39.49 GiB; the gap is
0.4-0.47 GiB. vLLM's gpu_memory_utilization applies to the smaller figure."""

CUDA_GRAPH_BASE_BYTES = 256 * MIB
CUDA_GRAPH_BYTES_PER_LAYER = 8 * MIB
"""CUDA-graph estimate: vLLM logs "Graph capturing finished in N secs, took X GiB" with X around 0.2-1 GiB for
7B-70B models (one graph per capture size, memory pool shared, growing with the layer count). Modelled as
256 MiB + 8 MiB per layer on the GPU; zero with ``enforce_eager``. An estimate, not a measurement."""

ACTIVATION_SLACK = 1.1
"""Factor on the modelled forward-pass tensors for allocator fragmentation and temporaries not modelled (the
modelled forward of a 16k-token LLaVA-7B profile was 2.13 GiB against 1.97 GiB logged: little slack needed)."""

SAMPLER_BYTES_PER_LOGIT = 38.5
"""Peak bytes of vLLM's dummy sampler run per (sequence, vocabulary entry): float32 logits, their softmax and
sort/top-k/top-p working copies. V1 logs put the activation peak at 38.4-39.6 x max_num_seqs x vocab bytes on
H100 whatever the hidden size or TP (llm-d empirical results: Llama-3.1-8B 4.76 GiB, Qwen3-32B 5.64 GiB,
Qwen3-0.6B 5.56 GiB at 1024 sequences). vLLM 0.29+'s model runner may need less: conservative for it."""

GENERATE_MAX_NUM_SEQS = 256
"""vLLM's default ``max_num_seqs`` for online serving; the tuner lowers it when the KV cache holds fewer."""

EMBED_MAX_NUM_SEQS = 256
TYPICAL_CHAT_TOKENS = 2048
"""Tokens (prompt + output) of a typical chat request, to translate KV tokens into a useful ``max_num_seqs``."""

TYPICAL_EMBED_TOKENS = 512
"""Tokens of a typical embedding request (one chunk of a document)."""

MIN_CONCURRENCY = 4
"""When ``max_model_len`` is not given and the model's maximum does not fit this many times over, the tuner
lowers ``max_model_len`` to the largest power of two that does (never below min(model max, 8192) when that fits),
so one long request cannot take the whole KV cache."""

LARGE_GPU_BYTES = 40 * GIB
"""GPUs at least this big get 8192 batched tokens per step for generation, smaller ones 2048 (vLLM's defaults
for the OpenAI server by GPU class are of the same order)."""


class TuneError(TriarchError):
    """No configuration of the model fits the GPU(s); the message gives the numbers."""


class LengthRefused(TuneError):
    """An explicit max_model_len vLLM would refuse (beyond the model, or beyond the KV cache)."""


# --------------------------------------------------------------------------------------------------------------
# Model architecture


@dataclass(frozen=True)
class ModelArch:
    """The architecture fields of a Hugging Face config.json that decide memory. Build with
    :func:`arch_from_hf_config`; all sizes are the checkpoint's (unsharded)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    """Dense MLP width (gate/up/down); for MoE models the width of the dense layers, if any."""
    tie_word_embeddings: bool = False
    dtype: str = "bfloat16"
    """Checkpoint dtype (``torch_dtype`` / ``dtype``)."""
    max_position_embeddings: int | None = None
    name: str | None = None
    model_type: str | None = None
    architectures: tuple[str, ...] = ()
    attention_bias: bool = False
    """Biases on q/k/v (Qwen2 always has them; others say ``attention_bias: true``)."""
    qk_norm: bool = False
    """Per-head RMSNorm on q and k (Qwen3)."""
    # --- Mixture of experts
    num_experts: int = 0
    """Routed experts per MoE layer (``num_experts`` / ``n_routed_experts`` / ``num_local_experts``); 0 = dense."""
    num_experts_per_tok: int = 0
    n_shared_experts: int = 0
    moe_intermediate_size: int = 0
    """Width of one routed expert (``moe_intermediate_size``, else ``intermediate_size``, as in Mixtral)."""
    shared_expert_intermediate_size: int = 0
    """Total width of the shared expert(s): ``n_shared_experts x moe_intermediate_size`` (DeepSeek) or
    ``shared_expert_intermediate_size`` (Qwen2-MoE)."""
    shared_expert_gate: bool = False
    """Qwen2-MoE gates its shared expert with a hidden_size x 1 projection."""
    first_k_dense_replace: int = 0
    num_moe_layers: int = 0
    """Decoder layers whose MLP is MoE (the rest use the dense MLP)."""
    # --- Multi-head latent attention (DeepSeek-V2/V3)
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # --- Quantization
    quant_method: str | None = None
    weight_bits: float | None = None
    """Bits per quantized weight (None = unquantized, stored in ``dtype``)."""
    quant_group_size: int | None = None

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None and self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and self.num_moe_layers > 0

    @property
    def serving_dtype_bytes(self) -> int:
        """Bytes of the dtype vLLM computes in with ``--dtype auto``: the checkpoint's, except that float32
        checkpoints are served in 16 bits (vLLM's ``_get_and_verify_dtype`` downcasts them)."""
        return min(2, DTYPE_BYTES.get(self.dtype, 2))

    @property
    def quantized_bytes_per_weight(self) -> float:
        """Bytes per weight of the quantized linear layers, including group scales/zeros roughly: a 16-bit scale
        plus a ``bits``-wide zero point per group (GPTQ/AWQ layout)."""
        if self.weight_bits is None:
            return float(self.serving_dtype_bytes)
        per_weight = self.weight_bits / 8
        if self.quant_group_size and self.quant_group_size > 0:
            per_weight += (2 + self.weight_bits / 8) / self.quant_group_size
        return per_weight

    @property
    def label(self) -> str:
        return self.name or self.model_type or "model"


def _int(d: Mapping[str, Any], *keys: str, default: int | None = None) -> int | None:
    for key in keys:
        value = d.get(key)
        if value is not None:
            return int(value)
    return default


def _quantization(d: Mapping[str, Any]) -> tuple[str | None, float | None, int | None]:
    """(method, bits per weight, group size) from ``quantization_config``, roughly; (None, None, None) if absent."""
    q = d.get("quantization_config")
    if not isinstance(q, Mapping):
        return None, None, None
    method = str(q.get("quant_method") or q.get("format") or "unknown").lower()
    group = q.get("group_size")
    group_size = int(group) if isinstance(group, int) and group > 0 else None
    if q.get("bits") is not None:  # GPTQ, AWQ, HQQ, ...
        return method, float(q["bits"]), group_size
    if q.get("load_in_4bit"):
        return method, 4.0, 64
    if q.get("load_in_8bit"):
        return method, 8.0, None
    if method in ("fp8", "fbgemm_fp8", "modelopt"):
        return method, 8.0, None
    if method == "mxfp4":
        return method, 4.0, 32
    groups = q.get("config_groups")
    if isinstance(groups, Mapping):  # compressed-tensors: the widest weight scheme of any group
        bits: list[tuple[float, int | None]] = []
        for g in groups.values():
            weights = g.get("weights") if isinstance(g, Mapping) else None
            if isinstance(weights, Mapping) and weights.get("num_bits") is not None:
                gs = weights.get("group_size")
                bits.append((float(weights["num_bits"]), int(gs) if isinstance(gs, int) and gs > 0 else None))
        if bits:
            widest = max(bits, key=lambda b: b[0])
            return method, widest[0], widest[1]
    return method, None, None


def arch_from_hf_config(d: Mapping[str, Any], *, name: str | None = None) -> ModelArch:
    """Parse a Hugging Face ``config.json`` (as a dict) into a :class:`ModelArch`.

    Multimodal configs that nest the language model under ``text_config`` are read from there. Raises
    :class:`TuneError` naming the missing key when a required field is absent.
    """
    text = d.get("text_config")
    cfg: Mapping[str, Any] = text if isinstance(text, Mapping) and "hidden_size" in text else d
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size") if k not in cfg]
    if missing:
        raise TuneError(f"config.json of {name or d.get('_name_or_path') or 'the model'} lacks {', '.join(missing)}")
    hidden = int(cfg["hidden_size"])
    layers = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = _int(cfg, "num_key_value_heads", default=heads) or heads
    head_dim = _int(cfg, "head_dim", default=hidden // heads) or hidden // heads
    model_type = cfg.get("model_type") or d.get("model_type")
    architectures = tuple(str(a) for a in (d.get("architectures") or cfg.get("architectures") or ()))

    experts = _int(cfg, "num_experts", "n_routed_experts", "num_local_experts", default=0) or 0
    intermediate = _int(cfg, "intermediate_size", default=4 * hidden) or 4 * hidden
    moe_inter = _int(cfg, "moe_intermediate_size", default=intermediate) or intermediate
    n_shared = _int(cfg, "n_shared_experts", default=0) or 0
    shared_inter = _int(cfg, "shared_expert_intermediate_size", default=0) or 0
    if shared_inter == 0 and n_shared:
        shared_inter = n_shared * moe_inter
    first_dense = _int(cfg, "first_k_dense_replace", default=0) or 0
    freq = _int(cfg, "moe_layer_freq", default=1) or 1
    sparse_step = _int(cfg, "decoder_sparse_step", default=1) or 1
    mlp_only = {int(i) for i in (cfg.get("mlp_only_layers") or ())}
    moe_layers = 0
    if experts:
        moe_layers = sum(
            1
            for i in range(layers)
            if i >= first_dense and i % freq == 0 and (i + 1) % sparse_step == 0 and i not in mlp_only
        )

    kv_lora = _int(cfg, "kv_lora_rank")
    method, bits, group = _quantization(cfg if "quantization_config" in cfg else d)
    if bits is not None and bits >= 16:
        bits = None
    mtype = str(model_type or "")
    return ModelArch(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=int(cfg["vocab_size"]),
        intermediate_size=intermediate,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", d.get("tie_word_embeddings", False))),
        dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or d.get("torch_dtype") or d.get("dtype") or "bfloat16"),
        max_position_embeddings=_int(cfg, "max_position_embeddings"),
        name=name or (str(d["_name_or_path"]) if d.get("_name_or_path") else None),
        model_type=str(model_type) if model_type else None,
        architectures=architectures,
        attention_bias=bool(cfg.get("attention_bias", False)) or mtype in ("qwen2", "qwen2_moe"),
        qk_norm=mtype.startswith("qwen3"),
        num_experts=experts,
        num_experts_per_tok=_int(cfg, "num_experts_per_tok", default=0) or 0,
        n_shared_experts=n_shared,
        moe_intermediate_size=moe_inter if experts else 0,
        shared_expert_intermediate_size=shared_inter if experts else 0,
        shared_expert_gate=bool(experts) and mtype == "qwen2_moe" and shared_inter > 0,
        first_k_dense_replace=first_dense,
        num_moe_layers=moe_layers,
        kv_lora_rank=kv_lora if kv_lora else None,
        q_lora_rank=_int(cfg, "q_lora_rank"),
        qk_rope_head_dim=_int(cfg, "qk_rope_head_dim", default=0) or 0,
        qk_nope_head_dim=_int(cfg, "qk_nope_head_dim", default=0) or 0,
        v_head_dim=_int(cfg, "v_head_dim", default=0) or 0,
        quant_method=method,
        weight_bits=bits,
        quant_group_size=group,
    )


def _catalog_file(name: str) -> Path:
    return MODELS_DIR / (name.replace("/", "--") + ".json")


def catalog_models() -> list[str]:
    """Hugging Face repo names in templates/models/ ("Qwen/Qwen3-8B", ...)."""
    return sorted(p.stem.replace("--", "/", 1) for p in MODELS_DIR.glob("*.json"))


def load_model_config(name_or_path: str | Path) -> dict[str, Any]:
    """A config.json as a dict: a catalog name ("Qwen/Qwen3-8B", or just "Qwen3-8B" when unambiguous), a path to
    a config.json, or a directory holding one. Raises :class:`TuneError` when none matches."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        text = str(name_or_path)
        candidates = [_catalog_file(text)] if "/" in text else []
        candidates += [_catalog_file(m) for m in catalog_models() if m.split("/", 1)[-1].lower() == text.lower()]
        found = [c for c in candidates if c.is_file()]
        if not found:
            raise TuneError(
                f"model {text!r}: not a config.json path and not in the catalog; known: {', '.join(catalog_models())}"
            )
        path = found[0]
    try:
        data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as error:
        raise TuneError(f"{path} is not JSON (line {error.lineno}, column {error.colno}: {error.msg})") from None
    except UnicodeDecodeError as error:
        raise TuneError(f"{path} is not UTF-8 text (byte {error.start})") from None
    except OSError as error:
        raise TuneError(f"{path} cannot be read ({error.strerror})") from None
    if not isinstance(data, dict):
        raise TuneError(f"{path}: expected a JSON object")
    return data


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise TuneError(f"a config.json names {key!r} twice")
        seen[key] = value
    return seen


def load_arch(name_or_path: str | Path) -> ModelArch:
    """:func:`load_model_config` then :func:`arch_from_hf_config`, named after the catalog entry or path."""
    data = load_model_config(name_or_path)
    source = str(data.get("_source", ""))
    name = data.get("_name_or_path") or _repo_from_source(source) or str(name_or_path)
    return arch_from_hf_config(data, name=str(name))


def _repo_from_source(source: str) -> str | None:
    prefix = "https://huggingface.co/"
    if not source.startswith(prefix):
        return None
    parts = source[len(prefix):].split("/")
    return "/".join(parts[:2]) if len(parts) >= 2 else None


# --------------------------------------------------------------------------------------------------------------
# Parameters and weights


@dataclass(frozen=True)
class ParameterCount:
    """Parameters by part of the network (whole model, unsharded)."""

    embedding: int
    attention: int
    dense_mlp: int
    routed_experts: int
    shared_experts: int
    router: int
    norms: int
    lm_head: int

    @property
    def total(self) -> int:
        return (self.embedding + self.attention + self.dense_mlp + self.routed_experts + self.shared_experts
                + self.router + self.norms + self.lm_head)

    @property
    def linear(self) -> int:
        """Parameters in the decoder's linear layers: what weight quantization (GPTQ/AWQ/FP8/...) compresses."""
        return self.attention + self.dense_mlp + self.routed_experts + self.shared_experts


def _attention_params(a: ModelArch) -> tuple[int, int]:
    """(linear weights + biases, norm weights) of one attention block."""
    h = a.hidden_size
    if a.is_mla:
        kv_lora = a.kv_lora_rank or 0
        q_head = a.qk_nope_head_dim + a.qk_rope_head_dim
        if a.q_lora_rank:
            q = h * a.q_lora_rank + a.q_lora_rank * a.num_attention_heads * q_head  # q_a_proj, q_b_proj
            norms = a.q_lora_rank  # q_a_layernorm
        else:
            q = h * a.num_attention_heads * q_head  # q_proj
            norms = 0
        kv_a = h * (kv_lora + a.qk_rope_head_dim)  # kv_a_proj_with_mqa
        kv_b = kv_lora * a.num_attention_heads * (a.qk_nope_head_dim + a.v_head_dim)  # kv_b_proj
        o = a.num_attention_heads * a.v_head_dim * h  # o_proj
        return q + kv_a + kv_b + o, norms + kv_lora  # + kv_a_layernorm
    q_out = a.num_attention_heads * a.head_dim
    kv_out = a.num_key_value_heads * a.head_dim
    linear = h * q_out + 2 * h * kv_out + q_out * h
    if a.attention_bias:
        linear += q_out + 2 * kv_out
    return linear, (2 * a.head_dim if a.qk_norm else 0)


def parameter_breakdown(arch: ModelArch, *, task: Task = "generate") -> ParameterCount:
    """Parameters of the checkpoint as vLLM loads it. ``task="embed"`` leaves out the LM head (vLLM's pooling
    adapter does not load it; tied embeddings change nothing)."""
    a = arch
    h = a.hidden_size
    attn_linear, attn_norms = _attention_params(a)
    dense_layers = a.num_hidden_layers - a.num_moe_layers
    mlp = 3 * h * a.intermediate_size  # gate_proj, up_proj, down_proj
    routed = a.num_moe_layers * a.num_experts * 3 * h * a.moe_intermediate_size
    shared = a.num_moe_layers * 3 * h * a.shared_expert_intermediate_size
    router = a.num_moe_layers * (a.num_experts * h + (h if a.shared_expert_gate else 0))
    norms = a.num_hidden_layers * (2 * h + attn_norms) + h  # input/post-attention norms per layer, final norm
    embedding = a.vocab_size * h
    lm_head = 0 if (a.tie_word_embeddings or task == "embed") else a.vocab_size * h
    return ParameterCount(
        embedding=embedding,
        attention=a.num_hidden_layers * attn_linear,
        dense_mlp=dense_layers * mlp,
        routed_experts=routed,
        shared_experts=shared,
        router=router,
        norms=norms,
        lm_head=lm_head,
    )


def count_parameters(arch: ModelArch, *, task: Task = "generate") -> int:
    """Total parameters (all experts counted)."""
    return parameter_breakdown(arch, task=task).total


def weight_bytes(arch: ModelArch, *, task: Task = "generate") -> int:
    """Bytes of weights as loaded: quantized linear layers at :attr:`ModelArch.quantized_bytes_per_weight`,
    embeddings, LM head, norms and router in the serving dtype (quantizers leave those alone)."""
    p = parameter_breakdown(arch, task=task)
    rest = p.total - p.linear
    return int(p.linear * arch.quantized_bytes_per_weight + rest * arch.serving_dtype_bytes)


# --------------------------------------------------------------------------------------------------------------
# KV cache


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


# --------------------------------------------------------------------------------------------------------------
# Memory budget


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

    @property
    def overhead(self) -> int:
        """Everything but weights and KV cache."""
        return self.non_torch + self.activation_peak + self.cuda_graphs

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
    extra = NON_TORCH_BYTES_PER_TP_GROUP if tensor_parallel_size * pipeline_parallel_size > 1 else 0
    return NON_TORCH_BYTES_TP1 + extra


def cuda_graph_bytes(arch: ModelArch, *, pipeline_parallel_size: int = 1, enforce_eager: bool = False) -> int:
    """CUDA-graph memory per GPU: see :data:`CUDA_GRAPH_BASE_BYTES`."""
    if enforce_eager:
        return 0
    return CUDA_GRAPH_BASE_BYTES + CUDA_GRAPH_BYTES_PER_LAYER * layers_per_gpu(arch, pipeline_parallel_size)


def memory_budget(
    arch: ModelArch,
    gpu_memory_bytes: int,
    *,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    gpu_memory_utilization: float = 0.92,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    task: Task = "generate",
    kv_cache_memory_bytes: int | None = None,
    enforce_eager: bool = False,
) -> MemoryBudget:
    """``available = total x gpu_memory_utilization - (weights/(tp x pp) + non-torch + activation peak) -
    CUDA graphs``, per GPU; or ``kv_cache_memory_bytes`` as given (vLLM then ignores the utilization)."""
    weights = math.ceil(weight_bytes(arch, task=task) / (tensor_parallel_size * pipeline_parallel_size))
    non_torch = non_torch_bytes(tensor_parallel_size, pipeline_parallel_size)
    activation = activation_peak_bytes(
        arch,
        tensor_parallel_size=tensor_parallel_size,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        task=task,
    )
    graphs = cuda_graph_bytes(arch, pipeline_parallel_size=pipeline_parallel_size, enforce_eager=enforce_eager)
    if kv_cache_memory_bytes is not None:
        return MemoryBudget(gpu_memory_bytes, 1.0, gpu_memory_bytes, weights, non_torch, activation, graphs,
                            kv_cache_memory_bytes, kv_cache_memory_bytes)
    requested = int(max(0, gpu_memory_bytes - CUDA_RESERVED_BYTES) * gpu_memory_utilization)
    available = requested - weights - non_torch - activation - graphs
    return MemoryBudget(gpu_memory_bytes, gpu_memory_utilization, requested, weights, non_torch, activation, graphs,
                        available)


# --------------------------------------------------------------------------------------------------------------
# Tuning


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

    def log_lines(self) -> list[str]:
        """The start-up lines vLLM (V1) would print for this configuration."""
        lines = [
            f"Model loading took {self.memory.weights / GIB:.4f} GiB",
            f"Available KV cache memory: {self.available_kv_bytes / GIB:.2f} GiB",
            f"GPU KV cache size: {self.kv_cache_tokens:,} tokens",
        ]
        if self.max_model_len is not None and self.max_concurrency is not None:
            lines.append(
                f"Maximum concurrency for {self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x"
            )
        return lines


def _tp_candidates(arch: ModelArch, gpus: int) -> list[int]:
    """Powers of two up to ``gpus`` that vLLM accepts: dividing the attention heads, and dividing the KV heads or
    being a multiple of them (KV heads replicate beyond that)."""
    out = []
    tp = 1
    while tp <= gpus:
        if arch.num_attention_heads % tp == 0 and (
            arch.is_mla or arch.num_key_value_heads % tp == 0 or tp % arch.num_key_value_heads == 0
        ):
            out.append(tp)
        tp *= 2
    return out


def _pow2_floor(value: int) -> int:
    """The largest power of two <= value (0 for value < 1)."""
    return 1 << (value.bit_length() - 1) if value >= 1 else 0


def _round_down(value: int, multiple: int) -> int:
    return value - value % multiple if value >= multiple else value


@dataclass(frozen=True)
class _Plan:
    tp: int
    budget: MemoryBudget
    kv_per_token: int
    blocks: int
    tokens: int
    max_num_batched_tokens: int
    max_num_seqs_cap: int


def _plan(
    arch: ModelArch,
    total: int,
    tp: int,
    *,
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
) -> _Plan:
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
        arch, total, tensor_parallel_size=tp, pipeline_parallel_size=pp, gpu_memory_utilization=util,
        max_num_batched_tokens=batched, max_num_seqs=seqs_cap, task=task,
        kv_cache_memory_bytes=kv_cache_memory_bytes, enforce_eager=enforce_eager,
    )
    per_token = kv_bytes_per_token(arch, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                                   kv_cache_dtype=kv_cache_dtype)
    blocks, tokens = kv_cache_capacity(budget.available_kv, per_token, block_size)
    if kv_cache_memory_bytes is not None and budget.spare < 0:
        blocks, tokens = 0, 0  # the given KV cache does not fit next to the weights
    return _Plan(tp, budget, per_token, blocks, tokens, batched, seqs_cap)


def _gib(value: int) -> str:
    return f"{value / GIB:.1f} GiB"


def _refusal(arch: ModelArch, gpu: Gpu, plan: _Plan, *, util: float, gpus: int, pp: int, task: Task,
             block_size: int, kv_given: bool) -> TuneError:
    b = plan.budget
    total = b.total
    label = f"{gpu.product} ({_gib(total)})"
    hint = "try more GPUs (gpus_available), a quantized checkpoint, kv_cache_dtype='fp8' or a smaller max_model_len"
    where = f"tensor_parallel_size={plan.tp}" + (f", pipeline_parallel_size={pp}" if pp > 1 else "")
    if kv_given:
        return TuneError(
            f"{arch.label} needs {_gib(b.weights)} of weights per GPU ({where}) plus {_gib(b.overhead)} of "
            f"non-torch/activation/CUDA-graph memory; with kv_cache_memory_bytes={b.available_kv} "
            f"({_gib(b.available_kv)}) that is {_gib(-b.spare)} more than the {label} holds; {hint}"
        )
    room = b.requested - b.overhead
    return TuneError(
        f"{arch.label} needs {_gib(b.weights)} of weights per GPU ({where}, the most {gpus} GPU(s) allow; "
        f"{_gib(weight_bytes(arch, task=task))} in all); {label} at gpu_memory_utilization {util} leaves "
        f"{_gib(room)} after {_gib(b.non_torch)} non-torch memory, {_gib(b.activation_peak)} activation peak "
        f"and {_gib(b.cuda_graphs)} CUDA graphs, so the KV cache gets {b.available_kv / GIB:.2f} GiB "
        f"(one block of {block_size} tokens needs {block_size * plan.kv_per_token / MIB:.1f} MiB); {hint}"
    )


def tune(
    arch: ModelArch,
    gpu: Gpu,
    *,
    tensor_parallel_size: int | None = None,
    gpu_memory_utilization: float = 0.92,
    max_model_len: int | None = None,
    kv_cache_dtype: str = "auto",
    kv_cache_memory_bytes: int | None = None,
    task: Task = "generate",
    gpus_available: int = 8,
    pipeline_parallel_size: int = 1,
    block_size: int = DEFAULT_BLOCK_SIZE,
    enforce_eager: bool = False,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> Sizing:
    """Engine args for serving ``arch`` on GPUs of type ``gpu``.

    Tensor parallelism: ``tensor_parallel_size`` if given, else the smallest power of two (dividing the attention
    heads, at most ``gpus_available // pipeline_parallel_size``) whose GPUs hold the weights and the KV cache of one
    ``max_model_len`` sequence; if none holds a full sequence, the one holding the most tokens. ``max_model_len``
    is capped to the model's maximum and to the KV tokens that fit; when not given it defaults to the model's
    ``max_position_embeddings``, lowered (see :data:`MIN_CONCURRENCY`) so several such requests fit.
    Raises :class:`TuneError` with the numbers when not even one KV block fits.
    """
    if task not in TASKS:
        raise TuneError(f"task {task!r} is not one of {', '.join(TASKS)}")
    if not 0 < gpu_memory_utilization <= 1:
        raise TuneError(f"gpu_memory_utilization {gpu_memory_utilization} must be in (0, 1]")
    if max_model_len is not None and max_model_len < 1:
        raise TuneError(f"max_model_len {max_model_len} must be at least 1")
    if block_size < 1 or pipeline_parallel_size < 1 or gpus_available < 1:
        raise TuneError("block_size, pipeline_parallel_size and gpus_available must be at least 1")
    if kv_cache_memory_bytes is not None and kv_cache_memory_bytes < 0:
        raise TuneError(f"kv_cache_memory_bytes {kv_cache_memory_bytes} must not be negative")
    kv_dtype_bytes(arch, kv_cache_dtype)  # validates the name
    if pipeline_parallel_size > arch.num_hidden_layers:
        raise TuneError(f"pipeline_parallel_size {pipeline_parallel_size} exceeds the {arch.num_hidden_layers} layers")

    notes: list[str] = []
    model_max = arch.max_position_embeddings
    requested_len = max_model_len
    if requested_len is not None and model_max is not None and requested_len > model_max:
        # vLLM refuses a --max-model-len beyond what it derives from the model's config.
        raise LengthRefused(f"max_model_len {requested_len} exceeds the {model_max} tokens {arch.label} supports "
                        "(max_position_embeddings); vLLM refuses a longer --max-model-len")
    target = requested_len if requested_len is not None else (
        min(model_max, DEFAULT_CONTEXT_TARGET) if model_max is not None else None
    )
    ceiling = requested_len if requested_len is not None else model_max

    tp_gpus = gpus_available // pipeline_parallel_size
    if tensor_parallel_size is not None:
        if tensor_parallel_size < 1 or arch.num_attention_heads % tensor_parallel_size:
            raise TuneError(
                f"tensor_parallel_size {tensor_parallel_size} must divide the "
                f"{arch.num_attention_heads} attention heads"
            )
        if tensor_parallel_size * pipeline_parallel_size > gpus_available:
            raise TuneError(
                f"tensor_parallel_size {tensor_parallel_size} x pipeline_parallel_size {pipeline_parallel_size} "
                f"needs more than the {gpus_available} GPU(s) available"
            )
        candidates = [tensor_parallel_size]
    else:
        candidates = _tp_candidates(arch, tp_gpus)
        if not candidates:
            raise TuneError(
                f"no tensor_parallel_size fits {gpus_available} GPU(s) with pipeline_parallel_size "
                f"{pipeline_parallel_size} and {arch.num_attention_heads} attention heads"
            )

    total = gpu.memory_mib * MIB
    plans = [
        _plan(arch, total, tp, pp=pipeline_parallel_size, util=gpu_memory_utilization, kv_cache_dtype=kv_cache_dtype,
              kv_cache_memory_bytes=kv_cache_memory_bytes, task=task, block_size=block_size, longest=ceiling,
              enforce_eager=enforce_eager, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
        for tp in candidates
    ]
    need = target if target is not None else block_size
    chosen = next((p for p in plans if p.blocks > 0 and p.tokens >= need), None)
    if chosen is None:
        usable = [p for p in plans if p.blocks > 0]
        if not usable:
            raise _refusal(arch, gpu, plans[-1], util=gpu_memory_utilization, gpus=tp_gpus,
                           pp=pipeline_parallel_size, task=task, block_size=block_size,
                           kv_given=kv_cache_memory_bytes is not None)
        chosen = max(usable, key=lambda p: (p.tokens, -p.tp))

    def length_for(plan: _Plan) -> int | None:
        """max_model_len for a plan: the ceiling, capped to the KV tokens (and, when no length was asked for,
        to room for MIN_CONCURRENCY full-length requests)."""
        if ceiling is None:
            return None
        length = min(ceiling, plan.tokens)
        if requested_len is None and target is not None and length * MIN_CONCURRENCY > plan.tokens:
            room = _pow2_floor(plan.tokens // MIN_CONCURRENCY)
            length = min(length, max(room, min(target, plan.tokens)))
        return length

    final_len = length_for(chosen)
    typical = TYPICAL_EMBED_TOKENS if task == "embed" else TYPICAL_CHAT_TOKENS
    seqs = chosen.tokens // min(final_len or typical, typical)
    seqs = max_num_seqs or _round_down(max(1, min(chosen.max_num_seqs_cap, seqs)), 8)
    batched = chosen.max_num_batched_tokens
    if task == "embed" and max_num_batched_tokens is None:
        # no larger than the activation estimate assumed, no smaller than one whole request
        batched = min(batched, max(DEFAULT_CONTEXT_TARGET, final_len or 0))
    batched = max(batched, seqs)
    if (seqs, batched) != (chosen.max_num_seqs_cap, chosen.max_num_batched_tokens):
        # vLLM profiles with the batch it is given: size the KV cache again with these args, so the numbers
        # reported are the ones vLLM will compute (a smaller batch only frees memory: the batch stays valid).
        chosen = _plan(arch, total, chosen.tp, pp=pipeline_parallel_size, util=gpu_memory_utilization,
                       kv_cache_dtype=kv_cache_dtype, kv_cache_memory_bytes=kv_cache_memory_bytes, task=task,
                       block_size=block_size, longest=ceiling, enforce_eager=enforce_eager, max_num_seqs=seqs,
                       max_num_batched_tokens=batched)
        final_len = length_for(chosen)
        if task == "embed" and final_len is not None:
            final_len = min(final_len, batched)  # pooling takes a whole request in one step
    if ceiling is not None and final_len is not None and final_len < ceiling:
        if requested_len is not None:
            # vLLM refuses to start when one request of max_model_len does not fit the KV cache.
            raise LengthRefused(f"max_model_len {requested_len} does not fit: the KV cache holds {chosen.tokens} "
                                f"tokens at tensor_parallel_size={chosen.tp} on {gpu.product}, and vLLM refuses to "
                                f"start below one full request; ask for at most {final_len}, fp8 KV or more GPUs")
        notes.append(f"max_model_len {ceiling} capped to {final_len}: the KV cache holds {chosen.tokens} tokens at "
                     f"tensor_parallel_size={chosen.tp}")
    concurrency = chosen.tokens / final_len if final_len else None

    args: dict[str, Any] = {"tensor_parallel_size": chosen.tp}
    if pipeline_parallel_size > 1:
        args["pipeline_parallel_size"] = pipeline_parallel_size
    if kv_cache_memory_bytes is not None:
        args["kv_cache_memory_bytes"] = kv_cache_memory_bytes
    else:
        args["gpu_memory_utilization"] = gpu_memory_utilization
    if final_len is not None:
        args["max_model_len"] = final_len
    args["max_num_seqs"] = seqs
    args["max_num_batched_tokens"] = batched
    args["kv_cache_dtype"] = kv_cache_dtype
    args["block_size"] = block_size
    if enforce_eager:
        args["enforce_eager"] = True
    if task == "embed":
        args["runner"] = "pooling"
        args["convert"] = "embed"

    return Sizing(
        model=arch.label,
        gpu=gpu.key,
        task=task,
        num_parameters=count_parameters(arch, task=task),
        weights_bytes=weight_bytes(arch, task=task),
        kv_bytes_per_token=chosen.kv_per_token,
        kv_cache_blocks=chosen.blocks,
        kv_cache_tokens=chosen.tokens,
        block_size=block_size,
        max_model_len=final_len,
        max_concurrency=concurrency,
        tensor_parallel_size=chosen.tp,
        pipeline_parallel_size=pipeline_parallel_size,
        available_kv_bytes=chosen.budget.available_kv,
        memory=chosen.budget,
        engine_args=args,
        notes=tuple(notes),
    )
