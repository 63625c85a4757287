"""The drain, measured: the lab stack's `chat` Deployment, as planned, is deleted the way a kubelet deletes its pod,
against the real engine with requests in flight. Its preStop hook (the planned command, run for real) holds the
server while the endpoints are removed; requests arriving then are served. Then SIGTERM, as the kubelet sends it to
the container's first process: vLLM's `--shutdown-timeout` drain. Streams in flight at SIGTERM (long generations)
finish whole; what a new request gets after SIGTERM, and how long the engine takes to exit, are measured and held to
the plan's claim: preStop + the drain fit the pod's grace period, and nothing accepted is cut."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conftest import StackPlan
from dataplane import DataPlane, counter
from engine_tier import eventually
from triarch.local.inside import Answer
from triarch.local.tiny_models import prompt

MODEL = "chat"
STREAMS = 8
"""Long generations in flight at SIGTERM: the tuned max_num_seqs of lab's chat, a full batch."""
STREAM_TOKENS = 4000
"""Each stream's length: about ten seconds of a full batch of the tiny model on two cores (measured 2026-12-06), so
every stream is still generating when SIGTERM comes."""
LATE_REQUESTS = 5
STREAMS_AT = 12
"""Seconds into the 15-second preStop when the streams start: still generating when SIGTERM comes."""
KV_BLOCKS = 2048
"""65,536 tokens of KV cache (blocks of 32): twice the streams' 8 x 4,064, so none is preempted while they drain."""


@dataclass
class Drain:
    pod: dict[str, Any]
    container: dict[str, Any]
    deleted: float = 0.0
    prestop_ended: float = 0.0
    terminated: float = 0.0
    exited: float = 0.0
    exit_code: int | None = None
    during_prestop: list[Answer] = field(default_factory=list)
    streams: list[Answer] = field(default_factory=list)
    running_at_sigterm: float = 0.0
    after_sigterm: list[tuple[float, Answer]] = field(default_factory=list)
    """(seconds after SIGTERM, answer) of new requests sent once SIGTERM was sent."""
    health_after_sigterm: list[tuple[float, Answer]] = field(default_factory=list)
    available: dict[str, int] = field(default_factory=dict)
    """The host's MemAvailable (MiB) at each step: what a stall under memory pressure would show."""
    engine_log: str = ""
    """The last lines the engine wrote, once it exited or the wait for it ended."""

    def context(self) -> str:
        """What a failing assertion adds: the host's memory and the engine's last lines."""
        return f"MemAvailable MiB {self.available}; the engine's last lines:\n{self.engine_log}"


def available_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return -1


def running(plane: DataPlane, url: str) -> float:
    body = plane.client.get(url + "/metrics").body
    return counter(body, "vllm:num_requests_running")


@pytest.fixture(scope="module")
def drain(data_plane: DataPlane, shipped: dict[str, StackPlan]) -> Iterator[Drain]:
    [deployment] = [d for d in shipped["lab"].objects("Deployment") if d["metadata"]["name"] == MODEL]
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    server = data_plane.start(data_plane.command(container, "Qwen/Qwen3-8B", MODEL, kv_blocks=KV_BLOCKS), MODEL)
    measured = Drain(pod, container)
    body = {"model": MODEL, "prompt": prompt(16), "max_tokens": 8}
    try:
        measured.available["deleted"] = available_mib()
        measured.deleted = time.time()  # the pod is deleted: the kubelet runs its preStop hook
        prestop = subprocess.Popen(data_plane.namespace.command(container["lifecycle"]["preStop"]["exec"]["command"]))
        streams: list[Future[Answer]] = []
        arrivals: list[Future[Answer]] = []
        while prestop.poll() is None:
            since = time.time() - measured.deleted
            if len(arrivals) < since:  # one request a second arrives while the endpoints are removed
                arrivals.append(data_plane.client.submit("POST", server.url + "/v1/completions", body, timeout=120))
            if not streams and since > STREAMS_AT:
                streams = [data_plane.client.submit(
                    "POST", server.url + "/v1/completions",
                    {"model": MODEL, "prompt": prompt(64, seed=i), "max_tokens": STREAM_TOKENS, "ignore_eos": True,
                     "stream": True, "stream_options": {"include_usage": True}}, timeout=300, stream=True)
                    for i in range(STREAMS)]
            time.sleep(0.1)
        measured.prestop_ended = time.time()
        if not eventually(lambda: running(data_plane, server.url) == STREAMS, 10, 0.2):
            raise AssertionError(f"the {STREAMS} streams are not all running when preStop ends")
        measured.running_at_sigterm = running(data_plane, server.url)
        measured.available["sigterm"] = available_mib()
        server.terminate()  # the kubelet's SIGTERM, once preStop returned
        measured.terminated = time.time()
        late: list[tuple[float, Future[Answer]]] = []
        while server.process.poll() is None and time.time() - measured.terminated < 120:
            since = time.time() - measured.terminated
            if len(late) < LATE_REQUESTS:
                late.append((since, data_plane.client.submit("POST", server.url + "/v1/completions", body,
                                                             timeout=30)))
                measured.health_after_sigterm.append((since, data_plane.client.get(server.url + "/health",
                                                                                  timeout=5)))
            time.sleep(0.5)
        measured.exit_code = server.process.poll()
        measured.exited = time.time()
        measured.available["exited"] = available_mib()
        measured.engine_log = "\n".join(server.log().splitlines()[-40:])
        measured.during_prestop = [a.result(120) for a in arrivals]
        measured.streams = [s.result(300) for s in streams]
        measured.after_sigterm = [(since, f.result(60)) for since, f in late]
        yield measured
    finally:
        data_plane.stop(server)


def test_prestop_holds_the_server_while_endpoints_go_and_serves_what_arrives(drain: Drain) -> None:
    planned = drain.container["lifecycle"]["preStop"]["exec"]["command"]
    assert planned == ["/bin/sh", "-c", "sleep 15"]
    assert drain.prestop_ended - drain.deleted >= 15
    assert drain.during_prestop and all(a.status == 200 for a in drain.during_prestop), \
        ([a.error or a.status for a in drain.during_prestop], drain.context())


def test_every_stream_in_flight_at_sigterm_finishes_whole(drain: Drain) -> None:
    assert drain.running_at_sigterm == STREAMS
    for stream in drain.streams:
        assert stream.status == 200 and stream.done, (stream.error or stream.body[:200], drain.context())
        assert stream.finish_reason == "length" and stream.tokens == STREAM_TOKENS
        assert stream.ended > drain.terminated  # still generating when SIGTERM came


def test_a_new_request_after_sigterm_is_refused_not_left_waiting(drain: Drain) -> None:
    """Once SIGTERM reached it, the server takes no new work: a late request fails at once, with vLLM 0.32's HTTP
    500 "cannot schedule new futures after shutdown" (a client may retry it elsewhere), instead of hanging until the
    grace period kills the pod. /health still answers 200 while the engine drains: a terminating pod is out of its
    Service's endpoints whatever its readiness, so no new traffic is routed to it by Kubernetes."""
    assert len(drain.after_sigterm) == LATE_REQUESTS
    for since, answer in drain.after_sigterm:
        assert answer.status == 500, f"{since:.1f}s after SIGTERM: {answer.status} {answer.error}"
        assert "cannot schedule new futures after shutdown" in answer.body
        # "at once" against the ~15 s the engine takes to exit: 1.05 s was measured under a loaded CI host
        assert answer.seconds < 5, f"{since:.1f}s after SIGTERM a new request waited {answer.seconds:.1f}s"
    assert [a.status for _, a in drain.health_after_sigterm] == [200] * LATE_REQUESTS


def test_the_engine_exits_within_its_drain_and_the_whole_within_the_grace_period(drain: Drain) -> None:
    args = drain.container["args"]
    shutdown_timeout = int(args[args.index("--shutdown-timeout") + 1])
    grace = drain.pod["terminationGracePeriodSeconds"]
    assert drain.exit_code == 0, (drain.exit_code, drain.context())
    assert drain.exited - drain.terminated <= shutdown_timeout
    assert drain.exited - drain.deleted < grace
    assert max(s.ended for s in drain.streams) <= drain.exited + 1


