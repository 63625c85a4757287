"""How close the vLLM KV-cache tuner comes to public vLLM start-up logs.

    uv run python bench/kv_calibration.py

Reads ../shared/reference/vllm-kv-cases.yaml (when present) and bench/kv-cases.yaml. For each case it prints, for
every number the log has, logged vs predicted and the signed relative error:

(a) weights per GPU ("Model loading took");
(b) paging: the logged "Available KV cache memory" given as ``kv_cache_memory_bytes``, predicted KV tokens vs the
    logged "GPU KV cache size" (or "# GPU blocks" x block size) -- isolates the bytes-per-token arithmetic;
(c) the full prediction from ``gpu_memory_utilization`` (weights, non-torch, activation peak, CUDA graphs): available
    KV memory and KV tokens;
(d) maximum concurrency (KV tokens / max_model_len), from the full prediction.

The memory components the log prints (non-torch, activation peak) are set against the tuner's model too. A case the
log shows failing must make the tuner refuse (TuneError) or cap max_model_len. A benchmark: prints, asserts nothing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from triarch.catalog import Gpu, catalog
from triarch.tuner import (
    CUDA_RESERVED_BYTES,
    GIB,
    MIB,
    ModelArch,
    Sizing,
    TuneError,
    arch_from_hf_config,
    kv_bytes_per_token,
    kv_cache_capacity,
    load_model_config,
    tune,
    weight_bytes,
)

BENCH_DIR = Path(__file__).resolve().parent
SHARED_CASES = BENCH_DIR.parents[1] / "shared" / "reference" / "vllm-kv-cases.yaml"
OWN_CASES = BENCH_DIR / "kv-cases.yaml"

W8A8 = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {"num_bits": 8}}}}
AWQ4 = {"quant_method": "awq", "bits": 4, "group_size": 128}
SHARED_HINTS: dict[str, dict[str, Any]] = {
    "vllm-project/vllm PR 12569": {"catalog_model": "meta-llama/Llama-3.1-70B-Instruct", "quantization_config": W8A8,
                                   "gpu": "h100-80gb"},
    "vllm-project/vllm issue 13882": {"catalog_model": "Qwen/Qwen2.5-7B-Instruct", "quantization_config": AWQ4},
    "vllm-project/vllm issue 12330": {"catalog_model": "meta-llama/Meta-Llama-3-8B", "gpu": "a100-40gb"},
}
"""The shared file names models and GPUs in prose; these are the readings tests/test_tuner.py uses for them."""

METRICS = ("weights", "paging tokens", "available KV", "KV tokens", "concurrency", "non-torch", "activation peak")


@dataclass
class Case:
    """One logged start-up, resolved to an architecture and a GPU."""

    label: str
    source: str
    model: str
    arch: ModelArch
    gpu: Gpu | None
    settings: dict[str, Any]
    logged: dict[str, Any]


@dataclass
class Tally:
    """Relative errors per metric (with the case they came from) and refusal matches."""

    errors: dict[str, list[tuple[float, str]]] = field(default_factory=lambda: {m: [] for m in METRICS})
    refusals: list[tuple[bool, str]] = field(default_factory=list)


def gib(value: Any) -> float:
    """'14.9888 GB' / '3.81GiB' / '9.37 GiB (V0 ...)' / 1.5 -> GiB as a float (old vLLM logs say GB for GiB)."""
    if isinstance(value, int | float):
        return float(value)
    match = re.search(r"-?\d+(?:\.\d+)?", str(value))
    if not match:
        raise ValueError(f"no number in {value!r}")
    return float(match.group(0))


def count(value: Any) -> int:
    """'175,856 tokens' / 1952 -> int."""
    if isinstance(value, int):
        return value
    match = re.search(r"-?[\d,]+", str(value))
    if not match:
        raise ValueError(f"no count in {value!r}")
    return int(match.group(0).replace(",", ""))


def rel(predicted: float, logged: float) -> float | None:
    """Signed relative error (predicted - logged) / |logged|; None when the logged value is 0."""
    return None if logged == 0 else (predicted - logged) / abs(logged)


def load_cases(path: Path, hints: Mapping[str, Mapping[str, Any]]) -> list[Case]:
    """The cases of one YAML file, each with its architecture and GPU resolved."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    gpus = catalog().gpus
    cases = []
    for i, entry in enumerate(raw, 1):
        d = {**hints.get(entry["source"], {}), **entry}
        settings: dict[str, Any] = dict(d.get("settings") or {})
        logged: dict[str, Any] = dict(d.get("logged") or {})
        if "config" in d:
            config: dict[str, Any] = dict(d["config"])
        else:
            config = load_model_config(d["catalog_model"])
        if d.get("quantization_config"):
            config = {**config, "quantization_config": d["quantization_config"]}
        arch = arch_from_hf_config(config, name=str(d.get("catalog_model") or config.get("_name_or_path") or "model"))
        total = d.get("gpu_total_gib") or settings.get("gpu_total") or logged.get("total_gpu_memory")
        gpu: Gpu | None = None
        if total is not None:
            # A logged total is what torch sees; the catalog (and the tuner) count from nvidia-smi's total, which
            # includes the CUDA context's reserve.
            mib = round(gib(total) * 1024 + CUDA_RESERVED_BYTES / (1 << 20))
            gpu = Gpu(key=f"logged-{mib}mib", product=f"GPU of {gib(total):.2f} GiB (logged)", architecture="unknown",
                      compute_capability="0.0", memory_mib=mib, min_cuda="0", data_center=True,
                      ray_accelerator_type=None)
        elif d.get("gpu"):
            gpu = gpus[d["gpu"]]
        label = f"{path.name}#{i} {d['source']}"
        cases.append(Case(label, d["source"], str(d["model"]), arch, gpu, settings, logged))
    return cases


def logged_kv_tokens(case: Case) -> int | None:
    """'GPU KV cache size' tokens, or '# GPU blocks' x block size."""
    if "kv_tokens" in case.logged:
        return count(case.logged["kv_tokens"])
    if "gpu_blocks" in case.logged:
        return count(case.logged["gpu_blocks"]) * int(case.settings.get("block_size", 16))
    return None


def logged_available(case: Case) -> float | None:
    """'Available KV cache memory' (V1) / 'kv_cache_size' or the rest reserved for KV (V0), GiB."""
    for key in ("available_kv", "kv_cache_size"):
        if key in case.logged:
            return gib(case.logged[key])
    return None


def logged_concurrency(case: Case) -> tuple[float, int] | None:
    """(logged maximum concurrency, the max_model_len it is for)."""
    for key, value in case.logged.items():
        match = re.fullmatch(r"max_concurrency(?:_at_(\d+))?", key)
        if match:
            length = int(match.group(1)) if match.group(1) else case.settings.get("max_model_len")
            if length:
                return gib(value), int(length)
    return None


def row(tally: Tally, case: Case, metric: str, logged: float, predicted: float, fmt: str = ".2f") -> None:
    """Print one logged-vs-predicted line and record its error."""
    err = rel(predicted, logged)
    shown = "   n/a" if err is None else f"{err:+7.1%}"
    print(f"    {metric:<26} logged {logged:>12{fmt}}  predicted {predicted:>12{fmt}}  err {shown}")
    if err is not None:
        tally.errors[metric].append((err, case.label))


def refused_kv(message: str) -> float | None:
    """The 'KV cache gets X GiB' figure of a TuneError message."""
    match = re.search(r"the KV cache gets (-?\d+\.\d+) GiB", message)
    return float(match.group(1)) if match else None


def run_case(case: Case, tally: Tally) -> None:
    """Print one case's comparison."""
    s = case.settings
    tp = int(s.get("tensor_parallel_size", 1))
    block = int(s.get("block_size", 16))
    kv_dtype = str(s.get("kv_cache_dtype", "auto"))
    util = float(s.get("gpu_memory_utilization", 0.9))
    max_len: int | None = s.get("max_model_len")
    conc = logged_concurrency(case)
    if max_len is None and conc is not None:
        max_len = conc[1]
    gpu_text = "GPU not given" if case.gpu is None else f"{case.gpu.product} ({case.gpu.memory_mib / 1024:.2f} GiB)"
    print(f"\n{case.label}\n  {case.model}\n  on {gpu_text}; tp={tp} util={s.get('gpu_memory_utilization', '-')} "
          f"max_model_len={max_len or '-'} block={block} kv_cache_dtype={kv_dtype}")

    # (a) weights per GPU
    if "model_weights" in case.logged:
        row(tally, case, "weights", gib(case.logged["model_weights"]),
            math.ceil(weight_bytes(case.arch) / tp) / GIB, ".4f")

    # (b) paging from the logged available KV memory
    available = logged_available(case)
    tokens = logged_kv_tokens(case)
    per_token = kv_bytes_per_token(case.arch, tensor_parallel_size=tp, kv_cache_dtype=kv_dtype)
    if available is not None and tokens is not None and available > 0:
        given = int(available * GIB)
        _, paged = kv_cache_capacity(given, per_token, block)
        how = "kv_bytes_per_token"
        if case.gpu is not None:
            try:
                paged = tune(case.arch, case.gpu, tensor_parallel_size=tp, gpus_available=tp, max_model_len=max_len,
                             kv_cache_memory_bytes=given, block_size=block, kv_cache_dtype=kv_dtype,
                             **batch_settings(case.settings)).kv_cache_tokens
                how = "tune(kv_cache_memory_bytes)"
            except TuneError:
                pass
        half = kv_cache_capacity(int(0.005 * GIB), per_token, block)[1]
        print(f"  (b) paging via {how}: {per_token:,} B/token, logged GiB rounding = +/-{half:,} tokens")
        row(tally, case, "paging tokens", tokens, paged, ",.0f")

    # (c) + (d) the full memory model
    failing = (case.logged.get("gpu_blocks") == 0 or (available is not None and available < 0)
               or "error" in case.logged)
    if case.gpu is None or "gpu_memory_utilization" not in s:
        print("  (c) full prediction: skipped (GPU total or gpu_memory_utilization not in the log)")
        return
    try:
        sizing: Sizing | None = tune(case.arch, case.gpu, tensor_parallel_size=tp, gpus_available=tp,
                                     gpu_memory_utilization=util, max_model_len=max_len, block_size=block,
                                     kv_cache_dtype=kv_dtype, **batch_settings(case.settings))
    except TuneError as refusal:
        sizing = None
        ok = failing
        tally.refusals.append((ok, case.label))
        print(f"  (c) tuner refuses (TuneError): {'match, vLLM failed too' if ok else 'MISMATCH, vLLM started'}")
        gets = refused_kv(str(refusal))
        if available is not None and gets is not None:
            row(tally, case, "available KV", available, gets)
    if sizing is not None:
        m = sizing.memory
        print(f"  (c) modelled: requested {m.requested / GIB:.2f} GiB = weights {m.weights / GIB:.2f} + non-torch "
              f"{m.non_torch / GIB:.2f} + activation {m.activation_peak / GIB:.2f} + CUDA graphs "
              f"{m.cuda_graphs / GIB:.2f} + KV {m.available_kv / GIB:.2f}")
        if failing:
            capped = max_len is not None and sizing.max_model_len is not None and sizing.max_model_len < max_len
            ok = capped and "error" in case.logged and case.logged.get("gpu_blocks") != 0
            tally.refusals.append((ok, case.label))
            verdict = f"caps max_model_len to {sizing.max_model_len:,}" if capped else "promises the full length"
            print(f"  (c) vLLM refused to start; tuner {verdict}: {'match' if ok else 'MISMATCH'}")
        if "requested" in case.logged:
            row(tally, case, "requested (info)", gib(case.logged["requested"]), m.requested / GIB)
        if available is not None:
            row(tally, case, "available KV", available, sizing.available_kv_bytes / GIB)
        if tokens is not None:
            row(tally, case, "KV tokens", tokens, sizing.kv_cache_tokens, ",.0f")
        if conc is not None:
            row(tally, case, "concurrency", conc[0], sizing.kv_cache_tokens / conc[1])
        if "non_torch_memory" in case.logged:
            row(tally, case, "non-torch", gib(case.logged["non_torch_memory"]), m.non_torch / GIB)
        activation = None
        if "activation_peak" in case.logged:
            activation = gib(case.logged["activation_peak"])
        elif "peak_torch_memory" in case.logged and "model_weights" in case.logged:
            activation = gib(case.logged["peak_torch_memory"]) - gib(case.logged["model_weights"])
        if activation is not None:
            row(tally, case, "activation peak", activation, m.activation_peak / GIB)


def summary(tally: Tally) -> None:
    """One line per metric: mean absolute relative error and the worst case."""
    print("\nSummary (signed error = predicted vs logged; + means the tuner predicts more)")
    for metric in METRICS:
        errs = tally.errors.get(metric, [])
        if not errs:
            print(f"  {metric:<16} n=0")
            continue
        mean = sum(abs(e) for e, _ in errs) / len(errs)
        worst, where = max(errs, key=lambda x: abs(x[0]))
        print(f"  {metric:<16} n={len(errs)}  mean |err| {mean:6.1%}  worst {worst:+7.1%}  ({where})")
    matched = sum(ok for ok, _ in tally.refusals)
    print(f"  {'failing starts':<16} {matched}/{len(tally.refusals)} matched by a tuner refusal or length cap")


def batch_settings(settings: dict[str, Any]) -> dict[str, int]:
    """The batch vLLM profiled with: as the log states it, else vLLM's default max_num_seqs of 256 (the tuner
    would otherwise size the run with the smaller batch it recommends, which the logged vLLM did not use)."""
    given = {key: int(settings[key]) for key in ("max_num_seqs", "max_num_batched_tokens") if key in settings}
    given.setdefault("max_num_seqs", VLLM_DEFAULT_MAX_NUM_SEQS)
    return given


VLLM_DEFAULT_MAX_NUM_SEQS = 256


def main() -> None:
    """Load both case files and print the comparison."""
    cases: list[Case] = []
    if SHARED_CASES.is_file():
        print(f"shared cases: {SHARED_CASES}")
        cases += load_cases(SHARED_CASES, SHARED_HINTS)
    else:
        print(f"shared cases: {SHARED_CASES} is absent (the shared reference checkout); using bench cases only")
    print(f"bench cases:  {OWN_CASES}")
    cases += load_cases(OWN_CASES, {})
    tally = Tally()
    tally.errors["requested (info)"] = []
    for case in cases:
        run_case(case, tally)
    summary(tally)
    print(f"\n({len(cases)} cases; 1 GiB = {GIB:,} B, 1 MiB = {MIB:,} B)")


if __name__ == "__main__":
    main()
