"""What a stack gives Prometheus and KEDA: monitors and alerts per layer, ScaledObjects for plain vLLM, every metric
name in them exported by the pinned release, every object valid against the upstream CRDs."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import promql_parser
import pytest
import yaml

from conftest import MutatedConfig, crd_schema, reference_file, stack_document, unknown_fields, unknown_paths
from test_network_policy import Pod, connects
from triarch.catalog import catalog
from triarch.config import from_pulumi_config
from triarch.errors import ConfigError
from triarch.guardrails.base import Resource
from triarch.guardrails.how import no_cpu_hpa
from triarch.planners.karpenter import controller_values
from triarch.planners.models import plan_models
from triarch.planners.objects import plan_kubernetes
from triarch.planners.observability import metric_names
from triarch.planners.queries import selected_metrics as selectors
from triarch.planners.vllm import grace_period_seconds

OBSERVED = {"prometheus": "existing", "keda": "install"}


def observed(config: dict[str, Any]) -> None:
    config["triarch:observability"] = dict(OBSERVED)
    config["triarch:nodeGroups"][0]["max"] = 8  # the placement proof counts the autoscaled vLLM model at its max
    config["triarch:models"][0].pop("replicas", None)
    config["triarch:models"][0].update(autoscaling={"min": 1, "max": 3}, timeToFirstTokenSloSeconds=2.5)


@pytest.fixture(scope="module")
def plan(mutated_config_module: MutatedConfig) -> tuple[Any, list[Any], list[dict[str, Any]]]:
    stack = from_pulumi_config(mutated_config_module("prod", observed))
    models = plan_models(stack, catalog())
    objects = plan_kubernetes(stack, models, catalog())
    return stack, models, objects.observability + objects.serving


@pytest.fixture(scope="module")
def mutated_config_module(tmp_path_factory: pytest.TempPathFactory) -> MutatedConfig:
    from conftest import stack_document, write_stack_file
    from triarch.offline import read_stack_config

    def build(name: str, mutate: Any) -> dict[str, str]:
        config = stack_document(name)
        mutate(config)
        path = write_stack_file(tmp_path_factory.mktemp("observed") / f"Pulumi.{name}.yaml", config)
        return read_stack_config(path)[0]

    return build


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def expressions(objects: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every alert and every KEDA query."""
    for rule in of_kind(objects, "PrometheusRule"):
        for group in rule["spec"]["groups"]:
            for alert in group["rules"]:
                yield alert["alert"], alert["expr"]
    for scaled in of_kind(objects, "ScaledObject"):
        for trigger in scaled["spec"]["triggers"]:
            yield f"{scaled['metadata']['name']}/{trigger['name']}", trigger["metadata"]["query"]


def reference_lines(*parts: str) -> set[str]:
    path = reference_file(*parts)
    return {line.split(",")[0].strip() for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")}


def known(name: str) -> bool:
    """Whether a pinned release exports ``name`` (histogram/counter suffixes taken off)."""
    base = re.sub(r"_(total|bucket|sum|count)$", "", name)
    data = metric_names()
    if name.startswith("vllm:"):
        return base in reference_lines("vllm-0.33.0", "metrics.txt")
    prefix = data["ray"]["rayVllmPrefix"]
    if name.startswith(prefix):  # vLLM inside ray[llm] 2.60.0, which pins vLLM 0.29.0 (its NIXL connector's
        # series are registered by the connector, not in the release's list: metrics.yaml nixl, with their source)
        return ("vllm:" + base.removeprefix(prefix) in reference_lines("vllm-0.29.0", "metrics.txt")
                or base.removeprefix(prefix) in data["nixl"]["names"])
    if name.startswith("DCGM_"):
        return name in reference_lines("dcgm-exporter-4.8.2", "default-counters.csv")
    if name.startswith("llm_d_epp_"):  # the endpoint picker of llm-d-router v0.10.0, as its registry names them
        picker = data["endpointPicker"]["names"]
        if name in picker:  # a counter with its _total, or a gauge
            return "HistogramVec" not in picker[name]
        histogram = re.sub(r"_(bucket|sum|count)$", "", name)
        return histogram != name and "HistogramVec" in picker.get(histogram, "")
    return any(base in data[source]["names"] for source in ("ray", "kuberay", "kubeStateMetrics"))


def test_every_metric_in_alerts_and_autoscalers_is_exported_by_a_pinned_release(plan: Any) -> None:
    _, _, objects = plan
    found = {(where, name) for where, expr in expressions(objects) for name in selectors(expr)}
    assert len(found) > 10
    assert [f for f in found if not known(f[1])] == []
    # the checker itself refuses names the releases do not export
    assert not known("vllm:gpu_cache_usage_ratio") and not known("ray_vllm_batch_size")
    assert not known("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")  # commented out in the exporter's default counters


def test_alerts_cover_every_layer_with_thresholds_from_the_plan(plan: Any) -> None:
    _, models, objects = plan
    [rule] = of_kind(objects, "PrometheusRule")
    groups = {g["name"]: {r["alert"]: r for r in g["rules"]} for g in rule["spec"]["groups"]}
    assert set(groups) == {"triarch-where", "triarch-how", "triarch-when"}
    for model in models:
        name = "".join(p.capitalize() for p in model.name.split("-"))
        queued = groups["triarch-when"][f"{name}RequestsQueuedGpusIdle"]["expr"]
        assert f"> {model.sizing.engine_args['max_num_seqs']} and" in queued
        if model.config.engine == "vllm":  # vLLM's own queue, the pods of its Deployment
            assert f'sum(vllm:num_requests_waiting{{namespace="llm", model_name="{model.name}"}})' in queued
            assert f'exported_pod=~"{model.name}-[a-z0-9]+-[a-z0-9]+"' in queued
        else:  # Serve's router queues beyond max_ongoing_requests; the worker group's pods as KubeRay names them
            assert (f'sum(ray_serve_deployment_queued_queries{{namespace="llm", application="{model.name}"}})'
                    in queued)
            assert "ray_vllm_num_requests_waiting" not in queued
            assert (f'exported_pod=~"llm-[a-z0-9]+-{model.pool.name}-{model.gpus_per_replica}gpu-worker-[a-z0-9]+"'
                    in queued)
        assert 'exported_namespace="llm"' in queued
    assert "EmbedSlowFirstToken" in groups["triarch-when"] and "> 2.5" in groups["triarch-when"][
        "EmbedSlowFirstToken"]["expr"]
    assert groups["triarch-when"]["ChatSlowFirstToken"]["expr"].endswith("> 2.0")  # prod's stack file: 2 s for chat
    assert "QwenSlowFirstToken" not in groups["triarch-when"]  # no SLO given for qwen
    pools = {m.pool.name: m.pool for m in models}
    for pool in pools.values():
        expr = groups["triarch-where"][f"{pool.name.capitalize()}GpusMissing"]["expr"]
        assert f"* {pool.schedulable_gpus_per_node} > " in expr
    assert "RayServiceNotReady" in groups["triarch-how"]
    for group in groups.values():  # what promtool checks: a parsable expression, a duration, a severity
        for alert in group.values():
            promql_parser.parse(alert["expr"])
            assert re.fullmatch(r"\d+m", alert["for"]) and alert["labels"]["severity"] in ("warning", "critical")


@pytest.mark.parametrize(("kind", "crd"), [
    ("PodMonitor", ("prometheus-operator-v0.93.1", "crds", "crd-podmonitors.yaml")),
    ("PrometheusRule", ("prometheus-operator-v0.93.1", "crds", "crd-prometheusrules.yaml")),
    ("ScaledObject", ("keda-2.20.2", "crds", "crd-scaledobjects.yaml")),
])
def test_objects_validate_against_the_upstream_crds(plan: Any, kind: str, crd: tuple[str, ...]) -> None:
    _, _, objects = plan
    found = of_kind(objects, kind)
    assert found
    version = "v1alpha1" if kind == "ScaledObject" else "v1"
    schema = crd_schema(*crd, version=version)
    # Not jsonschema.validate: it checks the schema first, and the CRD's Go patterns (`^(?i)(abort|warn)?$` on
    # a field Triarch does not set) are not Python regexes. Every field Triarch sets is still validated.
    validator = jsonschema.validators.validator_for(schema)(schema)
    for obj in found:
        validator.validate(obj)
        assert unknown_fields(obj, schema) == []


def test_keda_scales_plain_vllm_on_its_own_signals_and_drains_before_scaling_down(plan: Any) -> None:
    _, models, objects = plan
    [scaled] = of_kind(objects, "ScaledObject")
    [embed] = [m for m in models if m.name == "embed"]
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "embed"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 3)
    assert {t["type"] for t in spec["triggers"]} == {"prometheus"}
    waiting = next(t for t in spec["triggers"] if t["name"] == "requests-waiting")
    assert waiting["metadata"]["threshold"] == str(max(1, embed.sizing.engine_args["max_num_seqs"] // 10))
    down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert down["stabilizationWindowSeconds"] >= grace_period_seconds()
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": down["stabilizationWindowSeconds"]}]


HPA_TOLERANCE = 0.1
"""kube-controller-manager's --horizontal-pod-autoscaler-tolerance default: no change within 10% of the target."""


def hpa_desired(replicas: int, total: float, trigger: dict[str, Any]) -> int:
    """The replica count the HPA behind a ScaledObject wants for one AverageValue trigger (Kubernetes docs,
    "Horizontal Pod Autoscaling", algorithm details): the per-replica average against the target, ceil of the ratio
    times the replicas, unless the ratio is within the tolerance."""
    assert trigger["metricType"] == "AverageValue"
    ratio = (total / replicas) / float(trigger["metadata"]["threshold"])
    return replicas if abs(ratio - 1) <= HPA_TOLERANCE else math.ceil(replicas * ratio)


def test_keda_adds_a_replica_before_the_kv_cache_fills(plan: Any) -> None:
    """Two replicas whose KV caches are each 90% full: KEDA asks for a third, while the KV-cache-full alert (above
    95%, docs/runbook.md) has not fired; at 78% each, nothing changes. The query sums over replicas, so the HPA
    compares the average with the threshold."""
    _, _, objects = plan
    [scaled] = of_kind(objects, "ScaledObject")
    kv = next(t for t in scaled["spec"]["triggers"] if t["name"] == "kv-cache-usage")
    assert kv["metadata"]["query"].startswith("sum(vllm:kv_cache_usage_perc{")
    assert hpa_desired(2, 2 * 0.90, kv) == 3
    assert hpa_desired(2, 2 * 0.78, kv) == 2
    [rule] = of_kind(objects, "PrometheusRule")
    [full] = [a for g in rule["spec"]["groups"] for a in g["rules"] if a["alert"] == "EmbedKvCacheFull"]
    assert full["expr"].endswith("> 0.95")


def test_the_autoscaler_alone_owns_the_replica_count_and_the_spread_counts_its_max(
        mutated_config_module: MutatedConfig) -> None:
    """No spec.replicas where KEDA scales (the HPA owns it: an apply that sets it conflicts, and the next `pulumi up`
    fails; shown on the real engine in test_real_keda); the zone spread is sized for autoscaling.max."""
    stack = from_pulumi_config(mutated_config_module("prod", observed))
    models = plan_models(stack, catalog())
    objects = plan_kubernetes(stack, models, catalog())
    [scaled] = [o for o in objects.vllm["embed"] if o["kind"] == "Deployment"]
    assert "replicas" not in scaled["spec"]
    [by_zone, _] = scaled["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert (by_zone["whenUnsatisfiable"], by_zone["minDomains"]) == ("DoNotSchedule", 3)  # max 3, three zones
    fixed = from_pulumi_config(mutated_config_module("prod", lambda c: None))
    [deployment] = [o for o in plan_kubernetes(fixed, plan_models(fixed, catalog()), catalog()).vllm["embed"]
                    if o["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == stack_document("prod")["triarch:models"][0]["replicas"]


def test_the_cpu_autoscaler_guardrail_accepts_keda_on_vllm_metrics_and_refuses_cpu_triggers(plan: Any) -> None:
    _, _, objects = plan
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "embed", "namespace": "llm"},
                  "spec": {"template": {"spec": {"containers": [
                      {"name": "vllm", "image": "vllm/vllm-openai:v0.33.0",
                       "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}
    [scaled] = of_kind(objects, "ScaledObject")
    resources = [Resource("kubernetes:apps/v1:Deployment", "embed", deployment),
                 Resource("kubernetes:keda.sh/v1alpha1:ScaledObject", "embed", scaled)]
    assert no_cpu_hpa(resources, {}) == []
    cpu = {**scaled, "spec": {**scaled["spec"], "triggers": [{"type": "cpu", "metricType": "Utilization",
                                                              "metadata": {"value": "60"}}]}}
    [(_, message)] = no_cpu_hpa([resources[0], Resource("kubernetes:keda.sh/v1alpha1:ScaledObject", "embed", cpu)],
                                {})
    assert "on cpu" in message


def test_prometheus_scrapes_the_metrics_ports_and_nothing_else_does(plan: Any) -> None:
    _, _, objects = plan
    policies = of_kind(objects, "NetworkPolicy")
    prometheus = Pod("monitoring", {"app.kubernetes.io/name": "prometheus"})
    elsewhere = Pod("other", {"app": "curious"})
    vllm = Pod("llm", {"app.kubernetes.io/name": "vllm"}, ip="10.0.200.9")
    ray = Pod("llm", {"ray.io/is-ray-node": "yes", "ray.io/node-type": "worker"}, ip="10.0.200.10")
    assert connects(policies, prometheus, vllm, 8000) and connects(policies, prometheus, ray, 8080)
    assert not connects(policies, elsewhere, vllm, 8000) and not connects(policies, elsewhere, ray, 8080)
    assert not connects(policies, prometheus, ray, 8265)  # the dashboard stays closed


def test_nothing_for_prometheus_unless_the_stack_says_one_runs(mutated_config: MutatedConfig) -> None:
    """An adopted cluster gets none by default, a created one gets kube-prometheus-stack unless it says none."""
    adopted = from_pulumi_config(mutated_config("local", lambda c: None))
    created = from_pulumi_config(mutated_config("prod", lambda c: c.update(
        {"triarch:observability": {"prometheus": "none"}})))
    assert (adopted.prometheus, created.prometheus) == ("none", "none")
    assert from_pulumi_config(mutated_config("prod", lambda c: None)).prometheus == "install"
    for stack in (adopted, created):
        objects = plan_kubernetes(stack, plan_models(stack, catalog()), catalog())
        assert objects.observability == []
        assert [p for p in objects.serving if p["metadata"]["name"] == "allow-prometheus-scrape"] == []


@pytest.mark.parametrize(("observability", "autoscaling", "key", "words"), [
    ({}, {"min": 1, "max": 3}, "autoscaling", "needs KEDA and a Prometheus"),
    ({"prometheus": "existing"}, {"min": 1, "max": 3}, "autoscaling", "needs KEDA and a Prometheus"),
    (OBSERVED, {"min": 0, "max": 3}, "autoscaling.min", "leaves no vLLM server"),
])
def test_vllm_autoscaling_needs_keda_prometheus_and_a_server(mutated_config: MutatedConfig,
                                                            observability: dict[str, Any],
                                                            autoscaling: dict[str, int], key: str, words: str) -> None:
    def mutate(config: dict[str, Any]) -> None:
        config["triarch:observability"] = dict(observability)
        config["triarch:models"][0].pop("replicas", None)
        config["triarch:models"][0]["autoscaling"] = autoscaling

    with pytest.raises(ConfigError) as refused:
        from_pulumi_config(mutated_config("prod", mutate))
    assert str(refused.value).startswith(f"triarch:models[0].{key}") and words in str(refused.value)


def test_chart_service_monitors_use_keys_the_charts_have() -> None:
    from triarch.components.serving import kuberay_values

    labels = {"release": "kube-prometheus-stack"}
    for chart, values in (("kuberay-v1.7.0", kuberay_values("system", labels)),
                          ("karpenter-v1.14.1", {"serviceMonitor": controller_values("c", labels)["serviceMonitor"]})):
        upstream = yaml.safe_load(reference_file(chart, "values.yaml").read_text(encoding="utf-8"))
        assert unknown_paths(values, upstream) == []
    assert kuberay_values("system", labels)["metrics"]["serviceMonitor"]["additionalLabels"] == labels
    assert "serviceMonitor" not in controller_values("c")


def test_the_program_registers_them_and_the_guardrails_pass(tmp_path: Path) -> None:
    """Through the whole program under Pulumi's mocks: the monitors, the rule and the ScaledObject are registered
    (custom resources, with the chart ServiceMonitors switched on) and no mandatory guardrail objects."""
    from conftest import plan_config, stack_document
    from triarch.guardrails.check import evaluate

    config = stack_document("prod")
    observed(config)
    plan = plan_config("prod", config, tmp_path)
    kinds = {r.type for r in plan.resources}
    for kind in ("PodMonitor", "PrometheusRule"):
        assert f"kubernetes:monitoring.coreos.com/v1:{kind}" in kinds
    assert "kubernetes:keda.sh/v1alpha1:ScaledObject" in kinds
    releases = {r.inputs["name"]: r.inputs["values"] for r in plan.resources
                if r.type == "kubernetes:helm.sh/v3:Release"}
    assert releases["kuberay-operator"]["metrics"]["serviceMonitor"]["enabled"] is True
    assert releases["karpenter"]["serviceMonitor"]["additionalLabels"] == {"release": "kube-prometheus-stack"}
    assert {"dcgm-exporter", "keda"} <= set(releases)
    [keda] = [r.urn for r in plan.resources if r.type == "kubernetes:helm.sh/v3:Release" and r.inputs["name"] == "keda"]
    [scaled] = [r for r in plan.resources if r.type == "kubernetes:keda.sh/v1alpha1:ScaledObject"]
    assert keda in plan.dependencies[scaled.urn]  # its CRD comes with the chart
    resources = [Resource(r.type, r.name, r.inputs, r.urn) for r in plan.resources]
    mandatory = [f for f in evaluate(resources) if f.enforcement == "mandatory"]
    assert mandatory == []


def test_every_metric_the_runbook_names_is_exported_by_a_pinned_release() -> None:
    section = (Path(__file__).resolve().parents[1] / "docs" / "runbook.md").read_text(encoding="utf-8")
    spans = re.findall(r"`([^`]+)`", section)
    names = {re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", span).group(0) for span in spans  # type: ignore[union-attr]
             if re.match(r"(vllm:|ray_|DCGM_|kube_|kuberay_)[a-z_A-Z]", span)}
    names = {n for n in names if not n.endswith("_")}  # "ray_vllm_*" as a family, not a metric
    assert {"vllm:kv_cache_usage_perc", "DCGM_FI_DEV_XID_ERRORS", "kuberay_service_condition_ready"} <= names
    assert sorted(n for n in names if not known(n)) == []


def test_every_alert_links_the_runbook_page(plan: Any) -> None:
    """An alert's `runbook` annotation is what an on-call engineer follows: it names the page that holds the runbook's
    table (tests/test_docs.py holds every link of the docs themselves)."""
    _, _, objects = plan
    [rule] = of_kind(objects, "PrometheusRule")
    alerts = [r for group in rule["spec"]["groups"] for r in group["rules"] if "alert" in r]
    assert alerts and {r["annotations"]["runbook"] for r in alerts} == {"docs/runbook.md"}
    page = Path(__file__).resolve().parents[1] / "docs" / "runbook.md"
    assert page.read_text(encoding="utf-8").startswith("# Runbook: which layer is failing\n")


def test_the_dcgm_exporter_runs_on_gpu_nodes_only_with_keys_its_chart_has(plan: Any) -> None:
    """On GPU nodes only; its security as rendered (after Helm's coalescing) is tests/test_chart_values.py's."""
    from triarch.planners.monitoring import dcgm_values, keda_values
    from triarch.scheduling import GPU_TAINT_KEY

    stack, _, _ = plan
    values = dcgm_values(stack)
    assert values["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert [t["key"] for t in values["tolerations"]] == [GPU_TAINT_KEY]
    for chart, ours in (("dcgm-exporter-4.8.2", values), ("keda-2.20.2", keda_values(stack))):
        upstream = yaml.safe_load(reference_file(chart, "values.yaml").read_text(encoding="utf-8"))
        assert unknown_paths(ours, upstream) == []


def test_a_serving_namespace_named_like_an_add_on_is_refused(mutated_config: MutatedConfig) -> None:
    def mutate(config: dict[str, Any]) -> None:
        observed(config)
        config["triarch:serving"]["namespace"] = "keda"

    stack = from_pulumi_config(mutated_config("prod", mutate))
    with pytest.raises(ConfigError, match="keda"):
        plan_kubernetes(stack, plan_models(stack, catalog()), catalog())


def test_the_dashboard_is_laid_out_by_layer_with_real_metrics(plan: Any) -> None:
    _, models, objects = plan
    [config_map] = [o for o in objects if o["kind"] == "ConfigMap"]
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    [body] = config_map["data"].values()
    board = json.loads(body)
    rows = [p["title"].split(":")[0] for p in board["panels"] if p["type"] == "row"]
    assert rows == ["Where", "How", "When"]
    queries = [t["expr"] for p in board["panels"] if p["type"] == "timeseries" for t in p["targets"]]
    names = {name for expr in queries for name in selectors(expr)}
    assert sorted(n for n in names if not known(n)) == []
    for model in models:  # each model's own panels, on its engine's names
        metric = "vllm:" if model.config.engine == "vllm" else "ray_vllm_"
        assert any(f'{metric}kv_cache_usage_perc{{namespace="llm", model_name="{model.name}"}}' in q for q in queries)


def test_a_created_cluster_installs_prometheus_and_monitors_wait_for_its_crds(shipped: dict[str, Any]) -> None:
    prod = shipped["prod"]
    releases = {r.inputs["name"]: r for r in prod.resources if r.type == "kubernetes:helm.sh/v3:Release"}
    assert (releases["kube-prometheus-stack"].inputs["version"], releases["prometheus-operator-crds"].inputs[
        "version"]) == ("88.5.3", "31.0.1")
    assert releases["kube-prometheus-stack"].inputs["skipCrds"] is True
    crds = releases["prometheus-operator-crds"].urn
    monitors = [r for r in prod.resources if r.type.startswith("kubernetes:monitoring.coreos.com/v1:")]
    assert monitors and all(crds in prod.dependencies[r.urn] for r in monitors)
    for chart in ("karpenter", "kuberay-operator", "dcgm-exporter"):  # they ship ServiceMonitors
        assert crds in prod.dependencies[releases[chart].urn], chart


def test_every_vllm_name_triarch_reads_is_in_both_pinned_releases() -> None:
    """templates/compat/metrics.yaml's vLLM list (what the plan checks queries against), held to the releases."""
    names = metric_names()["vllm"]["names"]
    assert "kv_cache_usage_perc" in names and len(names) >= 7
    assert [n for n in names if f"vllm:{n}" not in reference_lines("vllm-0.33.0", "metrics.txt")] == []
    assert [n for n in names if f"vllm:{n}" not in reference_lines("vllm-0.29.0", "metrics.txt")] == []


@pytest.mark.parametrize(("broken", "said"), [
    (lambda plan, name: "vllm:gpu_cache_usage_ratio" if name == "kv_cache_usage_perc" else f"vllm:{name}",
     "error: alert EmbedKvCacheFull: its query selects vllm:gpu_cache_usage_ratio, which no pinned exporter "
     "emits (templates/compat/metrics.yaml)"),
    (lambda plan, name: "vllm:kv_cache_usage_perc{" if name == "kv_cache_usage_perc" else f"vllm:{name}",
     "error: alert EmbedKvCacheFull: its query does not parse"),
])
def test_a_query_that_cannot_work_fails_the_plan(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str], broken: Any, said: str) -> None:
    from triarch import cli
    from triarch.planners import observability

    real = observability.vllm_metric
    monkeypatch.setattr(observability, "vllm_metric", lambda plan, name: broken(plan, name)
                        if plan.name == "embed" else real(plan, name))
    code = cli.main(["plan", "--stack", "prod", "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(said), captured.err
    assert not (tmp_path / "out").exists()
