"""KEDA and `pulumi up` together, on the real engines: the real KEDA operator and metrics adapter (KEDA 2.20.2, built
from its Go module) reconcile the ScaledObject of an autoscaled vLLM model against a real Prometheus server (3.14.0,
the release kube-prometheus-stack runs, built from its Go module); the HPA KEDA creates (the controller manager's
real HPA controller, reading KEDA's external metrics API through the API server's aggregation layer) scales the
Deployment up; then a `pulumi up` that changes the model's image succeeds and leaves the scaled replica count alone.

No vLLM runs in kwok's pods, so one loopback exporter (tests/vllm_exporter.py) serves each pod's /metrics, vLLM's
gauges with vLLM's labels and the values the test chooses. Prometheus scrapes it once a second, one target per
running pod of the model, each target labelled as prometheus-operator's scrape config for Triarch's live PodMonitor
labels it (`scrape_targets`): so a ScaledObject query with a wrong label, or arithmetic that gives another number,
is answered as it would be in a cluster. Each trigger's query, read from the live ScaledObject, is also asked of
Prometheus directly and its answer held to the number the exporter was given.

The scenario is a second Pulumi stack (`lab-keda`) on the lab's plane: its own serving and Prometheus namespaces,
the A10G pool the lab's Ray model leaves idle (no KubeRay runs there)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT
from engine_tier import Lab, eventually, scratch_project
from triarch.datafiles import read_yaml_documents
from triarch.local import engines
from triarch.local.crds import crd_files
from triarch.local.lifecycle import start_operator, stop_operator

STACK = "lab-keda"
NAMESPACE = "llm-keda"
MONITORING = "monitoring-keda"
PROMETHEUS_PORT = 9090
"""Prometheus's own default port (--web.listen-address), on the plane's loopback."""
EXPORTER_PORT = 18110
"""The vLLM exporter's port on the plane's loopback: one no engine of the plane listens on (plane.py and
operators.py in components/triarch/local)."""
SCRAPE_INTERVAL = "1s"
"""Prometheus scrapes every second (the PodMonitor says 15 s): a value the test chooses reaches the queries fast."""
SCRAPE_TIMEOUT = 30
"""Seconds for Prometheus to read a rewritten target file (it watches it) and scrape the targets it lists."""
SCALE_TIMEOUT = 240
"""Seconds for KEDA (polling every 15 s) and the HPA (scale-up stabilised over 60 s, one pod per minute) to add a
replica."""
GAUGES = ("vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
FETCH = ("import sys, urllib.request\n"
         "with urllib.request.urlopen(sys.argv[1], timeout=10) as answer:\n"
         "    sys.stdout.write(answer.read().decode())\n")
"""A GET inside the plane's network namespace (Prometheus listens on the plane's loopback only)."""


def keda_config(lab: Lab) -> dict[str, Any]:
    config = copy.deepcopy(lab.config)
    config["triarch:nodeGroups"] = [g for g in config["triarch:nodeGroups"] if g["name"] == "a10g"]
    config["triarch:serving"] = {**config["triarch:serving"], "namespace": NAMESPACE}
    config["triarch:observability"] = {"prometheus": "existing", "keda": "existing", "namespace": MONITORING,
                                       "prometheusUrl": f"http://127.0.0.1:{PROMETHEUS_PORT}",
                                       "dcgmExporter": False}
    config["triarch:models"] = [{"name": "scaled", "model": "Qwen/Qwen3-8B", "engine": "vllm", "nodeGroup": "a10g",
                                 "maxModelLen": 8192, "autoscaling": {"min": 1, "max": 2}}]
    return config


MODELLED_SPEC = {"selector", "podMetricsEndpoints", "jobLabel"}
MODELLED_ENDPOINT = {"port", "path", "interval", "scrapeTimeout"}
"""The PodMonitor fields `scrape_targets` derives the targets' labels from (or that change no label: how often, how
long); a monitor with another (relabelings, honorLabels, portNumber, podTargetLabels, a namespaceSelector, ...)
fails the scenario rather than be scraped as it would not be."""


def served_model_name(container: dict[str, Any]) -> str:
    """The name vLLM labels its metrics with (`model_name`): `--served-model-name`, else the model it serves."""
    args = [*container.get("command", []), *container.get("args", [])]
    if "--served-model-name" in args:
        return str(args[args.index("--served-model-name") + 1])
    return str(container["args"][0])


def scrape_targets(monitor: dict[str, Any], pods: list[dict[str, Any]], exporter: str
                   ) -> list[dict[str, Any]]:
    """The targets, as Prometheus file_sd target groups, that prometheus-operator v0.93.1's scrape config for this
    PodMonitor gives Prometheus (pkg/prometheus/promcfg.go, ConfigGenerator.generatePodMonitorConfig), each at the
    exporter's address. Prometheus 3.14.0's Kubernetes discovery (role pod) makes a target of each container port
    of a pod that has an IP, `__address__` the pod's IP and port (discovery/kubernetes/pod.go, Pod.buildPod); the
    operator's relabeling keeps the pods not Failed or Succeeded (generateRunningFilter) and the ports named as the
    endpoint's `port`, and sets `namespace`, `container` and `pod` from the pod, `job` to <monitor's
    namespace>/<monitor's name> (to the pod's label named by `jobLabel`, where set and the pod has it) and
    `endpoint` to the port's name; Prometheus sets `instance` to the address, the pod's here. One exporter answers
    for every pod, each pod's on the endpoint's path followed by the pod's name."""
    spec = monitor["spec"]
    meta = monitor["metadata"]
    assert set(spec) <= MODELLED_SPEC, f"the targets here do not model {sorted(set(spec) - MODELLED_SPEC)}"
    groups = []
    for endpoint in spec["podMetricsEndpoints"]:
        assert set(endpoint) <= MODELLED_ENDPOINT, f"the targets here do not model {endpoint}"
        for pod in pods:
            if pod["status"].get("phase") in ("Failed", "Succeeded") or not pod["status"].get("podIP"):
                continue
            for container in pod["spec"]["containers"]:
                for port in container.get("ports", []):
                    if port.get("name") != endpoint["port"]:
                        continue
                    name = pod["metadata"]["name"]
                    job = pod["metadata"].get("labels", {}).get(spec.get("jobLabel", ""), "")
                    labels = {"namespace": pod["metadata"]["namespace"], "container": container["name"],
                              "pod": name, "job": job or f"{meta['namespace']}/{meta['name']}",
                              "endpoint": endpoint["port"],
                              "instance": f"{pod['status']['podIP']}:{port['containerPort']}",
                              "__metrics_path__": f"{endpoint.get('path', '/metrics').rstrip('/')}/{name}"}
                    groups.append({"targets": [exporter], "labels": labels})
    return groups


def prometheus_config(targets: Path) -> dict[str, Any]:
    """One job reading its targets from `targets` (file_sd, written by the test); `honor_labels: false` as the
    operator writes it for an endpoint that does not set honorLabels (ConfigGenerator.AddHonorLabels)."""
    return {"global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
            "scrape_configs": [{"job_name": "podmonitors", "honor_labels": False,
                                "file_sd_configs": [{"files": [str(targets)]}]}]}


def write_atomically(path: Path, text: str) -> None:
    """Readers (Prometheus's file watch, the exporter) see the old file or the new one, never half of one."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


@dataclass
class KedaStack:
    lab: Lab
    project: Path
    config: dict[str, Any]
    targets: Path
    values: Path
    prometheus_log: Path

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
        loaded: dict[str, Any] = self.lab.kubectl_json("get", "deployment", "scaled", "-n", NAMESPACE,
                                                       "--show-managed-fields")
        return loaded

    def scrape_pods(self) -> list[str]:
        """Point Prometheus at the pods Triarch's live PodMonitor selects now (a pod gone is no longer scraped; a new
        one reports zeros until the test chooses). Returns the pods' names."""
        monitor = self.lab.kubectl_json("get", "podmonitor", "vllm", "-n", NAMESPACE)
        selector = monitor["spec"]["selector"]
        assert set(selector) == {"matchLabels"}, selector  # as a label selector for kubectl
        pods = self.lab.kubectl_json("get", "pods", "-n", monitor["metadata"]["namespace"], "-l",
                                     ",".join(f"{k}={v}" for k, v in selector["matchLabels"].items()))["items"]
        groups = scrape_targets(monitor, pods, f"127.0.0.1:{EXPORTER_PORT}")
        by_name = {p["metadata"]["name"]: p for p in pods}
        before = json.loads(self.values.read_text())
        values = {}
        for group in groups:
            name = group["labels"]["pod"]
            [container] = [c for c in by_name[name]["spec"]["containers"] if c["name"] == group["labels"]["container"]]
            values[name] = before.get(name) or {"model_name": served_model_name(container),
                                                "num_requests_waiting": 0, "kv_cache_usage_perc": 0}
        write_atomically(self.values, json.dumps(values))  # before the targets: a new target's first scrape finds it
        write_atomically(self.targets, json.dumps(groups))
        return sorted(g["labels"]["pod"] for g in groups)

    def choose(self, pod: str, waiting: float, kv_cache: float) -> None:
        """What vLLM on `pod` reports: requests waiting, and the fraction of its KV cache in use."""
        values = json.loads(self.values.read_text())
        values[pod].update(num_requests_waiting=waiting, kv_cache_usage_perc=kv_cache)
        write_atomically(self.values, json.dumps(values))

    def get(self, path: str, **params: str) -> str | None:
        """Prometheus's answer to GET `path` (None if it does not answer, or not with 200)."""
        url = f"http://127.0.0.1:{PROMETHEUS_PORT}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        done = self.lab.plane.run([sys.executable, "-c", FETCH, url], check=False, timeout=60)
        return done.stdout if done.returncode == 0 else None

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result vector, as KEDA's prometheus scaler asks for it (GET /api/v1/query)."""
        body = self.get("/api/v1/query", query=promql)
        assert body is not None, f"Prometheus did not answer {promql}\n{self.prometheus_log.read_text()[-2000:]}"
        answer = json.loads(body)
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def scraped(self) -> dict[tuple[str, str], float]:
        """(pod, gauge) -> the value Prometheus holds now."""
        names = "|".join(GAUGES)
        series = self.query(f'{{__name__=~"{names}"}}')
        return {(s["metric"].get("pod", ""), s["metric"]["__name__"]): float(s["value"][1]) for s in series}

    def wait_for_scrape(self) -> None:
        """Until Prometheus holds what every pod's exporter says now."""
        values = json.loads(self.values.read_text())
        wanted = {(pod, f"vllm:{gauge}"): float(chosen[gauge]) for pod, chosen in values.items()
                  for gauge in ("num_requests_waiting", "kv_cache_usage_perc")}
        if not eventually(lambda: all(self.scraped().get(k) == v for k, v in wanted.items()), SCRAPE_TIMEOUT, 0.5):
            raise AssertionError(f"Prometheus did not scrape {wanted} within {SCRAPE_TIMEOUT}s: it holds "
                                 f"{self.scraped()}\n{self.prometheus_log.read_text()[-2000:]}")

    def triggers(self) -> dict[str, str]:
        """Each trigger's query, from the ScaledObject on the plane."""
        scaled = self.lab.kubectl_json("get", "scaledobject", "scaled", "-n", NAMESPACE)
        return {t["name"]: t["metadata"]["query"] for t in scaled["spec"]["triggers"]}

    def answers(self) -> dict[str, list[float]]:
        """What Prometheus answers each trigger's query: the values of its result vector."""
        return {name: [float(s["value"][1]) for s in self.query(query)] for name, query in self.triggers().items()}


@pytest.fixture(scope="module")
def keda_stack(deployed: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KedaStack]:
    """KEDA running on the lab's plane (its CRDs, operator, adapter and APIService), Prometheus and the vLLM
    exporter on its loopback, and the lab-keda stack up with Prometheus scraping its one pod, which reports no
    waiting requests. Afterwards the plane is as this module found it: the lab's cluster has no KEDA, and other
    modules rely on that."""
    plane = deployed.plane
    documents = [d for f in crd_files(["keda"], []) for d in read_yaml_documents(f) if d]
    plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(documents))
    plane.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                  *[f"crd/{d['metadata']['name']}" for d in documents])
    plane.kubectl("create", "namespace", MONITORING)
    start_operator(plane, "keda")
    work = tmp_path_factory.mktemp("keda")
    targets, values, log = work / "targets.json", work / "values.json", work / "prometheus.log"
    write_atomically(targets, "[]")
    write_atomically(values, "{}")
    (work / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config(targets), sort_keys=False))
    exporter = subprocess.Popen(plane.command([sys.executable, str(ROOT / "tests" / "vllm_exporter.py"),
                                               str(EXPORTER_PORT), str(values)]), start_new_session=True)
    with log.open("w") as sink:
        prometheus = subprocess.Popen(plane.command([
            str(engines.binary("prometheus")), f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}"]),
            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    project = scratch_project(work / "project")
    config = keda_config(deployed)
    (project / f"Pulumi.{STACK}.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    stack = KedaStack(deployed, project, config, targets, values, log)
    try:
        if not eventually(lambda: stack.get("/-/ready") is not None, 60, 0.5):
            raise AssertionError(f"Prometheus is not ready:\n{log.read_text()[-3000:]}")
        stack.pulumi("stack", "init", "--secrets-provider", "passphrase")
        stack.pulumi("up", "--yes", "--skip-preview")
        assert len(stack.scrape_pods()) == 1
        stack.wait_for_scrape()
        yield stack
        # KEDA removes its finalizers while it runs. The stack itself is not destroyed: `pulumi destroy` would wait
        # out each vLLM pod's 90-second grace period, which kwok honours; the namespace goes in the background.
        plane.kubectl("delete", "--ignore-not-found", "--wait=true", "scaledobjects", "--all", "-n", NAMESPACE)
    finally:
        prometheus.kill()
        exporter.kill()
        stop_operator(plane, "keda")
        plane.kubectl("delete", "--ignore-not-found", "--wait=false", "namespace", MONITORING, NAMESPACE)
        plane.kubectl("delete", "--ignore-not-found", *[f"crd/{d['metadata']['name']}" for d in documents])


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


def test_prometheus_answers_each_trigger_with_what_vllm_reports(keda_stack: KedaStack) -> None:
    """The ScaledObject's queries, asked of Prometheus as KEDA asks them, give back what the model's one pod
    reports; the series carry the labels the operator's relabeling and vLLM give them, no more."""
    [pod] = keda_stack.scrape_pods()
    keda_stack.choose(pod, waiting=40, kv_cache=0.25)
    keda_stack.wait_for_scrape()
    assert keda_stack.answers() == {"requests-waiting": [40.0], "kv-cache-usage": [0.25]}
    [series] = keda_stack.query(f'vllm:num_requests_waiting{{pod="{pod}"}}')
    assert set(series["metric"]) == {"__name__", "model_name", "engine", "namespace", "pod", "container", "endpoint",
                                     "job", "instance"}


def test_keda_scales_the_deployment_on_vllms_waiting_requests(keda_stack: KedaStack) -> None:
    hpa = keda_stack.lab.kubectl_json("get", "hpa", "keda-hpa-scaled", "-n", NAMESPACE)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "scaled"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 2)
    [pod] = keda_stack.scrape_pods()
    keda_stack.choose(pod, waiting=40, kv_cache=0.25)
    _wait_for("a second replica", lambda: keda_stack.deployment()["spec"]["replicas"] == 2, SCALE_TIMEOUT,
              keda_stack)
    _wait_for("two available replicas",
              lambda: keda_stack.deployment().get("status", {}).get("availableReplicas") == 2, 60, keda_stack)


def test_every_replica_is_scraped_and_the_queries_sum_over_them(keda_stack: KedaStack) -> None:
    """Two pods, each a target of its own: the requests waiting on both, and their KV caches' use, summed (the HPA
    divides by the replicas: the triggers are AverageValue)."""
    if keda_stack.deployment()["spec"]["replicas"] != 2:
        test_keda_scales_the_deployment_on_vllms_waiting_requests(keda_stack)
    first, second = keda_stack.scrape_pods()
    keda_stack.choose(first, waiting=40, kv_cache=0.25)
    keda_stack.choose(second, waiting=5, kv_cache=0.5)
    keda_stack.wait_for_scrape()
    assert keda_stack.answers() == {"requests-waiting": [45.0], "kv-cache-usage": [0.75]}


def test_an_image_bump_goes_up_and_keeps_the_scaled_replicas(keda_stack: KedaStack) -> None:
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
