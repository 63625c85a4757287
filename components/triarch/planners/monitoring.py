"""The add-ons Triarch installs for monitoring and autoscaling, as chart values: the DCGM exporter on GPU nodes
only (GPU health and use, per pod), and KEDA (autoscaling plain vLLM on its own metrics)."""

from __future__ import annotations

from typing import Any

from triarch.config import StackConfig
from triarch.planners import pods
from triarch.planners.serving import BLOCK_STORAGE_CLASS
from triarch.scheduling import GPU_PRESENT_LABEL, POOL_LABEL, SYSTEM_POOL, gpu_toleration

DCGM_NAMESPACE = "gpu-monitoring"
DCGM_RELEASE = "dcgm-exporter"
KEDA_NAMESPACE = "keda"
KEDA_RELEASE = "keda"


def dcgm_namespace() -> dict[str, Any]:
    return pods.namespace(
        DCGM_NAMESPACE, "privileged",
        "the DCGM exporter reads the kubelet's pod-resources socket (hostPath) to name the pod holding each GPU; "
        "the socket is root's, so the exporter runs as root with every capability dropped (no SYS_ADMIN, no "
        "privilege escalation), and nothing else runs here")


def dcgm_values(stack: StackConfig) -> dict[str, Any]:
    """On GPU nodes only, tolerating their taint. As root, the owner of the kubelet's pod-resources socket (a
    non-root exporter cannot open it and labels no GPU with its pod), with every capability dropped: the chart's
    default adds SYS_ADMIN for the DCP profiling fields, DCGM_FI_PROF_*, which no Triarch alert reads. Helm merges
    values maps key by key, so `add` is replaced by an empty list, not left out. A ServiceMonitor with the labels the
    cluster's Prometheus selects, keeping the target's labels (the exporter's pod/namespace arrive as exported_*,
    which the alerts and the dashboard select on). Every key exists in the chart's values.yaml (4.8.2)."""
    return {
        "nodeSelector": {GPU_PRESENT_LABEL: "true"},
        "tolerations": [gpu_toleration()],
        "securityContext": {"runAsNonRoot": False, "runAsUser": 0, "allowPrivilegeEscalation": False,
                            "capabilities": {"add": [], "drop": ["ALL"]}},
        "serviceMonitor": {"enabled": True, "honorLabels": False,
                           "additionalLabels": dict(stack.observability.monitor_labels)},
    }


def keda_namespace() -> dict[str, Any]:
    return pods.namespace(KEDA_NAMESPACE, "restricted",
                          "the KEDA operator and metrics server run non-root, read-only, with no capabilities")


def keda_values(stack: StackConfig) -> dict[str, Any]:
    """CRDs from the chart's templates (upgraded with it); on the system nodes of a created cluster. Every key
    exists in the chart's values.yaml (2.20.2)."""
    values: dict[str, Any] = {"crds": {"install": True}}
    if stack.cluster.create:
        values["nodeSelector"] = {POOL_LABEL: SYSTEM_POOL}
    return values


PROMETHEUS_RELEASE = "kube-prometheus-stack"
"""Its name shapes the Services (kube-prometheus-stack-prometheus, the URL KEDA queries by default) and the
`release` label its Prometheus selects monitors and rules by (observability.monitorLabels' default)."""
PROMETHEUS_CRDS_RELEASE = "prometheus-operator-crds"
GRAFANA_ADMIN_SECRET = "grafana-admin"
GRAFANA_ADMIN_USER = "admin"
GRAFANA_SECRET_KEYS = {"user": "admin-user", "password": "admin-password"}
"""The Secret Grafana reads its admin credentials from (its chart's admin.existingSecret, userKey, passwordKey)."""


def prometheus_namespace(stack: StackConfig) -> dict[str, Any]:
    return pods.namespace(
        stack.observability.namespace, "privileged",
        "the node exporter reads each node's /proc and /sys through hostPath with the host's network and PID "
        "namespaces, as kube-prometheus-stack ships it; Prometheus, Grafana and the operator run beside it")


def prometheus_values(stack: StackConfig) -> dict[str, Any]:
    """kube-prometheus-stack 88.5.3: its CRDs left to their own release; kube-state-metrics exports the pool label
    of nodes (the GPUs-missing alert and the dashboard group by it); operator, Prometheus, Alertmanager and
    kube-state-metrics on the system nodes of a created cluster (the GPU nodes' taint keeps the rest off them).
    Every key exists in the chart's values.yaml at 88.5.3 (or in kube-state-metrics 8.4.0's), read at
    prometheus-community/helm-charts cf408a290; ../shared has no copy to test against."""
    values: dict[str, Any] = {
        "crds": {"enabled": False},
        "kube-state-metrics": {"metricLabelsAllowlist": [f"nodes=[{POOL_LABEL}]"]},
        # The admin password from a Secret Triarch writes (a Pulumi secret), never the chart's default.
        "grafana": {"admin": {"existingSecret": GRAFANA_ADMIN_SECRET, "userKey": GRAFANA_SECRET_KEYS["user"],
                              "passwordKey": GRAFANA_SECRET_KEYS["password"]}},
    }
    # Its data on a volume claim that outlives the pod, within the volume (retentionSize, in Prometheus' GB, base 2).
    claim: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": f"{stack.observability.storage_gib}Gi"}}}
    if stack.cluster.create:
        claim["storageClassName"] = BLOCK_STORAGE_CLASS
    spec: dict[str, Any] = {
        "retention": stack.observability.retention,
        "retentionSize": f"{stack.observability.storage_gib * 85 // 100}GB",
        "storageSpec": {"volumeClaimTemplate": {"spec": claim}},
    }
    values["prometheus"] = {"prometheusSpec": spec}
    if stack.cluster.create:
        system = {POOL_LABEL: SYSTEM_POOL}
        values["prometheusOperator"] = {"nodeSelector": system}
        spec["nodeSelector"] = system
        values["alertmanager"] = {"alertmanagerSpec": {"nodeSelector": system}}
        values["kube-state-metrics"]["nodeSelector"] = system
    return values
