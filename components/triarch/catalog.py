"""The facts Triarch plans with, read from templates/compat/*.yaml (each fact there carries its source).

Loaded once per process; everything downstream asks this module rather than hard-coding a number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from triarch.datafiles import read_yaml
from triarch.paths import COMPAT_DIR


def version_tuple(version: str) -> tuple[int, ...]:
    """'580.65.06' -> (580, 65, 6); compares driver and CUDA versions numerically."""
    return tuple(int(part) for part in version.split("."))


@dataclass(frozen=True)
class Gpu:
    key: str
    product: str
    architecture: str
    compute_capability: str
    memory_mib: int
    min_cuda: str
    data_center: bool
    ray_accelerator_type: str | None
    torch_total_gib: float | None = None
    """The device total torch (and so vLLM) sees, below nvidia-smi's ``memory_mib`` (gpus.yaml, with sources)."""

    @property
    def torch_total_bytes(self) -> int:
        """What vLLM's ``gpu_memory_utilization`` multiplies; nvidia-smi's total where torch's is not known."""
        if self.torch_total_gib is None:
            return self.memory_mib << 20
        return round(self.torch_total_gib * (1 << 30))


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpu: str | None
    gpus: int
    vcpus: int
    memory_gib: float
    efa: int = 0
    """EFA interfaces the type takes (its vpc.amazonaws.com/efa capacity); 0 without EFA."""
    nvme_gb: int = 0
    """The instance store's total size (local NVMe, GB); 0 where the type has none."""


@dataclass(frozen=True)
class Image:
    """A serving image: what CUDA it was built with and which vLLM (and Ray) it bundles."""

    repository: str
    tag: str
    cuda: str
    vllm: str | None
    """The bundled vLLM release, where it is pinned exactly."""
    ray: str | None
    verified: bool = True
    """False where the tag itself was not seen upstream (its CUDA is inferred from the tag scheme)."""

    @property
    def ref(self) -> str:
        return f"{self.repository}:{self.tag}"


@dataclass(frozen=True)
class AmiRelease:
    """One EKS-optimized AMI release: the NVIDIA driver it ships and its node group release versions."""

    ami_type: str
    release: str
    nvidia_driver: str
    container_toolkit: str | None
    release_versions: dict[str, str]


@dataclass(frozen=True)
class Catalog:
    gpus: dict[str, Gpu]
    instances: dict[str, InstanceType]
    images: dict[str, Image]
    amis: dict[str, dict[str, AmiRelease]]
    cuda_minimum_driver: dict[str, str]
    minor_version_compatibility: dict[str, str]
    refused: dict[str, str] = field(default_factory=dict)
    """Instance families EKS runs that Triarch does not plan (instances.yaml `refused`), each with why."""

    def refusal(self, instance_type: str) -> str | None:
        """Why an instance type is not planned, where its family (the name before its first '.') is refused."""
        return self.refused.get(instance_type.split(".", 1)[0])

    def image(self, ref: str) -> Image | None:
        return self.images.get(ref)


def _read(path: Path) -> dict[str, Any]:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return data


def load_catalog(directory: Path = COMPAT_DIR) -> Catalog:
    cuda = _read(directory / "cuda.yaml")
    gpus = {
        key: Gpu(
            key=key,
            product=str(g["product"]),
            architecture=str(g["architecture"]),
            compute_capability=str(g["computeCapability"]),
            memory_mib=int(g["memoryMiB"]),
            min_cuda=str(g["minCuda"]),
            data_center=bool(g["dataCenter"]),
            ray_accelerator_type=g.get("rayAcceleratorType"),
            torch_total_gib=float(g["torchTotalGiB"]),
        )
        for key, g in _read(directory / "gpus.yaml")["gpus"].items()
    }
    raw_instances = _read(directory / "instances.yaml")
    instances = {
        name: InstanceType(name, i.get("gpu"), int(i.get("gpus", 0)), int(i["vcpus"]), float(i["memoryGiB"]),
                           int(i.get("efa", 0)), int(i.get("nvmeGB", 0)))
        for section in ("instances", "cpuInstances")
        for name, i in (raw_instances.get(section) or {}).items()
    }
    images = {
        f"{repository}:{tag}": Image(repository, str(tag), str(i["cuda"]), i.get("vllm"), i.get("ray"),
                                        bool(i.get("verified", True)))
        for repository, tags in _read(directory / "images.yaml")["images"].items()
        for tag, i in tags.items()
    }
    amis = {
        ami_type: {
            str(release): AmiRelease(
                ami_type=ami_type,
                release=str(release),
                nvidia_driver=str(r["nvidiaDriver"]),
                container_toolkit=r.get("containerToolkit"),
                release_versions={str(k): str(v) for k, v in (r.get("releaseVersions") or {}).items()},
            )
            for release, r in releases.items()
        }
        for ami_type, releases in _read(directory / "amis.yaml")["amiTypes"].items()
    }
    return Catalog(
        gpus=gpus,
        instances=instances,
        images=images,
        amis=amis,
        cuda_minimum_driver={str(k): str(v) for k, v in cuda["minimumDriver"].items()},
        minor_version_compatibility={str(k): str(v) for k, v in cuda["minorVersionCompatibility"].items()},
        refused={str(k): " ".join(str(v).split()) for k, v in (raw_instances.get("refused") or {}).items()},
    )


@cache
def catalog() -> Catalog:
    """The project's catalog, read once."""
    return load_catalog()


@dataclass(frozen=True)
class ChartImage:
    """An image a chart runs, and the values keys that set it (the layouts charts use: a repository with its
    registry in it, or registry and repository apart; a digest key where the chart has one)."""

    key: str
    """Its key under triarch:images, where a stack pins it (by mirror or digest)."""
    image: str
    """The upstream reference the pinned chart version runs."""
    values: dict[str, str]
    """registry / repository / tag / digest -> the dotted values key; or reference -> the one key that takes the
    whole reference (charts.yaml's `default` names where the chart keeps it when that key is unset)."""


@dataclass(frozen=True)
class Chart:
    name: str
    version: str
    repository: str
    image: str | None
    images: tuple[ChartImage, ...] = ()
    registry_key: str | None = None
    """A values key that moves every image of the chart (and its subcharts) to one registry."""
    pull_secrets_key: str | None = None
    """The values key of the image pull Secrets its pods use (a list of {name: ...})."""
    crds_url: str | None = None
    """Where the release publishes the CRDs Triarch manages apart from the chart (Helm never upgrades crds/)."""
    crds: tuple[tuple[str, str], ...] = ()
    """(file, sha256) of each of those CRDs."""
    image_values: dict[str, Any] = field(default_factory=dict)
    """Values that point the chart's images at a stack's mirror or pins (planners/registry.py); merged under the
    release's own values."""

    @property
    def reference(self) -> str:
        """What Helm is asked for: an OCI chart by its full address (Helm looks for an index.yaml in any
        repository URL, which an OCI registry has not), a classic chart by its name in `repository`."""
        return f"{self.repository}/{self.name}" if self.is_oci else self.name

    @property
    def is_oci(self) -> bool:
        return self.repository.startswith("oci://")


@cache
def addon_versions() -> dict[str, dict[str, str]]:
    """EKS managed add-on versions per Kubernetes minor (templates/compat/eks-addons.yaml); empty where unknown."""
    path = COMPAT_DIR / "eks-addons.yaml"
    if not path.is_file():
        return {}
    raw = _read(path).get("addons") or {}
    return {str(minor): {name: str(entry["version"]) for name, entry in (addons or {}).items()}
            for minor, addons in raw.items()}


@cache
def charts() -> dict[str, Chart]:
    """Pinned Helm charts (templates/compat/charts.yaml)."""
    raw = _read(COMPAT_DIR / "charts.yaml")["charts"]
    return {name: Chart(name, str(c["version"]), str(c["repository"]), c.get("image"),
                        tuple(ChartImage(key, str(i["image"]), {k: str(v) for k, v in i.items()
                                                                if k not in ("image", "subchart", "default")})
                              for key, i in (c.get("images") or {}).items()),
                        c.get("registryKey"), c.get("pullSecretsKey"), (c.get("crds") or {}).get("url"),
                        tuple(sorted((str(f), str(h)) for f, h in ((c.get("crds") or {}).get("files") or {}).items())))
            for name, c in raw.items()}


@dataclass(frozen=True)
class GatedRepos:
    """Hugging Face repository prefixes whose downloads need a token and an accepted license (gated-repos.yaml)."""

    prefixes: tuple[str, ...]

    def gated(self, repository: str) -> bool:
        return repository.startswith(self.prefixes)


@cache
def gated_repos() -> GatedRepos:
    raw = _read(COMPAT_DIR / "gated-repos.yaml")["gated"]
    return GatedRepos(tuple(entry["prefix"] for entry in raw))


@cache
def efa_image_patterns() -> tuple[re.Pattern[str], ...]:
    """Images known to carry the EFA installer's libraries: libfabric with its EFA provider, rdma-core's libefa and
    the aws-ofi-nccl plugin (templates/compat/efa-images.yaml)."""
    return tuple(re.compile(entry["pattern"]) for entry in _read(COMPAT_DIR / "efa-images.yaml")["images"])


def carries_efa_libraries(image: str) -> bool:
    return any(pattern.search(image) for pattern in efa_image_patterns())
