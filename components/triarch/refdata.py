"""Upstream reference data (CRDs, chart values and archives, vLLM name lists, public vLLM logs) as a pinned,
verified input of the project.

tools/reference/sources.yaml names every file's sha256 and upstream source. The files themselves live in a cache
outside the work tree (a clone has no ../shared): `triarch refdata fill` copies them from a directory laid out
like ../shared/reference (or a mirror) or downloads them, and readers ask `path()` for a file whose sha256 was
checked, or get one line saying how to bring it.
"""

from __future__ import annotations

import hashlib
import os
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from triarch.errors import TriarchError
from triarch.local.engines import user_cache
from triarch.paths import PROJECT_ROOT

SOURCES = PROJECT_ROOT / "tools" / "reference" / "sources.yaml"
FILL_FROM_SHARED = "uv run triarch refdata fill --from ../shared/reference"
FILL_FROM_UPSTREAM = "uv run triarch refdata fill"
TIMEOUT = 20.0
"""Seconds a download may wait for upstream: a blocked network fails fast instead of hanging a test run."""


class ReferenceMissing(TriarchError):
    """A reference file that is not in the cache, or not with the pinned sha256: one line saying how to bring it."""


@dataclass(frozen=True)
class Source:
    """One reference file: where it sits (relative to the reference root), its pinned digest and origin."""

    relpath: str
    sha256: str
    source: str | None
    derived: str | None = None
    """How the bytes were made where they are not upstream's as-is (then `source` cannot reproduce them)."""

    @property
    def bring(self) -> str:
        """The command that brings this file into the cache."""
        if self.derived or not self.source:
            return f"`{FILL_FROM_SHARED}`"
        return f"`{FILL_FROM_SHARED}` (or `{FILL_FROM_UPSTREAM}` from upstream)"


@cache
def load_sources(path: Path = SOURCES) -> dict[str, Source]:
    """Every pinned reference file by its relative path (read once per process)."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))["files"]
    return {rel: Source(rel, spec["sha256"], spec.get("source"), spec.get("derived")) for rel, spec in raw.items()}


def cache_root() -> Path:
    """$TRIARCH_REFERENCE_CACHE, else <XDG cache>/triarch/reference: outside the work tree, kept between clones."""
    return user_cache("TRIARCH_REFERENCE_CACHE", "reference")


_verified: set[tuple[Path, str]] = set()
"""(cached file, sha256) pairs checked in this process: a test session hashes each large CRD once, not per test."""


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _entry(relpath: str) -> Source:
    entry = load_sources().get(relpath)
    if entry is None:  # a caller's typo, not missing data: it must not turn into a skip
        raise ValueError(f"{relpath} is not listed in {SOURCES.relative_to(PROJECT_ROOT)}")
    return entry


def path(relpath: str) -> Path:
    """The cached copy of a reference file, its sha256 checked (at most once per process); ReferenceMissing
    otherwise."""
    entry = _entry(relpath)
    target = cache_root() / relpath
    if (target, entry.sha256) in _verified:
        return target
    if not target.is_file():
        raise ReferenceMissing(f"reference file {relpath} is not in {cache_root()} (source: {entry.source}); "
                               f"bring it with {entry.bring}")
    digest = _digest(target)
    if digest != entry.sha256:
        raise ReferenceMissing(f"reference file {relpath} in {cache_root()} has sha256 {digest}, not the pinned "
                               f"{entry.sha256} (source: {entry.source}); bring it again with {entry.bring}")
    _verified.add((target, entry.sha256))
    return target


def directory(reldir: str) -> Path:
    """The cached directory of a reference folder (a chart's crds/, say), every file listed under it checked."""
    prefix = reldir.rstrip("/") + "/"
    listed = [rel for rel in load_sources() if rel.startswith(prefix)]
    if not listed:
        raise ValueError(f"no file under {reldir}/ is listed in {SOURCES.relative_to(PROJECT_ROOT)}")
    for rel in listed:
        path(rel)
    return cache_root() / reldir


def status() -> dict[str, str]:
    """Each listed file's state in the cache: "ok", "missing", or "sha256 <digest>" where it differs."""
    found: dict[str, str] = {}
    for rel, entry in load_sources().items():
        target = cache_root() / rel
        if not target.is_file():
            found[rel] = "missing"
            continue
        digest = _digest(target)
        found[rel] = "ok" if digest == entry.sha256 else f"sha256 {digest}"
    return found


def _download(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
        data: bytes = response.read()
    return data


def is_mirror_url(source: str) -> bool:
    """A mirror given by URL (an HTTP server laid out like ../shared/reference) rather than a directory."""
    return source.startswith(("https://", "http://"))


def fill(from_dir: Path | str | None, log: Callable[[str], None] = lambda _: None) -> list[str]:
    """Bring every listed file into the cache: copied from `from_dir` (a directory laid out like
    ../shared/reference, or the URL of a mirror laid out the same way) or, with None, downloaded from its source.
    Every file is held to its sha256 before it is written; the problems come back one line each (a file already
    cached with the right digest is left alone)."""
    mirror = from_dir.rstrip("/") if isinstance(from_dir, str) and is_mirror_url(from_dir) else None
    if mirror is None and from_dir is not None:
        from_dir = Path(from_dir)
        if not from_dir.is_dir():
            raise TriarchError(f"--from {from_dir}: no such directory")
    root = cache_root()
    problems: list[str] = []
    for rel, entry in load_sources().items():
        target = root / rel
        if target.is_file() and _digest(target) == entry.sha256:
            _verified.add((target, entry.sha256))
            continue
        if mirror is not None:
            origin = f"{mirror}/{rel}"
            try:
                data = _download(origin)
            except (OSError, ValueError) as error:
                problems.append(f"{rel}: download of {origin} failed: {error}")
                continue
        elif isinstance(from_dir, Path):
            origin = str(from_dir / rel)
            if not (from_dir / rel).is_file():
                problems.append(f"{rel}: not in {from_dir}")
                continue
            data = (from_dir / rel).read_bytes()
        elif entry.derived or not entry.source:
            problems.append(f"{rel}: cannot be downloaded, upstream does not hold these bytes ({entry.derived}); "
                            f"copy it with `{FILL_FROM_SHARED}` or from a mirror")
            continue
        else:
            origin = entry.source
            try:
                data = _download(entry.source)
            except (OSError, ValueError) as error:  # URLError and timeouts are OSErrors
                problems.append(f"{rel}: download of {entry.source} failed: {error}")
                continue
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry.sha256:
            problems.append(f"{rel}: sha256 {digest} from {origin}, but sources.yaml pins {entry.sha256} "
                            f"(source: {entry.source}); not cached")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        partial.write_bytes(data)
        partial.replace(target)  # a reader never sees half a file
        _verified.add((target, entry.sha256))
        log(f"{rel}: cached from {origin}")
    return problems
