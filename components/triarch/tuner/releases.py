"""Which vLLM release is being sized, and what that release does at start-up (templates/compat/vllm-releases.yaml,
each rule cited to the release's source): defaults, what comes off before the KV cache, how context is derived."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from triarch.datafiles import read_yaml
from triarch.paths import TEMPLATES_DIR
from triarch.tuner.errors import TuneError

RELEASES_FILE = TEMPLATES_DIR / "compat" / "vllm-releases.yaml"

UsageContext = Literal["apiServer", "llmClass"]


@dataclass(frozen=True)
class BatchTier:
    """vLLM's default batch for GPUs of at least ``min_gib`` (torch's total) whose name lacks ``not_named``."""

    min_gib: float
    not_named: str | None
    defaults: Mapping[str, tuple[int, int]]
    """usage context -> (max_num_batched_tokens, max_num_seqs)."""


@dataclass(frozen=True)
class VllmRelease:
    """One vLLM release's start-up rules (see the data file's header for each field)."""

    version: str
    gpu_memory_utilization: float
    cuda_graphs_before_kv_cache: bool
    yarn_context: Literal["original-times-factor", "unscaled"]
    sentence_transformers_needs_do_lower_case: bool
    kv_tokens_reported: Literal["blocks", "concurrency"]
    null_block_reserved: bool
    in_flight_batches: int
    batch_tiers: tuple[BatchTier, ...]
    sources: Mapping[str, str]

    def batch_defaults(self, torch_total_gib: float, device_name: str,
                       usage: UsageContext = "apiServer") -> tuple[int, int]:
        """(max_num_batched_tokens, max_num_seqs) this release picks on that GPU when neither is given."""
        for tier in self.batch_tiers:
            if torch_total_gib >= tier.min_gib and not (tier.not_named and tier.not_named in device_name.lower()):
                return tier.defaults[usage]
        raise AssertionError("the last tier has minGiB 0")


def _version_key(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError:
        raise TuneError(f"vllm_version {version!r} is not a release number; allowed: e.g. 0.33.0") from None


def _release(version: str, raw: Mapping[str, Any]) -> VllmRelease:
    tiers = tuple(
        BatchTier(float(t["minGiB"]), t.get("notNamed"),
                  {usage: (int(t[usage]["tokens"]), int(t[usage]["seqs"])) for usage in ("apiServer", "llmClass")})
        for t in raw["batchDefaults"]
    )
    return VllmRelease(
        version=version,
        gpu_memory_utilization=float(raw["gpuMemoryUtilization"]),
        cuda_graphs_before_kv_cache=bool(raw["cudaGraphsBeforeKvCache"]),
        yarn_context=raw["yarnContext"],
        sentence_transformers_needs_do_lower_case=bool(raw["sentenceTransformersNeedsDoLowerCase"]),
        kv_tokens_reported=raw["kvTokensReported"],
        null_block_reserved=bool(raw["nullBlockReserved"]),
        in_flight_batches=int(raw["inFlightBatches"]),
        batch_tiers=tiers,
        sources={str(k): " ".join(str(v).split()) for k, v in raw["sources"].items()},
    )


@cache
def modelled_releases() -> dict[str, VllmRelease]:
    """The releases the tuner models, oldest first."""
    raw = read_yaml(RELEASES_FILE)["releases"]
    return {v: _release(v, raw[v]) for v in sorted(raw, key=_version_key)}


def default_image() -> str:
    """The serving image a stack gets unless it names another (config.ImagesConfig.vllm)."""
    from triarch.config import ImagesConfig

    return str(ImagesConfig.model_fields["vllm"].default.image)


def default_version() -> str:
    """The vLLM inside the default serving image (templates/compat/images.yaml)."""
    from triarch.catalog import catalog

    image = catalog().image(default_image())
    assert image is not None and image.vllm, f"{default_image()} is in images.yaml with its vLLM version"
    return image.vllm


def release_for(version: str | None) -> tuple[VllmRelease, str | None]:
    """The release that sizes ``version`` (None: the default image's) and, when it is not modelled itself, a note
    naming the nearest modelled release used instead (the closest by version; the newer on a tie)."""
    wanted = version or default_version()
    releases = modelled_releases()
    if wanted in releases:
        return releases[wanted], None
    key = _version_key(wanted)

    def distance(v: str) -> tuple[int, ...]:
        other = _version_key(v)
        return tuple(abs(a - b) for a, b in zip(key + (0,) * 3, other + (0,) * 3, strict=False))

    nearest = min(reversed(list(releases)), key=distance)
    return releases[nearest], (f"vLLM {wanted} is not modelled (templates/compat/vllm-releases.yaml has "
                               f"{', '.join(releases)}); sized with {nearest}'s start-up rules")


@dataclass(frozen=True)
class Spread:
    """Factors on each component of the memory estimate that give its pessimistic end (the data file's
    estimateSpread, from the calibration runs)."""

    weights: float
    """Unquantized, text-only checkpoints: their tensors are counted from the config, nearly exactly."""
    weights_estimated: float
    """Quantized checkpoints and those with a vision or audio tower, whose bytes the tuner estimates."""
    activation_peak: float
    non_torch: float
    cuda_graphs: float


@cache
def estimate_spread() -> Spread:
    raw = read_yaml(RELEASES_FILE)["estimateSpread"]
    return Spread(float(raw["weights"]), float(raw["weightsQuantizedOrMultimodal"]), float(raw["activationPeak"]),
                  float(raw["nonTorch"]), float(raw["cudaGraphs"]))
