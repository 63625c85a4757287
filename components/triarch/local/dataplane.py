"""The data plane's engines on CPU: vLLM's CPU build and Ray Serve, in Python environments of their own.

Each environment is one extra of tools/dataplane/pyproject.toml, synced from its lock (tools/dataplane/uv.lock) by
`uv` into `<cache>/<name>/<digest>/venv`, outside the work tree; the digest covers the lock, the project file, the
environment's entry in tools/dataplane/environments.yaml and the Python running it, so a pin change makes a new
environment and nothing is downloaded at test time. `triarch local build` builds them beside the Go engines."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from triarch.local.engines import EngineError, user_cache
from triarch.paths import PROJECT_ROOT

DATAPLANE_DIR = PROJECT_ROOT / "tools" / "dataplane"
ENVIRONMENTS = DATAPLANE_DIR / "environments.yaml"
DONE = "built.json"
"""Written last into an environment's directory: its presence means the sync completed."""


class DataplaneMissing(EngineError):
    """An environment that is not built: one line naming it and the command that builds it."""


@dataclass(frozen=True)
class Environment:
    name: str
    extra: str
    vllm: str
    serves: str
    """The engine of Triarch's it stands for: "vllm" (plain vLLM models) or "ray-serve"."""
    ray: str | None = None
    entry: str = ""
    """The environment's YAML as written, part of the cache key."""

    def digest(self) -> str:
        h = hashlib.sha256(self.entry.encode())
        for path in (DATAPLANE_DIR / "pyproject.toml", DATAPLANE_DIR / "uv.lock"):
            h.update(path.read_bytes())
        h.update(platform.python_version().encode())
        return h.hexdigest()[:12]

    def directory(self, cache: Path | None = None) -> Path:
        return (cache or cache_root()) / self.name / self.digest()

    def describe(self) -> str:
        return f"vLLM {self.vllm} (CPU)" + (f" with Ray {self.ray}" if self.ray else "")


def cache_root() -> Path:
    """Where the environments live: $TRIARCH_DATAPLANE_CACHE, else ~/.cache/triarch/dataplane."""
    return user_cache("TRIARCH_DATAPLANE_CACHE", "dataplane")


def load_environments(path: Path = ENVIRONMENTS) -> dict[str, Environment]:
    raw = yaml.safe_load(path.read_text())["environments"]
    return {name: Environment(name=name, extra=spec["extra"], vllm=str(spec["vllm"]), serves=spec["serves"],
                              ray=str(spec["ray"]) if spec.get("ray") else None,
                              entry=yaml.safe_dump({name: spec}, sort_keys=True))
            for name, spec in raw.items()}


def for_engine(engine: str, environments: dict[str, Environment] | None = None) -> Environment:
    """The environment that stands for one of Triarch's engines ("vllm" or "ray-serve")."""
    [found] = [e for e in (environments or load_environments()).values() if e.serves == engine]
    return found


def release_key(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split("."))


def for_vllm_release(release: str, environments: dict[str, Environment] | None = None) -> Environment:
    """The environment with the newest CPU build of vLLM not newer than `release` (the image's vLLM)."""
    candidates = sorted((e for e in (environments or load_environments()).values()
                         if release_key(e.vllm) <= release_key(release)), key=lambda e: release_key(e.vllm))
    if not candidates:
        raise EngineError(f"no data-plane environment has a CPU build of vLLM {release} or older")
    return candidates[-1]


def installed(environment: Environment, cache: Path | None = None) -> Path | None:
    """The environment's Python, where a complete sync of this pin exists."""
    directory = environment.directory(cache)
    return directory / "venv" / "bin" / "python" if (directory / DONE).is_file() else None


def python(environment: Environment, cache: Path | None = None) -> Path:
    """The environment's Python, or DataplaneMissing naming the command that builds it."""
    found = installed(environment, cache)
    if found is None:
        raise DataplaneMissing(
            f"data-plane environment {environment.name} ({environment.describe()}) is not built; build it with "
            f"`uv run triarch local build {environment.name}` (about 7 GB from the package registry)")
    return found


def vllm_cache(python: Path) -> Path:
    """The VLLM_CACHE_ROOT every engine of the environment whose Python is `python` shares: vLLM keeps there what it
    learnt of each architecture (modelinfos, held to the model module's hash), which an engine without it finds out
    in a subprocess that imports vLLM again, about nine seconds of CPU per start on two cores (2026-12-06)."""
    return python.parent.parent.parent / "vllm-cache"


def engine_tmp(python: Path) -> Path:
    """The TMPDIR every engine of the environment whose Python is `python` shares, in the user's own cache. A pod's
    /tmp is its own; this host's is every user's, and PyTorch keeps its compile cache in /tmp/torchinductor_$USER
    with USER the planned `ray` (planners/pods.py): an engine another user started first would own it, and this
    user's engines fail on it (PermissionError, seen as a non-root user on 2026-12-07)."""
    path = python.parent.parent.parent / "tmp"
    path.mkdir(parents=True, exist_ok=True)
    return path


def tiny_models(cache: Path | None = None) -> Path:
    """Where the engines' tiny models live, each in a directory named by its content (tiny_models.shared): a path
    that stays from run to run, which vLLM's compile cache is keyed by."""
    return (cache or cache_root()) / "tiny-models"


def missing(cache: Path | None = None) -> list[Environment]:
    return [e for e in load_environments().values() if installed(e, cache) is None]


Runner = Callable[[list[str], dict[str, str]], None]


def run_uv(argv: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-4:]
        raise EngineError(f"`{' '.join(argv[:3])} ...` failed: " + " | ".join(tail))


def build(environment: Environment, cache: Path | None = None, run: Runner = run_uv) -> Path:
    """Sync one environment from the lock (bytecode compiled once, here, not by every engine that imports it);
    returns its Python."""
    uv = shutil.which("uv")
    if uv is None:
        raise EngineError("uv is not on the PATH; install it (`pip install uv`) to build the data-plane environments")
    directory = environment.directory(cache)
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(directory / "venv")}
    run([uv, "sync", "--locked", "--project", str(DATAPLANE_DIR), "--extra", environment.extra,
         "--python", sys.executable, "--compile-bytecode", "--no-progress", "--quiet"], env)
    (directory / DONE).write_text(json.dumps({"extra": environment.extra, "vllm": environment.vllm}) + "\n")
    for stale in directory.parent.iterdir():  # earlier pins of this environment
        if stale != directory:
            shutil.rmtree(stale, ignore_errors=True)
    return directory / "venv" / "bin" / "python"


def build_all(names: list[str] | None = None, cache: Path | None = None, force: bool = False,
              log: Callable[[str], None] = print) -> dict[str, Path]:
    """Sync the environments that are not cached (all, or those named)."""
    environments = load_environments()
    built: dict[str, Path] = {}
    for name in names or list(environments):
        environment = environments[name]
        ready = None if force else installed(environment, cache)
        if ready is not None:
            log(f"{name} ({environment.describe()}): cached in {ready.parents[2]}")
            built[name] = ready
            continue
        start = time.monotonic()
        built[name] = build(environment, cache)
        log(f"{name} ({environment.describe()}): synced in {time.monotonic() - start:.0f}s")
    return built


def describe(cache: Path | None = None) -> dict[str, dict[str, str | None]]:
    """What is pinned and what is built, for `triarch local build --list`."""
    out: dict[str, dict[str, str | None]] = {}
    for name, environment in load_environments().items():
        ready = installed(environment, cache)
        out[name] = {"version": environment.describe(), "built": str(ready.parents[2]) if ready else None}
    return out
