"""Which checks run against a cluster, and in what order: where first (a failure there explains those above it),
each only where the stack installs what it checks."""

from __future__ import annotations

import urllib.request
from collections.abc import Mapping
from functools import partial

from triarch.catalog import Catalog
from triarch.config import StackConfig
from triarch.planners import device_plugin, karpenter, monitoring, repair
from triarch.planners.model_plan import ModelPlan
from triarch.planners.models import uses_efa
from triarch.planners.nodegroups import PoolPlan
from triarch.planners.observability import observability_manifests
from triarch.planners.ray import RAY_SERVICE, WorkerGroupKey
from triarch.planners.serving import KUBERAY_NAMESPACE, serving_settings
from triarch.planners.vllm import LWS_NAME_LABEL, LWS_WORKER_INDEX
from triarch.verify.base import Finding, check_ready
from triarch.verify.cluster import Cluster, KubectlFailed
from triarch.verify.how import check_ray_service
from triarch.verify.repair import check_repair_controller, check_repair_nodes
from triarch.verify.when import check_nccl, check_start, check_vllm, start_times
from triarch.verify.where import (
    DCGM_PORT,
    alert_series,
    check_alert_series,
    check_drivers,
    check_gpu_pods,
    check_nodes,
    holds_gpu,
    prometheus_count,
    prometheus_service,
)

RAY_LOGS = "/tmp/ray/session_latest/logs"
"""Where a Ray worker pod's processes (Serve replicas, vLLM's workers) write their output."""


def _get_text(url: str, timeout: float = 5.0) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.read().decode("utf-8", "replace"))
    except OSError:
        return ""


def verify(cluster: Cluster, stack: StackConfig, models: list[ModelPlan], pools: list[PoolPlan], facts: Catalog,
           endpoints: Mapping[str, str]) -> list[Finding]:
    """Every check, where first (a failure there explains those above it)."""
    nodes = cluster.items("nodes")
    findings = [*check_nodes(nodes, pools), *check_drivers(nodes, stack, models, facts)]
    findings += check_repair_nodes(nodes, pools, repair.repaired_pools(stack))
    if repair.repairs(stack):
        findings += check_repair_controller(cluster.items("deployments", "-n", karpenter.NAMESPACE),
                                            cluster.items("daemonsets", "-n", repair.facts().namespace))
    if stack.device_plugin.mode == "install":
        findings.append(check_ready(cluster.items("daemonsets", "-n", device_plugin.NAMESPACE),
                                    device_plugin.RELEASE, "where", "NVIDIA device plugin"))
    namespace = stack.serving.namespace
    if stack.prometheus != "none" and stack.observability.dcgm_exporter:
        ready = check_ready(cluster.items("daemonsets", "-n", monitoring.DCGM_NAMESPACE), monitoring.DCGM_RELEASE,
                            "where", "DCGM exporter")
        findings.append(ready)
        running = [p["metadata"]["name"] for p in cluster.items("pods", "-n", namespace)
                   if p.get("status", {}).get("phase") == "Running" and holds_gpu(p)]
        if ready.ok and running:
            with cluster.forward(monitoring.DCGM_NAMESPACE, monitoring.DCGM_RELEASE, DCGM_PORT) as url:
                findings.append(check_gpu_pods(_get_text(url + "/metrics"), namespace, running))
    target = prometheus_service(stack.observability.prometheus_url)
    if stack.prometheus != "none" and models and target is not None:
        series = alert_series(observability_manifests(stack, models, serving_settings(stack, False, False)))
        scheme = stack.observability.prometheus_url.split(":", 1)[0]
        with cluster.forward(target[0], target[1], target[2], scheme) as url:
            findings += check_alert_series(series, partial(prometheus_count, url))
    if stack.cluster.create and stack.cluster.provisioner == "karpenter":
        findings.append(check_ready(cluster.items("deployments", "-n", karpenter.NAMESPACE), karpenter.RELEASE,
                                    "where", "Karpenter"))
    served = [m.name for m in models if m.config.engine == "ray-serve"]
    if served and stack.kuberay.mode == "install":
        findings.append(check_ready(cluster.items("deployments", "-n", KUBERAY_NAMESPACE), "kuberay-operator",
                                    "how", "KubeRay operator"))
    if served:
        findings += check_ray_service(cluster.get("rayservice", RAY_SERVICE, "-n", namespace), served)
    for plan in models:
        if uses_efa(plan):
            findings += _nccl_findings(cluster, plan, namespace)
        if plan.config.engine != "vllm":
            continue
        findings += _start_findings(cluster, plan, namespace)
        if plan.name in endpoints:
            findings += check_vllm(plan, endpoints[plan.name])
        else:
            with cluster.forward(namespace, plan.name) as url:
                findings += check_vllm(plan, url)
    return findings


def _start_findings(cluster: Cluster, plan: ModelPlan, namespace: str) -> list[Finding]:
    """Each Ready server pod's start (a multi-node replica's leader: it serves when the group does)."""
    selector = f"app.kubernetes.io/name=vllm,app.kubernetes.io/instance={plan.name}"
    if plan.multi_node:
        selector += f",{LWS_WORKER_INDEX}=0"
    found = []
    for pod in cluster.items("pods", "-n", namespace, "-l", selector):
        conditions = (pod.get("status") or {}).get("conditions") or []
        if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            continue
        try:
            log = cluster.kubectl("logs", "-n", namespace, pod["metadata"]["name"], "-c", "vllm")
        except KubectlFailed:
            log = ""  # the times from the pod's status stand on their own
        found.append(check_start(plan, start_times(pod, log)))
    return found


def _nccl_findings(cluster: Cluster, plan: ModelPlan, namespace: str) -> list[Finding]:
    """The transport NCCL chose, from one leader of a vllm group (its container log) or one Ray worker pod of the
    model's group (its processes' log files)."""
    if plan.config.engine == "vllm":
        pods = cluster.items("pods", "-n", namespace, "-l", f"{LWS_NAME_LABEL}={plan.name},{LWS_WORKER_INDEX}=0")
        if not pods:
            return [Finding("when", f"{plan.name} NCCL", False, "no leader pod", "see the LeaderWorkerSet's events")]
        name = pods[0]["metadata"]["name"]
        return [check_nccl(plan, name, cluster.kubectl("logs", "-n", namespace, name, "-c", "vllm"))]
    group = WorkerGroupKey(plan.pool.name, plan.gpus_per_pod).name
    pods = cluster.items("pods", "-n", namespace, "-l", f"ray.io/group={group}")
    if not pods:
        return [Finding("how", f"{plan.name} NCCL", False, f"no worker pod of group {group}", "")]
    name = pods[0]["metadata"]["name"]
    try:
        log = cluster.kubectl("exec", "-n", namespace, name, "-c", "ray-worker", "--", "grep", "-rh", "NCCL INFO",
                              RAY_LOGS)
    except KubectlFailed:
        log = ""
    return [check_nccl(plan, name, log)]
