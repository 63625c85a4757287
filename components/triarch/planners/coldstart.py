"""How long a replica takes from no node to Ready, predicted at plan time as a sum of parts, each a range from
published figures (templates/compat/cold-start.yaml): the node's launch, the image's pull, the weights' read and
vLLM's start. A part nothing published stays unknown (never zero), and the total says so.

The startup probe's budget comes from here: the slow end of what happens after the container starts (weights and
engine), with a margin. That is what decides whether scale-from-zero is usable, so it is shown per model in the plan
and compared between plans in review.
"""

from __future__ import annotations

import math

from triarch.catalog import Catalog
from triarch.coldfacts import ColdStartFacts, Range, cold_start_facts
from triarch.config import StackConfig, pool_provisioner
from triarch.errors import ConfigError
from triarch.planners.model_plan import CONTAINER_PARTS, ColdStart, ModelPlan, Part
from triarch.planners.nodegroups import image_pull
from triarch.tuner import GIB

MB = 1_000_000
MIB = 1024 * 1024
HUB_FIRST_START_MINUTES = 30
"""The startup budget a model whose weights come from the hub keeps at least: its first start downloads them into
the cache at a rate no plan knows, and a budget shorter than the download restarts the container mid-way. Triarch's
earlier fixed default, kept as the floor for that case only; weightsUri (S3) or startupMinutes replaces it."""


def duration(seconds: float) -> str:
    """90 -> 1m30s; 3600 -> 60m."""
    whole = round(seconds)
    minutes, rest = divmod(whole, 60)
    if minutes == 0:
        return f"{rest}s"
    return f"{minutes}m" if rest == 0 else f"{minutes}m{rest:02d}s"


def span(value: Range) -> str:
    low, high = duration(value.low), duration(value.high)
    return low if low == high else f"{low}-{high}"


def _node(stack: StackConfig, plan: ModelPlan, cold: ColdStartFacts) -> Part:
    group = stack.node_group(plan.pool.name)
    provisioner = pool_provisioner(stack.cluster, group)
    if provisioner == "karpenter":
        return Part("node", cold.karpenter_ready + cold.gpu_advertised,
                    f"Karpenter launches a {group.instance_type} to Ready, then the device plugin advertises its GPUs",
                    ("nodeLaunch.karpenterReadySeconds", "nodeLaunch.gpuAdvertisedSeconds"))
    if provisioner == "managedNodeGroup" or stack.cluster.provisioner == "none":
        return Part("node", Range(0, 0), "the pool's nodes run already (a fixed-size pool)", ())
    return Part("node", None, f"the cluster's {stack.cluster.provisioner} launches a node of a type and AMI Triarch "
                "does not know", ())


def _image(stack: StackConfig, plan: ModelPlan, facts: Catalog, cold: ColdStartFacts) -> Part:
    repository = plan.release.rsplit(":", 1)[0]
    size = cold.images.get(repository)
    if size is None:
        return Part("image", None, f"{repository}: no published size", ())
    group = stack.node_group(plan.pool.name)
    if not stack.cluster.create:
        return Part("image", None, f"{repository} ({size.compressed_gb:g} GB) onto nodes whose disk and snapshotter "
                    "Triarch does not know", (f"images.{repository}.compressedGB",))
    pull = image_pull(group, facts)
    rate = cold.parallel_pull_mbps if pull.parallel else cold.sequential_pull_mbps
    transfer = size.compressed_gb * 1000 / rate
    mode = "in parallel (SOCI)" if pull.parallel else "one layer at a time"
    sources = [f"images.{repository}.compressedGB", "imagePull.parallelMBps" if pull.parallel
               else "imagePull.sequentialMBps"]
    if pull.instance_store:
        # AWS publishes only the instance store's random IOPS; the measured rates came off EBS at 1000 MiB/s,
        # faster than they need, so the network and decompression bound them, not the disk.
        return Part("image", Range(transfer, transfer),
                    f"{size.compressed_gb:g} GB {mode} onto the instance store", tuple(sources))
    write = size.unpacked_gb * 1000 * MB / (pull.root_mib_s * MIB)
    sources += [f"images.{repository}.unpackedGB", "rootVolume.baselineMiBps"]
    seconds = max(transfer, write)
    bound = "the root volume's writes" if write > transfer else "the pull"
    return Part("image", Range(seconds, seconds),
                f"{size.compressed_gb:g} GB {mode}, {size.unpacked_gb:g} GB unpacked onto gp3 at "
                f"{pull.root_mib_s} MiB/s ({bound} bound it)", tuple(sources))


def _weights(stack: StackConfig, plan: ModelPlan, cold: ColdStartFacts) -> Part:
    weights = plan.sizing.weights_bytes
    gib = f"{weights / GIB:.1f} GiB"
    if plan.config.weights_uri:
        rate = cold.streamer_s3_mbps
        return Part("weights", Range(weights / (rate.high * MB), weights / (rate.low * MB)),
                    f"{gib} streamed from S3 into each node (Run:ai Model Streamer, concurrency "
                    f"{cold.streamer_concurrency})",
                    ("weights.streamerS3MBps",))
    if stack.cluster.create and stack.serving.storage_class is None:
        return Part("weights", Range(weights / (cold.efs_per_client_mibps * MIB),
                                     weights / (cold.safetensors_on_block_mbps * MB)),
                    f"{gib} from the EFS model cache into each node (EFS's per-client limit at best, vLLM's "
                    "safetensors loader at worst)", ("weights.efsPerClientMiBps", "weights.safetensorsOnBlockMBps"))
    where = stack.serving.storage_class or "the cluster's default class"
    return Part("weights", None, f"{gib} from a claim of {where}, whose throughput Triarch does not know", ())


def compile_cache_on(stack: StackConfig) -> bool:
    """serving.compileCache with its default resolved: on where every replica can share the model cache."""
    given = stack.serving.compile_cache
    return given if given is not None else shared_cache(stack)


def shared_cache(stack: StackConfig) -> bool:
    """Whether the model cache is ReadWriteMany (Triarch's EFS on a created cluster, by default)."""
    return stack.cache_access_mode == "ReadWriteMany"


def _engine(plan: ModelPlan, cold: ColdStartFacts, warm: bool) -> Part:
    """vLLM's own start: from the compile cache (`warm`) or compiling cold; an MoE model also warms up its expert
    kernels, a replica across GPUs checks their links."""
    if plan.sizing.engine_args.get("enforce_eager"):
        return Part("engine", cold.engine_eager, "vLLM's profile and start in eager mode (no compile, no graphs)",
                    ("engine.eagerSeconds",))
    moe = " and the MoE kernels' warm-up" if plan.sizing.moe else ""
    if warm:
        figure, key = (cold.engine_warm_moe, "warmMoeSeconds") if plan.sizing.moe else (cold.engine_warm,
                                                                                         "warmCompileSeconds")
        return Part("engine", figure, f"vLLM's profile, compile from the shared compile cache, graph capture{moe} "
                    "and the server's start", (f"engine.{key}",))
    across = plan.gpus_per_replica > 1
    options = [(cold.engine_cold, "coldCompileSeconds")]
    if across:
        options.append((cold.engine_cold_parallel, "coldCompileTensorParallelSeconds"))
    if plan.sizing.moe:
        options.append((cold.engine_cold_moe, "coldMoeSeconds"))
    figure, key = max(options, key=lambda option: option[0].high)
    return Part("engine", figure, f"vLLM's profile, a cold compile, graph capture{moe} and the server's start"
                + (" across GPUs" if across else ""), (f"engine.{key}",))


def predict(stack: StackConfig, plan: ModelPlan, facts: Catalog, cold: ColdStartFacts | None = None) -> ColdStart:
    cold = cold or cold_start_facts()
    parts = [_node(stack, plan, cold), _image(stack, plan, facts, cold)]
    if plan.config.engine == "ray-serve":
        parts.append(Part("ray", None, "a Ray worker joins the cluster and Ray Serve places the replica", ()))
    parts += [_weights(stack, plan, cold), _engine(plan, cold, warm=compile_cache_on(stack))]
    first = ("streams from S3 like every start" if plan.config.weights_uri else
             f"downloads {plan.sizing.weights_bytes / GIB:.1f} GiB from the hub into the cache (rate unknown)")
    if compile_cache_on(stack):
        first += "; the first replica on a GPU type compiles cold"
    # The startup probe must also let the first start through, which compiles cold.
    first_parts = tuple(p if p.key != "engine" else _engine(plan, cold, warm=False) for p in parts)
    first_start = ColdStart(plan.name, first_parts, first, 0, "")
    budget, reason = startup_budget(plan, first_start, cold)
    return ColdStart(plan.name, tuple(parts), first, budget, reason, warm_skips=_warm_skips(stack, plan),
                     margin=cold.startup_margin, first_container=first_start.container)


def _warm_skips(stack: StackConfig, plan: ModelPlan) -> tuple[str, ...]:
    """A start onto warm capacity finds its node up; where placeholder pods hold it, with the image pulled."""
    if plan.config.warm_replicas == 0:
        return ()
    return ("node",) if pool_provisioner(stack.cluster, stack.node_group(plan.pool.name)) == "karpenter" \
        else ("node", "image")


def startup_budget(plan: ModelPlan, prediction: ColdStart, cold: ColdStartFacts) -> tuple[int, str]:
    """Seconds the startup probe waits, and why: the stack's startupMinutes where given; else the slow end of the
    container's part of the prediction with the margin, in whole minutes, and for weights from the hub at least
    HUB_FIRST_START_MINUTES (the first download's time is unknown)."""
    given = plan.config.startup_minutes
    if given is not None:
        return given * 60, "startupMinutes"
    container = prediction.container
    hub = plan.config.weights_uri is None
    if container is None:
        missing = ", ".join(p.key for p in prediction.parts if p.key in CONTAINER_PARTS and p.seconds is None)
        return HUB_FIRST_START_MINUTES * 60, (f"Triarch's fixed allowance, as the prediction of weights + engine is "
                                              f"incomplete ({missing} unknown)")
    minutes = max(1, math.ceil(container.high * cold.startup_margin / 60))
    reason = f"{cold.startup_margin:g} x {duration(container.high)}, the slow end of weights + a cold engine start"
    if hub and minutes < HUB_FIRST_START_MINUTES:
        return HUB_FIRST_START_MINUTES * 60, (f"the first download from the hub takes a time no plan knows (the "
                                              f"prediction alone gives {minutes}m: {reason}); weightsUri or "
                                              "startupMinutes replaces it")
    return minutes * 60, reason


def check_budget(index: int, prediction: ColdStart, startup_minutes: int | None) -> None:
    """A startupMinutes below the slow end of what the container's start is predicted to take restarts a start
    that is only slow: refused, naming the prediction."""
    container = prediction.first_container or prediction.container
    if startup_minutes is not None and container is not None and startup_minutes * 60 < container.high:
        need = math.ceil(container.high / 60)
        model = prediction.model
        raise ConfigError(f"triarch:models[{index}].startupMinutes", startup_minutes,
                              f"is shorter than the predicted start of '{model}' after its container starts "
                              f"({span(container)}: weights and a cold engine start; `triarch plan` shows the parts), "
                              "so the "
                              "startup probe would restart a start that is only slow",
                          f">= {need}, or remove it to take the prediction with its margin")
