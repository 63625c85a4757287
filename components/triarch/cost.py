"""What a stack holds and what it costs: per pool the GPUs and the monthly price idle, at `min` and at `max` nodes,
per model the GPUs it holds, the cluster's fixed costs (system nodes, control plane, NAT gateways and their public
addresses, root volumes, Prometheus' volume, the model caches' file system), and the rates of what is billed by use
(data through the NAT, file system reads and writes, control-plane logs), whose quantity depends on traffic and so is
never added to a total. Prices are on-demand list prices from templates/compat/prices.yaml, each with its source and
date; a price the table lacks is reported as unknown, never guessed. Written next to plan.json as capacity.json, so
`triarch diff` and the pull-request comment can compare two plans without planning again."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

from triarch.catalog import Catalog, _read, catalog
from triarch.config import NAMESPACE, NodeGroupConfig, StackConfig, key_path
from triarch.guardrails.placement_pools import cpu_millicores, memory_mib
from triarch.paths import COMPAT_DIR
from triarch.planners import picker
from triarch.planners.adapters import adapter_cost
from triarch.planners.kv_offload import offload_cost
from triarch.planners.model_plan import ModelPlan
from triarch.planners.models import replica_bounds
from triarch.planners.nodegroups import BASELINE_PULL, image_pull, plan_pool
from triarch.pricelist import REFRESH_COMMAND
from triarch.tuner import GIB

CAPACITY_FILE = "capacity.json"


@dataclass(frozen=True)
class Price:
    hourly_usd: float
    source: str
    source_date: str | None


@dataclass(frozen=True)
class Rate:
    """A price per unit of something stored (GB-month) or moved (GB)."""
    usd: float
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
    storage: dict[str, dict[str, Rate]] = field(default_factory=dict)
    """Region -> ebsGp3 / efsStandard -> USD per GB-month."""
    usage: dict[str, dict[str, Rate]] = field(default_factory=dict)
    """Region -> natGatewayProcessed / efsElasticRead / efsElasticWrite / logsIngested / logsStored -> USD per GB
    (logsStored: per GB-month)."""

    def instance(self, region: str | None, instance_type: str | None) -> Price | None:
        if region is None or instance_type is None:
            return None
        return self.instances.get(region, {}).get(instance_type)


def _sourced(entry: dict[str, Any] | None, sources: dict[str, str], key: str) -> tuple[float, str, str | None] | None:
    """A row's amount under `key`, its source (a URL, or a key of `sources`) and date; None without an amount."""
    if not entry or entry.get(key) is None:
        return None
    source = str(entry["source"])
    date = entry.get("sourceDate")
    return float(entry[key]), sources.get(source, source), None if date is None else str(date)


def _price(entry: dict[str, Any] | None, sources: dict[str, str]) -> Price | None:
    row = _sourced(entry, sources, "hourlyUsd")
    return None if row is None else Price(*row)


def _rate(entry: dict[str, Any] | None, sources: dict[str, str]) -> Rate | None:
    row = _sourced(entry, sources, "usd")
    return None if row is None else Rate(*row)


@cache
def price_table() -> PriceTable:
    """templates/compat/prices.yaml: a row's `source` is a URL or a key of its `sources`."""
    raw = _read(COMPAT_DIR / "prices.yaml")
    sources = {str(k): str(v) for k, v in (raw.get("sources") or {}).items()}
    instances: dict[str, dict[str, Price]] = {}
    fixed: dict[str, dict[str, Price]] = {}
    not_offered: dict[str, dict[str, str]] = {}
    storage: dict[str, dict[str, Rate]] = {}
    usage: dict[str, dict[str, Rate]] = {}
    for region, entries in (raw.get("regions") or {}).items():
        rows = entries.get("instances") or {}
        instances[region] = {name: p for name, e in rows.items() if (p := _price(e, sources)) is not None}
        not_offered[region] = {name: str(e["notOffered"]) for name, e in rows.items() if e.get("notOffered")}
        fixed[region] = {name: p for name in ("eksControlPlane", "natGateway", "publicIpv4")
                         if (p := _price(entries.get(name), sources)) is not None}
        storage[region] = {name: r for name, e in (entries.get("storage") or {}).items()
                           if (r := _rate(e, sources)) is not None}
        usage[region] = {name: r for name, e in (entries.get("usage") or {}).items()
                         if (r := _rate(e, sources)) is not None}
    return PriceTable(str(raw["retrieved"]), float(raw["hoursPerMonth"]), instances, fixed, not_offered, storage,
                      usage)


def _monthly(price: Price | None, count: int, table: PriceTable) -> float | None:
    return None if price is None else round(price.hourly_usd * count * table.hours_per_month, 2)


def _stored(rate: Rate | None, gib: float) -> float | None:
    return None if rate is None else round(rate.usd * gib, 2)


def _fixed(key: str, name: str, idle: float | None, low: float | None, high: float | None,
           source: Price | Rate | None) -> dict[str, Any]:
    """One fixed-cost line; `key` stays the same when the name's counts change, so two plans compare by it."""
    return {"key": key, "name": name, "monthlyUsdIdle": idle, "monthlyUsdAtMin": low, "monthlyUsdAtMax": high,
            "priceSource": source.source if source else None}


def reservation_rows(group: NodeGroupConfig, path: str, price: Price | None, table: PriceTable) -> list[dict[str, Any]]:
    """A pool's reservations as the cost counts them, each billed whether its instances run or not: an On-Demand
    Capacity Reservation at the on-demand rate while it exists (AWS EC2 User Guide, "Capacity Reservation pricing
    and billing": "charged at the equivalent On-Demand rate whether you run instances in reserved capacity or
    not"), a Capacity Block at the price its purchase recorded, as the stack gives it (Triarch never buys one).
    An instance running in a reservation is paid once, by the reservation."""
    rows = []
    for i, term in enumerate(group.reservations):
        block = term.type == "capacityBlock"
        hourly = term.hourly_usd if block else (price.hourly_usd if price else None)
        source = f"as the stack records it ({path}.reservations[{i}].hourlyUsd)" if block else (
            price.source if price else None)
        monthly = None if hourly is None or term.count is None else round(
            hourly * term.count * table.hours_per_month, 2)
        rows.append({"reservation": reservation_name(term.id, term.tags), "type": term.type, "count": term.count,
                     "hourlyUsdPerNode": hourly, "monthlyUsd": monthly, "priceSource": source,
                     "endsAt": term.ends_at.isoformat().replace("+00:00", "Z") if term.ends_at else None})
    return rows


def reservation_name(reservation_id: str | None, tags: dict[str, str] | None) -> str:
    """How a report names a reservation: its id, or the tags that select it."""
    if reservation_id is not None:
        return reservation_id
    return "tags " + ", ".join(f"{k}={v}" for k, v in sorted((tags or {}).items()))


def _with_reservations(price: Price | None, nodes: int, reserved: list[dict[str, Any]], reserved_only: bool,
                       table: PriceTable) -> float | None:
    """A pool's monthly cost at `nodes` nodes with reservations: every reservation's own (it bills used or not),
    plus the nodes beyond the instances they hold at the pool's on-demand price (none where the pool runs on
    reservations only). A reservation without a count adds nothing (the report names it as not counted)."""
    held = sum(int(r["count"]) for r in reserved if r["count"] is not None)
    beyond = 0 if reserved_only and all(r["count"] is not None for r in reserved) else max(0, nodes - held)
    extra = _monthly(price, beyond, table) if beyond else 0.0
    own: list[float | None] = [r["monthlyUsd"] for r in reserved if r["count"] is not None]
    if extra is None or any(v is None for v in own):
        return None
    return round(extra + sum(v for v in own if v is not None), 2)


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
    for index, group in enumerate(stack.node_groups):
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
        if group.reservations and cluster.create:
            reserved = reservation_rows(group, key_path(f"{NAMESPACE}:nodeGroups", index), price, table)
            counts = [r["count"] for r in reserved]
            pools[-1].update({
                "reservations": reserved, "reservedOnly": group.reserved_only,
                "reservedNodes": None if None in counts else sum(counts),
                "monthlyUsdAtMin": _with_reservations(price, group.min, reserved, group.reserved_only, table),
                "monthlyUsdAtMax": _with_reservations(price, group.max, reserved, group.reserved_only, table)})
    uses = []
    for plan in models:
        low, high = replica_bounds(plan)
        uses.append({"name": plan.name, "engine": plan.config.engine, "pool": plan.pool.name,
                     "gpusPerReplica": plan.gpus_per_replica, "replicasMin": low, "replicasMax": high,
                     "coldStart": plan.cold_start.document() if plan.cold_start else None})
        if plan.role is not None:  # a split model's role: its decode role under the model's name
            uses[-1]["role"] = plan.role
        if picker.routed(plan):
            uses[-1]["picker"] = _picker_cost(stack, region, facts, table)
        if plan.kv_offload_gib:  # host memory: in the node's price (planners/kv_offload.py)
            uses[-1]["kvOffload"] = offload_cost(plan)
        if plan.config.adapters:  # LoRA slots: GPU memory of the replica's own, nothing more to pay
            uses[-1]["adapters"] = adapter_cost(plan.config, plan.sizing.memory.lora_slots)
        if plan.hub is not None:  # what the sizing read from the Hub: the plan is reproducible at that commit
            uses[-1]["hub"] = {"repo": plan.hub.repo, "revision": plan.hub.revision, "commit": plan.hub.commit,
                               "pinned": plan.config.revision is not None}
    for pool_row, group in zip(pools, stack.node_groups, strict=True):
        # The idle floor: what runs with no traffic at all. Fixed replicas and autoscaling minimums (a Ray worker
        # group keeps its models' minimum replicas as workers) hold their GPUs, so their nodes stay up.
        # Warm capacity is held idle on purpose: its nodes run with nothing on them until a replica comes.
        on_pool = [m for m in models if m.pool.name == group.name]
        warm = sum(m.config.warm_replicas * m.gpus_per_replica for m in on_pool)
        held = sum(replica_bounds(m)[0] * m.gpus_per_replica for m in on_pool) + warm
        schedulable = int(pool_row["gpusPerNode"]) * int(pool_row["timeSlicedWays"] or 1)
        nodes = max(group.min, -(-held // schedulable))
        price = table.instance(region, group.instance_type)
        idle = _with_reservations(price, nodes, pool_row["reservations"], group.reserved_only, table) \
            if pool_row.get("reservations") else _monthly(price, nodes, table)
        pool_row.update({"gpusIdle": held, "gpusWarm": warm, "nodesIdle": nodes, "monthlyUsdIdle": idle})
        for use, warmed in ((u, m) for u in uses for m in on_pool if m.name == u["name"]):
            if warmed.config.warm_replicas:
                # What the warm capacity alone keeps running: its own nodes' worth, at the pool's price.
                warm_nodes = -(-warmed.config.warm_replicas * warmed.gpus_per_replica // schedulable)
                use["warm"] = {"replicas": warmed.config.warm_replicas,
                               "gpus": warmed.config.warm_replicas * warmed.gpus_per_replica,
                               "nodes": warm_nodes, "monthlyUsd": _monthly(price, warm_nodes, table)}
    fixed = fixed_costs(stack, models, pools, table) if cluster.create and region else []
    at_idle: list[float | None] = [row["monthlyUsdIdle"] for row in [*pools, *fixed]]
    at_min: list[float | None] = [row["monthlyUsdAtMin"] for row in [*pools, *fixed]]
    at_max: list[float | None] = [row["monthlyUsdAtMax"] for row in [*pools, *fixed]]
    unpriced = unpriced_lines(stack, pools, fixed, table) if region else []
    return {
        "stack": name, "region": region, "pricesRetrieved": table.retrieved, "hoursPerMonth": table.hours_per_month,
        "priceGaps": price_gaps(stack, table) if cluster.create and region else None,
        "pools": pools, "fixed": fixed, "models": uses,
        "usage": usage_rates(stack, models, table) if cluster.create and region else [],
        "monthlyUsdIdle": _sum(at_idle) if region else None,
        "monthlyUsdAtMin": _sum(at_min) if region else None,
        "monthlyUsdAtMax": _sum(at_max) if region else None,
        "atLeast": _at_least(at_idle, at_min, at_max) if unpriced else None,
        "unpriced": unpriced,
    }


UNPRICED_RATE = {"eksControlPlane": ("EKS control plane rate", ""), "natGateways": ("NAT gateway rate", ""),
                 "publicIpv4": ("public IPv4 rate", ""), "ebsRootVolumes": ("EBS gp3 rate", " (root volumes)"),
                 "ebsRootThroughput": ("EBS gp3 throughput rate", " (root volumes)"),
                 "prometheusVolume": ("EBS gp3 rate", " (Prometheus volume)"),
                 "efsModelCaches": ("EFS Standard rate", " (model caches)")}
"""What a fixed-cost line is priced by, as the partial total names it where the region has no such rate."""


def unpriced_lines(stack: StackConfig, pools: list[dict[str, Any]], fixed: list[dict[str, Any]],
                   table: PriceTable) -> list[str]:
    """Each line of a priced region's total that has no price, named with what is missing: the total of the others
    is then a floor ("at least"), never a guess."""
    region = stack.aws_region or ""
    offered = table.not_offered.get(region, {})

    def instance(name: str, where: str) -> str:
        if name in offered:
            return f"{name} has no on-demand price in {region}: {offered[name]} ({where})"
        return f"{name} price for {region} not recorded ({where})"

    missing = [instance(p["instanceType"], f"pool {p['name']}") for p in pools
               if p["instanceType"] and p["monthlyUsdAtMax"] is None]
    missing += [f"reservation {r['reservation']} of pool {p['name']} has no count, so the on-demand rate its unused "
                "instances bill is not counted" for p in pools for r in p.get("reservations") or []
                if r["count"] is None and p["monthlyUsdAtMax"] is not None]
    for row in fixed:
        if row["monthlyUsdAtMax"] is not None:
            continue
        if row["key"] == "systemNodes":
            missing.append(instance(stack.cluster.system_node_group.instance_type, "system nodes"))
        else:
            rate, where = UNPRICED_RATE.get(row["key"], (row["name"], ""))
            missing.append(f"{rate} for {region} not recorded{where}")
    return missing


def _at_least(*columns: list[float | None]) -> dict[str, float] | None:
    """The sum of the priced lines in each column, where some line has no price; None where no line has one."""
    if all(v is None for column in columns for v in column):
        return None
    return {key: round(sum(v for v in column if v is not None), 2) for key, column in zip(COST_COLUMNS, columns,
                                                                                             strict=True)}


def at_least_line(capacity: dict[str, Any]) -> str | None:
    """The one line a plan says where its total is a floor: the priced lines' sum and each line left out."""
    missing = capacity.get("unpriced") or []
    if not missing:
        return None
    floor = capacity.get("atLeast")
    if floor is None:
        return f"total unknown: no line has a price; not counted: {'; '.join(missing)}"
    idle, low, high = (f"${floor[key]:,.0f}" for key in COST_COLUMNS)
    return (f"total at least {idle} a month idle, {low} at min, {high} at max (the priced lines); not counted: "
            f"{'; '.join(missing)}")


FIXED_PRICES = ("eksControlPlane", "natGateway", "publicIpv4")
STORAGE_RATES = ("ebsGp3", "ebsGp3Throughput", "efsStandard")
USAGE_RATES = ("natGatewayProcessed", "efsElasticRead", "efsElasticWrite", "logsIngested", "logsStored")


def _faster_pull(stack: StackConfig) -> dict[str, int]:
    """Per pool, the root volume throughput its nodes provision above gp3's included 125 MiB/s."""
    return {group.name: image_pull(group, catalog()).root_mib_s - BASELINE_PULL.root_mib_s
            for group in stack.node_groups if group.instance_type}


def _rates_priced(stack: StackConfig) -> list[str]:
    """The storage and usage rates a stack's plan prices (fixed_costs, usage_rates): gp3 throughput only where a pool
    provisions more than the included, the EFS rates only where the model caches are on EFS."""
    efs = stack.serving.storage_class is None
    faster = any(_faster_pull(stack).values())
    return [k for k in (*STORAGE_RATES, *USAGE_RATES)
            if (efs or not k.startswith("efs")) and (faster or k != "ebsGp3Throughput")]


def price_gaps(stack: StackConfig, table: PriceTable) -> dict[str, Any] | None:
    """What a created cluster's region has no recorded price for (its pools' and system nodes' instance types, the
    fixed hourly prices, the storage and usage rates its plan prices), or None where nothing is missing. A
    type the region does not sell on demand (notOffered) is not a gap: the table says why it has no price."""
    region = stack.aws_region or ""
    types = [g.instance_type for g in stack.node_groups if g.instance_type] + \
        [stack.cluster.system_node_group.instance_type]
    instances = sorted({t for t in types if table.instance(region, t) is None
                        and t not in table.not_offered.get(region, {})})
    recorded = {**table.storage.get(region, {}), **table.usage.get(region, {})}
    others = [k for k in FIXED_PRICES if k not in table.fixed.get(region, {})] + \
        [k for k in _rates_priced(stack) if k not in recorded]
    if not instances and not others:
        return None
    return {"region": region, "instances": instances, "others": others,
            "recorded": bool(table.instances.get(region))}


def price_gap_line(capacity: dict[str, Any]) -> str | None:
    """The one line a plan says where its region lacks prices, naming the command that records them."""
    gaps = capacity.get("priceGaps")
    if not gaps:
        return None
    region = gaps["region"]
    missing = [*gaps["instances"], *gaps["others"]]
    what = "no on-demand prices are recorded" if not gaps["recorded"] else \
        f"no price is recorded for {', '.join(missing)}"
    fix = []
    if gaps["instances"]:
        fix.append(f"`{REFRESH_COMMAND.format(region=region)}` records the instance types' from AWS's price list")
    if gaps["others"]:
        # The refresh reads EC2's offer only: EKS, VPC, EBS, EFS and CloudWatch prices are rows added by hand.
        which = f"the other {region} rows" if gaps["instances"] else f"those {region} rows"
        fix.append(f"add {which} by hand, with their sources")
    return f"{region}: {what} in templates/compat/prices.yaml, so those costs are unknown; {'; '.join(fix)}"


def _picker_cost(stack: StackConfig, region: str | None, facts: Catalog, table: PriceTable) -> dict[str, Any]:
    """An endpoint picker's pods (two pickers and two proxies, planners/picker.py): what they request, and on a
    created cluster their share of a system node's price by CPU requested (the system nodes' own row counts the
    nodes; this says how much of them the pickers take, never added to a total)."""
    pods = ((picker.PICKER_RESOURCES, picker.PICKER_REPLICAS), (picker.PROXY_RESOURCES, picker.PROXY_REPLICAS))
    cpu = sum(cpu_millicores(r["requests"]["cpu"]) * n for r, n in pods)
    memory = sum(memory_mib(r["requests"]["memory"]) * n for r, n in pods)
    row: dict[str, Any] = {"pods": sum(n for _, n in pods), "cpuMillicores": cpu, "memoryMiB": memory,
                           "monthlyUsdShare": None}
    system = stack.cluster.system_node_group
    instance = facts.instances.get(system.instance_type)
    price = table.instance(region, system.instance_type) if stack.cluster.create and region else None
    if price is not None and instance is not None:
        row["monthlyUsdShare"] = round(price.hourly_usd * table.hours_per_month * cpu / (instance.vcpus * 1000), 2)
        row["of"] = f"{system.instance_type} ({instance.vcpus} vCPU)"
    return row


def fixed_costs(stack: StackConfig, models: list[ModelPlan], pools: list[dict[str, Any]],
                table: PriceTable) -> list[dict[str, Any]]:
    """A created cluster's costs besides its GPU nodes, idle, at min and at max: they do not depend on traffic."""
    cluster, region = stack.cluster, stack.aws_region or ""
    system = cluster.system_node_group
    hourly = table.fixed.get(region, {})
    storage = table.storage.get(region, {})
    price = table.instance(region, system.instance_type)
    low, high = _monthly(price, system.min, table), _monthly(price, system.max, table)
    rows = [_fixed("systemNodes", f"system nodes ({system.instance_type} x {system.min}-{system.max})", low, low,
                   high, price)]
    control_plane = hourly.get("eksControlPlane")
    one = _monthly(control_plane, 1, table)
    rows.append(_fixed("eksControlPlane", "EKS control plane", one, one, one, control_plane))
    gateways = len(cluster.zones) if cluster.nat_gateways == "perZone" else 1
    nat = _monthly(hourly.get("natGateway"), gateways, table)
    rows.append(_fixed("natGateways", f"NAT gateways ({gateways}, before data processed)", nat, nat, nat,
                       hourly.get("natGateway")))
    ipv4 = _monthly(hourly.get("publicIpv4"), gateways, table)
    rows.append(_fixed("publicIpv4", f"public IPv4 addresses ({gateways}, the NAT gateways' Elastic IPs)", ipv4, ipv4,
                       ipv4, hourly.get("publicIpv4")))
    # Every node's root volume is gp3, sized by its pool's diskGiB: it costs while the node runs.
    disks = {group.name: group.disk_gib for group in stack.node_groups}
    gib = {when: system.disk_gib * count + sum(disks[p["name"]] * int(p[nodes]) for p in pools)
           for when, count, nodes in (("idle", system.min, "nodesIdle"), ("min", system.min, "minNodes"),
                                      ("max", system.max, "maxNodes"))}
    gp3 = storage.get("ebsGp3")
    name = f"EBS root volumes (gp3: idle {gib['idle']} GiB, {gib['min']}-{gib['max']} GiB)"
    rows.append(_fixed("ebsRootVolumes", name,
                       _stored(gp3, gib["idle"]), _stored(gp3, gib["min"]), _stored(gp3, gib["max"]), gp3))
    # Throughput above gp3's included 125 MiB/s, where a pool's nodes unpack images on the root volume in parallel.
    faster = _faster_pull(stack)
    if any(faster.values()):
        mib_s = {when: sum(faster.get(p["name"], 0) * int(p[nodes]) for p in pools)
                 for when, nodes in (("idle", "nodesIdle"), ("min", "minNodes"), ("max", "maxNodes"))}
        rate = storage.get("ebsGp3Throughput")
        rows.append(_fixed("ebsRootThroughput", f"EBS root volume throughput above 125 MiB/s (idle {mib_s['idle']} "
                           f"MiB/s, {mib_s['min']}-{mib_s['max']} MiB/s)", _stored(rate, mib_s["idle"]),
                           _stored(rate, mib_s["min"]), _stored(rate, mib_s["max"]), rate))
    if stack.prometheus == "install":
        size = stack.observability.storage_gib
        cost = _stored(gp3, size)
        rows.append(_fixed("prometheusVolume", f"Prometheus volume (gp3, {size} GiB)", cost, cost, cost, gp3))
    if stack.serving.storage_class is None and models:
        # The model caches live on Triarch's EFS file system, billed for what it stores: at least the weights, once
        # per model (replicas share a cache); compile caches add to it, by an amount no plan knows.
        weights = round(sum(m.sizing.weights_bytes for m in models) / GIB, 1)
        efs = storage.get("efsStandard")
        cost = _stored(efs, weights)
        rows.append(_fixed("efsModelCaches", f"EFS model caches (at least the weights, {weights:g} GiB)", cost, cost,
                           cost, efs))
    return rows


def usage_rates(stack: StackConfig, models: list[ModelPlan], table: PriceTable) -> list[dict[str, Any]]:
    """What is billed by use, as a rate and, where the plan knows it, the amount one event moves: the quantity per
    month depends on traffic, so these are never in a total."""
    usage = table.usage.get(stack.aws_region or "", {})
    weights = {m.name: m.sizing.weights_bytes / GIB for m in models}
    efs = stack.serving.storage_class is None
    rows: list[dict[str, Any]] = []

    def row(key: str, name: str, rate: Rate | None, unit: str, per: str | None) -> None:
        rows.append({"key": key, "name": name, "usd": rate.usd if rate else None, "unit": unit,
                     "perEvent": per, "priceSource": rate.source if rate else None})

    def each(rate: Rate | None, which: dict[str, float] | None = None) -> str | None:
        which = weights if which is None else which
        if rate is None or not which:
            return None
        return ", ".join(f"{name} ${rate.usd * gib:,.2f}" for name, gib in sorted(which.items()))

    nat = usage.get("natGatewayProcessed")
    streamed = {m.name for m in models if m.config.weights_uri is not None}
    from_hub = {name: gib for name, gib in weights.items() if name not in streamed}
    from_s3 = {name: gib for name, gib in weights.items() if name in streamed}
    crossing = [f"a model's first download from the hub: {each(nat, from_hub)}"] if each(nat, from_hub) else []
    if from_s3 and stack.cluster.create:
        crossing.append("weights from s3:// in the VPC's region take its S3 gateway endpoint, not the NAT (no "
                        f"charge): {', '.join(sorted(from_s3))}")
    elif each(nat, from_s3):
        crossing.append(f"each replica start streams its weights from s3:// through your VPC's route to S3 (a NAT "
                        f"gateway unless it has an S3 endpoint): {each(nat, from_s3)}")
    row("natGatewayProcessed", "data through the NAT gateways", nat, "GB", "; ".join(crossing) or None)
    if efs:
        read, write = usage.get("efsElasticRead"), usage.get("efsElasticWrite")
        # Weights streamed from s3:// go to the GPUs straight from S3: they never touch the cache.
        row("efsElasticRead", "EFS reads (elastic throughput)", read, "GB",
            f"each replica start reads its weights: {each(read, from_hub)}" if each(read, from_hub) else None)
        row("efsElasticWrite", "EFS writes (elastic throughput)", write, "GB",
            f"a model's first download writes its weights: {each(write, from_hub)}" if each(write, from_hub)
            else None)
    row("logsIngested", "control-plane logs ingested (CloudWatch)", usage.get("logsIngested"), "GB", None)
    days = stack.cluster.log_retention_days
    row("logsStored", f"control-plane logs kept {days} days (CloudWatch)", usage.get("logsStored"), "GB-month",
        f"each day's logs are billed for about {round(days * 12 / 365)} GB-month(s) per GB")
    return rows


def _pool_view(pool: dict[str, Any] | None) -> dict[str, Any] | None:
    if pool is None:
        return None
    keys = ("instanceType", "minNodes", "maxNodes", "gpusAtMin", "gpusAtMax", "monthlyUsdAtMin", "monthlyUsdAtMax",
            "nodesIdle", "monthlyUsdIdle", "reservedNodes")
    return {key: pool.get(key) for key in keys}


def _totals(document: dict[str, Any] | None) -> dict[str, Any] | None:
    if document is None:
        return None
    return {"monthlyUsdIdle": document.get("monthlyUsdIdle"), "monthlyUsdAtMin": document.get("monthlyUsdAtMin"),
            "monthlyUsdAtMax": document.get("monthlyUsdAtMax")}


COST_COLUMNS = ("monthlyUsdIdle", "monthlyUsdAtMin", "monthlyUsdAtMax")


def _cost_lines(document: dict[str, Any] | None) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every line a total adds up, by a key that survives a change of counts: pools by name, fixed costs by key."""
    if document is None:
        return {}
    found = {f"pool {p['name']}": (f"pool {p['name']}", p) for p in document.get("pools", [])}
    for item in document.get("fixed", []):
        found[str(item.get("key") or item["name"])] = (str(item["name"]), item)
    return found


def _delta(before: Any, after: Any) -> float | None:
    if before is None and after is None:
        return None
    if isinstance(before, int | float) and isinstance(after, int | float):
        return round(after - before, 2)
    return None


def cost_change_lines(base: dict[str, Any] | None, head: dict[str, Any]) -> list[dict[str, Any]]:
    """The lines whose monthly cost differs, with their change idle, at min and at max: together they explain the
    change of the total (a line only one side has counts from or to zero)."""
    before, after = _cost_lines(base), _cost_lines(head)
    rows = []
    for key in sorted(set(before) | set(after)):
        was = before.get(key, ("", {}))[1]
        now = after.get(key, ("", {}))[1]
        values = {c: (was.get(c, 0 if key not in before else None), now.get(c, 0 if key not in after else None))
                  for c in COST_COLUMNS}
        if all(b == a for b, a in values.values()) and (key in before) == (key in after):
            continue
        name = after[key][0] if key in after else before[key][0]
        rows.append({"line": name, "before": {c: b for c, (b, _) in values.items()},
                     "after": {c: a for c, (_, a) in values.items()},
                     "change": {c: _delta(b, a) for c, (b, a) in values.items()}})
    return rows


def capacity_change(base: dict[str, Any] | None, head: dict[str, Any] | None) -> dict[str, Any] | None:
    """Two capacity.json documents compared per pool, line by line and in total; a base written before capacity.json
    existed (None) leaves every `before` null."""
    if head is None:
        return None
    before = {p["name"]: p for p in (base or {}).get("pools", [])}
    after = {p["name"]: p for p in head.get("pools", [])}
    pools = [{"pool": name, "before": _pool_view(before.get(name)), "after": _pool_view(after.get(name))}
             for name in sorted(set(before) | set(after))]
    lines = cost_change_lines(base, head) if base is not None else []
    return {"baseKnown": base is not None, "pools": pools, "lines": lines,
            "total": {"before": _totals(base), "after": _totals(head)},
            "coldStart": cold_start_change(base, head)}


def cold_start_change(base: dict[str, Any] | None, head: dict[str, Any]) -> list[dict[str, Any]]:
    """Each model's predicted cold start in both plans (None where a plan has no such model, or predates the
    prediction), by model name."""
    def by_name(document: dict[str, Any] | None) -> dict[str, Any]:
        return {m["name"]: m.get("coldStart") for m in (document or {}).get("models", [])}

    before, after = by_name(base), by_name(head)
    return [{"model": name, "before": before.get(name), "after": after.get(name)}
            for name in sorted(set(before) | set(after))]
