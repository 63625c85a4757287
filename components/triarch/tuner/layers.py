"""Which attention each decoder layer runs, as vLLM lays it out: full, sliding window or chunked local attention,
from the config's ``layer_types`` or the rule its transformers config class applies when the file has none. Models
with mamba or linear-attention layers, and model types the tuner does not know, are refused rather than guessed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from triarch.tuner.errors import TuneError

LayerKind = Literal["full", "sliding", "chunked"]

LAYER_TYPES: dict[str, LayerKind] = {
    "full_attention": "full", "sliding_attention": "sliding", "chunked_attention": "chunked",
}
"""``layer_types`` entries vLLM pages as attention (vllm/model_executor/models/{llama,gemma2,gemma3,gpt_oss}.py)."""

FULL_ATTENTION_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "phi", "granite",
    "granitemoe", "gemma", "deepseek_v2", "deepseek_v3", "cohere", "olmo2", "starcoder2",
})
"""Model types whose layers are all full attention unless the config lists ``layer_types`` (vLLM's llama-family
code reads only ``layer_types``; transformers v5 derives it for Qwen2/3 from ``use_sliding_window``; MLA models
are full attention over one latent)."""

PATTERNED_TYPES = frozenset({"gemma2", "gemma3", "gemma3_text", "gpt_oss", "llama4", "llama4_text"})
"""Model types whose config classes derive ``layer_types`` from a pattern when the file has none."""

STATE_SPACE_TYPES: dict[str, str] = {
    "jamba": "mamba", "bamba": "mamba2", "nemotron_h": "mamba2", "falcon_h1": "mamba2", "zamba2": "mamba2",
    "granitemoehybrid": "mamba2", "mamba": "mamba", "mamba2": "mamba2", "falcon_mamba": "mamba",
    "qwen3_next": "gated DeltaNet linear attention", "kimi_linear": "KDA linear attention",
    "minimax_text_01": "lightning linear attention", "minimax_m1": "lightning linear attention",
    "lfm2": "short convolution", "plamo2": "mamba",
}
"""Hybrids whose recurrent layers vLLM gives a fixed state per request (MambaSpec), page-aligned with the
attention layers (the attention block size is raised to match, e.g. 272 tokens for Qwen3-Next at TP=4)."""


@dataclass(frozen=True)
class AttentionLayout:
    """Per decoder layer, the attention kind; the window and chunk sizes the kinds use."""

    kinds: tuple[LayerKind, ...]
    sliding_window: int | None = None
    chunk_size: int | None = None

    @property
    def is_hybrid(self) -> bool:
        return len(set(self.kinds)) > 1 or self.kinds[:1] != ("full",)


def _refuse_state_space(model_type: str, what: str) -> TuneError:
    return TuneError(
        f"model_type {model_type!r} interleaves {what} layers with attention: vLLM gives each request a fixed "
        "recurrent state for them (MambaSpec) and raises the attention block size to that state's page, which the "
        "tuner does not model; it refuses rather than size the state as KV cache (public estimators have been "
        "off by tens of times on such models)")


def _patterned(model_type: str, cfg: Mapping[str, Any], layers: int) -> list[str]:
    """The ``layer_types`` transformers v5 derives when the file has none (configuration_<model>.py)."""
    if model_type in ("gemma2", "gpt_oss"):
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    if model_type in ("gemma3", "gemma3_text"):
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    # llama4: a NoPE (global) layer every no_rope_layer_interval layers, chunked local attention elsewhere
    interval = int(cfg.get("no_rope_layer_interval") or 4)
    no_rope = cfg.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
    if not cfg.get("attention_chunk_size", 8192):
        return ["full_attention"] * layers
    return ["chunked_attention" if use_rope else "full_attention" for use_rope in no_rope]


def read_layout(cfg: Mapping[str, Any], model_type: str | None, layers: int) -> AttentionLayout:
    """The layout of the text config ``cfg``; :class:`TuneError` for a hybrid with recurrent layers, an unknown
    layer type or an unknown model type."""
    if model_type is None:
        raise TuneError("the config names no model_type: the tuner cannot tell how vLLM lays out its layers")
    if model_type in STATE_SPACE_TYPES:
        raise _refuse_state_space(model_type, STATE_SPACE_TYPES[model_type])
    raw = cfg.get("layer_types")
    if raw is None and model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe") and cfg.get("use_sliding_window"):
        first = int(cfg.get("max_window_layers") or 0)
        raw = ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
    if raw is None and model_type in PATTERNED_TYPES:
        raw = _patterned(model_type, cfg, layers)
    if raw is None:
        if model_type not in FULL_ATTENTION_TYPES:
            known = ", ".join(sorted(FULL_ATTENTION_TYPES | PATTERNED_TYPES))
            raise TuneError(f"model_type {model_type!r} is not one the tuner knows how vLLM lays out (known: {known});"
                            " it refuses rather than guess its KV cache")
        raw = ["full_attention"] * layers
    unknown = sorted({str(t) for t in raw} - set(LAYER_TYPES))
    if unknown:
        if any(t in ("linear_attention", "mamba", "mamba2", "conv", "recurrent") for t in unknown):
            raise _refuse_state_space(model_type, "/".join(unknown))
        raise TuneError(f"layer_types {unknown} of model_type {model_type!r} are not attention kinds the tuner "
                        f"knows (known: {', '.join(LAYER_TYPES)})")
    if len(raw) != layers:
        raise TuneError(f"layer_types lists {len(raw)} layers, num_hidden_layers is {layers}")
    kinds = tuple(LAYER_TYPES[str(t)] for t in raw)
    window = cfg.get("sliding_window") if "sliding" in kinds else None
    if "sliding" in kinds and not window:
        raise TuneError(f"model_type {model_type!r} has sliding-window layers but no sliding_window size")
    chunk = int(cfg.get("attention_chunk_size") or 8192) if "chunked" in kinds else None
    return AttentionLayout(kinds, int(window) if window else None, chunk)
