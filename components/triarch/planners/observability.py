"""What a stack gives a Prometheus Operator to look at, layer by layer, and how plain vLLM scales on its own signals.

Where (Kubernetes): GPU errors from the DCGM exporter, GPUs a pool should advertise and does not, serving pods left
Pending. How (Ray): a RayService that is not ready. When (vLLM): requests queued beyond the batch the tuner gave a
model, a KV cache near full, preemptions, a slow first token. Thresholds come from the plan (each model's tuned
max_num_seqs, each pool's GPUs per node); metric names from the pinned releases (templates/compat/metrics.yaml).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from triarch.config import StackConfig
from triarch.datafiles import read_yaml
from triarch.disaggregation import role_deployment
from triarch.paths import TEMPLATES_DIR
from triarch.planners import picker, pods, repair
from triarch.planners.model_plan import ModelPlan
from triarch.planners.nodegroups import PoolPlan
from triarch.planners.ray import HEAD_PORTS, RAY_SERVICE, WorkerGroupKey
from triarch.planners.serving import RAY_NODE_LABEL
from triarch.planners.vllm import PORT, grace_period_seconds
from triarch.scheduling import POOL_LABEL

METRICS_FILE = TEMPLATES_DIR / "compat" / "metrics.yaml"
RULE_NAME = "triarch-layers"
QUEUE_MINUTES = 5
"""How long requests must wait beyond a full batch (with the GPUs idle) before it is a finding, not a burst."""
KV_FULL = 0.95
"""vllm:kv_cache_usage_perc is a fraction (1 = every block in use)."""
KV_SCALE_TARGET = 0.8
"""KEDA adds a replica when the replicas' KV caches are on average this full."""
GPU_IDLE_PERCENT = 50
RUNBOOK = "docs/runbook.md"
"""Each alert's `runbook` annotation: the page that says, per symptom, which layer to look at."""
XID_FILE = TEMPLATES_DIR / "compat" / "xid.yaml"
XID_WINDOW_MINUTES = 15
"""How long an alert on a new Xid stays firing: the exporter's value is the last Xid and never resets, so the
alert is on its change, which a window turns into a signal that ends."""
DCGM_NAMESPACE_LABEL = "exported_namespace"
DCGM_POD_LABEL = "exported_pod"
"""The DCGM exporter labels each GPU's series with the pod holding it (pod, namespace); its chart's ServiceMonitor
keeps the target's own labels (honorLabels false, which Triarch sets), so Prometheus stores them as exported_*."""


@cache
def metric_names() -> dict[str, Any]:
    return dict(read_yaml(METRICS_FILE))


def vllm_metric(plan: ModelPlan, name: str) -> str:
    """A vLLM metric as the model's engine exports it: vllm:<name> from vLLM's server, ray_vllm_<name> from vLLM
    inside Ray Serve (Ray's prefix, the colon replaced)."""
    if plan.config.engine == "ray-serve":
        return f"{metric_names()['ray']['rayVllmPrefix']}{name}"
    return f"vllm:{name}"


POOL_METRIC_LABEL = "label_" + re.sub(r"[./-]", "_", POOL_LABEL)
"""The pool label as kube-state-metrics exports it on kube_node_labels (label_<name, . / - as _>)."""


def model_selector(plan: ModelPlan, namespace: str) -> str:
    """The PromQL label matchers of one model's vLLM metrics (vLLM labels them with the served model name: a split
    model's name for both its roles)."""
    return f'{{namespace="{namespace}", model_name="{plan.config.name}"}}'


def role_replicas(plan: ModelPlan, namespace: str) -> str:
    """The replicas of a split model's role, as a vector labelled by replica id the way vLLM's Ray stat logger labels
    its series (ReplicaId): Serve's health gauge of the role's deployment, whose `replica` is the same id."""
    assert plan.role is not None
    deployment = role_deployment(plan.role, plan.config.name)
    return (f'label_replace(ray_serve_deployment_replica_healthy{{namespace="{namespace}", '
            f'application="{plan.config.name}", deployment="{deployment}"}}, "ReplicaId", "$1", "replica", "(.+)")')


def of_role(plan: ModelPlan, namespace: str, vector: str) -> str:
    """`vector`, a model's vLLM series (or a rate of them), kept to the replicas of the plan's role where the plan is
    a split model's role (both roles' engines label theirs with the model's name); as it is otherwise."""
    if plan.role is None:
        return vector
    return f"({vector} and on(ReplicaId) {role_replicas(plan, namespace)})"


def quantile_of(q: float, buckets: str) -> str:
    """The q-quantile of a histogram over its series' bucket rates, summed across them."""
    return f"histogram_quantile({q}, sum by (le) ({buckets}))"


def engine_quantile(plan: ModelPlan, namespace: str, q: float, name: str) -> str:
    """The q-quantile over five minutes of one of vLLM's histograms (`time_to_first_token_seconds`, ...) for a
    model's engines, or a split model's role's."""
    buckets = f"rate({vllm_metric(plan, name)}_bucket{model_selector(plan, namespace)}[5m])"
    return quantile_of(q, of_role(plan, namespace, buckets))


def first_token_p90(plan: ModelPlan, namespace: str) -> str:
    """The p90 time to first token of a model's (or a split model's role's) engines over five minutes."""
    return engine_quantile(plan, namespace, 0.9, "time_to_first_token_seconds")


def gpu_pods(plan: ModelPlan, namespace: str) -> str:
    """The DCGM label matchers of the GPUs serving a model: the pods of its Deployment
    (<name>-<pod-template-hash>-<suffix>), of its LeaderWorkerSet where a replica spans nodes (<name>-<group> for
    a leader, <name>-<group>-<index> for a worker), or the Ray worker pods of its worker group, which KubeRay names
    <rayservice>-<suffix>-<group>-worker-<suffix> (the group's GPUs, shared by the models on it)."""
    if plan.config.engine == "ray-serve":
        group = WorkerGroupKey(plan.pool.name, plan.gpus_per_pod).name
        pods_regex = f"{RAY_SERVICE}-[a-z0-9]+-{group}-worker-[a-z0-9]+"
    elif plan.multi_node:
        pods_regex = f"{plan.name}-[0-9]+(-[0-9]+)?"
    else:
        pods_regex = f"{plan.name}-[a-z0-9]+-[a-z0-9]+"
    return f'{{{DCGM_NAMESPACE_LABEL}="{namespace}", {DCGM_POD_LABEL}=~"{pods_regex}"}}'


def queued(plan: ModelPlan, namespace: str) -> str:
    """Requests waiting for a model, where its engine queues them: vLLM's own queue for a vLLM server; Ray Serve's
    router for a Ray Serve model (a replica takes at most max_num_seqs, so the rest wait in Serve, not in vLLM), for a
    split model's role those waiting for the role's deployment."""
    if plan.config.engine == "ray-serve":
        role = f', deployment="{role_deployment(plan.role, plan.config.name)}"' if plan.role else ""
        return (f'sum(ray_serve_deployment_queued_queries{{namespace="{namespace}", '
                f'application="{plan.config.name}"{role}}})')
    return f"sum(vllm:num_requests_waiting{model_selector(plan, namespace)})"


@cache
def xid_classes() -> dict[str, list[int]]:
    """Xid class -> codes (templates/compat/xid.yaml)."""
    loaded = read_yaml(XID_FILE)
    return {name: sorted(int(code) for code in loaded[name]) for name in ("application", "pending", "node")}


def _alert_name(name: str) -> str:
    """'my-model' -> 'MyModel': a stack name as the start of an alert name."""
    return "".join(part.capitalize() for part in name.split("-"))


@dataclass(frozen=True)
class Alert:
    name: str
    layer: str
    expr: str
    minutes: int
    summary: str
    severity: str = "warning"

    def rule(self) -> dict[str, Any]:
        return {"alert": self.name, "expr": self.expr, "for": f"{self.minutes}m",
                "labels": {"severity": self.severity, "layer": self.layer},
                "annotations": {"summary": self.summary, "runbook": RUNBOOK}}


def model_alerts(plan: ModelPlan, namespace: str) -> list[Alert]:
    """When (vLLM): the tuned batch overflowing while the GPUs idle, a full KV cache, preemptions, a slow first
    token against the model's SLO. A split model's role gets its own (its batch, its pool's GPUs, its replicas'
    series), named `<Model>Prefill...`/`<Model>Decode...`; the first token is the model's (split_alerts)."""
    sel = model_selector(plan, namespace)
    seqs = plan.sizing.engine_args["max_num_seqs"]
    name = _alert_name(f"{plan.config.name}-{plan.role}" if plan.role else plan.name)
    who = f"{plan.config.name}'s {plan.role} role" if plan.role else plan.name
    where = "in Ray Serve's router" if plan.config.engine == "ray-serve" else "in vLLM's queue"
    preemptions = f"rate({vllm_metric(plan, 'num_preemptions')}_total{sel}[5m])"
    alerts = [
        Alert(f"{name}RequestsQueuedGpusIdle", "when",
              f"{queued(plan, namespace)} > {seqs} and on() "
              f"avg(DCGM_FI_DEV_GPU_UTIL{gpu_pods(plan, namespace)}) < {GPU_IDLE_PERCENT}",
              QUEUE_MINUTES,
              f"{who}: more requests wait {where} than its batch (max_num_seqs {seqs}) while its GPUs are "
              f"under {GPU_IDLE_PERCENT}% busy: the scheduler, not the GPU, is the bottleneck"),
        Alert(f"{name}KvCacheFull", "when",
              f"max({of_role(plan, namespace, vllm_metric(plan, 'kv_cache_usage_perc') + sel)}) > {KV_FULL}", 10,
              f"{who}: the KV cache is over {KV_FULL:.0%} full ({plan.sizing.kv_cache_tokens} tokens per "
              "replica): requests are preempted or wait; add replicas or lower max_model_len"),
        Alert(f"{name}Preempting", "when", f"sum({of_role(plan, namespace, preemptions)}) > 0", 10,
              f"{who}: vLLM preempts running requests (KV cache exhausted mid-generation)"),
    ]
    slo = plan.config.ttft_slo_seconds
    if slo is not None and plan.role is None:
        alerts.append(Alert(
            f"{name}SlowFirstToken", "when", f"{first_token_p90(plan, namespace)} > {slo}", 10,
            f"{plan.name}: p90 time to first token is over its {slo}s SLO"))
    return alerts


def split_alerts(decode: ModelPlan, prefill: ModelPlan, namespace: str) -> list[Alert]:
    """A split model's own: the first token a client sees, estimated as the two roles' p90s added (no series
    measures it: templates/compat/prefill-decode.yaml userFirstToken; exact when both roles slow together, above it
    otherwise, so the alert errs toward firing), KV transfers failing, and KV caches the prefill role held for a
    decode replica that never read them."""
    sel = model_selector(decode, namespace)
    name = _alert_name(decode.config.name)
    model = decode.config.name

    def nixl(counter: str, window: str) -> str:
        return f"sum(increase({vllm_metric(decode, counter)}_total{sel}[{window}]))"

    alerts = [
        Alert(f"{name}KvTransfersFailing", "when",
              f"{nixl('nixl_num_failed_transfers', '5m')} > 0 or {nixl('nixl_num_failed_notifications', '5m')} > 0",
              5, f"{model}: KV transfers from its prefill role to its decode role fail (vLLM's NIXL connector): "
                 "requests are recomputed or fail; see both roles' logs for the NIXL error"),
        Alert(f"{name}KvCacheExpiredUnread", "when", f"{nixl('nixl_num_kv_expired_reqs', '10m')} > 0", 0,
              f"{model}: its prefill role released KV caches no decode replica read in time: decode replicas "
              "cannot reach prefill (the side channel's ports, a NetworkPolicy) or restarted mid-request"),
    ]
    slo = decode.config.ttft_slo_seconds
    if slo is not None:
        alerts.append(Alert(
            f"{name}SlowFirstToken", "when",
            f"{first_token_p90(prefill, namespace)} + {first_token_p90(decode, namespace)} > {slo}", 10,
            f"{model}: the p90 time to first token, its prefill role's and its decode role's added, is over its "
            f"{slo}s SLO"))
    return alerts


def pool_alerts(pool: PoolPlan) -> list[Alert]:
    """Where: the GPUs a pool's nodes should advertise (nodes x schedulable GPUs per node) against what they do."""
    nodes = f'kube_node_labels{{{POOL_METRIC_LABEL}="{pool.name}"}}'
    name = _alert_name(pool.name)
    # A node without the resource has no allocatable series at all: absent counts as zero GPUs, or the alert would
    # be blind exactly when the device plugin never registered on the pool's nodes.
    return [Alert(
        f"{name}GpusMissing", "where",
        f"count({nodes}) * {pool.schedulable_gpus_per_node} > (sum(kube_node_status_allocatable"
        f'{{resource="nvidia_com_gpu"}} * on(node) group_left() {nodes}) or on() vector(0))', 10,
        f"pool {pool.name}: its nodes advertise fewer GPUs than {pool.schedulable_gpus_per_node} each: the device "
        "plugin is not running there, or a GPU fell off the bus (XID 79)")]


def _xid_is(codes: list[int]) -> str:
    last = "DCGM_FI_DEV_XID_ERRORS"
    return " or ".join(f"{last} == {code}" for code in codes)


def xid_alerts() -> list[Alert]:
    """A GPU's new Xid, by its class: the node's GPU failed (page), a fix waits for a reset, an application faulted
    (warn), or a code Triarch does not classify (warn). On change only: the exporter keeps the last Xid forever."""
    classes = xid_classes()
    changed = f"changes(DCGM_FI_DEV_XID_ERRORS[{XID_WINDOW_MINUTES}m]) > 0"
    known = [code for codes in classes.values() for code in codes]

    def on_change(value: str) -> str:
        return f"max by (Hostname, gpu) (({value}) and on(Hostname, gpu) ({changed}))"

    return [
        Alert("GpuXidNodeError", "where", on_change(_xid_is(classes["node"])), 0,
              "a GPU reported an Xid of its hardware or link (the value: 79 fell off the bus, 48/94/95 memory, "
              "74 NVLink): drain the node", "critical"),
        Alert("GpuXidResetPending", "where", on_change(_xid_is(classes["pending"])), 0,
              "a GPU retired a page or remapped a row (Xid 63): drain the node and reset the GPU to use it"),
        Alert("GpuXidApplicationError", "where", on_change(_xid_is(classes["application"])), 0,
              "an application faulted on a GPU (Xid 13/31/43/45): the GPU is fine; see the serving pod's logs"),
        Alert("GpuXidUnclassified", "where",
              on_change("DCGM_FI_DEV_XID_ERRORS > 0 unless (" + _xid_is(known) + ")"), 0,
              "a GPU reported an Xid Triarch does not classify: look it up in NVIDIA's Xid catalog"),
    ]


def repair_alert() -> Alert:
    """Where node repair is planned: a new Xid the node monitoring agent turns into AcceleratedHardwareReady=False,
    so Karpenter replaces the node after its toleration (templates/compat/node-repair.yaml, the codes and the
    minutes). A warning: the repair is under way; the class alerts above still say what the Xid means."""
    f = repair.facts()
    changed = f"changes(DCGM_FI_DEV_XID_ERRORS[{XID_WINDOW_MINUTES}m]) > 0"
    return Alert("GpuXidNodeRepair", "where",
                 f"max by (Hostname, gpu) (({_xid_is(list(f.repair_xids))}) and on(Hostname, gpu) ({changed}))", 0,
                 f"a GPU reported an Xid node repair acts on ({repair.xids_text()}): the node monitoring agent marks "
                 f"the node {f.condition}={f.status} and Karpenter terminates it {f.toleration_minutes} minutes "
                 f"later without a drain (not while more than {f.max_unhealthy_percent}% of its pool is unhealthy); "
                 "its replicas restart elsewhere")


def cluster_alerts(namespace: str, with_ray: bool, repairs: bool = False) -> list[Alert]:
    alerts = [
        *xid_alerts(),
        *([repair_alert()] if repairs else []),
        Alert("GpuMemoryRowRemapFailure", "where", "max by (Hostname, gpu) (DCGM_FI_DEV_ROW_REMAP_FAILURE) > 0", 1,
              "a GPU could not remap a row of its memory: drain the node and replace the GPU", "critical"),
        Alert("GpuMemoryRowRemapPending", "where",
              f"max by (Hostname, gpu) (increase(DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS[{XID_WINDOW_MINUTES}m])) "
              "> 0", 1,
              "a GPU remapped a row after an uncorrectable memory error: the remap takes effect at the next GPU "
              "reset; drain the node and reset the GPU"),
        Alert("ServingPodsPending", "where",
              f'sum by (pod) (kube_pod_status_phase{{namespace="{namespace}", phase="Pending"}}) > 0', 15,
              f"a pod in {namespace} waits for a node: no pool has a free GPU (see the pool's max, its instance "
              "type's availability, and the placement the plan proved)"),
    ]
    if with_ray:
        alerts.append(Alert(
            "RayServiceNotReady", "how",
            f'max(kuberay_service_condition_ready{{namespace="{namespace}", name="{RAY_SERVICE}", '
            'condition="false"}) == 1', 10,
            f"the RayService {RAY_SERVICE} has no ready serve endpoints: see its status and the head's Serve logs"))
    return alerts


def monitor_labels(stack: StackConfig) -> dict[str, str]:
    return dict(stack.observability.monitor_labels)


def observability_manifests(stack: StackConfig, models: list[ModelPlan], settings: pods.ServingSettings
                            ) -> list[dict[str, Any]]:
    """PodMonitors for the vLLM servers and the Ray pods, and the PrometheusRule; empty without a Prometheus."""
    if stack.prometheus == "none" or not models:
        return []
    namespace = settings.namespace
    labels = {**monitor_labels(stack), **pods.MANAGED_BY}
    objects: list[dict[str, Any]] = []
    if any(m.config.engine == "vllm" for m in models):
        objects.append({"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
                        "metadata": {"name": "vllm", "namespace": namespace, "labels": labels},
                        "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "vllm", **pods.MANAGED_BY}},
                                 "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}]}})
    if any(picker.routed(m) for m in models):
        # The endpoint pickers' own metrics (their container port `metrics`; the chart's metrics auth is off),
        # for the dashboard; alerts and KEDA keep reading vLLM's.
        objects.append({"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
                        "metadata": {"name": "endpoint-picker", "namespace": namespace, "labels": labels},
                        "spec": {"selector": {"matchLabels": dict(picker.MODE_LABEL)},
                                 "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics",
                                                          "interval": "15s"}]}})
    with_ray = any(m.config.engine == "ray-serve" for m in models)
    if with_ray:
        # Every Ray node (head and workers) runs a metrics agent on the same port; the head alone names it.
        objects.append({"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
                        "metadata": {"name": "ray", "namespace": namespace, "labels": labels},
                        "spec": {"selector": {"matchLabels": dict(RAY_NODE_LABEL)},
                                 "podMetricsEndpoints": [{"portNumber": HEAD_PORTS["metrics"], "path": "/metrics",
                                                          "interval": "15s"}]}})
    alerts = cluster_alerts(namespace, with_ray, repair.repairs(stack))
    pools = {m.pool.name: m.pool for m in models}
    for pool in sorted(pools):
        alerts += pool_alerts(pools[pool])
    prefills = {m.config.name: m for m in models if m.role == "prefill"}
    for plan in sorted(models, key=lambda m: m.name):  # by name: reordering the stack's models changes nothing
        alerts += model_alerts(plan, namespace)
        if plan.role == "decode":
            alerts += split_alerts(plan, prefills[plan.config.name], namespace)
    groups = [{"name": f"triarch-{layer}", "rules": [a.rule() for a in alerts if a.layer == layer]}
              for layer in ("where", "how", "when") if any(a.layer == layer for a in alerts)]
    objects.append({"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
                    "metadata": {"name": RULE_NAME, "namespace": namespace, "labels": labels},
                    "spec": {"groups": groups}})
    objects += [scaled_object(stack, plan, namespace) for plan in models
                if plan.config.engine == "vllm" and plan.config.autoscaling is not None]
    return objects


def scaled_object(stack: StackConfig, plan: ModelPlan, namespace: str) -> dict[str, Any]:
    """KEDA scales a vLLM Deployment on what vLLM reports: requests waiting (a tenth of the tuned batch per replica
    is worth another replica) and KV cache use (``KV_SCALE_TARGET`` on average). Scale-down waits longer than a
    replica's drain, one replica at a time, so a scale-down never cuts the requests a pod still finishes."""
    scaling = plan.config.autoscaling
    assert scaling is not None
    seqs = int(plan.sizing.engine_args["max_num_seqs"])
    sel = model_selector(plan, namespace)
    server = stack.observability.prometheus_url
    window = max(300, 2 * grace_period_seconds())
    return {
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
        "metadata": {"name": plan.name, "namespace": namespace, "labels": dict(pods.MANAGED_BY)},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": plan.name},
            "minReplicaCount": scaling.min,
            "maxReplicaCount": scaling.max,
            "pollingInterval": 15,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 60,
                            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]},
                "scaleDown": {"stabilizationWindowSeconds": window,
                              "policies": [{"type": "Pods", "value": 1, "periodSeconds": window}]},
            }}},
            "triggers": [
                {"type": "prometheus", "name": "requests-waiting", "metricType": "AverageValue",
                 "metadata": {"serverAddress": server, "query": f"sum(vllm:num_requests_waiting{sel})",
                              "threshold": str(max(1, seqs // 10))}},
                {"type": "prometheus", "name": "kv-cache-usage", "metricType": "AverageValue",
                 "metadata": {"serverAddress": server, "query": f"sum(vllm:kv_cache_usage_perc{sel})",
                              "threshold": str(KV_SCALE_TARGET)}},
            ],
        },
    }


def scrape_policy(stack: StackConfig, namespace: str, with_ray: bool,
                  with_pickers: bool = False) -> list[dict[str, Any]]:
    """The serving namespace denies ingress by default: let the Prometheus namespace reach the metrics ports."""
    if stack.prometheus == "none":
        return []
    ports = [{"protocol": "TCP", "port": PORT}] + ([{"protocol": "TCP", "port": HEAD_PORTS["metrics"]}]
                                                   if with_ray else [])
    if with_pickers:
        ports.append({"protocol": "TCP", "port": picker.METRICS_PORT})
    source = {"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": stack.observability.namespace}}}
    return [{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
             "metadata": {"name": "allow-prometheus-scrape", "namespace": namespace, "labels": dict(pods.MANAGED_BY)},
             "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"from": [source], "ports": ports}]}}]

