"""The longest context vLLM derives from a model's files, release by release, and the refusal it gives for a longer
``--max-model-len`` (vllm/config/model.py ``_get_and_verify_max_len``; the rules per release are in
templates/compat/vllm-releases.yaml)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from triarch.tuner.errors import LengthRefused
from triarch.tuner.releases import VllmRelease

LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
               "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
"""The config keys vLLM takes the smallest of, in its order (model_arch_config_convertor.py
``derive_max_model_len_and_key``, the same in 0.19.0, 0.29.0 and 0.33.0)."""

NOT_SCALED = ("su", "longrope", "llama3")
"""Rope types whose max_position_embeddings already is the long length, in every release."""

YARN_TYPES = ("yarn", "deepseek_yarn", "deepseek_llama_scaling")
"""Added to :data:`NOT_SCALED` by vLLM 0.33.0 (``yarnContext: unscaled``)."""


@dataclass(frozen=True)
class RopeScaling:
    """One rope-scaling block (``rope_scaling`` / ``rope_parameters``; one per layer type when nested)."""

    rope_type: str
    factor: float | None
    original_max_position_embeddings: int | None


@dataclass(frozen=True)
class ContextFields:
    """What vLLM reads from a model's files to derive its longest context."""

    lengths: tuple[tuple[str, int], ...] = ()
    """The :data:`LENGTH_KEYS` present in the (text) config, in vLLM's order."""
    model_max_length: int | None = None
    """``model_max_length`` in config.json itself (it overrides the minimum, and admits longer requests)."""
    rope: tuple[RopeScaling, ...] = ()
    original_max_position_embeddings: int | None = None
    """Top level: the default length of longrope models."""
    position_embedding_type: str | None = None
    tokenizer_model_max_length: int | None = None
    """tokenizer_config.json ``model_max_length`` (read by vLLM for pooling models with absolute positions only)."""
    sentence_transformers_max_seq_length: int | None = None
    sentence_transformers_has_do_lower_case: bool = False


def _rope_blocks(cfg: Mapping[str, Any]) -> tuple[RopeScaling, ...]:
    raw = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    if not isinstance(raw, Mapping) or not raw:
        return ()
    nested = all(isinstance(v, Mapping) or v is None for v in raw.values())
    blocks = [v for v in raw.values() if isinstance(v, Mapping) and v] if nested else [raw]
    out = []
    for block in blocks:
        kind = str(block.get("rope_type") or block.get("type") or "default")
        kind = {"su": "longrope", "mrope": "default"}.get(kind, kind)
        factor = block.get("factor")
        original = block.get("original_max_position_embeddings")
        out.append(RopeScaling(kind, float(factor) if factor is not None else None,
                               int(original) if original is not None else None))
    return tuple(out)


def read_context_fields(cfg: Mapping[str, Any], top: Mapping[str, Any]) -> ContextFields:
    """From the text config ``cfg`` (and the whole file ``top``, which carries the tokenizer's and
    sentence-transformers' files under ``_tokenizer_config`` / ``_sentence_bert_config`` when known)."""
    lengths = tuple((k, int(cfg[k])) for k in LENGTH_KEYS if isinstance(cfg.get(k), int | float))
    tokenizer = top.get("_tokenizer_config")
    st = top.get("_sentence_bert_config")
    tok_len = tokenizer.get("model_max_length") if isinstance(tokenizer, Mapping) else None
    st_len = st.get("max_seq_length") if isinstance(st, Mapping) else None
    original = cfg.get("original_max_position_embeddings")
    return ContextFields(
        lengths=lengths,
        model_max_length=int(cfg["model_max_length"]) if cfg.get("model_max_length") else None,
        rope=_rope_blocks(cfg),
        original_max_position_embeddings=int(original) if original else None,
        position_embedding_type=cfg.get("position_embedding_type"),
        tokenizer_model_max_length=int(tok_len) if isinstance(tok_len, int | float) else None,
        sentence_transformers_max_seq_length=int(st_len) if isinstance(st_len, int) else None,
        sentence_transformers_has_do_lower_case=isinstance(st, Mapping) and "do_lower_case" in st,
    )


@dataclass(frozen=True)
class ContextLimit:
    """The longest context one release derives, how, and the default ``max_model_len`` it serves."""

    derived: float
    key: str
    default: int
    derivation: str

    @property
    def tokens(self) -> int:
        return int(self.derived)


def derive_context(fields: ContextFields, release: VllmRelease, *, model_type: str | None,
                   pooling: bool = False) -> ContextLimit | None:
    """``_get_and_verify_max_len`` for ``release``; None when the config names no length (vLLM then accepts any
    explicit max_model_len and defaults to 2048)."""
    if not fields.lengths and not fields.model_max_length:
        return None
    key, derived_int = min(fields.lengths, key=lambda kv: kv[1]) if fields.lengths else ("model_max_length", 0)
    if fields.model_max_length:
        key, derived_int = "model_max_length", fields.model_max_length
    derived: float = derived_int
    steps = [f"{key} {derived_int}"]
    if pooling and fields.position_embedding_type == "absolute" and fields.tokenizer_model_max_length:
        if fields.tokenizer_model_max_length < derived:
            steps.append(f"capped to the tokenizer's model_max_length {fields.tokenizer_model_max_length}")
        derived = min(derived, fields.tokenizer_model_max_length)
    if fields.rope and "gemma3" not in (model_type or ""):
        skipped = NOT_SCALED + (YARN_TYPES if release.yarn_context == "unscaled" else ())
        factor: float | None = 1.0
        for block in fields.rope:
            if block.rope_type in skipped:
                continue
            factor = block.factor if block.factor is not None else factor
            if block.rope_type == "yarn":
                base = block.original_max_position_embeddings or dict(fields.lengths).get("max_position_embeddings")
                if base is not None:
                    derived = base
                    steps = [f"original_max_position_embeddings {base}"]
        derived *= factor or 1.0
        if factor and factor != 1.0:
            steps.append(f"x {fields.rope[-1].rope_type} factor {factor:g}")
        elif any(b.rope_type in YARN_TYPES for b in fields.rope) and release.yarn_context == "unscaled":
            steps.append("(yarn taken as already scaled)")
    st_len = fields.sentence_transformers_max_seq_length
    if st_len and (fields.sentence_transformers_has_do_lower_case
                   or not release.sentence_transformers_needs_do_lower_case):
        derived = st_len
        steps = [f"sentence-transformers max_seq_length {st_len}"]
    default = int(derived)
    if any(b.rope_type == "longrope" for b in fields.rope):
        default = fields.original_max_position_embeddings or default
    return ContextLimit(derived, key, default, " ".join(steps))


def refuse_longer(requested: int, limit: ContextLimit | None, fields: ContextFields, release: VllmRelease,
                  label: str) -> None:
    """Raise :class:`LengthRefused` with vLLM's own reason when vLLM refuses ``requested``."""
    if limit is None or requested <= limit.derived:
        return
    if fields.model_max_length is not None and requested <= fields.model_max_length:
        return
    derived = limit.derived if fields.rope else int(limit.derived)
    raise LengthRefused(
        f"vLLM {release.version} refuses max_model_len {requested} for {label} (the longest it derives: "
        f"{limit.derivation}): \"User-specified max_model_len ({requested}) is greater than the derived "
        f"max_model_len ({limit.key}={derived} or model_max_length={fields.model_max_length} in model's "
        "config.json).\" Serve at most that, or raise max_position_embeddings in the model's config where the "
        "model is trained for longer")
