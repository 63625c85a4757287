"""Each model's plan: its pool, its tuned engine args, its GPUs per replica, image and cache size.

The tuner runs here once per model; workloads, the plan summary and policies read the result.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from triarch.catalog import Catalog, gated_repos
from triarch.config import StackConfig, gpus_per_node
from triarch.errors import ConfigError
from triarch.hub import HubError, HubModel
from triarch.matrix import deployed_images, images_by_engine
from triarch.paths import PROJECT_ROOT
from triarch.planners.coldstart import check_budget, predict
from triarch.planners.model_plan import ModelPlan
from triarch.planners.nodegroups import plan_pool
from triarch.tuner import GIB, LengthRefused, Sizing, TuneError, find_arch, load_arch, tune
from triarch.tuner.nodes import NodesRefused, tune_nodes
from triarch.tuner.search import LENGTH_HINT, REFUSAL_HINT, REMEDY_HINT

MIN_CACHE_GIB = 20


def replica_bounds(plan: ModelPlan) -> tuple[int, int]:
    """The fewest and most replicas a model runs: its autoscaling range, or its fixed count twice."""
    scaling = plan.config.autoscaling
    return (scaling.min, scaling.max) if scaling else (plan.config.replicas, plan.config.replicas)


STACK_WORDS = (
    (REFUSAL_HINT, "try a pool with more GPUs per node (or more nodes, with pipelineParallelSize), a quantized "
                   "checkpoint, kvCacheDtype: fp8 or a smaller maxModelLen"),
    (LENGTH_HINT, "kvCacheDtype: fp8 or a pool with more GPUs per node"),
    (REMEDY_HINT, "more memory per replica (a larger gpuMemoryUtilization, fewer timeSlicing replicas per GPU or a "
                  "pool of larger GPUs) keeps the defaults"),
    ("tensor_parallel_size=", "tensorParallelSize "), ("tensor_parallel_size ", "tensorParallelSize "),
    ("pipeline_parallel_size=", "pipelineParallelSize "), ("pipeline_parallel_size ", "pipelineParallelSize "),
)
"""The tuner's argument names in a refusal, as the stack file says them (the tuner also answers `triarch tune`,
whose flags are its arguments'). What vLLM itself would be given or say stays in its words (the
gpu_memory_utilization a slice gets, a derived max_model_len)."""
SLICE_HINT = ("try fewer timeSlicing replicas per GPU (a bigger slice), a pool of larger GPUs, a quantized checkpoint, "
              "kvCacheDtype: fp8 or a smaller maxModelLen")
"""A refusal's hint on a time-sliced pool, where a replica never spans GPUs."""


def in_stack_words(message: str) -> str:
    for tuner, stack in STACK_WORDS:
        message = message.replace(tuner, stack)
    return message


def _model_path(index: int) -> str:
    return f"triarch:models[{index}]"


def plan_model(stack: StackConfig, index: int, facts: Catalog, token: str | None = None) -> ModelPlan:
    model = stack.models[index]
    group = stack.node_group(model.node_group)
    pool = plan_pool(stack, group, facts)
    read: HubModel | None = None
    try:
        if model.model_config_path:
            arch = load_arch(PROJECT_ROOT / model.model_config_path)
        else:
            arch, read = find_arch(model.model, revision=model.revision, token=token)
    except HubError as error:
        raise ConfigError(f"{_model_path(index)}.model", model.model, str(error), show_value=False) from None
    except TuneError as error:
        if model.model_config_path:
            raise ConfigError(f"{_model_path(index)}.modelConfig", model.model_config_path,
                              f"cannot be read as a model's config.json: {error}",
                              "the path (from the project's root) of a Hugging Face config.json") from None
        raise ConfigError(f"{_model_path(index)}.model", model.model, "has no known architecture",
                          f"a model of templates/models, or modelConfig: path/to/config.json ({error})") from None
    share = pool.time_slicing_replicas or 1
    if share > 1 and (model.tensor_parallel_size or 1) > 1:
        raise ConfigError(f"{_model_path(index)}.tensorParallelSize", model.tensor_parallel_size,
                          f"needs whole GPUs, but node group '{group.name}' slices each GPU {share} ways (the device "
                          "plugin refuses a request for more than one slice)", "1, or a pool without timeSlicing")
    try:
        # On a time-sliced GPU a replica shares the memory with up to `share - 1` others (no isolation): it is
        # sized for its share, as vLLM's gpu_memory_utilization is a fraction of the whole GPU.
        image = facts.image(images_by_engine(stack, facts)[model.engine])
        options: dict[str, Any] = {"vllm_version": image.vllm if image is not None else None,
                                   "gpu_memory_utilization": round(model.gpu_memory_utilization / share, 4),
                                   "max_model_len": model.max_model_len,
                                   "kv_cache_dtype": model.kv_cache_dtype, "task": model.resolved_task}
        if share > 1:  # a slice of one GPU: no replica spans slices
            sizing = tune(arch, pool.gpu, tensor_parallel_size=model.tensor_parallel_size, gpus_available=1,
                          **options)
        else:
            sizing = tune_nodes(arch, pool.gpu, tensor_parallel_size=model.tensor_parallel_size,
                                pipeline_parallel_size=model.pipeline_parallel_size,
                                gpus_per_node=gpus_per_node(group, facts), max_nodes=pool.max_nodes, **options)
    except NodesRefused as error:
        on = f"node group '{group.name}' ({pool.gpu.product})"
        index_of = next(i for i, g in enumerate(stack.node_groups) if g.name == group.name)
        larger = "a pool of larger GPUs, a quantized checkpoint or kvCacheDtype: fp8"
        allowed = (f"triarch:nodeGroups[{index_of}].max >= {error.nodes_needed}, or {larger}"
                   if error.nodes_needed else larger)
        raise ConfigError(_model_path(index), model.model,
                          in_stack_words(f"cannot be served on {on}: one node: {error.one_node}; {error}"),
                          allowed) from None
    except LengthRefused as error:
        raise ConfigError(f"{_model_path(index)}.maxModelLen", model.max_model_len,
                          in_stack_words(f"is refused: {error}"),
                          "a length the model supports and one request of which the KV cache holds") from None
    except TuneError as error:
        on = f"node group '{group.name}' ({pool.gpu.product}" + (f", 1/{share} of each GPU)" if share > 1 else ")")
        said = in_stack_words(f"cannot be served on {on}: {error}")
        if share > 1:  # more GPUs per node do not help a slice: a bigger slice does
            said = said.replace(STACK_WORDS[0][1], SLICE_HINT)
        raise ConfigError(_model_path(index), model.model, said) from None
    if sizing.sized_for != "pessimistic":
        raise _may_not_start(index, model.model, f"node group '{group.name}' ({pool.gpu.product})", sizing,
                             sliced=share > 1)
    cache = model.cache_gib or max(MIN_CACHE_GIB, math.ceil(2 * sizing.weights_bytes / GIB))
    instance = facts.instances.get(group.instance_type) if group.instance_type else None
    release = images_by_engine(stack, facts)[model.engine]
    return ModelPlan(model, pool, instance, sizing, deployed_images(stack)[model.engine], cache, release=release,
                     hub=read)


def hub_lines(plans: Iterable[ModelPlan]) -> list[str]:
    """What a plan says of the models it read from the Hub: the commit each was sized at, whether the stack pins
    it, and what moved or was read from the cache."""
    lines = []
    for plan in plans:
        if plan.hub is None:
            continue
        read = plan.hub
        if plan.config.revision is None:
            pin = f"not pinned: vLLM loads main as it is when a pod starts; pin this with revision: {read.commit}"
        elif read.pinned:
            pin = "pinned"
        else:
            pin = f"pinned to {read.revision}, which vLLM loads as this commit (--revision)"
        lines.append(f"{plan.name}: {read.describe()}, {pin}")
        lines += [f"{plan.name}: {note}" for note in read.notes]
    return lines


FITS_KEYS = {"tensor_parallel_size": "tensorParallelSize: {}", "max_model_len": "maxModelLen: {}",
             "kv_cache_dtype": "kvCacheDtype: {}"}
"""What fits at the pessimistic end, as the model's stack keys."""


def _may_not_start(index: int, model: str, on: str, sizing: Sizing, *, sliced: bool) -> ConfigError:
    """A model whose one request fits only at the nominal end of the memory estimate: vLLM may refuse to start
    it, so the plan does, naming what would fit at the pessimistic end too (docs/tuning.md's promise)."""
    fits = [FITS_KEYS[key].format(value) for key, value in sizing.fits_instead]
    if not any(key == "tensor_parallel_size" for key, _ in sizing.fits_instead):
        fits.append("a bigger slice (fewer timeSlicing replicas per GPU)" if sliced
                    else "more GPUs per replica (a pool with more GPUs per node, or more nodes with "
                         "pipelineParallelSize)")
    said = ", ".join(fits[:-1]) + f" or {fits[-1]}" if len(fits) > 1 else fits[0]
    return ConfigError(_model_path(index), model, in_stack_words(f"may not start on {on}: {sizing.shortfall()}"),
                       f"what fits there: {said}")


def largest_gpu_use(plan: ModelPlan) -> int:
    return plan.config.replicas if plan.config.autoscaling is None else plan.config.autoscaling.max


def plan_models(stack: StackConfig, facts: Catalog, token: str | None = None) -> list[ModelPlan]:
    """Every model's plan; `token` reads gated models from the Hub (default: $HF_TOKEN)."""
    plans = [plan_model(stack, i, facts, token) for i in range(len(stack.models))]
    plans = [replace(plan, surge_fits=_surge_fits(stack, plan, plans)) for plan in plans]
    plans = [replace(plan, cold_start=predict(stack, plan, facts)) for plan in plans]
    for index, plan in enumerate(plans):
        assert plan.cold_start is not None
        check_budget(index, plan.cold_start, plan.config.startup_minutes)
    prefixes: dict[str, str] = {}
    for i, plan in enumerate(plans):
        if plan.config.engine != "ray-serve":
            continue
        if plan.route_prefix in prefixes:
            raise ConfigError(f"{_model_path(i)}.routePrefix", plan.route_prefix,
                              f"is already the route of model '{prefixes[plan.route_prefix]}'",
                              "a distinct route prefix per ray-serve model")
        prefixes[plan.route_prefix] = plan.name
    return plans


def smallest_gpu_use(plan: ModelPlan) -> int:
    return plan.config.replicas if plan.config.autoscaling is None else plan.config.autoscaling.min


def _surge_fits(stack: StackConfig, plan: ModelPlan, plans: list[ModelPlan]) -> bool:
    """Room for one more replica while every other model on the pool runs at its largest and a RayService
    upgrade runs its new cluster (at its smallest) beside the old: the pool's worst moment."""
    capacity = stack.node_group(plan.pool.name).max * plan.pool.schedulable_gpus_per_node
    on_pool = [p for p in plans if p.pool.name == plan.pool.name]
    others = sum(largest_gpu_use(p) * p.gpus_per_replica for p in on_pool if p.name != plan.name)
    upgrade = sum(smallest_gpu_use(p) * p.gpus_per_replica for p in on_pool if p.config.engine == "ray-serve")
    return (plan.config.replicas + 1) * plan.gpus_per_replica + others + upgrade <= capacity


def pod_resources(plan: ModelPlan) -> dict[str, dict[str, str]]:
    """Requests equal to limits (Guaranteed QoS): the replica's GPUs and its share of the node's CPU and memory,
    leaving a core and a fifth of the memory for the kubelet, daemon sets and page cache. On a time-sliced pool
    the share is of the node's slices: every slice's replica must fit beside the others."""
    gpus = plan.gpus_per_pod
    if plan.instance is not None and plan.instance.gpus:
        share = gpus / plan.pool.schedulable_gpus_per_node
        cpu = max(1, int(plan.instance.vcpus * share) - 1)
        memory = max(4, int(plan.instance.memory_gib * share * 0.8))
    else:
        cpu, memory = 2, 8  # existing nodes of unknown size: a modest floor
    amounts = {"cpu": str(cpu), "memory": f"{memory}Gi", "nvidia.com/gpu": str(gpus)}
    if uses_efa(plan):
        # Every interface of the node: Karpenter attaches as many as the pod asks for, and NCCL spreads over them.
        amounts[EFA_RESOURCE] = str(plan.pool.efa_interfaces)
    return {"requests": dict(amounts), "limits": dict(amounts)}


EFA_RESOURCE = "vpc.amazonaws.com/efa"
"""What the EFA device plugin advertises (one per interface), and Karpenter's capacity of an EFA instance type."""


def uses_efa(plan: ModelPlan) -> bool:
    """A replica across nodes on an EFA pool: its stages talk over EFA (a replica within a node uses NVLink)."""
    return plan.multi_node and plan.pool.efa_interfaces > 0


def gated_model_warnings(stack: StackConfig, secrets: Iterable[str], plans: Iterable[ModelPlan] = ()) -> list[str]:
    """A model from a gated repository (templates/compat/gated-repos.yaml, or as the Hub said when the plan read
    it), downloaded from the hub without triarch:hfToken: the first start fails with 401 and the pod restarts for
    ever, which a plan can say before any node is launched."""
    if "hfToken" in set(secrets):
        return []
    repos = gated_repos()
    read_gated = {plan.name for plan in plans if plan.hub is not None and plan.hub.gated}
    return [f"model '{model.name}' ({model.model}) is gated on Hugging Face: its download needs a token of an "
            "account that accepted the license on the model's page, and triarch:hfToken is not set; "
            f"pulumi config set --secret triarch:hfToken hf_... (or serve it from S3 with weightsUri)"
            for model in stack.models
            if model.weights_uri is None and (repos.gated(model.model) or model.name in read_gated)]
