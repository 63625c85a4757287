"""Prices per region: AWS's offer file read for the node's on-demand price (a hand-made slice in the offer file's
layout, tests/fixtures/prices), written into the price table by `triarch prices refresh`, and a region without a
price said in one line per plan, naming that command."""

from __future__ import annotations

import copy
import json
import re
import shutil
from datetime import date
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import StackWriter, compat_data, stack_document
from triarch import cli
from triarch.catalog import catalog
from triarch.config import from_pulumi_config
from triarch.cost import PriceTable, capacity_report, price_gap_line, price_gaps, price_table
from triarch.errors import TriarchError
from triarch.offline import read_stack_config
from triarch.paths import COMPAT_DIR
from triarch.planners.models import plan_models
from triarch.pricelist import OfferError, RegionPrices, region_prices, write_region
from triarch.review import review_markdown

SLICE = Path(__file__).resolve().parent / "fixtures" / "prices" / "AmazonEC2-us-east-1-slice.json"
US_EAST_1 = "https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/us-east-1/index.json"


def offer() -> dict[str, Any]:
    return copy.deepcopy(json.loads(SLICE.read_text(encoding="utf-8")))


# --- the offer file -------------------------------------------------------------------------------------------------

def test_the_node_price_is_linux_shared_without_software_in_use_on_demand() -> None:
    prices = region_prices(offer(), "us-east-1", ["g6.xlarge", "p5.48xlarge", "m7i.large", "p5e.48xlarge"], "slice")
    # The Windows, RHEL, dedicated, SQL Web and unused-reservation SKUs of g6.xlarge (901-905) are all left out.
    assert prices.hourly_usd == {"g6.xlarge": 0.8048, "m7i.large": 0.1008, "p5.48xlarge": 55.04}
    assert prices.missing == ["p5e.48xlarge"]  # a product without an on-demand term: Capacity Blocks only
    assert prices.published == "2026-11-20T18:04:11Z"
    assert prices.source == US_EAST_1


@pytest.mark.parametrize(("attribute", "value"), [
    ("operatingSystem", "Windows"), ("tenancy", "Dedicated"), ("preInstalledSw", "SQL Web"),
    ("capacitystatus", "UnusedCapacityReservation"), ("licenseModel", "Bring your own license"),
])
def test_a_node_sku_that_differs_in_one_attribute_is_not_the_node_price(attribute: str, value: str) -> None:
    data = offer()
    data["products"]["A6GXLNODE0000001"]["attributes"][attribute] = value
    for sku in ("A6GXLWIN00000002", "A6GXLDEDI0000003", "A6GXLUNUSED00004", "A6GXLSQLWEB00005", "A6GXLRHEL0000006"):
        del data["products"][sku]
    assert region_prices(data, "us-east-1", ["g6.xlarge"], "slice").missing == ["g6.xlarge"]


def test_a_product_of_another_family_is_not_an_instance_price() -> None:
    data = offer()
    data["products"]["EBSGP3STORAGE010"]["attributes"].update(
        {"instanceType": "g6.xlarge", "operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
         "capacitystatus": "Used", "licenseModel": "No License required"})
    assert region_prices(data, "us-east-1", ["g6.xlarge"], "slice").hourly_usd == {"g6.xlarge": 0.8048}


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda o: o.pop("publicationDate"), "slice: publicationDate: None is missing"),
    (lambda o: o["terms"].pop("OnDemand"), "slice: terms.OnDemand: NoneType is not a dict"),
    (lambda o: o["terms"]["OnDemand"]["A6GXLNODE0000001"]["A6GXLNODE0000001.JRTCKXETXF"]["priceDimensions"][
        "A6GXLNODE0000001.JRTCKXETXF.6YS6EN2CT7"].update(unit="GB-Mo"),
     "slice: terms.OnDemand.A6GXLNODE0000001.A6GXLNODE0000001.JRTCKXETXF.priceDimensions."
     "A6GXLNODE0000001.JRTCKXETXF.6YS6EN2CT7.unit: 'GB-Mo' is not an hourly price; allowed: 'Hrs'"),
    (lambda o: o["terms"]["OnDemand"]["A6GXLNODE0000001"]["A6GXLNODE0000001.JRTCKXETXF"]["priceDimensions"][
        "A6GXLNODE0000001.JRTCKXETXF.6YS6EN2CT7"]["pricePerUnit"].update(USD="n/a"),
     ".pricePerUnit.USD: 'n/a' is not a price; allowed: a decimal number of US dollars"),
    (lambda o: o["products"]["A6GXLNODE0000001"]["attributes"].update(regionCode="us-west-2"),
     "slice: products.A6GXLNODE0000001.attributes.regionCode: 'us-west-2' is not the region asked for; "
     "allowed: 'us-east-1'"),
    (lambda o: o["products"]["A6GXLWIN00000002"]["attributes"].update(operatingSystem="Linux"),
     "slice: products.A6GXLWIN00000002: a second on-demand Linux SKU for g6.xlarge; allowed: one per instance type"),
])
def test_an_offer_out_of_layout_is_refused_in_one_line(mutate: Any, message: str) -> None:
    data = offer()
    mutate(data)
    with pytest.raises(OfferError) as caught:
        region_prices(data, "us-east-1", ["g6.xlarge"], "slice")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


# --- the price table written ----------------------------------------------------------------------------------------

def test_refresh_writes_the_region_rows_dated_and_sourced_keeping_the_rest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "prices.yaml"
    shutil.copy(COMPAT_DIR / "prices.yaml", table)
    before = yaml.safe_load(table.read_text(encoding="utf-8"))
    assert cli.main(["prices", "refresh", "--region", "us-east-1", "--from", str(SLICE), "--file", str(table)]) == 0
    out = capsys.readouterr().out
    assert "us-east-1: 3 of" in out and "offer published 2026-11-20T18:04:11Z" in out
    after = yaml.safe_load(table.read_text(encoding="utf-8"))
    rows = after["regions"]["us-east-1"]["instances"]
    assert rows["g6.xlarge"] == {"hourlyUsd": 0.8048, "source": US_EAST_1, "sourceDate": date(2026, 11, 20)}
    assert rows["p5.48xlarge"]["hourlyUsd"] == 55.04
    assert rows["p5e.48xlarge"]["hourlyUsd"] is None and rows["p5e.48xlarge"]["notOffered"]
    assert set(rows) == set(catalog().instances)  # every type Triarch knows has a row, priced or not
    # Everything but the region's instance rows is as it was: the fixed prices, the rates, the other regions.
    for key in ("eksControlPlane", "natGateway", "publicIpv4", "storage", "usage"):
        assert after["regions"]["us-east-1"][key] == before["regions"]["us-east-1"][key]
    assert {r: v for r, v in after["regions"].items() if r != "us-east-1"} == \
        {r: v for r, v in before["regions"].items() if r != "us-east-1"}
    assert after["sources"] == before["sources"]


def test_a_region_the_table_lacks_is_added() -> None:
    text = (COMPAT_DIR / "prices.yaml").read_text(encoding="utf-8")
    prices = RegionPrices("ca-central-1", "2026-11-20T18:04:11Z", "URL", {"g6.xlarge": 0.9}, ["p5.48xlarge"])
    data = yaml.safe_load(write_region(text, prices, ["g6.xlarge", "p5.48xlarge"]))
    assert data["regions"]["ca-central-1"]["instances"] == {
        "g6.xlarge": {"hourlyUsd": 0.9, "source": "URL", "sourceDate": date(2026, 11, 20)},
        "p5.48xlarge": {"hourlyUsd": None, "notOffered": "no On-Demand Linux SKU in the offer file", "source": "URL",
                        "sourceDate": date(2026, 11, 20)}}
    assert data["regions"]["us-east-1"] == yaml.safe_load(text)["regions"]["us-east-1"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--region", "us-west"], "error: --region: 'us-west' is not an AWS region code; allowed: e.g. us-east-1"),
    (["--region", "us-east-1", "--region", "us-west-2", "--from", str(SLICE)],
     "error: --from: one offer file is one region's, but --region names 2; allowed: exactly one --region with --from"),
    (["--region", "us-east-1", "--from", "missing.json"], "error: --from: 'missing.json' does not exist"),
    (["--region", "us-west-2", "--from", str(SLICE)],
     "regionCode: 'us-east-1' is not the region asked for; allowed: 'us-west-2'"),
])
def test_refresh_refuses_bad_input_in_one_line(argv: list[str], message: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "prices.yaml"
    shutil.copy(COMPAT_DIR / "prices.yaml", table)
    assert cli.main(["prices", "refresh", *argv, "--file", str(table)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert table.read_text(encoding="utf-8") == (COMPAT_DIR / "prices.yaml").read_text(encoding="utf-8")


# --- a region without prices ----------------------------------------------------------------------------------------

def in_region(config: dict[str, Any], region: str) -> dict[str, Any]:
    config["aws:region"] = region
    config["triarch:cluster"]["zones"] = [f"{region}a", f"{region}b"]
    return config


GPU_REGIONS = {"af-south-1", "ap-east-1", "ap-northeast-1", "ap-northeast-2", "ap-northeast-3", "ap-south-1",
               "ap-southeast-1", "ap-southeast-2", "ap-southeast-3", "ca-central-1", "eu-central-1", "eu-north-1",
               "eu-south-1", "eu-south-2", "eu-west-1", "eu-west-2", "eu-west-3", "me-central-1", "me-south-1",
               "us-east-1", "us-east-2", "us-west-1", "us-west-2"}
SKYPILOT = "https://github.com/skypilot-org/skypilot-catalog/blob/00148f2af3672e2229b4f7bf8157d5a3f36e3c35/" \
    "catalogs/v8/aws/vms.csv"
# The fixed prices and the rates the shipped dev stack's plan prices (no pool above gp3's included throughput), less
# public IPv4: its rate is recorded in every listed region.
DEV_OTHERS = ["eksControlPlane", "natGateway", "ebsGp3", "efsStandard", "natGatewayProcessed",
              "efsElasticRead", "efsElasticWrite", "logsIngested", "logsStored"]


def test_every_region_shipped_is_a_gpu_region_with_a_source() -> None:
    text = (COMPAT_DIR / "prices.yaml").read_text(encoding="utf-8")
    table, header = yaml.safe_load(text), text.split("retrieved:")[0]
    assert set(table["regions"]) == GPU_REGIONS  # the regions listed before (p5en, g5g) are among them
    gpus = {name for name, row in compat_data("instances")["instances"].items() if row.get("gpus")}
    for region, entries in table["regions"].items():
        assert region in header  # named in the header, which says why it is listed
        rows = entries.get("instances") or {}
        assert any(rows[t]["hourlyUsd"] for t in gpus & set(rows)), region  # an NVIDIA GPU type priced there
        for name, row in rows.items():
            assert row["source"] in table["sources"] or row["source"].startswith("https://"), (region, name)


@pytest.mark.parametrize(("region", "instance_type", "hourly"), [
    # The catalog's Price of the type in the region, as read (skypilot-catalog@00148f2a, catalogs/v8/aws/vms.csv).
    ("us-west-2", "g6.xlarge", 0.8048), ("ap-northeast-1", "g6.xlarge", 1.1672), ("eu-north-1", "g5.12xlarge", 6.01593),
    ("eu-south-2", "g6e.48xlarge", 31.75027), ("ap-south-1", "p5.48xlarge", 66.048), ("ca-central-1", "p4d.24xlarge",
    25.25174), ("me-south-1", "g4dn.xlarge", 0.645), ("ap-southeast-1", "p4de.24xlarge", 32.93646),
    ("eu-west-1", "m6i.large", 0.107), ("ap-northeast-2", "m7i.2xlarge", 0.4956), ("us-east-1", "g4dn.metal", 7.824),
    ("us-west-2", "p6-b200.48xlarge", 113.9328),
])
def test_a_catalog_row_is_the_regions_price(region: str, instance_type: str, hourly: float) -> None:
    price = price_table().instance(region, instance_type)
    assert price is not None and (price.hourly_usd, price.source) == (hourly, SKYPILOT)


def test_p5e_without_an_on_demand_price_is_not_offered_and_a_type_a_region_lacks_has_no_row() -> None:
    table = price_table()
    assert "p5e.48xlarge" in table.not_offered["us-west-2"] and table.instance("us-west-2", "p5e.48xlarge") is None
    assert table.instance("us-west-1", "g6.xlarge") is None and "g6.xlarge" not in table.not_offered["us-west-1"]


@pytest.mark.parametrize(("region", "hourly", "idle", "at_max", "system_min", "system_max"), [
    # dev: one g6.xlarge pool (0-2 nodes, 1 held idle by its model) and m7i.large system nodes (2-4); by hand from
    # the catalog's prices: g6.xlarge x 730 h, m7i.large x 730 h, rounded to cents.
    ("us-west-2", 0.8048, 587.5, 1175.01, 147.17, 294.34),       # 0.8048, 0.1008
    ("ap-northeast-1", 1.1672, 852.06, 1704.11, 190.09, 380.18),  # 1.1672, 0.1302
    ("eu-north-1", 0.8536, 623.13, 1246.26, 156.37, 312.73),      # 0.8536, 0.1071
])
def test_a_stack_in_a_gpu_region_prices_its_pools_and_names_the_rest_once(
        region: str, hourly: float, idle: float, at_max: float, system_min: float, system_max: float,
        write_stack: StackWriter) -> None:
    stack = from_pulumi_config(read_stack_config(write_stack(in_region(stack_document("dev"), region)))[0])
    report = capacity_report("dev", stack, plan_models(stack, catalog()), catalog())
    (pool,) = report["pools"]
    assert (pool["hourlyUsdPerNode"], pool["monthlyUsdIdle"], pool["monthlyUsdAtMin"], pool["monthlyUsdAtMax"],
            pool["priceSource"]) == (hourly, idle, 0.0, at_max, SKYPILOT)
    fixed = {row["key"]: row for row in report["fixed"]}
    system = fixed.pop("systemNodes")
    assert (system["monthlyUsdIdle"], system["monthlyUsdAtMin"], system["monthlyUsdAtMax"]) == \
        (system_min, system_min, system_max)
    assert fixed.pop("publicIpv4")["monthlyUsdAtMax"] == 3.65  # $0.005 an hour in every region x 730 h
    assert all(row["monthlyUsdAtMax"] is None for row in fixed.values())  # control plane, NAT, volumes, EFS
    assert report["monthlyUsdAtMax"] is None  # a total with an unknown part is unknown, never a guess
    assert report["priceGaps"] == {"region": region, "instances": [], "others": DEV_OTHERS, "recorded": True}
    assert price_gap_line(report) == (
        f"{region}: no price is recorded for {', '.join(DEV_OTHERS)} in templates/compat/prices.yaml, so those "
        f"costs are unknown; add those {region} rows by hand, with their sources")


def test_a_nat_price_recorded_for_a_region_is_counted_and_not_named(write_stack: StackWriter) -> None:
    # us-east-2: "$0.045/hour in US East" and $0.045 per GB (cloudburn, 2026-02-24); ap-southeast-1: $0.059 for both.
    table = price_table()
    assert (table.fixed["ap-southeast-1"]["natGateway"].hourly_usd,
            table.usage["ap-southeast-1"]["natGatewayProcessed"].usd) == (0.059, 0.059)
    stack = from_pulumi_config(read_stack_config(write_stack(in_region(stack_document("dev"), "us-east-2")))[0])
    report = capacity_report("dev", stack, plan_models(stack, catalog()), catalog())
    nat = {row["key"]: row for row in report["fixed"]}["natGateways"]
    assert (nat["monthlyUsdIdle"], nat["monthlyUsdAtMax"]) == (32.85, 32.85)  # one gateway: 0.045 x 730 h
    assert {row["key"]: row["usd"] for row in report["usage"]}["natGatewayProcessed"] == 0.045
    assert report["priceGaps"]["others"] == [k for k in DEV_OTHERS if k not in ("natGateway", "natGatewayProcessed")]


def test_a_type_the_region_lacks_is_named_with_the_command() -> None:
    # A plan never gets here for a listed region (a type it has no row for is refused: tests/test_region_costs.py);
    # the line still names the command wherever instance prices are missing.
    gaps = {"region": "us-west-1", "instances": ["g6.xlarge"], "others": DEV_OTHERS, "recorded": True}
    line = price_gap_line({"priceGaps": gaps})
    assert line == ("us-west-1: no price is recorded for g6.xlarge, " + ", ".join(DEV_OTHERS) + " in "
                    "templates/compat/prices.yaml, so those costs are unknown; `triarch prices refresh --region "
                    "us-west-1` records the instance types' from AWS's price list; add the other us-west-1 rows by "
                    "hand, with their sources")


def test_the_rates_a_plan_does_not_price_are_not_named(write_stack: StackWriter) -> None:
    config = in_region(stack_document("dev"), "us-west-2")
    config["triarch:serving"] = {**(config.get("triarch:serving") or {}), "storageClass": "gp3"}
    stack = from_pulumi_config(read_stack_config(write_stack(config))[0])
    others = price_gaps(stack, price_table())["others"]  # type: ignore[index]
    assert others == ["eksControlPlane", "natGateway", "ebsGp3", "natGatewayProcessed",
                      "logsIngested", "logsStored"]  # the model caches are not on EFS: no EFS rate is missing


def test_gp3_throughput_is_named_where_a_pool_provisions_more_than_the_included(write_stack: StackWriter) -> None:
    config = in_region(stack_document("dev"), "us-west-2")
    config["triarch:nodeGroups"][0]["diskThroughputMiBps"] = 500
    stack = from_pulumi_config(read_stack_config(write_stack(config))[0])
    others = price_gaps(stack, price_table())["others"]  # type: ignore[index]
    assert others[:4] == ["eksControlPlane", "natGateway", "ebsGp3", "ebsGp3Throughput"]


def test_a_region_with_no_rows_says_so(write_stack: StackWriter) -> None:
    stack = from_pulumi_config(read_stack_config(write_stack(in_region(stack_document("dev"), "ap-southeast-4")))[0])
    line = price_gap_line({"priceGaps": price_gaps(stack, price_table())})
    assert line is not None and line.startswith("ap-southeast-4: no on-demand prices are recorded in ")
    assert "triarch prices refresh --region ap-southeast-4" in line


def test_a_priced_region_and_a_type_not_sold_on_demand_say_nothing(write_stack: StackWriter) -> None:
    stack = from_pulumi_config(read_stack_config(write_stack(stack_document("dev")))[0])
    assert price_gaps(stack, price_table()) is None
    table = price_table()
    only = PriceTable(table.retrieved, table.hours_per_month, {"us-east-1": {
        k: v for k, v in table.instances["us-east-1"].items() if k != "g6.xlarge"}}, table.fixed,
        {"us-east-1": {"g6.xlarge": "Capacity Blocks only"}}, table.storage, table.usage)
    assert price_gaps(stack, only) is None


def test_the_plan_and_its_review_say_it_once(write_stack: StackWriter, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = write_stack(in_region(stack_document("dev"), "ap-southeast-4"))  # a region the table does not list
    out_dir = tmp_path / "review" / "head" / "test"
    assert cli.main(["plan", "--stack-file", str(path), "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert len(re.findall(r"triarch prices refresh --region ap-southeast-4", out)) == 1
    assert json.loads((out_dir / "capacity.json").read_text())["priceGaps"]["region"] == "ap-southeast-4"
    comment = review_markdown(tmp_path / "review")
    assert len(re.findall(r":warning: ap-southeast-4: no on-demand prices are recorded", comment)) == 1


def test_an_offer_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(TriarchError):
        region_prices([], "us-east-1", ["g6.xlarge"], "slice")
