"""Ray Serve LLM runs Triarch's serve config: the serveConfigV2 of the prod stack's RayService (chat, a DeepSeek-V2
MLA model behind the prefix-aware router, and qwen) and of the lab stack's (embed, a pooling model), deployed with
`serve deploy` on a one-node Ray 2.60 cluster on the namespace's loopback, as KubeRay PUTs it to a head. Every
LLMConfig runs on vLLM 0.29.0's CPU build (the vLLM Ray 2.60 pins) with the swaps triarch.local.cpu_serving lists
(the model, CPU in place of the accelerator, the engine args no CPU runs); the rest is the plan's, prefix routing,
autoscaling and max_ongoing_requests among it. Each application answers its OpenAI routes behind its route prefix,
and Ray's metrics agent exports the series the plan's dashboard and alerts read for Ray Serve models.

The two stacks' applications go in one config: their names and route prefixes are distinct, and one Ray start
serves both."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import StackPlan
from dataplane import RAY_METRICS_PORT, SERVE_URL, TREE_ACTOR, DataPlane, RayHead, counter, ray_head
from engine_tier import eventually
from prometheus_harness import Prometheus
from triarch.guardrails.workloads import application_llm_configs
from triarch.local.cpu_serving import Replacement, cpu_serve_config
from triarch.local.inside import Answer
from triarch.local.tiny_models import prompt
from triarch.planners.queries import selected_metrics, selectors, shipped_queries
from triarch.planners.ray import PREFIX_ROUTER, imbalance_threshold

STACKS = ("prod", "fresh")
DEPLOY_TIMEOUT = 900
"""Seconds for every application to be RUNNING: each replica's engine starts in its own process, about four minutes
for the five engines on this machine's two idle cores, eight with the suite's planes beside them (measured
2026-12-06)."""
PROMETHEUS_PORT = 9090
EXPORTED_AFTER_REQUESTS: tuple[tuple[str, dict[str, str], int], ...] = (
    ("ray_vllm_request_success_total", {"model_name": "split"}, 2),
    ("ray_vllm_prompt_tokens_by_source_total", {"model_name": "split", "source": "external_kv_transfer"}, 1),
    ("ray_vllm_nixl_bytes_transferred_count", {"model_name": "split"}, 1),
)
"""The agent's counters the tests read once the requests were answered, each with the number of replicas that must
show it: both of the split's roles count their requests (each replica exports on its own cycle, so one can show them
a minute before the other), its decode engine records the last two. Waited for up to EXPORT_TIMEOUT seconds."""
EXPORT_TIMEOUT = 120


def counting_replicas(exposition: str, name: str, **labels: str) -> set[str]:
    """The Ray Serve replicas (ReplicaId) whose samples of a counter in the agent's exposition are above zero."""
    found = {match.group(1) for line in exposition.splitlines() if (match := re.search(r'ReplicaId="([^"]+)"', line))}
    return {replica for replica in found if counter(exposition, name, ReplicaId=replica, **labels) > 0}


def llm_configs(app: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """An application's LLMConfigs, each with where it sits (`chat.llm_configs[0]`, `split.prefill_config`)."""
    return [(f"{app['name']}.{where}", config) for where, config in application_llm_configs(app)]


def planned_serve_config(plan: StackPlan) -> dict[str, Any]:
    [service] = plan.objects("RayService")
    loaded: dict[str, Any] = yaml.safe_load(service["spec"]["serveConfigV2"])
    return loaded


def python_path_files(plan: StackPlan) -> dict[str, str]:
    """The files the plan's Ray containers find on their PYTHONPATH: those of the ConfigMap mounted there, the same in
    each container of each group (checked here); none where no container has a PYTHONPATH."""
    [service] = plan.objects("RayService")
    cluster = service["spec"]["rayClusterConfig"]
    found: set[str | None] = set()
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        spec = group["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        for container in spec["containers"]:
            paths = [e["value"] for e in container["env"] if e["name"] == "PYTHONPATH"]
            mounts = [m["name"] for m in container["volumeMounts"] if m["mountPath"] in paths]
            found.add(volumes[mounts[0]]["configMap"]["name"] if paths and len(mounts) == 1 else None)
    [name] = found
    if name is None:
        return {}
    [config_map] = [c for c in plan.objects("ConfigMap") if c["metadata"]["name"] == name]
    return dict(config_map["data"])


@dataclass
class Served:
    head: RayHead
    planned: dict[str, Any]
    deployed: dict[str, Any]
    replacements: list[Replacement]
    status: dict[str, Any]
    answers: dict[str, Answer] = field(default_factory=dict)
    actors: list[dict[str, Any]] = field(default_factory=list)
    series: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    agent_metrics: str = ""
    """Ray's metrics agent's exposition once the requests were answered."""
    exposition_under_load: str = ""
    """Where a selector stayed empty: Prometheus's last scrape (a line), then the agent's exposition."""
    split_answers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """The split model's role queries (SPLIT_QUERIES) as Prometheus answered them under load."""


@pytest.fixture(scope="module")
def served(data_plane: DataPlane, shipped: dict[str, StackPlan], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Served]:
    planned = {"applications": [app for name in STACKS for app in planned_serve_config(shipped[name])["applications"]]}
    models = {c["model_loading_config"]["model_source"] for a in planned["applications"] for _, c in llm_configs(a)}
    assert len(models) == 3, models  # DeepSeek-V2-Lite, Qwen3-8B, Qwen3-Embedding-0.6B
    deployed, replacements = cpu_serve_config(planned, data_plane.tiny_model)
    mounted = data_plane.work / "python-path"  # the ConfigMap's files, where the pods have them mounted
    mounted.mkdir()
    for name in STACKS:
        for file, text in python_path_files(shipped[name]).items():
            (mounted / file).write_text(text)
    with ray_head(data_plane, mounted) as head:
        head.deploy(deployed, data_plane.work / "serve.yaml")
        names = {a["name"] for a in planned["applications"]}

        def running() -> bool:
            status = head.applications()
            failed = [n for n, a in status.items() if a.get("status") in ("DEPLOY_FAILED", "UNHEALTHY")]
            if failed:
                raise AssertionError(f"{failed} failed: {status[failed[0]].get('message')}\n{head.logs()}")
            return {n for n, a in status.items() if a.get("status") == "RUNNING"} == names

        if not eventually(running, DEPLOY_TIMEOUT, 3):
            raise AssertionError(f"not RUNNING within {DEPLOY_TIMEOUT}s: {head.applications()}\n{head.logs()}")
        seen = Served(head, planned, deployed, replacements, head.applications())
        for app in planned["applications"]:
            name, route = app["name"], app["route_prefix"]
            seen.answers[f"{name} models"] = data_plane.client.get(f"{SERVE_URL}{route}/v1/models", timeout=120)
            if name == "embed":
                seen.answers[f"{name} embeddings"] = data_plane.client.post(
                    f"{SERVE_URL}{route}/v1/embeddings", {"model": name, "input": [prompt(12), prompt(20, 1)]})
            else:
                for _ in range(3):  # more than one, so rates and histograms have something to show
                    seen.answers[f"{name} chat"] = data_plane.client.post(
                        f"{SERVE_URL}{route}/v1/chat/completions",
                        {"model": name, "max_tokens": 16, "messages": [{"role": "user", "content": prompt(40)}]})
                    seen.answers[f"{name} completions"] = data_plane.client.post(
                        f"{SERVE_URL}{route}/v1/completions", {"model": name, "prompt": prompt(40), "max_tokens": 16})

        def exported() -> bool:
            """Ray's agent exports what each engine recorded every few seconds, not at once, and each replica on its
            own cycle: the split's prefill engine can show its requests before the decode engine shows its
            transfers, so wait for every counter the tests read."""
            seen.agent_metrics = data_plane.client.get(f"http://127.0.0.1:{RAY_METRICS_PORT}/metrics").body
            return all(len(counting_replicas(seen.agent_metrics, name, **labels)) >= replicas
                       for name, labels, replicas in EXPORTED_AFTER_REQUESTS)

        eventually(exported, EXPORT_TIMEOUT, 2)
        listed = head.run("ray", "list", "actors", "--format", "json", "--detail", "--limit", "1000",
                          "--address=127.0.0.1:6379", timeout=120)
        seen.actors = json.loads(listed.stdout) if listed.returncode == 0 else []
        seen.series, seen.exposition_under_load, seen.split_answers = scraped_series(
            data_plane, shipped["prod"], data_plane.work / "prometheus", split_queries(shipped["fresh"]))
        yield seen


def ray_queries(plan: StackPlan) -> list[tuple[str, str]]:
    """The plan's queries that read Ray's series (Ray Serve's, and vLLM's through Ray's metrics agent)."""
    [board_map] = [o for o in plan.objects("ConfigMap") if o["metadata"]["name"] == "triarch-layers"]
    board = json.loads(next(iter(board_map["data"].values())))
    return [(where, expr) for where, expr in shipped_queries(plan.objects(), board)
            if any(m.startswith("ray_") for m in selected_metrics(expr))]


GENERATE_UNDER_LOAD = {"chat": 400, "qwen": 400, "split": 32}
"""prod's generate models, kept busy while Prometheus is asked for their gauges, and fresh's split, asked for its
roles' series; each with the tokens a request of it generates."""
SPLIT_PANELS = {"prefill": ("split (prefill): time to first token and between tokens", "TTFT p90"),
                "decode": ("split (decode): time to first token and between tokens", "TTFT p90"),
                "client": ("split: KV transfer time and the first token", "TTFT p90, prefill + decode (estimate)")}
"""The fresh dashboard's targets (panel, legend) that read the split's roles apart, and the client's estimate."""


def split_queries(plan: StackPlan) -> dict[str, str]:
    """The plan's queries of SPLIT_QUERIES, and for each role the series its TTFT query keeps (the vector inside
    its `sum by (le)`), counted per replica: the replicas the plan takes for that role's."""
    [board_map] = [o for o in plan.objects("ConfigMap") if o["metadata"]["name"] == "triarch-layers"]
    board = json.loads(next(iter(board_map["data"].values())))
    targets = {(p["title"], t["legendFormat"]): t["expr"] for p in board["panels"] for t in p.get("targets", [])}
    queries = {name: targets[where] for name, where in SPLIT_PANELS.items()}
    for role in ("prefill", "decode"):
        inner = queries[role].removeprefix("histogram_quantile(0.9, sum by (le) (").removesuffix("))")
        assert inner != queries[role] and "rate(" in inner, queries[role]
        queries[f"{role} replicas"] = f"count by (ReplicaId) ({inner})"
    return queries
EXPORTED_ON_EVENT = {"ray_vllm_num_preemptions_total": "vLLM's preemption counter reaches Ray's metrics agent at a "
                                                       "replica's first preemption (the agent exports what was "
                                                       "recorded; plain vLLM's prometheus_client exports a 0)"}
"""Ray series absent until what they count happens, with why; each is held absent here only where vLLM's own
counter says it did not happen."""


def numbers(result: list[dict[str, Any]]) -> bool:
    """Whether an instant query's result has samples, none of them NaN (a quantile of a rate with no increase yet:
    the split's requests reach a role's histogram, and then Ray's agent, seconds apart)."""
    return bool(result) and all(sample["value"][1] != "NaN" for sample in result)


def scraped_series(plane: DataPlane, plan: StackPlan, work: Path, also: dict[str, str]
                   ) -> tuple[dict[str, list[dict[str, Any]]], str, dict[str, list[dict[str, Any]]]]:
    """Prometheus scraping Ray's metrics agent as prometheus-operator scrapes the plan's `ray` PodMonitor (a port
    number on each Ray pod, here the one node): each Ray selector of the plan's queries, asked while the generate
    models serve a load, for its last sample in the window (Ray 2.60's agent drops a gauge not refreshed within two
    export intervals, open_telemetry_metric_recorder.py, so on a loaded host a gauge can come and go between scrapes
    and an instant query at the wrong moment finds it stale); and, if a selector stayed empty, Prometheus's last
    scrape and the agent's exposition, to say why; and what Prometheus answers to each query `also` names, asked
    until each answers."""
    [monitor] = [m for m in plan.objects("PodMonitor") if m["metadata"]["name"] == "ray"]
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    # Scrapes time out at the interval: under a loaded CI host the agent's exposition took longer than 1 s to serve.
    prometheus = Prometheus(plane.inside(), plane.client, work, PROMETHEUS_PORT, interval="3s")

    def more_load(name: str) -> list[Any]:
        return [plane.client.submit("POST", f"{SERVE_URL}/{name}/v1/completions",
                                    {"model": name, "prompt": prompt(200, seed=i), "max_tokens": GENERATE_UNDER_LOAD[
                                        name], "ignore_eos": True}, timeout=600)
                for i in range(12 if GENERATE_UNDER_LOAD[name] > 100 else 4)]

    load = {name: more_load(name) for name in GENERATE_UNDER_LOAD}
    try:
        prometheus.scrape([{"targets": [f"127.0.0.1:{endpoint['portNumber']}"], "labels": {
            "namespace": monitor["metadata"]["namespace"], "pod": "llm-head-x7k2q", "container": "ray-head",
            "job": f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}",
            "__metrics_path__": endpoint["path"]}}])
        wanted = {s for _, expr in ray_queries(plan) for s in selectors(expr) if s.split("{")[0].startswith("ray_")}
        found: dict[str, list[dict[str, Any]]] = {}
        answers: dict[str, list[dict[str, Any]]] = {}

        def answered() -> bool:
            for name, futures in load.items():  # each model stays busy until every gauge was seen: one that
                if all(f.done() for f in futures):  # finished its batch first idles, and its gauges go
                    futures.extend(more_load(name))
            for selector in wanted - {k for k, v in found.items() if v}:
                found[selector] = prometheus.query(f"last_over_time({selector}[10m])")
            for name, query in also.items():
                if not numbers(answers.get(name, [])):
                    answers[name] = prometheus.query(query)
            return (all(found.get(s) for s in wanted if s.split("{")[0] not in EXPORTED_ON_EVENT)
                    and all(numbers(answers.get(name, [])) for name in also))

        if eventually(answered, 120, 2):
            return found, "", answers
        scrapes = [(s["metric"]["__name__"], s["value"][1]) for s in prometheus.query(
            '{__name__=~"up|scrape_duration_seconds|scrape_samples_scraped"}')]
        exposition = plane.client.get(f"http://127.0.0.1:{RAY_METRICS_PORT}/metrics").body
        return found, f"Prometheus's last scrape: {scrapes}\n{exposition}", answers
    finally:
        for futures in load.values():  # what is still generating once every gauge was seen is no longer needed
            for future in futures:
                plane.client.cancel(future)
        for futures in load.values():
            for future in futures:
                future.result(600)
        prometheus.stop()


def test_every_application_of_the_plans_serve_config_runs(served: Served) -> None:
    assert {n: a["status"] for n, a in served.status.items()} == {"chat": "RUNNING", "qwen": "RUNNING",
                                                                  "embed": "RUNNING", "split": "RUNNING"}


def test_each_model_answers_its_openai_routes_behind_its_route_prefix(served: Served) -> None:
    for app in served.planned["applications"]:
        name = app["name"]
        models = served.answers[f"{name} models"]
        assert models.status == 200 and [m["id"] for m in models.json()["data"]] == [name], models.body[:300]
        if name == "embed":
            answer = served.answers["embed embeddings"]
            assert answer.status == 200, answer.body[:300]
            assert len(answer.json()["data"]) == 2
        else:
            for route in ("chat", "completions"):
                answer = served.answers[f"{name} {route}"]
                assert answer.status == 200, answer.body[:300]
                assert answer.json()["usage"]["completion_tokens"] == 16


def test_the_deployed_config_is_the_plans_but_for_the_listed_swaps(served: Served) -> None:
    """Every field of every LLMConfig is the plan's, except those a replacement names; the deployment options
    (the prefix-aware router and its kwargs, autoscaling, max_ongoing_requests) reach Serve as planned."""
    named = {r.what for r in served.replacements}
    for planned_app, deployed_app in zip(served.planned["applications"], served.deployed["applications"], strict=True):
        assert {k: v for k, v in planned_app.items() if k != "args"} == {
            k: v for k, v in deployed_app.items() if k != "args"}
        for (where, planned), (_, deployed) in zip(llm_configs(planned_app), llm_configs(deployed_app), strict=True):
            assert planned["deployment_config"] == deployed["deployment_config"]
            assert planned.get("experimental_configs") == deployed.get("experimental_configs")
            for key, value in planned["engine_kwargs"].items():
                if f"{where}.engine_kwargs.{key}" not in named:
                    assert deployed["engine_kwargs"][key] == value, f"{where}: {key}"
            added = set(deployed["engine_kwargs"]) - set(planned["engine_kwargs"])
            assert {f"{where}.engine_kwargs.{k}" for k in added} <= named


def test_the_prefix_aware_router_with_triarchs_settings_routes_the_requests(served: Served) -> None:
    """The router class the plan names is Ray's (its tree actor exists, one per routed deployment), and requests
    through it were answered (above)."""
    routers = {a["name"]: {c["deployment_config"].get("request_router_config", {}).get("request_router_class")
                           for _, c in llm_configs(a)} for a in served.planned["applications"]}
    routed = [name for name, classes in routers.items() if PREFIX_ROUTER in classes]
    assert sorted(routed) == ["chat", "qwen"]
    trees = [a for a in served.actors if a.get("name") == TREE_ACTOR and a.get("state") == "ALIVE"]
    assert sorted(a["ray_namespace"].split("::")[1] for a in trees) == ["chat", "qwen"], served.actors[:3]


def test_where_the_prefix_tree_actor_lands(served: Served) -> None:
    """The open risk, answered on Ray 2.60: the tree actor is detached, asks one CPU to be placed (none while it
    runs) and is never restarted (max_restarts 0). On Triarch's cluster the head offers no CPUs (num-cpus 0), so it
    lands on a GPU worker, and if that node goes, requests through the router wait on a dead actor (issue 47)."""
    [tree] = [a for a in served.actors if a.get("name") == TREE_ACTOR and "::chat::" in a.get("ray_namespace", "")]
    assert tree["is_detached"] is True
    assert tree.get("required_resources") in ({}, {"CPU": 1.0}), tree.get("required_resources")
    assert tree.get("num_restarts") in (0, "0", None)


def test_rays_metrics_carry_every_series_the_plan_reads_for_ray_serve_models(served: Served) -> None:
    """Each Ray selector of prod's alerts and dashboard (ray_vllm_* through Ray's metrics agent, ray_serve_*)
    returns samples from the real agent under load, with the labels the plan's queries match on; a series exported
    only once its event happens is absent only where vLLM's own count of it is zero."""
    assert served.series, "no Ray selector in prod's queries"
    empty = [s for s, result in served.series.items() if not result and s.split("{")[0] not in EXPORTED_ON_EVENT]
    names = {s.split("{")[0] for s in empty}
    lines = served.exposition_under_load.splitlines()
    exported = [line for line in lines[1:] if line.split("{")[0] in names]
    assert not empty, f"{empty}; {lines[0] if lines else ''}; the agent exported: {exported or 'none of them'}"
    for selector, result in served.series.items():
        if not result:
            assert "ray_vllm_num_preemptions" not in served.agent_metrics, selector


def test_the_split_model_moves_each_prompts_kv_cache_from_prefill_to_decode_over_nixl(served: Served) -> None:
    """fresh's `split`: the plan's kv_transfer_config (NixlConnector, kv_producer on prefill, kv_consumer on decode,
    backends [UCX]: its pool has no EFA) runs as planned on vLLM 0.29.0's CPU build (NIXL's CPU path: vllm
    distributed/kv_transfer/kv_connector/v1/nixl/utils.py lists "cpu"). The decode engine took its prompts' tokens
    from the KV transfer, not from its own compute, and NIXL moved bytes."""
    [app] = [a for a in served.planned["applications"] if a["name"] == "split"]
    planned = {role: app["args"][f"{role}_config"]["engine_kwargs"]["kv_transfer_config"] for role in ("prefill",
                                                                                                        "decode")}
    assert planned["prefill"]["kv_role"] == "kv_producer" and planned["decode"]["kv_role"] == "kv_consumer"
    assert {tuple(c["kv_connector_extra_config"]["backends"]) for c in planned.values()} == {("UCX",)}
    metrics = served.agent_metrics
    assert counter(metrics, "ray_vllm_prompt_tokens_by_source_total", model_name="split",
                   source="external_kv_transfer") > 0
    assert counter(metrics, "ray_vllm_nixl_bytes_transferred_count", model_name="split") > 0


def test_the_split_models_roles_are_measured_apart(served: Served) -> None:
    """fresh's dashboard reads the split's roles apart on Ray 2.60's real series (issue 47, item 8): both roles'
    engines label theirs `model_name="split"`, and each role's time-to-first-token query keeps one replica's, not the
    other role's. The replica it takes for decode is the one whose engine read KV caches over NIXL (a consumer
    records the transfers), the one it takes for prefill is not; each role's p90 and the client's estimate (their
    sum) are numbers."""
    answers = served.split_answers
    replicas = {role: {a["metric"].get("ReplicaId") for a in answers.get(f"{role} replicas", [])}
                for role in ("prefill", "decode")}
    assert all(len(found) == 1 for found in replicas.values()), (replicas, served.exposition_under_load[:300])
    [prefill], [decode] = replicas["prefill"], replicas["decode"]
    assert prefill != decode
    assert counter(served.agent_metrics, "ray_vllm_nixl_bytes_transferred_count", ReplicaId=decode) > 0
    assert counter(served.agent_metrics, "ray_vllm_nixl_bytes_transferred_count", ReplicaId=prefill) == 0
    assert counter(served.agent_metrics, "ray_vllm_request_success_total", ReplicaId=prefill) > 0
    p90s = {name: [float(a["value"][1]) for a in answers.get(name, [])] for name in ("prefill", "decode", "client")}
    assert all(len(v) == 1 and 0 < v[0] < float("inf") for v in p90s.values()), p90s


IMAGE = "data:image/png;base64,iVBORw0KGgo="
UNREADABLE = {
    "token ids": ("/v1/completions", {"model": "chat", "prompt": [5, 6, 7, 8, 9, 10, 11, 12], "max_tokens": 4}),
    "an image alone": ("/v1/chat/completions", {"model": "chat", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": IMAGE}}]}]}),
    "detokenize": ("/detokenize", {"model": "chat", "tokens": [5, 6, 7]}),
    "score": ("/v1/score", {"model": "chat", "text_1": "alpha", "text_2": "beta"}),
}
"""Requests behind prod's prefix-routed `chat` that carry no text to match: Ray 2.60's own router divides by the empty
text of the first two and raises on the others, and each waited for the client's timeout (issue 47, item 5)."""
ANSWER_WITHIN = 60
"""Seconds a request gets here; a model's answer takes about one on these cores."""


def route(served: Served, app: str) -> str:
    [found] = [a["route_prefix"] for a in served.planned["applications"] if a["name"] == app]
    return f"{SERVE_URL}{found}"


def test_requests_the_router_cannot_read_as_text_are_answered(served: Served) -> None:
    """Triarch's router routes them by load, and each gets an answer: the token ids are completed; the image (the
    model reads none) and the score (a generate model scores nothing) are refused by the engine. So is /detokenize,
    by Ray Serve LLM 2.60 whatever the router: it reads vLLM's tokenization handler as `openai_serving_tokenization`,
    which vLLM 0.29 names `serving_tokenization` (ray/llm/.../vllm_engine.py; vllm/entrypoints/launchers/api_server/
    app_state.py), so /tokenize and /detokenize answer 400 on every Ray Serve model."""
    client = served.head.plane.client
    answers = {what: client.post(route(served, "chat") + path, body, timeout=ANSWER_WITHIN)
               for what, (path, body) in UNREADABLE.items()}
    got = {what: (a.status, a.error or a.body[:300]) for what, a in answers.items()}
    assert all(a.status is not None for a in answers.values()), got  # none left waiting for the client's timeout
    assert answers["token ids"].status == 200, got
    assert json.loads(answers["token ids"].body)["usage"]["prompt_tokens"] == 8, got
    assert all(400 <= int(a.status or 0) < 500 for w, a in answers.items() if w != "token ids"), got
    assert "'tokenization' task" in answers["detokenize"].body, got


def tree_actors(head: RayHead, app: str) -> list[dict[str, Any]]:
    listed = head.run("ray", "list", "actors", "--format", "json", "--detail", "--limit", "1000",
                      "--address=127.0.0.1:6379", "--filter", f"name={TREE_ACTOR}", timeout=120)
    assert listed.returncode == 0, listed.stderr[-1500:]
    return [a for a in json.loads(listed.stdout) if f"::{app}::" in a.get("ray_namespace", "")]


def in_actor(head: RayHead, namespace: str, statement: str) -> str:
    """Run `statement` in a driver of the cluster, with the tree actor of `namespace` as `tree`: its last line out."""
    script = ("import json, ray, sys; ray.init(address='127.0.0.1:6379', namespace=sys.argv[1], "
              "logging_level='ERROR'); tree = ray.get_actor(sys.argv[2]); " + statement)
    done = head.run("python", "-c", script, namespace, TREE_ACTOR, timeout=120)
    assert done.returncode == 0, done.stderr[-1500:]
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def test_routing_by_prefix_goes_on_after_the_prefix_tree_actor_is_lost(served: Served) -> None:
    """The tree actor killed, as its node going would (Ray's router then keeps a dead handle and every request
    through it waits): requests are answered, a new tree actor takes the name with chat's replicas, and the
    prompts routed since are remembered in it, so routing by prefix resumed (issue 47, item 4)."""
    [before] = [a for a in tree_actors(served.head, "chat") if a["state"] == "ALIVE"]
    in_actor(served.head, before["ray_namespace"], "ray.kill(tree); print('killed')")
    client = served.head.plane.client
    text = prompt(40, seed=11)
    answers = [client.post(route(served, "chat") + "/v1/chat/completions", {
        "model": "chat", "max_tokens": 4, "messages": [{"role": "user", "content": text}]}, timeout=ANSWER_WITHIN)
        for _ in range(3)]
    assert [a.status for a in answers] == [200, 200, 200], [a.error or a.body[:200] for a in answers]
    [after] = [a for a in tree_actors(served.head, "chat") if a["state"] == "ALIVE"]
    assert after["actor_id"] != before["actor_id"]
    remembered = json.loads(in_actor(served.head, after["ray_namespace"],
                                     "print(json.dumps(ray.get(tree.getattr.remote('tenant_to_char_count'))))"))
    replicas = [a for a in served.actors if str(a.get("class_name")).startswith("ServeReplica:chat:LLMServer")
                and a.get("state") == "ALIVE"]
    assert len(remembered) == len(replicas) >= 1, (remembered, [a.get("class_name") for a in served.actors])
    assert sum(remembered.values()) >= len(text), remembered


BALANCE_PROBE = Path(__file__).parent / "ray_balance_probe.py"
BATCHES = (1, 4)
ANSWERED = re.compile(r"^answered per replica at batch (\d+): (\[.*\])$", re.MULTILINE)
"""The probe's line of counts for a batch (Ray may print its workers' logs on the driver's output around it)."""


@pytest.fixture(scope="module")
def balanced(served: Served) -> dict[int, list[int]]:
    """What each batch's two replicas answered: one run of the probe for every batch, side by side."""
    done = served.head.run("python", str(BALANCE_PROBE), "balance", PREFIX_ROUTER, "8",
                           *[f"{batch}:{imbalance_threshold(batch)}" for batch in BATCHES], timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = {int(batch): json.loads(counts) for batch, counts in ANSWERED.findall(done.stdout)}
    assert set(found) == set(BATCHES), done.stdout[-2000:]
    return found


@pytest.mark.parametrize("batch", BATCHES)
def test_the_prefix_router_balances_one_hot_prompt_at_every_batch(balanced: dict[int, list[int]], batch: int) -> None:
    """Two replicas that take `batch` requests at once (a role's max_ongoing_requests, its max_num_seqs) and hold each
    for a second, behind Triarch's router with Triarch's default threshold for that batch, sent 8 requests of one
    prompt at once: both replicas answer half (issue 47, item 7). Measured on this cluster (2026-12-06), with the
    threshold half a batch rounded up to 1 at batch 1 (Triarch's before) and with Ray's default (never balance) at
    batch 4, one replica answered all 8 while the other idled."""
    answered = balanced[batch]
    assert len(answered) == 2 and min(answered) >= 3, answered
