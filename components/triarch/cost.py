"""What a stack holds and what it costs: per pool the GPUs and the monthly price at `min` and at `max` nodes, per
model the GPUs it holds, and the cluster's fixed costs. Prices are on-demand list prices from
templates/compat/prices.yaml, each with its source and date; a price the table lacks is reported as unknown,
never guessed. Written next to plan.json as capacity.json, so `triarch diff` and the pull-request comment can
compare two plans without planning again."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from triarch.catalog import Catalog, _read
from triarch.config import StackConfig
from triarch.paths import COMPAT_DIR
from triarch.planners.models import ModelPlan, replica_bounds
from triarch.planners.nodegroups import plan_pool

CAPACITY_FILE = "capacity.json"


@dataclass(frozen=True)
class Price:
    hourly_usd: float
    source: str
    source_date: str | None


@dataclass(frozen=True)
class PriceTable:
    retrieved: str
    hours_per_month: float
    instances: dict[str, dict[str, Price]]
    """Region -> instance type -> on-demand Linux price."""
    fixed: dict[str, dict[str, Price]]
    """Region -> eksControlPlane / natGateway -> hourly price."""
    not_offered: dict[str, dict[str, str]]
    """Region -> instance type -> why it has no on-demand price there (e.g. sold as Capacity Blocks only)."""

    def instance(self, region: str | None, instance_type: str | None) -> Price | None:
        if region is None or instance_type is None:
            return None
        return self.instances.get(region, {}).get(instance_type)


def _price(entry: dict[str, Any] | None, sources: dict[str, str]) -> Price | None:
    if not entry or entry.get("hourlyUsd") is None:
        return None
    source = str(entry["source"])
    date = entry.get("sourceDate")
    return Price(float(entry["hourlyUsd"]), sources.get(source, source), None if date is None else str(date))


@cache
def price_table() -> PriceTable:
    """templates/compat/prices.yaml: a row's `source` is a URL or a key of its `sources`."""
    raw = _read(COMPAT_DIR / "prices.yaml")
    sources = {str(k): str(v) for k, v in (raw.get("sources") or {}).items()}
    instances: dict[str, dict[str, Price]] = {}
    fixed: dict[str, dict[str, Price]] = {}
    not_offered: dict[str, dict[str, str]] = {}
    for region, entries in (raw.get("regions") or {}).items():
        rows = entries.get("instances") or {}
        instances[region] = {name: p for name, e in rows.items() if (p := _price(e, sources)) is not None}
        not_offered[region] = {name: str(e["notOffered"]) for name, e in rows.items() if e.get("notOffered")}
        fixed[region] = {name: p for name in ("eksControlPlane", "natGateway")
                         if (p := _price(entries.get(name), sources)) is not None}
    return PriceTable(str(raw["retrieved"]), float(raw["hoursPerMonth"]), instances, fixed, not_offered)


def _monthly(price: Price | None, count: int, table: PriceTable) -> float | None:
    return None if price is None else round(price.hourly_usd * count * table.hours_per_month, 2)


def _sum(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else round(sum(v for v in values if v is not None), 2)


def capacity_report(name: str, stack: StackConfig, models: list[ModelPlan], facts: Catalog,
                    table: PriceTable | None = None) -> dict[str, Any]:
    """capacity.json: pools (GPUs and monthly cost at min and max nodes), models (GPUs held), fixed costs, and the
    totals. Costs are null where a price is unknown (an existing cluster's nodes, a type the table lacks)."""
    table = table or price_table()
    cluster = stack.cluster
    region = stack.aws_region if cluster.create else None
    pools: list[dict[str, Any]] = []
    for group in stack.node_groups:
        pool = plan_pool(stack, group, facts)
        price = table.instance(region, group.instance_type)
        pools.append({
            "name": group.name, "instanceType": group.instance_type, "gpu": pool.gpu.product,
            "gpusPerNode": pool.gpus_per_node, "timeSlicedWays": pool.time_slicing_replicas,
            "minNodes": group.min, "maxNodes": group.max,
            "gpusAtMin": group.min * pool.gpus_per_node, "gpusAtMax": group.max * pool.gpus_per_node,
            "capacityType": group.capacity_type if cluster.create else None,
            "hourlyUsdPerNode": price.hourly_usd if price else None,
            "monthlyUsdAtMin": _monthly(price, group.min, table), "monthlyUsdAtMax": _monthly(price, group.max, table),
            "priceSource": price.source if price else None,
        })
    fixed: list[dict[str, Any]] = []
    if cluster.create:
        system = cluster.system_node_group
        price = table.instance(region, system.instance_type)
        fixed.append({"name": f"system nodes ({system.instance_type} x {system.min}-{system.max})",
                      "monthlyUsdAtMin": _monthly(price, system.min, table),
                      "monthlyUsdAtMax": _monthly(price, system.max, table),
                      "priceSource": price.source if price else None})
        fixed_prices = table.fixed.get(region or "", {})
        control_plane = fixed_prices.get("eksControlPlane")
        fixed.append({"name": "EKS control plane", "monthlyUsdAtMin": _monthly(control_plane, 1, table),
                      "monthlyUsdAtMax": _monthly(control_plane, 1, table),
                      "priceSource": control_plane.source if control_plane else None})
        nat = fixed_prices.get("natGateway")
        gateways = len(cluster.zones) if cluster.nat_gateways == "perZone" else 1
        fixed.append({"name": f"NAT gateways ({gateways}, before data processing)",
                      "monthlyUsdAtMin": _monthly(nat, gateways, table),
                      "monthlyUsdAtMax": _monthly(nat, gateways, table),
                      "priceSource": nat.source if nat else None})
    uses = []
    for plan in models:
        low, high = replica_bounds(plan)
        uses.append({"name": plan.name, "engine": plan.config.engine, "pool": plan.pool.name,
                     "gpusPerReplica": plan.gpus_per_replica, "replicasMin": low, "replicasMax": high})
    for pool_row, group in zip(pools, stack.node_groups, strict=True):
        # The idle floor: what runs with no traffic at all. Fixed replicas and autoscaling minimums (a Ray worker
        # group keeps its models' minimum replicas as workers) hold their GPUs, so their nodes stay up.
        held = sum(replica_bounds(m)[0] * m.gpus_per_replica for m in models if m.pool.name == group.name)
        schedulable = int(pool_row["gpusPerNode"]) * int(pool_row["timeSlicedWays"] or 1)
        nodes = max(group.min, -(-held // schedulable))
        price = table.instance(region, group.instance_type)
        pool_row.update({"gpusIdle": held, "nodesIdle": nodes, "monthlyUsdIdle": _monthly(price, nodes, table)})
    at_idle: list[float | None] = [row["monthlyUsdIdle"] for row in pools] + [row["monthlyUsdAtMin"] for row in fixed]
    at_min: list[float | None] = [row["monthlyUsdAtMin"] for row in [*pools, *fixed]]
    at_max: list[float | None] = [row["monthlyUsdAtMax"] for row in [*pools, *fixed]]
    return {
        "stack": name, "region": region, "pricesRetrieved": table.retrieved, "hoursPerMonth": table.hours_per_month,
        "pools": pools, "fixed": fixed, "models": uses,
        "monthlyUsdIdle": _sum(at_idle) if region else None,
        "monthlyUsdAtMin": _sum(at_min) if region else None,
        "monthlyUsdAtMax": _sum(at_max) if region else None,
    }


def _pool_view(pool: dict[str, Any] | None) -> dict[str, Any] | None:
    if pool is None:
        return None
    keys = ("instanceType", "minNodes", "maxNodes", "gpusAtMin", "gpusAtMax", "monthlyUsdAtMin", "monthlyUsdAtMax",
            "nodesIdle", "monthlyUsdIdle")
    return {key: pool.get(key) for key in keys}


def _totals(document: dict[str, Any] | None) -> dict[str, Any] | None:
    if document is None:
        return None
    return {"monthlyUsdIdle": document.get("monthlyUsdIdle"), "monthlyUsdAtMin": document.get("monthlyUsdAtMin"),
            "monthlyUsdAtMax": document.get("monthlyUsdAtMax")}


def capacity_change(base: dict[str, Any] | None, head: dict[str, Any] | None) -> dict[str, Any] | None:
    """Two capacity.json documents compared per pool and in total; a base written before capacity.json existed
    (None) leaves every `before` null."""
    if head is None:
        return None
    before = {p["name"]: p for p in (base or {}).get("pools", [])}
    after = {p["name"]: p for p in head.get("pools", [])}
    pools = [{"pool": name, "before": _pool_view(before.get(name)), "after": _pool_view(after.get(name))}
             for name in sorted(set(before) | set(after))]
    return {"baseKnown": base is not None, "pools": pools, "total": {"before": _totals(base), "after": _totals(head)}}
