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


def _kept_parts(patterns: Any) -> tuple[str, ...]:
    """Map ``ignore`` / ``modules_to_not_convert`` patterns to the parts :mod:`weights` counts (a pattern naming one
    layer's module keeps only that module: too small to count)."""
    kept: set[str] = set()
    for raw in patterns or ():
        text = str(raw).removeprefix("re:")
        if any(part.isdigit() for part in text.split(".")):
            continue  # one layer's module, e.g. model.layers.0.mlp.down_proj
        if "attn" in text or "attention" in text:
            kept.add("attention")
        elif "shared_expert" in text:
            kept.add("shared_experts")
        elif "experts" in text:
            kept.add("routed_experts")
        elif text.endswith("mlp") or text.endswith("mlp.*"):
            kept.add("dense_mlp")
    return tuple(sorted(kept))


def read_quantization(d: Mapping[str, Any]) -> Quantization | None:
    """How ``quantization_config`` stores the linear weights; None if absent. Group scales: GPTQ/AWQ a 16-bit scale
    plus a ``bits``-wide zero point per group; MXFP4 one 8-bit scale per 32; NVFP4 one 8-bit scale per 16."""
    q = d.get("quantization_config")
    if not isinstance(q, Mapping):
        return None
    method = str(q.get("quant_method") or q.get("format") or "unknown").lower()
    kept = _kept_parts(q.get("ignore") or q.get("modules_to_not_convert"))
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
