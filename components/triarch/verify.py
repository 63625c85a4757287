"""`triarch verify`: a live cluster against the plan, layer by layer.

Where: every GPU node of a pool carries the planned labels and taint and advertises the planned nvidia.com/gpu, and
the driver GPU feature discovery reports satisfies the driver/CUDA matrix for every image placed there; the device
plugin, the DCGM exporter and Karpenter are ready. How: the KubeRay operator is ready and every Ray Serve application
is RUNNING. When: every vLLM server answers /health, lists its model on /v1/models and exports the metrics the
alerts read. The checks are pure functions of what `kubectl get -o json` and the servers return; `Cluster` fetches
that through testinfra's local host (kubectl and a port-forward per server).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from triarch.catalog import Catalog
from triarch.config import StackConfig
from triarch.matrix import Node, check_image_on_node, images_by_engine
from triarch.planners import device_plugin, karpenter, monitoring
from triarch.planners.coldstart import duration, span
from triarch.planners.model_plan import ModelPlan
from triarch.planners.models import uses_efa
from triarch.planners.nodegroups import PoolPlan
from triarch.planners.observability import observability_manifests
from triarch.planners.queries import selectors
from triarch.planners.ray import RAY_SERVICE, WorkerGroupKey
from triarch.planners.serving import KUBERAY_NAMESPACE, serving_settings
from triarch.planners.vllm import LWS_NAME_LABEL, LWS_WORKER_INDEX, PORT
from triarch.scheduling import POOL_LABEL

DRIVER_LABEL = "nvidia.com/cuda.driver-version.full"
"""The node's driver as GPU feature discovery labels it."""
GPU_RESOURCE = "nvidia.com/gpu"
ALERT_METRICS = ("num_requests_waiting", "num_requests_running", "kv_cache_usage_perc", "num_preemptions",
                 "time_to_first_token_seconds")
"""The vLLM metrics the alerts and the autoscaler read (base names; counters and histograms carry suffixes)."""


@dataclass(frozen=True)
class Finding:
    layer: str
    subject: str
    ok: bool
    message: str
    fix: str = ""


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def check_nodes(nodes: list[dict[str, Any]], pools: Iterable[PoolPlan]) -> Iterator[Finding]:
    """Where: each pool's nodes carry its labels and taints and advertise its GPUs."""
    for pool in pools:
        members = [n for n in nodes if _labels(n).get(POOL_LABEL) == pool.name]
        if not members:
            yield Finding("where", f"pool {pool.name}", True, "no nodes up (the pool may be scaled to zero)")
            continue
        for node in members:
            name = f"node {node['metadata']['name']} (pool {pool.name})"
            labels = _labels(node)
            wrong = {k: labels.get(k) for k, v in pool.labels.items() if labels.get(k) != v}
            if wrong:
                yield Finding("where", name, False, f"labels {wrong} where the plan has "
                              f"{ {k: pool.labels[k] for k in wrong} }",
                              "the node group's labels (pulumi up) or, for existing nodes, kubectl label")
            taints = [{k: t.get(k) for k in ("key", "value", "effect")} for t in (node.get("spec") or {}).get(
                "taints") or []]
            missing = [t for t in pool.taints if t not in taints]
            if missing:
                yield Finding("where", name, False, f"lacks the taint(s) {missing}: other pods can take its GPUs",
                              "the node group's taints (pulumi up) or kubectl taint")
            advertised = ((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE)
            if str(advertised) != str(pool.schedulable_gpus_per_node):
                yield Finding("where", name, False, f"advertises {advertised or 'no'} {GPU_RESOURCE}, the plan "
                              f"{pool.schedulable_gpus_per_node}",
                              "the device plugin is not running on it (taint, node selector) or a GPU failed "
                              "(see DCGM_FI_DEV_XID_ERRORS)")
            if not wrong and not missing and str(advertised) == str(pool.schedulable_gpus_per_node):
                yield Finding("where", name, True, f"labels, taints and {advertised} {GPU_RESOURCE} as planned")


def check_drivers(nodes: list[dict[str, Any]], stack: StackConfig, models: list[ModelPlan],
                  facts: Catalog) -> Iterator[Finding]:
    """Where: the driver each node reports against the CUDA of every image placed on its pool."""
    images = images_by_engine(stack, facts)
    placed = sorted({(m.pool.name, images[m.config.engine]) for m in models})
    pools = {m.pool.name: m.pool for m in models}
    for pool_name, ref in placed:
        image = facts.image(ref)
        if image is None:
            continue
        for node in (n for n in nodes if _labels(n).get(POOL_LABEL) == pool_name):
            name = f"node {node['metadata']['name']} (pool {pool_name})"
            driver = _labels(node).get(DRIVER_LABEL)
            if driver is None:
                yield Finding("where", name, False, f"has no {DRIVER_LABEL} label",
                              "GPU feature discovery is not running there (devicePlugin.gpuFeatureDiscovery)")
                continue
            verdict = check_image_on_node(image, Node(pool_name, pools[pool_name].gpu, driver, "reports"), facts)
            yield Finding("where", name, verdict.level != "error",
                          f"driver {driver} for {ref}: {verdict.message}",
                          "" if verdict.level != "error" else "pin an AMI release whose driver the matrix accepts")


def _holds_gpu(pod: Mapping[str, Any]) -> bool:
    return any(GPU_RESOURCE in (c.get("resources", {}).get("limits") or {}) for c in pod["spec"]["containers"])


def _get_text(url: str, timeout: float = 5.0) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.read().decode("utf-8", "replace"))
    except OSError:
        return ""


def check_ready(workloads: list[dict[str, Any]], release: str, layer: str, what: str) -> Finding:
    """A Helm release's DaemonSets and Deployments all ready (matched by app.kubernetes.io/instance)."""
    mine = [w for w in workloads if _labels(w).get("app.kubernetes.io/instance") == release]
    if not mine:
        return Finding(layer, what, False, f"no DaemonSet or Deployment of release {release}",
                       "pulumi up (the release is in the plan)")
    for w in mine:
        status = w.get("status") or {}
        if w["kind"] == "DaemonSet":
            want, have = status.get("desiredNumberScheduled", 0), status.get("numberReady", 0)
        else:
            want, have = (w.get("spec") or {}).get("replicas", 1), status.get("readyReplicas", 0)
        if have < want:
            return Finding(layer, what, False, f"{w['kind']} {w['metadata']['name']}: {have} of {want} ready",
                           f"kubectl -n {w['metadata']['namespace']} describe {w['kind'].lower()} "
                           f"{w['metadata']['name']}")
    return Finding(layer, what, True, f"{len(mine)} workload(s) ready")


def check_ray_service(service: dict[str, Any] | None, served: list[str]) -> Iterator[Finding]:
    """How: each Ray Serve application of the RayService RUNNING."""
    if service is None:
        yield Finding("how", f"RayService {RAY_SERVICE}", False, "not found", "pulumi up")
        return
    apps = ((service.get("status") or {}).get("activeServiceStatus") or {}).get("applicationStatuses") or {}
    for name in served:
        status = (apps.get(name) or {}).get("status", "absent")
        yield Finding("how", f"Ray Serve application {name}", status == "RUNNING", f"status {status}",
                      "" if status == "RUNNING" else
                      f"kubectl describe rayservice {RAY_SERVICE}; the head's logs (serve status)")


def exposition_names(exposition: str) -> set[str]:
    """Metric names of a Prometheus text exposition (comments and blank lines skipped)."""
    names = set()
    for line in exposition.splitlines():
        match = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)", line)
        if match and not line.startswith("#"):
            names.add(match.group(1))
    return names


def check_vllm(plan: ModelPlan, base_url: str, timeout: float = 5.0) -> Iterator[Finding]:
    """When: /health answers, /v1/models lists the served model, /metrics has what the alerts read."""
    subject = f"vLLM server {plan.name}"

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(base_url.rstrip("/") + path, timeout=timeout) as response:
                return response.status, response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as error:
            return error.code, ""
        except OSError as error:
            return 0, str(error)

    status, _ = get("/health")
    yield Finding("when", subject, status == 200, f"/health answered {status or 'nothing'}",
                  "" if status == 200 else f"kubectl -n <namespace> logs deploy/{plan.name} (weights, OOM, CUDA)")
    status, body = get("/v1/models")
    try:
        ids = [m.get("id") for m in json.loads(body).get("data", [])] if status == 200 else []
    except (json.JSONDecodeError, AttributeError):
        ids = []
    yield Finding("when", subject, plan.name in ids, f"/v1/models lists {ids or 'nothing'}",
                  "" if plan.name in ids else "--served-model-name must be the stack's model name (pulumi up)")
    status, body = get("/metrics")
    exported = exposition_names(body) if status == 200 else set()
    missing = [m for m in ALERT_METRICS
               if not any(n == f"vllm:{m}" or n.startswith(f"vllm:{m}_") for n in exported)]
    yield Finding("when", subject, not missing, "exports every metric the alerts read" if not missing else
                  f"does not export {', '.join('vllm:' + m for m in missing)}",
                  "" if not missing else "the image's vLLM must be the pinned one (templates/compat/images.yaml)")


DCGM_PORT = 9400
"""The DCGM exporter's metrics port (its chart's service.port)."""


def gpu_pod_labels(exposition: str) -> set[tuple[str, str]]:
    """(namespace, pod) of every GPU the exporter reports as held by a pod (DCGM_FI_DEV_GPU_UTIL, its own labels,
    before Prometheus renames them exported_*)."""
    held = set()
    for line in exposition.splitlines():
        if not line.startswith("DCGM_FI_DEV_GPU_UTIL{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        if found.get("pod"):
            held.add((found.get("namespace", ""), found["pod"]))
    return held


def check_gpu_pods(exposition: str, namespace: str, running: list[str]) -> Finding:
    """Where: the DCGM exporter names the serving pods holding GPUs (the alerts and the dashboard select GPUs by
    pod); an exporter that cannot read the kubelet's pod-resources socket labels none."""
    held = {pod for ns, pod in gpu_pod_labels(exposition) if ns == namespace}
    unseen = sorted(set(running) - held)
    return Finding("where", "DCGM exporter", not unseen,
                   "names the pod of every serving GPU" if not unseen else
                   f"reports no GPU for {', '.join(unseen)}",
                   "" if not unseen else "the exporter must run as root to read the kubelet's pod-resources socket "
                   "(the stack's dcgm values do); check its kubeletPath mount")


def alert_series(objects: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Every series selector the plan's alerts read (as PromQL, labels and all) -> the alerts reading it."""
    found: dict[str, list[str]] = {}
    for obj in objects:
        if obj["kind"] != "PrometheusRule":
            continue
        for group in obj["spec"]["groups"]:
            for rule in group["rules"]:
                for selector in selectors(rule["expr"]):
                    found.setdefault(selector, [])
                    if rule["alert"] not in found[selector]:
                        found[selector].append(rule["alert"])
    return dict(sorted(found.items()))


def check_alert_series(series: Mapping[str, list[str]], count: Callable[[str], int | None]) -> list[Finding]:
    """How: the cluster's Prometheus holds a series for every selector an alert reads (`count` answers how many, or
    None when Prometheus does not answer). An alert whose series Prometheus lacks can never fire."""
    missing = []
    for selector, alerts in series.items():
        found = count(selector)
        if found is None:
            return [Finding("where", "Prometheus", False, "does not answer queries",
                            "kubectl -n <observability.namespace> get pods (is Prometheus running?)")]
        if found == 0:
            missing.append((selector, alerts))
    if not missing:
        return [Finding("where", "Prometheus", True, f"holds every series the alerts read ({len(series)})")]
    return [Finding("where", "Prometheus", False, f"holds no series {selector} ({', '.join(alerts)} read it)",
                    "check the monitor that scrapes it (its labels: observability.monitorLabels) and the labels its "
                    "exporter gives (the DCGM exporter's pod and namespace arrive as exported_*)")
            for selector, alerts in missing]


def prometheus_service(url: str) -> tuple[str, str, int] | None:
    """(namespace, service, port) of an in-cluster Prometheus URL (http://<service>.<namespace>.svc[...]:<port>)."""
    match = re.fullmatch(r"https?://([a-z0-9-]+)\.([a-z0-9-]+)\.svc(?:\.cluster\.local)?(?::(\d+))?/?", url)
    if match is None:
        return None
    return match.group(2), match.group(1), int(match.group(3) or 80)


def prometheus_count(base_url: str, selector: str, timeout: float = 10.0) -> int | None:
    """How many series Prometheus holds for a selector (its HTTP query API), None when it does not answer."""
    query = urllib.parse.urlencode({"query": f"count({selector})"})
    try:
        with urllib.request.urlopen(f"{base_url.rstrip('/')}/api/v1/query?{query}", timeout=timeout) as response:
            result = json.loads(response.read().decode("utf-8"))["data"]["result"]
    except (OSError, ValueError, KeyError):
        return None
    return int(float(result[0]["value"][1])) if result else 0


class Unreachable(Exception):
    """No cluster answers (no kubectl, no context, or the API server does not): verify is skipped."""


class KubectlFailed(Exception):
    """The cluster answered, but a kubectl call failed (RBAC, a missing namespace): verify fails."""


NCCL_OVER_EFA = ("Using network Libfabric", "Using network AWS Libfabric", "NET/OFI Selected provider is efa")
"""What NCCL (with aws-ofi-nccl) logs at INFO when it talks over EFA: NVIDIA/nccl src/init.cc "Using network %s"
with the plugin's name (Libfabric since aws-ofi-nccl 1.12, "AWS Libfabric" before), and the plugin's own line
(aws/aws-ofi-nccl src/nccl_ofi_net.cpp)."""
NCCL_OVER_TCP = ("Using network Socket", "NET/Socket : Using")
"""What it logs when it found no network plugin and uses TCP sockets (src/init.cc, src/transport/net_socket.cc)."""
RAY_LOGS = "/tmp/ray/session_latest/logs"
"""Where a Ray worker pod's processes (Serve replicas, vLLM's workers) write their output."""


def nccl_transport(log: str) -> str | None:
    """"efa", "tcp", or None when the log says neither (NCCL not started, or NCCL_DEBUG not INFO)."""
    if any(marker in log for marker in NCCL_OVER_EFA):
        return "efa"
    if any(marker in log for marker in NCCL_OVER_TCP):
        return "tcp"
    return None


def check_nccl(plan: ModelPlan, pod: str, log: str) -> Finding:
    """A replica across nodes on an EFA pool talks over EFA, not over the TCP NCCL falls back to unannounced."""
    subject = f"{plan.name} NCCL ({pod})"
    transport = nccl_transport(log)
    if transport == "efa":
        return Finding("when", subject, True, "the stages talk over EFA (Libfabric)")
    if transport == "tcp":
        return Finding("when", subject, False, "NCCL fell back to TCP sockets between the nodes",
                       "an image with libfabric and aws-ofi-nccl (templates/compat/efa-images.yaml), and the pod's "
                       "vpc.amazonaws.com/efa request granted")
    return Finding("when", subject, False, "no NCCL network line in the log (not started yet, or NCCL_DEBUG unset)",
                   "wait for the replica to load, then run verify again")


VLLM_START_LINES = {
    "load": re.compile(r"Model loading took [\d.]+ ?GiB(?: memory)? and ([\d.]+) seconds"),
    "compile": re.compile(r"torch\.compile (?:takes|took) ([\d.]+) s in total"),
    "graphs": re.compile(r"Graph capturing finished in ([\d.]+) secs"),
    "init": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) (?:seconds|s)"),
}
"""What vLLM logs of its own start (0.33.0's format strings: model_loader gpu_model_runner.py "Model loading took",
compilation/monitor.py "torch.compile took", gpu_model_runner.py "Graph capturing finished", v1/engine/core.py "init
engine ... took"; earlier releases' "takes" and "seconds" too). The last match wins: a restarted engine logs again."""


def _seconds_at(stamp: str | None) -> float | None:
    if not stamp:
        return None
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class StartTimes:
    """One pod's start, as its own status and vLLM's log tell it (seconds; None where they do not say)."""

    pod: str
    to_scheduled: float | None
    """Created to bound to a node: the node's launch, where none had room."""
    to_started: float | None
    """Bound to the server container running: the image pull (and volume mounts)."""
    to_ready: float | None
    """Container running to Ready: the weights and vLLM's start."""
    total: float | None
    vllm: dict[str, float]
    """load, compile, graphs, init: vLLM's own figures."""


def start_times(pod: Mapping[str, Any], log: str, container: str = "vllm") -> StartTimes:
    """A Ready pod's start from its creation, its conditions' transition times and its container's start."""
    status = pod.get("status") or {}
    created = _seconds_at((pod.get("metadata") or {}).get("creationTimestamp"))
    when = {c.get("type"): _seconds_at(c.get("lastTransitionTime")) for c in status.get("conditions") or []
            if c.get("status") == "True"}
    running = next((c.get("state", {}).get("running", {}).get("startedAt") for c in
                    status.get("containerStatuses") or [] if c.get("name") == container), None)
    started = _seconds_at(running)
    scheduled, ready = when.get("PodScheduled"), when.get("Ready")

    def between(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else max(0.0, b - a)

    found = {name: float(matches[-1]) for name, pattern in VLLM_START_LINES.items()
             if (matches := pattern.findall(log))}
    return StartTimes(str(pod["metadata"]["name"]), between(created, scheduled), between(scheduled, started),
                      between(started, ready), between(created, ready), found)


def check_start(plan: ModelPlan, times: StartTimes) -> Finding:
    """A replica's measured start beside its prediction; slower than the prediction's slow end with its margin is a
    finding (the budget the startup probe and `pulumi up` were given came from it)."""
    subject = f"{plan.name} start ({times.pod})"
    measured = ", ".join(f"{label} {duration(value)}" for label, value in (
        ("to a node", times.to_scheduled), ("image", times.to_started), ("weights + engine", times.to_ready))
        if value is not None)
    own = ", ".join(f"{k} {v:g}s" for k, v in times.vllm.items())
    cold = plan.cold_start
    predicted = "" if cold is None else f"; predicted {span(cold.total())}" + (
        f" + {', '.join(cold.unknown())} unknown" if cold.unknown() else "")
    text = (f"Ready {duration(times.total)} after creation" if times.total is not None else "not Ready yet") + (
        f" ({measured})" if measured else "") + (f"; vLLM: {own}" if own else "") + predicted
    if cold is not None and times.total is not None and not cold.unknown() \
            and times.total > cold.total().high * cold.margin:
        return Finding("when", subject, False, text + ": slower than the prediction's slow end with its margin",
                       "compare the parts with `triarch plan`'s; a slow part is worth a look (image size, the cache's "
                       "throughput, a cold compile cache)")
    return Finding("when", subject, True, text)


class Cluster:
    """kubectl through testinfra's local host."""

    def __init__(self, context: str | None = None) -> None:
        import testinfra  # type: ignore[import-untyped]

        self.host = testinfra.get_host("local://")
        self.context = ["--context", context] if context else []

    def kubectl(self, *args: str) -> str:
        result = self.host.run(" ".join(["kubectl", *self.context, *args]))
        if result.rc != 0:
            raise KubectlFailed(f"kubectl {' '.join(args)}: " + (result.stderr.strip().splitlines()[-1]
                                                                  if result.stderr.strip() else f"exit {result.rc}"))
        return str(result.stdout)

    def reachable(self) -> None:
        if not self.host.exists("kubectl"):
            raise Unreachable("kubectl is not on the PATH")
        try:
            self.kubectl("get", "--raw", "/readyz")
        except KubectlFailed as why:
            raise Unreachable(str(why)) from None

    def items(self, *args: str) -> list[dict[str, Any]]:
        return list(json.loads(self.kubectl("get", *args, "-o", "json")).get("items", []))

    def get(self, *args: str) -> dict[str, Any] | None:
        try:
            return dict(json.loads(self.kubectl("get", *args, "-o", "json")))
        except KubectlFailed:
            return None

    @contextmanager
    def forward(self, namespace: str, service: str, port: int = PORT) -> Iterator[str]:
        """A local address for a service's port (the OpenAI port unless told), through kubectl port-forward."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            local = probe.getsockname()[1]
        process = subprocess.Popen(["kubectl", *self.context, "-n", namespace, "port-forward", f"svc/{service}",
                                    f"{local}:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(50):
                with socket.socket() as attempt:
                    if attempt.connect_ex(("127.0.0.1", local)) == 0:
                        break
                time.sleep(0.1)
            yield f"http://127.0.0.1:{local}"
        finally:
            process.terminate()
            process.wait(timeout=10)


def verify(cluster: Cluster, stack: StackConfig, models: list[ModelPlan], pools: list[PoolPlan], facts: Catalog,
           endpoints: Mapping[str, str]) -> list[Finding]:
    """Every check, where first (a failure there explains those above it)."""
    nodes = cluster.items("nodes")
    findings = [*check_nodes(nodes, pools), *check_drivers(nodes, stack, models, facts)]
    if stack.device_plugin.mode == "install":
        findings.append(check_ready(cluster.items("daemonsets", "-n", device_plugin.NAMESPACE),
                                    device_plugin.RELEASE, "where", "NVIDIA device plugin"))
    namespace = stack.serving.namespace
    if stack.prometheus != "none" and stack.observability.dcgm_exporter:
        ready = check_ready(cluster.items("daemonsets", "-n", monitoring.DCGM_NAMESPACE), monitoring.DCGM_RELEASE,
                            "where", "DCGM exporter")
        findings.append(ready)
        running = [p["metadata"]["name"] for p in cluster.items("pods", "-n", namespace)
                   if p.get("status", {}).get("phase") == "Running" and _holds_gpu(p)]
        if ready.ok and running:
            with cluster.forward(monitoring.DCGM_NAMESPACE, monitoring.DCGM_RELEASE, DCGM_PORT) as url:
                findings.append(check_gpu_pods(_get_text(url + "/metrics"), namespace, running))
    target = prometheus_service(stack.observability.prometheus_url)
    if stack.prometheus != "none" and models and target is not None:
        series = alert_series(observability_manifests(stack, models, serving_settings(stack, False, False)))
        with cluster.forward(target[0], target[1], target[2]) as url:
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


def report(findings: list[Finding]) -> str:
    lines = []
    for layer, title in (("where", "Where (Kubernetes)"), ("how", "How (Ray)"), ("when", "When (vLLM)")):
        mine = [f for f in findings if f.layer == layer]
        if not mine:
            continue
        lines.append(title)
        for f in mine:
            lines.append(f"  {'ok  ' if f.ok else 'FAIL'} {f.subject}: {f.message}" + (f" -> {f.fix}" if f.fix else ""))
    failed = sum(not f.ok for f in findings)
    lines.append(f"{len(findings) - failed} ok, {failed} failing")
    return "\n".join(lines)
