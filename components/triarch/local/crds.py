"""Which CRDs a local control plane installs, and where their pinned copies come from (tools/engines/engines.yaml:
the chart's own copy in a directory given with --crds, else in the reference cache (`triarch refdata fill`, each
file's sha256 checked), else the operator's Go module from the module proxy)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from triarch import refdata
from triarch.config import StackConfig
from triarch.local.engines import PINS, EngineError

CRD_SETS = ("kuberay", "prometheus", "keda", "karpenter", "lws")


@dataclass(frozen=True)
class CrdSet:
    name: str
    chart: str
    reference_dir: str
    reference_files: tuple[str, ...]
    module: str
    module_files: tuple[str, ...]


def load_crd_sets(path: Path = PINS) -> dict[str, CrdSet]:
    raw = yaml.safe_load(path.read_text())["crds"]
    return {name: CrdSet(name, spec["chart"], spec["reference"]["dir"], tuple(spec["reference"]["files"]),
                         spec["module"]["path"], tuple(spec["module"]["files"]))
            for name, spec in raw.items()}


def existing_crd_sets(stack: StackConfig) -> list[str]:
    """The CRD sets of the components an adopted stack says the cluster already runs (a real cluster running
    them has their CRDs), in a fixed order."""
    wanted = set()
    if stack.kuberay.mode == "existing" and any(m.engine == "ray-serve" for m in stack.models):
        wanted.add("kuberay")
    if stack.prometheus == "existing":
        wanted.add("prometheus")
    if stack.observability.keda == "existing":
        wanted.add("keda")
    if not stack.cluster.create and stack.cluster.provisioner == "karpenter":
        wanted.add("karpenter")
    if stack.leader_worker_set.mode == "existing" and any(m.engine == "vllm" for m in stack.models):
        wanted.add("lws")  # whether a vllm replica spans nodes is the tuner's to say; the CRD costs nothing
    return [name for name in CRD_SETS if name in wanted]


def _from_reference(crds: CrdSet, references: list[Path]) -> list[Path] | None:
    """The chart's copies from the first given directory holding them all, else from the reference cache."""
    for root in references:
        if not root.is_dir():
            raise EngineError(f"--crds {root}: no such directory")
        files = [root / crds.reference_dir / f for f in crds.reference_files]
        if all(f.is_file() for f in files):
            return files
    try:
        return [refdata.path(f"{crds.reference_dir}/{f}") for f in crds.reference_files]
    except refdata.ReferenceMissing:
        return None


def _from_module(crds: CrdSet) -> list[Path] | None:
    """The files from the Go module cache, downloaded through the module proxy; None where it is not served."""
    try:
        done = subprocess.run(["go", "mod", "download", "-json", crds.module], capture_output=True, text=True,
                              check=False)
    except FileNotFoundError:
        return None
    if done.returncode != 0:
        return None
    directory = Path(json.loads(done.stdout)["Dir"])
    files = [directory / f for f in crds.module_files]
    return files if all(f.is_file() for f in files) else None


def crd_files(names: list[str], references: list[Path]) -> list[Path]:
    """Every CRD file of the named sets: from the first directory in `references` holding the chart's copies, else
    the reference cache, else the operator's module. An EngineError names a set found nowhere and how to supply it."""
    sets = load_crd_sets()
    found: list[Path] = []
    for name in names:
        crds = sets[name]
        files = _from_reference(crds, references) or _from_module(crds)
        if files is None:
            raise EngineError(
                f"the {name} CRDs (chart {crds.chart}) are needed by this stack, but the Go module proxy does not "
                f"serve {crds.module} and the reference cache ({refdata.cache_root()}) has no verified "
                f"{crds.reference_dir}/; bring it with `{refdata.FILL_FROM_UPSTREAM}` (from upstream; or "
                f"`{refdata.FILL_FROM_SHARED}` where it is beside the clone)")
        found += files
    return found
