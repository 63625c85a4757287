"""A vllm replica across nodes as the real LeaderWorkerSet controller builds it: the LWS manager (built from its Go
module; 0.9.0 stands in for the pinned 0.10.0, whose source the module proxy refuses) with its webhooks, served
on the plane's address, and the real scheduler placing the pods. The assertions read the pods, the Service's
endpoints and the nodes, not Triarch's manifests.

The scenario is a Pulumi stack of its own (`lab-gangs`, namespace llm-gangs) on the lab's plane: Qwen3-8B in two
pipeline stages on the A10G pool (one GPU per node, so a replica spans two nodes), two replicas, the controller
`existing` (the plane runs it). The pool's six nodes sit in two zones. This module runs before the KEDA one, which
needs the pool's nodes back: it leaves nothing behind."""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine_tier import Lab, eventually, scratch_project
from triarch.local import engines
from triarch.local.crds import crd_files
from triarch.local.lifecycle import install_crds, start_operator, stop_operator
from triarch.scheduling import POOL_LABEL

STACK = "lab-gangs"
NAMESPACE = "llm-gangs"
HOLD = "triarch.test/hold"
"""A finalizer the scenario puts on a pod to keep it in its deletion while a controller reacts."""
TIMEOUT = 120
NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
GROUP_LABEL = "leaderworkerset.sigs.k8s.io/group-key"
ZONE = "topology.kubernetes.io/zone"


def gangs_config(lab: Lab) -> dict[str, Any]:
    config = copy.deepcopy(lab.config)
    config["triarch:nodeGroups"] = [g for g in config["triarch:nodeGroups"] if g["name"] == "a10g"]
    config["triarch:serving"] = {**config["triarch:serving"], "namespace": NAMESPACE}
    config["triarch:observability"] = {"prometheus": "none"}
    config["triarch:leaderWorkerSet"] = {"mode": "existing"}
    config["triarch:models"] = [{"name": "chat", "model": "Qwen/Qwen3-8B", "engine": "vllm", "nodeGroup": "a10g",
                                 "tensorParallelSize": 1, "pipelineParallelSize": 2, "maxModelLen": 8192,
                                 "replicas": 2}]
    return config


@dataclass
class GangStack:
    lab: Lab
    project: Path

    def pulumi(self, *args: str) -> None:
        argv = [str(engines.binary("pulumi")), *args, "--stack", STACK, "--non-interactive"]
        done = subprocess.run(self.lab.plane.command(argv), env=self.lab.plane.env(), cwd=self.project,
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, f"pulumi {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}"

    def items(self, kind: str, *selector: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.lab.kubectl_json("get", kind, "-n", NAMESPACE, *selector)["items"]
        return found

    def pods(self) -> list[dict[str, Any]]:
        return self.items("pods", "-l", f"{NAME_LABEL}=chat")

    def wait(self, what: str, check: Callable[[], bool], timeout: float = TIMEOUT) -> None:
        if eventually(check, timeout):
            return
        states = [(p["metadata"]["name"], p["status"].get("phase"), p["spec"].get("nodeName")) for p in self.pods()]
        log = (self.lab.plane.directory / "logs" / "lws-manager.log").read_text()[-1500:]
        raise AssertionError(f"{what} did not happen within {timeout:.0f}s\npods: {states}\n{log}")


@pytest.fixture(scope="module")
def gangs(deployed: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GangStack]:
    """The LWS controller on the lab's plane and the lab-gangs stack up; afterwards neither, and no pod left."""
    plane = deployed.plane
    install_crds(plane, crd_files(["lws"], []))
    start_operator(plane, "lws")
    project = scratch_project(tmp_path_factory.mktemp("gangs") / "project")
    (project / f"Pulumi.{STACK}.yaml").write_text(yaml.safe_dump({"config": gangs_config(deployed)}, sort_keys=False))
    stack = GangStack(deployed, project)
    try:
        stack.pulumi("stack", "init", "--secrets-provider", "passphrase")
        stack.pulumi("up", "--yes", "--skip-preview")  # Pulumi waits for the Service's endpoints: the leaders
        # The manager's pod controller (what restarts a group) starts its workers once its cache has synced, which on
        # a loaded machine can come after the groups are up: the scenarios act on it only then.
        log = plane.directory / "logs" / "lws-manager.log"
        stack.wait("the LWS pod controller's workers started", lambda: any(
            "Starting workers" in line and '"controller": "pod"' in line
            for line in log.read_text().splitlines()), 240)
        yield stack
    finally:
        plane.kubectl("delete", "--ignore-not-found", "--wait=true", "leaderworkersets", "--all", "-n", NAMESPACE,
                      check=False)
        # kwok honours each pod's 90-second grace period; the KEDA module needs these nodes now
        plane.kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--grace-period=0", "--force", check=False)
        stop_operator(plane, "lws")
        plane.kubectl("delete", "--ignore-not-found", "--wait=false", "namespace", NAMESPACE, check=False)


def test_each_group_is_a_leader_and_a_worker_that_finds_it(gangs: GangStack) -> None:
    gangs.wait("two groups of two Running pods", lambda: len(gangs.pods()) == 4 and all(
        p["status"].get("phase") == "Running" for p in gangs.pods()))
    groups: dict[str, list[dict[str, Any]]] = {}
    for pod in gangs.pods():
        groups.setdefault(pod["metadata"]["labels"][GROUP_LABEL], []).append(pod)
    assert sorted(len(g) for g in groups.values()) == [2, 2]
    for members in groups.values():
        [leader] = [p for p in members if p["metadata"]["labels"][INDEX_LABEL] == "0"]
        [worker] = [p for p in members if p["metadata"]["labels"][INDEX_LABEL] == "1"]
        [container] = worker["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        # the webhook's environment, which the worker's args name: $(LWS_LEADER_ADDRESS), $(LWS_WORKER_INDEX)
        # the group's own headless Service, named after its leader (UniquePerReplica), not the model's Service
        leader_name = leader["metadata"]["name"]
        assert env["LWS_LEADER_ADDRESS"] == f"{leader_name}.{leader_name}.{NAMESPACE}"
        assert worker["spec"]["subdomain"] == leader_name
        assert gangs.lab.kubectl_json("get", "service", leader_name, "-n", NAMESPACE)["spec"]["clusterIP"] == "None"
        assert env["LWS_WORKER_INDEX"] == "1" and env["LWS_GROUP_SIZE"] == "2"
        assert "$(LWS_LEADER_ADDRESS)" in container["args"] and "--headless" in container["args"]
        assert worker["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_a_groups_pods_share_a_zone_and_the_groups_do_not(gangs: GangStack) -> None:
    """The scheduler's own reading of Triarch's podAffinity (matchLabelKeys on the group key) and the leaders' zone
    spread: each group in one zone, the two groups in two, every pod on its own A10G node."""
    gangs.wait("four pods placed", lambda: sum(bool(p["spec"].get("nodeName")) for p in gangs.pods()) == 4)
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in gangs.lab.kubectl_json("get", "nodes")["items"]}
    zones: dict[str, set[str]] = {}
    placed = [p["spec"]["nodeName"] for p in gangs.pods()]
    for pod in gangs.pods():
        labels = nodes[pod["spec"]["nodeName"]]
        assert labels[POOL_LABEL] == "a10g"
        zones.setdefault(pod["metadata"]["labels"][GROUP_LABEL], set()).add(labels[ZONE])
    assert all(len(z) == 1 for z in zones.values()), zones
    assert len(set().union(*zones.values())) == 2
    assert len(set(placed)) == 4
    # The API server merged the group key into each pod's affinity selector at creation (MatchLabelKeysInPodAffinity,
    # GA in 1.33): Karpenter 1.14, which reads matchLabelKeys only in spread constraints, sees one group's term.
    for pod in gangs.pods():
        [term] = pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert {"key": GROUP_LABEL, "operator": "In",
                "values": [pod["metadata"]["labels"][GROUP_LABEL]]} in term["labelSelector"]["matchExpressions"]


def test_the_service_sends_to_the_leaders_only(gangs: GangStack) -> None:
    leaders = {p["status"]["podIP"] for p in gangs.pods() if p["metadata"]["labels"][INDEX_LABEL] == "0"}
    slices = gangs.items("endpointslices", "-l", "kubernetes.io/service-name=chat")
    addresses = {a for s in slices for e in s.get("endpoints") or [] for a in e["addresses"]}
    assert addresses == leaders and len(leaders) == 2


def test_a_lost_worker_restarts_its_whole_group(gangs: GangStack) -> None:
    """RecreateGroupOnPodRestart: one stage gone stops the replica, so the controller deletes its leader too, and
    the group comes back whole: a new leader and a new worker, both Running (under the other policy, `None`, the
    leader would stay and only the worker would come back).

    The LWS controller acts on a pod that is being deleted (it has a deletionTimestamp), not on one already gone.
    kwok removes a deleted pod at once, so the controller's cache may never hold it in between (a force delete lost
    that race in CI). A finalizer holds the worker in its deletion, as a kubelet's grace period would, until the
    leader is being deleted; both are then ended at once (kwok would end each at a random moment within its grace
    period, holding its GPU until then)."""
    [worker] = [p for p in gangs.pods() if p["metadata"]["labels"][INDEX_LABEL] == "1"][:1]
    name = worker["metadata"]["name"]
    group = worker["metadata"]["labels"][GROUP_LABEL]
    [leader] = [p for p in gangs.pods() if p["metadata"]["labels"][GROUP_LABEL] == group
                and p["metadata"]["labels"][INDEX_LABEL] == "0"]
    kubectl = gangs.lab.plane.kubectl
    kubectl("patch", "pod", "-n", NAMESPACE, name, "--type=merge", "-p",
            json.dumps({"metadata": {"finalizers": [HOLD]}}))
    try:
        kubectl("delete", "pod", "-n", NAMESPACE, name, "--wait=false")

        def leader_restarted() -> bool:
            now = {p["metadata"]["uid"]: p for p in gangs.pods()}
            mine = now.get(leader["metadata"]["uid"])
            return mine is None or bool(mine["metadata"].get("deletionTimestamp"))

        gangs.wait("the group's leader deleted with its worker", leader_restarted)
    finally:
        kubectl("patch", "pod", "-n", NAMESPACE, name, "--type=merge", "-p",
                json.dumps({"metadata": {"finalizers": None}}), check=False)
    for pod in (name, leader["metadata"]["name"]):  # both GPUs back at once, for the group's new pods
        kubectl("delete", "pod", "-n", NAMESPACE, pod, "--grace-period=0", "--force", "--ignore-not-found",
                check=False)
    old = {leader["metadata"]["uid"], worker["metadata"]["uid"]}

    def whole_again() -> bool:
        members = [p for p in gangs.pods() if p["metadata"]["labels"].get(GROUP_LABEL) == group
                   or p["metadata"]["name"] in (name, leader["metadata"]["name"])]
        indexes = sorted(p["metadata"]["labels"][INDEX_LABEL] for p in members)
        return (indexes == ["0", "1"] and not {p["metadata"]["uid"] for p in members} & old
                and all(p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
                        for p in members))

    gangs.wait("the group back whole: a new leader and a new worker, Running", whole_again)
