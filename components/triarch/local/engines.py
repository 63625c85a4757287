"""The real engines (etcd, the Kubernetes control plane, kwok, the Pulumi CLI and its Kubernetes provider): their
pins, where each is cached, and how each is built from the Go module proxy.

Pins live in tools/engines/engines.yaml, one entry per tool. A tool builds in a wrapper module of its own (their
dependency sets conflict) into `<cache>/<tool>/<version>-<digest of its entry and sources>/bin`, so a pin change
rebuilds that tool alone and nothing built enters the work tree."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from triarch.errors import TriarchError
from triarch.paths import PROJECT_ROOT

ENGINES_DIR = PROJECT_ROOT / "tools" / "engines"
PINS = ENGINES_DIR / "engines.yaml"
GO_VERSION_FILE = ENGINES_DIR / ".go-version"
"""The Go the engines are built with: this build checks its major.minor, CI's actions/setup-go installs it."""
DONE = "built.json"
"""Written last into a tool's cache directory: its presence means every binary there is complete."""
BUILD_HINT = "uv run triarch local build"


class EngineError(TriarchError):
    """A missing toolchain, a failed build or a missing engine: one line naming what and how to fix it."""


@dataclass(frozen=True)
class Engine:
    """One pinned tool: a Go module at a version, the binaries built from it, and how."""

    name: str
    module: str
    version: str
    packages: dict[str, str]
    release: str | None = None
    stands_in_for: str | None = None
    """The pinned release this build takes the place of, where the module proxy does not serve that one's source."""
    replace: dict[str, str] = field(default_factory=dict)
    require: dict[str, str] = field(default_factory=dict)
    staging_replaces: bool = False
    inherit_replaces: bool = False
    """Carry the module's own versioned `replace` lines into the wrapper (its build depends on them)."""
    cgo: bool = False
    ldflags: dict[str, str] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    sources: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    schema: str | None = None
    entry: str = ""
    """The pin's YAML as written, part of the cache key."""

    @property
    def binaries(self) -> list[str]:
        return sorted([*self.packages, *(f for f in self.files if "/" not in f)])

    @property
    def plain_version(self) -> str:
        """The release the binaries report (the tag for an untagged module), without its leading v."""
        return (self.release or self.version).removeprefix("v")

    def digest(self) -> str:
        """What a build depends on: the pin, the Go release pinned to build it (tools/engines/.go-version), the
        code that builds (BUILD_RECIPE) and our own sources for it. Any of them changed, the engine is built again
        into a directory of its own; a cache built otherwise is never reused."""
        h = hashlib.sha256(self.entry.encode())
        h.update(f"go {pinned_go()}".encode())
        h.update(recipe_digest().encode())
        if self.sources:
            for path in sorted((ENGINES_DIR / self.sources).iterdir()):
                h.update(path.name.encode())
                h.update(path.read_bytes())
        return h.hexdigest()[:12]

    def directory(self, cache: Path) -> Path:
        return cache / self.name / f"{self.plain_version}-{self.digest()}"


def user_cache(variable: str, name: str) -> Path:
    """$variable if set, else <XDG cache>/triarch/<name>: outside the work tree, kept between clones."""
    given = os.environ.get(variable)
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "triarch" / name


def cache_root() -> Path:
    """Where built engines live: $TRIARCH_ENGINES_CACHE, else ~/.cache/triarch/engines."""
    return user_cache("TRIARCH_ENGINES_CACHE", "engines")


def load_engines(path: Path = PINS) -> dict[str, Engine]:
    raw = yaml.safe_load(path.read_text())["engines"]
    found: dict[str, Engine] = {}
    for name, spec in raw.items():
        entry = yaml.safe_dump({name: spec}, sort_keys=True)
        found[name] = Engine(
            name=name, module=spec["module"], version=spec["version"], packages=dict(spec["packages"]),
            release=spec.get("release"), stands_in_for=spec.get("standsInFor"), replace=dict(spec.get("replace", {})),
            require=dict(spec.get("require", {})),
            staging_replaces=bool(spec.get("stagingReplaces", False)),
            inherit_replaces=bool(spec.get("inheritReplaces", False)), cgo=bool(spec.get("cgo", False)),
            ldflags=dict(spec.get("ldflags", {})), tags=tuple(spec.get("tags", [])), sources=spec.get("sources"),
            files=dict(spec.get("files", {})), schema=spec.get("schema"), entry=entry)
    return found


def installed(engine: Engine, cache: Path | None = None) -> Path | None:
    """The bin directory of a complete build of this pin, or None."""
    directory = engine.directory(cache or cache_root())
    return directory / "bin" if (directory / DONE).is_file() else None


def binary(name: str, cache: Path | None = None, engines: dict[str, Engine] | None = None) -> Path:
    """The path of one built binary (e.g. "kube-apiserver"); an EngineError naming the build command if absent."""
    engines = engines or load_engines()
    for engine in engines.values():
        if name in engine.binaries:
            bin_dir = installed(engine, cache)
            if bin_dir is None:
                raise EngineError(f"engine {engine.name} {engine.plain_version} is not built (needed for {name}); "
                                  f"build it with `{BUILD_HINT}` (Go and the Go module proxy; ~40 min cold for all)")
            return bin_dir / name
    raise EngineError(f"no engine in {PINS.relative_to(PROJECT_ROOT)} builds {name}")


def missing(cache: Path | None = None, engines: dict[str, Engine] | None = None) -> list[Engine]:
    engines = engines or load_engines()
    return [engine for engine in engines.values() if installed(engine, cache) is None]


def ldflags(engine: Engine) -> str:
    version = engine.version.removeprefix("v")
    major, minor = [*version.split("."), "0"][:2]
    values = {"version": version, "major": major, "minor": minor, "release": engine.plain_version}
    stamps = [f"-X {var}={value.format(**values)}" for var, value in engine.ldflags.items()]
    return " ".join(["-s", "-w", *stamps])


STAGING_REPLACE = re.compile(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/")
VERSIONED_REPLACE = re.compile(r"^\s*(?:replace\s+)?([\w./-]+)\s+=>\s+([\w./-]+)\s+(v[\w.+-]+)\s*$")


def staging_replaces(kubernetes_go_mod: str, version: str) -> dict[str, str]:
    """k8s.io/kubernetes replaces each staging module with its ./staging copy; the published copy of the same code
    is v0.<minor>.<patch> (v1.35.4 -> v0.35.4)."""
    published = "v0." + version.removeprefix("v").split(".", 1)[1]
    return {m.group(1): f"{m.group(1)} {published}"
            for line in kubernetes_go_mod.splitlines() if (m := STAGING_REPLACE.match(line))}


def versioned_replaces(go_mod: str) -> dict[str, str]:
    """A module's own `replace X => Y vN` lines (replaces onto local directories are left out)."""
    return {m.group(1): f"{m.group(2)} {m.group(3)}"
            for line in go_mod.splitlines() if (m := VERSIONED_REPLACE.match(line.split("//")[0]))}


Runner = Callable[[list[str], Path, dict[str, str]], str]


def run_go(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    try:
        done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise EngineError("go is not on the PATH; install Go >= 1.26 (the engines build from the Go module "
                          "proxy)") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-6:]
        raise EngineError(f"`{' '.join(args[:3])} ...` failed in {cwd}: " + " | ".join(tail))
    return done.stdout


def pinned_go(path: Path = GO_VERSION_FILE) -> str:
    """The Go version in tools/engines/.go-version (e.g. 1.26.8)."""
    return path.read_text(encoding="utf-8").strip()


GO_VERSION = re.compile(r"\bgo(\d+)\.(\d+)(?:\.\d+|rc\d+|beta\d+)?\b")


def check_go_version(output: str, pinned: str | None = None) -> None:
    """Refuse, in one line, a `go version` output whose major.minor is not the pinned one's (GOTOOLCHAIN=local
    keeps go from fetching another toolchain, so the Go on the PATH is the one that builds)."""
    pinned = pinned or pinned_go()
    want = tuple(pinned.split(".")[:2])
    found = GO_VERSION.search(output)
    if found is None:
        raise EngineError(f"cannot read a Go version from `go version`: {output.strip()!r}")
    if found.groups() != want:
        file = GO_VERSION_FILE.relative_to(PROJECT_ROOT)
        raise EngineError(f"go {found.group(0).removeprefix('go')} is on the PATH but {file} pins {pinned}; "
                          f"install Go {'.'.join(want)}.x (the engines are built and cached with that one)")


def go_version_output() -> str:
    done = subprocess.run(["go", "version"], env={**os.environ, "GOTOOLCHAIN": "local"}, capture_output=True,
                          text=True, check=False)
    return done.stdout or done.stderr


def go_env(engine: Engine) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"CGO_ENABLED": "1" if engine.cgo else "0", "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local",
                "GOWORK": "off"})
    return env


def module_dir(engine: Engine, module: str, version: str, run: Runner, cwd: Path) -> Path:
    """The module's source in the Go module cache (downloaded if needed)."""
    out = run(["go", "mod", "download", "-json", f"{module}@{version}"], cwd, go_env(engine))
    return Path(json.loads(out)["Dir"])


def build(engine: Engine, cache: Path | None = None, run: Runner = run_go,
          log: Callable[[str], None] = print) -> Path:
    """Build every binary of one pin into its cache directory; returns the bin directory."""
    directory = engine.directory(cache or cache_root())
    if directory.exists():
        shutil.rmtree(directory)
    wrapper, bin_dir = directory / "wrapper", directory / "bin"
    wrapper.mkdir(parents=True)
    bin_dir.mkdir()
    env = go_env(engine)
    run(["go", "mod", "init", f"triarch.local/engines/{engine.name}"], wrapper, env)
    if engine.sources:
        for source in (ENGINES_DIR / engine.sources).glob("*.go"):
            shutil.copy2(source, wrapper / source.name)
    requires = {engine.module: engine.version, **engine.require}
    edits = [f"-require={module}@{version}" for module, version in requires.items()]
    source_dir = module_dir(engine, engine.module, engine.version, run, wrapper)
    replaces: dict[str, str] = {}
    if engine.inherit_replaces or engine.staging_replaces:
        go_mod = (source_dir / "go.mod").read_text()
        replaces.update(versioned_replaces(go_mod) if engine.inherit_replaces else {})
        replaces.update(staging_replaces(go_mod, engine.version) if engine.staging_replaces else {})
    replaces.update(engine.replace)
    for module, target in sorted(replaces.items()):
        path, _, version = target.partition(" ")
        edits.append(f"-replace={module}={path}@{version}" if version else f"-replace={module}={path}")
    run(["go", "mod", "edit", *edits], wrapper, env)
    if engine.schema:
        schema = json.loads((source_dir / engine.schema).read_text())
        schema["version"] = engine.plain_version
        (wrapper / "schema.json").write_text(json.dumps(schema))
    timings: dict[str, float] = {}
    for name, package in sorted(engine.packages.items()):
        target = "." if engine.sources and package == "." else (
            engine.module if package == "." else f"{engine.module}/{package}")
        command = ["go", "build", "-trimpath", "-ldflags", ldflags(engine), "-o", str(bin_dir / name)]
        if engine.tags:
            command += ["-tags", ",".join(engine.tags)]
        start = time.monotonic()
        run([*command, target], wrapper, env)
        timings[name] = round(time.monotonic() - start, 1)
        log(f"built {name} ({engine.module}@{engine.version}) in {timings[name]:.0f}s")
    for name, relative in engine.files.items():
        module, _, inside = relative.rpartition(":")
        origin = module_dir(engine, module, requires[module], run, wrapper) if module else source_dir
        (bin_dir / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(origin / inside, bin_dir / name)
        (bin_dir / name).chmod(0o755)
    (directory / DONE).write_text(json.dumps({"version": engine.version, "seconds": timings}, indent=1) + "\n")
    for stale in directory.parent.iterdir():  # earlier pins of this tool
        if stale != directory:
            shutil.rmtree(stale, ignore_errors=True)
    return bin_dir


def build_all(names: list[str] | None = None, cache: Path | None = None, force: bool = False,
              log: Callable[[str], None] = print, go_version: Callable[[], str] = go_version_output
              ) -> dict[str, Path]:
    """Build the engines that are not cached (all, or those named); returns each tool's bin directory."""
    if shutil.which("go") is None:
        raise EngineError("go is not on the PATH; install Go >= 1.26 (the engines build from the Go module proxy)")
    engines = load_engines()
    unknown = sorted(set(names or []) - set(engines))
    if unknown:
        raise EngineError(f"unknown engine {', '.join(unknown)}; allowed: {', '.join(sorted(engines))}")
    built: dict[str, Path] = {}
    checked = False
    for name in names or list(engines):
        engine = engines[name]
        ready = None if force else installed(engine, cache)
        if ready is not None:
            log(f"{name} {engine.plain_version}: cached in {ready}")
            built[name] = ready
            continue
        if not checked:  # before the first build: a cached engine needs no particular Go
            check_go_version(go_version())
            checked = True
        start = time.monotonic()
        built[name] = build(engine, cache, log=log)
        log(f"{name} {engine.plain_version}: built in {time.monotonic() - start:.0f}s")
    return built


PLUGINS = ("pulumi-resource-kubernetes",)
"""Engines the Pulumi CLI loads as plugins from its PULUMI_HOME (installed there, kept off the PATH)."""


def path_with_engines(cache: Path | None = None) -> str:
    """A PATH with every built engine's bin directory first: kubectl, the control plane, pulumi with the Python
    language host it bundles beside it."""
    dirs = [str(d) for engine in load_engines().values()
            if engine.name not in PLUGINS and (d := installed(engine, cache)) is not None]
    return os.pathsep.join([*dirs, os.environ.get("PATH", "")])


def describe(cache: Path | None = None) -> dict[str, Any]:
    """What is pinned and what is built, for `triarch local build --list`."""
    out: dict[str, Any] = {}
    for name, engine in load_engines().items():
        ready = installed(engine, cache)
        out[name] = {"version": engine.plain_version, "module": f"{engine.module}@{engine.version}",
                     "built": str(ready) if ready else None}
    return out


BUILD_RECIPE: tuple[Callable[..., Any], ...] = (build, go_env, module_dir, ldflags, versioned_replaces,
                                                staging_replaces)
"""The code that turns a pin into binaries (every function of this module `build` calls: tests/test_local.py holds
it): its source is part of each engine's cache key."""


@functools.cache
def recipe_digest() -> str:
    """The sha256 of BUILD_RECIPE's source."""
    h = hashlib.sha256()
    for function in BUILD_RECIPE:
        h.update(inspect.getsource(function).encode())
    return h.hexdigest()

