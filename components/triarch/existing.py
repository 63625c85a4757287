"""What a cluster must already have for the components a stack says it runs (`existing`): the CRDs of Triarch's
objects whose operator Triarch does not install. Offline they are trusted (and the plan says so); under the real
engine the program lists the cluster's CRDs before registering anything and stops with one line if one is missing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterable
from typing import Any

from triarch.config import StackConfig
from triarch.errors import ConfigError
from triarch.planners.objects import KubernetesPlan

PLURALS = {"RayService": "rayservices", "RayCluster": "rayclusters", "PodMonitor": "podmonitors",
           "ServiceMonitor": "servicemonitors", "PrometheusRule": "prometheusrules", "ScaledObject": "scaledobjects",
           "NodePool": "nodepools", "EC2NodeClass": "ec2nodeclasses", "LeaderWorkerSet": "leaderworkersets"}
"""The resource name of each custom kind Triarch writes (a CRD is named <plural>.<group>)."""


def _providers(stack: StackConfig) -> dict[str, tuple[str, str]]:
    """API group -> (the stack key that says who provides it, its value), for the groups whose operator the
    cluster runs already."""
    given: dict[str, tuple[str, str]] = {}
    if stack.kuberay.mode == "existing":
        given["ray.io"] = ("triarch:kuberay.mode", "existing")
    if stack.leader_worker_set.mode == "existing":
        given["leaderworkerset.x-k8s.io"] = ("triarch:leaderWorkerSet.mode", "existing")
    if stack.prometheus == "existing":
        given["monitoring.coreos.com"] = ("triarch:observability.prometheus", "existing")
    if stack.observability.keda == "existing":
        given["keda.sh"] = ("triarch:observability.keda", "existing")
    return given


def planned_objects(objects: KubernetesPlan) -> Iterable[dict[str, Any]]:
    yield from objects.device_plugin
    yield from objects.kuberay
    yield from objects.lws
    yield from objects.serving
    for manifests in objects.vllm.values():
        yield from manifests
    yield from objects.ray
    for manifests in objects.node_pools.values():
        yield from manifests
    yield from objects.observability


def required_crds(stack: StackConfig, objects: KubernetesPlan) -> dict[str, str]:
    """CRD name -> the stack key that declares its operator present, for every custom kind Triarch will create
    whose operator Triarch does not install; sorted by name."""
    providers = _providers(stack)
    needed: dict[str, str] = {}
    for obj in planned_objects(objects):
        group = obj["apiVersion"].rpartition("/")[0]
        if group in providers:
            key, value = providers[group]
            needed[f"{PLURALS[obj['kind']]}.{group}"] = f"{key}: {value}"
    return dict(sorted(needed.items()))


def trusted_note(stack: StackConfig, objects: KubernetesPlan) -> str | None:
    """What an offline plan takes on trust, for its summary."""
    needed = required_crds(stack, objects)
    if not needed:
        return None
    listed = ", ".join(f"{name} ({key})" for name, key in needed.items())
    return (f"Trusted offline, checked by `pulumi preview` against the cluster: the CRDs {listed} of components "
            "the cluster already runs")


Kubectl = Callable[[list[str]], subprocess.CompletedProcess[str]]


def _kubectl(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", *args], capture_output=True, text=True, timeout=60, check=False)


def check_cluster(stack: StackConfig, objects: KubernetesPlan, kubectl: Kubectl = _kubectl) -> None:
    """Stop with one line if the adopted cluster lacks a CRD that an `existing` component should have brought."""
    needed = required_crds(stack, objects)
    if not needed:
        return
    cluster = stack.cluster
    context_key = "triarch:cluster.context"
    if kubectl is _kubectl and shutil.which("kubectl") is None:
        raise ConfigError(context_key, cluster.context,
                          f"cannot be checked for the CRDs of components marked existing ({', '.join(needed)}): "
                          "kubectl is not on the PATH", "install kubectl where `pulumi preview` and `up` run")
    done = kubectl(["--kubeconfig", cluster.kubeconfig_path, "--context", cluster.context or "", "get",
                    "customresourcedefinitions", "-o", "json"])
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise ConfigError(context_key, cluster.context,
                          f"could not be asked for its CRDs ({said[-1] if said else f'exit {done.returncode}'})",
                          "a reachable cluster: the CRDs of components marked existing are checked before "
                          "anything is created")
    present = {item["metadata"]["name"] for item in json.loads(done.stdout).get("items", [])}
    for name, key in needed.items():
        if name not in present:
            setting, value = key.split(": ")
            raise ConfigError(setting, value,
                              f"says the cluster runs the component, but context {cluster.context!r} has no CRD "
                              f"{name}", "the component installed there first (its chart brings the CRD), or "
                              f"{setting.partition(':')[2]}: install")
