"""The published figures a replica's cold start is predicted from (templates/compat/cold-start.yaml), typed: the
node's launch, the image's size and pull rates, the root volume, the weights' read rates and vLLM's own start."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from triarch.catalog import _read
from triarch.paths import COMPAT_DIR

COLD_START_FILE = COMPAT_DIR / "cold-start.yaml"


@dataclass(frozen=True)
class Range:
    """Seconds (or a rate) from the fast and the slow end of what was published."""

    low: float
    high: float

    def __add__(self, other: Range) -> Range:
        return Range(self.low + other.low, self.high + other.high)

    def scaled(self, factor: float) -> Range:
        return Range(self.low * factor, self.high * factor)


@dataclass(frozen=True)
class ImageSize:
    compressed_gb: float
    unpacked_gb: float
    source: str


@dataclass(frozen=True)
class ColdStartFacts:
    karpenter_ready: Range
    gpu_advertised: Range
    images: dict[str, ImageSize]
    """Upstream repository -> its size, where published."""
    sequential_pull_mbps: float
    parallel_pull_mbps: float
    fast_pull_min_release: str
    fast_pull_min_vcpus: int
    fast_pull_min_memory_gib: float
    root_baseline_mibps: int
    root_baseline_iops: int
    root_fast_pull_mibps: int
    root_max_mibps: int
    efs_per_client_mibps: float
    safetensors_on_block_mbps: float
    streamer_s3_mbps: Range
    streamer_concurrency: int
    engine_warm: Range
    engine_cold: Range
    engine_cold_parallel: Range
    engine_warm_moe: Range
    engine_cold_moe: Range
    engine_eager: Range
    startup_margin: float
    sources: dict[str, str]
    """Each figure's source, by its key (`nodeLaunch.karpenterReadySeconds`, ...)."""


def _range(value: dict[str, Any]) -> Range:
    return Range(float(value["low"]), float(value["high"]))


def _sources(raw: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = {}
    for section, body in raw.items():
        if isinstance(body, dict):
            for key, text in (body.get("sources") or {}).items():
                found[f"{section}.{key}"] = " ".join(str(text).split())
            for name, entry in body.items():
                if isinstance(entry, dict) and isinstance(entry.get("sources"), dict):
                    for key, text in entry["sources"].items():
                        found[f"{section}.{name}.{key}"] = " ".join(str(text).split())
    found["imagePull.fastImagePull"] = " ".join(str(raw["imagePull"]["fastImagePullSources"]).split())
    found["startupMargin"] = " ".join(str(raw["startupMarginSource"]).split())
    return found


@cache
def cold_start_facts() -> ColdStartFacts:
    raw = _read(COLD_START_FILE)
    node, pull, root, weights, engine = (raw["nodeLaunch"], raw["imagePull"], raw["rootVolume"], raw["weights"],
                                         raw["engine"])
    images = {repository: ImageSize(float(size["compressedGB"]), float(size["unpackedGB"]),
                                    " ".join(str(size["sources"]["compressedGB"]).split()))
              for repository, size in raw["images"].items()}
    return ColdStartFacts(
        karpenter_ready=_range(node["karpenterReadySeconds"]), gpu_advertised=_range(node["gpuAdvertisedSeconds"]),
        images=images,
        sequential_pull_mbps=float(pull["sequentialMBps"]), parallel_pull_mbps=float(pull["parallelMBps"]),
        fast_pull_min_release=str(pull["fastImagePullMinRelease"]),
        fast_pull_min_vcpus=int(pull["fastImagePullMinVcpus"]),
        fast_pull_min_memory_gib=float(pull["fastImagePullMinMemoryGiB"]),
        root_baseline_mibps=int(root["baselineMiBps"]), root_baseline_iops=int(root["baselineIops"]),
        root_fast_pull_mibps=int(root["fastPullMiBps"]), root_max_mibps=int(root["maxMiBps"]),
        efs_per_client_mibps=float(weights["efsPerClientMiBps"]),
        safetensors_on_block_mbps=float(weights["safetensorsOnBlockMBps"]),
        streamer_s3_mbps=_range(weights["streamerS3MBps"]), streamer_concurrency=int(weights["streamerConcurrency"]),
        engine_warm=_range(engine["warmCompileSeconds"]), engine_cold=_range(engine["coldCompileSeconds"]),
        engine_cold_parallel=_range(engine["coldCompileTensorParallelSeconds"]),
        engine_warm_moe=_range(engine["warmMoeSeconds"]), engine_cold_moe=_range(engine["coldMoeSeconds"]),
        engine_eager=_range(engine["eagerSeconds"]),
        startup_margin=float(raw["startupMargin"]),
        sources=_sources(raw),
    )
