"""The workloads of the placement proof, read from the plan's resources: Deployments, StatefulSets, LeaderWorkerSets,
Ray heads and worker groups, and the pods the Helm releases run (placed as each chart places them with its values),
each with one pod's requests and its replicas at their largest (a rollout's surge, a RayService upgrade's second
cluster)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from triarch.guardrails.placement_pools import Amounts, as_int, cpu_millicores, memory_mib, overhead
from triarch.guardrails.workloads import LWS_KIND, kind_of, pod_templates
from triarch.scheduling import GPU_RESOURCE

POD_KINDS = ("apps/v1:Deployment", "apps/v1:StatefulSet", "ray.io/v1:RayService", "ray.io/v1:RayCluster",
             LWS_KIND)


@dataclass(frozen=True)
class Workload:
    where: str
    resource_type: str
    resource_name: str
    urn: str
    spec: Mapping[str, Any]
    requests: Amounts
    replicas: int
    surge: int = 0
    upgrade: int = 0
    """Pods a RayService upgrade starts beside these (its new cluster at its smallest)."""
    daemon: bool = False

    @property
    def peak(self) -> int:
        return self.replicas + self.surge + self.upgrade


def requests_of(containers: Iterable[Mapping[str, Any]]) -> Amounts:
    """A pod's requests: its containers' requests (a limit stands in for a missing request, as Kubernetes
    defaults it)."""
    total = Amounts()
    for container in containers:
        resources = container.get("resources") or {}
        amounts = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        total += Amounts(cpu_millicores(amounts["cpu"]) if "cpu" in amounts else 0,
                         memory_mib(amounts["memory"]) if "memory" in amounts else 0,
                         int(amounts.get(GPU_RESOURCE, 0) or 0))
    return total


# --- workloads ------------------------------------------------------------------------------------------------

CHART_WORKLOADS = ("nvidia-device-plugin", "karpenter", "kuberay-operator")
PICKER_CHART = "llm-d-router-standalone"
"""The endpoint picker's chart (planners/picker.py), one release per routed model, each named for its model."""


def workloads_of(resources: list[Any]) -> list[Workload]:
    found: list[Workload] = []
    for r in resources:
        kind = kind_of(r.type)
        if kind in POD_KINDS:
            found += _pod_workloads(r, kind)
        elif r.type == "kubernetes:helm.sh/v3:Release" and (
                r.props.get("name") in CHART_WORKLOADS or _is_picker(r)):
            found += _chart_workloads(r)
    return found


def _pod_workloads(r: Any, kind: str) -> list[Workload]:
    spec = r.props.get("spec") or {}
    found = []
    if kind.endswith(("Deployment", "StatefulSet")):
        [template] = list(pod_templates(r.type, r.props, r.name))
        strategy = (spec.get("strategy") or {}).get("rollingUpdate") or {}
        surge = _surge(strategy.get("maxSurge", "25%"), template.replicas) if kind.endswith("Deployment") else 0
        found.append(Workload(template.where, r.type, r.name, r.urn, template.spec,
                              requests_of(template.spec.get("containers") or []), template.replicas, surge))
        return found
    if kind == LWS_KIND:
        # A rolling update adds whole groups (maxSurge of them): a leader and its workers each.
        rolling = (spec.get("rolloutStrategy") or {}).get("rollingUpdateConfiguration") or {}
        sets = as_int(spec.get("replicas")) or 1
        extra = _surge(rolling.get("maxSurge", 0), sets)
        for template in pod_templates(r.type, r.props, r.name):
            per_group = template.replicas // sets
            found.append(Workload(template.where, r.type, r.name, r.urn, template.spec,
                                  requests_of(template.spec.get("containers") or []), template.replicas,
                                  extra * per_group))
        return found
    cluster = spec.get("rayClusterConfig") if kind.endswith("RayService") else spec
    strategy = ((spec.get("upgradeStrategy") or {}).get("type") or "NewCluster") if kind.endswith("RayService") else ""
    groups = {str(g.get("groupName")): g for g in (cluster or {}).get("workerGroupSpecs") or []}
    for template in pod_templates(r.type, r.props, r.name):
        group = groups.get(template.where.rsplit(" ", 1)[-1]) if not template.ray_head else None
        low = as_int((group or {}).get("minReplicas")) or 0 if group else 1
        upgrade = (low if strategy == "NewCluster" else 0)
        found.append(Workload(template.where, r.type, r.name, r.urn, template.spec,
                              requests_of(template.spec.get("containers") or []), template.replicas, 0, upgrade))
    return found


def _surge(value: Any, replicas: int) -> int:
    text = str(value)
    if text.endswith("%"):
        return math.ceil(replicas * float(text[:-1]) / 100)
    return as_int(text) or 0


def _is_picker(r: Any) -> bool:
    return str(r.props.get("chart") or "").rsplit("/", 1)[-1] == PICKER_CHART


def _chart_workloads(r: Any) -> list[Workload]:
    """The pods a Helm release runs, placed as the chart places them with these values."""
    values = r.props.get("values") or {}
    name = str(r.props.get("name"))
    label = f"Helm release {name}"
    if _is_picker(r):
        # The pickers (router.epp.replicas, 1 by default; the Deployment is Recreate, so no surge), placed by
        # router.epp.affinity and tolerations, with the proxy as a sidecar (router.proxy.mode sidecar, the chart's
        # default) or, in service mode, the proxies in a Deployment of their own (router.proxy.replicas, 2 by
        # default), which takes no placement values: any node without a taint, with the Deployment's default
        # surge of 25%, rounded up (routerlib _deployment.yaml and _proxy-deployment.yaml, v0.10.0).
        router = values.get("router") or {}
        epp, proxy = router.get("epp") or {}, router.get("proxy") or {}
        spec = {"affinity": epp.get("affinity") or {}, "tolerations": epp.get("tolerations") or []}
        pickers = as_int(epp.get("replicas")) or 1
        if proxy.get("mode") != "service":
            requests = requests_of([{"resources": epp.get("resources") or {}},
                                    {"resources": proxy.get("resources") or {}}])
            return [Workload(f"{label} (endpoint picker and proxy)", r.type, r.name, r.urn, spec, requests, pickers)]
        proxies = as_int(proxy.get("replicas")) or 2
        return [Workload(f"{label} (endpoint picker)", r.type, r.name, r.urn, spec,
                         requests_of([{"resources": epp.get("resources") or {}}]), pickers),
                Workload(f"{label} (proxy)", r.type, r.name, r.urn, {},
                         requests_of([{"resources": proxy.get("resources") or {}}]), proxies, _surge("25%", proxies))]
    if name == "nvidia-device-plugin":
        spec = {"affinity": values.get("affinity") or {}, "tolerations": values.get("tolerations") or []}
        requests = requests_of([{"resources": values.get("resources") or {}}])
        pods = [Workload(f"{label} DaemonSet (device plugin)", r.type, r.name, r.urn, spec, requests, 1, daemon=True)]
        if (values.get("gfd") or {}).get("enabled"):
            pods.append(replace(pods[0], where=f"{label} DaemonSet (GPU feature discovery)"))
            worker = (values.get("nfd") or {}).get("worker") or {}
            nfd = overhead()["nfdWorker"]
            pods.append(Workload(f"{label} DaemonSet (node-feature-discovery worker)", r.type, r.name, r.urn,
                                 {"tolerations": worker.get("tolerations") or []},
                                 Amounts(cpu_millicores(nfd["cpu"]), memory_mib(nfd["memory"])), 1, daemon=True))
        return pods
    if name == "karpenter":
        # The chart's own placement (values.yaml 1.14.1): Linux nodes Karpenter did not make, one replica per host,
        # plus the values' node selector.
        affinity = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "karpenter.sh/nodepool", "operator": "DoesNotExist"}]}]}},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname"}]},
        }
        spec = {"nodeSelector": {"kubernetes.io/os": "linux", **(values.get("nodeSelector") or {})},
                "affinity": affinity, "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}]}
        requests = requests_of([{"resources": (values.get("controller") or {}).get("resources") or {}}])
        return [Workload(f"{label} (controller)", r.type, r.name, r.urn, spec, requests,
                         as_int(values.get("replicas")) or 2)]
    spec = {"nodeSelector": values.get("nodeSelector") or {}, "tolerations": values.get("tolerations") or []}
    requests = requests_of([{"resources": values.get("resources") or {}}])
    return [Workload(f"{label} (operator)", r.type, r.name, r.urn, spec, requests, 1)]
