"""Prefix-aware routing of plain vLLM models (issue 37 D3): an InferencePool over one model's pods and llm-d-router's
endpoint picker with its Envoy sidecar (the standalone chart, v0.10.0) in front of them; the model's Service moved to
the proxy; the serving namespace's policies let clients reach the proxy and the picker the API server; the picker's
metrics scraped; its pod placed; bad input refused in one line. Expected values are written here by hand, from the
chart's templates (routerlib, v0.10.0) and the Gateway API Inference Extension's v1 CRD."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT, MutatedConfig, StackPlan, plan_config, plan_refusal, stack_document, write_stack_file
from test_effects import document
from test_engine_args import planned, with_model
from test_network_policy import API_ENDPOINT, API_SERVICE, HUB, Pod, connects
from test_observability import known
from triarch import cli
from triarch.catalog import charts
from triarch.config import from_pulumi_config
from triarch.diff import diff_plans
from triarch.effects import traffic_effects
from triarch.planners.queries import selected_metrics as selectors
from triarch.planners.registry import image_values
from triarch.postrender import restrict

RELEASE = "kubernetes:helm.sh/v3:Release"
CHAT_PODS = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": "chat"}
PICKER_POD = Pod("llm", {"llm-d-router-gateway": "chat-pool-epp", "llm-d.ai/igw-mode": "llm-d-router-gateway"},
                 "10.0.30.1")
"""The chat picker's pod as the chart labels it (selectorLabels and modeLabels, InferencePool mode)."""
PROXY_POD = Pod("llm", {"app.kubernetes.io/name": "chat-pool-epp", "llm-d-router-proxy": "chat-pool-proxy"},
                "10.0.30.4")
"""A chat proxy's pod as the chart labels it in service mode (routerlib labels and proxySelectorLabels)."""


def picker_release(plan: StackPlan, name: str = "chat-pool") -> dict[str, Any]:
    [release] = [r for r in plan.of_type(RELEASE) if r.inputs.get("name") == name]
    return dict(release.inputs)


def service(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    [found] = [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == name]
    return found


def test_the_routed_models_pool_selects_its_vllm_pods_on_vllms_port(shipped: dict[str, StackPlan]) -> None:
    plan = shipped["fresh"]
    release = picker_release(plan)
    assert release["chart"] == "oci://127.0.0.1:5000/charts/llm-d-router-standalone"
    assert release["version"] == "v0.10.0" and release["namespace"] == "llm"
    assert release["skipCrds"] is True and release["postrender"] == "./.venv/bin/triarch-restrict-pods"
    router = release["values"]["router"]
    assert router["modelServers"] == {"matchLabels": CHAT_PODS, "targetPorts": [{"number": 8000}]}
    assert router["epp"]["image"] == {"tag": "v0.10.0", "pullPolicy": "IfNotPresent"}
    # two pickers (the chart then turns on leader election), on different nodes where they can be
    assert router["epp"]["replicas"] == 2
    apart = {"topologyKey": "kubernetes.io/hostname",
             "labelSelector": {"matchLabels": {"llm-d-router-gateway": "chat-pool-epp"}}}
    assert router["epp"]["affinity"]["podAntiAffinity"] == {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": apart}]}
    # two proxies of their own (service mode), failing at once where the picker does not answer
    assert router["proxy"] == {"enabled": True, "mode": "service", "replicas": 2, "failOpen": False, "resources": {
        "requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        # the release's own Envoy ConfigMap (the chart's preset names every release's `envoy`), mounted by the proxies
        "configMap": {"name": "chat-pool-envoy"}, "volumes": [{"name": "config", "configMap": {
            "name": "chat-pool-envoy", "items": [{"key": "envoy.yaml", "path": "envoy.yaml"}]}}]}
    assert router["monitoring"] == {"prometheus": {"auth": {"enabled": False}}}
    [deployment] = [d for d in plan.objects("Deployment") if d["metadata"]["name"] == "chat"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert CHAT_PODS.items() <= labels.items()
    # Only chat is routed: one release, and the InferencePool's CRD once, from the stack's mirror.
    assert [r.inputs["name"] for r in plan.of_type(RELEASE)
            if str(r.inputs["chart"]).endswith("/llm-d-router-standalone")] == ["chat-pool"]
    crds = [r for r in plan.of_type("kubernetes:yaml/v2:ConfigFile") if "inferencepools" in r.name]
    assert [r.inputs["file"] for r in crds] == [
        "https://127.0.0.1:5000/files/crds/llm-d-router-standalone/v0.10.0/"
        "inference.networking.k8s.io_inferencepools.yaml"]


def test_the_routed_models_service_sends_to_the_pickers_proxies(shipped: dict[str, StackPlan]) -> None:
    """The proxies' Deployment (the chart's service mode labels its pods `llm-d-router-proxy: <release>-proxy`), on
    their listener; one of the two is kept while nodes drain."""
    objects = shipped["fresh"].objects()
    chat = service(objects, "chat")
    assert chat["spec"]["selector"] == {"llm-d-router-proxy": "chat-pool-proxy"}
    assert chat["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": 8081, "protocol": "TCP"}]
    budgets = {b["metadata"]["name"]: b["spec"] for b in objects if b["kind"] == "PodDisruptionBudget"}
    assert budgets["chat-pool-proxy"] == {"minAvailable": 1,
                                          "selector": {"matchLabels": {"llm-d-router-proxy": "chat-pool-proxy"}}}
    assert not [n for n, b in budgets.items() if "llm-d-router-gateway" in b["selector"].get("matchLabels", {})]


def test_the_service_waits_for_the_picker(shipped: dict[str, StackPlan]) -> None:
    """The Service selects the picker's pod, so `pulumi up` waits for its endpoints only after the release."""
    plan = shipped["fresh"]
    [release] = [r for r in plan.of_type(RELEASE) if r.inputs.get("name") == "chat-pool"]
    [chat] = [r for r in plan.of_type("kubernetes:core/v1:Service") if r.name.endswith("llm-chat")]
    waits = set(plan.dependencies[chat.urn])
    parent = chat.parent
    while parent:  # a component's dependencies hold its children back too
        waits |= set(plan.dependencies.get(parent, []))
        parent = next((r.parent for r in plan.resources if r.urn == parent), None)
    assert release.urn in waits


def test_turning_routing_off_moves_the_service_back_to_the_vllm_pods(mutated_config: MutatedConfig) -> None:
    objects = planned(mutated_config("fresh", with_model(0, prefixRouting={"enabled": False})))
    chat = service(objects, "chat")
    assert chat["spec"]["selector"] == CHAT_PODS
    assert chat["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    names = {o["metadata"]["name"] for o in objects if o["kind"] in ("NetworkPolicy", "PodMonitor")}
    assert not names & {"allow-picker-proxy", "allow-picker-api-server", "endpoint-picker"}


def test_clients_reach_the_proxy_and_the_picker_reaches_vllm_and_the_api_server(
        shipped: dict[str, StackPlan]) -> None:
    policies = shipped["fresh"].objects("NetworkPolicy")
    server = Pod("llm", {**CHAT_PODS, "app.kubernetes.io/managed-by": "triarch"}, "10.0.30.2")
    client = Pod("llm", {"app": "smoke-test"}, "10.0.30.3")
    assert connects(policies, client, PROXY_POD, 8081)
    assert connects(policies, PROXY_POD, PICKER_POD, 9002)  # the proxies ask the picker (ext_proc) through its Service
    assert connects(policies, PROXY_POD, server, 8000)  # and send to vLLM
    assert connects(policies, PICKER_POD, server, 8000)  # the picker reads vLLM's metrics
    assert connects(policies, PICKER_POD, API_SERVICE, 443) and connects(policies, PICKER_POD, API_ENDPOINT, 6443)
    assert connects(policies, Pod("monitoring", {"app": "prometheus"}), PICKER_POD, 9090)
    for namespace in ("default", "kube-system", "keda"):
        assert not connects(policies, Pod(namespace), PROXY_POD, 8081), namespace
    assert not connects(policies, client, PICKER_POD, 9002)  # ext_proc is the proxies' alone
    assert not connects(policies, client, PICKER_POD, 8081)  # the picker's pod serves no clients
    assert not connects(policies, server, API_SERVICE, 443)  # the vLLM pods stay off the API server
    assert not connects(policies, PROXY_POD, API_SERVICE, 443)  # nor do the proxies
    assert not connects(policies, PICKER_POD, HUB, 80)


def test_the_pickers_metrics_are_scraped_and_the_alerts_keep_vllms(shipped: dict[str, StackPlan]) -> None:
    plan = shipped["fresh"]
    [monitor] = [m for m in plan.objects("PodMonitor") if m["metadata"]["name"] == "endpoint-picker"]
    assert monitor["spec"]["selector"] == {"matchLabels": {"llm-d.ai/igw-mode": "llm-d-router-gateway"}}
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]
    [scaled] = [s for s in plan.objects("ScaledObject") if s["metadata"]["name"] == "chat"]
    assert all("vllm:" in t["metadata"]["query"] for t in scaled["spec"]["triggers"])


def _board(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [config_map] = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "triarch-layers"]
    [body] = config_map["data"].values()
    board: dict[str, Any] = json.loads(body)
    return board


PICKER_SERIES = '{namespace="llm", pod=~"chat-pool-epp-[^-]+-[^-]+"}'
POOL_SERIES = '{namespace="llm", name="chat-pool"}'


def test_the_dashboard_shows_the_routed_models_picker_on_its_own_metrics(shipped: dict[str, StackPlan]) -> None:
    """The fresh stack's chat is routed: a Routing row after When with chat's four picker panels, on the names the
    picker of llm-d-router v0.10.0 registers (llm_d_router_metrics.go, approximateprefix/metrics.go at 71f4f09),
    selecting the picker pod's series and its pool's (named as the release), each name in the pinned list."""
    board = _board(shipped["fresh"].objects())
    rows = [p["title"].split(":")[0] for p in board["panels"] if p["type"] == "row"]
    assert rows[-1] == "Routing" and rows.count("Routing") == 1
    titles = [p.get("title", "") for p in board["panels"]]
    routing = board["panels"][titles.index("Routing: endpoint pickers send each request to a pod") + 1:]
    assert [p["title"] for p in routing] == [
        "chat: requests through the endpoint picker", "chat: latency through the endpoint picker",
        "chat: the pool's ready endpoints and queue", "chat: share of each prompt in the picker's prefix index"]
    queries = [t["expr"] for p in routing for t in p["targets"]]
    names = {name for expr in queries for name in selectors(expr)}
    assert names == {"llm_d_epp_request_total", "llm_d_epp_request_error_total",
                     "llm_d_epp_request_duration_seconds_bucket", "llm_d_epp_request_ttft_seconds_bucket",
                     "llm_d_epp_scheduler_e2e_duration_seconds_bucket", "llm_d_epp_ready_endpoints",
                     "llm_d_epp_average_queue_size", "llm_d_epp_prefix_indexer_hit_ratio_sum",
                     "llm_d_epp_prefix_indexer_hit_ratio_count"}
    assert sorted(n for n in names if not known(n)) == []
    assert f"sum(rate(llm_d_epp_request_total{PICKER_SERIES}[5m]))" in queries
    assert f"max(llm_d_epp_ready_endpoints{POOL_SERIES})" in queries
    assert f"max(llm_d_epp_average_queue_size{POOL_SERIES})" in queries
    assert ("histogram_quantile(0.9, sum by (le) (rate(llm_d_epp_request_duration_seconds_bucket"
            f"{PICKER_SERIES}[5m])))") in queries
    # chat's vLLM panels stay on vLLM's own names, and the alerts and KEDA too
    assert any('vllm:kv_cache_usage_perc{namespace="llm", model_name="chat"}' in t["expr"]
               for p in board["panels"] if p["type"] == "timeseries" for t in p["targets"])


def test_the_pinned_picker_list_refuses_what_the_release_does_not_export() -> None:
    assert known("llm_d_epp_ready_endpoints") and known("llm_d_epp_request_total")
    assert known("llm_d_epp_request_duration_seconds_bucket") and known("llm_d_epp_prefix_indexer_hit_ratio_count")
    assert not known("llm_d_epp_ready_pods")  # the deprecated inference_pool_ready_pods' twin is ready_endpoints
    assert not known("llm_d_epp_request_total_bucket") and not known("llm_d_epp_ready_endpoints_sum")
    assert not known("llm_d_epp_request_duration_seconds")  # a histogram's series carry a suffix
    assert not known("inference_pool_ready_pods")  # deprecated names are not read


def test_without_routing_the_dashboard_has_no_picker_panels(mutated_config: MutatedConfig) -> None:
    objects = planned(mutated_config("fresh", with_model(0, prefixRouting={"enabled": False})))
    board = _board(objects)
    assert "Routing" not in [p["title"].split(":")[0] for p in board["panels"] if p["type"] == "row"]
    assert "llm_d_epp_" not in json.dumps(board)


def test_the_proxy_image_moves_to_a_mirror_in_its_one_key(mutated_config: MutatedConfig) -> None:
    def mirrored(config: dict[str, Any]) -> None:
        config["triarch:registry"]["images"] = "registry.example.com/mirror"
    stack = from_pulumi_config(mutated_config("fresh", mirrored))
    values = image_values(charts()["llm-d-router-standalone"], stack)
    assert values == {"router": {
        "epp": {"image": {"registry": "registry.example.com",
                          "repository": "mirror/llm-d/llm-d-router-endpoint-picker", "tag": "v0.10.0"}},
        "proxy": {"image": "registry.example.com/mirror/envoyproxy/envoy:distroless-v1.33.2"}}}


def test_the_post_renderer_gives_the_chart_pods_the_restricted_context() -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "chat-pool-epp"},
                  "spec": {"template": {"spec": {"containers": [
                      {"name": "envoy-proxy", "securityContext": {"readOnlyRootFilesystem": True}},
                      {"name": "epp"}]}}}}
    spec = restrict(deployment)["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 1000
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    envoy, epp = spec["containers"]
    assert epp["securityContext"] == {"allowPrivilegeEscalation": False, "privileged": False,
                                      "readOnlyRootFilesystem": False, "capabilities": {"drop": ["ALL"]}}
    assert envoy["securityContext"]["readOnlyRootFilesystem"] is True  # what the chart set stays
    assert envoy["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    other = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"ports": []}}
    assert restrict(dict(other)) == other


def test_the_post_renderer_names_the_pull_secret_only_when_asked() -> None:
    def deployment() -> dict[str, Any]:
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "chat-pool-epp"},
                "spec": {"template": {"spec": {"containers": [{"name": "epp"}]}}}}
    assert "imagePullSecrets" not in restrict(deployment())["spec"]["template"]["spec"]
    pulled = restrict(deployment(), "triarch-registry")["spec"]["template"]["spec"]
    assert pulled["imagePullSecrets"] == [{"name": "triarch-registry"}]
    assert pulled["securityContext"]["runAsNonRoot"] is True  # and restricted as before
    own = deployment()
    own["spec"]["template"]["spec"]["imagePullSecrets"] = [{"name": "theirs"}]
    assert restrict(own, "triarch-registry")["spec"]["template"]["spec"]["imagePullSecrets"] == [
        {"name": "theirs"}, {"name": "triarch-registry"}]  # the chart's kept, ours once
    again = restrict(restrict(deployment(), "triarch-registry"), "triarch-registry")
    assert again["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "triarch-registry"}]
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"ports": []}}
    assert restrict(dict(service), "triarch-registry") == service


def _credentials(config: dict[str, Any]) -> None:
    config["triarch:registry"].update(images="harbor.example.com/proxy", username="robot$triarch")
    config["triarch:registryPassword"] = {"secure": "v1:robot-token"}


def test_with_registry_credentials_the_release_runs_the_pulling_post_renderer(tmp_path: Path) -> None:
    """The fresh stack (chat routed) pulling through a registry that takes credentials: the picker's Release names
    the post-renderer that adds the pull Secret, in the same directory; the Secret is in the release's namespace."""
    config = stack_document("fresh")
    _credentials(config)
    plan = plan_config("fresh", config, tmp_path)
    release = picker_release(plan)
    assert release["postrender"] == "./.venv/bin/triarch-restrict-pods-pulling"
    secrets = [r for r in plan.of_type("kubernetes:core/v1:Secret")
               if r.inputs["metadata"]["name"] == "triarch-registry"]
    assert "llm" in {r.inputs["metadata"]["namespace"] for r in secrets}
    assert "imagePullSecrets" not in json.dumps(release["values"])  # the chart has no value for it


def test_the_post_renderers_path_is_the_projects_virtualenv() -> None:
    """The Release's path is relative to the project's root, where the provider runs (no `main` in Pulumi.yaml,
    so the CLI's plugin directory is the root) and where the uv toolchain makes the virtualenv Pulumi.yaml names;
    both commands are this package's console scripts."""
    project = yaml.safe_load((ROOT / "Pulumi.yaml").read_text(encoding="utf-8"))
    assert "main" not in project and project["runtime"]["options"]["virtualenv"] == ".venv"
    scripts = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'triarch-restrict-pods = "triarch.postrender:main"' in scripts
    assert 'triarch-restrict-pods-pulling = "triarch.postrender:main_pulling"' in scripts


@pytest.mark.parametrize(("command", "secrets"), [
    ("./.venv/bin/triarch-restrict-pods", None),
    ("./.venv/bin/triarch-restrict-pods-pulling", [{"name": "triarch-registry"}]),
])
def test_the_post_renderer_runs_as_helm_runs_it(tmp_path: Path, command: str, secrets: Any) -> None:
    """As Helm execs it (pkg/postrender): the Release's relative path from the provider's working directory (a
    project root whose .venv is this environment), no PATH entry holding it, the rendered chart on stdin."""
    (tmp_path / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    rendered = yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "chat-pool-epp"}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "chat-pool-epp"},
         "spec": {"template": {"spec": {"containers": [{"name": "epp"}, {"name": "envoy-proxy"}]}}}}])
    path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not (Path(d) / "triarch-restrict-pods").exists())
    done = subprocess.run([command], input=rendered, cwd=tmp_path, env={**os.environ, "PATH": path},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    account, deployment = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert account == {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "chat-pool-epp"}}
    spec = deployment["spec"]["template"]["spec"]
    assert spec.get("imagePullSecrets") == secrets
    assert [c["securityContext"]["capabilities"] for c in spec["containers"]] == [{"drop": ["ALL"]}] * 2


# --- bad input: one line naming the key, exit 2 ------------------------------------------------------------------

def refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], index: int, **settings: Any) -> str:
    config = stack_document("fresh")
    config["triarch:models"][index].update(settings)
    return plan_refusal(tmp_path, capsys, config)


def test_a_ray_router_key_on_a_vllm_model_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(tmp_path, capsys, 0, prefixRouting={"enabled": True, "imbalancedThreshold": 8})
    assert line.startswith("error: triarch:models[0].prefixRouting.imbalancedThreshold: 8 tunes Ray Serve's"), line
    assert line.endswith("allowed: only prefixRouting.enabled on engine vllm"), line


def test_the_picker_for_one_replica_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/serving.md: routing by prefix buys nothing with one replica (there is no choice to make)."""
    line = refused(tmp_path, capsys, 1, prefixRouting={"enabled": True})
    assert line.startswith("error: triarch:models[1].prefixRouting.enabled: True picks among a model's replicas"), line
    assert line.endswith("allowed: replicas >= 2 or autoscaling.max >= 2, or remove prefixRouting"), line


def test_the_picker_with_caching_off_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(tmp_path, capsys, 0, prefixCaching=False)
    assert line.startswith("error: triarch:models[0].prefixRouting.enabled: True puts the endpoint picker"), line
    assert line.endswith("allowed: prefixRouting.enabled: false, or prefixCaching: true"), line


def test_the_picker_for_a_replica_across_nodes_is_refused(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    config = stack_document("fresh")
    config["triarch:models"][1].update(prefixRouting={"enabled": True}, replicas=2)  # two replicas to choose from
    config["triarch:nodeGroups"][1]["max"] = 8  # room for both
    line = plan_refusal(tmp_path, capsys, config)
    assert line.startswith("error: triarch:models[1].prefixRouting.enabled: True puts an endpoint picker"), line
    assert "spans 2 nodes" in line, line


# --- what turning it on or off does to running traffic (triarch diff), and where its pod goes -------------------

def fresh_effects(shipped: dict[str, StackPlan], enabled: bool, tmp_path: Path) -> list[str]:
    """The effects of chat's routing turned to `enabled`, against the shipped fresh stack (where it is on); off
    first and back on for the other direction."""
    config = stack_document("fresh")
    config["triarch:models"][0]["prefixRouting"] = {"enabled": False}
    off = document(plan_config("fresh", config, tmp_path / "off"))
    on = document(shipped["fresh"])
    base, head = (off, on) if enabled else (on, off)
    return traffic_effects(diff_plans(base, head), base, head, None, None)


def test_turning_the_picker_on_says_the_services_backends_move_to_the_proxy(shipped: dict[str, StackPlan],
                                                                           tmp_path: Path) -> None:
    found = [line for line in fresh_effects(shipped, True, tmp_path) if line.startswith("Service ")]
    assert found == ["Service chat: its backends move from the vLLM pods to the endpoint picker's proxies "
                     "(chat-pool-proxy): open connections stay on their pod, new ones go through a proxy, which "
                     "sends each request to the pod the picker chose by its prompt's start; four more pods (two "
                     "pickers, one leading, and two proxies) run beside the add-ons"]


def test_turning_the_picker_off_says_the_service_goes_back_to_the_pods(shipped: dict[str, StackPlan],
                                                                       tmp_path: Path) -> None:
    found = [line for line in fresh_effects(shipped, False, tmp_path) if line.startswith("Service ")]
    assert found == ["Service chat: its backends move from the endpoint picker's proxies (chat-pool-proxy) back to "
                     "the vLLM pods, connections spread over them without regard to their prefix caches; the "
                     "picker's pods are removed"]


def test_the_pickers_pods_are_placed_on_the_system_nodes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """prod with its vllm model made a generate model and routed: the placement proof places the two pickers (500m
    CPU, 1 GiB each) on the system pool by their affinity, and the two proxies (250m, 256 MiB each; a third while
    their Deployment rolls) where no taint keeps them off, the system pool too, and nothing breaks."""
    config = stack_document("prod")
    config["triarch:models"][0].update(model="Qwen/Qwen3-8B", prefixRouting={"enabled": True})
    path = write_stack_file(tmp_path / "Pulumi.routed.yaml", config)
    code = cli.main(["check", "--stack-file", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "Helm release embed-pool (endpoint picker): on system (m7i.xlarge); asks 500m CPU, 1024 MiB" in out, out
    assert "1 node(s) at its peak of 2 pod(s)" in out.split("embed-pool (endpoint picker)")[1].split("\n")[0], out
    proxies = out.split("Helm release embed-pool (proxy): ")[1].split("\n")[0]
    assert proxies.startswith("on system (m7i.xlarge); asks 250m CPU, 256 MiB") and "peak of 3 pod(s)" in proxies, out
    assert "triarch-guardrails: no violations" in out


def test_the_cost_report_counts_the_pickers_pods(tmp_path: Path) -> None:
    """capacity.json: the routed model's two pickers and two proxies (2 x 500m + 2 x 250m = 1500m CPU, 2 x 1024 +
    2 x 256 = 2560 MiB requested) and their share of an m7i.xlarge system node by CPU: $0.2016/h (prices.yaml,
    us-east-1) x 730 h x 1.5 / 4 vCPU = $55.19 a month."""
    config = stack_document("prod")
    config["triarch:models"][0].update(model="Qwen/Qwen3-8B", prefixRouting={"enabled": True})
    path = write_stack_file(tmp_path / "Pulumi.routed.yaml", config)
    assert cli.main(["plan", "--stack-file", str(path), "--out", str(tmp_path / "out")]) == 0
    capacity = json.loads((tmp_path / "out" / "capacity.json").read_text())
    pickers = {m["name"]: m.get("picker") for m in capacity["models"]}
    assert pickers == {"embed": {"pods": 4, "cpuMillicores": 1500, "memoryMiB": 2560, "monthlyUsdShare": 55.19,
                                 "of": "m7i.xlarge (4 vCPU)"}, "chat": None, "qwen": None}


def test_a_stack_routed_before_the_proxies_moved_out_is_told_what_its_upgrade_does() -> None:
    """A Service that selected the picker's pod (its sidecar proxy, as Triarch planned before) and now selects the
    proxies' own Deployment: said, with the gap it opens."""
    from triarch.effects import _picker_effects

    def plan(selector: dict[str, str]) -> dict[str, Any]:
        return {"resources": [{"type": "kubernetes:core/v1:Service",
                               "inputs": {"metadata": {"name": "chat"}, "spec": {"selector": selector}}}]}

    found = _picker_effects(plan({"llm-d-router-gateway": "chat-pool-epp"}),
                            plan({"llm-d-router-proxy": "chat-pool-proxy"}))
    assert found == ["Service chat: its backends move from the endpoint picker's pod and its sidecar proxy "
                     "(chat-pool-epp) to two proxies of their own (chat-pool-proxy), and a second picker waits to "
                     "lead: the picker's release upgrades and its old pod goes (Recreate): requests fail until the new "
                     "proxies are ready and a picker leads"]
    assert _picker_effects(plan({"llm-d-router-proxy": "chat-pool-proxy"}),
                           plan({"llm-d-router-proxy": "chat-pool-proxy"})) == []


@pytest.mark.parametrize(("paths", "said"), [
    (["version"], True),                                     # a chart bump: new templates and labels
    (["values.router.epp.image.tag"], True),                 # the picker's image
    (["postrender"], True),                                  # registry credentials added: the pods' pull Secret
    (["values.router.proxy.resources.requests.cpu"], False),  # the proxies roll, one at a time, under their budget
])
def test_a_change_that_replaces_the_pickers_pods_says_routing_stops_until_one_leads(paths: list[str], said: bool
                                                                                    ) -> None:
    """The chart's picker Deployment is Recreate: what changes its pods stops both pickers before the new start."""
    from triarch.diff import Diff, Difference
    from triarch.effects import _picker_roll, traffic_effects

    urn = "urn:pulumi:fresh::triarch::kubernetes:helm.sh/v3:Release::chat-pool"
    head = {"resources": [{"type": "kubernetes:helm.sh/v3:Release", "name": "chat-pool", "urn": urn, "inputs": {
        "name": "chat-pool", "chart": "oci://127.0.0.1:5000/charts/llm-d-router-standalone"}}]}
    difference = Difference("changed", "kubernetes:helm.sh/v3:Release", "chat-pool", urn, paths, False, "")
    expected = [f"Helm release chat-pool: its endpoint pickers' pods are replaced both at once (the chart's "
                f"Deployment is Recreate; caused by {paths[0]}): requests through the model's proxies fail until a "
                "new picker leads"]
    assert _picker_roll(difference, head) == (expected if said else [])
    assert traffic_effects(Diff([difference]), head, head, None, None) == (expected if said else [])
    other = {"resources": [{**head["resources"][0], "inputs": {"name": "keda", "chart": "oci://x/keda"}}]}
    assert _picker_roll(difference, other) == []
