"""A Grafana dashboard laid out by layer, built with grafana-foundation-sdk and shipped as a ConfigMap that Grafana's
dashboard sidecar loads (kube-prometheus-stack's Grafana watches ConfigMaps labelled grafana_dashboard=1).

Where: GPUs each pool advertises and the pods request, GPU nodes per pool, GPU use and memory per pod.
How: Ray Serve replicas, queued and ongoing requests. When: running and waiting requests, KV cache use, time to
first token and between tokens, tokens per second and preemptions, per model (vLLM's own names, or Ray's
ray_vllm_ ones). Routing, for each vllm model behind an endpoint picker: requests and errors through it, their
latency and the picker's own, the pool's ready endpoints and queue, how much of each prompt its prefix index had seen
(the picker's own names, llm-d-router v0.10.0, templates/compat/metrics.yaml endpointPicker)."""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.timeseries import Panel
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from triarch.config import StackConfig
from triarch.planners import picker, pods
from triarch.planners.model_plan import ModelPlan
from triarch.planners.observability import (
    DCGM_NAMESPACE_LABEL,
    DCGM_POD_LABEL,
    POOL_METRIC_LABEL,
    engine_quantile,
    first_token_p90,
    model_selector,
    of_role,
    quantile_of,
    queued,
    vllm_metric,
)

DASHBOARD_UID = "triarch-layers"
SIDECAR_LABEL = {"grafana_dashboard": "1"}
"""The label kube-prometheus-stack's Grafana sidecar looks for (its default `sidecar.dashboards.label`)."""
POOL = POOL_METRIC_LABEL


def _panel(title: str, unit: str, *queries: tuple[str, str]) -> Panel:
    panel = Panel().title(title).unit(unit)
    for expr, legend in queries:
        panel = panel.with_target(Dataquery().expr(expr).legend_format(legend))
    return panel


def _where(namespace: str) -> list[Panel]:
    pool_nodes = f"kube_node_labels{{{POOL}!=\"\"}}"
    return [
        _panel("GPUs advertised per pool", "short",
               (f'sum by ({POOL}) (kube_node_status_allocatable{{resource="nvidia_com_gpu"}} * on(node) '
                f"group_left({POOL}) {pool_nodes})", f"{{{{{POOL}}}}}")),
        _panel("GPU nodes per pool (nodes coming and going)", "short",
               (f"count by ({POOL}) ({pool_nodes})", f"{{{{{POOL}}}}}")),
        _panel("GPUs requested by serving pods", "short",
               (f'sum(kube_pod_container_resource_requests{{namespace="{namespace}", resource="nvidia_com_gpu"}})',
                "requested")),
        _panel("GPU utilisation per pod", "percent",
               (f'avg by ({DCGM_POD_LABEL}) (DCGM_FI_DEV_GPU_UTIL{{{DCGM_NAMESPACE_LABEL}="{namespace}"}})',
                f"{{{{{DCGM_POD_LABEL}}}}}")),
        _panel("GPU memory used per pod", "decmbytes",
               (f'sum by ({DCGM_POD_LABEL}) (DCGM_FI_DEV_FB_USED{{{DCGM_NAMESPACE_LABEL}="{namespace}"}})',
                f"{{{{{DCGM_POD_LABEL}}}}}")),
    ]


def _how() -> list[Panel]:
    return [
        _panel("Ray Serve replicas: healthy and target", "short",
               ("sum by (deployment) (ray_serve_deployment_replica_healthy)", "{{deployment}} healthy"),
               ("max by (deployment) (ray_serve_autoscaling_target_replicas)", "{{deployment}} target")),
        _panel("Ray Serve requests: queued and ongoing", "short",
               ("sum by (deployment) (ray_serve_deployment_queued_queries)", "{{deployment}} queued"),
               ("sum by (deployment) (ray_serve_num_ongoing_requests_at_replicas)", "{{deployment}} ongoing")),
    ]


def _when(plan: ModelPlan, namespace: str) -> list[Panel]:
    """A model's panels; a split model's role's read its own replicas' series (of_role), titled `<model> (<role>)`."""
    sel = model_selector(plan, namespace)
    title = f"{plan.config.name} ({plan.role})" if plan.role else plan.name

    def metric(name: str) -> str:
        return vllm_metric(plan, name)

    def total(name: str) -> str:
        return f"sum({of_role(plan, namespace, f'rate({metric(name)}_total{sel}[5m])')})"

    # No tuned number in the dashboard: a ConfigMap's data cannot change in place (the provider replaces it), so the
    # dashboard changes only when models or pools come and go. The batch is in the alerts (a PrometheusRule).
    return [
        _panel(f"{title}: requests running and waiting", "short",
               (f"sum({of_role(plan, namespace, metric('num_requests_running') + sel)})", "running"),
               (queued(plan, namespace), "waiting")),
        _panel(f"{title}: KV cache use", "percentunit",
               (f"max by (pod) ({of_role(plan, namespace, metric('kv_cache_usage_perc') + sel)})", "{{pod}}")),
        _panel(f"{title}: time to first token and between tokens", "s",
               (engine_quantile(plan, namespace, 0.5, "time_to_first_token_seconds"), "TTFT p50"),
               (first_token_p90(plan, namespace), "TTFT p90"),
               (engine_quantile(plan, namespace, 0.9, "inter_token_latency_seconds"), "ITL p90")),
        _panel(f"{title}: tokens per second and preemptions", "short",
               (total("generation_tokens"), "generated tokens/s"),
               (total("num_preemptions"), "preemptions/s")),
    ]


def _transfer(decode: ModelPlan, prefill: ModelPlan, namespace: str) -> list[Panel]:
    """A split model's KV transfers from prefill to decode (vLLM's NIXL connector, recorded by the decode engines),
    and the first token a client sees, estimated as the two roles' p90s added (no series measures it)."""
    sel = model_selector(decode, namespace)

    def metric(name: str) -> str:
        return vllm_metric(decode, name)

    def quantile(q: float, name: str) -> str:
        return quantile_of(q, f"rate({metric(name)}_bucket{sel}[5m])")

    model = decode.config.name
    return [
        _panel(f"{model}: KV transfer time and the first token", "s",
               (quantile(0.5, "nixl_xfer_time_seconds"), "transfer p50"),
               (quantile(0.9, "nixl_xfer_time_seconds"), "transfer p90"),
               (f"{first_token_p90(prefill, namespace)} + {first_token_p90(decode, namespace)}",
                "TTFT p90, prefill + decode (estimate)")),
        _panel(f"{model}: KV bytes moved", "Bps",
               (f"sum(rate({metric('nixl_bytes_transferred')}_sum{sel}[5m]))", "bytes/s")),
        _panel(f"{model}: KV transfers failed and caches expired unread", "short",
               (f"sum(rate({metric('nixl_num_failed_transfers')}_total{sel}[5m]))", "failed transfers/s"),
               (f"sum(rate({metric('nixl_num_failed_notifications')}_total{sel}[5m]))", "failed notifications/s"),
               (f"sum(rate({metric('nixl_num_kv_expired_reqs')}_total{sel}[5m]))", "expired unread/s")),
    ]


def picker_selector(plan: ModelPlan, namespace: str) -> str:
    """The series scraped from a routed model's picker pod: the PodMonitor's `pod` label, the chart's Deployment
    name (`<release>-epp`) then its ReplicaSet's hash and the pod's suffix, so no other Deployment's pods match."""
    return f'{{namespace="{namespace}", pod=~"{picker.picker_name(plan.name)}-[^-]+-[^-]+"}}'


def pool_selector(plan: ModelPlan, namespace: str) -> str:
    """A routed model's pool gauges: the picker labels them with its InferencePool's name (the release's)."""
    return f'{{namespace="{namespace}", name="{picker.release_name(plan.name)}"}}'


def _routing(plan: ModelPlan, namespace: str) -> list[Panel]:
    sel = picker_selector(plan, namespace)
    pool = pool_selector(plan, namespace)

    def quantile(q: float, name: str) -> str:
        return quantile_of(q, f"rate({name}_bucket{sel}[5m])")

    return [
        _panel(f"{plan.name}: requests through the endpoint picker", "reqps",
               (f"sum(rate(llm_d_epp_request_total{sel}[5m]))", "requests/s"),
               (f"sum(rate(llm_d_epp_request_error_total{sel}[5m]))", "errors/s")),
        _panel(f"{plan.name}: latency through the endpoint picker", "s",
               (quantile(0.5, "llm_d_epp_request_duration_seconds"), "end to end p50"),
               (quantile(0.9, "llm_d_epp_request_duration_seconds"), "end to end p90"),
               (quantile(0.9, "llm_d_epp_request_ttft_seconds"), "TTFT p90"),
               (quantile(0.9, "llm_d_epp_scheduler_e2e_duration_seconds"), "picking a pod p90")),
        _panel(f"{plan.name}: the pool's ready endpoints and queue", "short",
               (f"max(llm_d_epp_ready_endpoints{pool})", "ready endpoints"),
               (f"max(llm_d_epp_average_queue_size{pool})", "requests queued per endpoint")),
        _panel(f"{plan.name}: share of each prompt in the picker's prefix index", "percentunit",
               (f"sum(rate(llm_d_epp_prefix_indexer_hit_ratio_sum{sel}[5m])) / "
                f"sum(rate(llm_d_epp_prefix_indexer_hit_ratio_count{sel}[5m]))", "mean match")),
    ]


def dashboard(stack: StackConfig, models: list[ModelPlan], namespace: str) -> dict[str, Any]:
    """The dashboard model (Grafana's JSON) for this stack's pools and models."""
    board = (Dashboard("Triarch: where, how, when").uid(DASHBOARD_UID).tags(["triarch", stack.cluster.name])
             .refresh("30s").time("now-6h", "now"))
    board = board.with_row(Row("Where: Kubernetes places replicas on GPUs"))
    for panel in _where(namespace):
        board = board.with_panel(panel)
    if any(m.config.engine == "ray-serve" for m in models):
        board = board.with_row(Row("How: Ray Serve splits the work"))
        for panel in _how():
            board = board.with_panel(panel)
    board = board.with_row(Row("When: vLLM schedules each request"))
    prefills = {m.config.name: m for m in models if m.role == "prefill"}
    for plan in sorted(models, key=lambda m: m.name):  # by name: reordering the stack's models changes nothing
        for panel in _when(plan, namespace):
            board = board.with_panel(panel)
        if plan.role == "decode":
            for panel in _transfer(plan, prefills[plan.config.name], namespace):
                board = board.with_panel(panel)
    routed = sorted((m for m in models if picker.routed(m)), key=lambda m: m.name)
    if routed:
        board = board.with_row(Row("Routing: endpoint pickers send each request to a pod"))
        for plan in routed:
            for panel in _routing(plan, namespace):
                board = board.with_panel(panel)
    built: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return built


def dashboard_config_map(stack: StackConfig, board: dict[str, Any]) -> dict[str, Any]:
    """The dashboard (`dashboard()`'s model) as a ConfigMap in the Prometheus namespace, for Grafana's sidecar."""
    body = json.dumps(board, sort_keys=True, indent=1)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": DASHBOARD_UID, "namespace": stack.observability.namespace,
                         "labels": {**SIDECAR_LABEL, **pods.MANAGED_BY}},
            "data": {f"{DASHBOARD_UID}.json": body}}
