"""Reserved GPUs (issue 52 D3): a Karpenter pool's capacity reservations and Capacity Blocks, planned as its
EC2NodeClass's capacityReservationSelectorTerms and the NodePool's `reserved` capacity type ahead of on-demand,
checked against Karpenter 1.14.1's CRDs (schema and CEL rules); the placement proof and the cost counting reserved
nodes apart; `triarch diff` saying what a reservation's change or end does to the replicas on its nodes; bad input
refused in one line.

Expectations come from the CRDs and the getting-started policy in the reference data, templates/compat/prices.yaml
read as YAML, and Karpenter's and AWS's documented behaviour (cited in triarch.effects and docs/pools.md), never
from the planners' own functions.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import (
    StackPlan,
    compat_data,
    plan_config,
    plan_refusal,
    reference_file,
    schema_validate,
    stack_document,
    unknown_fields,
    write_stack_file,
)
from test_karpenter import cel_failures, schema_of
from test_placement import resources
from triarch import cli
from triarch.diff import diff_plans
from triarch.effects import reservation_effects, traffic_effects
from triarch.guardrails.placement import headroom, prove
from triarch.planners import karpenter

ODCR = "cr-0123456789abcdef0"
BLOCK_TAGS = {"team": "ml-serving"}
BLOCK_END = "2027-01-15T11:30:00Z"
RESERVED = [{"id": ODCR, "count": 1},
            {"tags": BLOCK_TAGS, "type": "capacityBlock", "count": 1, "hourlyUsd": 20.5, "endsAt": BLOCK_END}]


def pool(config: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(g for g in config["triarch:nodeGroups"] if g["name"] == name)
    return found


def with_reservations(edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    config = stack_document("prod")
    edit(config)
    return config


def a100_reserved(config: dict[str, Any]) -> None:
    pool(config, "a100")["reservations"] = [dict(r) for r in RESERVED]


@pytest.fixture(scope="module")
def reserved(tmp_path_factory: pytest.TempPathFactory) -> StackPlan:
    return plan_config("prod", with_reservations(a100_reserved), tmp_path_factory.mktemp("reserved"))


def objects_of(plan: StackPlan, kind: str, name: str) -> dict[str, Any]:
    [found] = [o for o in plan.objects(kind) if o["metadata"]["name"] == name]
    return found


def capacity_values(node_pool: dict[str, Any]) -> list[str]:
    [requirement] = [r for r in node_pool["spec"]["template"]["spec"]["requirements"]
                     if r["key"] == "karpenter.sh/capacity-type"]
    values: list[str] = requirement["values"]
    return values


# --- the plan: Karpenter's objects, against its CRDs -----------------------------------------------------------

def test_a_pools_reservations_are_its_node_class_terms_and_reserved_comes_first(reserved: StackPlan) -> None:
    node_class = objects_of(reserved, "EC2NodeClass", "a100")
    assert node_class["spec"]["capacityReservationSelectorTerms"] == [{"id": ODCR}, {"tags": BLOCK_TAGS}]
    node_pool = objects_of(reserved, "NodePool", "a100")
    assert capacity_values(node_pool) == ["reserved", "on-demand"]
    assert node_pool["metadata"]["annotations"] == {"triarch.dev/reserved-nodes": "2"}
    # the other pool is untouched
    assert "capacityReservationSelectorTerms" not in objects_of(reserved, "EC2NodeClass", "l4")["spec"]
    assert capacity_values(objects_of(reserved, "NodePool", "l4")) == ["on-demand"]


def test_the_reserved_objects_validate_against_karpenters_crds(reserved: StackPlan) -> None:
    for obj in (objects_of(reserved, "EC2NodeClass", "a100"), objects_of(reserved, "NodePool", "a100")):
        schema = schema_of(obj["kind"])
        schema_validate(obj, schema)
        body = {k: v for k, v in obj.items() if k != "metadata"}
        assert unknown_fields(body, schema) == []
        assert cel_failures(body, schema) == []


def test_the_crd_refuses_what_the_stack_check_refuses() -> None:
    """The CRD's own rules on the terms Triarch refuses: id with other fields, a term of nothing, an empty tag. (Its
    id pattern, `^cr-[0-9a-z]+$`, is looser than EC2's ids; Triarch checks `cr-` and 17 hex digits.)"""
    spec = schema_of("EC2NodeClass")["properties"]["spec"]
    terms_schema = spec["properties"]["capacityReservationSelectorTerms"]
    assert cel_failures([{"id": ODCR, "tags": BLOCK_TAGS}], terms_schema)
    assert cel_failures([{"id": ODCR, "ownerID": "123456789012"}], terms_schema)
    assert cel_failures([{}], terms_schema)
    assert cel_failures([{"tags": {"team": ""}}], terms_schema)
    assert cel_failures([{"id": ODCR}, {"tags": BLOCK_TAGS, "ownerID": "123456789012"}], terms_schema) == []
    assert terms_schema["items"]["properties"]["id"]["pattern"] == "^cr-[0-9a-z]+$"
    assert terms_schema["maxItems"] == 30


def test_reserved_only_allows_reserved_alone(tmp_path: Path) -> None:
    def edit(config: dict[str, Any]) -> None:
        a100_reserved(config)
        pool(config, "a100").update(reservedOnly=True)
        del pool(config, "a100")["reservations"][0]["count"]  # an ODCR of unknown size: no annotation

    plan = plan_config("prod", with_reservations(edit), tmp_path)
    node_pool = objects_of(plan, "NodePool", "a100")
    assert capacity_values(node_pool) == ["reserved"]
    assert "annotations" not in node_pool["metadata"]
    schema = schema_of("NodePool")
    schema_validate(node_pool, schema)
    assert cel_failures({k: v for k, v in node_pool.items() if k != "metadata"}, schema) == []


def test_the_controller_may_describe_and_launch_into_reservations_only_where_a_pool_has_some() -> None:
    """Karpenter's getting-started policy (1.14.1) has both; Triarch's narrower policy adds them with a reservation."""
    upstream = reference_file("karpenter-v1.14.1", "getting-started-cloudformation.yaml").read_text(encoding="utf-8")
    assert '"ec2:DescribeCapacityReservations"' in upstream
    assert ":*:capacity-reservation/*" in upstream
    arns = {"cluster": "llm-prod", "region": "us-east-1", "cluster_arn": "arn:aws:eks:us-east-1:1:cluster/x",
            "node_role_arn": "arn:aws:iam::1:role/n", "queue_arn": "arn:aws:sqs:us-east-1:1:q",
            "instance_profile_arn": "arn:aws:iam::1:instance-profile/p"}
    without = json.dumps(karpenter.controller_policy(**arns))
    assert "CapacityReservation" not in without and "capacity-reservation" not in without
    with_them = karpenter.controller_policy(**arns, capacity_reservations=True)["Statement"]
    launch = next(s for s in with_them if s["Sid"] == "LaunchFromImagesSubnetsAndSecurityGroups")
    assert "arn:aws:ec2:us-east-1:*:capacity-reservation/*" in launch["Resource"]
    describe = next(s for s in with_them if s["Sid"] == "DescribeInThisRegion")
    assert "ec2:DescribeCapacityReservations" in describe["Action"]


# --- bad input: one line, exit 2 ---------------------------------------------------------------------------------

def set_a100(**keys: Any) -> Callable[[dict[str, Any]], None]:
    return lambda config: pool(config, "a100").update(keys)


@pytest.mark.parametrize(("edit", "expected"), [
    (set_a100(reservations=[{"id": "cr-0123456789abcdef"}]),  # 16 hex digits
     "triarch:nodeGroups[1].reservations[0].id: 'cr-0123456789abcdef' has the wrong form"),
    (set_a100(reservations=[{"id": "cr-0123456789ABCDEF0"}]),
     "triarch:nodeGroups[1].reservations[0].id: 'cr-0123456789ABCDEF0' has the wrong form"),
    (set_a100(reservations=[{"id": ODCR, "tags": BLOCK_TAGS}]),
     "triarch:nodeGroups[1].reservations[0]: {'id': 'cr-0123456789abcdef0', 'tags': {'team': 'ml-serving'}} names a "
     "reservation by id or by tags, not both and not neither"),
    (set_a100(reservations=[{"count": 2}]), "triarch:nodeGroups[1].reservations[0]: {} names a reservation by id"),
    (set_a100(reservations=[{"id": ODCR, "ownerID": "123456789012"}]),
     "triarch:nodeGroups[1].reservations[0].ownerID: '123456789012' only narrows a tags term"),
    (set_a100(reservations=[{"tags": {"team": ""}}]), "triarch:nodeGroups[1].reservations[0].tags: {'team': ''} has "
     "an empty key or value"),
    (set_a100(reservations=[{"tags": {f"k{i}": "v" for i in range(21)}}]),
     "triarch:nodeGroups[1].reservations[0].tags: "),
    (set_a100(reservations=[{"tags": BLOCK_TAGS, "type": "capacityBlock", "count": 2}]),
     "triarch:nodeGroups[1].reservations[0].hourlyUsd: is required for a Capacity Block"),
    (set_a100(reservations=[{"tags": BLOCK_TAGS, "type": "capacityBlock", "hourlyUsd": 20.5}]),
     "triarch:nodeGroups[1].reservations[0].count: is required for a Capacity Block"),
    (set_a100(reservations=[{"id": ODCR, "hourlyUsd": 20.5}]),
     "triarch:nodeGroups[1].reservations[0].hourlyUsd: 20.5 only applies to a Capacity Block"),
    (set_a100(reservations=[{"id": ODCR}, {"id": ODCR, "count": 1}]),
     "triarch:nodeGroups[1].reservations[1]: 'cr-0123456789abcdef0' repeats reservations[0]"),
    (set_a100(reservedOnly=True), "triarch:nodeGroups[1].reservedOnly: True leaves the pool no capacity"),
    (set_a100(reservations=[{"id": ODCR}], endsAt="2027-01-01"), "triarch:nodeGroups[1].endsAt"),
    (set_a100(reservations=[{"id": ODCR, "endsAt": "2027-01-15T11:30:00"}]),  # no zone: which instant?
     "triarch:nodeGroups[1].reservations[0].endsAt"),
    (set_a100(reservations=[{"id": ODCR}], provisioner="managedNodeGroup", min=2, max=2),
     "triarch:nodeGroups[1].reservations: ['cr-0123456789abcdef0'] needs a Karpenter pool"),
])
def test_bad_reservations_are_refused_in_one_line(edit: Callable[[dict[str, Any]], None], expected: str,
                                                  tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = plan_refusal(tmp_path, capsys, with_reservations(edit))
    assert line.startswith(f"error: {expected}"), line


def test_a_reservation_on_an_adopted_cluster_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = stack_document("lab")
    config["triarch:nodeGroups"][0]["reservations"] = [{"id": ODCR}]
    line = plan_refusal(tmp_path, capsys, config)
    assert line.startswith("error: triarch:nodeGroups[0].reservations: ['cr-0123456789abcdef0'] only applies when "
                           "triarch:cluster.create is true"), line


# --- the placement proof: reserved nodes apart --------------------------------------------------------------------

def test_the_headroom_counts_the_reserved_nodes(reserved: StackPlan) -> None:
    proof = prove(resources(reserved))
    assert proof.findings == []
    [a100] = [p for p in proof.pools if p.name == "a100"]
    assert (a100.reserved_nodes, a100.reserved_only) == (2, False)
    lines = [line for line in headroom(proof) if " on a100 " in line]
    assert lines and all(line.endswith("pool max 2, 2 of them reserved, the rest on-demand") for line in lines)


def test_a_pool_on_its_reservations_only_must_fit_in_them(tmp_path: Path) -> None:
    """l4 (max 6) on one reserved node only: embed's and qwen's pods at their largest need more nodes than that."""
    def edit(config: dict[str, Any]) -> None:
        pool(config, "l4").update(reservations=[{"id": ODCR, "count": 1}], reservedOnly=True)

    proof = prove(resources(plan_config("prod", with_reservations(edit), tmp_path)))
    [finding] = [f for f in proof.findings if f.rule == "pool-capacity"]
    assert finding.message.startswith("pool l4 (NodePool l4) runs on its capacity reservations only, which hold 1 "
                                      "g6.2xlarge node(s), but its workloads at their largest need ")
    assert finding.message.endswith("; reserve more, let the pool fall back to on-demand (reservedOnly: false) or "
                                    "lower the replicas")


# --- the cost: each reservation billed used or not ------------------------------------------------------------

@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`triarch plan` of prod as shipped, with a100's reservations, and with a100 on one ODCR only: each plan
    directory (plan.json, capacity.json), every stack file named Pulumi.prod.yaml so the plans compare."""
    found = {}
    for name, edit in (("base", lambda c: None), ("reserved", a100_reserved),
                       ("only", set_a100(reservations=[{"id": ODCR, "count": 1, "endsAt": "2027-02-01T00:00:00Z"}],
                                         reservedOnly=True))):
        directory = tmp_path_factory.mktemp(name)
        path = write_stack_file(directory / "Pulumi.prod.yaml", with_reservations(edit))
        assert cli.main(["plan", "--stack-file", str(path), "--out", str(directory / "out")]) == 0
        found[name] = directory / "out"
    return found


def capacity_of(directory: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((directory / "capacity.json").read_text(encoding="utf-8"))
    return data


def test_the_cost_counts_each_reservation_apart(planned: dict[str, Path]) -> None:
    prices = compat_data("prices")
    hours = prices["hoursPerMonth"]
    on_demand = prices["regions"]["us-east-1"]["instances"]["p4de.24xlarge"]["hourlyUsd"]
    [a100] = [p for p in capacity_of(planned["reserved"])["pools"] if p["name"] == "a100"]
    odcr = round(on_demand * 1 * hours, 2)   # billed at the on-demand rate whether used or not
    block = round(20.5 * 1 * hours, 2)       # the price the stack recorded
    assert [(r["reservation"], r["type"], r["count"], r["monthlyUsd"]) for r in a100["reservations"]] == [
        (ODCR, "odcr", 1, odcr), ("tags team=ml-serving", "capacityBlock", 1, block)]
    assert a100["reservations"][1]["endsAt"] == BLOCK_END
    assert a100["reservations"][1]["priceSource"] == \
        "as the stack records it (triarch:nodeGroups[1].reservations[1].hourlyUsd)"
    assert a100["reservedNodes"] == 2
    # max 2 nodes, both in the reservations: nothing beyond them; at min (0 nodes) the reservations still bill
    assert a100["monthlyUsdAtMin"] == a100["monthlyUsdAtMax"] == a100["monthlyUsdIdle"] == round(odcr + block, 2)


def test_an_odcr_of_unknown_size_makes_the_total_a_floor(write_stack: Callable[[Any], Path]) -> None:
    from triarch.catalog import catalog
    from triarch.config import from_pulumi_config
    from triarch.cost import at_least_line, capacity_report
    from triarch.offline import read_stack_config
    from triarch.planners.models import plan_models

    config = with_reservations(set_a100(reservations=[{"id": ODCR}]))
    stack = from_pulumi_config(read_stack_config(write_stack(config))[0])
    report = capacity_report("prod", stack, plan_models(stack, catalog()), catalog())
    assert report["unpriced"] == [f"reservation {ODCR} of pool a100 has no count, so the on-demand rate its unused "
                                  "instances bill is not counted"]
    line = at_least_line(report)
    assert line is not None and line.startswith("total at least ")


def test_the_plan_summary_names_the_reserved_capacity(planned: dict[str, Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = write_stack_file(tmp_path / "Pulumi.prod.yaml", with_reservations(a100_reserved))
    assert cli.main(["plan", "--stack-file", str(path), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert (f"Reserved capacity of pool a100 (billed used or not, in its cost): {ODCR} (ODCR, on-demand rate) 1 "
            "node(s) $") in out
    assert "Karpenter NodePool a100: from 0 to 2 p4de.24xlarge reserved (then on-demand) nodes" in out


# --- triarch diff: what a reservation's change or end does ---------------------------------------------------

def effects(planned: dict[str, Path], base: str, head: str) -> list[str]:
    before = json.loads((planned[base] / "plan.json").read_text(encoding="utf-8"))
    after = json.loads((planned[head] / "plan.json").read_text(encoding="utf-8"))
    return traffic_effects(diff_plans(before, after), before, after, capacity_of(planned[base]),
                           capacity_of(planned[head]))


def test_adding_reservations_moves_nothing_and_says_when_the_block_ends(planned: dict[str, Path]) -> None:
    found = effects(planned, "base", "reserved")
    # reservation terms and the capacity-type requirement are outside Karpenter's drift hashes: no node replaced
    assert not any("replaces every node" in line for line in found), found
    assert found[0] == (f"pool a100: new nodes launch into {ODCR}, tags team=ml-serving first (Karpenter's reserved "
                        "capacity type, ahead of on-demand); running nodes stay (reservation terms are outside the "
                        "EC2NodeClass's drift hash)")
    assert found[1] == (f"pool a100: Capacity Block tags team=ml-serving ends {BLOCK_END}: 40 minutes before it ends, "
                        "Karpenter deletes its nodes, 10 minutes before EC2 starts terminating them (Karpenter 1.14.1, "
                        "capacityreservation.expiration; EC2 User Guide, \"Work with Capacity Blocks\": thirty minutes "
                        "before the end); their replicas move to on-demand nodes Karpenter launches for them, each "
                        "starting cold")
    assert len(found) == 2


def test_dropping_a_reservation_and_reserving_only_drift_their_nodes(planned: dict[str, Path]) -> None:
    found = effects(planned, "reserved", "only")
    assert found == [
        "pool a100: nodes running in tags team=ml-serving drift (CapacityReservationDrift, Karpenter 1.14.1) and "
        "Karpenter replaces them as the pool's disruption budget allows; their replicas wait Pending until a "
        "reservation of the pool has room (reservedOnly: no on-demand node)",
        "pool a100: reservedOnly: its nodes outside the reservations drift (their capacity type leaves the "
        "NodePool's requirement) and Karpenter replaces them in the reservations as far as they hold; the rest of "
        "their replicas wait Pending",
        f"pool a100: reservation {ODCR} ends 2027-02-01T00:00:00Z: its running nodes stay, billed on-demand from "
        "then: Karpenter relabels them on-demand (Karpenter 1.14.1, capacityreservation.capacitytype); then they "
        "drift off the reservations-only NodePool, and their replicas wait Pending"]


def test_removing_every_reservation_names_the_odcr_that_still_bills() -> None:
    base = {"pools": [{"name": "a100", "capacityType": "ON_DEMAND", "reservations": [
        {"reservation": ODCR, "type": "odcr", "count": 1}]}]}
    head = {"pools": [{"name": "a100", "capacityType": "ON_DEMAND"}]}
    [line] = reservation_effects(base, head)
    assert line.endswith(f"their replicas move to on-demand nodes Karpenter launches for them, each starting cold; "
                         f"Triarch cancels no reservation: {ODCR} bill(s) at the on-demand rate until you cancel it in "
                         "EC2")


def test_an_unchanged_reservation_says_nothing(planned: dict[str, Path]) -> None:
    capacity = capacity_of(planned["reserved"])
    assert reservation_effects(capacity, capacity) == []


# --- the key reference ---------------------------------------------------------------------------------------------

def test_the_keys_are_in_the_reference_and_the_schema() -> None:
    docs = Path(__file__).resolve().parents[1] / "docs"
    keys = (docs / "stack-keys.md").read_text(encoding="utf-8")
    for key in ("reservations", "reservations[].id", "reservations[].tags", "reservations[].ownerID",
                "reservations[].type", "reservations[].count", "reservations[].hourlyUsd",
                "reservations[].endsAt", "reservedOnly"):
        assert f"`triarch:nodeGroups[].{key}`" in keys, key
    schema = json.loads((docs / "stack.schema.json").read_text(encoding="utf-8"))
    text = json.dumps(schema)
    assert "^cr-[0-9a-f]{17}$" in text and "capacityBlock" in text
    assert yaml.safe_load((docs / "pools.md").read_text(encoding="utf-8").split("```yaml\n")[-1].split("```")[0])
