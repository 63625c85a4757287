"""What a model's config.json says about memory: the architecture fields that size weights, KV cache and
activations, read into a :class:`ModelArch` (multimodal configs from their ``text_config``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from triarch.errors import TriarchError

Task = Literal["generate", "embed"]
TASKS: tuple[str, ...] = ("generate", "embed")

DTYPE_BYTES: dict[str, int] = {
    "float32": 4, "float": 4, "fp32": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "fp16": 2,
    "float8": 1, "fp8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}
"""Bytes per element of the dtype names found in config.json (``torch_dtype`` / ``dtype``)."""


class TuneError(TriarchError):
    """No configuration of the model fits the GPU(s); the message gives the numbers."""


class LengthRefused(TuneError):
    """An explicit max_model_len vLLM would refuse (beyond the model, or beyond the KV cache)."""


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
