"""What the tuner says when a model does not fit, and what it tries first: the refusal with its numbers and the
hint of what would help (said again in stack keys by the planner, in flags by `triarch tune`), and the remedies a
person would try before refusing (a smaller batch, eager mode), with the note that says what they cost."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from triarch.catalog import Gpu
from triarch.tuner.arch import ModelArch, Task, TuneError
from triarch.tuner.plan import Plan
from triarch.tuner.units import GIB, MIB
from triarch.tuner.weights import weight_bytes

TYPICAL_CHAT_TOKENS = 2048
"""Tokens (prompt + output) of a typical chat request, to translate KV tokens into a useful ``max_num_seqs``."""

REMEDY_HINT = "more memory per replica (a larger gpu_memory_utilization or GPU) keeps the defaults"
"""How a plan that needed eager mode or a smaller batch gets its defaults back (a stack says it in stack keys,
`triarch tune` in its flags)."""

REFUSAL_HINT = "try more GPUs (gpus_available), a quantized checkpoint, kv_cache_dtype='fp8' or a smaller max_model_len"
"""What a refusal proposes, in the tuner's argument names (a stack's refusal says it in stack keys)."""
LENGTH_HINT = "fp8 KV or more GPUs"
LENGTH_GPUS_HINT = "more GPUs (fp8 KV would not hold it either)"
"""A length refusal's remedies: fp8 KV only where it holds one request of that length at the pessimistic end too."""
WEIGHTS_HINT = "try more GPUs (gpus_available), a GPU with more memory or a quantized checkpoint"
"""What a refusal proposes where the weights leave no room for any KV cache: KV settings cannot help there."""


def pow2_floor(value: int) -> int:
    """The largest power of two <= value (0 for value < 1)."""
    return 1 << (value.bit_length() - 1) if value >= 1 else 0


def _gib(value: int) -> str:
    return f"{value / GIB:.1f} GiB"


def tried(plan: Plan, remedied: Plan | None, *, kv_given: bool) -> str:
    """What the refusal says of the remedies tried (eager mode, a smaller batch): the most remedied plan's numbers."""
    if remedied is None:
        return ""
    eager = remedied.enforce_eager and not plan.enforce_eager
    smaller = remedied.max_num_batched_tokens < plan.max_num_batched_tokens
    what = " and ".join((["eager mode"] if eager else []) + (["a smaller batch"] if smaller else []))
    args = " and ".join((["enforce_eager"] if eager else [])
                        + ([f"max_num_batched_tokens {remedied.max_num_batched_tokens} (the fewest a request "
                            "needs)"] if smaller else []))
    b = remedied.budget
    still = (f"still needs {_gib(-b.spare)} more" if kv_given
             else f"the KV cache still gets {b.available_kv / GIB:.2f} GiB")
    return f"; {what} {'were' if eager and smaller else 'was'} tried too: with {args} {still}"


def refusal(arch: ModelArch, gpu: Gpu, plan: Plan, *, util: float, gpus: int, pp: int, task: Task,
             block_size: int, kv_given: bool, remedied: Plan | None = None) -> TuneError:
    b = plan.budget
    total = b.total
    label = f"{gpu.product} ({_gib(total)})"
    hint = REFUSAL_HINT
    where = f"tensor_parallel_size={plan.tp}" + (f", pipeline_parallel_size={pp}" if pp > 1 else "")
    if kv_given:
        return TuneError(
            f"{arch.label} needs {_gib(b.weights)} of weights per GPU ({where}) plus {_gib(b.overhead)} of "
            f"non-torch/activation/CUDA-graph memory; with kv_cache_memory_bytes={b.available_kv} "
            f"({_gib(b.available_kv)}) that is {_gib(-b.spare)} more than the {label} holds"
            f"{tried(plan, remedied, kv_given=True)}; {hint}"
        )
    room = b.requested - b.overhead
    if b.available_kv <= 0:
        hint = WEIGHTS_HINT
    return TuneError(
        f"{arch.label} needs {_gib(b.weights)} of weights per GPU ({where}, the most {gpus} GPU(s) allow; "
        f"{_gib(weight_bytes(arch, task=task))} in all); {label} at gpu_memory_utilization {util} leaves "
        f"{_gib(room)} after {_gib(b.non_torch)} non-torch memory, {_gib(b.activation_peak)} activation peak "
        f"and {_gib(b.cuda_graphs)} CUDA graphs, so the KV cache gets {b.available_kv / GIB:.2f} GiB "
        f"(one block of {block_size} tokens needs {block_size * plan.kv_per_token / MIB:.1f} MiB)"
        f"{tried(plan, remedied, kv_given=False)}; {hint}", weights_alone=hint == WEIGHTS_HINT
    )


@dataclass(frozen=True)
class Remedied:
    plans: list[Plan]
    """Every tensor-parallel candidate with the remedy (for a refusal: the most remedied one tried)."""
    chosen: Plan | None
    """The plan picked among them; None when not even the remedies leave a KV block."""


def _smaller_batches(default: int, floor: int) -> list[int]:
    """Batched-token budgets below ``default``, largest first: the powers of two above ``floor``, then ``floor``."""
    out = []
    size = pow2_floor(default - 1)
    while size > floor:
        out.append(size)
        size //= 2
    return [*out, floor] if floor < default else out


def remedy(defaults: list[Plan], *, pick: Callable[[list[Plan]], Plan | None], plan: Callable[..., Plan],
            low: Callable[[Plan], Plan], task: Task, need: int, useful: int, batch_free: bool, eager_free: bool,
            seqs: int) -> Remedied | None:
    """What a person tries before giving up on a model no tensor-parallel size leaves a KV block for, least
    intrusive first: a smaller batch (``max_num_batched_tokens`` sizes the activation peak; never below
    ``max_num_seqs``, nor below ``useful`` tokens: for embed a pooling request is taken in one step, so the batch
    caps the context; for generate a typical request should prefill in one), eager mode (no CUDA-graph memory, at
    some throughput), then both. Only what the caller left open is tried.

    Of each remedy's batches, the one giving the longest request at the pessimistic end of the estimate, then at
    the nominal one (up to ``need``; ties: the larger batch). The first remedy whose request reaches ``useful``
    is taken (nominally, as a tensor-parallel size is: the pessimistic end shortens the length or adds a note),
    else the one giving the longest. None when there is nothing to try."""
    default = defaults[0].max_num_batched_tokens
    eager = defaults[0].enforce_eager
    floor = max(seqs, useful if task == "embed" else min(useful, TYPICAL_CHAT_TOKENS))
    smaller = _smaller_batches(default, floor) if batch_free else []
    remedies = ([(eager, smaller)] if smaller else []) + ([(True, [default])] if eager_free else []) + (
        [(True, smaller)] if eager_free and smaller else [])
    if not remedies:
        return None
    best: list[tuple[tuple[int, int, int], list[Plan], Plan]] = []  # per remedy: (score, its plans, the pick)
    options: list[Plan] = []
    for eager_mode, batches in remedies:
        found = []
        for batched in batches:
            options = [plan(p.tp, batched=batched, eager=eager_mode) for p in defaults]
            chosen = pick(options)
            if chosen is None:
                continue
            cap = min(need, batched) if task == "embed" else need
            score = (min(low(chosen).longest(need), cap), min(chosen.longest(need), cap), batched)
            found.append((score, options, chosen))
        if found:
            best.append(max(found, key=lambda f: f[0]))
    if not best:
        return Remedied(options, None)
    taken = next((b for b in best if b[0][1] >= useful), None) or max(best, key=lambda b: b[0][:2])
    return Remedied(taken[1], taken[2])


def remedy_note(without: Plan, chosen: Plan, batched: int, *, task: Task) -> str:
    """What the remedy changed and why, in vLLM's words (the hint in the caller's)."""
    eager = chosen.enforce_eager and not without.enforce_eager
    smaller = batched < without.max_num_batched_tokens
    b = without.budget
    changed = " and ".join((["enforce_eager"] if eager else [])
                           + ([f"max_num_batched_tokens {batched} (not {without.max_num_batched_tokens})"]
                              if smaller else []))
    took = " and ".join(([f"{_gib(b.cuda_graphs)} of CUDA graphs"] if eager else [])
                        + ([f"a {_gib(b.activation_peak)} activation peak for {without.max_num_batched_tokens} "
                            "tokens a step"] if smaller else []))
    costs = "; ".join((["eager mode runs without CUDA graphs, at some throughput"] if eager else [])
                      + ([f"a pooling request is taken in one step, so max_model_len is at most {batched}"
                          if task == "embed" else "a long prompt takes more steps to prefill"] if smaller else []))
    short = (f"kv_cache_memory_bytes={b.available_kv} would be {_gib(-b.spare)} more than the GPU holds"
             if b.kv_cache_memory_bytes is not None else f"the KV cache would get {b.available_kv / GIB:.2f} GiB")
    return f"{changed}: with {took} {short} at tensor_parallel_size={chosen.tp}; {costs}; {REMEDY_HINT}"
