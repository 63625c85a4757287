"""KEDA and `pulumi up` together, on the real engines: the real KEDA operator and metrics adapter (KEDA 2.20.2, built
from its Go module) reconcile the ScaledObject of an autoscaled vLLM model against a real Prometheus server (3.14.0,
the release kube-prometheus-stack runs, built from its Go module); the HPA KEDA creates (the controller manager's
real HPA controller, reading KEDA's external metrics API through the API server's aggregation layer) scales the
Deployment up on a real engine's queue, and back down once it empties; a `pulumi up` that changes the model's image
succeeds and leaves the scaled replica count alone.

kwok runs the pods, so each running pod of the model gets a real vLLM engine in its place (vLLM's CPU build,
tests/dataplane.py): the pod's own container, as the API server holds it, started by triarch.local.cpu_serving with
the pod's address for its host, on the plane's loopback where kwok's pod addresses live. The real Prometheus Operator
(v0.93.1, the release kube-prometheus-stack runs) turns Triarch's live PodMonitor into the scrape configuration of
a Prometheus resource that selects monitors as kube-prometheus-stack's does; Prometheus runs that configuration,
discovering the pods through the API server and relabeling them as the operator wrote, with the intervals compressed
to a second: so a PodMonitor the operator would not select, a ScaledObject query with a wrong label, or arithmetic
that gives another number, is answered as it would be in a cluster. Load is a stream of real requests: long
generations fill the engine's batch (its planned max_num_seqs) and the rest wait in vLLM's queue, the series KEDA
scales on.

The scenario is a second Pulumi stack (`lab-keda`) on the lab's plane: its own serving and Prometheus namespaces,
the A10G pool the lab's Ray model leaves idle (no KubeRay runs there)."""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from dataplane import DataPlane, counter, one_module_of_engines_at_a_time, require_dataplane
from engine_tier import Lab, eventually, scratch_project
from prometheus_harness import Prometheus, generated_secret, operator_config, prometheus_resource
from triarch.datafiles import read_yaml_documents
from triarch.local import dataplane, engines
from triarch.local.cpu_serving import Server
from triarch.local.crds import crd_files
from triarch.local.inside import Answer, Client
from triarch.local.lifecycle import start_operator, stop_operator
from triarch.local.tiny_models import prompt

STACK = "lab-keda"
NAMESPACE = "llm-keda"
MONITORING = "monitoring-keda"
MODEL = "scaled"
HUB_MODEL = "Qwen/Qwen3-8B"
PROMETHEUS = "k8s"
"""The scenario's Prometheus resource, as the cluster's Prometheus Operator holds it."""
PROMETHEUS_PORT = 9090
"""Prometheus's own default port (--web.listen-address), on the plane's loopback."""
SCRAPE_TIMEOUT = 60
"""Seconds for Prometheus to read a rewritten target file (it watches it) and scrape the targets it lists."""
SCALE_TIMEOUT = 240
"""Seconds for KEDA (polling every 15 s) and the HPA (scale-up stabilised over 60 s, one pod per minute) to add a
replica."""
SHORT_SCALE_DOWN = 20
"""The scale-down window (and policy period) the scenario sets on the live ScaledObject once the HPA is seen holding
the planned one (300 s, planners/observability.py)."""
SCALE_DOWN_TIMEOUT = 180
"""Seconds for the HPA to remove a replica once the queue is empty: KEDA's reconcile of the shortened window and its
poll (15 s), the window, the HPA's sync (15 s), with room for a loaded host."""
GENERATION = 8000
"""Tokens each load request generates (the planned max_model_len is 8,192): about twenty seconds of a full batch of
the tiny model on two idle cores, during which the requests behind the batch wait and the queue holds still."""
KV_BLOCKS = 2400
"""76,800 tokens of KV cache (blocks of 32): a full batch of the planned max_num_seqs (8) at 64 + GENERATION tokens
each fills about 85% of it, so the KV-cache trigger reads a real, changing fraction."""
PROMPT_WORDS = 64


def keda_config(lab: Lab) -> dict[str, Any]:
    config = copy.deepcopy(lab.config)
    config["triarch:nodeGroups"] = [g for g in config["triarch:nodeGroups"] if g["name"] == "a10g"]
    config["triarch:serving"] = {**config["triarch:serving"], "namespace": NAMESPACE}
    config["triarch:observability"] = {"prometheus": "existing", "keda": "existing", "namespace": MONITORING,
                                       "prometheusUrl": f"http://127.0.0.1:{PROMETHEUS_PORT}",
                                       "dcgmExporter": False}
    config["triarch:models"] = [{"name": MODEL, "model": HUB_MODEL, "engine": "vllm", "nodeGroup": "a10g",
                                 "maxModelLen": 8192, "autoscaling": {"min": 1, "max": 2}}]
    return config


@dataclass
class KedaStack:
    lab: Lab
    project: Path
    config: dict[str, Any]
    plane: DataPlane
    engines: dict[str, Server] = field(default_factory=dict)
    """Running pod -> the real engine in its place."""
    load: list[Future[Answer]] = field(default_factory=list)
    prometheus: Prometheus = field(init=False)
    """Started from the Prometheus Operator's configuration once the stack's PodMonitor is in it."""

    def pulumi(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [str(engines.binary("pulumi")), *args, "--stack", STACK, "--non-interactive"]
        done = subprocess.run(self.lab.plane.command(argv), env=self.lab.plane.env(), cwd=self.project,
                              capture_output=True, text=True, timeout=600, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"pulumi {' '.join(args)} exited {done.returncode}:\n{done.stdout[-4000:]}\n"
                                 f"{done.stderr[-3000:]}")
        return done

    def write_config(self, config: dict[str, Any]) -> None:
        path = self.project / f"Pulumi.{STACK}.yaml"
        current = yaml.safe_load(path.read_text()) or {}
        current["config"] = config
        path.write_text(yaml.safe_dump(current, sort_keys=False))

    def deployment(self) -> dict[str, Any]:
        loaded: dict[str, Any] = self.lab.kubectl_json("get", "deployment", MODEL, "-n", NAMESPACE,
                                                       "--show-managed-fields")
        return loaded

    def serve_pods(self) -> list[str]:
        """A real engine in each pod Triarch's live PodMonitor selects now (started from the pod's own container, on
        the pod's address), none for a pod gone (its engine drained by SIGTERM). Returns the pods' names, once
        Prometheus, discovering pods as the operator's configuration says, has scraped each."""
        monitor = self.lab.kubectl_json("get", "podmonitor", "vllm", "-n", NAMESPACE)
        selector = monitor["spec"]["selector"]
        assert set(selector) == {"matchLabels"}, selector  # as a label selector for kubectl
        pods = [p for p in self.lab.kubectl_json(
            "get", "pods", "-n", monitor["metadata"]["namespace"], "-l",
            ",".join(f"{k}={v}" for k, v in selector["matchLabels"].items()))["items"]
            if p["status"].get("phase") == "Running" and p["status"].get("podIP")
            and not p["metadata"].get("deletionTimestamp")]
        for name in sorted(set(self.engines) - {p["metadata"]["name"] for p in pods}):
            self.plane.stop(self.engines.pop(name))
        for pod in pods:
            name = pod["metadata"]["name"]
            if name not in self.engines:
                [container] = pod["spec"]["containers"]
                command = self.plane.command(container, HUB_MODEL, name, host=pod["status"]["podIP"],
                                             kv_blocks=KV_BLOCKS)
                self.engines[name] = self.plane.start(command, name)
        names = sorted(self.engines)
        scraped = lambda: {s["metric"]["pod"] for s in self.query("vllm:num_requests_waiting")} == set(names)  # noqa: E731
        if not eventually(scraped, SCRAPE_TIMEOUT, 0.5):
            raise AssertionError(f"Prometheus did not scrape {names} within {SCRAPE_TIMEOUT}s\n"
                                 f"{self.prometheus.get('/api/v1/targets')}\n"
                                 f"{self.prometheus.log.read_text()[-2000:]}")
        return names

    def query(self, promql: str) -> list[dict[str, Any]]:
        return self.prometheus.query(promql)

    def reported(self, pod: str, gauge: str) -> float:
        """What the engine in `pod` reports now on its own /metrics."""
        body = self.plane.client.get(self.engines[pod].url + "/metrics").body
        return counter(body, f"vllm:{gauge}")

    def triggers(self) -> dict[str, str]:
        """Each trigger's query, from the ScaledObject on the plane."""
        scaled = self.lab.kubectl_json("get", "scaledobject", MODEL, "-n", NAMESPACE)
        return {t["name"]: t["metadata"]["query"] for t in scaled["spec"]["triggers"]}

    def answers(self, triggers: dict[str, str] | None = None) -> dict[str, float]:
        """What Prometheus answers each trigger's query (one sample each)."""
        found = {}
        for name, query in (triggers or self.triggers()).items():
            [sample] = self.query(query)
            found[name] = float(sample["value"][1])
        return found

    def batch(self, pod: str) -> int:
        """The engine's batch: the planned --max-num-seqs of the pod's container."""
        args = self.engines[pod].command.argv
        return int(args[args.index("--max-num-seqs") + 1])

    def add_load(self, pod: str, waiting: int, tokens: int = GENERATION) -> None:
        """Long generations (`tokens` each) sent to one pod's engine: a full batch, and `waiting` more that wait in
        vLLM's queue behind it."""
        url = self.engines[pod].url + "/v1/completions"
        self.load += [self.plane.client.submit("POST", url, {
            "model": MODEL, "prompt": prompt(PROMPT_WORDS, seed=i), "max_tokens": tokens, "ignore_eos": True},
            timeout=900) for i in range(self.batch(pod) + waiting)]

    def hold_load(self, pod: str, waiting: int, tokens: int = GENERATION) -> None:
        """Keep a full batch and `waiting` more in flight on the pod's engine: what finished is replaced."""
        answers = [f.result() for f in self.load if f.done()]
        assert all(a.status == 200 for a in answers), [a.error or a.body[:200] for a in answers if a.status != 200]
        self.load = [f for f in self.load if not f.done()]
        missing = self.batch(pod) + waiting - len(self.load)
        if missing > 0:
            self.add_load(pod, missing - self.batch(pod), tokens)

    def end_load(self) -> None:
        """End the load as its clients going away would: what was answered was answered in full, what is still
        generating is cancelled and vLLM aborts it, so each engine has nothing running or waiting within seconds, not
        after minutes of generations nobody reads (they were most of the scenario's CPU: 2026-12-06, .ci/timings.yaml).
        """
        for future in self.load:
            self.plane.client.cancel(future)
        answers = [f.result(120) for f in self.load]
        self.load = []
        failed = [a.error or a.body[:200] for a in answers if a.status != 200 and not a.cancelled]
        assert not failed, failed
        idle = lambda: all(self.reported(p, "num_requests_running") + self.reported(p, "num_requests_waiting") == 0  # noqa: E731
                           for p in self.engines)
        assert eventually(idle, 60, 0.5), {p: (self.reported(p, "num_requests_running"),
                                               self.reported(p, "num_requests_waiting")) for p in self.engines}


@pytest.fixture(scope="module")
def keda_stack(deployed: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KedaStack]:
    """KEDA running on the lab's plane (its CRDs, operator, adapter and APIService), Prometheus on its loopback, and
    the lab-keda stack up with a real engine in its one pod, scraped. Afterwards the plane is as this module found
    it: the lab's cluster has no KEDA and no engine, and other modules rely on that."""
    require_dataplane()
    with one_module_of_engines_at_a_time():
        yield from _keda_stack(deployed, tmp_path_factory)


def _keda_stack(deployed: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KedaStack]:
    plane = deployed.plane
    documents = [d for f in crd_files(["keda"], []) for d in read_yaml_documents(f) if d]
    plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(documents))
    plane.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                  *[f"crd/{d['metadata']['name']}" for d in documents])
    plane.kubectl("create", "namespace", MONITORING)
    start_operator(plane, "keda")
    start_operator(plane, "prometheus-operator")
    plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(prometheus_resource(PROMETHEUS,
                                                                                                MONITORING)))
    work = tmp_path_factory.mktemp("keda")
    inside = lambda argv: plane.command(argv)  # noqa: E731
    client = Client(inside)
    data_plane = DataPlane(plane.namespace(), client, work / "engines")
    prometheus: Prometheus | None = None
    stack: KedaStack | None = None
    try:
        project = scratch_project(work / "project")
        config = keda_config(deployed)
        (project / f"Pulumi.{STACK}.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))
        stack = KedaStack(deployed, project, config, data_plane)
        stack.pulumi("stack", "init", "--secrets-provider", "passphrase")
        stack.pulumi("up", "--yes", "--skip-preview")
        generated = generated_config(deployed, f"podMonitor/{NAMESPACE}/vllm/0")
        prometheus = Prometheus(inside, client, work / "prometheus", PROMETHEUS_PORT,
                                config=operator_config(generated, plane.kubeconfig, f"prometheus-{PROMETHEUS}-0"))
        stack.prometheus = prometheus
        assert len(stack.serve_pods()) == 1
        yield stack
        # KEDA removes its finalizers while it runs. The stack itself is not destroyed: `pulumi destroy` would wait
        # out each vLLM pod's 90-second grace period, which kwok honours; the namespace goes in the background.
        plane.kubectl("delete", "--ignore-not-found", "--wait=true", "scaledobjects", "--all", "-n", NAMESPACE)
    finally:
        for server in list(data_plane.servers):
            data_plane.stop(server)
        if prometheus is not None:
            prometheus.stop()
        client.close()
        stop_operator(plane, "keda")
        # The operator finalizes its Prometheus resource (its status clean-up): removed while the operator runs, or
        # the CRD's deletion waits for it forever.
        plane.kubectl("delete", "--ignore-not-found", "--wait=true", "--timeout=60s", "prometheus", PROMETHEUS, "-n",
                      MONITORING, check=False)
        stop_operator(plane, "prometheus-operator")
        plane.kubectl("delete", "--ignore-not-found", "--wait=false", "namespace", MONITORING, NAMESPACE)
        plane.kubectl("delete", "--ignore-not-found", *[f"crd/{d['metadata']['name']}" for d in documents],
                      "crd/prometheuses.monitoring.coreos.com", "crd/probes.monitoring.coreos.com")


def generated_config(lab: Lab, job: str) -> dict[str, Any]:
    """The configuration the Prometheus Operator generated for the scenario's Prometheus (its Secret
    prometheus-<name>, key prometheus.yaml.gz), once it holds `job`: the stack's PodMonitor, selected and
    translated by the operator."""
    found: dict[str, Any] = {}

    def holds() -> bool:
        secret = lab.plane.kubectl("get", "secret", f"prometheus-{PROMETHEUS}", "-n", MONITORING, "-o", "json",
                                   check=False)
        if secret.returncode != 0:
            return False
        config = generated_secret(json.loads(secret.stdout))
        if config is None:
            return False
        found.update(config)
        return any(j["job_name"] == job for j in found.get("scrape_configs", []))

    if not eventually(holds, 120, 1):
        log = (lab.plane.directory / "logs" / "prometheus-operator.log").read_text()[-3000:]
        raise AssertionError(f"the operator's configuration never held {job}: "
                             f"{[j['job_name'] for j in found.get('scrape_configs', [])]}\n{log}")
    return found


def _wait_for(what: str, check: Any, timeout: float, stack: KedaStack) -> None:
    if eventually(check, timeout, 3):
        return
    hpa = stack.lab.plane.kubectl("describe", "hpa", "-n", NAMESPACE, check=False).stdout[-2500:]
    logs = (stack.lab.plane.directory / "logs" / "keda-operator.log").read_text()[-2000:]
    raise AssertionError(f"{what} did not happen within {timeout:.0f}s\n{hpa}\n{logs}")


def test_the_deployment_leaves_its_replica_count_to_the_autoscaler(keda_stack: KedaStack) -> None:
    """Triarch writes no spec.replicas for a model KEDA scales: the HPA alone owns the field."""
    deployment = keda_stack.deployment()
    fields = deployment["metadata"]["managedFields"]
    assert any(m["manager"].startswith("pulumi-kubernetes") for m in fields)  # Pulumi applied the Deployment
    managers = {m["manager"] for m in fields if "f:replicas" in (m.get("fieldsV1", {}).get("f:spec") or {})}
    assert not any(m.startswith("pulumi-kubernetes") for m in managers), managers


def matches_the_engines(stack: KedaStack, pods: list[str], triggers: dict[str, str]) -> bool:
    """The triggers' answers against what the engines report on their own /metrics, read just before and just after
    the query: the queue exactly (it holds while the batch generates), the KV cache between the two readings (it
    grows with every token; Prometheus's sample is at most a scrape, a second, old)."""
    waiting = [stack.reported(p, "num_requests_waiting") for p in pods]
    kv = [stack.reported(p, "kv_cache_usage_perc") for p in pods]
    answers = stack.answers(triggers)
    waiting_after = [stack.reported(p, "num_requests_waiting") for p in pods]
    kv_after = [stack.reported(p, "kv_cache_usage_perc") for p in pods]
    return (waiting == waiting_after and answers["requests-waiting"] == sum(waiting) > 0
            and sum(kv) - 0.2 <= answers["kv-cache-usage"] <= sum(kv_after) + 0.01 and sum(kv) > 0)


def test_prometheus_answers_each_trigger_with_what_vllm_reports(keda_stack: KedaStack) -> None:
    """The ScaledObject's queries, asked of Prometheus as KEDA asks them, give back what the model's one engine
    reports under load; the series carry the labels the operator's relabeling and vLLM give them, no more."""
    [pod] = keda_stack.serve_pods()
    # Below both triggers' targets, so the HPA keeps one replica however long the load lasts on a busy machine: one
    # request waiting (the queue's target is 1 a replica) and half the generation (the batch's KV cache about 42%
    # full at its end, the target 80%).
    triggers = keda_stack.triggers()

    def matched() -> bool:  # the load held while Prometheus is compared (an idle machine ends a batch in seconds)
        keda_stack.hold_load(pod, 1, GENERATION // 2)
        return matches_the_engines(keda_stack, [pod], triggers)

    assert eventually(matched, 60, 0.5), (
        keda_stack.answers(), keda_stack.reported(pod, "num_requests_waiting"))
    [series] = keda_stack.query(f'vllm:num_requests_waiting{{pod="{pod}"}}')
    assert set(series["metric"]) == {"__name__", "model_name", "engine", "namespace", "pod", "container", "endpoint",
                                     "job", "instance"}
    assert series["metric"]["model_name"] == MODEL
    keda_stack.end_load()


def test_keda_scales_the_deployment_on_vllms_waiting_requests(keda_stack: KedaStack) -> None:
    hpa = keda_stack.lab.kubectl_json("get", "hpa", f"keda-hpa-{MODEL}", "-n", NAMESPACE)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": MODEL}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 2)
    [pod] = keda_stack.serve_pods()
    threshold = float(next(t for t in keda_stack.lab.kubectl_json("get", "scaledobject", MODEL, "-n", NAMESPACE)
                           ["spec"]["triggers"] if t["name"] == "requests-waiting")["metadata"]["threshold"])

    def scaled() -> bool:
        # The queue held above what one replica may have waiting, until the HPA adds one: a whole batch more than
        # that, so the batch that ends and the next that starts never empty it (the HPA acts on the lowest
        # recommendation of its 60-second scale-up window).
        keda_stack.hold_load(pod, keda_stack.batch(pod) + int(2 * threshold) + 1)
        return bool(keda_stack.deployment()["spec"]["replicas"] == 2)

    _wait_for("a second replica", scaled, SCALE_TIMEOUT, keda_stack)
    _wait_for("two available replicas",
              lambda: keda_stack.deployment().get("status", {}).get("availableReplicas") == 2, 60, keda_stack)
    keda_stack.end_load()


def test_every_replica_is_scraped_and_the_queries_sum_over_them(keda_stack: KedaStack) -> None:
    """Two pods, each with its engine and each a target of its own: the requests waiting on both, and their KV
    caches' use, summed (the HPA divides by the replicas: the triggers are AverageValue)."""
    if keda_stack.deployment()["spec"]["replicas"] != 2:
        test_keda_scales_the_deployment_on_vllms_waiting_requests(keda_stack)
    first, second = keda_stack.serve_pods()
    keda_stack.add_load(first, 4)
    keda_stack.add_load(second, 2)
    triggers = keda_stack.triggers()
    assert eventually(lambda: matches_the_engines(keda_stack, [first, second], triggers), 60, 0.5), (
        keda_stack.answers(), [keda_stack.reported(p, "num_requests_waiting") for p in (first, second)])
    keda_stack.end_load()


def test_an_image_bump_goes_up_and_keeps_the_scaled_replicas(keda_stack: KedaStack) -> None:
    """The image moves to vLLM 0.29.0: the rolled pods' engines are 0.29.0's CPU build, with the args the tuner gave
    that release."""
    if keda_stack.deployment()["spec"]["replicas"] != 2:
        test_keda_scales_the_deployment_on_vllms_waiting_requests(keda_stack)
    edited = copy.deepcopy(keda_stack.config)
    edited["triarch:images"] = {"vllm": "vllm/vllm-openai:v0.29.0"}
    keda_stack.write_config(edited)
    done = keda_stack.pulumi("up", "--yes", "--skip-preview", check=False)
    assert done.returncode == 0, done.stdout[-3000:]
    deployment = keda_stack.deployment()
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "vllm/vllm-openai:v0.29.0"
    pods = keda_stack.serve_pods()  # `pulumi up` waited for the rollout: the pods are the new template's
    assert len(pods) == 2
    older = dataplane.for_vllm_release("0.29.0").directory()
    assert all(keda_stack.engines[p].command.argv[0].startswith(str(older)) for p in pods)


def test_keda_scales_back_down_once_the_queue_is_empty(keda_stack: KedaStack) -> None:
    """With nothing waiting and the KV caches empty, the HPA goes back to one replica, and the removed pod's engine
    is drained by SIGTERM. The HPA KEDA made holds the planned scale-down window (twice the grace period, at least
    five minutes: a replica removed has drained); that window is then shortened on the live ScaledObject, as the
    Karpenter scenario shortens consolidateAfter: five idle minutes of two engines prove nothing the HPA's own
    behaviour, read here, does not say."""
    if keda_stack.deployment()["spec"]["replicas"] != 2:
        test_keda_scales_the_deployment_on_vllms_waiting_requests(keda_stack)
    pods = keda_stack.serve_pods()
    planned = keda_stack.lab.kubectl_json("get", "scaledobject", MODEL, "-n", NAMESPACE)["spec"]["advanced"][
        "horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    hpa = keda_stack.lab.kubectl_json("get", "hpa", f"keda-hpa-{MODEL}", "-n", NAMESPACE)
    held = hpa["spec"]["behavior"]["scaleDown"]
    assert (held["stabilizationWindowSeconds"], held["policies"]) == (planned["stabilizationWindowSeconds"],
                                                                      planned["policies"])
    assert planned["stabilizationWindowSeconds"] >= 300
    short = {"stabilizationWindowSeconds": SHORT_SCALE_DOWN,
             "policies": [{"type": "Pods", "value": 1, "periodSeconds": SHORT_SCALE_DOWN}]}
    keda_stack.lab.plane.kubectl("patch", "scaledobject", MODEL, "-n", NAMESPACE, "--type=merge", "-p", json.dumps(
        {"spec": {"advanced": {"horizontalPodAutoscalerConfig": {"behavior": {"scaleDown": short}}}}}))
    empty = {"requests-waiting": 0.0, "kv-cache-usage": 0.0}
    assert eventually(lambda: keda_stack.answers() == empty, SCRAPE_TIMEOUT, 1), keda_stack.answers()
    _wait_for("one replica", lambda: keda_stack.deployment()["spec"]["replicas"] == 1, SCALE_DOWN_TIMEOUT, keda_stack)
    assert eventually(lambda: len(keda_stack.serve_pods()) == 1, 180, 3)
    assert len(pods) == 2
