"""Upstream reference data (CRDs, chart values and archives, vLLM name lists, public vLLM logs) as a pinned,
verified input of the project.

tools/reference/sources.yaml names every file's sha256 and upstream source. The files themselves live in a cache
outside the work tree (a clone has no ../shared): `triarch refdata fill` copies them from a directory laid out
like ../shared/reference (or a mirror) or downloads them, and readers ask `path()` for a file whose sha256 was
checked, or get one line saying how to bring it.

A file whose bytes are not upstream's as-is may carry a derivation recipe (`derive:` in sources.yaml): `fill`
from upstream downloads the recipe's input (held to its own sha256 where one is pinned), applies the recipe, and
holds the result to the file's sha256 like any download. Each recipe is a pure function of the input's bytes.

A file with neither an upstream copy nor a recipe needs a mirror (`--from DIR|URL`; in CI the repository variable
TRIARCH_REFERENCE_MIRROR). A fill from upstream that misses only such files succeeds, and records them in the cache
(NEEDS_MIRROR): under CI=true a test needing one of them skips saying so (`verdict`), while any other missing file
still fails there.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import io
import os
import re
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml

from triarch.errors import TriarchError
from triarch.local.engines import user_cache
from triarch.paths import PROJECT_ROOT

SOURCES = PROJECT_ROOT / "tools" / "reference" / "sources.yaml"
FILL_FROM_SHARED = "uv run triarch refdata fill --from ../shared/reference"
FILL_FROM_UPSTREAM = "uv run triarch refdata fill"
FILL_FROM_MIRROR = ("`uv run triarch refdata fill --from DIR|URL` (../shared/reference or a mirror), in CI the "
                    "repository variable TRIARCH_REFERENCE_MIRROR")
"""How a file that only a mirror holds is brought."""
NEEDS_MIRROR = ".needs-mirror"
"""The marker in the cache root: the files the last fill from upstream left out because only a mirror holds them,
one per line. Each fill writes it again (a fill from upstream that left none out, or any fill from a directory or
mirror, removes it)."""
TIMEOUT = 20.0
"""Seconds a download may wait for upstream: a blocked network fails fast instead of hanging a test run."""


class ReferenceMissing(TriarchError):
    """A reference file that is not in the cache, or not with the pinned sha256: one line saying how to bring it."""

    def __init__(self, message: str, relpath: str = "", absent: bool = False) -> None:
        super().__init__(message)
        self.relpath = relpath
        """The file (relative to the reference root)."""
        self.absent = absent
        """True where the file is not in the cache at all (False where its bytes differ)."""


# --- derivation recipes: pure functions of the input's bytes (and the recipe's parameters in sources.yaml) -------

def strip_helm_lines(data: bytes, header: str) -> bytes:
    """A chart template made plain YAML: every line holding a Helm action (`{{`) removed, `header` (one comment
    line) put on top."""
    kept = [line for line in data.decode("utf-8").splitlines(keepends=True) if "{{" not in line]
    return (header + "\n" + "".join(kept)).encode("utf-8")


def stamp_chart_version(data: bytes, version: str, app_version: str) -> bytes:
    """A Chart.yaml with its top-level `version:` and `appVersion:` lines set, as a release script stamps them;
    every other byte kept."""
    text = data.decode("utf-8")
    for key, value in (("version", version), ("appVersion", app_version)):
        text, count = re.subn(rf"^{key}: .*$", f"{key}: {value}", text, flags=re.MULTILINE)
        if count != 1:
            raise ValueError(f"{count} top-level `{key}:` lines, not one")
    return text.encode("utf-8")


def _tar_sources(data: bytes, prefix: str) -> dict[str, str]:
    """The Python files of a .tar.gz (an sdist) whose member names start with `prefix`, by member name."""
    found: dict[str, str] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            for member in archive:
                if member.isfile() and member.name.startswith(prefix) and member.name.endswith(".py"):
                    handle = archive.extractfile(member)
                    if handle is not None:
                        found[member.name] = handle.read().decode("utf-8")
    except (tarfile.TarError, EOFError, OSError) as error:
        raise ValueError(f"not a readable .tar.gz: {error}") from error
    if not found:
        raise ValueError(f"no Python file under {prefix} in the archive")
    return found


def class_fields(data: bytes, member: str, classes: list[str], sort: bool) -> bytes:
    """The annotated field names of top-level `classes` in one Python file of a .tar.gz, one per line: in the
    order they are declared (class by class, a repeated name once), or sorted."""
    tree = ast.parse(_tar_sources(data, member).get(member, ""), member)
    bodies = {node.name: node.body for node in tree.body if isinstance(node, ast.ClassDef)}
    names: list[str] = []
    for name in classes:
        if name not in bodies:
            raise ValueError(f"no class {name} in {member}")
        names += [st.target.id for st in bodies[name] if isinstance(st, ast.AnnAssign)
                  and isinstance(st.target, ast.Name) and st.target.id not in names]
    return "".join(f"{name}\n" for name in (sorted(names) if sort else names)).encode("utf-8")


def literal_names(data: bytes, under: str, pattern: str) -> bytes:
    """Every string literal that matches `pattern` whole, in the Python files under `under` in a .tar.gz, sorted
    and one per line (vLLM's Prometheus metric names, say)."""
    matcher = re.compile(pattern)
    names = {node.value for name, text in _tar_sources(data, under).items() for node in ast.walk(ast.parse(text, name))
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and matcher.fullmatch(node.value)}
    if not names:
        raise ValueError(f"no string literal matching {pattern} under {under}")
    return "".join(f"{name}\n" for name in sorted(names)).encode("utf-8")


RECIPES: dict[str, Callable[..., bytes]] = {
    "strip-helm-lines": strip_helm_lines,
    "stamp-chart-version": stamp_chart_version,
    "class-fields": class_fields,
    "literal-names": literal_names,
}
"""Each recipe by its name in sources.yaml; its keyword parameters are the `derive:` keys besides recipe, from and
from_sha256."""


@dataclass(frozen=True)
class Derive:
    """How `fill` makes a file from upstream where upstream does not serve its bytes as-is."""

    recipe: str
    source: str
    """The input's URL (sources.yaml's `from`; the file's own `source` where it is left out)."""
    sha256: str | None = None
    """The input's pinned sha256 (`from_sha256`), checked before the recipe runs."""
    params: dict[str, Any] = field(default_factory=dict)

    def apply(self, data: bytes) -> bytes:
        return RECIPES[self.recipe](data, **self.params)


def _derive(rel: str, spec: dict[str, Any], source: str | None) -> Derive:
    params = {key: value for key, value in spec.items() if key not in {"recipe", "from", "from_sha256"}}
    recipe = RECIPES.get(spec.get("recipe", ""))
    if recipe is None:
        raise ValueError(f"{rel}: unknown recipe {spec.get('recipe')!r} (known: {', '.join(sorted(RECIPES))})")
    wanted = list(inspect.signature(recipe).parameters)[1:]
    if sorted(params) != sorted(wanted):
        raise ValueError(f"{rel}: recipe {spec['recipe']} takes {', '.join(wanted)}, not {', '.join(params)}")
    origin = spec.get("from", source)
    if not origin:
        raise ValueError(f"{rel}: a recipe needs `from` or the file's `source`")
    return Derive(spec["recipe"], origin, spec.get("from_sha256"), params)


@dataclass(frozen=True)
class Source:
    """One reference file: where it sits (relative to the reference root), its pinned digest and origin."""

    relpath: str
    sha256: str
    source: str | None
    derived: str | None = None
    """How the bytes were made where they are not upstream's as-is (then `source` alone cannot reproduce them)."""
    derive: Derive | None = None
    """The recipe that makes those bytes from upstream, where there is one."""

    @property
    def from_upstream(self) -> bool:
        """Whether `fill` without --from can bring this file (as-is from `source`, or by its recipe)."""
        return self.derive is not None or (bool(self.source) and not self.derived)

    @property
    def mirror_only(self) -> bool:
        """Whether only a mirror (or ../shared) holds these bytes: no upstream copy and no recipe."""
        return not self.from_upstream

    @property
    def bring(self) -> str:
        """The command that brings this file into the cache, what every user has first: upstream, where it holds the
        file; a mirror (../shared for the project's developers) otherwise."""
        if not self.from_upstream:
            return FILL_FROM_MIRROR
        return f"`{FILL_FROM_UPSTREAM}` (from upstream; or `{FILL_FROM_SHARED}` where it is beside the clone)"


@cache
def load_sources(path: Path = SOURCES) -> dict[str, Source]:
    """Every pinned reference file by its relative path (read once per process)."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))["files"]
    return {rel: Source(rel, spec["sha256"], spec.get("source"), spec.get("derived"),
                        _derive(rel, spec["derive"], spec.get("source")) if "derive" in spec else None)
            for rel, spec in raw.items()}


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
                               f"bring it with {entry.bring}", relpath, absent=True)
    digest = _digest(target)
    if digest != entry.sha256:
        raise ReferenceMissing(f"reference file {relpath} in {cache_root()} has sha256 {digest}, not the pinned "
                               f"{entry.sha256} (source: {entry.source}); bring it again with {entry.bring}",
                               relpath)
    _verified.add((target, entry.sha256))
    return target


def directory(reldir: str) -> Path:
    """The cached directory of a reference folder (a chart's crds/, say), every file listed under it checked."""
    prefix = reldir.rstrip("/") + "/"
    listed = [rel for rel in load_sources() if rel.startswith(prefix)]
    if not listed:
        raise ValueError(f"no file under {reldir}/ is listed in {SOURCES.relative_to(PROJECT_ROOT)}")
    unavailable: list[ReferenceMissing] = []
    for rel in listed:
        try:
            path(rel)
        except ReferenceMissing as missing:
            unavailable.append(missing)
    if unavailable:  # a file upstream serves first: a mirror-only one must not stand for (and skip) it
        raise min(unavailable, key=lambda missing: _entry(missing.relpath).mirror_only)
    return cache_root() / reldir


def needs_mirror() -> frozenset[str]:
    """The files the last fill from upstream recorded as left out because only a mirror holds them (NEEDS_MIRROR);
    empty where there is no marker."""
    marker = cache_root() / NEEDS_MIRROR
    if not marker.is_file():
        return frozenset()
    lines = marker.read_text(encoding="utf-8").splitlines()
    return frozenset(line for line in lines if line and not line.startswith("#"))


def _record_needs_mirror(relpaths: list[str]) -> None:
    marker = cache_root() / NEEDS_MIRROR
    if not relpaths:
        marker.unlink(missing_ok=True)
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    partial = marker.with_name(f"{NEEDS_MIRROR}.{os.getpid()}.partial")
    partial.write_text("# left out by the last `triarch refdata fill` from upstream: only a mirror holds them\n"
                       + "".join(f"{rel}\n" for rel in relpaths), encoding="utf-8")
    partial.replace(marker)


Verdict = Literal["skip", "fail"]


def verdict(missing: ReferenceMissing, ci: bool, marked: Collection[str]) -> tuple[Verdict, str]:
    """What a test does about a reference file it cannot read, and the one line it says: outside CI it skips with
    the line of `missing`. Under CI it fails with that line (CI fills first; a skip would hide a check that never
    ran), except for a file `marked` (needs_mirror()) that only a mirror holds and that is absent: there it skips,
    saying so."""
    entry = _entry(missing.relpath) if missing.relpath else None
    if not ci:
        return "skip", str(missing)
    if entry is not None and entry.mirror_only and missing.absent and missing.relpath in marked:
        return "skip", (f"reference file {missing.relpath} needs a mirror: upstream does not hold it, and the last "
                        f"fill was from upstream; set TRIARCH_REFERENCE_MIRROR (or fill --from DIR|URL) to run this")
    return "fail", str(missing)


NEEDS_A_MIRROR = "needs a mirror"


def status() -> dict[str, str]:
    """Each listed file's state in the cache: "ok", "missing", "sha256 <digest>" where it differs, or NEEDS_A_MIRROR
    where it is missing as the last fill from upstream recorded (only a mirror holds it)."""
    found: dict[str, str] = {}
    marked = needs_mirror()
    for rel, entry in load_sources().items():
        target = cache_root() / rel
        if not target.is_file():
            found[rel] = NEEDS_A_MIRROR if rel in marked and entry.mirror_only else "missing"
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


class _Unreachable(Exception):
    """A download not made, or failed, because its host cannot be reached (not an answer such as a 404)."""


@dataclass
class _Reach:
    """Downloads in one fill, each host tried until it cannot be reached, then no more: offline, or behind a proxy
    that refuses, a fill says so once instead of once per file (and does not wait out a timeout per file)."""

    unreachable: dict[str, str] = field(default_factory=dict)
    """host -> why it could not be reached."""
    files: list[str] = field(default_factory=list)
    """The files not brought because their host could not be reached."""

    def get(self, url: str) -> bytes:
        parts = urllib.parse.urlsplit(url)
        host = parts.netloc or parts.scheme
        if host in self.unreachable:
            raise _Unreachable(host)
        try:
            return _download(url)
        except urllib.error.HTTPError:
            raise  # the host answered
        except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
            self.unreachable[host] = str(getattr(error, "reason", None) or error)
            raise _Unreachable(host) from None

    def problem(self) -> str | None:
        """The one line for every file not brought because a host could not be reached, or None."""
        if not self.files:
            return None
        first = self.files[0] + (f" and {len(self.files) - 1} more" if len(self.files) > 1 else "")
        hosts = "; ".join(f"{host}: {why}" for host, why in self.unreachable.items())
        return (f"{first}: not brought, upstream cannot be reached ({hosts}); fill where it can be, or bring them "
                f"with {FILL_FROM_MIRROR}")


def _recipe_input(derive: Derive, inputs: dict[str, bytes], get: Callable[[str], bytes]) -> bytes:
    """A recipe's input, downloaded once per fill and held to its pinned sha256 where one is pinned."""
    if derive.source not in inputs:
        data = get(derive.source)
        digest = hashlib.sha256(data).hexdigest()
        if derive.sha256 is not None and digest != derive.sha256:
            raise ValueError(f"its input has sha256 {digest}, but sources.yaml pins {derive.sha256}")
        inputs[derive.source] = data
    return inputs[derive.source]


@dataclass
class Filled:
    """What a fill could not do, one line per file."""

    problems: list[str] = field(default_factory=list)
    """Failures: a sha256 that differs, a download or recipe that failed, a file missing from --from."""
    need_mirror: list[str] = field(default_factory=list)
    """Files a fill from upstream left out because only a mirror holds them (not a failure), recorded in the cache
    (NEEDS_MIRROR)."""


def fill(from_dir: Path | str | None, log: Callable[[str], None] = lambda _: None) -> Filled:
    """Bring every listed file into the cache: copied from `from_dir` (a directory laid out like
    ../shared/reference, or the URL of a mirror laid out the same way) or, with None, downloaded from its source.
    Every file is held to its sha256 before it is written; the problems come back one line each (a file already
    cached with the right digest is left alone), the files that only a mirror holds apart (from upstream only),
    and those are recorded in the cache's NEEDS_MIRROR marker (removed by any other fill)."""
    mirror = from_dir.rstrip("/") if isinstance(from_dir, str) and is_mirror_url(from_dir) else None
    if mirror is None and from_dir is not None:
        from_dir = Path(from_dir)
        if not from_dir.is_dir():
            raise TriarchError(f"--from {from_dir}: no such directory")
    root = cache_root()
    problems: list[str] = []
    need_mirror: list[str] = []
    left_out: list[str] = []
    inputs: dict[str, bytes] = {}  # a recipe input shared by several files (an sdist) is downloaded once
    reach = _Reach()
    for rel, entry in load_sources().items():
        target = root / rel
        if target.is_file() and _digest(target) == entry.sha256:
            _verified.add((target, entry.sha256))
            continue
        if mirror is not None:
            origin = f"{mirror}/{rel}"
            try:
                data = reach.get(origin)
            except _Unreachable:
                reach.files.append(rel)
                continue
            except (OSError, ValueError) as error:
                problems.append(f"{rel}: download of {origin} failed: {error}")
                continue
        elif isinstance(from_dir, Path):
            origin = str(from_dir / rel)
            if not (from_dir / rel).is_file():
                problems.append(f"{rel}: not in {from_dir}")
                continue
            data = (from_dir / rel).read_bytes()
        elif entry.derive is not None:
            origin = f"{entry.derive.recipe} of {entry.derive.source}"
            try:
                data = entry.derive.apply(_recipe_input(entry.derive, inputs, reach.get))
            except _Unreachable:
                reach.files.append(rel)
                continue
            except (OSError, ValueError, SyntaxError) as error:
                problems.append(f"{rel}: {origin} failed: {error}")
                continue
        elif entry.derived or not entry.source:  # mirror_only (no recipe, above): upstream cannot bring it
            if target.is_file():  # bytes that are not the pinned ones: a failure, not a file left out
                problems.append(f"{rel}: sha256 {_digest(target)} in {root}, not the pinned {entry.sha256}, and "
                                f"upstream does not hold these bytes ({entry.derived}); bring it with "
                                f"{FILL_FROM_MIRROR}")
                continue
            need_mirror.append(f"{rel}: needs a mirror, upstream does not hold these bytes ({entry.derived}); "
                               f"bring it with {FILL_FROM_MIRROR}")
            left_out.append(rel)
            continue
        else:
            origin = entry.source
            try:
                data = reach.get(entry.source)
            except _Unreachable:
                reach.files.append(rel)
                continue
            except (OSError, ValueError) as error:  # a refused URL (404) and other failures are OSErrors
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
    if (unreached := reach.problem()) is not None:
        problems.append(unreached)
    _record_needs_mirror(left_out)
    return Filled(problems, need_mirror)
