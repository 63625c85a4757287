"""Costs in every region Triarch ships prices for (issue 50, deliverable 5): a node type a listed region does not
sell is refused at plan time in one line, naming the key path, the type, the region and what it could be instead;
a region with some rates missing gets a partial total, "at least" the priced lines, naming each line left out; the
rates recorded for a region are the ones the plan uses; a region the table does not list is not refused.

Every expected amount is written out from the sources' numbers (templates/compat/prices.yaml), never computed by
the code under test: 730 hours a month; eu-west-1's g5.xlarge $1.123 and m7i.large $0.11235 an hour (SkyPilot's
catalog), its NAT gateway $0.048 an hour and $0.048 per GB (AWS's offer 20260925174521), public IPv4 $0.005 an
hour."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import StackWriter, plan_refusal, stack_document
from triarch import cli
from triarch.catalog import catalog
from triarch.config import from_pulumi_config
from triarch.cost import at_least_line, capacity_report, price_table, unpriced_lines
from triarch.errors import ConfigError
from triarch.offline import read_stack_config
from triarch.planners.models import plan_models
from triarch.pricelist import types_listed
from triarch.review import review_markdown


def in_region(config: dict[str, Any], region: str, pool_type: str | None = None) -> dict[str, Any]:
    config["aws:region"] = region
    config["triarch:cluster"]["zones"] = [f"{region}a", f"{region}b"]
    if pool_type is not None:
        config["triarch:nodeGroups"][0]["instanceType"] = pool_type
    return config


def plan(write_stack: StackWriter, tmp_path: Path, capsys: pytest.CaptureFixture[str],
         config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    out = tmp_path / "review" / "head" / "test"
    assert cli.main(["plan", "--stack-file", str(write_stack(config)), "--out", str(out)]) == 0
    return capsys.readouterr().out, json.loads((out / "capacity.json").read_text(encoding="utf-8"))


# --- a type the region does not sell ------------------------------------------------------------------------------

def test_a_g6_pool_in_eu_west_1_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = plan_refusal(tmp_path, capsys, in_region(stack_document("dev"), "eu-west-1"))
    assert line.startswith("error: triarch:nodeGroups[0].instanceType: 'g6.xlarge' is not sold in eu-west-1 "), line
    # eu-west-1 sells no L4 type at all: the line names the regions that sell g6.xlarge (SkyPilot's rows).
    assert "(eu-west-1 sells no NVIDIA L4 type)" in line
    assert "allowed: a region that sells g6.xlarge: ap-northeast-1, ap-northeast-2, ap-south-1, ap-southeast-2, " \
        "ca-central-1, eu-central-1, eu-north-1, eu-south-2, eu-west-2, eu-west-3, me-central-1, us-east-1, " \
        "us-east-2, us-west-2 " in line


def test_the_second_pool_is_named_by_its_own_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = in_region(stack_document("dev"), "eu-west-1", "g5.xlarge")
    config["triarch:nodeGroups"].append({**config["triarch:nodeGroups"][0], "name": "l40s",
                                         "instanceType": "g6e.xlarge"})
    line = plan_refusal(tmp_path, capsys, config)
    assert line.startswith("error: triarch:nodeGroups[1].instanceType: 'g6e.xlarge' is not sold in eu-west-1 "), line


def test_a_system_type_the_region_does_not_sell_names_what_it_sells(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # af-south-1's rows: g4dn and m6i, no m7i (the dev stack's system nodes are m7i.large).
    line = plan_refusal(tmp_path, capsys, in_region(stack_document("dev"), "af-south-1", "g4dn.xlarge"))
    assert line == ("error: triarch:cluster.systemNodeGroup.instanceType: 'm7i.large' is not sold in af-south-1 "
                    "(templates/compat/prices.yaml lists every type the region sells, and not this one): no node of "
                    "it could ever launch there; allowed: the CPU types af-south-1 sells: m6i.large, m6i.xlarge")


def test_the_types_of_the_same_gpu_the_region_sells_are_named() -> None:
    from triarch.config.pools import check_sold_in_region

    # ca-central-1's rows hold p5.48xlarge (8 x H100) but not p5.4xlarge (1 x H100): the same GPU, another size.
    config = in_region(stack_document("dev"), "ca-central-1")
    stack = from_pulumi_config({k: json.dumps(v) if not isinstance(v, str) else v for k, v in config.items()})
    group = stack.node_groups[0].model_copy(update={"instance_type": "p5.4xlarge"})
    with pytest.raises(ConfigError) as raised:
        check_sold_in_region(stack.model_copy(update={"node_groups": [group]}), catalog())
    assert str(raised.value) == (
        "triarch:nodeGroups[0].instanceType: 'p5.4xlarge' is not sold in ca-central-1 (templates/compat/prices.yaml "
        "lists every type the region sells, and not this one): no node of it could ever launch there; allowed: the "
        "NVIDIA H100 80GB HBM3 types ca-central-1 sells: p5.48xlarge")
    group = stack.node_groups[0].model_copy(update={"instance_type": "p5.48xlarge"})
    check_sold_in_region(stack.model_copy(update={"node_groups": [group]}), catalog())  # sold there: no error


def test_a_region_the_table_does_not_list_is_not_refused(write_stack: StackWriter, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert "ap-southeast-4" not in types_listed()
    out, capacity = plan(write_stack, tmp_path, capsys, in_region(stack_document("dev"), "ap-southeast-4"))
    assert capacity["pools"][0]["monthlyUsdAtMax"] is None  # g6.xlarge: not recorded, not refused
    assert "g6.xlarge price for ap-southeast-4 not recorded (pool l4)" in capacity["unpriced"]
    assert capacity["atLeast"] is None  # nothing at all is priced there: the total stays unknown
    assert "  total unknown: no line has a price; not counted: g6.xlarge price for ap-southeast-4 not recorded " \
        "(pool l4); m7i.large price for ap-southeast-4 not recorded (system nodes); EKS control plane rate for " \
        "ap-southeast-4 not recorded;" in out


def test_an_existing_cluster_is_not_judged_by_region() -> None:
    from triarch.config.pools import check_sold_in_region

    config = in_region(stack_document("dev"), "eu-west-1")
    stack = from_pulumi_config({k: json.dumps(v) if not isinstance(v, str) else v
                                for k, v in in_region(stack_document("dev"), "us-east-1").items()})
    adopted = stack.model_copy(update={"aws_region": config["aws:region"], "cluster": stack.cluster.model_copy(
        update={"create": False})})
    check_sold_in_region(adopted, catalog())  # Triarch launches no node there: nothing to refuse


# --- a partial total ----------------------------------------------------------------------------------------------

EU_WEST_1_MISSING = ["EKS control plane rate for eu-west-1 not recorded",
                     "EBS gp3 rate for eu-west-1 not recorded (root volumes)",
                     "EBS gp3 rate for eu-west-1 not recorded (Prometheus volume)",
                     "EFS Standard rate for eu-west-1 not recorded (model caches)"]


def test_eu_west_1_plans_at_least_the_priced_lines_and_names_the_rest(
        write_stack: StackWriter, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, capacity = plan(write_stack, tmp_path, capsys, in_region(stack_document("dev"), "eu-west-1", "g5.xlarge"))
    fixed = {row["key"]: row for row in capacity["fixed"]}
    (pool,) = capacity["pools"]
    # g5.xlarge $1.123 x 730 h: 819.79 a node; 1 node idle (the model's replica), 0 at min, 2 at max.
    assert (pool["monthlyUsdIdle"], pool["monthlyUsdAtMin"], pool["monthlyUsdAtMax"]) == (819.79, 0.0, 1639.58)
    # m7i.large $0.11235 x 730 h = 82.0155: 2 nodes 164.03, 4 nodes 328.06.
    system = fixed["systemNodes"]
    assert (system["monthlyUsdIdle"], system["monthlyUsdAtMin"], system["monthlyUsdAtMax"]) == \
        (164.03, 164.03, 328.06)
    # One NAT gateway at $0.048 x 730 h; its one Elastic IP at $0.005 x 730 h.
    assert fixed["natGateways"]["monthlyUsdAtMax"] == 35.04
    assert fixed["natGateways"]["priceSource"] == \
        "https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/20260925174521/eu-west-1/index.json"
    assert fixed["publicIpv4"]["monthlyUsdAtMax"] == 3.65
    assert fixed["publicIpv4"]["priceSource"] == \
        "https://www.haufe-akademie.de/en/skill-it/blog/aws-gebuehren-ipv4-adressen"
    assert fixed["eksControlPlane"]["monthlyUsdAtMax"] is None
    # The exact totals stay unknown; the floor is the sum of the priced lines:
    # idle 819.79 + 164.03 + 35.04 + 3.65, at min 0 + 164.03 + 35.04 + 3.65, at max 1639.58 + 328.06 + 35.04 + 3.65.
    assert (capacity["monthlyUsdIdle"], capacity["monthlyUsdAtMin"], capacity["monthlyUsdAtMax"]) == \
        (None, None, None)
    assert capacity["atLeast"] == {"monthlyUsdIdle": 1022.51, "monthlyUsdAtMin": 202.72, "monthlyUsdAtMax": 2006.33}
    assert capacity["unpriced"] == EU_WEST_1_MISSING
    assert ("  total at least $1,023 a month idle, $203 at min, $2,006 at max (the priced lines); not counted: "
            + "; ".join(EU_WEST_1_MISSING)) in out.splitlines()
    total = next(line for line in out.splitlines() if line.lstrip().startswith("total "))
    assert total.split()[1:] == ["at", "least", "$1,023", "at", "least", "$203", "at", "least", "$2,006"]
    comment = review_markdown(tmp_path / "review")
    assert "| **total** | idle at least $1,023, at least $203-at least $2,006 |" in comment
    assert "The total at least $1,023 a month idle" in comment and "EKS control plane rate for eu-west-1" in comment


def test_eu_west_1_bills_nat_data_at_its_own_rate(write_stack: StackWriter) -> None:
    stack = from_pulumi_config(read_stack_config(write_stack(in_region(stack_document("dev"), "eu-west-1",
                                                                       "g5.xlarge")))[0])
    report = capacity_report("dev", stack, plan_models(stack, catalog()), catalog())
    assert {row["key"]: row["usd"] for row in report["usage"]}["natGatewayProcessed"] == 0.048
    assert report["priceGaps"]["others"] == ["eksControlPlane", "ebsGp3", "efsStandard", "efsElasticRead",
                                             "efsElasticWrite", "logsIngested", "logsStored"]


@pytest.mark.parametrize("region", ["af-south-1", "ap-east-1", "ap-northeast-1", "ap-northeast-2", "ap-northeast-3",
                                    "ap-south-1", "ap-southeast-1", "ap-southeast-2", "ap-southeast-3",
                                    "ca-central-1", "eu-central-1", "eu-north-1", "eu-south-1", "eu-south-2",
                                    "eu-west-1", "eu-west-2", "eu-west-3", "me-central-1", "me-south-1", "us-east-1",
                                    "us-east-2", "us-west-1", "us-west-2"])
def test_every_listed_region_records_public_ipv4_at_half_a_cent(region: str) -> None:
    price = price_table().fixed[region]["publicIpv4"]
    assert price.hourly_usd == 0.005


def test_a_region_with_every_rate_has_an_exact_total_and_no_floor(write_stack: StackWriter) -> None:
    stack = from_pulumi_config(read_stack_config(write_stack(stack_document("dev")))[0])
    report = capacity_report("dev", stack, plan_models(stack, catalog()), catalog())
    assert report["unpriced"] == [] and report["atLeast"] is None
    assert report["monthlyUsdAtMax"] is not None and at_least_line(report) is None


def test_a_type_without_an_on_demand_price_is_named_with_why(write_stack: StackWriter) -> None:
    stack = from_pulumi_config(read_stack_config(write_stack(stack_document("dev")))[0])
    pools = [{"name": "h200", "instanceType": "p5e.48xlarge", "monthlyUsdAtMax": None},
             {"name": "l4", "instanceType": "g6.xlarge", "monthlyUsdAtMax": 1175.01}]
    fixed = [{"key": "systemNodes", "name": "system nodes", "monthlyUsdAtMax": 294.34},
             {"key": "ebsRootThroughput", "name": "EBS root volume throughput", "monthlyUsdAtMax": None}]
    assert unpriced_lines(stack, pools, fixed, price_table()) == [
        "p5e.48xlarge has no on-demand price in us-east-1: no On-Demand SKU in us-east-1 (Capacity Blocks only) "
        "(pool h200)",
        "EBS gp3 throughput rate for us-east-1 not recorded (root volumes)"]


def test_the_floor_sums_each_column_of_the_priced_lines_only() -> None:
    capacity = {"unpriced": ["EKS control plane rate for eu-west-1 not recorded"],
                "atLeast": {"monthlyUsdIdle": 1022.51, "monthlyUsdAtMin": 202.72, "monthlyUsdAtMax": 2006.33}}
    assert at_least_line(capacity) == ("total at least $1,023 a month idle, $203 at min, $2,006 at max (the priced "
                                       "lines); not counted: EKS control plane rate for eu-west-1 not recorded")
    assert at_least_line({"unpriced": [], "atLeast": None}) is None
