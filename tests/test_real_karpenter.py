"""Scale from zero with real Karpenter (its kwok provider, built from the core module Karpenter 1.14.1 for AWS pins):
the prod stack's NodePools, their nodeClassRef pointed at a KWOKNodeClass, start with no GPU node; the plan's pods go
Pending; Karpenter launches nodes of the pool's instance type in the zones the hard spread needs; the pods bind; the
NodePool's limit holds; and empty nodes are consolidated as its disruption policy says. Triarch's own claims for
the same stack (the placement proof's pool per pod, the nodes a pool needs, the refusal of what does not fit) are held
against what Karpenter did.

`triarch local up --from-zero` installs the NodePools; the test applies the rest of the plan's manifests (prod's AWS
half stays under mocks): everything but the Helm releases, the EFS storage class (the plane's kwok volumes stand in)
and the kinds whose operators do not run here (the RayService, the Prometheus Operator's monitors)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import stack_document, stack_path, write_stack_file
from engine_tier import eventually, require_engines
from triarch.catalog import catalog
from triarch.config import from_pulumi_config
from triarch.errors import ConfigError
from triarch.guardrails.check import resources_of_plan
from triarch.guardrails.placement import prove
from triarch.local.lifecycle import down, start_operator, stop_operator, up
from triarch.local.plane import Plane, PlaneSpec
from triarch.local.stack import on_kwok, spec_for_stack
from triarch.offline import read_stack_config
from triarch.planners.karpenter import RESERVED_NODES_ANNOTATION
from triarch.planners.models import plan_models
from triarch.planners.objects import plan_kubernetes
from triarch.report.planning import plan_stack
from triarch.report.validation import validate_stack_file
from triarch.scheduling import POOL_LABEL

STACK = "prod"
SKIPPED = {"StorageClass", "RayService", "PodMonitor", "ServiceMonitor", "PrometheusRule", "ScaledObject",
           "NodePool", "EC2NodeClass"}
"""Kinds not applied from the plan: the plane stands in for the storage class, installs the NodePools itself (on
kwok node classes), and runs no KubeRay or Prometheus Operator for this stack."""
LAUNCH_TIMEOUT = 180
ZONE = "topology.kubernetes.io/zone"


@dataclass
class FromZero:
    plane: Plane
    plan: dict[str, Any]
    manifests: list[dict[str, Any]]
    before: list[dict[str, Any]]
    """The nodes as the plane came up, before any workload was applied."""
    instance_types: list[dict[str, Any]]
    """What Karpenter's kwok provider was started with."""

    def get(self, *args: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = json.loads(self.plane.kubectl("get", *args, "-o", "json").stdout)["items"]
        return items

    def pool_nodes(self, pool: str) -> list[dict[str, Any]]:
        return self.get("nodes", "-l", f"{POOL_LABEL}={pool}")

    def pods(self, name: str) -> list[dict[str, Any]]:
        return self.get("pods", "-n", "llm", "-l", f"app.kubernetes.io/instance={name}")

    def empty_l4(self) -> None:
        """No embed replica, and the l4 pool consolidated down to no node (its consolidateAfter shortened to 5s)."""
        self.no_embed_pods()
        self.plane.kubectl("patch", "nodepool", "l4", "--type=merge",
                           "-p", json.dumps({"spec": {"disruption": {"consolidateAfter": "5s"}}}))
        # No node and no claim: a claim launched for a pod of the scenario before (its node not registered yet) would
        # bring a node after the pool looked empty, and the next scenario would take it for its own (seen in CI).
        self.wait("the l4 pool empty", lambda: not self.pool_nodes("l4") and not self.get(
            "nodeclaims", "-l", "karpenter.sh/nodepool=l4"), 240)

    def no_embed_pods(self) -> None:
        """embed scaled to zero and its pods gone at once. kwok would end each pod at a random moment within its
        grace period, as a drain might; the drain is not what these scenarios are about. The pods are deleted again
        each time until none is left: a pod deleted before the ReplicaSet took the new scale is replaced, and the
        replacement, deleted by the scale-down, would wait out the vLLM pod's grace period and be counted by the
        scenario after (seen under a loaded CI host, 2026-12-07)."""
        self.plane.kubectl("scale", "deployment", "embed", "-n", "llm", "--replicas=0")

        def gone() -> bool:
            if not self.pods("embed"):
                return True
            self.plane.kubectl("delete", "pods", "-n", "llm", "-l", "app.kubernetes.io/instance=embed", "--force",
                               "--grace-period=0", "--ignore-not-found")
            return False

        self.wait("the embed pods gone", gone, 60)

    def karpenter_refused(self, pod: dict[str, Any]) -> str | None:
        """Karpenter's own word that it cannot place the pod (its FailedScheduling event on it, not the
        scheduler's): the message, once there is one."""
        for event in self.get("events", "-n", "llm", "--field-selector",
                              f"involvedObject.uid={pod['metadata']['uid']},reason=FailedScheduling"):
            if "karpenter" in (event.get("reportingComponent"), (event.get("source") or {}).get("component")):
                return str(event["message"])
        return None

    def offer_only_in(self, instance_type: str, zone: str | None) -> None:
        """Karpenter restarted with the instance types it may launch, `instance_type` offered in `zone` only (None:
        as the plane started): a zone out of capacity as Karpenter sees one, no offering there."""
        offered = self.instance_types
        if zone is not None:
            offered = json.loads(json.dumps(offered))
            for each in offered:
                if each["name"] == instance_type:
                    each["offerings"] = [o for o in each["offerings"] if any(
                        r["key"] == ZONE and r["values"] == [zone] for r in o["Requirements"])]
        stop_operator(self.plane, "karpenter")
        start_operator(self.plane, "karpenter", PlaneSpec(self.plane.name, "", [], instance_types=offered))

    def wait(self, what: str, check: Callable[[], bool], timeout: float = LAUNCH_TIMEOUT) -> None:
        if eventually(check, timeout):
            return
        claims = self.plane.kubectl("get", "nodeclaims", "-o", "wide", check=False).stdout
        log = (self.plane.directory / "logs" / "karpenter.log").read_text()[-3000:]
        raise AssertionError(f"{what} did not happen within {timeout:.0f}s\n{claims}\n{log}")


def _serving(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods Running and not being deleted (a pod whose node Karpenter disrupts lingers Running while it ends,
    beside its replacement)."""
    return [p for p in pods if p.get("status", {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")]


def _pending(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods waiting for a node, not those being deleted."""
    return [p for p in pods if p.get("status", {}).get("phase") == "Pending"
            and not p["metadata"].get("deletionTimestamp")]


def _running(pods: list[dict[str, Any]]) -> int:
    return len(_serving(pods))


@pytest.fixture(scope="session")
def from_zero(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FromZero]:
    require_engines()
    patch = pytest.MonkeyPatch()
    patch.setenv("TRIARCH_LOCAL_HOME", str(tmp_path_factory.mktemp("from-zero")))
    name = f"k{os.getpid()}"
    validated = validate_stack_file(STACK, stack_path(STACK))
    out = tmp_path_factory.mktemp("prod-plan")
    plan_stack(validated, out)
    plan = json.loads((out / "plan.json").read_text())
    manifests = [yaml.safe_load(p.read_text()) for p in sorted((out / "manifests").glob("*.yaml"))]
    try:
        spec = spec_for_stack(name, validated.stack, [], from_zero=True)
        plane = up(spec, log=lambda _: None)
        before = json.loads(plane.kubectl("get", "nodes", "-o", "json").stdout)["items"]
        applied = [m for m in manifests if m["kind"] not in SKIPPED]
        namespaces = [m for m in applied if m["kind"] == "Namespace"]
        plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(namespaces))
        plane.kubectl("apply", "--server-side", "-f", "-",
                      input=yaml.safe_dump_all([m for m in applied if m["kind"] != "Namespace"]))
        yield FromZero(plane, plan, manifests, before, spec.instance_types)
    finally:
        down(name, quiet=True)
        patch.undo()


def test_the_gpu_pools_start_with_no_node(from_zero: FromZero) -> None:
    pools = {n["metadata"]["labels"].get(POOL_LABEL) for n in from_zero.before}
    assert pools == {"system"}
    assert all("nvidia.com/gpu" not in n["status"]["allocatable"] for n in from_zero.before)


def test_karpenter_launches_the_nodes_the_plan_says_in_the_zones_the_spread_needs(from_zero: FromZero) -> None:
    [deployment] = [m for m in from_zero.manifests if m["kind"] == "Deployment" and m["metadata"]["name"] == "embed"]
    replicas = deployment["spec"]["replicas"]
    from_zero.wait(f"{replicas} embed replicas Running", lambda: _running(from_zero.pods("embed")) == replicas)
    nodes = {n["metadata"]["name"]: n for n in from_zero.pool_nodes("l4")}
    pods = _serving(from_zero.pods("embed"))
    assert len(pods) == replicas, [(p["metadata"]["name"], p["spec"].get("nodeName")) for p in from_zero.pods("embed")]
    # The pool the placement proof puts the pods in is the pool Karpenter launched their nodes for, and the nodes
    # it says they need are the nodes Karpenter launched, within one.
    proof = prove(resources_of_plan(from_zero.plan))
    [placed] = [p for p in proof.placements if p.workload.where == "Deployment embed"]
    assert {nodes[p["spec"]["nodeName"]]["metadata"]["labels"][POOL_LABEL] for p in pods} == set(placed.pools)
    assert placed.nodes_needed is not None and abs(len(nodes) - placed.nodes_needed) <= 1
    stack = from_pulumi_config(read_stack_config(stack_path(STACK))[0])
    for node in nodes.values():
        labels = node["metadata"]["labels"]
        assert labels["node.kubernetes.io/instance-type"] == stack.node_group("l4").instance_type
        assert labels["karpenter.sh/nodepool"] == "l4" and labels["nvidia.com/gpu.present"] == "true"
        assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in node["spec"]["taints"]
    # minDomains: the replicas went to distinct zones although the pool started with none.
    zones = {nodes[p["spec"]["nodeName"]]["metadata"]["labels"]["topology.kubernetes.io/zone"] for p in pods}
    assert len(zones) == replicas
    assert from_zero.pool_nodes("a100") == []  # nothing asked for that pool


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp)


def test_empty_nodes_are_consolidated_as_the_disruption_policy_says(from_zero: FromZero) -> None:
    """Read from Karpenter's own records: the NodePool's disruption as the API server admitted it, each NodeClaim's
    last pod event once its pods left, no claim consolidatable within consolidateAfter, and, with consolidateAfter
    shortened, each claim made consolidatable no sooner than that after its last pod event, then removed."""
    [planned] = [m for m in from_zero.manifests if m["kind"] == "NodePool" and m["metadata"]["name"] == "l4"]
    [live] = [p for p in from_zero.get("nodepools") if p["metadata"]["name"] == "l4"]
    assert live["spec"]["disruption"]["consolidationPolicy"] == "WhenEmpty"
    assert live["spec"]["disruption"]["consolidateAfter"] == planned["spec"]["disruption"]["consolidateAfter"]
    claims = {c["metadata"]["name"] for c in from_zero.get("nodeclaims") if c["metadata"]["labels"].get(
        "karpenter.sh/nodepool") == "l4"}
    assert claims
    from_zero.no_embed_pods()

    def recorded() -> bool:  # the moment consolidateAfter counts from (a pod's bind or removal; Karpenter writes
        now = {c["metadata"]["name"]: c for c in from_zero.get("nodeclaims")}  # it at most every 10 s)
        return all(name in now and now[name]["status"].get("lastPodEventTime") for name in claims)

    from_zero.wait("Karpenter's record of each l4 claim's last pod event", recorded, 60)
    for claim in from_zero.get("nodeclaims"):
        if claim["metadata"]["name"] in claims:
            kinds = {c["type"] for c in claim["status"].get("conditions", [])}
            assert "Consolidatable" not in kinds, claim["metadata"]["name"]  # within consolidateAfter
    assert len(from_zero.pool_nodes("l4")) == len(claims)
    # The planned ten minutes are too long to wait for here: shorten them on the live NodePool, keeping the policy
    # and its budget of one node at a time.
    from_zero.plane.kubectl("patch", "nodepool", "l4", "--type=merge",
                            "-p", json.dumps({"spec": {"disruption": {"consolidateAfter": "5s"}}}))
    made: dict[str, float] = {}

    def consolidated() -> bool:
        for claim in from_zero.get("nodeclaims"):
            for condition in claim["status"].get("conditions", []):
                if condition["type"] == "Consolidatable" and condition["status"] == "True":
                    made[claim["metadata"]["name"]] = (_time(condition["lastTransitionTime"]) - _time(
                        claim["status"]["lastPodEventTime"])).total_seconds()
        return not from_zero.pool_nodes("l4")

    from_zero.wait("the empty nodes consolidated", consolidated, 240)
    assert made, "no claim was seen consolidatable before it went"
    assert all(seconds >= 5 for seconds in made.values()), made


def test_a_zone_without_capacity_leaves_a_replica_pending_not_doubled_up(from_zero: FromZero) -> None:
    """The hard zone spread's promise, on real Karpenter: when the pool's instance type is offered in one zone only
    (none left in the others, as Karpenter sees a zone out of capacity), the second replica waits, and Karpenter
    says it cannot place it, rather than joining the first in that zone. A soft spread would not wait: Karpenter
    relaxes a preference it cannot meet and launches a second node in the same zone. Runs after the consolidation
    scenario, so the pool is empty already."""
    from_zero.empty_l4()
    [pool] = [m for m in from_zero.manifests if m["kind"] == "NodePool" and m["metadata"]["name"] == "l4"]
    requirements = pool["spec"]["template"]["spec"]["requirements"]
    [zones] = [r["values"] for r in requirements if r["key"] == ZONE]
    [[instance_type]] = [r["values"] for r in requirements if r["key"] == "node.kubernetes.io/instance-type"]
    assert len(zones) >= 2
    only = zones[0]
    from_zero.offer_only_in(instance_type, only)
    try:
        [deployment] = [m for m in from_zero.manifests
                        if m["kind"] == "Deployment" and m["metadata"]["name"] == "embed"]
        assert deployment["spec"]["replicas"] == 2
        from_zero.plane.kubectl("scale", "deployment", "embed", "-n", "llm", "--replicas=2")
        from_zero.wait("one embed replica Running", lambda: _running(from_zero.pods("embed")) == 1)
        [waiting] = _pending(from_zero.pods("embed"))
        from_zero.wait("Karpenter's word that it cannot place the second replica",
                       lambda: from_zero.karpenter_refused(waiting) is not None, 120)
        nodes = from_zero.pool_nodes("l4")
        assert [n["metadata"]["labels"][ZONE] for n in nodes] == [only]
        assert len(from_zero.get("nodeclaims", "-l", "karpenter.sh/nodepool=l4")) == 1
        phases = sorted(p["status"].get("phase") for p in from_zero.pods("embed"))
        assert phases == ["Pending", "Running"]
    finally:  # every zone offered again, for the scenario after this one
        from_zero.offer_only_in(instance_type, None)


def test_the_nodepool_limit_holds_where_the_plan_refuses(from_zero: FromZero, tmp_path: Path) -> None:
    stack_config = read_stack_config(stack_path(STACK))[0]
    stack = from_pulumi_config(stack_config)
    most = stack.node_group("l4").max
    models = json.loads(stack_config["triarch:models"])
    next(m for m in models if m["name"] == "embed")["replicas"] = most + 1
    edited = from_pulumi_config({**stack_config, "triarch:models": json.dumps(models)})
    with pytest.raises(ConfigError, match=r"'l4'") as refused:  # the plan refuses one replica more than it holds
        plan_kubernetes(edited, plan_models(edited, catalog()), catalog())
    assert str(refused.value).startswith(f"triarch:nodeGroups[0].max: {most} holds {most} GPU(s)")
    from_zero.plane.kubectl("scale", "deployment", "embed", "-n", "llm", f"--replicas={most + 1}")
    from_zero.wait(f"{most} embed replicas Running", lambda: _running(from_zero.pods("embed")) == most)
    # Karpenter says a pod's FailedScheduling once in five minutes (its event dedupe is by the pod): a pod still
    # pending from the scenario before would keep that scenario's word, so the pending pod is made anew.
    [stale] = _pending(from_zero.pods("embed"))
    from_zero.plane.kubectl("delete", "pod", "-n", "llm", stale["metadata"]["name"], "--grace-period=0", "--force")

    def pending_anew() -> list[dict[str, Any]]:
        return [p for p in from_zero.pods("embed") if p["status"].get("phase") == "Pending"
                and p["metadata"]["uid"] != stale["metadata"]["uid"] and not p["metadata"].get("deletionTimestamp")]

    from_zero.wait("the pending replica made anew", lambda: len(pending_anew()) == 1, 60)
    [waiting] = pending_anew()
    from_zero.wait("Karpenter's word that the pool's limit leaves no room",
                   lambda: "exceed limits for nodepool" in (from_zero.karpenter_refused(waiting) or ""), 120)
    # A node the previous scenario left empty may still be terminating (its capacity no longer counts against the
    # limit): the limit is on the nodes that stay.
    nodes = from_zero.pool_nodes("l4")
    staying = [n for n in nodes if "deletionTimestamp" not in n["metadata"]]
    assert len(staying) == most, [(n["metadata"]["name"], n["metadata"].get("deletionTimestamp")) for n in nodes]
    assert len(_pending(from_zero.pods("embed"))) == 1


RESERVATIONS = ("cr-0123456789abcdef0", "cr-0123456789abcdef1")
"""Two capacity reservations of one instance each, in the pool's first two zones (an ODCR is zonal)."""
RESERVATION_ID_LABEL = "karpenter.k8s.aws/capacity-reservation-id"
"""The AWS provider's label for a node's capacity reservation, which Triarch's karpenter-kwok main names as the
core's ReservationIDLabel (tools/engines/karpenter-kwok)."""
CAPACITY_TYPE = "karpenter.sh/capacity-type"


def test_a_pools_reservations_are_launched_into_before_on_demand(from_zero: FromZero, tmp_path: Path) -> None:
    """Reserved GPUs on real Karpenter (issue 52 D3): prod's l4 pool planned with two capacity reservations of one
    instance each, its NodePool applied as planned (capacity types reserved, then the pool's own), Karpenter's kwok
    provider offering the pool's instance type reserved in the first two zones (at the on-demand price: only its
    being reserved sets it apart) and on-demand in all three. Three replicas under the hard zone spread go one to a
    zone: the nodes of the two zones with a reservation are launched into it (the reservation's id on the node and
    pinned in its NodeClaim), the third zone's on-demand; the reserved nodes are as many as the plan says the
    reservations hold.

    Not shown, as kwok cannot: a reservation filling up (the provider's offerings do not count what was launched
    into them; EC2 does). Seen while writing this (Karpenter 1.14.1, topologygroup.go nextDomainTopologySpread):
    under a hard zone spread Karpenter picks the zone first, one of the least used, and only then an offering, so a
    reservation in one zone is used only when that zone's turn comes (docs/pools.md)."""
    from_zero.empty_l4()
    config = stack_document(STACK)
    next(g for g in config["triarch:nodeGroups"] if g["name"] == "l4")["reservations"] = [
        {"id": reservation, "count": 1} for reservation in RESERVATIONS]
    out = tmp_path / "plan"
    plan_stack(validate_stack_file(STACK, write_stack_file(tmp_path / f"Pulumi.{STACK}.yaml", config)), out)
    planned = [yaml.safe_load(p.read_text()) for p in sorted((out / "manifests").glob("*.yaml"))]
    [pool] = [m for m in on_kwok(planned) if m["kind"] == "NodePool" and m["metadata"]["name"] == "l4"]
    requirements = pool["spec"]["template"]["spec"]["requirements"]
    [capacity_types] = [r["values"] for r in requirements if r["key"] == CAPACITY_TYPE]
    assert capacity_types[0] == "reserved" and len(capacity_types) == 2, capacity_types
    [zones] = [r["values"] for r in requirements if r["key"] == ZONE]
    [[instance_type]] = [r["values"] for r in requirements if r["key"] == "node.kubernetes.io/instance-type"]
    assert len(zones) == 3
    reserved_in = dict(zip(zones, RESERVATIONS, strict=False))  # the first two zones
    offered = json.loads(json.dumps(from_zero.instance_types))
    [kind] = [t for t in offered if t["name"] == instance_type]
    price = kind["offerings"][0]["Price"]
    kind["offerings"] += [{"Price": price, "Available": True, "ReservationCapacity": 1, "Requirements": [
        {"key": CAPACITY_TYPE, "operator": "In", "values": ["reserved"]},
        {"key": ZONE, "operator": "In", "values": [zone]},
        {"key": RESERVATION_ID_LABEL, "operator": "In", "values": [reservation]}]}
        for zone, reservation in reserved_in.items()]
    [original] = [m for m in on_kwok(from_zero.manifests) if m["kind"] == "NodePool" and m["metadata"]["name"] == "l4"]
    plane = from_zero.plane
    plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump(pool))
    stop_operator(plane, "karpenter")
    start_operator(plane, "karpenter", PlaneSpec(plane.name, "", [], instance_types=offered))
    try:
        plane.kubectl("scale", "deployment", "embed", "-n", "llm", "--replicas=3")
        from_zero.wait("three embed replicas Running", lambda: _running(from_zero.pods("embed")) == 3)
        # The replicas' nodes: Karpenter may launch a node more while the pods bind (seen once in CI, an empty
        # reserved node beside them, consolidated later), and kwok's reservations never fill, so the nodes the
        # replicas run on are what the scenario holds, and every node's labels and claim agree with its zone.
        nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in from_zero.pool_nodes("l4")}
        launches = [line for line in (plane.directory / "logs" / "karpenter.log").read_text().splitlines()
                    if "launched nodeclaim" in line]
        serving = [nodes[p["spec"]["nodeName"]] for p in _serving(from_zero.pods("embed"))]
        found = sorted((v[ZONE], v[CAPACITY_TYPE], v.get(RESERVATION_ID_LABEL)) for v in serving)
        assert found == [(zones[0], "reserved", RESERVATIONS[0]), (zones[1], "reserved", RESERVATIONS[1]),
                         (zones[2], "on-demand", None)], "\n".join([json.dumps(found), *launches[-6:]])
        assert len([v for v in serving if v[CAPACITY_TYPE] == "reserved"]) == int(
            pool["metadata"]["annotations"][RESERVED_NODES_ANNOTATION])
        for claim in from_zero.get("nodeclaims", "-l", "karpenter.sh/nodepool=l4"):
            if claim["status"].get("nodeName") not in nodes:
                continue
            labels = nodes[claim["status"]["nodeName"]]
            pinned = [r["values"] for r in claim["spec"]["requirements"] if r["key"] == RESERVATION_ID_LABEL]
            expected = [[reserved_in[labels[ZONE]]]] if labels[CAPACITY_TYPE] == "reserved" else []
            assert pinned == expected and labels.get(RESERVATION_ID_LABEL) == reserved_in.get(
                labels[ZONE] if labels[CAPACITY_TYPE] == "reserved" else ""), (labels, pinned)
    finally:  # the pool and the offerings as the plane started
        plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump(original))
        from_zero.offer_only_in(instance_type, None)


def test_warm_capacity_keeps_a_node_that_the_next_replica_takes(from_zero: FromZero) -> None:
    """The plan's CapacityBuffer on real Karpenter: with the pool empty and no replica asking, Karpenter launches a
    node for the buffer, keeps it although it is empty past consolidateAfter, and the next replica binds there."""
    plane = from_zero.plane
    from_zero.empty_l4()

    config = read_stack_config(stack_path(STACK))[0]
    models = json.loads(config["triarch:models"])
    next(m for m in models if m["name"] == "embed")["warmReplicas"] = 1
    stack = from_pulumi_config({**config, "triarch:models": json.dumps(models)})
    warm = plan_kubernetes(stack, plan_models(stack, catalog()), catalog()).warm
    assert sorted(o["kind"] for o in warm) == ["CapacityBuffer", "PodTemplate"]
    plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(warm))
    try:
        from_zero.wait("a node launched for the buffer", lambda: len(from_zero.pool_nodes("l4")) == 1)
        [buffer] = from_zero.get("capacitybuffers.autoscaling.x-k8s.io", "-n", "llm")
        conditions = {c["type"]: c["status"] for c in buffer.get("status", {}).get("conditions", [])}
        assert buffer["status"]["replicas"] == 1 and conditions.get("ReadyForProvisioning") == "True", buffer
        assert from_zero.pods("embed") == []
        [warm_node] = from_zero.pool_nodes("l4")
        node = warm_node["metadata"]["name"]

        def kept_for_the_buffer() -> bool:  # Karpenter's own word, once the node is past consolidateAfter
            return any("has buffer pods" in e.get("message", "") for e in from_zero.get(
                "events", "-A", "--field-selector", f"involvedObject.kind=Node,involvedObject.name={node},"
                "reason=Unconsolidatable"))

        from_zero.wait("Karpenter keeping the empty node for the buffer", kept_for_the_buffer, 120)
        assert [n["metadata"]["name"] for n in from_zero.pool_nodes("l4")] == [warm_node["metadata"]["name"]]
        plane.kubectl("scale", "deployment", "embed", "-n", "llm", "--replicas=1")
        from_zero.wait("the replica Running", lambda: _running(from_zero.pods("embed")) == 1, 60)
        [pod] = from_zero.pods("embed")
        assert pod["spec"]["nodeName"] == warm_node["metadata"]["name"]
    finally:
        plane.kubectl("delete", "-f", "-", "--ignore-not-found", input=yaml.safe_dump_all(warm))

