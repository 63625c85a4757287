"""vLLM runs what Triarch planned: every plain vLLM model of every shipped stack, its container's command and args read
from the Deployment or LeaderWorkerSet the plan wrote, starts the real engine (vLLM's CPU build closest to the pinned
image's release, tools/dataplane) on a tiny model of the same architecture, with only the replacements
triarch.local.cpu_serving lists; a flag the engine refuses fails the start with the engine's own line. The planned
probes answer on their paths and ports, and the OpenAI routes the model serves answer.

Models whose planned containers are identical (the embedding model of dev and prod) share one start. A model that
spans nodes starts as its LeaderWorkerSet's group does: the leader and a headless worker, each with what
LeaderWorkerSet's webhook sets (LWS_LEADER_ADDRESS, LWS_WORKER_INDEX), meeting on the namespace's loopback."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from conftest import STACK_NAMES, StackPlan, stack_document
from dataplane import DataPlane
from triarch.local.cpu_serving import CpuCommand, EngineFailed
from triarch.local.inside import Answer
from triarch.local.tiny_models import SHRUNK, prompt

PLAIN_VLLM = [(stack, model["name"]) for stack in STACK_NAMES
              for model in stack_document(stack).get("triarch:models", []) if model["engine"] == "vllm"]
"""Every plain vLLM model the shipped stacks serve, as (stack, model name)."""
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
LWS_LEADER = "127.0.0.1"
"""The leader's address LeaderWorkerSet's webhook would give the group (LWS_LEADER_ADDRESS): here the namespace's
loopback, where the leader listens."""


@dataclass
class Workload:
    """A model's planned serving containers: the Deployment's, or a LeaderWorkerSet's leader and worker."""

    kind: str
    leader: dict[str, Any]
    worker: dict[str, Any] | None
    group_size: int = 1

    def key(self) -> str:
        return json.dumps([self.leader, self.worker], sort_keys=True)


def workload(plan: StackPlan, name: str) -> Workload:
    for document in plan.objects("Deployment"):
        if document["metadata"]["name"] == name:
            [container] = [c for c in document["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
            return Workload("Deployment", container, None)
    for document in plan.objects("LeaderWorkerSet"):
        if document["metadata"]["name"] == name:
            template = document["spec"]["leaderWorkerTemplate"]
            [leader] = template["leaderTemplate"]["spec"]["containers"]
            [worker] = template["workerTemplate"]["spec"]["containers"]
            return Workload("LeaderWorkerSet", leader, worker, int(template["size"]))
    raise AssertionError(f"no Deployment or LeaderWorkerSet named {name} in the {plan.name} plan")


def hub_model(stack: str, name: str) -> str:
    [model] = [m for m in stack_document(stack)["triarch:models"] if m["name"] == name]
    return str(model["model"])


@dataclass
class Served:
    """What one start of a planned workload gave."""

    commands: list[CpuCommand]
    seconds: float | None = None
    failure: str | None = None
    probes: dict[str, tuple[int | None, float]] = field(default_factory=dict)
    """probe -> (status, seconds) of its HTTP GET on its path and port, once the engine was up."""
    answers: dict[str, Answer] = field(default_factory=dict)


RUNS: dict[str, Served] = {}
"""Starts made in this module, by workload (identical containers start once)."""


def probe_port(container: dict[str, Any], probe: dict[str, Any]) -> int:
    """A probe's port as the kubelet resolves it: a number, or the name of one of the container's ports."""
    port = probe["httpGet"]["port"]
    if isinstance(port, int):
        return port
    [number] = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
    return int(number)


def serve(plane: DataPlane, stack: str, name: str, work: Workload) -> Served:
    model = hub_model(stack, name)
    label = f"{stack}-{name}"
    if work.worker is None:
        commands = [plane.command(work.leader, model, label)]
    else:
        group = {"LWS_LEADER_ADDRESS": LWS_LEADER, "LWS_GROUP_SIZE": str(work.group_size)}
        commands = [plane.command(work.leader, model, label, pod_env={**group, "LWS_WORKER_INDEX": "0"}),
                    *(plane.command(work.worker, model, f"{label}-{i}", pod_env={**group, "LWS_WORKER_INDEX": str(i)})
                      for i in range(1, work.group_size))]
    served = Served(commands)
    workers = [plane.start(c, f"{label}-{i}", healthy=False) for i, c in enumerate(commands[1:], 1)]
    try:
        leader = plane.start(commands[0], label)
        served.seconds = leader.wait_healthy(lambda: True, 1)
        for kind in PROBES:
            probe = work.leader[kind]
            port = probe_port(work.leader, probe)
            answer = plane.client.get(f"http://127.0.0.1:{port}{probe['httpGet']['path']}",
                                      timeout=probe["timeoutSeconds"])
            served.probes[kind] = (answer.status, answer.seconds)
        served.answers["models"] = plane.client.get(leader.url + "/v1/models")
        if "--runner" in commands[0].argv and "pooling" in commands[0].argv:
            served.answers["embeddings"] = plane.post(leader, "/v1/embeddings",
                                                      {"model": name, "input": [prompt(12), prompt(30, 1)]})
        else:
            served.answers["completions"] = plane.post(leader, "/v1/completions",
                                                       {"model": name, "prompt": prompt(24), "max_tokens": 16})
            served.answers["chat"] = plane.post(leader, "/v1/chat/completions", {
                "model": name, "max_tokens": 16, "messages": [{"role": "user", "content": prompt(10)}]})
        plane.stop(leader)
    except EngineFailed as failure:
        served.failure = str(failure)
    finally:
        for worker in workers:
            plane.stop(worker)
    return served


@pytest.fixture
def served(request: pytest.FixtureRequest, data_plane: DataPlane, shipped: dict[str, StackPlan]
           ) -> tuple[Workload, Served]:
    stack, name = request.param
    work = workload(shipped[stack], name)
    if work.key() not in RUNS:
        RUNS[work.key()] = serve(data_plane, stack, name, work)
    return work, RUNS[work.key()]


@pytest.mark.parametrize("served", PLAIN_VLLM, indirect=True, ids=[f"{s}-{m}" for s, m in PLAIN_VLLM])
def test_the_planned_container_starts_the_engine_and_serves(served: tuple[Workload, Served]) -> None:
    work, run = served
    assert run.failure is None, run.failure
    [model] = [m["id"] for m in run.answers["models"].json()["data"]]
    served_name = work.leader["args"][work.leader["args"].index("--served-model-name") + 1]
    assert model == served_name
    if "embeddings" in run.answers:
        vectors = [d["embedding"] for d in run.answers["embeddings"].json()["data"]]
        assert [len(v) for v in vectors] == [SHRUNK["hidden_size"]] * 2  # one vector per input, the model's width
    else:
        for route in ("completions", "chat"):
            answer = run.answers[route]
            assert answer.status == 200, answer.body
            [choice] = answer.json()["choices"]
            assert choice["finish_reason"] == "length"
            assert answer.json()["usage"]["completion_tokens"] == 16


@pytest.mark.parametrize("served", PLAIN_VLLM, indirect=True, ids=[f"{s}-{m}" for s, m in PLAIN_VLLM])
def test_the_planned_probes_answer_on_their_paths_and_ports(served: tuple[Workload, Served]) -> None:
    """Each probe's GET, on the port its name resolves to, answers 200 within its timeout once the engine is up,
    and the startup probe's budget (failureThreshold x periodSeconds) covers the measured start."""
    work, run = served
    assert run.failure is None, run.failure
    for kind in PROBES:
        status, seconds = run.probes[kind]
        assert status == 200, f"{kind}: {status}"
        assert seconds < work.leader[kind]["timeoutSeconds"]
    startup = work.leader["startupProbe"]
    assert run.seconds is not None and run.seconds < startup["failureThreshold"] * startup["periodSeconds"]


@pytest.mark.parametrize("served", PLAIN_VLLM, indirect=True, ids=[f"{s}-{m}" for s, m in PLAIN_VLLM])
def test_every_planned_argument_reaches_the_engine_unless_replaced(served: tuple[Workload, Served]) -> None:
    """The engine's argv holds every planned flag with its planned value, but for the flags the replacements name;
    the model is the first argument (as `vllm serve MODEL` takes it)."""
    work, run = served
    replaced = {r.what for r in run.commands[0].replacements}
    planned = work.leader["args"]
    argv = run.commands[0].argv[run.commands[0].argv.index("serve") + 1:]
    for at, arg in enumerate(planned[1:], 1):
        if not arg.startswith("--") or arg in replaced:
            continue
        value = planned[at + 1] if at + 1 < len(planned) and not planned[at + 1].startswith("--") else None
        assert arg in argv, f"{arg} planned but not passed"
        if value is not None and "$(" not in value:
            assert argv[argv.index(arg) + 1] == value, f"{arg} {value} planned, {argv[argv.index(arg) + 1]} passed"


def test_a_flag_the_engine_refuses_fails_the_start_with_its_own_line(data_plane: DataPlane,
                                                                    shipped: dict[str, StackPlan]) -> None:
    """`--swap-space`, which the source article recommends, is gone from vLLM: the engine's own parser refuses it,
    and the start fails with that one line."""
    container = json.loads(json.dumps(workload(shipped["lab"], "chat").leader))
    container["args"] += ["--swap-space", "4"]
    with pytest.raises(EngineFailed) as refused:
        data_plane.start(data_plane.command(container, "Qwen/Qwen3-8B", "refused-flag"), "refused-flag")
    line = str(refused.value)
    assert "\n" not in line
    assert "unrecognized arguments: --swap-space 4" in line, line


def test_a_context_longer_than_the_model_holds_fails_with_the_engines_reason(data_plane: DataPlane,
                                                                            shipped: dict[str, StackPlan]) -> None:
    """Qwen3-8B holds 40,960 tokens (max_position_embeddings, kept in the tiny model): vLLM refuses a longer
    --max-model-len at start, in one line naming it."""
    container = json.loads(json.dumps(workload(shipped["lab"], "chat").leader))
    args = container["args"]
    args[args.index("--max-model-len") + 1] = "65536"
    with pytest.raises(EngineFailed) as refused:
        data_plane.start(data_plane.command(container, "Qwen/Qwen3-8B", "too-long"), "too-long")
    line = str(refused.value)
    assert "\n" not in line
    assert "max_model_len" in line.lower() or "max-model-len" in line.lower(), line
    assert "40960" in line, line
