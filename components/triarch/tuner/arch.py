"""What a model's config.json says about memory: the architecture fields that size weights, KV cache and
activations, read into a :class:`ModelArch` (multimodal configs from their ``text_config``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

from triarch.datafiles import read_yaml
from triarch.paths import TEMPLATES_DIR
from triarch.tuner.context import ContextFields, read_context_fields
from triarch.tuner.errors import LengthRefused as LengthRefused
from triarch.tuner.errors import TuneError as TuneError
from triarch.tuner.layers import AttentionLayout, read_layout
from triarch.tuner.quantization import read_quantization

CONFIG_DEFAULTS_FILE = TEMPLATES_DIR / "compat" / "config-defaults.yaml"

Task = Literal["generate", "embed"]
TASKS: tuple[str, ...] = ("generate", "embed")

DTYPE_BYTES: dict[str, int] = {
    "float32": 4, "float": 4, "fp32": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "fp16": 2,
    "float8": 1, "fp8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}
"""Bytes per element of the dtype names found in config.json (``torch_dtype`` / ``dtype``)."""


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
    moe_layer_indices: tuple[int, ...] = ()
    """Which decoder layers those are (0-based): a pipeline stage's weights depend on how many it holds."""
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
    quant_scale_bytes: float = 0.0
    """Bytes of scale (and zero point) per group of ``quant_group_size`` weights."""
    quant_kept: tuple[str, ...] = ()
    """Linear modules the quantization config leaves unquantized (``ignore`` / ``modules_to_not_convert``)."""
    # --- Layers and context
    layout: AttentionLayout = field(default_factory=lambda: AttentionLayout(("full",)))
    context: ContextFields = field(default_factory=ContextFields)
    # --- Multimodal towers (loaded next to the language model)
    tower_parameters: int = 0
    """Parameters of the vision/audio encoder(s) and projector, estimated from ``vision_config``/``audio_config``."""

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
        """Bytes per weight of the quantized linear layers, group scales (and zero points) included."""
        if self.weight_bits is None:
            return float(self.serving_dtype_bytes)
        per_weight = self.weight_bits / 8
        if self.quant_group_size and self.quant_group_size > 0:
            per_weight += self.quant_scale_bytes / self.quant_group_size
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


def _tower_parameters(d: Mapping[str, Any]) -> int:
    """Parameters of a ViT-style encoder (``vision_config``; ``audio_config`` alike): per layer the attention
    projections (4 h^2) and a two-matrix MLP (2 h x intermediate), plus the patch embedding and a projector into
    the text model's width. An estimate: towers are 0.4-0.7B parameters on the models the calibration has."""
    text = d.get("text_config")
    text_hidden = int(text.get("hidden_size", 0)) if isinstance(text, Mapping) else 0
    total = 0
    for key in ("vision_config", "audio_config"):
        tower = d.get(key)
        if not isinstance(tower, Mapping) or not tower.get("hidden_size"):
            continue
        h = int(tower["hidden_size"])
        inter = int(tower.get("intermediate_size") or 4 * h)
        layers = int(tower.get("num_hidden_layers") or tower.get("depth") or 0)
        patch = int(tower.get("patch_size") or 14)
        channels = int(tower.get("num_channels") or 3)
        total += layers * (4 * h * h + 2 * h * inter + 4 * h) + channels * patch * patch * h + h * text_hidden
    return total


@cache
def _config_defaults() -> dict[str, Any]:
    return dict(read_yaml(CONFIG_DEFAULTS_FILE))


def _with_type_defaults(cfg: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """The text config with its model_type (inferred from the top level's for a nested text config that omits it)
    and transformers' defaults for the keys it leaves out (templates/compat/config-defaults.yaml)."""
    data = _config_defaults()
    out = dict(cfg)
    if "model_type" not in out and cfg is not top and top.get("model_type") in data["textModelTypes"]:
        out["model_type"] = data["textModelTypes"][top["model_type"]]
    return {**data["defaults"].get(out.get("model_type"), {}), **out}


def arch_from_hf_config(d: Mapping[str, Any], *, name: str | None = None) -> ModelArch:
    """Parse a Hugging Face ``config.json`` (as a dict) into a :class:`ModelArch`.

    Multimodal configs that nest the language model under ``text_config`` are read from there. Raises
    :class:`TuneError` naming the missing key when a required field is absent.
    """
    text = d.get("text_config")
    cfg: Mapping[str, Any] = text if isinstance(text, Mapping) and "hidden_size" in text else d
    cfg = _with_type_defaults(cfg, d)
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
    if str(cfg.get("model_type")) == "llama4_text" and experts:
        shared_inter = moe_inter  # every Llama 4 MoE layer adds one shared expert of the routed experts' width
        sparse_step_llama4 = _int(cfg, "interleave_moe_layer_step", default=1) or 1
        mlp_only_llama4 = {i for i in range(int(cfg["num_hidden_layers"])) if (i + 1) % sparse_step_llama4}
    else:
        mlp_only_llama4 = set()
    first_dense = _int(cfg, "first_k_dense_replace", default=0) or 0
    freq = _int(cfg, "moe_layer_freq", default=1) or 1
    sparse_step = _int(cfg, "decoder_sparse_step", default=1) or 1
    mlp_only = {int(i) for i in (cfg.get("mlp_only_layers") or ())} | mlp_only_llama4
    moe_indices: tuple[int, ...] = ()
    if experts:
        moe_indices = tuple(
            i
            for i in range(layers)
            if i >= first_dense and i % freq == 0 and (i + 1) % sparse_step == 0 and i not in mlp_only
        )

    kv_lora = _int(cfg, "kv_lora_rank")
    quant = read_quantization(cfg if "quantization_config" in cfg else d, num_layers=layers)
    bits = quant.bits if quant and quant.bits is not None and quant.bits < 16 else None
    mtype = str(model_type or "")
    layout = read_layout(cfg, str(model_type) if model_type else None, layers)
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
        num_moe_layers=len(moe_indices),
        moe_layer_indices=moe_indices,
        kv_lora_rank=kv_lora if kv_lora else None,
        q_lora_rank=_int(cfg, "q_lora_rank"),
        qk_rope_head_dim=_int(cfg, "qk_rope_head_dim", default=0) or 0,
        qk_nope_head_dim=_int(cfg, "qk_nope_head_dim", default=0) or 0,
        v_head_dim=_int(cfg, "v_head_dim", default=0) or 0,
        quant_method=quant.method if quant else None,
        weight_bits=bits,
        quant_group_size=quant.group_size if quant and bits else None,
        quant_scale_bytes=quant.scale_bytes_per_group if quant and bits else 0.0,
        quant_kept=quant.kept if quant and bits else (),
        layout=layout,
        context=read_context_fields(cfg, d),
        tower_parameters=_tower_parameters(d),
    )
