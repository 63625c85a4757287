"""Driver/CUDA/GPU compatibility between node groups and serving images, decided before anything is registered.

The rules, from NVIDIA's CUDA compatibility guide (sources in templates/compat/cuda.yaml):
- an image built with CUDA X.Y runs on a driver >= the minimum driver of X.Y;
- below that, CUDA minor-version compatibility lets it run on a driver >= the major's first driver
  (12.x: 525, 13.x: 580), but kernels that need PTX JIT of a newer toolchain fail: reported as a warning;
- below that it cannot start (vLLM fails with a CUDA driver error). Forward compatibility (cuda-compat) exists
  only for data-center GPUs and only when the image ships it: Triarch never assumes it;
- a GPU whose architecture is newer than the image's CUDA has no kernels for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from triarch.catalog import Catalog, Gpu, Image, version_tuple
from triarch.config import UPSTREAM_IMAGES, StackConfig, driver_of, gpu_of
from triarch.errors import MatrixError
from triarch.images import mirror, release_of

Level = Literal["ok", "warning", "error"]


@dataclass(frozen=True)
class Verdict:
    level: Level
    node_group: str
    image: str
    message: str


@dataclass(frozen=True)
class Node:
    """What the matrix needs to know of a node group."""

    name: str
    gpu: Gpu
    driver: str
    driver_origin: str
    """How the driver is known, for the message: "pins AMI release v20260512" or "declares"."""
    releases: tuple[tuple[str, str], ...] = ()
    """Where the node group pins an AMI release: the known releases it could pin instead (of its AMI type, for the
    cluster's Kubernetes version), oldest first, with their drivers: a mismatch names the one to pin."""


def check_image_on_node(image: Image, node: Node, facts: Catalog) -> Verdict:
    def verdict(level: Level, message: str) -> Verdict:
        return Verdict(level, node.name, image.ref, message)

    if version_tuple(image.cuda) < version_tuple(node.gpu.min_cuda):
        return verdict("error", f"{image.ref} is built with CUDA {image.cuda}, but {node.gpu.product} "
                       f"(compute capability {node.gpu.compute_capability}, node group '{node.name}') needs "
                       f"CUDA >= {node.gpu.min_cuda}; use an image built for CUDA >= {node.gpu.min_cuda}")
    needed = facts.cuda_minimum_driver.get(image.cuda)
    if needed is None:
        return verdict("error", f"{image.ref} is built with CUDA {image.cuda}, which templates/compat/cuda.yaml "
                       "does not list; add its minimum driver with a source")
    have = f"node group '{node.name}' {node.driver_origin} with driver {node.driver}"
    if version_tuple(node.driver) >= version_tuple(needed):
        fits = f"{image.ref} needs CUDA {image.cuda} -> NVIDIA driver >= {needed}; {have}"
        if not image.verified:
            return verdict("warning", f"{fits}; but the tag was not seen upstream and its CUDA is inferred from the "
                           "tag scheme (templates/compat/images.yaml): confirm it before deploying"
                           f"{_seen_instead(image, node, facts)}")
        return verdict("ok", fits)
    major = image.cuda.split(".")[0]
    floor = facts.minor_version_compatibility.get(major)
    if floor is not None and version_tuple(node.driver) >= version_tuple(floor):
        return verdict("warning", f"{image.ref} needs CUDA {image.cuda} -> NVIDIA driver >= {needed} for full "
                       f"compatibility; {have}, which runs it only through CUDA {major}.x minor-version "
                       "compatibility (kernels needing PTX JIT fail); pin a newer driver")
    forward = (" (CUDA forward compatibility could bridge this on a data-center GPU, but Triarch does not "
               "assume it)") if node.gpu.data_center else ""
    return verdict("error", f"{image.ref} needs CUDA {image.cuda} -> NVIDIA driver >= {needed}; {have}{forward}; "
                   f"{_newer_driver(node, needed)} or an image built for an older CUDA")


def _seen_instead(image: Image, node: Node, facts: Catalog) -> str:
    """The newest tag of the image's repository that was seen upstream and whose CUDA the node's driver runs: what
    to pin where the tag cannot be confirmed."""
    def runs(other: Image) -> bool:
        needed = facts.cuda_minimum_driver.get(other.cuda)
        return needed is not None and version_tuple(node.driver) >= version_tuple(needed)

    seen = [other for other in facts.images.values()
            if other.repository == image.repository and other.verified and runs(other)]
    if not seen:
        return ""
    newest = max(seen, key=lambda other: version_tuple(other.ray or other.vllm or "0"))
    bundles = ", ".join(f"{name} {version}" for name, version in (("Ray", newest.ray), ("vLLM", newest.vllm))
                        if version)
    return f", or pin the newest tag seen upstream, {newest.ref} ({bundles})"


def _newer_driver(node: Node, needed: str) -> str:
    """How the node group gets a driver of at least `needed`: the oldest known AMI release that ships one, where it
    pins a release (on EKS the AMI brings the driver), else the driver itself."""
    if not node.releases:
        return f"pin a driver >= {needed}"
    fits = [(release, driver) for release, driver in node.releases if version_tuple(driver) >= version_tuple(needed)]
    if not fits:
        return (f"no AMI release of templates/compat/amis.yaml for this Kubernetes version ships a driver >= "
                f"{needed}")
    release, driver = fits[0]
    return f"pin amiRelease: {release} on node group '{node.name}' (driver {driver})"


def nodes_of(stack: StackConfig, facts: Catalog) -> dict[str, Node]:
    nodes = {}
    for group in stack.node_groups:
        origin = (f"pins AMI release {group.ami_release}" if group.ami_release is not None
                  else "declares existing nodes")
        releases = () if group.ami_release is None else tuple(
            (name, release.nvidia_driver) for name, release in sorted(facts.amis[group.ami_type].items())
            if stack.cluster.kubernetes_version in release.release_versions)
        nodes[group.name] = Node(group.name, facts.gpus[gpu_of(group, facts)], driver_of(group, facts), origin,
                                 releases)
    return nodes


def images_by_engine(stack: StackConfig, facts: Catalog) -> dict[str, str]:
    """The upstream release (a key of templates/compat/images.yaml) each serving engine runs, whatever registry
    and digest it is pulled by (config validation guarantees it resolves)."""
    pins = {"vllm": stack.images.vllm, "ray-serve": stack.images.ray_llm}
    return {engine: release_of(pin.image, pin.release, UPSTREAM_IMAGES[engine], facts.images)
            for engine, pin in pins.items()}


def deployed_images(stack: StackConfig) -> dict[str, str]:
    """The reference each serving engine's pods pull: as pinned, moved to the stack's mirror when it comes from a
    public registry."""
    prefixes = stack.registry.images
    return {"vllm": mirror(stack.images.vllm.image, prefixes),
            "ray-serve": mirror(stack.images.ray_llm.image, prefixes)}


def check_stack(stack: StackConfig, facts: Catalog) -> list[Verdict]:
    """One verdict per (serving image, node group) pair that the stack's models put together."""
    nodes = nodes_of(stack, facts)
    engine_images = images_by_engine(stack, facts)
    pairs = dict.fromkeys((engine_images[m.engine], m.node_group) for m in stack.models)
    verdicts = []
    for ref, group in pairs:
        image = facts.image(ref)
        assert image is not None, "config validation guarantees the image is in the catalog"
        verdicts.append(check_image_on_node(image, nodes[group], facts))
    return verdicts


def require_compatible(stack: StackConfig, facts: Catalog) -> list[Verdict]:
    """Raise MatrixError on the first incompatible pair; return all verdicts (warnings included) otherwise."""
    verdicts = check_stack(stack, facts)
    errors = [v for v in verdicts if v.level == "error"]
    if errors:
        more = f" (and {len(errors) - 1} more incompatible pair(s))" if len(errors) > 1 else ""
        raise MatrixError(errors[0].message + more)
    return verdicts
