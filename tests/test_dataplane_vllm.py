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

from conftest import STACK_NAMES, StackPlan, plan_config, stack_document
from dataplane import DataPlane
from triarch.local.cpu_serving import CpuCommand, EngineFailed
from triarch.local.inside import Answer
from triarch.local.tiny_models import SHRUNK, make_adapter, prompt

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


# --- LoRA adapters (issue 52) ---------------------------------------------------------------------------------------

ADAPTERS = {"support": 8, "legal": 16}
"""lab's chat with two Hub adapters, by name and rank: two slots of rank 16 (planners/adapters.py)."""
ADAPTER_REVISION = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class AdapterRun:
    work: Workload
    command: CpuCommand
    models: Answer
    answers: dict[str, Answer]
    """Served name -> a greedy completion of the same prompt, with its tokens' log-probabilities."""
    unknown: Answer
    metrics: str


@pytest.fixture(scope="module")
def adapter_run(data_plane: DataPlane, tmp_path_factory: pytest.TempPathFactory) -> AdapterRun:
    """lab's chat planned with two Hub adapters and started from its planned container, each adapter a tiny one
    Triarch makes for the tiny model in place of what the pod's init container fetches; one greedy completion of the
    same prompt from the base model and from each adapter."""
    config = stack_document("lab")
    [chat] = [m for m in config["triarch:models"] if m["name"] == "chat"]
    chat["adapters"] = [{"name": name, "rank": rank, "hub": {"id": f"my-org/{name}-lora", "revision": ADAPTER_REVISION}}
                        for name, rank in ADAPTERS.items()]
    work = workload(plan_config("adapters", config, tmp_path_factory.mktemp("adapters-plan")), "chat")
    tiny = data_plane.tiny_model("Qwen/Qwen3-8B")
    made = {name: make_adapter(tiny, data_plane.work / "adapters" / name, rank, seed)
            for seed, (name, rank) in enumerate(ADAPTERS.items())}
    command = data_plane.command(work.leader, "Qwen/Qwen3-8B", "adapters", adapters=made)
    server = data_plane.start(command, "adapters")
    try:
        body = {"prompt": prompt(24), "max_tokens": 8, "temperature": 0, "logprobs": 1}
        answers = {name: data_plane.post(server, "/v1/completions", {**body, "model": name})
                   for name in ("chat", *ADAPTERS)}
        unknown = data_plane.post(server, "/v1/completions", {**body, "model": "not-loaded"})
        return AdapterRun(work, command, data_plane.client.get(server.url + "/v1/models"), answers, unknown,
                          data_plane.client.get(server.url + "/metrics").body)
    finally:
        data_plane.stop(server)


def test_each_adapter_serves_under_its_name_beside_the_base_model(adapter_run: AdapterRun) -> None:
    """/v1/models lists the base model and each adapter with the base as its parent; a completion asked of an
    adapter answers under its name."""
    cards = {card["id"]: card for card in adapter_run.models.json()["data"]}
    assert set(cards) == {"chat", *ADAPTERS}
    assert {name: cards[name]["parent"] for name in ADAPTERS} == {name: "chat" for name in ADAPTERS}
    for name, answer in adapter_run.answers.items():
        assert answer.status == 200, answer.body
        assert answer.json()["model"] == name
        assert answer.json()["usage"]["completion_tokens"] == 8


def test_an_adapter_changes_what_the_model_answers(adapter_run: AdapterRun) -> None:
    """The same greedy request gives other log-probabilities under each adapter than under the base model and the
    other adapter: the adapter's weights are applied, not only its name accepted. The random model's logits are
    nearly flat (vLLM's dummy weights), so the differences are in the sixth decimal, exact floats compared: a request
    that ran without its adapter would give the base model's to the bit."""
    def logprobs(name: str) -> list[float]:
        return list(adapter_run.answers[name].json()["choices"][0]["logprobs"]["token_logprobs"])

    seen = {name: logprobs(name) for name in adapter_run.answers}
    assert len({tuple(v) for v in seen.values()}) == len(seen), seen


def test_a_name_no_adapter_has_is_refused_by_the_engine(adapter_run: AdapterRun) -> None:
    assert adapter_run.unknown.status == 404, adapter_run.unknown.body
    assert "not-loaded" in adapter_run.unknown.body


def test_the_adapters_run_with_the_planned_slots_as_the_picker_reads_them(adapter_run: AdapterRun) -> None:
    """The engine took the planned --max-loras and --max-lora-rank as they are (no replacement touches them) and
    loaded each adapter from the path --lora-modules names, the planned one but for the fetch; it reports its slots
    in vllm:lora_requests_info{max_lora}, and each adapter it ran in running_lora_adapters: what the endpoint
    picker's lora-affinity-scorer reads."""
    args = adapter_run.work.leader["args"]
    slots = args[args.index("--max-loras") + 1]
    assert (slots, args[args.index("--max-lora-rank") + 1]) == ("2", "16")
    replaced = {r.what: (r.planned, r.used) for r in adapter_run.command.replacements if "lora" in r.what}
    assert set(replaced) == {f"--lora-modules {name}" for name in ADAPTERS}
    assert {what: planned for what, (planned, _) in replaced.items()} == {
        f"--lora-modules {name}": f"/models/adapters/{name}" for name in ADAPTERS}
    series = [line for line in adapter_run.metrics.splitlines() if line.startswith("vllm:lora_requests_info{")]
    assert series and all(f'max_lora="{slots}"' in line for line in series), series
    running = {line.split('running_lora_adapters="', 1)[1].split('"', 1)[0] for line in series}
    assert set(ADAPTERS) <= running, f"each adapter seen running by the engine's own gauge: {series}"
