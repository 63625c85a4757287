"""Ray as KubeRay builds it: the real KubeRay operator (built from its Go module; 1.6.2 stands in for the pinned 1.7.0,
whose source the module proxy refuses) reconciles the RayService of a stack's ray-serve model into a RayCluster and
its head and worker pods, and the assertions read those pods, not Triarch's manifests.

The pods are kwok's, so no Ray runs in them: a stand-in (tests/ray_standin.py) answers what KubeRay asks of a Ray
cluster on the pods' addresses (the dashboard's Serve API, the Serve proxy's health), so the RayService can go Ready
and an upgrade can run. The scenario is a Pulumi stack of its own (`lab-ray`, namespace llm-ray) on the lab's plane,
with an autoscaled model (so the head runs Ray's autoscaler) on the L4 pool."""

from __future__ import annotations

import contextlib
import copy
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT, write_stack_file
from engine_tier import Lab, eventually, scratch_project
from triarch.catalog import catalog
from triarch.config import from_pulumi_config
from triarch.local import engines
from triarch.offline import read_stack_config
from triarch.planners.models import plan_models
from triarch.planners.objects import plan_kubernetes
from triarch.planners.observability import gpu_pods
from triarch.scheduling import POOL_LABEL

HOSTNAME_LABEL = "kubernetes.io/hostname"

STACK = "lab-ray"
NAMESPACE = "llm-ray"
TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount"
TIMEOUT = 120


def ray_config(lab: Lab) -> dict[str, Any]:
    config = copy.deepcopy(lab.config)
    config["triarch:nodeGroups"] = [g for g in config["triarch:nodeGroups"] if g["name"] == "l4"]
    config["triarch:serving"] = {**config["triarch:serving"], "namespace": NAMESPACE}
    config["triarch:observability"] = {"prometheus": "none"}
    config["triarch:models"] = [{"name": "chat", "model": "Qwen/Qwen3-8B", "engine": "ray-serve", "nodeGroup": "l4",
                                 "maxModelLen": 8192, "autoscaling": {"min": 1, "max": 2}}]
    return config


@dataclass
class RayStack:
    lab: Lab
    project: Path
    config: dict[str, Any]
    requests: Path
    """What KubeRay asked the stand-in Ray clusters."""

    def pulumi(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [str(engines.binary("pulumi")), *args, "--stack", STACK, "--non-interactive"]
        done = subprocess.run(self.lab.plane.command(argv), env=self.lab.plane.env(), cwd=self.project,
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, f"pulumi {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}"
        return done

    def up(self, config: dict[str, Any]) -> None:
        path = self.project / f"Pulumi.{STACK}.yaml"
        current = yaml.safe_load(path.read_text()) or {}
        current["config"] = config
        path.write_text(yaml.safe_dump(current, sort_keys=False))
        self.pulumi("up", "--yes", "--skip-preview")

    def items(self, kind: str, *selector: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.lab.kubectl_json("get", kind, "-n", NAMESPACE, *selector)["items"]
        return found

    def condition(self, kind: str) -> str | None:
        [service] = self.items("rayservices")
        return next((c["status"] for c in service.get("status", {}).get("conditions", []) if c["type"] == kind),
                    None)

    def wait(self, what: str, check: Callable[[], bool], timeout: float = TIMEOUT) -> None:
        if eventually(check, timeout):
            return
        log = (self.lab.plane.directory / "logs" / "kuberay-operator.log").read_text()[-1500:]
        raise AssertionError(f"{what} did not happen within {timeout:.0f}s\n{self.unplaced()}\n{log}")

    def unplaced(self) -> str:
        """Each pod of the namespace not Running, with the scheduler's reason: what a timeout most often comes
        down to (a pool without room)."""
        lines = [_phase(pod) for pod in self.items("pods") if pod["status"].get("phase") != "Running"]
        return "pods not Running:\n" + "\n".join(lines) if lines else "every pod Running"

    def planned(self, config: dict[str, Any]) -> dict[str, Any]:
        """The RayService Triarch plans for `config`."""
        path = write_stack_file(self.project / "planned.yaml", config)
        stack = from_pulumi_config(read_stack_config(path)[0])
        [service] = [o for o in plan_kubernetes(stack, plan_models(stack, catalog()), catalog()).ray
                     if o["kind"] == "RayService"]
        return service


@pytest.fixture(scope="session")
def ray_stack(deployed: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayStack]:
    """The lab-ray stack up, its RayService Ready on the stand-in."""
    work = tmp_path_factory.mktemp("ray")
    requests = work / "requests.log"
    requests.touch()
    standin = subprocess.Popen(deployed.plane.command([sys.executable, str(ROOT / "tests" / "ray_standin.py"),
                                                       str(requests)]), start_new_session=True)
    project = scratch_project(work / "project")
    config = ray_config(deployed)
    (project / f"Pulumi.{STACK}.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    stack = RayStack(deployed, project, config, requests)
    try:
        stack.pulumi("stack", "init", "--secrets-provider", "passphrase")
        stack.pulumi("up", "--yes", "--skip-preview")
        stack.wait("the RayService Ready", lambda: stack.condition("Ready") == "True")
        yield stack
    finally:
        standin.kill()


def _pods(stack: RayStack, kind: str, cluster: str | None = None) -> list[dict[str, Any]]:
    selector = ["-l", f"ray.io/node-type={kind}" + (f",ray.io/cluster={cluster}" if cluster else "")]
    return stack.items("pods", *selector)


def test_kuberay_builds_a_raycluster_from_the_rayservice_and_deploys_its_serve_config(ray_stack: RayStack) -> None:
    [cluster] = ray_stack.items("rayclusters")
    owners = cluster["metadata"]["ownerReferences"]
    assert [(o["kind"], o["name"]) for o in owners] == [("RayService", "llm")]
    assert cluster["metadata"]["name"].startswith("llm-")
    [head] = _pods(ray_stack, "head")
    asked = ray_stack.requests.read_text()
    assert f"PUT {head['status']['podIP']}:8265 /api/serve/applications/" in asked  # the plan's serveConfigV2


def test_only_the_autoscaler_container_holds_the_service_account_token(ray_stack: RayStack) -> None:
    [head] = _pods(ray_stack, "head")
    containers = {c["name"]: c for c in head["spec"]["containers"]}
    assert set(containers) == {"ray-head", "autoscaler"}
    with_token = [name for name, c in containers.items()
                  if any(m["mountPath"] == TOKEN for m in c.get("volumeMounts", []))]
    assert with_token == ["autoscaler"]
    assert head["spec"]["automountServiceAccountToken"] is False
    assert head["spec"]["serviceAccountName"] == "ray-autoscaler"


def test_each_worker_advertises_its_accelerator_type_and_lands_on_its_pool(ray_stack: RayStack) -> None:
    workers = _pods(ray_stack, "worker")
    assert workers
    nodes = {n["metadata"]["name"]: n for n in ray_stack.lab.kubectl_json("get", "nodes")["items"]}
    planned = ray_stack.planned(ray_stack.config)["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    [group] = planned
    planned_pod = group["template"]["spec"]
    for pod in workers:
        [container] = [c for c in pod["spec"]["containers"] if c["name"] == "ray-worker"]
        started = " ".join(container.get("command", []) + container.get("args", []))
        assert "ray start" in started and "accelerator_type:L4" in started  # KubeRay's own ray start line
        node = nodes[pod["spec"]["nodeName"]]
        assert node["metadata"]["labels"][POOL_LABEL] == "l4"
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
        assert pod["spec"]["terminationGracePeriodSeconds"] == planned_pod["terminationGracePeriodSeconds"]
        [planned_container] = planned_pod["containers"]
        assert container["lifecycle"]["preStop"] == planned_container["lifecycle"]["preStop"]


def test_the_gpu_alerts_select_the_worker_pods_kuberay_names(ray_stack: RayStack) -> None:
    """The DCGM selector of a Ray model's GPUs (its alerts and tests/test_alert_rules.py's scenarios) matches the
    worker pods KubeRay names, and not its head."""
    path = write_stack_file(ray_stack.project / "selector.yaml", ray_stack.config)
    stack = from_pulumi_config(read_stack_config(path)[0])
    [model] = plan_models(stack, catalog())
    selector = gpu_pods(model, NAMESPACE)
    pattern = re.search(r'exported_pod=~"([^"]+)"', selector)
    assert pattern is not None and f'exported_namespace="{NAMESPACE}"' in selector
    workers = _pods(ray_stack, "worker")
    assert workers and all(re.fullmatch(pattern.group(1), p["metadata"]["name"]) for p in workers), [
        p["metadata"]["name"] for p in workers]
    assert not any(re.fullmatch(pattern.group(1), p["metadata"]["name"]) for p in _pods(ray_stack, "head"))


def _phase(pod: dict[str, Any]) -> str:
    """A pod's phase, and the scheduler's reason where it is not placed."""
    why = next((c.get("message", "") for c in pod["status"].get("conditions", [])
                if c["type"] == "PodScheduled" and c["status"] != "True"), "")
    return f"{pod['metadata']['name']} {pod['status'].get('phase')} {why}".rstrip()


@contextlib.contextmanager
def only_room_beside(stack: RayStack, pod: dict[str, Any]) -> Iterator[str]:
    """The pool's only free GPU on a node in `pod`'s zone: a kwok node like `pod`'s own added, every other free node
    of the pool cordoned; undone afterwards (the lab plane is shared). Yields the added node's name."""
    node = stack.lab.kubectl_json("get", "node", pod["spec"]["nodeName"])
    name = f"{node['metadata']['name']}-beside"
    labels = {**node["metadata"]["labels"], HOSTNAME_LABEL: name}
    added = {"apiVersion": "v1", "kind": "Node",
             "metadata": {"name": name, "labels": labels, "annotations": node["metadata"].get("annotations", {})},
             "spec": {"taints": node["spec"].get("taints", [])},
             # Created with its status, as the plane makes its nodes: kwok keeps the capacity and reports Ready.
             "status": {k: node["status"][k] for k in ("capacity", "allocatable", "nodeInfo")}}
    others = [node for node, free in stack.lab.free_gpus(labels[POOL_LABEL]).items() if free > 0]
    plane = stack.lab.plane
    try:
        for other in others:
            plane.kubectl("cordon", other)
        plane.kubectl("create", "-f", "-", input=yaml.safe_dump(added))
        stack.wait(f"the added node {name} with a free GPU",
                   lambda: [n for n, free in stack.lab.free_gpus(labels[POOL_LABEL]).items() if free > 0] == [name])
        yield name
    finally:
        for other in others:
            plane.kubectl("uncordon", other, check=False)
        plane.kubectl("delete", "node", name, "--wait=false", check=False)


def test_a_cluster_changing_upgrade_runs_the_new_cluster_beside_the_old_one(ray_stack: RayStack) -> None:
    """NewCluster: a change of the Ray cluster's spec (here the Ray LLM image) brings a new cluster up beside the
    active one, and the pool holds both at once, as the plan's capacity check claims for this stack; once the new
    cluster serves, it becomes the active one.

    Made to happen in the one placement where a spread counting both clusters' workers refuses the new one: the
    pool's only free GPU in the zone of the old worker (in a shared pool, the way a fixed pool often ends up). The
    new worker would wait there for the old cluster to go, which waits for the new one to serve."""
    [before] = ray_stack.items("rayclusters")
    [old_worker] = _pods(ray_stack, "worker")
    edited = copy.deepcopy(ray_stack.config)
    edited["triarch:images"] = {"rayLlm": "rayproject/ray-llm:2.58.0-py312-cu130"}
    ray_stack.planned(edited)  # the plan accepts the upgrade on this pool (it refuses one that cannot fit)
    with only_room_beside(ray_stack, old_worker) as beside:
        ray_stack.up(edited)
        ray_stack.wait("a second RayCluster", lambda: len(ray_stack.items("rayclusters")) == 2)
        [after] = [c for c in ray_stack.items("rayclusters") if c["metadata"]["name"] != before["metadata"]["name"]]
        new_name, old_name = after["metadata"]["name"], before["metadata"]["name"]
        seen: list[str] = []

        def both_running() -> bool:
            found = {(kind, name): _pods(ray_stack, kind, name) for kind in ("head", "worker")
                     for name in (new_name, old_name)}
            seen[:] = [f"{kind} of {name}: {[_phase(p) for p in pods] or 'none'}"
                       for (kind, name), pods in found.items()]
            return all(pods and all(p["status"].get("phase") == "Running" for p in pods) for pods in found.values())

        # Generous: on a busy two-core machine KubeRay and kwok take their time; the old cluster stays at least a
        # minute after the switch (KubeRay's deletion delay), so the moment both run is not missed.
        try:
            ray_stack.wait("the new cluster's head and worker Running beside the old one's", both_running,
                           timeout=2 * TIMEOUT)
        except AssertionError as error:
            raise AssertionError("last seen while waiting:\n" + "\n".join(seen) + f"\n{error}") from None
        pending = [p["metadata"]["name"] for p in ray_stack.items("pods") if p["status"].get("phase") == "Pending"]
        assert pending == []  # both clusters' workers placed: the pool holds the upgrade
        [new_worker] = _pods(ray_stack, "worker", new_name)
        assert new_worker["spec"]["nodeName"] == beside  # in the old worker's zone
        images = {c["image"] for c in new_worker["spec"]["containers"]}
        assert images == {"rayproject/ray-llm:2.58.0-py312-cu130"}
        ray_stack.wait("the new cluster active", lambda: ray_stack.items("rayservices")[0]["status"].get(
            "activeServiceStatus", {}).get("rayClusterName") == new_name)


RAY_SERVICE_FINALIZER = "ray.io/rayservice-finalizer"
"""KubeRay 1.7.0's finalizer on a RayService (ray-project/kuberay#4807), in the 1.6.2 built here too (#4909)."""


def test_a_deleted_ray_service_goes_once_kuberay_has_removed_its_clusters(ray_stack: RayStack) -> None:
    """The RayService carries KubeRay's finalizer, so its deletion waits on the operator: it goes once the operator
    has deleted its RayClusters and removed the finalizer (with no operator it would stay, being deleted, which is
    why Triarch's RayService depends on the KubeRay release). Last in the module: it deletes the service."""
    [service] = ray_stack.items("rayservices")
    assert RAY_SERVICE_FINALIZER in (service["metadata"].get("finalizers") or []), service["metadata"]
    assert ray_stack.items("rayclusters")
    ray_stack.lab.plane.kubectl("delete", "rayservice", service["metadata"]["name"], "-n", NAMESPACE, "--wait=false")
    ray_stack.wait("the RayService and its RayClusters gone",
                   lambda: not ray_stack.items("rayservices") and not ray_stack.items("rayclusters"))
