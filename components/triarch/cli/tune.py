"""`triarch tune`: vLLM's KV cache and engine args sized for a model on a GPU (or across nodes), said in the
command's flags."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from triarch.cli.common import Commands
from triarch.errors import TriarchError

if TYPE_CHECKING:
    from triarch.tuner import Sizing


FITS_FLAGS = {"tensor_parallel_size": "--tensor-parallel-size {}", "max_model_len": "--max-model-len {}",
              "kv_cache_dtype": "--kv-cache-dtype {}"}
"""What fits at the pessimistic end, as `triarch tune`'s flags."""


def sized_for(sizing: Sizing) -> str:
    """Which end of the memory estimate the engine args start at; at the nominal one only, why not the other and
    what would (the answer `triarch plan` refuses with)."""
    if sizing.sized_for == "pessimistic":
        return "sized for the pessimistic end of the estimate: the engine args start there too"
    fits = [FITS_FLAGS[key].format(value) for key, value in sizing.fits_instead]
    if not any(key == "tensor_parallel_size" for key, _ in sizing.fits_instead):
        fits.append("more GPUs per replica (--gpus, or more nodes with --nodes)")
    said = ", ".join(fits[:-1]) + f" or {fits[-1]}" if len(fits) > 1 else fits[0]
    return f"sized for the nominal end only: {sizing.shortfall()}; triarch plan refuses it; what fits there: {said}"


def tune_flags() -> tuple[tuple[str, str], ...]:
    """The tuner's refusal and note hints as `triarch tune`'s flags (a stack says them in stack keys); the tuner
    imported only when a command tunes."""
    from triarch.tuner.remedies import LENGTH_GPUS_HINT, LENGTH_HINT, REFUSAL_HINT, REMEDY_HINT, WEIGHTS_HINT

    return (
        (REFUSAL_HINT, "try more GPUs (--gpus, or more nodes with --nodes), a quantized checkpoint, "
                       "--kv-cache-dtype fp8 or a smaller --max-model-len"),
        (LENGTH_HINT, "--kv-cache-dtype fp8 or more GPUs (--gpus)"),
        (LENGTH_GPUS_HINT, "more GPUs (--gpus; --kv-cache-dtype fp8 would not hold it either)"),
        ("max_model_len=", "--max-model-len "),
        (WEIGHTS_HINT, "try more GPUs (--gpus, or more nodes with --nodes), a --gpu with more memory or a quantized "
                       "checkpoint"),
        (REMEDY_HINT, "more memory per replica (a larger --gpu-memory-utilization or --gpu) keeps the defaults; "
                      "--no-enforce-eager and --max-num-batched-tokens set them yourself"),
    )


def in_flags(message: str) -> str:
    for tuner, flags in tune_flags():
        message = message.replace(tuner, flags)
    return message


def cmd_tune(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from triarch.catalog import Gpu, catalog
    from triarch.tuner import GIB, Task, TuneError, find_arch, load_arch, tune
    from triarch.tuner.nodes import NodesRefused, tune_nodes
    from triarch.tuner.releases import default_image

    read = None
    if args.revision and not args.model:
        raise TriarchError("--revision: names a revision of --model on the Hub; allowed: with --model only")
    if args.model:
        arch, read = find_arch(args.model, revision=args.revision, config_key="--model-config path/to/config.json")
    else:
        arch = load_arch(args.model_config)
    per_node = 8
    if args.gpu is not None:
        name, per_node = gpu_named(args.gpu)
        gpu = catalog().gpus[name]
    elif args.kv_cache_memory_bytes is not None:
        # The KV budget is given: the GPU only has to be large enough to hold it next to the weights.
        gpu = Gpu("unspecified", "unspecified GPU (KV budget given)", "unknown", "0.0", 1 << 30, "0.0", True, None)
    else:
        raise TriarchError("--gpu: missing; allowed: a GPU from templates/compat/gpus.yaml, or pass "
                           "--kv-cache-memory-bytes to size the KV cache without one")
    task: Task = args.task or ("embed" if "embedding" in arch.label.lower() else "generate")
    args.gpus = per_node if args.gpus is None else args.gpus
    if args.nodes < 1:
        raise TriarchError(f"--nodes: {args.nodes} is not allowed; allowed: 1 or more (nodes of --gpus GPUs)")
    options = {"vllm_version": args.vllm_version, "gpu_memory_utilization": args.gpu_memory_utilization,
               "max_model_len": args.max_model_len, "kv_cache_dtype": args.kv_cache_dtype,
               "kv_cache_memory_bytes": args.kv_cache_memory_bytes, "task": task, "max_num_seqs": args.max_num_seqs,
               "max_num_batched_tokens": args.max_num_batched_tokens, "enforce_eager": args.enforce_eager}
    try:
        if args.nodes == 1 and args.pipeline_parallel_size is None:
            sizing = tune(arch, gpu, tensor_parallel_size=args.tensor_parallel_size, gpus_available=args.gpus,
                          **options)
        else:
            sizing = tune_nodes(arch, gpu, gpus_per_node=args.gpus, max_nodes=args.nodes,
                                tensor_parallel_size=args.tensor_parallel_size,
                                pipeline_parallel_size=args.pipeline_parallel_size, **options)
    except NodesRefused as error:
        raise TriarchError(in_flags(f"{arch.label} on {args.nodes} node(s) of {args.gpus} {gpu.product}: one node: "
                                    f"{error.one_node}; {error}")) from None
    except TuneError as error:
        raise type(error)(in_flags(str(error))) from None
    if args.json:
        document = {k: v for k, v in dataclasses.asdict(sizing).items() if k != "memory"}
        document["memory"] = dataclasses.asdict(sizing.memory)
        if read is not None:
            document["hub"] = {"repo": read.repo, "revision": read.revision, "commit": read.commit,
                               "notes": list(read.notes)}
        print(json.dumps(document, indent=2, sort_keys=True))
        return 0
    pinned = "" if args.vllm_version else f", the version in {default_image()}"
    if read is not None:
        print(f"read from the Hub: {read.describe()}" + "".join(f"; {note}" for note in read.notes))
    print(f"{sizing.model} on {gpu.product} ({task}): {sizing.num_parameters / 1e9:.2f}B parameters, "
          f"tensor_parallel_size={sizing.tensor_parallel_size}; as vLLM {sizing.vllm_version} sizes it{pinned}")
    if sizing.context_limit is not None:
        print(f"  longest context vLLM {sizing.vllm_version} derives: {sizing.context_limit:,} tokens "
              f"({sizing.context_derivation})")
    for line in sizing.stage_lines():
        print(f"  {line}")
    for line in sizing.log_lines():
        print(f"  {line}")
    if sizing.kv_cache_tokens_low < sizing.kv_cache_tokens:
        print(f"  at the pessimistic end of the estimate (every component at its worst calibrated underestimate): "
              f"{sizing.available_kv_bytes_low / GIB:.2f} GiB, {sizing.kv_cache_tokens_low:,} tokens")
    print(f"  {sized_for(sizing)}")
    for note in sizing.notes:
        print(f"  note: {in_flags(note)}")
    print("engine args: " + " ".join(f"--{k.replace('_', '-')}={v}" for k, v in sizing.engine_args.items()))
    return 0


def gpu_named(value: str) -> tuple[str, int]:
    """`--gpu` as a stack speaks: a GPU of gpus.yaml in any case (`L4`), or an instance type (`g6.xlarge`), which
    also gives the GPUs a node has. Returns the GPU's key and the GPUs per node (8 for a bare GPU)."""
    from triarch.catalog import catalog

    facts = catalog()
    if value.lower() in facts.gpus:
        return value.lower(), 8
    instance = facts.instances.get(value.lower())
    if instance is not None and instance.gpu is not None:
        return instance.gpu, instance.gpus
    from triarch.config.pools import unknown

    with_gpus = sorted(n for n, i in facts.instances.items() if i.gpu is not None)
    raise unknown("--gpu", value, "GPU or GPU instance type", [*sorted(facts.gpus), *with_gpus],
                  "templates/compat/gpus.yaml or instances.yaml")


def add_parser(commands: Commands) -> None:
    tune = commands.add_parser("tune", help="size vLLM's KV cache and engine args for a model on a GPU")
    model = tune.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", help="a model of templates/models (e.g. Qwen/Qwen3-8B), or any Hugging Face "
                                       "repository of an architecture the tuner knows, read from the Hub "
                                       "($HF_ENDPOINT, $HF_TOKEN) or from the cache of `triarch model fetch`")
    model.add_argument("--model-config", help="path to any Hugging Face config.json")
    tune.add_argument("--revision", help="the Hub revision of --model to size (a commit, branch or tag; default: "
                                         "the catalog's entry, else main)")
    tune.add_argument("--gpu", help="a GPU of templates/compat/gpus.yaml (e.g. l4, a100-80gb; any case), or an "
                                    "instance type of templates/compat/instances.yaml (e.g. g6.xlarge): its GPU, "
                                    "and its GPUs per node unless --gpus says")
    tune.add_argument("--gpus", type=int, help="GPUs per node the tensor-parallel search may use (default: the "
                                               "instance type's, else 8)")
    tune.add_argument("--tensor-parallel-size", type=int,
                      help="GPUs each layer is split over, within a node (default: the fewest that fit)")
    tune.add_argument("--pipeline-parallel-size", type=int, help="stages; beyond one node, whole nodes each")
    tune.add_argument("--nodes", type=int, default=1,
                      help="most nodes of --gpus GPUs one replica may span (TP within a node, PP across)")
    tune.add_argument("--gpu-memory-utilization", type=float, help="default: the vLLM release's own default")
    tune.add_argument("--vllm-version", help="size as this vLLM release does (templates/compat/vllm-releases.yaml; "
                                             "default: the vLLM of the pinned vllm/vllm-openai image)")
    tune.add_argument("--max-model-len", type=int,
                      help="the longest request in tokens (default: the longest the KV cache holds at a useful "
                           "batch, capped by the model's own)")
    tune.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], default="auto",
                      help="fp8 halves the KV cache's memory (default: auto, the model's dtype)")
    tune.add_argument("--max-num-seqs", type=int, help="fix vLLM's batch size (default: sized from the KV cache)")
    tune.add_argument("--max-num-batched-tokens", type=int, help="fix the tokens per step (sizes the activation)")
    tune.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction,
                      help="fix eager mode on or off (default: CUDA graphs, eager only where they leave no KV cache)")
    tune.add_argument("--kv-cache-memory-bytes", type=int, help="the KV budget per GPU, as vLLM's flag of that name")
    tune.add_argument("--task", choices=["generate", "embed"], help="default: embed for embedding models")
    tune.add_argument("--json", action="store_true", help="one JSON object instead of the start-up log")
    tune.set_defaults(handler=cmd_tune)
