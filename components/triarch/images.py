"""Image references as a registry understands them, and which upstream release a deployed image is.

A team deploys `vllm/vllm-openai:v0.33.0` as Docker Hub names it, or the same release from its own mirror (an ECR
pull-through cache, Artifactory, Harbor), by tag, by digest or both. What Triarch knows about an image (its CUDA,
the vLLM and Ray inside) is keyed by the upstream release in templates/compat/images.yaml; a deployed reference maps
to that release by the path a mirror keeps (`<mirror>/vllm/vllm-openai:v0.33.0`) or by the release the stack file
declares beside it (`{release: v0.33.0, image: <mirror>/...@sha256:...}`). Pure: strings in, strings out."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

DOCKER_HUB = "docker.io"
IMAGE_RELEASE = "triarch.dev/image-release"
"""On a workload whose image comes from a mirror or by digest: the upstream release it is, so the guardrails, the
diff and `triarch verify` know its CUDA and vLLM from the manifests alone (metadata: setting it rolls no pod)."""
FLOATING_TAGS = frozenset({"latest", "stable", "main", "master", "nightly", "edge", "dev"})
"""Tags that move to newer builds: an image under one of them (without a digest) is not pinned."""
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_PATH = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_HOST = re.compile(r"^(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+|[A-Za-z0-9-]+)(?::[0-9]+)?$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")


class ImageError(ValueError):
    """A reference that is not one, or a release that cannot be told: `reason` and what is `allowed`."""

    def __init__(self, reason: str, allowed: str, part: str = "image") -> None:
        super().__init__(reason)
        self.reason = reason
        self.allowed = allowed
        self.part = part
        """Which key of a pin is wrong: `image` or `release`."""


@dataclass(frozen=True)
class Reference:
    """registry/repository[:tag][@digest]; registry None is Docker Hub, as a container runtime reads it."""

    registry: str | None
    repository: str
    tag: str | None
    digest: str | None

    def __str__(self) -> str:
        name = f"{self.registry}/{self.repository}" if self.registry else self.repository
        return name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")

    @property
    def host(self) -> str:
        """The registry a runtime pulls from (docker.io for a reference without one)."""
        return self.registry or DOCKER_HUB

    @property
    def pinned(self) -> bool:
        return self.digest is not None or (self.tag is not None and self.tag not in FLOATING_TAGS)

    def named(self, registry: str | None, repository: str) -> Reference:
        return Reference(registry, repository, self.tag, self.digest)


def parse(text: str) -> Reference:
    """A reference as the distribution grammar reads it (the first component is a registry when it has a dot, a
    port or is localhost). Digests must be sha256 with 64 hex characters."""
    rest, _, digest = text.partition("@")
    if digest and not _DIGEST.match(digest):
        raise ImageError(f"has digest {digest!r}, which is not sha256: and 64 lowercase hex characters",
                         "name:tag, name@sha256:<64 hex>, or name:tag@sha256:<64 hex>")
    slash = rest.rfind("/")
    name, tag = rest, None
    if ":" in rest[slash + 1:]:
        name, tag = rest.rsplit(":", 1)
        if not _TAG.match(tag):
            raise ImageError(f"has tag {tag!r}, which is not a tag", "letters, digits, '_', '.', '-' (up to 128)")
    registry: str | None = None
    first, _, remainder = name.partition("/")
    if remainder and ("." in first or ":" in first or first == "localhost"):
        if not _HOST.match(first):
            raise ImageError(f"has registry {first!r}, which is not a host[:port]", "a registry host, e.g. "
                             "123456789012.dkr.ecr.us-east-1.amazonaws.com")
        registry, name = first, remainder
    if not _PATH.match(name):
        raise ImageError(f"has repository {name!r}, which is not a repository path",
                         "lowercase path components (letters, digits, '.', '_', '-') separated by '/'")
    return Reference(registry, name, tag, digest or None)


def version_key(tag: str) -> tuple[tuple[int, ...], str]:
    """Tags in the order of their releases (v0.9.0 before v0.33.0), then as text."""
    return tuple(int(n) for n in re.findall(r"\d+", tag)), tag


def known_tags(repository: str, known: Iterable[str]) -> list[str]:
    """The tags of `repository` among known references, as versions."""
    return sorted((ref.split(":", 1)[1] for ref in known if ref.split(":", 1)[0] == repository), key=version_key)


def upstream_path(reference: Reference, upstream: str) -> bool:
    """Whether a reference names the upstream repository, directly or under a mirror's prefix (a pull-through cache
    keeps the upstream path below its own: <registry>/<prefix>/vllm/vllm-openai)."""
    path = reference.repository.removeprefix("library/")
    return path == upstream or path.endswith("/" + upstream)


def release_of(image: str, release: str | None, upstream: str, known: Iterable[str]) -> str:
    """The upstream release (a key of templates/compat/images.yaml, `repository:tag`) that a deployed image is.

    `release` is what the stack file declares beside the image (a tag, or the whole upstream reference); without
    it the image must name the upstream repository (maybe under a mirror's prefix) and a tag Triarch knows."""
    known = set(known)
    reference = parse(image)
    tags = ", ".join(known_tags(upstream, known))
    declare = (f"declare the release beside the image: {{release: <one of {tags}>, image: {image}}}"
               if tags else "a release of templates/compat/images.yaml")
    if release is not None:
        wanted = release if ":" in release else f"{upstream}:{release}"
        if wanted not in known:
            raise ImageError(f"is not a release templates/compat/images.yaml has for {upstream}",
                             tags or "a release of templates/compat/images.yaml", "release")
        if reference.tag and upstream_path(reference, upstream) and reference.tag != wanted.split(":", 1)[1]:
            raise ImageError(f"differs from the tag of {image}", f"{reference.tag} (the image's tag), or an image of "
                             "that release", "release")
        return wanted
    if not reference.pinned:
        raise ImageError("is not pinned (no tag, or one that moves, and no digest)",
                         "a versioned tag (v0.33.0), a digest (@sha256:<64 hex>), or both")
    if not upstream_path(reference, upstream):
        raise ImageError(f"is not {upstream} (or a mirror of it that keeps its path), so its release is unknown",
                         declare)
    if reference.tag is None:
        raise ImageError("is a digest without a tag, so its release is unknown", declare)
    wanted = f"{upstream}:{reference.tag}"
    if wanted not in known:
        raise ImageError(f"has tag {reference.tag}, which templates/compat/images.yaml does not have, so its CUDA "
                         "version is unknown", tags or "add the image with its CUDA version and source")
    return wanted


PUBLIC_REGISTRIES = frozenset({"docker.io", "quay.io", "nvcr.io", "ghcr.io", "public.ecr.aws", "registry.k8s.io",
                               "gcr.io", "mcr.microsoft.com"})
"""Where upstream images come from; a mirror setting moves images from these (or the hosts it maps)."""


def parse_host(host: str) -> bool:
    return bool(_HOST.match(host)) and ("." in host or ":" in host or host == "localhost")


def parse_prefix(prefix: str) -> tuple[str, str]:
    """A mirror prefix: a registry host and an optional path below it (no tag, no digest)."""
    host, _, path = prefix.partition("/")
    if not parse_host(host) or (path and not _PATH.match(path)):
        raise ImageError("is not a registry prefix", "<registry host>[/<path>], e.g. "
                         "123456789012.dkr.ecr.us-east-1.amazonaws.com/mirror")
    return host, path


def mirror(image: str, prefixes: str | dict[str, str] | None) -> str:
    """Where a node pulls `image` from: below the mirror's prefix for its upstream registry (one prefix for all, or
    one per upstream host), the upstream path kept (Docker Hub's official images under library/, as a pull-through
    cache names them). An image from a registry the setting does not cover stays as it is."""
    if not prefixes:
        return image
    reference = parse(image)
    if isinstance(prefixes, dict):
        prefix = prefixes.get(reference.host)
    else:
        prefix = prefixes if reference.host in PUBLIC_REGISTRIES else None
    if prefix is None:
        return image
    host, path = parse_prefix(prefix)
    repository = reference.repository
    if reference.host == DOCKER_HUB and "/" not in repository:
        repository = f"library/{repository}"
    return str(reference.named(host, f"{path}/{repository}" if path else repository))


def chart_release(image: str, release: str | None, runs: str) -> str:
    """A chart's image pinned by mirror or digest: the release is the one the pinned chart runs (`runs`); a tag or
    a declared release that differs is another release, which that chart version was not made for."""
    reference = parse(image)
    tag = runs.rsplit(":", 1)[1]
    if release is not None and release.rsplit(":", 1)[-1] != tag:
        raise ImageError(f"is not the release the pinned chart runs ({runs})", tag, "release")
    if not reference.pinned:
        raise ImageError("is not pinned (no tag, or one that moves, and no digest)",
                         f"a tag ({tag}), a digest (@sha256:<64 hex>), or both")
    if reference.tag is not None and reference.tag != tag:
        raise ImageError(f"has tag {reference.tag}, but the pinned chart runs {runs}",
                         f"{tag} (a digest of it), or the chart version that runs {reference.tag}")
    return runs
