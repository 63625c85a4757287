"""Where: Kubernetes' layer, which places the work. Each pool's nodes carry its labels, taints and GPUs, their
drivers suit the images placed there, the DCGM exporter names the pods holding GPUs, and Prometheus holds every
series the alerts read."""

from __future__ import annotations

import json
import re
import ssl
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from triarch.catalog import Catalog
from triarch.config import StackConfig
from triarch.matrix import Node, check_image_on_node, images_by_engine
from triarch.planners.model_plan import ModelPlan
from triarch.planners.nodegroups import PoolPlan
from triarch.planners.queries import selectors
from triarch.scheduling import POOL_LABEL
from triarch.verify.base import GPU_RESOURCE, Finding, labels_of

DRIVER_LABEL = "nvidia.com/cuda.driver-version.full"
"""The node's driver as GPU feature discovery labels it."""


def check_nodes(nodes: list[dict[str, Any]], pools: Iterable[PoolPlan]) -> Iterator[Finding]:
    """Where: each pool's nodes carry its labels and taints and advertise its GPUs."""
    for pool in pools:
        members = [n for n in nodes if labels_of(n).get(POOL_LABEL) == pool.name]
        if not members:
            yield Finding("where", f"pool {pool.name}", True, "no nodes up (the pool may be scaled to zero)")
            continue
        for node in members:
            name = f"node {node['metadata']['name']} (pool {pool.name})"
            labels = labels_of(node)
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
        for node in (n for n in nodes if labels_of(n).get(POOL_LABEL) == pool_name):
            name = f"node {node['metadata']['name']} (pool {pool_name})"
            driver = labels_of(node).get(DRIVER_LABEL)
            if driver is None:
                yield Finding("where", name, False, f"has no {DRIVER_LABEL} label",
                              "GPU feature discovery is not running there (devicePlugin.gpuFeatureDiscovery)")
                continue
            verdict = check_image_on_node(image, Node(pool_name, pools[pool_name].gpu, driver, "reports"), facts)
            yield Finding("where", name, verdict.level != "error",
                          f"driver {driver} for {ref}: {verdict.message}",
                          "" if verdict.level != "error" else "pin an AMI release whose driver the matrix accepts")


def holds_gpu(pod: Mapping[str, Any]) -> bool:
    return any(GPU_RESOURCE in (c.get("resources", {}).get("limits") or {}) for c in pod["spec"]["containers"])


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
    """(namespace, service, port) of an in-cluster Prometheus URL (http[s]://<service>.<namespace>.svc[...][:<port>]);
    without a port, the scheme's default (RFC 9110: 80 for http, 443 for https)."""
    match = re.fullmatch(r"(https?)://([a-z0-9-]+)\.([a-z0-9-]+)\.svc(?:\.cluster\.local)?(?::(\d+))?/?", url)
    if match is None:
        return None
    return match.group(3), match.group(2), int(match.group(4) or (443 if match.group(1) == "https" else 80))


def prometheus_count(base_url: str, selector: str, timeout: float = 10.0) -> int | None:
    """How many series Prometheus holds for a selector (its HTTP query API), None when it does not answer."""
    query = urllib.parse.urlencode({"query": f"count({selector})"})
    tunnelled = None
    if base_url.startswith("https://127.0.0.1:"):
        # kubectl's port-forward is the authenticated channel; the in-cluster certificate names the Service (not
        # 127.0.0.1) and is signed by a CA this machine need not trust, so TLS here only carries the bytes.
        tunnelled = ssl.create_default_context()
        tunnelled.check_hostname = False
        tunnelled.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(f"{base_url.rstrip('/')}/api/v1/query?{query}", timeout=timeout,
                                    context=tunnelled) as response:
            result = json.loads(response.read().decode("utf-8"))["data"]["result"]
    except (OSError, ValueError, KeyError):
        return None
    return int(float(result[0]["value"][1])) if result else 0
