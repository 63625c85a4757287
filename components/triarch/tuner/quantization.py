"""What a checkpoint's ``quantization_config`` does to its linear layers: bits per weight, the scales stored with
them, and the modules it leaves in the checkpoint dtype."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Quantization:
    """What ``quantization_config`` does to the linear layers' weights."""

    method: str
    bits: float | None
    """Bits per quantized weight (None: not a weight format the tuner reads; weights stay in the dtype)."""
    group_size: int | None = None
    scale_bytes_per_group: float = 0.0
    kept: tuple[str, ...] = ()
    """Parts left in the checkpoint dtype: "attention", "dense_mlp", "shared_experts", "routed_experts"."""


def _part(text: str) -> str | None:
    """The part of :mod:`weights` a module pattern names."""
    if "attn" in text or "attention" in text:
        return "attention"
    if "shared_expert" in text:
        return "shared_experts"
    if "experts" in text:
        return "routed_experts"
    if "mlp" in text.split(".")[-1] or text.endswith("mlp.*") or ".mlp." in text:
        return "dense_mlp"
    return None


def _kept_parts(patterns: Any, num_layers: int | None) -> tuple[str, ...]:
    """Map ``ignore`` / ``modules_to_not_convert`` patterns to the parts :mod:`weights` counts. A pattern naming one
    layer's module keeps only that module: a part counts as kept when the patterns name it in every decoder layer
    (Meta's FP8 Llama 3.1 405B lists the attention of all 126 layers one by one), else it is too small to count."""
    kept: set[str] = set()
    per_layer: dict[str, set[int]] = {}
    for raw in patterns or ():
        text = str(raw).removeprefix("re:")
        part = _part(text)
        if part is None:
            continue
        layers = [int(piece) for piece in text.split(".") if piece.isdigit()]
        if layers:
            per_layer.setdefault(part, set()).add(layers[0])
        elif text.endswith("mlp") or text.endswith("mlp.*") or part != "dense_mlp":
            kept.add(part)
    if num_layers:
        kept |= {part for part, layers in per_layer.items() if len(layers) >= num_layers}
    return tuple(sorted(kept))


def read_quantization(d: Mapping[str, Any], num_layers: int | None = None) -> Quantization | None:
    """How ``quantization_config`` stores the linear weights; None if absent. Group scales: GPTQ/AWQ a 16-bit scale
    plus a ``bits``-wide zero point per group; MXFP4 one 8-bit scale per 32; NVFP4 one 8-bit scale per 16."""
    q = d.get("quantization_config")
    if not isinstance(q, Mapping):
        return None
    method = str(q.get("quant_method") or q.get("format") or "unknown").lower()
    kept = _kept_parts(q.get("ignore") or q.get("modules_to_not_convert"), num_layers)
    group = q.get("group_size")
    group_size = int(group) if isinstance(group, int) and group > 0 else None
    if q.get("bits") is not None:  # GPTQ, AWQ, HQQ, ...
        bits = float(q["bits"])
        return Quantization(method, bits, group_size, 2 + bits / 8 if group_size else 0.0, kept)
    if q.get("load_in_4bit"):
        return Quantization(method, 4.0, 64, 2.0 + 0.5, kept)
    if q.get("load_in_8bit"):
        return Quantization(method, 8.0, None, 0.0, kept)
    if method in ("fp8", "fbgemm_fp8", "fp8_dynamic"):
        return Quantization(method, 8.0, None, 0.0, kept)
    if method == "mxfp4":
        return Quantization(method, 4.0, 32, 1.0, kept)
    if method == "modelopt":
        algo = str(q.get("quant_algo") or "fp8").lower()
        return Quantization(method, 4.0, 16, 1.0, kept) if "fp4" in algo else Quantization(method, 8.0, None, 0.0, kept)
    groups = q.get("config_groups")
    if isinstance(groups, Mapping):  # compressed-tensors: the widest weight scheme of any group
        schemes: list[tuple[float, int | None, str]] = []
        for g in groups.values():
            weights = g.get("weights") if isinstance(g, Mapping) else None
            if isinstance(weights, Mapping) and weights.get("num_bits") is not None:
                gs = weights.get("group_size")
                schemes.append((float(weights["num_bits"]), int(gs) if isinstance(gs, int) and gs > 0 else None,
                                str(weights.get("type") or "int")))
        if schemes:
            bits, gs, kind = max(schemes, key=lambda b: b[0])
            scale = (1.0 if kind == "float" and bits == 4 else 2.0) if gs else 0.0
            return Quantization(method, bits, gs, scale, kept)
    return Quantization(method, None, None, 0.0, kept)
