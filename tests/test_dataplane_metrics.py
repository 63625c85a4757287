"""The metrics are the engine's: a real Prometheus scrapes a real vLLM engine started from the `fresh` stack's `chat`
Deployment (with a first-token SLO set, so every alert a plain vLLM model can have is planned). The Deployment, its
PodMonitors and PrometheusRule run on a plane of their own: the engine listens on the address kwok gave the
Deployment's pod, and a real Prometheus Operator (0.93.1) turns the monitors and the rule into the configuration and
rule files of a Prometheus resource selecting as kube-prometheus-stack's does; Prometheus runs them, discovering the
pod through the plane's API server. Under a load that overflows the tuned batch and fills a capped KV cache, every
query Triarch ships for the model (its alerts, its KEDA triggers, its dashboard panels) returns samples; the queue and
KV-cache alerts fire and, once the load ends, resolve.

What cannot be real here, and stands in: the GPU. The queue alert joins vLLM's queue with the DCGM exporter's GPU
utilisation (`and on() avg(DCGM_FI_DEV_GPU_UTIL{...}) < 50`); with no GPU there is no exporter, so a fixed
exposition, scraped by a static job added to the operator's configuration, says the model's pod's GPU is idle
(`dcgm_stand_in`). The `for` of every alert is held to 0 s: the planned minutes are Prometheus's to count
(tests/test_alert_rules.py holds each rule's duration with promtool)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import STACK_NAMES, StackPlan, plan_config, stack_document
from dataplane import DataPlane
from engine_tier import eventually, require_engines
from prometheus_harness import Prometheus, generated_secret, operator_config, prometheus_resource
from triarch.catalog import catalog
from triarch.config import from_pulumi_config
from triarch.local.crds import crd_files
from triarch.local.inside import Answer, Client
from triarch.local.lifecycle import down, up
from triarch.local.plane import Plane, PlaneSpec
from triarch.local.stack import plane_nodes
from triarch.local.tiny_models import prompt
from triarch.offline import read_stack_config
from triarch.planners.queries import selected_metrics, shipped_queries

MODEL = "chat"
NAMESPACE = "llm"
MONITORING = "monitoring"
PROMETHEUS = "kube-prometheus-stack-prometheus"
"""The Prometheus resource kube-prometheus-stack renders for a release named kube-prometheus-stack."""
SLO_SECONDS = 1
PROMETHEUS_PORT = 9090
DCGM_PORT = 9400
KV_BLOCKS = 257
"""KV blocks of 32 tokens: 8,192 tokens, exactly one request of the planned max_model_len (vLLM refuses less), and
the one block vLLM keeps back (its null block: with 256 it offers 8,160 tokens)."""
LOAD = 32
"""Concurrent requests: four times the tuned max_num_seqs (8), each asking for more tokens than the KV cache holds
for all of the running ones."""
PROMPT_WORDS, MAX_TOKENS = 900, 1500
ALERT_TIMEOUT = 180
RESOLVE_TIMEOUT = 120
NOT_HERE = {
    "DCGM_": "the DCGM exporter reads a GPU; none here (the queue alert's GPU conjunct stands in, DCGM_STAND_IN)",
    "kube_": "kube-state-metrics reads a cluster's objects; the engine runs with no cluster around it here",
    "kuberay_": "KubeRay's operator metrics: no RayService runs beside this engine",
    "llm_d_epp_": "the endpoint picker (llm-d-router v0.10.0): the module proxy refuses its source, so it cannot "
                  "be built here",
    "ray_": "Ray Serve's and Ray's vLLM metrics: tests/test_dataplane_ray.py evaluates them on a real Ray Serve",
}
"""Series families a query may read that no engine of this module exports, each with why."""


def metrics_config() -> dict[str, Any]:
    """The fresh stack with a first-token SLO on `chat`: its alerts are then every alert a vLLM model can have."""
    config = stack_document("fresh")
    for model in config["triarch:models"]:
        if model["name"] == MODEL:
            model["timeToFirstTokenSloSeconds"] = SLO_SECONDS
    return config


def dcgm_stand_in(pod: str) -> str:
    return (f'# TYPE DCGM_FI_DEV_GPU_UTIL gauge\nDCGM_FI_DEV_GPU_UTIL{{gpu="0",Hostname="gpu-node-1",'
            f'exported_namespace="{NAMESPACE}",exported_pod="{pod}"}} 0\n')


def model_queries(plan: StackPlan) -> list[tuple[str, str]]:
    """Every shipped query that reads the model's vLLM series (alerts, triggers, dashboard panels)."""
    [board_map] = [o for o in plan.objects("ConfigMap") if o["metadata"]["name"] == "triarch-layers"]
    board = json.loads(next(iter(board_map["data"].values())))
    return [(where, expr) for where, expr in shipped_queries(plan.objects(), board)
            if any(m.startswith("vllm:") for m in selected_metrics(expr)) and f'model_name="{MODEL}"' in expr]


@dataclass
class Observed:
    plan: StackPlan
    prometheus: Prometheus
    fired: dict[str, float] = field(default_factory=dict)
    """alert -> seconds after the load began when it was first seen firing."""
    results: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    """(where, query) -> its result vector under load: the first that held samples, else the last."""
    health: list[Answer] = field(default_factory=list)
    """The liveness probe's GET during the load."""
    answers: list[Answer] = field(default_factory=list)
    resolved: dict[str, float] = field(default_factory=dict)
    """alert -> seconds after the last request ended when it was no longer firing."""
    series: list[dict[str, Any]] = field(default_factory=list)
    pod: str = ""
    """The kwok pod the engine stands in, named by its ReplicaSet."""
    address: str = ""
    """The pod's address on the plane, where its engine listens."""


@pytest.fixture(scope="module")
def observed(data_plane: DataPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    """The module's data-plane lock is held (data_plane); the engine runs on a plane of its own, where the Prometheus
    Operator turns the plan's monitors and rules into Prometheus's configuration."""
    require_engines()
    work = tmp_path_factory.mktemp("metrics")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRIARCH_LOCAL_HOME", str(work / "planes"))
        yield from _observed(work)


def _observed(work: Path) -> Iterator[Observed]:
    plan = plan_config("fresh", metrics_config(), work / "plan")
    stack = from_pulumi_config(read_stack_config(work / "plan" / "Pulumi.fresh.yaml")[0])
    name = f"m{os.getpid()}"
    plane = up(PlaneSpec(name, "", plane_nodes(stack, catalog()), crds=crd_files(["prometheus"], []),
                         namespaces=(MONITORING,), operators=("prometheus-operator",)), log=lambda _: None)
    client = Client(lambda argv: plane.command(argv))
    engines_here = DataPlane(plane.namespace(), client, work / "engines")
    prometheus: Prometheus | None = None
    dcgm: subprocess.Popen[bytes] | None = None
    try:
        [deployment] = [d for d in plan.objects("Deployment") if d["metadata"]["name"] == MODEL]
        [claim] = [c for c in plan.objects("PersistentVolumeClaim")
                   if c["metadata"]["name"] == deployment["spec"]["template"]["spec"]["volumes"][0][
                       "persistentVolumeClaim"]["claimName"]]
        applied = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}, claim,
                   {**deployment, "spec": {**deployment["spec"], "replicas": 1}},
                   *plan.objects("PodMonitor"), *plan.objects("PrometheusRule"),
                   prometheus_resource(PROMETHEUS, MONITORING)]
        plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(applied))
        pod = running_pod(plane)
        [container] = pod["spec"]["containers"]
        server = engines_here.start(engines_here.command(container, "Qwen/Qwen3-8B", MODEL, host=pod["status"][
            "podIP"], kv_blocks=KV_BLOCKS), MODEL)
        generated, rules = operator_output(plane)
        rule_dir = work / "rules"
        rule_dir.mkdir()
        for file, text in rules.items():  # the operator's rule files, each alert's `for` held (module docstring)
            (rule_dir / file).write_text(yaml.safe_dump(held(yaml.safe_load(text)), sort_keys=False))
        config = operator_config(generated, plane.kubeconfig, f"prometheus-{PROMETHEUS}-0")
        config["rule_files"] = [str(rule_dir / "*.yaml")]
        config["scrape_configs"].append({"job_name": "dcgm-exporter", "metrics_path": "/metrics.txt",
                                         "static_configs": [{"targets": [f"127.0.0.1:{DCGM_PORT}"]}]})
        (work / "dcgm").mkdir()
        (work / "dcgm" / "metrics.txt").write_text(dcgm_stand_in(pod["metadata"]["name"]))  # text/plain:
        # Prometheus 3 refuses a scrape whose Content-Type is not an exposition format's
        dcgm = subprocess.Popen(plane.command([sys.executable, "-m", "http.server", str(DCGM_PORT), "--bind",
                                               "127.0.0.1", "--directory", str(work / "dcgm")]),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        prometheus = Prometheus(lambda argv: plane.command(argv), client, work / "prometheus", PROMETHEUS_PORT,
                                config=config)
        pod_name = pod["metadata"]["name"]
        if not eventually(lambda: bool(prometheus.query(f'vllm:num_requests_waiting{{pod="{pod_name}"}}')), 60, 0.5):
            raise AssertionError(f"Prometheus never scraped the engine:\n{prometheus.log.read_text()[-2000:]}")
        [rule] = plan.objects("PrometheusRule")
        seen = Observed(plan, prometheus)
        queries = model_queries(plan)
        alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"].startswith("Chat")}
        liveness = container["livenessProbe"]
        start = time.time()
        load: list[Future[Answer]] = [client.submit(
            "POST", server.url + "/v1/completions",
            {"model": MODEL, "prompt": prompt(PROMPT_WORDS, seed=i), "max_tokens": MAX_TOKENS, "ignore_eos": True},
            timeout=600) for i in range(LOAD)]

        def watch() -> bool:
            seen.health.append(client.get(server.url + liveness["httpGet"]["path"],
                                          timeout=liveness["timeoutSeconds"]))
            for name in prometheus.firing() & alerts:
                seen.fired.setdefault(name, time.time() - start)
            for query in queries:  # each asked until it answers with samples while the load lasts
                if not seen.results.get(query):
                    seen.results[query] = prometheus.query(query[1])
            everything = set(seen.fired) == alerts and all(seen.results.values())
            return everything or all(f.done() for f in load)

        eventually(watch, ALERT_TIMEOUT, 1)
        seen.series = prometheus.query(f'vllm:kv_cache_usage_perc{{pod="{pod_name}"}}')
        seen.pod, seen.address = pod_name, server.command.host
        seen.answers = [f.result(600) for f in load]
        ended = time.time()
        pending = {"ChatKvCacheFull", "ChatRequestsQueuedGpusIdle"}

        def resolved() -> bool:
            now = prometheus.firing()
            for name in pending - now:
                seen.resolved.setdefault(name, time.time() - ended)
            return not pending & now

        eventually(resolved, RESOLVE_TIMEOUT, 1)
        yield seen
    finally:
        if prometheus is not None:
            prometheus.stop()
        if dcgm is not None:
            dcgm.terminate()  # SIGTERM, which sudo (the non-root way into the namespace) passes on; SIGKILL would
            dcgm.wait(timeout=10)  # end sudo alone and leave the server in the namespace
        for engine in list(engines_here.servers):
            engines_here.stop(engine)
        client.close()
        down(name, quiet=True)


def running_pod(plane: Plane) -> dict[str, Any]:
    """The model's one pod, once kwok runs it on a node of its pool and gives it an address."""
    found: list[dict[str, Any]] = []

    def running() -> bool:
        pods = json.loads(plane.kubectl("get", "pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={MODEL}",
                                        "-o", "json").stdout)["items"]
        found[:] = [p for p in pods if p["status"].get("phase") == "Running" and p["status"].get("podIP")]
        return len(found) == 1

    if not eventually(running, 120, 0.5):
        raise AssertionError(plane.kubectl("describe", "pods", "-n", NAMESPACE, check=False).stdout[-3000:])
    return found[0]


def operator_output(plane: Plane) -> tuple[dict[str, Any], dict[str, str]]:
    """What the Prometheus Operator generated for the scenario's Prometheus, once it holds the vLLM PodMonitor's
    job and the plan's rules: its configuration (Secret prometheus-<name>, prometheus.yaml.gz) and its rule files
    (ConfigMap prometheus-<name>-rulefiles-0, a file per PrometheusRule)."""
    config: dict[str, Any] = {}
    rules: dict[str, str] = {}

    def generated() -> bool:
        secret = plane.kubectl("get", "secret", f"prometheus-{PROMETHEUS}", "-n", MONITORING, "-o", "json",
                               check=False)
        files = plane.kubectl("get", "configmap", f"prometheus-{PROMETHEUS}-rulefiles-0", "-n", MONITORING, "-o",
                              "json", check=False)
        if secret.returncode != 0 or files.returncode != 0:
            return False
        generated = generated_secret(json.loads(secret.stdout))
        if generated is None:
            return False
        config.clear()
        config.update(generated)
        rules.clear()
        rules.update(json.loads(files.stdout).get("data", {}))
        return bool(rules) and any(j["job_name"] == f"podMonitor/{NAMESPACE}/vllm/0"
                                   for j in config.get("scrape_configs", []))

    if not eventually(generated, 120, 1):
        log = (plane.directory / "logs" / "prometheus-operator.log").read_text()[-3000:]
        raise AssertionError(f"the operator never generated the vLLM job and the rules: "
                             f"{[j['job_name'] for j in config.get('scrape_configs', [])]}, {sorted(rules)}\n{log}")
    return config, rules


def held(rule_file: dict[str, Any]) -> dict[str, Any]:
    """A rule file with every alert's `for` held to 0 s."""
    for group in rule_file["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["for"] = "0s"
    return rule_file


def test_the_load_was_served(observed: Observed) -> None:
    """Every request of the load answered in full: the overflow waited in vLLM's queue, none was dropped."""
    assert [a.status for a in observed.answers] == [200] * LOAD, [a.error or a.body[:200] for a in observed.answers]
    assert {a.json()["usage"]["completion_tokens"] for a in observed.answers} == {MAX_TOKENS}


def test_every_query_of_the_model_returns_samples_under_load(observed: Observed) -> None:
    assert len(observed.results) >= 10, sorted(observed.results)
    empty = [f"{where}: {query}" for (where, query), result in observed.results.items() if not result]
    assert not empty, "empty under load:\n" + "\n".join(empty)


def test_the_queue_and_kv_cache_alerts_fire_under_load_and_resolve_after(observed: Observed) -> None:
    for alert in ("ChatRequestsQueuedGpusIdle", "ChatKvCacheFull"):
        assert alert in observed.fired, f"{alert} never fired; fired: {observed.fired}"
        assert alert in observed.resolved, f"{alert} still fires {RESOLVE_TIMEOUT}s after the load"


def test_the_preemption_and_first_token_alerts_fire_under_load(observed: Observed) -> None:
    """A KV cache too small for the batch preempts (vLLM's own counter), and requests that wait behind a full batch
    see their first token later than the 1 s SLO."""
    assert {"ChatPreempting", "ChatSlowFirstToken"} <= set(observed.fired), observed.fired


def test_the_liveness_probe_answers_within_its_timeout_under_load(observed: Observed) -> None:
    """/health answers while the engine is saturated: a busy engine is not restarted by its liveness probe."""
    assert len(observed.health) >= 5
    failed = [a.error or a.status for a in observed.health if a.status != 200]
    assert not failed, failed


def test_the_series_carry_vllms_labels_and_the_operators(observed: Observed) -> None:
    """Labelled by Prometheus's own pod discovery through the operator's relabelling of the plan's PodMonitor."""
    [series] = observed.series
    assert series["metric"] | {"__name__": ""} == {
        "__name__": "", "model_name": MODEL, "engine": "0", "namespace": NAMESPACE, "pod": observed.pod,
        "container": "vllm", "endpoint": "http", "job": f"{NAMESPACE}/vllm", "instance": f"{observed.address}:8000"}


def normalised(expr: str) -> str:
    """A query with the model's name, namespace and numbers taken out: the shape every model's query shares."""
    expr = re.sub(r'model_name="[^"]+"', 'model_name="M"', expr)
    expr = re.sub(r'(exported_)?namespace="[^"]+"', r'\1namespace="N"', expr)
    expr = re.sub(r'exported_pod=~"[^"]+"', 'exported_pod=~"P"', expr)
    return re.sub(r"(?<![\w.])\d+(\.\d+)?(?![\w.])", "0", expr)


def test_every_vllm_query_any_shipped_stack_ships_has_the_shape_of_one_evaluated(
        observed: Observed, shipped: dict[str, StackPlan]) -> None:
    """The other models' queries differ from chat's in the model's name, the namespace and the thresholds only, so
    each is one of the shapes evaluated above against the real engine."""
    evaluated = {normalised(query) for _, query in observed.results}
    missing = []
    for name in STACK_NAMES:
        plan = shipped[name]
        boards = [json.loads(next(iter(o["data"].values()))) for o in plan.objects("ConfigMap")
                  if o["metadata"]["name"] == "triarch-layers"]
        for where, expr in shipped_queries(plan.objects(), boards[0] if boards else None):
            if any(m.startswith("vllm:") for m in selected_metrics(expr)) and normalised(expr) not in evaluated:
                missing.append(f"{name}: {where}: {expr}")
    assert not missing, "\n".join(missing)


def test_every_series_family_a_query_reads_is_evaluated_here_or_named_with_why(shipped: dict[str, StackPlan]
                                                                               ) -> None:
    unnamed = []
    for name in STACK_NAMES:
        plan = shipped[name]
        boards = [json.loads(next(iter(o["data"].values()))) for o in plan.objects("ConfigMap")
                  if o["metadata"]["name"] == "triarch-layers"]
        for where, expr in shipped_queries(plan.objects(), boards[0] if boards else None):
            for metric in selected_metrics(expr):
                if not metric.startswith("vllm:") and not any(metric.startswith(p) for p in NOT_HERE):
                    unnamed.append(f"{name}: {where}: {metric}")
    assert not unnamed, "\n".join(unnamed)


def test_the_planned_alert_durations_are_what_promtool_tests(observed: Observed) -> None:
    """The rule file Prometheus evaluated here is the one the operator generated from the plan's PrometheusRule,
    the plan's groups with `for` held to 0 s, nothing else changed."""
    [rule] = observed.plan.objects("PrometheusRule")
    [file] = list((observed.prometheus.work.parent / "rules").glob("*.yaml"))
    assert file.name.startswith(f"{NAMESPACE}-{rule['metadata']['name']}-"), file.name  # <namespace>-<name>-<uid>
    loaded = yaml.safe_load(file.read_text())
    planned = rule["spec"]["groups"]
    assert [[{k: v for k, v in r.items() if k != "for"} for r in g["rules"]] for g in loaded["groups"]] == [
        [{k: v for k, v in r.items() if k != "for"} for r in g["rules"]] for g in planned]


def test_a_prometheus_that_cannot_start_fails_its_wait_at_once_with_its_reason(data_plane: DataPlane,
                                                                             tmp_path: Path) -> None:
    """The harness's wait for Prometheus ends when Prometheus exits, with its own line, not after READY_TIMEOUT with
    no reason (a test's Prometheus given a configuration it refuses)."""
    refused = {"scrape_configs": [{"job_name": "refused", "no_such_field": 1}]}
    with pytest.raises(AssertionError) as failed:
        Prometheus(data_plane.inside(), data_plane.client, tmp_path / "prometheus", PROMETHEUS_PORT + 1,
                   config=refused)
    assert "exited with code 2 before it was ready" in str(failed.value)  # its exit code for a bad config
    assert "no_such_field" in str(failed.value)
