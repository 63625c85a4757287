"""The search: the smallest tensor-parallel size that holds the weights and one request, the batch the KV cache
supports, and ``max_model_len`` capped to what fits (or refused where vLLM would refuse it)."""

from __future__ import annotations

from typing import Any

from triarch.catalog import Gpu
from triarch.tuner.arch import TASKS, LengthRefused, ModelArch, Task, TuneError
from triarch.tuner.context import derive_context, refuse_longer
from triarch.tuner.kv import DEFAULT_BLOCK_SIZE, kv_dtype_bytes
from triarch.tuner.lora import LoraSlots
from triarch.tuner.plan import DEFAULT_CONTEXT_TARGET, Plan, plan_for
from triarch.tuner.releases import estimate_spread, modelled_releases, release_for
from triarch.tuner.remedies import (
    LENGTH_GPUS_HINT,
    LENGTH_HINT,
    TYPICAL_CHAT_TOKENS,
    pow2_floor,
    refusal,
    remedy,
    remedy_note,
)
from triarch.tuner.report import Sizing
from triarch.tuner.weights import count_parameters, weight_bytes

TYPICAL_EMBED_TOKENS = 512
"""Tokens of a typical embedding request (one chunk of a document)."""

MIN_CONCURRENCY = 4
"""When ``max_model_len`` is not given and the model's maximum does not fit this many times over, the tuner
lowers ``max_model_len`` to the largest power of two that does (never below min(model max, 8192) when that fits),
so one long request cannot take the whole KV cache."""

def _tp_candidates(arch: ModelArch, gpus: int) -> list[int]:
    """Powers of two up to ``gpus`` that vLLM accepts: dividing the attention heads, and dividing the KV heads or
    being a multiple of them (KV heads replicate beyond that)."""
    out = []
    tp = 1
    while tp <= gpus:
        if arch.num_attention_heads % tp == 0 and (
            arch.is_mla or arch.num_key_value_heads % tp == 0 or tp % arch.num_key_value_heads == 0
        ):
            out.append(tp)
        tp *= 2
    return out


def _round_down(value: int, multiple: int) -> int:
    return value - value % multiple if value >= multiple else value


def tune(
    arch: ModelArch,
    gpu: Gpu,
    *,
    tensor_parallel_size: int | None = None,
    gpu_memory_utilization: float | None = None,
    max_model_len: int | None = None,
    kv_cache_dtype: str = "auto",
    kv_cache_memory_bytes: int | None = None,
    task: Task = "generate",
    gpus_available: int = 8,
    pipeline_parallel_size: int = 1,
    block_size: int = DEFAULT_BLOCK_SIZE,
    enforce_eager: bool | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    vllm_version: str | None = None,
    remedies: bool = True,
    tp_limit: int | None = None,
    typical_tokens: int | None = None,
    lora: LoraSlots | None = None,
) -> Sizing:
    """Engine args for serving ``arch`` on GPUs of type ``gpu``.

    Tensor parallelism: ``tensor_parallel_size`` if given, else the smallest power of two (dividing the attention
    heads, at most ``gpus_available // pipeline_parallel_size``) whose GPUs hold the weights and the KV cache of one
    ``max_model_len`` sequence at the pessimistic end of the memory estimate, else nominally; if none holds a full
    sequence, the one holding the most tokens. The answer says which end it was sized for (``sized_for``) and, when
    only the nominal one, what would fit at the pessimistic end (``fits_instead``; a larger tensor-parallel size
    up to ``tp_limit`` GPUs, default ``gpus_available // pipeline_parallel_size``). ``max_model_len``
    is capped to the model's maximum and to the KV tokens that fit; when not given it defaults to the context
    ``vllm_version`` derives (:mod:`triarch.tuner.context`), lowered (see :data:`MIN_CONCURRENCY`) so several
    such requests fit. Memory and paging follow that release's rules (None: the default image's vLLM;
    ``gpu_memory_utilization`` None: the release's default). ``max_num_seqs``, when not given, is how many requests
    of ``typical_tokens`` (a typical request's length: TYPICAL_CHAT_TOKENS, TYPICAL_EMBED_TOKENS for embed, when
    None) the KV cache holds, up to vLLM's default.

    When no tensor-parallel size leaves even one KV block, the tuner tries what a person would before refusing
    (:func:`_remedy`): a smaller ``max_num_batched_tokens``, then eager mode, then both, each only where the
    caller left it open (``max_num_batched_tokens`` / ``enforce_eager`` None; ``remedies`` False: none), and
    says which in a note. Raises :class:`TuneError` with the numbers (and what was tried) when not even one KV
    block fits then, :class:`LengthRefused` for a length vLLM would refuse.
    """
    release, release_note = release_for(vllm_version)
    if gpu_memory_utilization is None:
        gpu_memory_utilization = release.gpu_memory_utilization
    if task not in TASKS:
        raise TuneError(f"task {task!r} is not one of {', '.join(TASKS)}")
    if not 0 < gpu_memory_utilization <= 1:
        raise TuneError(f"gpu_memory_utilization {gpu_memory_utilization} must be in (0, 1]")
    if max_model_len is not None and max_model_len < 1:
        raise TuneError(f"max_model_len {max_model_len} must be at least 1")
    if block_size < 1 or pipeline_parallel_size < 1 or gpus_available < 1:
        raise TuneError("block_size, pipeline_parallel_size and gpus_available must be at least 1")
    if kv_cache_memory_bytes is not None and kv_cache_memory_bytes < 0:
        raise TuneError(f"kv_cache_memory_bytes {kv_cache_memory_bytes} must not be negative")
    kv_dtype_bytes(arch, kv_cache_dtype)  # validates the name
    if pipeline_parallel_size > arch.num_hidden_layers:
        raise TuneError(f"pipeline_parallel_size {pipeline_parallel_size} exceeds the {arch.num_hidden_layers} layers")

    notes: list[str] = [release_note] if release_note else []
    limit = derive_context(arch.context, release, model_type=arch.model_type, pooling=task == "embed")
    model_max = limit.default if limit is not None else None
    requested_len = max_model_len
    if requested_len is not None:
        refuse_longer(requested_len, limit, arch.context, release, arch.label)
    target = requested_len if requested_len is not None else (
        min(model_max, DEFAULT_CONTEXT_TARGET) if model_max is not None else None
    )
    ceiling = requested_len if requested_len is not None else model_max

    tp_gpus = gpus_available // pipeline_parallel_size
    if tensor_parallel_size is not None:
        if tensor_parallel_size < 1 or arch.num_attention_heads % tensor_parallel_size:
            raise TuneError(
                f"tensor_parallel_size {tensor_parallel_size} must divide the "
                f"{arch.num_attention_heads} attention heads"
            )
        if tensor_parallel_size * pipeline_parallel_size > gpus_available:
            raise TuneError(
                f"tensor_parallel_size {tensor_parallel_size} x pipeline_parallel_size {pipeline_parallel_size} "
                f"needs more than the {gpus_available} GPU(s) available"
            )
        candidates = [tensor_parallel_size]
    else:
        candidates = _tp_candidates(arch, tp_gpus)
        if not candidates:
            raise TuneError(
                f"no tensor_parallel_size fits {gpus_available} GPU(s) with pipeline_parallel_size "
                f"{pipeline_parallel_size} and {arch.num_attention_heads} attention heads"
            )

    total = gpu.torch_total_bytes

    def plan(tp: int, seqs: int | None = max_num_seqs, batched: int | None = max_num_batched_tokens,
             eager: bool = bool(enforce_eager)) -> Plan:
        return plan_for(arch, total, tp, release=release, pp=pipeline_parallel_size, util=gpu_memory_utilization,
                     kv_cache_dtype=kv_cache_dtype, kv_cache_memory_bytes=kv_cache_memory_bytes, task=task,
                     block_size=block_size, longest=ceiling, enforce_eager=eager, max_num_seqs=seqs,
                     max_num_batched_tokens=batched, lora=lora)

    spread = estimate_spread()
    # A release the tuner does not model is sized, at the pessimistic end, under every modelled release's rules and
    # the worst of them: the largest activation and overheads any modelled release takes.
    pessimists = [release] if release_note is None else list(modelled_releases().values())

    def low(p: Plan, kv_dtype: str = kv_cache_dtype) -> Plan:
        """The same configuration at the pessimistic end of the memory estimate (estimateSpread)."""
        options = [plan_for(arch, total, p.tp, release=r, pp=pipeline_parallel_size, util=gpu_memory_utilization,
                            kv_cache_dtype=kv_dtype, kv_cache_memory_bytes=kv_cache_memory_bytes, task=task,
                            block_size=block_size, longest=ceiling, enforce_eager=p.enforce_eager,
                            max_num_seqs=p.max_num_seqs_cap, max_num_batched_tokens=p.max_num_batched_tokens,
                            spread=spread, lora=lora)
                   for r in pessimists]
        return min(options, key=lambda q: q.blocks)

    plans = [plan(tp) for tp in candidates]
    need = target if target is not None else block_size

    def pick(options: list[Plan]) -> Plan | None:
        """The smallest TP holding one request of ``need`` tokens at the pessimistic end (vLLM starts there
        too), else nominally, else the one holding the longest; None when none holds a block."""
        found = next((p for p in options if low(p).fits(need)), None) or next((p for p in options if p.fits(need)),
                                                                               None)
        if found is None:
            usable = [p for p in options if p.fits(block_size)]
            found = max(usable, key=lambda p: (p.longest(need), -p.tp)) if usable else None
        return found

    typical = typical_tokens or (TYPICAL_EMBED_TOKENS if task == "embed" else TYPICAL_CHAT_TOKENS)
    # What a remedy must leave room for: the length asked for, else one typical request (or the model's maximum).
    useful = requested_len if requested_len is not None else min(typical, target) if target is not None else typical
    aim = useful  # the length below which the pessimistic end's shorter max_model_len would serve nobody
    picked = pick(plans)
    without: Plan | None = None  # the plan at the chosen TP without the remedy, when one was needed
    if picked is None and remedies:
        tried = remedy(plans, pick=pick, plan=plan, low=low, task=task, need=need, useful=useful,
                        batch_free=max_num_batched_tokens is None, eager_free=enforce_eager is None,
                        seqs=max_num_seqs or plans[0].max_num_seqs_cap)
        if tried is None or tried.chosen is None:
            raise refusal(arch, gpu, plans[-1], util=gpu_memory_utilization, gpus=tp_gpus,
                          pp=pipeline_parallel_size, task=task, block_size=block_size,
                          kv_given=kv_cache_memory_bytes is not None,
                          remedied=tried.plans[-1] if tried is not None else None)
        without = next(p for p in plans if p.tp == tried.chosen.tp)
        plans, picked = tried.plans, tried.chosen
    if picked is None:
        raise refusal(arch, gpu, plans[-1], util=gpu_memory_utilization, gpus=tp_gpus, pp=pipeline_parallel_size,
                      task=task, block_size=block_size, kv_given=kv_cache_memory_bytes is not None)
    chosen = picked

    def length_for(plan: Plan, spread: bool = True) -> int | None:
        """max_model_len for a plan: the ceiling, capped to what one request may hold (and, when no length was
        asked for, to what one request may hold at the pessimistic end, so vLLM's start-up check passes there
        too, and with `spread` to room for MIN_CONCURRENCY full-length requests)."""
        if ceiling is None:
            return None
        length = plan.longest(ceiling)
        if requested_len is None:
            # Down to what one request may hold at the pessimistic end, unless that is below a typical request's
            # length (or the one asked of a remedy): such a length serves nobody, so the nominal one stays, sized
            # for the nominal end only (which `triarch plan` refuses).
            safe = low(plan).longest(ceiling)
            if aim is None or safe >= min(aim, length):
                length = min(length, safe)
        if spread and requested_len is None and target is not None and plan.concurrency(length) < MIN_CONCURRENCY:
            room = pow2_floor(length)
            while room > target and plan.concurrency(room) < MIN_CONCURRENCY:
                room //= 2
            length = min(length, max(room, min(target, plan.longest(target))))
        return length

    final_len = length_for(chosen)
    seqs = int(chosen.concurrency(min(final_len or typical, typical)))
    seqs = max_num_seqs or _round_down(max(1, min(chosen.max_num_seqs_cap, seqs)), 8)
    batched = chosen.max_num_batched_tokens
    if task == "embed" and max_num_batched_tokens is None:
        # no larger than the activation estimate assumed, no smaller than one whole request (the one asked for:
        # a pooling step holds it whole, so its activation is what the KV cache must be sized after)
        batched = min(batched, max(DEFAULT_CONTEXT_TARGET, requested_len or final_len or 0))
    batched = max(batched, seqs)
    if (seqs, batched) != (chosen.max_num_seqs_cap, chosen.max_num_batched_tokens):
        # vLLM profiles with the batch it is given: size the KV cache again with these args, so the numbers
        # reported are the ones vLLM will compute (a smaller batch only frees memory: the batch stays valid).
        chosen = plan(chosen.tp, seqs, batched, chosen.enforce_eager)
        final_len = length_for(chosen)
    if task == "embed" and final_len is not None:
        final_len = min(final_len, batched)  # pooling takes a whole request in one step
    if without is not None:
        notes.append(remedy_note(without, chosen, batched, task=task))
    if ceiling is not None and final_len is not None and final_len < ceiling:
        if requested_len is not None:
            # vLLM refuses to start when one request of max_model_len does not fit the KV cache. The length
            # suggested fits at the pessimistic end too, which `triarch plan` holds a length to: followed, it plans.
            safe = low(chosen).longest(ceiling)
            fp8_holds = kv_cache_dtype != "fp8" and low(chosen, "fp8").fits(requested_len)
            most = (f"ask for at most {safe} ({final_len} fits at the nominal end of the memory estimate only)"
                    if block_size <= safe < final_len else f"ask for at most {final_len}")
            raise LengthRefused(f"max_model_len {requested_len} does not fit: the KV cache holds "
                                f"{chosen.reported_tokens(None)} tokens ({chosen.blocks} blocks) at "
                                f"tensor_parallel_size={chosen.tp} on {gpu.product}, and vLLM refuses to start "
                                f"below one full request; {most}, "
                                f"{LENGTH_HINT if fp8_holds else LENGTH_GPUS_HINT}")
        held = (f"a pooling request is taken in one step of max_num_batched_tokens {batched} (the KV cache holds "
                f"{chosen.reported_tokens(final_len)} tokens)"
                if without is not None and task == "embed" and final_len == batched < chosen.longest(ceiling)
                else f"the KV cache holds {low(chosen).reported_tokens(final_len)} tokens at the pessimistic end of "
                     f"the memory estimate ({chosen.reported_tokens(final_len)} nominally)"
                if final_len == low(chosen).longest(ceiling) < chosen.longest(final_len + 1)
                else f"the KV cache holds {chosen.reported_tokens(final_len)} tokens")
        single, ruled = length_for(chosen, spread=False), length_for(chosen)
        if single is not None and ruled is not None and final_len == ruled < single:  # the rule cut it
            floor = f" and goes no lower than {target}" if target is not None and final_len == target else ""
            notes.append(f"max_model_len {ceiling} capped to {final_len} so several full-length requests fit the KV "
                         f"cache at once: {chosen.concurrency(final_len):.1f} at this length (the tuner aims at "
                         f"{MIN_CONCURRENCY}{floor}; {chosen.reported_tokens(final_len)} tokens at "
                         f"tensor_parallel_size={chosen.tp}); max_model_len={single} keeps the longest context "
                         f"that fits, at {chosen.concurrency(single):.1f}")
        else:
            notes.append(f"max_model_len {ceiling} capped to {final_len}: {held} at tensor_parallel_size={chosen.tp}")
    concurrency = chosen.concurrency(final_len) if final_len else None
    pessimistic = low(chosen)
    one_request = final_len or block_size
    fits_instead: list[tuple[str, int | str]] = []
    if not pessimistic.fits(one_request):
        # Sized for the nominal end only (a length or tensor-parallel size asked for, or nothing in reach holds a
        # useful request there): what would fit at the pessimistic end, one change at a time.
        limit_tp = tp_limit if tp_limit is not None else tp_gpus
        larger = (plan(t, batched=batched, eager=chosen.enforce_eager) for t in _tp_candidates(arch, limit_tp)
                  if t > chosen.tp)
        safer = next((p.tp for p in larger if low(p).fits(one_request)), None)
        if safer is not None:
            fits_instead.append(("tensor_parallel_size", safer))
        shorter = pessimistic.longest(one_request)
        if final_len is not None and shorter >= block_size:
            fits_instead.append(("max_model_len", shorter))
        if kv_cache_dtype != "fp8" and low(chosen, "fp8").fits(one_request):
            fits_instead.append(("kv_cache_dtype", "fp8"))

    args: dict[str, Any] = {"tensor_parallel_size": chosen.tp}
    if pipeline_parallel_size > 1:
        args["pipeline_parallel_size"] = pipeline_parallel_size
    if kv_cache_memory_bytes is not None:
        args["kv_cache_memory_bytes"] = kv_cache_memory_bytes
    else:
        args["gpu_memory_utilization"] = gpu_memory_utilization
    if final_len is not None:
        args["max_model_len"] = final_len
    args["max_num_seqs"] = seqs
    args["max_num_batched_tokens"] = batched
    args["kv_cache_dtype"] = kv_cache_dtype
    args["block_size"] = block_size
    if chosen.enforce_eager:
        args["enforce_eager"] = True
    if task == "embed":
        args["runner"] = "pooling"
        args["convert"] = "embed"

    return Sizing(
        model=arch.label,
        gpu=gpu.key,
        task=task,
        num_parameters=count_parameters(arch, task=task),
        weights_bytes=weight_bytes(arch, task=task),
        kv_bytes_per_token=chosen.kv_per_token,
        kv_cache_blocks=chosen.blocks,
        kv_bytes_per_block=chosen.layout.bytes_per_block,
        kv_cache_tokens=chosen.reported_tokens(final_len),
        block_size=block_size,
        max_model_len=final_len,
        max_concurrency=concurrency,
        tensor_parallel_size=chosen.tp,
        pipeline_parallel_size=pipeline_parallel_size,
        available_kv_bytes=chosen.budget.available_kv,
        available_kv_bytes_low=pessimistic.budget.available_kv,
        kv_cache_tokens_low=pessimistic.reported_tokens(final_len),
        moe=arch.is_moe,
        memory=chosen.budget,
        engine_args=args,
        notes=tuple(notes),
        vllm_version=release.version,
        context_limit=limit.tokens if limit is not None else None,
        context_derivation=limit.derivation if limit is not None else "",
        combined_kv_line=release.kv_tokens_reported == "concurrency",
        sized_for="nominal" if not pessimistic.fits(one_request) else "pessimistic",
        fits_instead=tuple(fits_instead),
    )
