"""What `triarch plan` prints: the pools and how each gets its nodes, the device plugin, the driver/CUDA matrix,
the models with their engine args and cold start, capacity and cost, and the resources by layer."""

from __future__ import annotations

from collections import Counter
from typing import Any

from triarch.catalog import Catalog, catalog, charts
from triarch.config import NodeGroupConfig, StackConfig, driver_of, pool_provisioner
from triarch.cost import COST_COLUMNS, at_least_line, price_gap_line
from triarch.offline import Registered
from triarch.planners import repair
from triarch.planners.adapters import adapter_line
from triarch.planners.coldstart import duration, span
from triarch.planners.karpenter import CONSOLIDATE_AFTER, pool_limits
from triarch.planners.kv_offload import offload_cost_line, offload_line
from triarch.planners.model_plan import ModelPlan
from triarch.planners.models import hub_lines, in_stack_words, replica_bounds
from triarch.planners.nodegroups import plan_eks_pool, plan_pool
from triarch.report.planning import PlanResult
from triarch.scheduling import POOL_LABEL
from triarch.tuner import Sizing
from triarch.tuner.units import GIB

LAYERS = {"where": "Kubernetes: where (scheduling)", "how": "Kubernetes: how (Ray)", "when": "Kubernetes: when (vLLM)"}


HELM_RELEASE = "kubernetes:helm.sh/v3:Release"


LAYER_OF_MODULE = {
    "triarch:cluster": "where", "triarch:network": "where", "triarch:nodegroups": "where",
    "triarch:deviceplugin": "where", "triarch:storage": "where", "triarch:serving": "where",
    "triarch:karpenter": "where",
    "triarch:ray": "how", "triarch:vllm": "when",
}


PROVISIONER_LABELS = {"karpenter": "karpenter", "managedNodeGroup": "node group", "existing": "existing"}


def scaling(stack: StackConfig, group: NodeGroupConfig, facts: Catalog) -> str:
    """One sentence: what brings the pool's nodes up, and whether (and how) it can start from zero."""
    cluster = stack.cluster
    provisioner = pool_provisioner(cluster, group)
    if provisioner == "karpenter":
        zones = ", ".join(group.zones or cluster.zones)
        limits = ", ".join(f"{v} {k}" for k, v in pool_limits(plan_eks_pool(stack, group, facts)).items())
        plan = plan_eks_pool(stack, group, facts)
        efa = (f"; EFA: a pod across nodes takes its node's {plan.pool.efa_interfaces} interfaces"
               if plan.pool.efa_interfaces else "")
        placed = (f"; in cluster placement group {plan.placement_group}, so in one zone: a zone outage takes every "
                  "replica" if plan.placement_group else "")
        kind = group.capacity_type.lower().replace("_", "-")
        if group.reservations:
            kind = f"reserved{'' if group.reserved_only else f' (then {kind})'}"
        return (f"Karpenter NodePool {group.name}: from 0 to {group.max} {group.instance_type} "
                f"{kind} nodes in {zones}, launched for pending pods "
                f"(limits: {limits}); an empty node is removed after {CONSOLIDATE_AFTER}{efa}{placed}")
    if provisioner == "managedNodeGroup":
        return f"EKS managed node group of {group.max} node(s), fixed size: never at zero"
    if cluster.provisioner == "none":
        named = ", ".join(group.nodes) or "none named"
        return (f"existing node(s) ({named}) labelled by Triarch; triarch:cluster.nodeProvisioner none, so the "
                f"pool keeps its {group.min}+ node(s)")
    return (f"the cluster's {cluster.provisioner} adds nodes (from zero when min is 0); it must give them the "
            f"pool's labels ({POOL_LABEL}={group.name}) and GPU taint")


def layer_of(resource: Registered, by_urn: dict[str, Registered]) -> str:
    """The layer of the nearest Triarch component above (or at) the resource."""
    current: Registered | None = resource
    while current is not None:
        module = ":".join(current.type.split(":")[:2])
        if module in LAYER_OF_MODULE:
            return LAYER_OF_MODULE[module]
        current = by_urn.get(current.parent or "")
    return "where"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def summary(result: PlanResult, facts: Catalog | None = None) -> str:
    facts = facts or catalog()
    stack = result.stack
    cluster = stack.cluster
    where = (f"EKS cluster {cluster.name} in {', '.join(cluster.zones)}" if cluster.create
             else f"existing cluster, kubeconfig context {cluster.context}")
    lines = [f"stack {result.run.stack}: {where}, Kubernetes {cluster.kubernetes_version}", "", "GPU pools"]
    rows = [["name", "instance", "GPU", "GPUs/node", "nodes", "capacity", "provisioner", "NVIDIA driver",
             "AMI release", "taint"]]
    for group in stack.node_groups:
        pool = plan_pool(stack, group, facts)
        driver = driver_of(group, facts)
        gpus = str(pool.gpus_per_node) + (f" (x{pool.time_slicing_replicas} sliced)"
                                          if pool.time_slicing_replicas else "")
        taint = ",".join(f"{t['key']}={t['value']}:{t['effect']}" for t in pool.taints) or "none"
        memory = f"{pool.gpu.torch_total_bytes / GIB:.1f} GiB"  # as vLLM sees it: the figure its refusals give
        capacity = group.capacity_type.lower().replace("_", "-") if cluster.create else "-"
        rows.append([group.name, group.instance_type or "existing", f"{pool.gpu.product} {memory}", gpus,
                     f"{group.min}-{group.max}", capacity, PROVISIONER_LABELS[pool_provisioner(cluster, group)],
                     driver, group.ami_release or "-", taint])
    lines += _table(rows)
    lines += ["", "How each pool gets its nodes"]
    lines += [f"  {group.name}: {scaling(stack, group, facts)}" for group in stack.node_groups]
    lines += ["", "Node repair (templates/compat/node-repair.yaml)", *(f"  {x}" for x in repair.plan_lines(stack))]
    if stack.device_plugin.mode == "install":
        chart = charts()["nvidia-device-plugin"]
        gfd = "with GPU feature discovery" if stack.device_plugin.gpu_feature_discovery else "without GFD"
        lines += ["", f"Device plugin: chart {chart.name} {chart.version} ({chart.repository}), {gfd}, "
                  "GPU nodes only, tolerating the GPU taint"]
    else:
        lines += ["", "Device plugin: the cluster's own (devicePlugin.mode: existing); Triarch installs none"]
    if result.trusted:
        lines += ["", result.trusted]
    if result.verdicts:
        lines += ["", "Driver/CUDA matrix"]
        lines += [f"  {v.level:7} {v.message}" for v in result.verdicts]
    if result.models:
        lines += ["", "Models (engine args from the tuner; KV capacity per replica, from the pessimistic end of the "
                  "memory estimate to the nominal one: the args start at either)"]
        rows = [["name", "engine", "model", "node group", "GPUs x replicas", "TP", "KV cache", "max len",
                 "max concurrency"]]
        for plan in result.models:
            sizing = plan.sizing
            concurrency = f"{sizing.max_concurrency:.1f}x" if sizing.max_concurrency is not None else "-"
            rows.append([plan.name, plan.config.engine, plan.config.model, plan.pool.name,
                         f"{plan.gpus_per_replica} x {replicas(plan)}", parallelism(plan), kv_range(sizing),
                         str(sizing.max_model_len or "-"), concurrency])
        lines += _table(rows)
        told = [(plan.name, in_stack_words(note)) for plan in result.models for note in plan.sizing.notes]
        if told:
            lines += ["  What the tuner adjusted or warns of:", *(f"    {name}: {note}" for name, note in told)]
        split = split_lines(result.models)
        if split:
            lines += ["  Split into prefill and decode (Ray Serve LLM's P/D application, vLLM's NIXL connector):",
                      *(f"    {x}" for x in split)]
        offloads = [offload_line(p.name, p.kv_offload_gib, p.host_memory) for p in result.models if p.kv_offload_gib]
        if offloads:
            lines += ["  KV offload to host memory (vLLM's native offloading; /dev/shm and memory limit raised to "
                      "match):", *(f"    {x}" for x in offloads)]
        adapters = [adapter_line(p.config, p.sizing.memory.lora_slots) for p in result.models if p.config.adapters]
        if adapters:
            lines += ["  LoRA adapters (served under their own names; no cost beyond the replicas' GPUs):",
                      *(f"    {x}" for x in adapters)]
        read = hub_lines(result.models)
        if read:
            lines += ["  Read from the Hugging Face Hub (the commit each was sized at):", *(f"    {x}" for x in read)]
    if result.models:
        lines += ["", *cold_start_lines(result.models)]
    else:
        lines += ["", "Models: none (triarch:models is empty or not set): this plans the cluster, its GPU pools and "
                  "the operators, and serves nothing; add a model under triarch:models to serve one"]
    lines += ["", *capacity_lines(result.capacity)]
    notes = [w for w in result.run.warnings if w not in {v.message for v in result.verdicts}]
    if notes:
        lines += ["", "Warnings from the program", *[f"  {w}" for w in notes]]
    lines += ["", *resource_lines(result.run.resources)]
    return "\n".join(lines)


def replicas(plan: ModelPlan) -> str:
    """A plan's replicas as the summary says them: `2`, or `1-3` where they scale."""
    low, high = replica_bounds(plan)
    return str(low) if low == high else f"{low}-{high}"


def split_lines(models: list[ModelPlan]) -> list[str]:
    """Each split model's roles in one line: replicas, pools, batches and how the KV cache crosses between them."""
    lines = []
    for decode in models:
        if decode.role != "decode":
            continue
        prefill = next(p for p in models if p.role == "prefill" and p.config.name == decode.config.name)
        crossing = ("EFA between the roles' pools" if decode.kv_over_efa
                    else "TCP between nodes without EFA (see the kv-transfer-over-tcp advisory)")
        lines.append(f"{decode.name}: prefill {replicas(prefill)} x {prefill.gpus_per_replica} GPU on "
                     f"'{prefill.pool.name}' (batch {prefill.sizing.engine_args['max_num_seqs']}), decode "
                     f"{replicas(decode)} x {decode.gpus_per_replica} GPU on '{decode.pool.name}' (batch "
                     f"{decode.sizing.engine_args['max_num_seqs']}); the KV cache crosses over NIXL's "
                     f"{decode.kv_backend} backend: {crossing}")
    return lines


def resource_kind(resource: Registered, by_urn: dict[str, Registered]) -> str:
    """What a resource is, for the summary: an AWS resource, another provider's (a generated password, TLS), or
    a Kubernetes object by the layer of the Triarch component that owns it."""
    provider = resource.type.split(":", 1)[0]
    if provider == "aws":
        return "AWS"
    if provider == "kubernetes":
        return LAYERS[layer_of(resource, by_urn)]
    if provider == "pulumi":
        return "Pulumi providers"
    return "other"


def resource_lines(resources: list[Registered]) -> list[str]:
    """Resources by what they are (AWS, then Kubernetes by layer), and the Helm releases with their charts."""
    by_urn = {r.urn: r for r in resources}
    # A provider-side component (a CRD file) stands for the object it creates; explicit providers count, as
    # `pulumi preview` counts them.
    counted = [r for r in resources if r.custom or r.type.startswith("kubernetes:yaml/")]
    counts = Counter(resource_kind(r, by_urn) for r in counted)
    lines = [f"Resources: {len(counted)} to create"]
    for label in ("AWS", *LAYERS.values(), "Pulumi providers", "other"):
        if counts.get(label) or label in ("AWS", *LAYERS.values()):
            lines.append(f"  {label:31} {counts.get(label, 0)}")
    releases = sorted((r.name, str(r.inputs.get("chart", "")), str(r.inputs.get("version", "")))
                      for r in resources if r.type == HELM_RELEASE)
    if releases:
        shown = [f"{name} {version}" if chart.rsplit("/", 1)[-1] == name
                 else f"{name} ({chart.rsplit('/', 1)[-1]}) {version}" for name, chart, version in releases]
        lines.append("  of which Helm releases (chart version): " + ", ".join(shown))
    return lines


def kv_range(sizing: Sizing) -> str:
    """The KV cache's tokens from the pessimistic end of the memory estimate to the nominal one."""
    low, high = sizing.kv_cache_tokens_low, sizing.kv_cache_tokens
    return f"{high:,} tokens" if low >= high else f"{low:,}-{high:,} tokens"


def cold_start_lines(models: list[ModelPlan]) -> list[str]:
    """Each model's predicted start from no node to Ready, part by part, with the startup probe's budget."""
    lines = ["Cold start per model, from no node to Ready (ranges from published figures, "
             "templates/compat/cold-start.yaml)"]
    for plan in models:
        cold = plan.cold_start
        if cold is None:
            continue
        unknown = cold.unknown()
        head = f"  {plan.name}: {span(cold.total())}" + (f" + {', '.join(unknown)} (unknown)" if unknown else "")
        if cold.warm_skips:
            head += f"; onto its warm capacity {span(cold.total(skip=cold.warm_skips))}"
        lines.append(head)
        for part in cold.parts:
            shown = span(part.seconds) if part.seconds is not None else "unknown"
            lines.append(f"    {part.key:8} {shown:12} {part.how}")
        if plan.config.engine == "vllm":
            lines.append(f"    startup probe: {duration(cold.budget_seconds)}: {cold.budget_reason}")
        lines.append(f"    first start: {cold.first_start}")
    return lines


def parallelism(plan: ModelPlan) -> str:
    """TP, or TP x PP where the layers are staged, and the nodes a replica spans."""
    sizing = plan.sizing
    text = str(sizing.tensor_parallel_size)
    if sizing.pipeline_parallel_size > 1:
        text += f" x PP {sizing.pipeline_parallel_size}"
    return text + (f" ({plan.nodes_per_replica} nodes)" if plan.multi_node else "")


def usd(value: float | None) -> str:
    return "unknown" if value is None else f"${value:,.0f}"


def total_cell(capacity: dict[str, Any], key: str) -> str:
    """A total as the summary shows it: exact, or "at least" the priced lines where some line has no price."""
    floor = capacity.get("atLeast")
    if capacity.get(key) is None and floor is not None:
        return f"at least {usd(floor[key])}"
    return usd(capacity.get(key))


def usage_line(item: dict[str, Any]) -> str:
    """A rate billed by use: what it costs per unit, and what one event costs where the plan knows."""
    rate = "unknown rate" if item["usd"] is None else f"${item['usd']:g} per {item['unit']}"
    return f"{item['name']} {rate}" + (f" ({item['perEvent']})" if item.get("perEvent") else "")


def reservation_line(pool: dict[str, Any]) -> str:
    """A pool's reservations, counted apart in its cost: each billed whether its instances run or not."""
    parts = []
    for r in pool["reservations"]:
        kind = "Capacity Block, price as recorded" if r["type"] == "capacityBlock" else "ODCR, on-demand rate"
        ends = f", ends {r['endsAt']}" if r.get("endsAt") else ""
        count = f"{r['count']} node(s)" if r["count"] is not None else "count unknown"
        parts.append(f"{r['reservation']} ({kind}{ends}) {count} {usd(r['monthlyUsd'])}")
    beyond = "nothing beyond them (reservedOnly)" if pool.get("reservedOnly") else \
        f"nodes beyond them {(pool.get('capacityType') or 'ON_DEMAND').lower().replace('_', '-')}"
    return (f"Reserved capacity of pool {pool['name']} (billed used or not, in its cost): {'; '.join(parts)}; "
            f"{beyond}")


def capacity_lines(capacity: dict[str, Any]) -> list[str]:
    """The capacity section of the summary: GPUs and monthly cost per pool at min and at max nodes."""
    where = f"on-demand list prices in {capacity['region']}, {capacity['pricesRetrieved']}" if capacity["region"] \
        else "existing nodes: no price"
    lines = [f"Capacity and cost per month ({where}; {capacity['hoursPerMonth']:g} h)"]
    gap = price_gap_line(capacity)
    if gap:
        lines.append(f"  {gap}")
    rows = [["pool", "instance", "nodes", "GPUs", "idle", "at min", "at max"]]
    for pool in capacity["pools"]:
        spot = " (spot, priced on-demand: an upper bound)" if pool.get("capacityType") == "SPOT" else ""
        rows.append([pool["name"] + spot, pool["instanceType"] or "existing", f"{pool['minNodes']}-{pool['maxNodes']}",
                     f"{pool['gpusAtMin']}-{pool['gpusAtMax']}",
                     f"{pool['nodesIdle']} node(s) {usd(pool['monthlyUsdIdle'])}", usd(pool["monthlyUsdAtMin"]),
                     usd(pool["monthlyUsdAtMax"])])
    for item in capacity["fixed"]:
        rows.append([item["name"], "", "", "", usd(item.get("monthlyUsdIdle", item["monthlyUsdAtMin"])),
                     usd(item["monthlyUsdAtMin"]), usd(item["monthlyUsdAtMax"])])
    if capacity["region"]:
        rows.append(["total", "", "", "", *(total_cell(capacity, key) for key in COST_COLUMNS)])
    lines += _table(rows)
    lines += [f"  {reservation_line(pool)}" for pool in capacity["pools"] if pool.get("reservations")]
    floor = at_least_line(capacity)
    if floor:
        lines.append(f"  {floor}")
    if capacity.get("usage"):
        lines += ["  Billed by use, not in the total:", *(f"    {usage_line(u)}" for u in capacity["usage"])]
    if capacity["models"]:
        held = ", ".join(f"{m['name']} {m['gpusPerReplica']} x {m['replicasMin']}"
                         + (f"-{m['replicasMax']}" if m["replicasMax"] != m["replicasMin"] else "")
                         + f" on {m['pool']}" for m in capacity["models"])
        lines.append(f"  GPUs held (per replica x replicas): {held}")
        warm = [f"{m['name']} {m['warm']['gpus']} GPU(s) on {m['warm']['nodes']} node(s), "
                f"{usd(m['warm']['monthlyUsd'])}" for m in capacity["models"] if m.get("warm")]
        if warm:
            lines.append(f"  Warm capacity (kept running empty, in the pools' idle cost): {'; '.join(warm)}")
        pickers = [picker_line(m["name"], m["picker"]) for m in capacity["models"] if m.get("picker")]
        if pickers:
            lines.append(f"  Endpoint pickers (on the system nodes, in their row's cost): {'; '.join(pickers)}")
        offloads = offload_cost_line(capacity["models"])
        if offloads:
            lines.append(f"  {offloads}")
    return lines


def picker_line(model: str, picker: dict[str, Any]) -> str:
    """A model's endpoint picker as the summary says it: its pods, what they request, and on a created cluster
    their share of the system nodes' cost by CPU (never added to a total: the system nodes' row counts them)."""
    share = (f", {usd(picker['monthlyUsdShare'])} of {picker['of']} by CPU" if picker.get("monthlyUsdShare")
             is not None else "")
    return (f"{model} {picker['pods']} pods requesting {picker['cpuMillicores'] / 1000:g} CPU and "
            f"{picker['memoryMiB'] / 1024:g} GiB{share}")
