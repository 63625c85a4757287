"""How close the tuner comes to vLLM's own start-up numbers, component by component.

    uv run --extra test python bench/kv_calibration.py            # the table
    uv run --extra test python bench/kv_calibration.py --cases    # and every case, logged vs predicted

Cases: llm-d-planner's committed vLLM 0.19.0 runs on H100 (bench/llmd-vllm-0.19.0.yaml, imported by
bench/import_vllm_logs.py; models resolved to templates/models), our own collection of earlier public logs
(bench/kv-cases.yaml) and the shared cases (vllm-kv-cases.yaml of the reference data, when cached). Each case is
sized with the rules of the release it was logged on (earlier logs with 0.19.0's: graphs captured after the KV
cache, tokens reported as blocks) and the batch it ran with. Per component, the signed error (predicted - logged) /
logged: weights per GPU, activation peak, non-torch memory, CUDA-graph estimate, available KV memory, KV tokens
(from the full prediction, and paged from the logged available memory), maximum concurrency. Failing starts must be
refused. A benchmark: it prints and asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from triarch import refdata
from triarch.catalog import Gpu, catalog
from triarch.tuner import GIB, ModelArch, TuneError, arch_from_hf_config, load_model_config, tune
from triarch.tuner.kv import kv_layout

BENCH_DIR = Path(__file__).resolve().parent
SHARED_CASES = "vllm-kv-cases.yaml"
"""Its path in the reference data (tools/reference/sources.yaml), read from the cache `triarch refdata fill` fills."""
OWN_CASES = BENCH_DIR / "kv-cases.yaml"
LLMD_CASES = BENCH_DIR / "llmd-vllm-0.19.0.yaml"

W8A8 = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {"num_bits": 8}}},
        "ignore": ["lm_head"]}
W4A16 = {"quant_method": "compressed-tensors", "ignore": ["lm_head"],
         "config_groups": {"group_0": {"weights": {"num_bits": 4, "group_size": 128, "type": "int"}}}}
FP8 = {"quant_method": "compressed-tensors", "ignore": ["lm_head"],
       "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}}}
AWQ4 = {"quant_method": "awq", "bits": 4, "group_size": 128}

LLMD_MODELS: dict[str, tuple[str, Mapping[str, Any] | None]] = {
    "RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic": ("meta-llama/Llama-3.1-70B-Instruct", FP8),
    "redhatai/Llama-3.3-70B-Instruct-quantized.w8a8": ("meta-llama/Llama-3.1-70B-Instruct", W8A8),
    "RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16": ("meta-llama/Llama-3.1-8B-Instruct", W4A16),
    "RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8": ("meta-llama/Llama-3.1-8B-Instruct", W8A8),
    "RedHatAI/Qwen2.5-7B-Instruct-fp8-dynamic": ("Qwen/Qwen2.5-7B-Instruct", FP8),
    "RedHatAI/Qwen2.5-7B-Instruct-quantized.w8a8": ("Qwen/Qwen2.5-7B-Instruct", W8A8),
    "moonshotai/Kimi-Dev-72B": ("Qwen/Qwen2.5-72B-Instruct", None),
}
"""llm-d models not in the catalog, read as the catalog model they are a quantization or fine-tune of. The
quantization block is inferred from the checkpoint's name (llm-compressor's w8a8 / w4a16 / fp8-dynamic schemes);
Kimi-Dev-72B is a Qwen2.5-72B fine-tune."""

SHARED_HINTS: dict[str, dict[str, Any]] = {
    "vllm-project/vllm PR 12569": {"catalog_model": "meta-llama/Llama-3.1-70B-Instruct", "quantization_config": W8A8,
                                   "gpu": "h100-80gb"},
    "vllm-project/vllm issue 13882": {"catalog_model": "Qwen/Qwen2.5-7B-Instruct", "quantization_config": AWQ4},
    "vllm-project/vllm issue 12330": {"catalog_model": "meta-llama/Meta-Llama-3-8B", "gpu": "a100-40gb"},
}
"""The shared file names models and GPUs in prose; these are the readings tests/test_tuner.py uses for them."""

COMPONENTS = ("weights", "activation", "non-torch", "CUDA graphs", "available KV", "KV tokens", "concurrency",
              "KV tokens (given available)", "concurrency (given available)")
SIZING_FAILURES = ("max_model_len", "warming up sampler", "not divisible")
"""Failures a sizing tool should foresee (the rest: no network, an unsupported model, a DP bug, another process
holding the GPU's memory)."""


@dataclass
class Case:
    """One logged start-up, resolved."""

    group: str
    label: str
    arch: ModelArch
    gpu: Gpu
    version: str
    settings: dict[str, Any]
    logged: dict[str, float]
    failed: str | None = None


@dataclass
class Tally:
    errors: dict[str, dict[str, list[tuple[float, str]]]] = field(default_factory=dict)
    refusals: dict[str, list[tuple[bool, str]]] = field(default_factory=dict)

    def add(self, case: Case, component: str, logged: float, predicted: float, show: bool) -> None:
        if logged == 0:
            return
        err = (predicted - logged) / abs(logged)
        self.errors.setdefault(case.group, {}).setdefault(component, []).append((err, case.label))
        if show:
            print(f"    {component:<28} logged {logged:>14,.2f}  predicted {predicted:>14,.2f}  err {err:+7.1%}")


def number(value: Any) -> float:
    """'14.9888 GB' / '3.81GiB' / '175,856 tokens' / 1.5 -> float."""
    if isinstance(value, int | float):
        return float(value)
    match = re.search(r"-?[\d,]*\.?\d+", str(value))
    if not match:
        raise ValueError(f"no number in {value!r}")
    return float(match.group(0).replace(",", ""))


def torch_gpu(total_gib: float) -> Gpu:
    return Gpu(key=f"logged-{total_gib}", product=f"GPU of {total_gib:.2f} GiB (logged)", architecture="unknown",
               compute_capability="0.0", memory_mib=round(total_gib * 1024), min_cuda="0", data_center=True,
               ray_accelerator_type=None, torch_total_gib=total_gib)


def llmd_cases() -> list[Case]:
    raw = yaml.safe_load(LLMD_CASES.read_text(encoding="utf-8"))["cases"]
    known = {m.lower(): m for m in _catalog_names()}
    out = []
    for entry in raw:
        failed = entry.get("failed")
        if failed and not any(reason in failed for reason in SIZING_FAILURES):
            continue
        model = str(entry["model"])
        base, quant = LLMD_MODELS.get(model, (known.get(model.lower(), ""), None))
        if not base:
            continue
        config = load_model_config(base)
        if quant:
            config = {**config, "quantization_config": quant}
        settings = dict(entry["settings"])
        if settings.get("dtype") == "float32":
            continue  # explicit --dtype float32: the tuner sizes --dtype auto (float32 checkpoints served in 16 bits)
        if settings.get("quantization") == "fp8" and not quant:  # vLLM's online fp8 (--quantization fp8)
            config = {**config, "quantization_config": {"quant_method": "fp8"}}
        if "dtype" in settings and settings["dtype"] in ("float16", "float32"):
            config = {**config, "torch_dtype": settings["dtype"]}
        logged = {k: float(v) for k, v in entry["logged"].items() if k != "vllm_version"}
        gpu = torch_gpu(logged.get("total_gib", 79.19))
        out.append(Case("vLLM 0.19.0 (llm-d-planner, H100)", entry["log"], arch_from_hf_config(config, name=model),
                        gpu, str(entry["logged"].get("vllm_version", "0.19.0")), settings, logged, failed))
    return out


def _catalog_names() -> list[str]:
    from triarch.tuner import catalog_models

    return catalog_models()


def earlier_cases(path: Path, hints: Mapping[str, Mapping[str, Any]]) -> list[Case]:
    """bench/kv-cases.yaml and the shared file: older releases' logs, normalised to the llm-d shape."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    out = []
    for i, entry in enumerate(raw, 1):
        d = {**hints.get(entry["source"], {}), **entry}
        config = dict(d["config"]) if "config" in d else load_model_config(d["catalog_model"])
        if d.get("quantization_config"):
            config = {**config, "quantization_config": d["quantization_config"]}
        config.setdefault("model_type", "llama")
        lg = dict(d.get("logged") or {})
        total = d.get("gpu_total_gib") or (d.get("settings") or {}).get("gpu_total") or lg.get("total_gpu_memory")
        gpu = torch_gpu(number(total)) if total is not None else catalog().gpus.get(str(d.get("gpu")))
        if gpu is None:
            continue
        logged: dict[str, float] = {}
        for ours, theirs in (("weights_gib", "model_weights"), ("non_torch_gib", "non_torch_memory"),
                             ("activation_gib", "activation_peak"), ("available_kv_gib", "available_kv"),
                             ("available_kv_gib", "kv_cache_size"), ("kv_tokens", "kv_tokens")):
            if theirs in lg:
                logged[ours] = number(lg[theirs])
        if "gpu_blocks" in lg:
            logged["kv_tokens"] = number(lg["gpu_blocks"]) * int((d.get("settings") or {}).get("block_size", 16))
        for key, value in lg.items():
            match = re.fullmatch(r"max_concurrency(?:_at_(\d+))?", key)
            if match:
                logged["max_concurrency"] = number(value)
        failed = lg.get("error") or ("did not start" if lg.get("gpu_blocks") == 0 else None)
        out.append(Case("earlier releases (public issues)", f"{path.name}#{i} {d['source']}",
                        arch_from_hf_config(config, name=str(d.get("catalog_model") or "model")), gpu, "0.19.0",
                        dict(d.get("settings") or {}), logged, str(failed) if failed else None))
    return out


def run(case: Case, tally: Tally, show: bool) -> None:
    s, lg = case.settings, case.logged
    tp, pp = int(s.get("tensor_parallel_size", 1)), int(s.get("pipeline_parallel_size", 1))
    args: dict[str, Any] = {
        "tensor_parallel_size": tp, "pipeline_parallel_size": pp, "gpus_available": tp * pp,
        "max_model_len": s.get("max_model_len"), "block_size": int(s.get("block_size", 16)),
        "kv_cache_dtype": str(s.get("kv_cache_dtype", "auto")), "vllm_version": case.version,
        "max_num_seqs": int(s.get("max_num_seqs", 256)),
    }
    if "max_num_batched_tokens" in s:
        args["max_num_batched_tokens"] = int(s["max_num_batched_tokens"])
    if show:
        print(f"\n  {case.label}: {case.arch.label} tp={tp} pp={pp} {args['kv_cache_dtype']}")
    try:
        sizing = tune(case.arch, case.gpu, gpu_memory_utilization=float(s.get("gpu_memory_utilization", 0.9)),
                      **args)
    except TuneError as refusal:
        tally.refusals.setdefault(case.group, []).append((case.failed is not None, case.label))
        if show:
            print(f"    refused ({'as vLLM did' if case.failed else 'MISMATCH: vLLM started'}): {refusal}"[:240])
        return
    if case.failed:
        tally.refusals.setdefault(case.group, []).append((False, case.label))
        if show:
            print(f"    MISMATCH: vLLM failed ({case.failed[:100]}), the tuner sized it")
        return
    m = sizing.memory
    for component, key, predicted in (("weights", "weights_gib", m.weights / GIB),
                                      ("activation", "activation_gib", m.activation_peak / GIB),
                                      ("non-torch", "non_torch_gib", m.non_torch / GIB),
                                      ("CUDA graphs", "cuda_graph_estimate_gib", m.cuda_graphs / GIB),
                                      ("available KV", "available_kv_gib", sizing.available_kv_bytes / GIB),
                                      ("KV tokens", "kv_tokens", sizing.kv_cache_tokens),
                                      ("concurrency", "max_concurrency", sizing.max_concurrency or 0.0)):
        if key in lg:
            tally.add(case, component, lg[key], predicted, show)
    if "available_kv_gib" in lg and "kv_tokens" in lg and lg["available_kv_gib"] > 0:
        per_block = kv_layout(case.arch, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                              kv_cache_dtype=args["kv_cache_dtype"], block_size=args["block_size"]).bytes_per_block
        # the memory vLLM paged: its own block count where the log has it (exact), else the logged GiB (rounded)
        blocks = int(lg["kv_blocks"]) if "kv_blocks" in lg else math.floor(lg["available_kv_gib"] * GIB / per_block)
        # paging alone: a GPU large enough that only the given KV memory decides
        paged = tune(case.arch, torch_gpu(4096.0), kv_cache_memory_bytes=blocks * per_block, **args)
        tally.add(case, "KV tokens (given available)", lg["kv_tokens"], paged.kv_cache_tokens, show)
        if "max_concurrency" in lg and paged.max_concurrency is not None:
            tally.add(case, "concurrency (given available)", lg["max_concurrency"], round(paged.max_concurrency, 2),
                      show)


def table(tally: Tally) -> None:
    print("\n| cases | component | n | median abs err | mean err | mean abs err | worst |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for group, components in tally.errors.items():
        for component in COMPONENTS:
            errs = components.get(component)
            if not errs:
                continue
            values = [e for e, _ in errs]
            worst = max(values, key=abs)
            print(f"| {group} | {component} | {len(values)} | {statistics.median(abs(v) for v in values):.1%} | "
                  f"{statistics.fmean(values):+.1%} | {statistics.fmean(abs(v) for v in values):.1%} | {worst:+.1%} |")
    for group, refusals in tally.refusals.items():
        print(f"\n{group}: failing starts foreseen {sum(ok for ok, _ in refusals)}/{len(refusals)}"
              + "".join(f"\n  - {'ok' if ok else 'missed'}: {label}" for ok, label in refusals if not ok))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", action="store_true", help="print every case, logged vs predicted")
    show = parser.parse_args(argv).cases
    cases = llmd_cases() + earlier_cases(OWN_CASES, {})
    try:
        cases += earlier_cases(refdata.path(SHARED_CASES), SHARED_HINTS)
    except refdata.ReferenceMissing as missing:
        print(f"(the shared cases are left out: {missing})")
    tally = Tally()
    for case in cases:
        run(case, tally, show)
    table(tally)


if __name__ == "__main__":
    main()
