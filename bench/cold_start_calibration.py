"""How the cold-start prediction's parts compare with every public start-up timing we could source.

    uv run --extra test python bench/cold_start_calibration.py     # the Markdown table docs/cold-start.md carries

Each case of bench/cold-start-timings.yaml is one measured part of a start (the weights' read, or vLLM's own start
from the weights loaded to serving); it is held against the range the prediction gives that part for the same path
(templates/compat/cold-start.yaml, through the same code `triarch plan` uses). In-sample cases (a figure's own
source) agree by construction and are marked so; the rest say whether the measurement fell inside the range, below
it (faster) or above it (slower), and by how much. A benchmark: it prints and asserts nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from triarch.coldfacts import Range, cold_start_facts

BENCH_DIR = Path(__file__).resolve().parent
CASES = BENCH_DIR / "cold-start-timings.yaml"
MB = 1_000_000
MIB = 1024 * 1024


def predicted(case: dict[str, Any]) -> Range | None:
    """The prediction's range for the case's part and path (None: a path the prediction does not model)."""
    cold = cold_start_facts()
    if case["part"] == "weights":
        size = float(case["gigabytes"]) * 1000 * MB
        if case["path"] == "s3-streamer":
            return Range(size / (cold.streamer_s3_mbps.high * MB), size / (cold.streamer_s3_mbps.low * MB))
        if case["path"] == "safetensors-block":
            return Range(size / (cold.efs_per_client_mibps * MIB), size / (cold.safetensors_on_block_mbps * MB))
        return None
    return {"warm": cold.engine_warm, "cold": cold.engine_cold, "cold-parallel": cold.engine_cold_parallel,
            "warm-moe": cold.engine_warm_moe, "cold-moe": cold.engine_cold_moe,
            "eager": cold.engine_eager}[case["compile"]]


def verdict(case: dict[str, Any], expected: Range | None) -> str:
    seconds = float(case["seconds"])
    if expected is None:
        return "not modelled"
    if expected.low * 0.99 <= seconds <= expected.high * 1.01:  # the figures are rounded where they were derived
        return "in-sample" if case.get("source_of") else "inside"
    if seconds < expected.low:
        return f"faster ({seconds / expected.low:.2f}x the fast end)"
    return f"slower ({seconds / expected.high:.2f}x the slow end)"


def main() -> None:
    cases = yaml.safe_load(CASES.read_text(encoding="utf-8"))["cases"]
    print("| case | part | measured | predicted | verdict |")
    print("|---|---|---:|---:|---|")
    counts: dict[str, int] = {}
    for case in cases:
        expected = predicted(case)
        found = verdict(case, expected)
        kind = found if found == "not modelled" else found.split(" ")[0]
        counts[kind] = counts.get(kind, 0) + 1
        part = case["part"] + (f" ({case['path']})" if case["part"] == "weights" else f" ({case['compile']})")
        shown = "-" if expected is None else f"{expected.low:.1f}-{expected.high:.1f} s"
        link = f"[{case['what']}]({case['source']})"
        print(f"| {link} | {part} | {float(case['seconds']):g} s | {shown} | {found} |")
    print()
    print(", ".join(f"{k}: {n}" for k, n in sorted(counts.items())))


if __name__ == "__main__":
    main()
