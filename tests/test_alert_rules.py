"""Every alert Triarch generates, and every dashboard query, evaluated by promtool (built from the Prometheus module
the pinned kube-prometheus-stack runs) against series shaped as Prometheus stores them after the scrape configs
Triarch deploys: vLLM and Ray through their PodMonitors (job <namespace>/<monitor>, the pod's namespace and name),
the DCGM exporter through its chart's ServiceMonitor (honorLabels false: the GPU's pod and namespace arrive as
exported_pod and exported_namespace), kube-state-metrics and the KubeRay operator as kube-prometheus-stack and
KubeRay's chart scrape them (honorLabels true). Pods are named as their controllers name them: a Deployment's
<name>-<pod-template-hash>-<suffix>, KubeRay's <rayservice>-<suffix>-<group>-worker-<suffix>.

Each rule gets a case where it fires and one where it stays silent; an alert of a kind with no case fails the test.
Scenarios are this file's own, written from what each alert is for, never from the rule's text."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import STACK_NAMES, StackPlan
from triarch.guardrails.workloads import application_llm_configs
from triarch.local import engines
from triarch.local.engines import EngineError

XID = "DCGM_FI_DEV_XID_ERRORS"
ROLE_PREFIXES = {"prefill": "Prefill:", "decode": "Decode:"}
"""Ray 2.60's names for a split application's deployments (serving_patterns/prefill_decode/builder.py)."""
MONITORING = "monitoring"


@pytest.fixture(scope="session")
def promtool() -> Path:
    try:
        return engines.binary("promtool")
    except EngineError as error:
        message = str(error)  # one line: the engine, its version and the command that builds it
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def labels(**given: str) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in given.items()) + "}"


@dataclass(frozen=True)
class Model:
    name: str
    engine: str
    pool: str
    worker_group: str | None
    """The Ray worker group serving it (KubeRay names its pods after it)."""
    slo: float | None = None
    """Its timeToFirstTokenSloSeconds in the stack file."""
    group_size: int = 1
    """Pods per LeaderWorkerSet group, where a vllm replica spans nodes (LWS names them <set>-<group> for the
    leader, <set>-<group>-<index> for the workers)."""
    routed: bool = False
    """A vllm model behind an endpoint picker (prefixRouting.enabled in the stack file)."""
    role: str | None = None
    """A split model's role (disaggregation in the stack file): each role is a Model of the model's name."""
    replica: str = "r1"
    """The replica's id, as vLLM's Ray stat logger labels its series (ReplicaId) and Serve its health (replica)."""

    @property
    def stem(self) -> str:
        """How its alerts' names start: the model's name, and a split model's role, in CamelCase."""
        return "".join(p.capitalize() for p in [*self.name.split("-"), *([self.role] if self.role else [])])

    @property
    def deployment(self) -> str:
        """Its Serve deployment, as Ray 2.60 names it: LLMServer:<model>, or a split model's Prefill:/Decode:."""
        return f"{ROLE_PREFIXES[self.role]}{self.name}" if self.role else f"LLMServer:{self.name}"

    @property
    def pod(self) -> str:
        """One of the model's GPU pods, named as its controller names it."""
        if self.worker_group is not None:
            return f"llm-x7k2p-{self.worker_group}-worker-q9z4c"
        if self.group_size > 1:
            return f"{self.name}-0-{self.group_size - 1}"
        return f"{self.name}-7d9c6b5f48-x2x9z"


@dataclass(frozen=True)
class World:
    """The stack's facts a scenario needs: where its pods run and what they are called."""

    namespace: str
    models: list[Model]
    pools: list[str]

    def pod_job(self, monitor: str, pod: str, **rest: str) -> dict[str, str]:
        return {"job": f"{self.namespace}/{monitor}", "namespace": self.namespace, "pod": pod,
                "instance": "198.18.1.5:8000", **rest}

    def vllm(self, metric: str, model: Model, **rest: str) -> str:
        """A vLLM metric of one model, from its server (PodMonitor vllm) or from vLLM inside Ray (PodMonitor ray)."""
        if model.engine == "ray-serve":
            name = "ray_vllm_" + metric
            got = self.pod_job("ray", model.pod, model_name=model.name, engine="0", Component="core_worker",
                               SessionName="session_2026", ReplicaId=model.replica, **rest)
        else:
            name = "vllm:" + metric
            got = self.pod_job("vllm", model.pod, container="vllm", endpoint="http", model_name=model.name,
                               engine="0", **rest)
        return name + labels(**got)

    def serve_queue(self, model: Model) -> str:
        return "ray_serve_deployment_queued_queries" + labels(**self.pod_job(
            "ray", "llm-x7k2p-head-b8r2m", application=model.name, deployment=model.deployment,
            handle="h1", actor_id="a1"))

    def healthy(self, model: Model) -> str:
        """Serve's controller's gauge of one replica (on the head), which names its deployment."""
        return "ray_serve_deployment_replica_healthy" + labels(**self.pod_job(
            "ray", "llm-x7k2p-head-b8r2m", application=model.name, deployment=model.deployment,
            replica=model.replica))

    def roles(self, model: Model) -> list[Model]:
        """A split model's two roles (the model alone otherwise)."""
        return [m for m in self.models if m.name == model.name] if model.role else [model]

    @staticmethod
    def dcgm(metric: str, pod: str | None = None, namespace: str | None = None, gpu: str = "0",
             node: str = "ip-10-0-1-17.ec2.internal") -> str:
        got = {"job": "dcgm-exporter", "namespace": "gpu-monitoring", "pod": "dcgm-exporter-h4k9s",
               "service": "dcgm-exporter", "endpoint": "metrics", "instance": "198.18.2.1:9400", "gpu": gpu,
               "UUID": f"GPU-{gpu}", "device": f"nvidia{gpu}", "modelName": "NVIDIA L4", "Hostname": node}
        if pod is not None:
            got.update(exported_pod=pod, exported_namespace=namespace or "", exported_container="vllm")
        return metric + labels(**got)

    @staticmethod
    def ksm(metric: str, **rest: str) -> str:
        return metric + labels(job="kube-state-metrics", instance="198.18.3.1:8080", **rest)


Series = list[dict[str, str]]


@dataclass
class Case:
    """Input series and, per evaluation time, whether the alert fires (with the labels its expression keeps)."""

    series: Series
    checks: list[tuple[str, dict[str, str] | None]] = field(default_factory=list)


def s(name: str, values: str) -> dict[str, str]:
    return {"series": name, "values": values}


Scenario = Callable[[World, str], list[Case]]
"""(world, alert name) -> cases."""


def _model_of(world: World, alert: str, suffix: str) -> Model:
    stem = alert.removesuffix(suffix)
    [model] = [m for m in world.models if m.stem == stem]
    return model


def per_role(suffix: str, cases_of: Callable[[World, Model], list[Case]]) -> Scenario:
    """A model's alert; for a split model's role, with both roles' replicas alive (Serve's health gauge), and one
    more case per case that fires: the same trouble on the other role leaves this role's alert silent."""
    def scenario(world: World, alert: str) -> list[Case]:
        model = _model_of(world, alert, suffix)
        cases = cases_of(world, model)
        if model.role is None:
            return cases
        alive = [s(world.healthy(role), "1x40") for role in world.roles(model)]
        [other] = [m for m in world.roles(model) if m.role != model.role]
        elsewhere = [Case(c.series, [(at, None) for at, _ in c.checks]) for c in cases_of(world, other)
                     if any(fired is not None for _, fired in c.checks)]
        return [Case([*alive, *c.series], c.checks) for c in [*cases, *elsewhere]]
    return scenario


def xid_cases(kind: str) -> Scenario:
    """Xids by class, on change: the exporter's value is the last Xid and never resets."""
    fires_on = {"GpuXidNodeError": "79", "GpuXidResetPending": "63", "GpuXidApplicationError": "13",
                "GpuXidUnclassified": "109", "GpuXidNodeRepair": "79"}[kind]
    other = "13" if kind != "GpuXidApplicationError" else "79"
    where = {"Hostname": "ip-10-0-1-17.ec2.internal", "gpu": "0"}

    def cases(world: World, alert: str) -> list[Case]:
        return [
            # a new Xid of this class: fires at once, and ends once the window has passed with no new one
            Case([s(world.dcgm(XID), f"0x5 {fires_on}x60")], [("3m", None), ("7m", where), ("30m", None)]),
            # another class: this one stays silent
            Case([s(world.dcgm(XID), f"0x5 {other}x60")], [("7m", None)]),
            # a value that was there before (an exporter that has kept it for hours): no change, no alert
            Case([s(world.dcgm(XID), f"{fires_on}x60")], [("30m", None)]),
        ]
    return cases


def row_remap_failure(world: World, alert: str) -> list[Case]:
    where = {"Hostname": "ip-10-0-1-17.ec2.internal", "gpu": "1"}
    name = world.dcgm("DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu="1")
    return [Case([s(name, "0x3 1x20")], [("10m", where)]), Case([s(name, "0x20")], [("10m", None)])]


def row_remap_pending(world: World, alert: str) -> list[Case]:
    where = {"Hostname": "ip-10-0-1-17.ec2.internal", "gpu": "1"}
    name = world.dcgm("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", gpu="1")
    # a new remapped row pages for the window; rows remapped long ago (a counter that stands still) do not
    return [Case([s(name, "2x5 3x40")], [("8m", where), ("40m", None)]), Case([s(name, "2x40")], [("20m", None)])]


def pods_pending(world: World, alert: str) -> list[Case]:
    pod = "embed-6c8f9b7d4-k2m8q"
    pending = world.ksm("kube_pod_status_phase", namespace=world.namespace, pod=pod, uid="u1", phase="Pending")
    elsewhere = world.ksm("kube_pod_status_phase", namespace="default", pod="other-1", uid="u2", phase="Pending")
    return [Case([s(pending, "1x30")], [("10m", None), ("20m", {"pod": pod})]),
            Case([s(pending, "1x5 0x25"), s(elsewhere, "1x30")], [("20m", None)])]


def ray_not_ready(world: World, alert: str) -> list[Case]:
    def ready(condition: str) -> str:
        return "kuberay_service_condition_ready" + labels(job="kuberay-operator", instance="198.18.3.2:8080",
                                                          namespace=world.namespace, name="llm", condition=condition)
    return [Case([s(ready("false"), "1x20"), s(ready("true"), "0x20")], [("15m", {})]),
            Case([s(ready("false"), "0x20"), s(ready("true"), "1x20")], [("15m", None)])]


def gpus_missing(world: World, alert: str) -> list[Case]:
    pool = next(p for p in world.pools if "".join(x.capitalize() for x in p.split("-")) + "GpusMissing" == alert)
    node = "ip-10-0-1-17.ec2.internal"
    label = world.ksm("kube_node_labels", node=node, label_triarch_dev_pool=pool)
    gpus = world.ksm("kube_node_status_allocatable", node=node, resource="nvidia_com_gpu", unit="integer")
    cpu = world.ksm("kube_node_status_allocatable", node=node, resource="cpu", unit="core")
    return [
        # the device plugin never registered: the node has no GPU resource at all
        Case([s(label, "1x20"), s(cpu, "8x20")], [("15m", {})]),
        # it registered, and then the GPUs went (XID 79): zero
        Case([s(label, "1x20"), s(gpus, "0x20")], [("15m", {})]),
        Case([s(label, "1x20"), s(gpus, "1000x20")], [("15m", None)]),
        # a node of another pool without GPUs says nothing about this one
        Case([s(world.ksm("kube_node_labels", node="n2", label_triarch_dev_pool="other"), "1x20")], [("15m", None)]),
    ]


def queued_gpus_idle(world: World, model: Model) -> list[Case]:
    busy_gpu = world.dcgm("DCGM_FI_DEV_GPU_UTIL", pod=model.pod, namespace=world.namespace)
    if model.engine == "ray-serve":
        # Serve's router holds what the replicas do not take; vLLM's own queue stays empty
        queue = [s(world.serve_queue(model), "100000x20"), s(world.vllm("num_requests_waiting", model), "0x20")]
        empty = [s(world.serve_queue(model), "0x20"), s(world.vllm("num_requests_waiting", model), "0x20")]
    else:
        queue = [s(world.vllm("num_requests_waiting", model), "100000x20")]
        empty = [s(world.vllm("num_requests_waiting", model), "0x20")]
    someone_else = world.dcgm("DCGM_FI_DEV_GPU_UTIL", pod="another-5f6d7c8b9-abcde", namespace=world.namespace,
                              gpu="3")
    return [
        Case([*queue, s(busy_gpu, "10x20")], [("3m", None), ("8m", {})]),
        Case([*queue, s(busy_gpu, "95x20")], [("8m", None)]),  # the GPU is the limit: not this alert
        # idle means under half busy: 45% is, 55% is not
        Case([*queue, s(busy_gpu, "45x20")], [("8m", {})]),
        Case([*queue, s(busy_gpu, "55x20")], [("8m", None)]),
        Case([*empty, s(busy_gpu, "10x20")], [("8m", None)]),
        # only another workload's GPUs are seen idle: nothing about this model's
        Case([*queue, s(someone_else, "10x20")], [("8m", None)]),
    ]


def kv_full(world: World, model: Model) -> list[Case]:
    name = world.vllm("kv_cache_usage_perc", model)
    # Above 95% it fires; at 93%, where KEDA already adds replicas (test_observability), it stays silent.
    return [Case([s(name, "0.99x20")], [("5m", None), ("12m", {})]), Case([s(name, "0.6x20")], [("12m", None)]),
            Case([s(name, "0.97x20")], [("12m", {})]), Case([s(name, "0.93x20")], [("12m", None)])]


def preempting(world: World, model: Model) -> list[Case]:
    name = world.vllm("num_preemptions_total", model)
    return [Case([s(name, "0+3x30")], [("15m", {})]), Case([s(name, "7x30")], [("15m", None)])]


def slow_first_token(world: World, alert: str) -> list[Case]:
    stem = alert.removesuffix("SlowFirstToken")
    split = [m for m in world.models if m.role and m.stem == stem + m.role.capitalize()]
    if split:
        return split_first_token(world, split)
    model = _model_of(world, alert, "SlowFirstToken")

    def bucket(le: str) -> str:
        return world.vllm("time_to_first_token_seconds_bucket", model, le=le)
    slow = [s(bucket("0.1"), "0x30"), s(bucket("1000"), "0+10x30"), s(bucket("+Inf"), "0+10x30")]
    fast = [s(bucket("0.1"), "0+10x30"), s(bucket("1000"), "0+10x30"), s(bucket("+Inf"), "0+10x30")]
    assert model.slo is not None

    def near(low: float, high: float) -> list[dict[str, str]]:
        """Every first token between low and high x the SLO: the p90 interpolates to low + 0.9 (high - low)."""
        return [s(bucket(f"{low * model.slo:g}"), "0x30"), s(bucket(f"{high * model.slo:g}"), "0+10x30"),
                s(bucket("+Inf"), "0+10x30")]
    # p90 at 1.28 x the SLO fires, at 0.86 x it does not: the threshold is the stack's SLO
    return [Case(slow, [("20m", {})]), Case(fast, [("20m", None)]),
            Case(near(1.1, 1.3), [("20m", {})]), Case(near(0.5, 0.9), [("20m", None)])]


def split_first_token(world: World, roles: list[Model]) -> list[Case]:
    """A split model's first token: a client waits for its prefill role's, then its decode role's (the KV transfer
    included), so the p90s of the two roles add up against the SLO, and neither alone, nor both blended, is it."""
    [prefill] = [m for m in roles if m.role == "prefill"]
    [decode] = [m for m in roles if m.role == "decode"]
    slo = decode.slo
    assert slo is not None
    alive = [s(world.healthy(role), "1x40") for role in roles]

    def between(model: Model, low: float, high: float) -> list[dict[str, str]]:
        """Every first token of the role between low and high x the SLO: its p90 is low + 0.9 (high - low)."""
        def bucket(le: str) -> str:
            return world.vllm("time_to_first_token_seconds_bucket", model, le=le)
        return [s(bucket(f"{low * slo:g}"), "0x30"), s(bucket(f"{high * slo:g}"), "0+10x30"),
                s(bucket("+Inf"), "0+10x30")]

    return [
        # each role under the SLO (0.64 and 0.54 x), together over it (1.18 x): fires
        Case([*alive, *between(prefill, 0.55, 0.65), *between(decode, 0.45, 0.55)], [("20m", {})]),
        # 0.19 + 0.69 = 0.88 x: silent; both roles' series blended would read 0.68 x for each and fire
        Case([*alive, *between(prefill, 0.1, 0.2), *between(decode, 0.6, 0.7)], [("20m", None)]),
        # a slow prefill alone (1.28 x)
        Case([*alive, *between(prefill, 1.1, 1.3), *between(decode, 0.01, 0.02)], [("20m", {})]),
    ]


def kv_transfers_failing(world: World, alert: str) -> list[Case]:
    """Failures the decode engines' NIXL connector counts (transfers, and the notifications that free the prefill's
    blocks), for five minutes; failures long over do not page."""
    model = _model_of(world, alert.removesuffix("KvTransfersFailing") + "Decode", "")
    failed = world.vllm("nixl_num_failed_transfers_total", model)
    notices = world.vllm("nixl_num_failed_notifications_total", model)
    return [Case([s(failed, "0+2x30")], [("3m", None), ("10m", {})]),
            Case([s(notices, "0+1x30")], [("10m", {})]),
            Case([s(failed, "4x30"), s(notices, "3x30")], [("10m", None)])]


def kv_expired_unread(world: World, alert: str) -> list[Case]:
    """The prefill engines released KV caches no decode replica read: at once, for ten minutes after."""
    model = _model_of(world, alert.removesuffix("KvCacheExpiredUnread") + "Prefill", "")
    expired = world.vllm("nixl_num_kv_expired_reqs_total", model)
    return [Case([s(expired, "0x5 1x30")], [("4m", None), ("7m", {}), ("25m", None)]),
            Case([s(expired, "3x30")], [("20m", None)])]


SCENARIOS: list[tuple[re.Pattern[str], Scenario]] = [
    (re.compile(r"GpuXid(NodeError|ResetPending|ApplicationError|Unclassified|NodeRepair)"),
     lambda world, alert: xid_cases(alert)(world, alert)),
    (re.compile(r"GpuMemoryRowRemapFailure"), row_remap_failure),
    (re.compile(r"GpuMemoryRowRemapPending"), row_remap_pending),
    (re.compile(r"ServingPodsPending"), pods_pending),
    (re.compile(r"RayServiceNotReady"), ray_not_ready),
    (re.compile(r"\w+GpusMissing"), gpus_missing),
    (re.compile(r"\w+RequestsQueuedGpusIdle"), per_role("RequestsQueuedGpusIdle", queued_gpus_idle)),
    (re.compile(r"\w+KvCacheFull"), per_role("KvCacheFull", kv_full)),
    (re.compile(r"\w+Preempting"), per_role("Preempting", preempting)),
    (re.compile(r"\w+SlowFirstToken"), slow_first_token),
    (re.compile(r"\w+KvTransfersFailing"), kv_transfers_failing),
    (re.compile(r"\w+KvCacheExpiredUnread"), kv_expired_unread),
]


def world_of(plan: StackPlan) -> World:
    [rule] = plan.objects("PrometheusRule")
    namespace = rule["metadata"]["namespace"]
    groups: dict[tuple[str, int], str] = {}
    for service in plan.objects("RayService"):
        for group in service["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
            pool, _, gpus = group["groupName"].rpartition("-")
            groups[(pool, int(gpus.removesuffix("gpu")))] = group["groupName"]
        serve = yaml.safe_load(service["spec"]["serveConfigV2"])
        # per application and role (None, or a split's prefill/decode): the GPUs of one replica
        ray_gpus = {(app["name"], where.removesuffix("_config") if where.endswith("_config") else None):
                    int(c["engine_kwargs"].get("tensor_parallel_size", 1))
                    * int(c["engine_kwargs"].get("pipeline_parallel_size", 1))
                    for app in serve["applications"] for where, c in application_llm_configs(app)}
    sizes = {s["metadata"]["name"]: s["spec"]["leaderWorkerTemplate"]["size"]
             for s in plan.objects("LeaderWorkerSet")}
    models = []
    for entry in plan.config["triarch:models"]:
        split = entry.get("disaggregation")
        roles: list[tuple[str | None, str]] = (
            [(role, (split.get(role) or {}).get("nodeGroup", entry["nodeGroup"])) for role in ("prefill", "decode")]
            if split and split.get("enabled", True) else [(None, entry["nodeGroup"])])
        for role, pool_name in roles:
            group = None
            if entry.get("engine") == "ray-serve":
                # a worker pod holds one replica, or one node of a replica that spans several
                gpus = next(g for (app, where), g in ray_gpus.items() if app == entry["name"] and where == role)
                group = groups.get((pool_name, gpus)) or next(
                    name for (pool, per_pod), name in groups.items() if pool == pool_name and gpus % per_pod == 0)
            models.append(Model(entry["name"], entry.get("engine", "vllm"), pool_name, group,
                                entry.get("timeToFirstTokenSloSeconds"), sizes.get(entry["name"], 1),
                                entry.get("engine", "vllm") == "vllm"
                                and bool((entry.get("prefixRouting") or {}).get("enabled")),
                                role, f"{role[0]}{len(models)}x7" if role else "r1"))
    return World(namespace, models, sorted({m.pool for m in models}))


def rule_file(plan: StackPlan, directory: Path) -> tuple[Path, dict[str, dict[str, Any]]]:
    [rule] = plan.objects("PrometheusRule")
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    return path, {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def unit_tests(world: World, rules: dict[str, dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """promtool's tests for every rule, and which rules have a case that fires and one that does not."""
    tests: list[dict[str, Any]] = []
    seen: dict[str, list[str]] = {}
    for alert, rule in sorted(rules.items()):
        scenario = next((make for pattern, make in SCENARIOS if pattern.fullmatch(alert)), None)
        assert scenario is not None, f"no scenario for alert {alert}: write one where it fires, one where it does not"
        for case in scenario(world, alert):
            checks = []
            for at, fired in case.checks:
                expected = [] if fired is None else [{"exp_labels": {**fired, **rule["labels"]},
                                                      "exp_annotations": rule["annotations"]}]
                checks.append({"eval_time": at, "alertname": alert, "exp_alerts": expected})
                seen.setdefault(alert, []).append("fires" if fired is not None else "silent")
            tests.append({"name": f"{alert} {len(tests)}", "interval": "1m", "input_series": case.series,
                          "alert_rule_test": checks})
    return tests, seen


def run_promtool(promtool: Path, directory: Path, rules: Path, tests: list[dict[str, Any]]
                 ) -> subprocess.CompletedProcess[str]:
    path = directory / "tests.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests},
                                   sort_keys=False))
    return subprocess.run([str(promtool), "test", "rules", str(path)], capture_output=True, text=True, timeout=300,
                          check=False)


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_every_alert_fires_when_it_should_and_only_then(promtool: Path, shipped: dict[str, StackPlan], stack: str,
                                                        tmp_path: Path) -> None:
    plan = shipped[stack]
    if not plan.objects("PrometheusRule"):  # only a stack with no Prometheus to read them goes without alerts
        assert not plan.objects("PodMonitor") and not [
            r for r in plan.of_type("kubernetes:helm.sh/v3:Release") if r.name == "kube-prometheus-stack"], stack
        return
    rules, by_name = rule_file(plan, tmp_path)
    checked = subprocess.run([str(promtool), "check", "rules", str(rules)], capture_output=True, text=True,
                             timeout=120, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tests, seen = unit_tests(world_of(plan), by_name)
    assert {alert: sorted(set(kinds)) for alert, kinds in seen.items()} == {
        alert: ["fires", "silent"] for alert in by_name}
    done = run_promtool(promtool, tmp_path, rules, tests)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]


def test_a_broken_alert_fails_its_scenario(promtool: Path, shipped: dict[str, StackPlan], tmp_path: Path) -> None:
    """The harness itself: the old latching Xid alert (any Xid, forever) fails the case of a Xid that is over."""
    plan = shipped["prod"]
    rules, by_name = rule_file(plan, tmp_path)
    groups = yaml.safe_load(rules.read_text())["groups"]
    for group in groups:
        for rule in group["rules"]:
            if rule["alert"] == "GpuXidApplicationError":
                rule["expr"] = f"max by (Hostname, gpu) ({XID}) > 0"
    rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    tests, _ = unit_tests(world_of(plan), {"GpuXidApplicationError": by_name["GpuXidApplicationError"]})
    done = run_promtool(promtool, tmp_path, rules, tests)
    assert done.returncode != 0
    assert "GpuXidApplicationError" in done.stdout + done.stderr


def busy_world(world: World) -> Series:
    """Every series the dashboard shows, as a serving stack under load produces them."""
    node = "ip-10-0-1-17.ec2.internal"
    series = [s(world.ksm("kube_node_labels", node=f"{node}-{pool}", label_triarch_dev_pool=pool), "1x30")
              for pool in world.pools]
    series += [s(world.ksm("kube_node_status_allocatable", node=f"{node}-{pool}", resource="nvidia_com_gpu",
                           unit="integer"), "4x30") for pool in world.pools]
    for index, model in enumerate(world.models):
        series += [
            s(world.ksm("kube_pod_container_resource_requests", namespace=world.namespace, pod=model.pod,
                        container="vllm", node=node, resource="nvidia_com_gpu", unit="integer"), "1x30"),
            s(world.dcgm("DCGM_FI_DEV_GPU_UTIL", pod=model.pod, namespace=world.namespace, gpu=str(index)), "60x30"),
            s(world.dcgm("DCGM_FI_DEV_FB_USED", pod=model.pod, namespace=world.namespace, gpu=str(index)), "20000x30"),
            s(world.vllm("num_requests_running", model), "12x30"),
            s(world.vllm("num_requests_waiting", model), "3x30"),
            s(world.vllm("kv_cache_usage_perc", model), "0.4x30"),
            s(world.vllm("generation_tokens_total", model), "0+600x30"),
            s(world.vllm("num_preemptions_total", model), "0+1x30"),
        ]
        for histogram in ("time_to_first_token_seconds", "inter_token_latency_seconds"):
            series += [s(world.vllm(f"{histogram}_bucket", model, le=le), f"0+{rate}x30")
                       for le, rate in (("0.05", "5"), ("0.5", "8"), ("+Inf", "10"))]
        if model.routed:
            series += picker_series(world, model)
        if model.engine == "ray-serve":
            deployment = {"application": model.name, "deployment": model.deployment}
            series += [
                s(world.serve_queue(model), "2x30"),
                s("ray_serve_num_ongoing_requests_at_replicas" + labels(**world.pod_job(
                    "ray", model.pod, handle="h1", actor_id="a1", **deployment)), "12x30"),
                s(world.healthy(model), "1x30"),
                s("ray_serve_autoscaling_target_replicas" + labels(**world.pod_job(
                    "ray", "llm-x7k2p-head-b8r2m", **deployment)), "1x30"),
            ]
        if model.role == "decode":  # its engines read the KV caches over NIXL and count what moved
            series += [s(world.vllm("nixl_xfer_time_seconds_bucket", model, le=le), f"0+{rate}x30")
                       for le, rate in (("0.01", "5"), ("0.1", "8"), ("+Inf", "10"))]
            series += [s(world.vllm("nixl_bytes_transferred_sum", model), "0+2000000x30"),
                       s(world.vllm("nixl_num_failed_transfers_total", model), "0x30"),
                       s(world.vllm("nixl_num_failed_notifications_total", model), "0x30")]
        if model.role == "prefill":
            series += [s(world.vllm("nixl_num_kv_expired_reqs_total", model), "0x30")]
    return series


def picker_series(world: World, model: Model) -> Series:
    """A routed model's endpoint picker under load, as the picker of llm-d-router v0.10.0 labels its series and the
    PodMonitor endpoint-picker scrapes them from the chart's pod (Deployment <model>-pool-epp)."""
    def picker(metric: str, **rest: str) -> str:
        return metric + labels(**{**world.pod_job("endpoint-picker", f"{model.name}-pool-epp-6c9f8d7b5-k2x7q",
                                                   container="epp", endpoint="metrics"), **rest})
    request = {"model_name": model.name, "target_model_name": model.name, "fairness_id": "", "priority": "0"}
    series = [s(picker("llm_d_epp_request_total", **request), "0+60x30"),
              s(picker("llm_d_epp_request_error_total", **request, error_code="ServiceUnavailable"), "0+1x30"),
              s(picker("llm_d_epp_ready_endpoints", name=f"{model.name}-pool"), "2x30"),
              s(picker("llm_d_epp_average_queue_size", name=f"{model.name}-pool"), "1x30")]
    for histogram, extra in (("llm_d_epp_request_duration_seconds", request),
                             ("llm_d_epp_request_ttft_seconds", {**request, "streaming": "true"}),
                             ("llm_d_epp_scheduler_e2e_duration_seconds", {})):
        series += [s(picker(f"{histogram}_bucket", **extra, le=le), f"0+{rate}x30")
                   for le, rate in (("0.001", "5"), ("0.5", "8"), ("+Inf", "10"))]
    prefix = {"plugin_name": "approx-prefix-cache-producer", "plugin_type": "approx-prefix-cache-producer"}
    series += [s(picker("llm_d_epp_prefix_indexer_hit_ratio_sum", **prefix), "0+6x30"),
               s(picker("llm_d_epp_prefix_indexer_hit_ratio_count", **prefix), "0+10x30")]
    return series


def dashboard_queries(plan: StackPlan) -> list[tuple[str, str]]:
    [board] = [c for c in plan.objects("ConfigMap") if c["metadata"]["name"] == "triarch-layers"]
    model = json.loads(next(iter(board["data"].values())))
    return [(panel["title"], target["expr"]) for panel in model["panels"] if panel.get("type") != "row"
            for target in panel.get("targets", [])]


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_every_dashboard_query_shows_the_data_it_is_for(promtool: Path, shipped: dict[str, StackPlan], stack: str,
                                                        tmp_path: Path) -> None:
    """Each panel's query, evaluated on a busy stack's series, returns something: a query selecting a label the
    series do not carry (pod for the DCGM exporter's exported_pod, say) draws an empty panel."""
    plan = shipped[stack]
    if not plan.objects("PrometheusRule"):
        assert not [c for c in plan.objects("ConfigMap") if c["metadata"]["name"] == "triarch-layers"], stack
        return
    world = world_of(plan)
    queries = dashboard_queries(plan)
    assert len(queries) >= 5 + 4 * len(world.models)
    rules = tmp_path / "none.yaml"
    rules.write_text("groups: []\n")
    tests = [{"name": "dashboard", "interval": "1m", "input_series": busy_world(world),
              "promql_expr_test": [{"expr": f"clamp_max(count({expr}), 1)", "eval_time": "20m",
                                    "exp_samples": [{"labels": "{}", "value": 1}]} for _, expr in queries]}]
    done = run_promtool(promtool, tmp_path, rules, tests)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
