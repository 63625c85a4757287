"""`triarch verify`: the checks on the formats a live cluster returns (`kubectl get -o json` lists, checked against
the Kubernetes schemas here; the RayService status against KubeRay's CRD), vLLM's endpoints served by a loopback
HTTP server, and the command end to end with a kubectl stand-in that answers from those files. Nothing fakes a
success: each check is shown failing on a broken input too."""

from __future__ import annotations

import copy
import json
import os
import stat
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from conftest import crd_schema
from triarch.catalog import catalog
from triarch.cli import main
from triarch.config import from_pulumi_config
from triarch.offline import read_stack_config
from triarch.planners.models import plan_models
from triarch.planners.nodegroups import plan_pool
from triarch.verify.base import check_ready
from triarch.verify.how import check_ray_service
from triarch.verify.when import check_start, check_vllm, exposition_names, start_times
from triarch.verify.where import check_drivers, check_nodes

HERE = Path(__file__).resolve().parent
RECORDED = HERE / "verify"
ROOT = HERE.parent


def recorded(name: str) -> Any:
    return json.loads((RECORDED / name).read_text(encoding="utf-8"))


def local_stack() -> tuple[Any, list[Any], list[Any]]:
    config, _ = read_stack_config(ROOT / "stacks" / "Pulumi.local.yaml")
    stack = from_pulumi_config(config)
    pools = [plan_pool(stack, group, catalog()) for group in stack.node_groups]
    return stack, plan_models(stack, catalog()), pools


@pytest.mark.parametrize("name", ["nodes.json", "daemonsets-nvidia-device-plugin.json", "pods-llm.json"])
def test_the_recorded_shapes_are_what_the_api_server_returns(name: str) -> None:
    for item in recorded(name)["items"]:
        kubernetes_validate.validate(item, "1.34", strict=True)


def test_the_recorded_ray_service_status_is_kuberays() -> None:
    status = crd_schema("kuberay-v1.7.0", "ray.io_rayservices.yaml")["properties"]["status"]
    jsonschema.validators.validator_for(status)(status).validate(recorded("rayservice.json")["status"])


def test_nodes_as_planned_pass_and_each_drift_fails_with_its_fix() -> None:
    _, _, pools = local_stack()
    nodes = recorded("nodes.json")["items"]
    assert [f.ok for f in check_nodes(nodes, pools)] == [True]
    unlabeled = copy.deepcopy(nodes)
    del unlabeled[0]["metadata"]["labels"]["triarch.dev/gpu"]
    assert check_nodes(unlabeled, pools)  # the node still belongs to the pool by its pool label
    [finding] = [f for f in check_nodes(unlabeled, pools) if not f.ok]
    assert "triarch.dev/gpu" in finding.message and finding.fix
    no_gpus = copy.deepcopy(nodes)
    no_gpus[0]["status"]["allocatable"].pop("nvidia.com/gpu")
    [finding] = [f for f in check_nodes(no_gpus, pools) if not f.ok]
    assert "advertises no nvidia.com/gpu, the plan 1" in finding.message and "device plugin" in finding.fix


def test_a_tainted_pool_needs_its_taint() -> None:
    config, _ = read_stack_config(ROOT / "stacks" / "Pulumi.prod.yaml")
    stack = from_pulumi_config(config)
    [l4] = [plan_pool(stack, g, catalog()) for g in stack.node_groups if g.name == "l4"]
    node = copy.deepcopy(recorded("nodes.json")["items"][0])
    node["metadata"]["labels"].update(l4.labels)
    failing = [f for f in check_nodes([node], [l4]) if not f.ok]
    assert [f.message for f in failing if "taint" in f.message]
    node["spec"]["taints"] = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    assert all(f.ok for f in check_nodes([node], [l4]))


def test_the_reported_driver_is_checked_against_the_images_cuda() -> None:
    stack, models, _ = local_stack()
    nodes = recorded("nodes.json")["items"]
    [finding] = list(check_drivers(nodes, stack, models, catalog()))
    assert finding.ok and "580.95.05" in finding.message
    old = copy.deepcopy(nodes)
    old[0]["metadata"]["labels"]["nvidia.com/cuda.driver-version.full"] = "535.104.05"  # CUDA 12.2's driver
    [finding] = list(check_drivers(old, stack, models, catalog()))
    assert not finding.ok and "AMI release" in finding.fix


def test_add_ons_ready_or_not() -> None:
    [ds] = recorded("daemonsets-nvidia-device-plugin.json")["items"]
    assert check_ready([ds], "nvidia-device-plugin", "where", "device plugin").ok
    stuck = copy.deepcopy(ds)
    stuck["status"]["numberReady"] = 0
    finding = check_ready([stuck], "nvidia-device-plugin", "where", "device plugin")
    assert not finding.ok and "0 of 1 ready" in finding.message
    assert not check_ready([], "nvidia-device-plugin", "where", "device plugin").ok


def test_ray_serve_applications_must_be_running() -> None:
    findings = {f.subject: f for f in check_ray_service(recorded("rayservice.json"), ["chat", "qwen", "gone"])}
    assert findings["Ray Serve application chat"].ok
    assert not findings["Ray Serve application qwen"].ok and "DEPLOY_FAILED" in findings[
        "Ray Serve application qwen"].message
    assert "absent" in findings["Ray Serve application gone"].message
    assert not next(iter(check_ray_service(None, ["chat"]))).ok


EXPOSITION = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="embed"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="embed"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="embed"} 0.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="embed"} 0.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="embed"} 0.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="embed"} 0.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="embed"} 0.0
"""


class Server:
    """What vLLM's OpenAI server answers on /health, /v1/models and /metrics (a loopback HTTP server)."""

    def __init__(self, health: int = 200, models: tuple[str, ...] = ("embed",), metrics: str = EXPOSITION) -> None:
        self.health, self.models, self.metrics = health, models, metrics

    @property
    def handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/health":
                    self._send(server.health, b"")
                elif self.path == "/v1/models":
                    body = {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "vllm"}
                                                       for m in server.models]}
                    self._send(200, json.dumps(body).encode(), "application/json")
                elif self.path == "/metrics":
                    self._send(200, server.metrics.encode(), "text/plain; version=0.0.4")
                else:
                    self._send(404, b"")

            def _send(self, code: int, body: bytes, kind: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []

    def start(server: Server) -> str:
        http = ThreadingHTTPServer(("127.0.0.1", 0), server.handler)
        threading.Thread(target=http.serve_forever, daemon=True).start()
        servers.append(http)
        return f"http://127.0.0.1:{http.server_address[1]}"

    yield start
    for http in servers:
        http.shutdown()


def test_a_healthy_vllm_server_passes_and_each_fault_fails(serve: Any) -> None:
    _, models, _ = local_stack()
    [embed] = models
    assert all(f.ok for f in check_vllm(embed, serve(Server())))
    sick = [f for f in check_vllm(embed, serve(Server(health=503))) if not f.ok]
    assert [f.message for f in sick] == ["/health answered 503"]
    renamed = [f for f in check_vllm(embed, serve(Server(models=("Qwen/Qwen3-Embedding-0.6B",)))) if not f.ok]
    assert len(renamed) == 1 and "served-model-name" in renamed[0].fix
    thin = EXPOSITION.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    [missing] = [f for f in check_vllm(embed, serve(Server(metrics=thin))) if not f.ok]
    assert "vllm:kv_cache_usage_perc" in missing.message
    [down] = [f for f in check_vllm(embed, "http://127.0.0.1:9", timeout=1) if not f.ok][:1]
    assert "answered nothing" in down.message
    assert "vllm:num_preemptions_total" in exposition_names(EXPOSITION)


KUBECTL = """#!{python}
import json, pathlib, sys
args = [a for a in sys.argv[1:]]
for flag in ("--kubeconfig", "--context"):
    if flag in args:
        i = args.index(flag); del args[i:i + 2]
recorded = pathlib.Path({recorded!r})
if args[:2] == ["get", "--raw"]:
    print("ok"); sys.exit(0)
if args[:2] == ["get", "nodes"]:
    print((recorded / "nodes.json").read_text()); sys.exit(0)
if args[:2] == ["get", "pods"]:
    print((recorded / "pods-llm.json").read_text()); sys.exit(0)
if args[:1] == ["logs"]:
    print((recorded / "vllm-embed.log").read_text()); sys.exit(0)
if args[:2] == ["get", "daemonsets"] and args[3] == "nvidia-device-plugin":
    print((recorded / "daemonsets-nvidia-device-plugin.json").read_text()); sys.exit(0)
print("error: the server doesn't have a resource type", file=sys.stderr); sys.exit(1)
"""


def test_verify_end_to_end_against_recorded_answers(tmp_path: Path, serve: Any, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(KUBECTL.format(python=sys.executable, recorded=str(RECORDED)))
    kubectl.chmod(kubectl.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    url = serve(Server())
    assert main(["verify", "--stack", "local", "--context", "triarch-local", "--endpoint", f"embed={url}"]) == 0
    out = capsys.readouterr().out
    assert "Where (Kubernetes)" in out and "When (vLLM)" in out and "0 failing" in out
    assert "ok   embed start (embed-6d8f9c7b5-x2k4q): Ready 4m51s after creation" in out
    sick = serve(Server(health=503))
    assert main(["verify", "--stack", "local", "--endpoint", f"embed={sick}"]) == 1
    assert "FAIL vLLM server embed: /health answered 503 -> kubectl" in capsys.readouterr().out


UNREACHABLE = """#!/bin/sh
echo "$@" >> {calls}
echo 'error: context "my-eks" does not exist' >&2
exit 1
"""


def unreachable_kubectl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A kubectl that reaches no cluster (as for a context that does not exist), writing down how it was called."""
    calls = tmp_path / "calls"
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(UNREACHABLE.format(calls=calls))
    kubectl.chmod(kubectl.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_verify_fails_on_a_named_cluster_it_cannot_reach(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A typo in CI's --context must not pass verification: exit 1, one line naming the context and kubectl's
    reason."""
    unreachable_kubectl(tmp_path, monkeypatch)
    assert main(["verify", "--stack", "prod", "--context", "my-eks"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("error: verify prod: cannot reach the cluster of context 'my-eks' (--context): kubectl "
                            'get --raw /readyz: error: context "my-eks" does not exist; name a context that reaches '
                            "it (--context), or pass --if-reachable to skip a cluster that cannot be reached\n")


def test_verify_reaches_an_adopted_cluster_through_the_stacks_kubeconfig_and_context(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    calls = unreachable_kubectl(tmp_path, monkeypatch)
    assert main(["verify", "--stack", "local"]) == 1
    assert "cluster of context 'triarch-local' (triarch:cluster.context)" in capsys.readouterr().err
    kubeconfig = os.path.expanduser("~/.kube/config")  # stacks/Pulumi.local.yaml's
    assert calls.read_text().splitlines() == [f"--kubeconfig {kubeconfig} --context triarch-local get --raw /readyz"]
    # another context given: kubectl's own kubeconfig, not the stack's
    calls.unlink()
    assert main(["verify", "--stack", "local", "--context", "other"]) == 1
    assert calls.read_text().splitlines() == ["--context other get --raw /readyz"]
    capsys.readouterr()
    # a created cluster names no context: kubectl's current one, said so
    assert main(["verify", "--stack", "prod"]) == 1
    assert "cannot reach the cluster of kubectl's current context: " in capsys.readouterr().err


def test_verify_skips_an_unreachable_cluster_only_when_asked_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no kubectl at all
    assert main(["verify", "--stack", "local"]) == 1
    assert "(triarch:cluster.context): kubectl is not on the PATH;" in capsys.readouterr().err
    assert main(["verify", "--stack", "local", "--if-reachable"]) == 0
    assert capsys.readouterr().err == "verify local: skipped, no cluster reachable (kubectl is not on the PATH)\n"


def test_a_bad_endpoint_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--stack", "local", "--endpoint", "embed"]) == 2
    assert "--endpoint: 'embed' is not NAME=URL" in capsys.readouterr().err


def test_a_cluster_that_answers_but_refuses_a_query_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(KUBECTL.format(python=sys.executable, recorded=str(tmp_path / "nothing-recorded")))
    kubectl.chmod(kubectl.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert main(["verify", "--stack", "local"]) == 1  # /readyz answers, the node list does not
    assert "the cluster answered but kubectl get nodes" in capsys.readouterr().err


GPU = 'gpu="{n}",UUID="GPU-{n}",device="nvidia{n}",modelName="NVIDIA L4",Hostname="n1"'
DCGM_EXPOSITION = "\n".join([
    "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
    "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
    "DCGM_FI_DEV_GPU_UTIL{" + GPU.format(n=0) + ',container="vllm",namespace="llm",pod="embed-7d9c6b5f48-x2x9z"} 71',
    "DCGM_FI_DEV_GPU_UTIL{" + GPU.format(n=1) + "} 0",
    "DCGM_FI_DEV_FB_USED{" + GPU.format(n=0) + ',container="vllm",namespace="llm",pod="chat-1"} 1',
]) + "\n"


def test_the_exporter_must_name_the_pod_holding_each_serving_gpu() -> None:
    """A non-root exporter cannot read the kubelet's pod-resources socket: its GPUs carry no pod, and the GPU alerts
    and panels select nothing."""
    from triarch.verify.where import check_gpu_pods, gpu_pod_labels

    assert gpu_pod_labels(DCGM_EXPOSITION) == {("llm", "embed-7d9c6b5f48-x2x9z")}  # GPU_UTIL only, pods only
    seen = check_gpu_pods(DCGM_EXPOSITION, "llm", ["embed-7d9c6b5f48-x2x9z"])
    assert seen.ok and seen.layer == "where"
    unseen = check_gpu_pods(DCGM_EXPOSITION, "llm", ["embed-7d9c6b5f48-x2x9z", "chat-1"])
    assert not unseen.ok and unseen.message == "reports no GPU for chat-1"
    assert "root" in unseen.fix and "pod-resources" in unseen.fix
    assert not check_gpu_pods(DCGM_EXPOSITION, "other", ["embed-7d9c6b5f48-x2x9z"]).ok  # namespace matters


def prod_plan() -> tuple[Any, Any]:
    from conftest import stack_path
    from triarch.planners.objects import plan_kubernetes

    stack = from_pulumi_config(read_stack_config(stack_path("prod"))[0])
    models = plan_models(stack, catalog())
    return stack, plan_kubernetes(stack, models, catalog())


def test_verify_reads_the_series_the_alerts_read() -> None:
    from triarch.verify.where import alert_series, check_alert_series

    _, objects = prod_plan()
    series = alert_series(objects.observability)
    # the selectors as the alerts write them, labels and all, each with the alerts reading it
    assert sorted(series["DCGM_FI_DEV_XID_ERRORS"]) == ["GpuXidApplicationError", "GpuXidNodeError",
                                                        "GpuXidNodeRepair", "GpuXidResetPending",
                                                        "GpuXidUnclassified"]
    assert series['ray_serve_deployment_queued_queries{application="chat",namespace="llm"}'] == [
        "ChatRequestsQueuedGpusIdle"]
    assert 'vllm:kv_cache_usage_perc{model_name="embed",namespace="llm"}' in series
    everything = check_alert_series(series, lambda selector: 3)
    assert [(f.ok, f.message) for f in everything] == [(True, f"holds every series the alerts read ({len(series)})")]
    # a DCGM exporter scraped with its labels honoured has no exported_pod: the GPU alerts read nothing
    lacking = check_alert_series(series, lambda selector: 0 if "exported_pod" in selector else 1)
    assert lacking and not any(f.ok for f in lacking)
    assert all("exported_pod" in f.message and "exported_*" in f.fix for f in lacking)
    assert "(ChatRequestsQueuedGpusIdle read it)" in " ".join(f.message for f in lacking)
    [silent] = check_alert_series(series, lambda selector: None)
    assert not silent.ok and silent.message == "does not answer queries"


def test_the_prometheus_url_names_the_service_to_forward() -> None:
    from triarch.verify.where import prometheus_service

    assert prometheus_service("http://kube-prometheus-stack-prometheus.monitoring.svc:9090") == (
        "monitoring", "kube-prometheus-stack-prometheus", 9090)
    assert prometheus_service("http://prom.obs.svc.cluster.local") == ("obs", "prom", 80)
    assert prometheus_service("https://prometheus.example.com") is None  # not in the cluster: nothing to forward


def test_prometheus_is_asked_how_many_series_it_holds(serve: Any) -> None:
    from triarch.verify.where import prometheus_count

    asked: list[str] = []

    class Prometheus(Server):
        @property
        def handler(self) -> type[BaseHTTPRequestHandler]:
            class Handler(BaseHTTPRequestHandler):
                def do_GET(self) -> None:
                    import urllib.parse

                    query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["query"][0]
                    asked.append(query)
                    result = [{"metric": {}, "value": [0, "2"]}] if "DCGM" in query else []
                    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(body.encode())

                def log_message(self, format: str, *args: object) -> None:
                    return

            return Handler

    url = serve(Prometheus())
    assert prometheus_count(url, 'DCGM_FI_DEV_GPU_UTIL{exported_namespace="llm"}') == 2
    assert prometheus_count(url, "vllm:num_requests_waiting") == 0
    assert asked == ['count(DCGM_FI_DEV_GPU_UTIL{exported_namespace="llm"})', "count(vllm:num_requests_waiting)"]
    assert prometheus_count("http://127.0.0.1:9", "up", timeout=1) is None


# --- a replica's start, measured -----------------------------------------------------------------------------

def test_a_replicas_start_is_read_from_its_status_and_vllms_log() -> None:
    [pod] = recorded("pods-llm.json")["items"]
    times = start_times(pod, (RECORDED / "vllm-embed.log").read_text(encoding="utf-8"))
    # 08:00:00 created, 08:02:22 scheduled, 08:03:33 the container running, 08:04:51 Ready
    assert (times.to_scheduled, times.to_started, times.to_ready, times.total) == (142, 71, 78, 291)
    assert times.vllm == {"load": 4.213391, "compile": 8.37, "graphs": 14, "init": 33.12}


def test_older_vllm_wording_and_a_restart_read_the_last_start() -> None:
    [pod] = recorded("pods-llm.json")["items"]
    log = ("Model loading took 15.00 GiB and 41.5 seconds\ntorch.compile takes 52.0 s in total\n"
           "init engine (profile, create kv cache, warmup model) took 90.10 seconds\n"
           "Model loading took 15.00 GiB and 12.0 seconds\n")
    assert start_times(pod, log).vllm == {"load": 12.0, "compile": 52.0, "init": 90.1}


def test_a_start_slower_than_the_prediction_with_its_margin_fails() -> None:
    _, models, _ = local_stack()
    [plan] = models
    [pod] = recorded("pods-llm.json")["items"]
    times = start_times(pod, "")
    # The local stack's image pull is unknown (an adopted cluster's disks): no verdict on speed, only the facts.
    finding = check_start(plan, times)
    assert finding.ok and "Ready 4m51s after creation (to a node 2m22s, image 1m11s, weights + engine 1m18s)" in \
        finding.message
    stack = from_pulumi_config(read_stack_config(ROOT / "stacks" / "Pulumi.dev.yaml")[0])
    [dev] = plan_models(stack, catalog())
    assert dev.cold_start is not None and not dev.cold_start.unknown()
    slow = copy.deepcopy(pod)
    for condition in slow["status"]["conditions"]:
        if condition["type"] == "Ready":
            condition["lastTransitionTime"] = "2026-12-02T08:30:00Z"  # 30 minutes: beyond 1.5 x the slow end
    assert check_start(dev, start_times(pod, "")).ok
    late = check_start(dev, start_times(slow, ""))
    assert not late.ok and "slower than the prediction's slow end" in late.message
