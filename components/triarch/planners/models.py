"""Each model's plan: its pool, its tuned engine args, its GPUs per replica, image and cache size.

The tuner runs here once per model; workloads, the plan summary and policies read the result.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from triarch.catalog import Catalog, carries_efa_libraries, gated_repos
from triarch.config import ModelConfig, StackConfig, gpus_per_node
from triarch.config.schema import DisaggregationConfig
from triarch.disaggregation import facts as pd_facts
from triarch.errors import ConfigError
from triarch.hub import HubError, HubModel
from triarch.matrix import deployed_images, images_by_engine
from triarch.paths import PROJECT_ROOT
from triarch.planners.adapters import lora_slots
from triarch.planners.coldstart import check_budget, predict
from triarch.planners.kv_offload import plan_offload
from triarch.planners.model_plan import ModelPlan
from triarch.planners.nodegroups import plan_pool
from triarch.planners.router_memory import eviction_bounds, routing_facts
from triarch.scheduling import EFA_RESOURCE
from triarch.tuner import GIB, LengthRefused, Sizing, TuneError, find_arch, load_arch, tune
from triarch.tuner.arch import ModelArch
from triarch.tuner.lora import MAX_LORA_VOCAB
from triarch.tuner.nodes import NodesRefused, tune_nodes
from triarch.tuner.offload import engine_memory_gib
from triarch.tuner.remedies import LENGTH_GPUS_HINT, LENGTH_HINT, REFUSAL_HINT, REMEDY_HINT, WEIGHTS_HINT

MIN_CACHE_GIB = 20


def replica_bounds(plan: ModelPlan) -> tuple[int, int]:
    """The fewest and most replicas a model runs: its autoscaling range, or its fixed count twice."""
    scaling = plan.config.autoscaling
    return (scaling.min, scaling.max) if scaling else (plan.config.replicas, plan.config.replicas)


WEIGHTS_STACK_WORDS = ("try a pool with more GPUs per node (or more nodes, with pipelineParallelSize), a pool of "
                       "larger GPUs or a quantized checkpoint")
STACK_WORDS = (
    (REFUSAL_HINT, "try a pool with more GPUs per node (or more nodes, with pipelineParallelSize), a quantized "
                   "checkpoint, kvCacheDtype: fp8 or a smaller maxModelLen"),
    (LENGTH_HINT, "kvCacheDtype: fp8 or a pool with more GPUs per node"),
    (LENGTH_GPUS_HINT, "a pool with more GPUs per node (kvCacheDtype: fp8 would not hold it either)"),
    (WEIGHTS_HINT, WEIGHTS_STACK_WORDS),
    (REMEDY_HINT, "more memory per replica (a larger gpuMemoryUtilization, fewer timeSlicing replicas per GPU or a "
                  "pool of larger GPUs) keeps the defaults"),
    ("tensor_parallel_size=", "tensorParallelSize "), ("tensor_parallel_size ", "tensorParallelSize "),
    ("max_model_len=", "maxModelLen: "),
    ("pipeline_parallel_size=", "pipelineParallelSize "), ("pipeline_parallel_size ", "pipelineParallelSize "),
)
"""The tuner's argument names in a refusal, as the stack file says them (the tuner also answers `triarch tune`,
whose flags are its arguments'). What vLLM itself would be given or say stays in its words (the
gpu_memory_utilization a slice gets, a derived max_model_len)."""
SLICE_HINT = ("try fewer timeSlicing replicas per GPU (a bigger slice), a pool of larger GPUs, a quantized checkpoint, "
              "kvCacheDtype: fp8 or a smaller maxModelLen")
SLICE_WEIGHTS_HINT = ("try fewer timeSlicing replicas per GPU (a bigger slice), a pool of larger GPUs or a quantized "
                      "checkpoint")
"""A refusal's hint on a time-sliced pool, where a replica never spans GPUs (the second where no KV setting helps)."""


def in_stack_words(message: str) -> str:
    for tuner, stack in STACK_WORDS:
        message = message.replace(tuner, stack)
    return message


def _model_path(index: int) -> str:
    return f"triarch:models[{index}]"


def _check_adapters_fit(arch: ModelArch, model: ModelConfig, index: int) -> None:
    """LoRA slots are sized for dense attention models (tuner/lora.py), and vLLM refuses LoRA on a large vocabulary."""
    if not model.adapters:
        return
    if arch.is_moe or arch.is_mla:
        raise ConfigError(f"{_model_path(index)}.adapters", [a.name for a in model.adapters],
                          f"are adapters of {model.model}, a mixture of experts or MLA model, whose LoRA slots "
                          "Triarch does not size (it sizes dense attention models' only)",
                          "a dense model, or remove adapters")
    if arch.vocab_size > MAX_LORA_VOCAB:
        raise ConfigError(f"{_model_path(index)}.adapters", [a.name for a in model.adapters],
                          f"need LoRA, which vLLM refuses for a vocabulary above {MAX_LORA_VOCAB} "
                          f"({model.model}: {arch.vocab_size})", "a model with a smaller vocabulary, or remove "
                          "adapters")


def plan_model(stack: StackConfig, index: int, facts: Catalog, token: str | None = None,
               model: ModelConfig | None = None, **tuned: Any) -> ModelPlan:
    """The plan of models[index], or of `model` in its place (a split model's role); `tuned` are tuner options the
    role fixes (its batch, the decode role's length)."""
    model = model or stack.models[index]
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
    _check_adapters_fit(arch, model, index)
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
        options.update(tuned)
        if model.adapters:  # the LoRA slots come out before the KV cache (tuner/lora.py)
            options["lora"] = lora_slots(model)
        if share > 1:  # a slice of one GPU: no replica spans slices
            sizing = tune(arch, pool.gpu, tensor_parallel_size=model.tensor_parallel_size, gpus_available=1,
                          **options)
        else:
            sizing = tune_nodes(arch, pool.gpu, tensor_parallel_size=model.tensor_parallel_size,
                                pipeline_parallel_size=model.pipeline_parallel_size,
                                gpus_per_node=gpus_per_node(group, facts), max_nodes=pool.max_nodes, **options)
    except NodesRefused as error:
        on = f"node group '{group.name}' ({pool.gpu.product})"
        def fp8_fits() -> bool:  # within the pool's max nodes, at the pessimistic end: fp8 is worth naming
            try:
                return tune_nodes(arch, pool.gpu, tensor_parallel_size=model.tensor_parallel_size,
                                  pipeline_parallel_size=model.pipeline_parallel_size,
                                  gpus_per_node=gpus_per_node(group, facts), max_nodes=pool.max_nodes,
                                  **{**options, "kv_cache_dtype": "fp8"}).sized_for == "pessimistic"
            except TuneError:
                return False

        larger = "a pool of larger GPUs or a quantized checkpoint"
        if model.kv_cache_dtype != "fp8" and fp8_fits():
            larger = "a pool of larger GPUs, a quantized checkpoint or kvCacheDtype: fp8"
        allowed = (f"{stack.node_group_key(group.name)}.max >= {error.nodes_needed}, or {larger}"
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
            said = said.replace(STACK_WORDS[0][1], SLICE_HINT).replace(WEIGHTS_STACK_WORDS, SLICE_WEIGHTS_HINT)
        raise ConfigError(_model_path(index), model.model, said) from None
    if sizing.sized_for != "pessimistic":
        raise _may_not_start(index, model.model, f"node group '{group.name}' ({pool.gpu.product})", sizing,
                             sliced=share > 1)
    if model.adapters and sizing.nodes > 1:
        raise ConfigError(f"{_model_path(index)}.adapters", [a.name for a in model.adapters],
                          f"are planned for a replica within one node, and this one spans {sizing.nodes} nodes",
                          "a pool with more GPUs per node, or remove adapters")
    cache = model.cache_gib or max(MIN_CACHE_GIB, math.ceil(2 * sizing.weights_bytes / GIB))
    instance = facts.instances.get(group.instance_type) if group.instance_type else None
    release = images_by_engine(stack, facts)[model.engine]
    offload, room = plan_offload(stack, index, model, pool, instance, sizing)
    return ModelPlan(model, pool, instance, sizing, deployed_images(stack)[model.engine], cache, release=release,
                     hub=read, kv_offload_gib=offload, host_memory=room)


def hub_lines(plans: Iterable[ModelPlan]) -> list[str]:
    """What a plan says of the models it read from the Hub: the commit each was sized at, whether the stack pins
    it, and what moved or was read from the cache."""
    lines = []
    for plan in plans:
        if plan.hub is None or plan.role == "prefill":  # read once, for the model
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


def peak_gpus(models: list[ModelPlan]) -> dict[str, tuple[int, int, int]]:
    """Per pool: GPUs of (the vLLM models at their largest, the ray-serve models at their largest, the new Ray
    cluster a RayService `NewCluster` upgrade starts beside the old one at its smallest)."""
    vllm: dict[str, int] = defaultdict(int)
    ray: dict[str, int] = defaultdict(int)
    upgrade: dict[str, int] = defaultdict(int)
    for plan in models:
        if plan.config.engine == "ray-serve":
            low, high = replica_bounds(plan)
            ray[plan.pool.name] += high * plan.gpus_per_replica
            upgrade[plan.pool.name] += low * plan.gpus_per_replica
        else:
            vllm[plan.pool.name] += largest_gpu_use(plan) * plan.gpus_per_replica
    return {pool: (vllm[pool], ray[pool], upgrade[pool]) for pool in sorted({p.pool.name for p in models})}


def prefill_step(split: DisaggregationConfig) -> int:
    """The prefill role's tokens per step: vLLM's advice for throughput (templates/compat/prefill-decode.yaml
    prefillStep), or one expected prompt where that is longer, so a typical prompt is computed in one step."""
    return max(pd_facts().prefill_step_tokens, split.prefill.prompt_length or 0)


def widen_prefill_step(prefill: ModelPlan, step: int, plan_with: Callable[[int], ModelPlan]) -> ModelPlan:
    """The prefill role with the largest step of `step`, `step`/2, ... above the one vLLM's defaults gave it that its
    GPUs hold at the same shape (GPUs per replica, the same end of the memory estimate, one request of its length):
    a larger step never buys more GPUs. Where a smaller step than `step` is kept, the plan's notes say why."""
    default = int(prefill.sizing.engine_args["max_num_batched_tokens"])
    tried = step
    while tried > default:
        try:
            wider: ModelPlan | None = plan_with(tried)
        except ConfigError:
            wider = None  # one request of the role's length no longer fits beside that step's activations
        if (wider is not None and wider.gpus_per_replica == prefill.gpus_per_replica
                and wider.sizing.sized_for == prefill.sizing.sized_for):
            if tried == step:
                return wider
            prefill, default = wider, tried
            break
        tried //= 2
    if default >= step:
        return prefill
    note = (f"prefill steps of {default} tokens (max_num_batched_tokens), not {step}: a larger step's activations "
            f"would leave {prefill.pool.gpu.product} too little KV cache for one {prefill.sizing.max_model_len}-token "
            "request at this tensorParallelSize; a pool of larger GPUs for the prefill role "
            "(disaggregation.prefill.nodeGroup) takes it")
    return replace(prefill, sizing=replace(prefill.sizing, notes=(*prefill.sizing.notes, note)))


def plan_roles(stack: StackConfig, index: int, facts: Catalog, token: str | None) -> tuple[ModelPlan, ModelPlan]:
    """A split model's decode role (the model's plan) and prefill role, each tuned on its own pool: the decode role
    as the model would be, the prefill role at the decode role's max_model_len (a request must fit both), for
    throughput: a batch of the expected prompts its KV cache holds (a held cache is not a running request:
    prefill-decode.yaml heldCaches), and the larger step where the GPUs vLLM's defaults chose hold it; both with the
    NIXL backend their pools allow."""
    model = stack.models[index]
    split = model.disaggregation
    assert split is not None

    def role_config(given: Any, **update: Any) -> ModelConfig:
        return model.model_copy(update={"node_group": given.node_group or model.node_group,
                                        "tensor_parallel_size": given.tensor_parallel_size
                                        or model.tensor_parallel_size, "replicas": given.replicas,
                                        "autoscaling": given.autoscaling, **update})

    decode = plan_model(stack, index, facts, token, role_config(split.decode))
    check_decode_stages(stack, index, decode)
    length = decode.sizing.max_model_len
    prompt = split.prefill.prompt_length
    if prompt is not None and length is not None and prompt >= length:
        raise ConfigError(f"{_model_path(index)}.disaggregation.prefill.promptLength", prompt,
                          f"leaves no room for an answer in the {length} tokens a request may hold (the decode "
                          "role's max_model_len)", f"16..{length - 1}")
    config = role_config(split.prefill, warm_replicas=0, ttft_slo_seconds=None)
    lengths = {"max_model_len": length} if length else {}
    prefill = plan_model(stack, index, facts, token, config, typical_tokens=prompt, **lengths)
    prefill = widen_prefill_step(prefill, prefill_step(split),
                                 lambda step: plan_model(stack, index, facts, token, config, typical_tokens=prompt,
                                                         max_num_batched_tokens=step, **lengths))
    over_efa = prefill.pool.efa_interfaces > 0 and decode.pool.efa_interfaces > 0
    check_backend(stack, index, over_efa)
    return (replace(decode, role="decode", kv_backend=split.backend, kv_over_efa=over_efa),
            replace(prefill, role="prefill", kv_backend=split.backend, kv_over_efa=over_efa))


def check_backend(stack: StackConfig, index: int, over_efa: bool) -> None:
    """LIBFABRIC only where it can load and has EFA to use: both roles' pools with EFA, an image known to carry
    libfabric. Anywhere else its plugin fails in the engine, after the nodes were bought."""
    split = stack.models[index].disaggregation
    assert split is not None
    if split.backend != pd_facts().libfabric_backend:
        return
    key, image = f"{_model_path(index)}.disaggregation.backend", stack.images.ray_llm.image
    if not over_efa:
        raise ConfigError(key, split.backend, "moves the KV cache over libfabric's EFA provider, but the roles' "
                          "pools are not both EFA pools (nodeGroups[].efa)",
                          f"{pd_facts().default_backend}, or both roles on pools with efa: true")
    if not carries_efa_libraries(image):
        raise ConfigError(key, split.backend, f"cannot load in {image}: {pd_facts().libfabric_library}, and the "
                          "image is not known to carry the EFA installer (templates/compat/efa-images.yaml)",
                          f"{pd_facts().default_backend}, or an image with the EFA installer as "
                          "triarch:images.rayLlm {image, release}")


def check_decode_stages(stack: StackConfig, index: int, decode: ModelPlan) -> None:
    """A decode role within one pipeline stage: the engine refuses a NIXL consumer spread over stages at start, so
    the plan does, naming the key that asked for the stages (the model's pipelineParallelSize, or the decode role's
    pool, where the tuner had to spread the model over nodes to hold it)."""
    stages = decode.sizing.pipeline_parallel_size
    if stages == 1:
        return
    model, path = stack.models[index], _model_path(index)
    reason = (f"spreads the decode role (a NIXL consumer) over {stages} pipeline stages, which "
              f"{pd_facts().decode_pipeline_parallel}")
    if model.pipeline_parallel_size is not None:
        raise ConfigError(f"{path}.pipelineParallelSize", model.pipeline_parallel_size, reason,
                          "1 beside disaggregation (the decode role within one node: a pool of larger GPUs for "
                          "disaggregation.decode.nodeGroup), or disaggregation.enabled: false")
    assert model.disaggregation is not None
    given = model.disaggregation.decode.node_group
    raise ConfigError(f"{path}.disaggregation.decode.nodeGroup" if given else f"{path}.nodeGroup", decode.pool.name,
                      f"holds no decode replica within a node: the tuner {reason}",
                      "a pool whose node holds the model (disaggregation.decode.nodeGroup), or "
                      "disaggregation.enabled: false")


def check_router_thresholds(stack: StackConfig, plans: list[ModelPlan]) -> None:
    """A prefix router's imbalancedThreshold below the batch of each replica it routes to (a split model's roles
    each): two queues bounded by the batch never differ by more, so a threshold at or above it never balances and
    the router follows prefixes onto a full replica while another idles."""
    for plan in plans:
        routing = plan.config.prefix_routing
        given = routing.imbalanced_threshold if routing is not None else None
        batch = int(plan.sizing.engine_args.get("max_num_seqs", 1))
        if plan.config.engine != "ray-serve" or given is None or given < batch:
            continue
        role = f"the {plan.role} role of '{plan.config.name}'" if plan.role else f"'{plan.name}'"
        raise ConfigError(f"{_model_path(model_index(stack, plan))}.prefixRouting.imbalancedThreshold", given,
                          f"is not below the {batch} requests a replica of {role} takes at once (its batch, Serve's "
                          "max_ongoing_requests): two replicas' queues never differ by more, so the router would "
                          "never balance load", f"0..{batch - 1}, or remove it (half the batch)")


def check_router_eviction(stack: StackConfig, plans: list[ModelPlan]) -> None:
    """An evictionTargetChars given without evictionThresholdChars stays under the threshold Triarch derives from the
    replica's KV cache (planners/router_memory.py): cut back to more than it holds, the tree would never forget."""
    for plan in plans:
        routing = plan.config.prefix_routing
        if (plan.config.engine != "ray-serve" or plan.role == "prefill" or routing is None or not routing.eviction
                or routing.eviction_target_chars is None or routing.eviction_threshold_chars is not None):
            continue
        threshold, target = eviction_bounds(plan)
        if target <= threshold:
            continue
        raise ConfigError(f"{_model_path(model_index(stack, plan))}.prefixRouting.evictionTargetChars", target,
                          f"is more than the {threshold} characters at which eviction starts (Triarch's bound: the "
                          f"{plan.sizing.kv_cache_tokens} tokens a replica of '{plan.name}' caches, at "
                          f"{routing_facts()['charsPerToken']:g} characters each): a replica would be cut back to more "
                          "than it holds", f"1..{threshold}, or evictionThresholdChars as well")


def model_index(stack: StackConfig, plan: ModelPlan) -> int:
    """The position in triarch:models of the model a plan (or a split model's role) serves."""
    return next(i for i, m in enumerate(stack.models) if m.name == plan.config.name)


def check_roles_fit(stack: StackConfig, plans: list[ModelPlan]) -> None:
    """A split model's roles fit their pools together before anything else runs there: one line naming the
    model's disaggregation keys, not the pool's capacity in general."""
    for plan in plans:
        if plan.role != "prefill":
            continue
        decode = next(p for p in plans if p.role == "decode" and p.config.name == plan.config.name)
        needs: dict[str, int] = {}
        for role in (plan, decode):
            needs[role.pool.name] = needs.get(role.pool.name, 0) + largest_gpu_use(role) * role.gpus_per_replica
        for pool_name, need in needs.items():
            group = stack.node_group(pool_name)
            pool = plan.pool if plan.pool.name == pool_name else decode.pool
            capacity = group.max * pool.schedulable_gpus_per_node
            if need <= capacity:
                continue
            each = " + ".join(f"{r.role} {largest_gpu_use(r)} x {r.gpus_per_replica}" for r in (plan, decode)
                              if r.pool.name == pool_name)
            raise ConfigError(f"{_model_path(model_index(stack, plan))}.disaggregation", plan.config.name,
                              f"needs {need} GPUs on node group '{pool_name}' ({each} GPUs per replica), which holds "
                              f"{capacity} at most (max {group.max} x {pool.schedulable_gpus_per_node})",
                              f"{stack.node_group_key(pool_name)}.max >= "
                              f"{-(-sum(peak_gpus(plans)[pool_name]) // pool.schedulable_gpus_per_node)} (the pool's "
                              "other models and a RayService upgrade counted), fewer replicas of a role "
                              "(disaggregation.prefill.replicas, disaggregation.decode.replicas), or a role on another "
                              "node group (disaggregation.prefill.nodeGroup, disaggregation.decode.nodeGroup)")


def plan_models(stack: StackConfig, facts: Catalog, token: str | None = None) -> list[ModelPlan]:
    """Every model's plan, in the stack's order (plans[i] is models[i]'s), then the prefill role of each split
    model; `token` reads gated models from the Hub (default: $HF_TOKEN)."""
    plans: list[ModelPlan] = []
    prefills: list[ModelPlan] = []
    for i, model in enumerate(stack.models):
        if model.disaggregation is not None and model.disaggregation.enabled:
            decode, prefill = plan_roles(stack, i, facts, token)
            plans.append(decode)
            prefills.append(prefill)
        else:
            plans.append(plan_model(stack, i, facts, token))
    plans += prefills
    check_roles_fit(stack, plans)
    check_router_thresholds(stack, plans)
    check_router_eviction(stack, plans)
    plans = [replace(plan, surge_fits=_surge_fits(stack, plan, plans)) for plan in plans]
    plans = [replace(plan, cold_start=predict(stack, plan, facts)) for plan in plans]
    for plan in plans:
        assert plan.cold_start is not None
        check_budget(model_index(stack, plan), plan.cold_start, plan.config.startup_minutes)
    prefixes: dict[str, str] = {}
    for i, plan in enumerate(plans):
        if plan.config.engine != "ray-serve" or plan.role == "prefill":
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
    leaving a core and a fifth of the memory for the kubelet, daemon sets and page cache, and the model's KV offload
    on top (kvOffload, sized to fit in that fifth after the node's system reserve). On a time-sliced pool
    the share is of the node's slices: every slice's replica must fit beside the others."""
    gpus = plan.gpus_per_pod
    share = gpus / plan.pool.schedulable_gpus_per_node
    known = plan.instance is not None and plan.instance.gpus
    # existing nodes of unknown size: a modest floor
    cpu = max(1, int(plan.instance.vcpus * share) - 1) if plan.instance is not None and known else 2
    # The engine's share of the node's memory (tuner/offload.py), and the KV offload's buffer beside it (kvOffload).
    memory = engine_memory_gib(plan.instance, share) + plan.kv_offload_gib
    amounts = {"cpu": str(cpu), "memory": f"{memory}Gi", "nvidia.com/gpu": str(gpus)}
    if uses_efa(plan):
        amounts[EFA_RESOURCE] = str(efa_share(plan))
    return {"requests": dict(amounts), "limits": dict(amounts)}


def efa_share(plan: ModelPlan) -> int:
    """The EFA interfaces a pod of the plan asks for: every interface of the node for a pod of the whole node
    (Karpenter attaches as many as the pod asks for, and NCCL spreads over them); for a split model's role whose
    pods take part of a node, the part of its interfaces that goes with its GPUs (at least one), so the node's
    other pods get theirs."""
    per_node = plan.pool.schedulable_gpus_per_node
    return max(1, plan.pool.efa_interfaces * plan.gpus_per_pod // per_node)


def uses_efa(plan: ModelPlan) -> bool:
    """A replica across nodes on an EFA pool: its stages talk over EFA (a replica within a node uses NVLink); or a
    split model's role on an EFA pool whose other role is on one too, which NIXL's backend can cross over."""
    return plan.pool.efa_interfaces > 0 and (plan.multi_node or plan.kv_over_efa)


def gated_model_warnings(stack: StackConfig, secrets: Iterable[str], plans: Iterable[ModelPlan] = ()) -> list[str]:
    """A model from a gated repository (templates/compat/gated-repos.yaml, or as the Hub said when the plan read
    it), downloaded from the hub without triarch:hfToken: the first start fails with 401 and the pod restarts for
    ever, which a plan can say before any node is launched."""
    if "hfToken" in set(secrets):
        return []
    repos = gated_repos()
    read_gated = {plan.config.name for plan in plans if plan.hub is not None and plan.hub.gated}
    return [f"model '{model.name}' ({model.model}) is gated on Hugging Face: its download needs a token of an "
            "account that accepted the license on the model's page, and triarch:hfToken is not set; "
            f"pulumi config set --secret triarch:hfToken hf_... (or serve it from S3 with weightsUri)"
            for model in stack.models
            if model.weights_uri is None and (repos.gated(model.model) or model.name in read_gated)]
