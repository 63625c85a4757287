"""Read vLLM (V1) start-up logs into calibration cases: the settings each run used and every memory number it printed.

    uv run python bench/import_vllm_logs.py LOG_DIR --source "owner/repo@commit:path" > bench/some-cases.yaml

Written for the logs llm-d-planner committed in llm-d-incubation/llm-d-planner (commit d3121e0, directory
accuracy/results/v0.19.0/logs, removed again in 2489dbb): `git archive d3121e0 accuracy/results | tar x`. Only the
numbers are kept, as printed; a log that failed to start keeps the reason vLLM gave. The output is committed so that
the calibration benchmark needs no network.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path
from typing import Any

import yaml

PATTERNS: dict[str, str] = {
    "version": r"Initializing a V1 LLM engine \(v([0-9.]+)\)",
    "dtype": r"Initializing a V1 LLM engine .*? dtype=torch\.(\w+)",
    "quantization": r"Initializing a V1 LLM engine .*? quantization=([\w-]+)",
    "kv_cache_dtype": r"Initializing a V1 LLM engine .*? kv_cache_dtype=(\w+)",
    "max_num_seqs": r"Defaulting max_num_seqs to (\d+)",
    "max_num_batched_tokens": r"Defaulting max_num_batched_tokens to (\d+)",
    "total_gib": r"worker init memory snapshot: .*?total_memory=([0-9.]+)GiB",
    "init_non_torch_gib": r"worker init memory snapshot: .*?non_torch_memory=([0-9.]+)GiB",
    "requested_gib": r"worker requested memory: ([0-9.]+)GiB",
    "weights_gib": r"Model loading took ([0-9.]+) GiB",
    "non_kv_gib": r"Total non KV cache memory: ([0-9.]+)GiB",
    "activation_gib": r"torch peak memory increase: ([0-9.]+)GiB",
    "non_torch_gib": r"non-torch forward increase memory: ([0-9.]+)GiB",
    "cuda_graph_estimate_gib": r"Estimated CUDA graph memory: ([0-9.]+) GiB total",
    "cuda_graph_gib": r"Graph capturing finished in \d+ secs, took ([0-9.]+) GiB",
    "available_kv_gib": r"Available KV cache memory: ([0-9.]+) GiB",
    "kv_tokens": r"GPU KV cache size: ([0-9,]+) tokens",
    "kv_blocks": r"after num_gpu_blocks is: (\d+)",
    "max_concurrency": r"Maximum concurrency for [0-9,]+ tokens per request: ([0-9.]+)x",
}
INTS = {"max_num_seqs", "max_num_batched_tokens", "kv_tokens", "kv_blocks"}
FAILURE = re.compile(r"(ValueError|RuntimeError|AssertionError|OSError): (.*?)(?:', please check.*)?$", re.MULTILINE)


def _first(pattern: str, text: str) -> str | None:
    match = re.search(pattern, text, flags=re.MULTILINE)
    return match.group(1) if match else None


def read_log(path: Path) -> dict[str, Any]:
    """One case: the model and its non-default args, the numbers the log printed, or why it failed."""
    text = path.read_text(encoding="utf-8", errors="replace")
    args_text = _first(r"non-default args: (\{.*\})$", text)
    args: dict[str, Any] = ast.literal_eval(args_text) if args_text else {}
    settings = {k: v for k, v in args.items() if k not in ("model_tag", "model", "enable_prefix_caching")}
    logged: dict[str, Any] = {}
    for key, pattern in PATTERNS.items():
        value = _first(pattern, text)
        if value is None:
            continue
        if key in ("version", "dtype", "quantization", "kv_cache_dtype", "max_num_seqs", "max_num_batched_tokens"):
            if key in ("max_num_seqs", "max_num_batched_tokens"):
                settings.setdefault(key, int(value))
            elif key == "version":
                logged["vllm_version"] = value
            elif value != "None" and not (key == "kv_cache_dtype" and value == "auto"):
                settings.setdefault(key, value)
            continue
        logged[key] = int(value.replace(",", "")) if key in INTS else float(value)
    case: dict[str, Any] = {"log": path.name, "model": args.get("model"), "settings": settings, "logged": logged}
    if "available_kv_gib" not in logged or ".FAILED." in path.name:
        reasons = [m.group(2).strip() for m in FAILURE.finditer(text) if "Engine core initialization" not in m.group(2)]
        reasons += [line.split("Value error, ", 1)[1].strip() for line in text.splitlines() if "Value error, " in line]
        case["failed"] = reasons[-1][:400] if reasons else "no reason printed"
    return case


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log_dir", type=Path)
    parser.add_argument("--source", required=True, help="where the logs come from (repository@commit:path)")
    args = parser.parse_args(argv)
    cases = [read_log(p) for p in sorted(args.log_dir.glob("*.log"))]
    header = (f"# vLLM start-up logs read by bench/import_vllm_logs.py from {args.source}.\n"
              "# settings: the run's non-default args plus the defaults the log says it chose; logged: numbers as\n"
              "# printed (GiB to two decimals). A case with `failed` did not start; the reason is vLLM's.\n")
    sys.stdout.write(header + yaml.safe_dump({"cases": cases}, sort_keys=False, width=120))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
