"""The real-engine tier's shared pieces: one local control plane and one `pulumi up` of the lab stack per test
session, on engines built by `triarch local build`.

Outside CI the tier skips, in one line that says how to build the engines, where Go or a built engine is missing;
with CI=true a missing engine fails the run instead. Everything runs inside the plane's network namespace (only
`lo`), and the plane is brought down at the end of the session whatever happened."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT, stack_document, write_stack_file
from triarch import refdata
from triarch.local import engines, netns
from triarch.local.lifecycle import down, up
from triarch.local.netns import Namespace
from triarch.local.plane import Plane
from triarch.local.stack import spec_for_stack
from triarch.report.validation import validate_stack_file
from triarch.scheduling import POOL_LABEL

STACK = "lab"
GPU = "nvidia.com/gpu"
"""The Pulumi stack name the tier deploys (its config: stacks/Pulumi.lab.yaml, kubeconfig pointed at the plane)."""


def require_engines() -> None:
    """Skip (fail under CI=true) with one line where the tier cannot run here."""
    problems = []
    if shutil.which("go") is None and engines.missing():
        problems.append("Go is not installed")
    missing = [e.name for e in engines.missing()]
    if missing:
        problems.append(f"engines not built: {', '.join(missing)}")
    try:  # the line saying which namespace the planes get is in the run's summary (conftest)
        netns.choose()
    except netns.NetnsError as error:
        problems.append(str(error))
    if shutil.which("uv") is None:
        problems.append("uv is not on the PATH (the Pulumi program's toolchain)")
    try:  # the CRDs of the lab stack's existing components (KubeRay, Prometheus Operator)
        for folder in ("kuberay-v1.7.0", "prometheus-operator-v0.93.1/crds"):
            refdata.directory(folder)
    except refdata.ReferenceMissing as missing:
        problems.append(str(missing))
    if not problems:
        return
    message = ("real-engine tier: " + "; ".join(problems)
               + "; build the engines with `uv run triarch local build` (Go >= 1.26 and the Go module proxy)")
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def engines_required() -> None:
    """For a test that starts engines without the lab (`@pytest.mark.usefixtures("engines_required")`): it skips
    (fails under CI=true) as the tier does, and it puts the test in the tier (the `engines` marker, conftest.py)."""
    require_engines()


def eventually(check: Callable[[], bool], timeout: float, interval: float = 2.0) -> bool:
    """Poll `check` until it holds (True) or `timeout` seconds pass (False): a condition awaited, never a fixed
    sleep. The caller says what did not happen, with what it knows of why."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval)
    return False


def scratch_project(directory: Path, program: str | None = None) -> Path:
    """A Pulumi project in `directory` that runs Triarch's program (or `program`, a file written beside it) in the
    environment running the tests (the project's, or a mutation benchmark's copy through PYTHONPATH), with its
    stack files there too: the tests' stack config never touches stacks/. The same project name as Triarch's, so
    the same stacks and URNs. No pyproject.toml above it, so the uv toolchain syncs nothing."""
    directory.mkdir(parents=True, exist_ok=True)
    project = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    project["runtime"]["options"]["virtualenv"] = sys.prefix  # the environment running the tests
    project["stackConfigDir"] = "."
    if program is None:
        project["main"] = os.path.relpath(ROOT, directory)
    else:
        (directory / "program.py").write_text(program)
        project["main"] = "program.py"
    (directory / "Pulumi.yaml").write_text(yaml.safe_dump(project, sort_keys=False))
    venv = directory / ".venv"  # where a Release's post-renderer path points, from the program's directory
    if not venv.exists():
        venv.symlink_to(sys.prefix, target_is_directory=True)
    return directory


@dataclass
class Lab:
    """The plane, the scratch project whose stack file the Pulumi CLI reads (kubeconfig pointed at the plane)."""

    plane: Plane
    project: Path
    config: dict[str, Any]

    @property
    def stack_file(self) -> Path:
        return self.project / f"Pulumi.{STACK}.yaml"

    def pulumi(self, *args: str, check: bool = True, timeout: float = 600, cwd: Path | None = None,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """`pulumi ARGS` for the lab stack, run from the scratch project (or `cwd`) inside the plane's namespace."""
        argv = [str(engines.binary("pulumi")), *args, "--stack", STACK, "--non-interactive"]
        done = subprocess.run(self.plane.command(argv), env={**self.plane.env(), **(env or {})},
                              cwd=cwd or self.project, capture_output=True, text=True, timeout=timeout,
                              check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"pulumi {' '.join(args)} exited {done.returncode}:\n{done.stdout[-4000:]}\n"
                                 f"{done.stderr[-4000:]}")
        return done

    def kubectl_json(self, *args: str) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.plane.kubectl(*args, "-o", "json").stdout)
        return loaded

    def free_gpus(self, pool: str) -> dict[str, int]:
        """Each of the pool's nodes (cordoned ones left out) with its GPUs that no pod holds: a Pending pod already
        bound to the node, or a Running one, in any namespace."""
        nodes = [n for n in self.kubectl_json("get", "nodes", "-l", f"{POOL_LABEL}={pool}")["items"]
                 if not n["spec"].get("unschedulable")]
        held: dict[str, int] = {}
        for pod in self.kubectl_json("get", "pods", "-A")["items"]:
            node = pod["spec"].get("nodeName")
            if node and pod["status"].get("phase") in ("Pending", "Running"):
                held[node] = held.get(node, 0) + sum(
                    int(((c.get("resources") or {}).get("requests") or {}).get(GPU, 0))
                    for c in pod["spec"]["containers"])
        return {n["metadata"]["name"]: int(n["status"]["allocatable"].get(GPU, 0)) - held.get(n["metadata"]["name"], 0)
                for n in nodes}

    def write_config(self, config: dict[str, Any]) -> None:
        """Replace the stack's Triarch config (keeps the passphrase salt Pulumi wrote into the file)."""
        current = yaml.safe_load(self.stack_file.read_text()) or {}
        current["config"] = {**config, **{k: v for k, v in current.get("config", {}).items()
                                          if not k.startswith("triarch:")}}
        self.stack_file.write_text(yaml.safe_dump(current, sort_keys=False))


def lab_config(kubeconfig: Path) -> dict[str, Any]:
    config = stack_document(STACK)
    config["triarch:cluster"]["kubeconfig"] = str(kubeconfig)
    return config


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """The lab stack, up on a fresh plane (`pulumi up` ran once); brought down after the session."""
    require_engines()
    home = tmp_path_factory.mktemp("planes")
    patch = pytest.MonkeyPatch()
    patch.setenv("TRIARCH_LOCAL_HOME", str(home))
    patch.setenv("PULUMI_CONFIG_PASSPHRASE", "triarch-tests")
    name = f"t{os.getpid()}"
    project = scratch_project(tmp_path_factory.mktemp("project"))
    config = lab_config(project / "kubeconfig")
    write_stack_file(project / f"Pulumi.{STACK}.yaml", config)
    validated = validate_stack_file(STACK, project / f"Pulumi.{STACK}.yaml")
    try:
        # No --crds directory: the CRDs come from the reference cache (checked above), as for `triarch local up`.
        plane = up(spec_for_stack(name, validated.stack, []), log=lambda _: None)
        lab = Lab(plane, project, config)
        lab.pulumi("stack", "init", "--secrets-provider", "passphrase")
        yield lab
    finally:
        down(name, quiet=True)
        patch.undo()


def recording_namespaces(monkeypatch: pytest.MonkeyPatch) -> list[Namespace]:
    """The network namespaces planes make from now on in this test (a plane that fails to come up leaves no state
    that would name its namespace)."""
    made: list[Namespace] = []
    create = netns.create

    def recording(*args: Any, **kwargs: Any) -> Namespace:
        made.append(create(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(netns, "create", recording)
    return made


def namespace_gone(recorded: Namespace) -> bool:
    """Whether a plane's network namespace and every process in it are gone (its holder too, in user mode; no
    name left in `ip netns list`, in root or sudo mode)."""
    return not recorded.exists() and recorded.pids() == [] and not Namespace("root", recorded.name).exists()


@pytest.fixture(scope="session")
def deployed(lab: Lab) -> Lab:
    """`pulumi up` of the lab stack, once per session; Pulumi's own await decides when it is done."""
    lab.pulumi("up", "--yes", "--skip-preview")
    return lab


def pulumi_json(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(done.stdout)


def resources_by_type(state: dict[str, Any], prefix: str = "kubernetes:") -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for resource in state.get("deployment", {}).get("resources", []):
        if resource["type"].startswith(prefix):
            found.setdefault(resource["type"], []).append(resource)
    return found


def names(items: Sequence[dict[str, Any]]) -> list[str]:
    return sorted(i["metadata"]["name"] for i in items)


def pod_templates(document: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each pod template an object holds, with where it sits: a workload's, a LeaderWorkerSet's leader and worker
    templates, a RayService's (or RayCluster's) head and worker groups'."""
    kind, spec = document.get("kind"), document.get("spec") or {}
    if kind in ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"):
        return [("template", spec["template"])]
    if kind == "CronJob":
        return [("jobTemplate", spec["jobTemplate"]["spec"]["template"])]
    if kind == "LeaderWorkerSet":
        roles = spec["leaderWorkerTemplate"]
        return [(role, roles[role]) for role in ("leaderTemplate", "workerTemplate") if role in roles]
    if kind in ("RayService", "RayCluster"):
        cluster = spec["rayClusterConfig"] if kind == "RayService" else spec
        return [("head", cluster["headGroupSpec"]["template"]),
                *((f"worker group {g['groupName']}", g["template"]) for g in cluster.get("workerGroupSpecs") or [])]
    return []


def refused_as_pod(plane: Plane, document: dict[str, Any], namespace: str) -> list[str]:
    """Each pod template of `document`, created as a Pod in `namespace` in a server-side dry run: what the API server
    refused, and any Pod Security warning it gave. A workload only draws Pod Security's warnings; its pods are what
    the `enforce` level refuses."""
    found = []
    for where, template in pod_templates(document):
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"generateName": "pod-security-", "namespace": namespace,
                            "labels": (template.get("metadata") or {}).get("labels") or {}},
               "spec": template["spec"]}
        done = plane.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
        said = f"{document['kind']} {document['metadata']['name']} ({where}): {done.stderr.strip()}"
        if done.returncode != 0 or "PodSecurity" in done.stderr:
            found.append(said)
    return found
