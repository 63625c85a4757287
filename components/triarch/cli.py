"""triarch: LLM inference on Kubernetes, set up right the first time. Plan a stack offline under Pulumi's mock
engine (no cloud, no credentials), check it against the guardrails, diff two plans, size vLLM for a model and a
GPU, review a change as its pull request would be, and verify a live cluster. `pulumi up` deploys what it plans."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from triarch.errors import EXIT_USAGE, TriarchError


@contextmanager
def progress(message: str, stream: TextIO | None = None, after: float = 1.5) -> Iterator[None]:
    """A spinner on a terminal once the work takes longer than `after` seconds; one line otherwise."""
    stream = stream or sys.stderr
    if not stream.isatty():
        print(f"{message} ...", file=stream, flush=True)
        yield
        return
    done = threading.Event()

    def spin() -> None:
        if done.wait(after):
            return
        frames = "|/-\\"
        start = time.monotonic()
        i = 0
        while not done.wait(0.1):
            print(f"\r{message} {frames[i % 4]} {time.monotonic() - start + after:4.1f}s", end="", file=stream,
                  flush=True)
            i += 1
        print("\r" + " " * (len(message) + 12) + "\r", end="", file=stream, flush=True)

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _stack_source(args: argparse.Namespace) -> tuple[str, Path]:
    from triarch.offline import stack_file, stack_name_of

    if args.stack_file:
        path = Path(args.stack_file)
        if path.is_dir():
            raise TriarchError(f"--stack-file: {str(path)!r} is a directory; allowed: a Pulumi stack file path")
        if not path.is_file():
            raise TriarchError(f"--stack-file: {str(path)!r} does not exist; allowed: a Pulumi stack file path")
        return stack_name_of(path), path
    return args.stack, stack_file(args.stack)


def cmd_plan(args: argparse.Namespace) -> int:
    from triarch.report.planning import plan_stack
    from triarch.report.summary import summary
    from triarch.report.validation import validate_stack_file

    name, path = _stack_source(args)
    out = Path(args.out) if args.out else Path("out") / name
    if args.at:
        from triarch.baseline import plan_at

        stack_args = ["--stack-file", str(path.resolve())] if args.stack_file else ["--stack", name]
        with progress(f"planning stack {name} as of {args.at} (its code and stack file, in a worktree)"):
            printed = plan_at(args.at, stack_args, out)
        print(printed, end="")
        return 0
    validated = validate_stack_file(name, path)
    with progress(f"planning stack {name} (Pulumi mock engine, no cloud calls)"):
        result = plan_stack(validated, out)
    print(summary(result))
    print(f"\nwrote {out / 'plan.json'} (every resource and its inputs), {out / 'capacity.json'} (pools, GPUs and "
          f"cost) and {len(result.manifest_paths)} manifest(s) in {out / 'manifests'}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    import tempfile

    from triarch.diff import load_plan
    from triarch.guardrails.check import (
        evaluate,
        load_policy_config,
        report_json,
        report_markdown,
        report_text,
        resources_of_plan,
    )
    from triarch.guardrails.placement import headroom, prove
    from triarch.report.planning import plan_stack
    from triarch.report.validation import validate_stack_file

    policy_config = load_policy_config(Path(args.policy_config) if args.policy_config else None)
    if args.manifests:
        from triarch.guardrails.manifests import read_manifests

        resources = read_manifests(args.manifests)
        findings = evaluate(resources, policy_config)
        name = "manifests"
        if args.format == "json":
            print(report_json(findings, name))
        elif args.format == "markdown":
            print(report_markdown(findings, name))
        else:
            print(report_text(findings))
        return 1 if any(f.enforcement == "mandatory" for f in findings) else 0
    if args.plan:
        document = load_plan(Path(args.plan), option="--plan")
        name = str(document.get("stack") or Path(args.plan).name)
    else:
        name, path = _stack_source(args)
        validated = validate_stack_file(name, path)
        with progress(f"checking stack {name} against triarch-guardrails"), \
                tempfile.TemporaryDirectory() as scratch:
            out = Path(args.out) if args.out else Path(scratch)
            plan_stack(validated, out)
            document = load_plan(out)
    resources = resources_of_plan(document)
    findings = evaluate(resources, policy_config)
    placement = headroom(prove(resources))
    if args.format == "json":
        print(report_json(findings, name, placement))
    elif args.format == "markdown":
        print(report_markdown(findings, name, placement))
    else:
        print(report_text(findings, placement))
    return 1 if any(f.enforcement == "mandatory" for f in findings) else 0


def _same_stack(base: dict[str, Any], name: str, base_from: str, across: bool) -> None:
    """Two plans of different stacks differ in every URN: refused unless asked for."""
    base_stack = str(base.get("stack") or "")
    if base_stack and base_stack != name and not across:
        raise TriarchError(
            f"--base: {base_from} plans stack {base_stack!r} and the head is stack {name!r}: URNs carry the stack "
            f"name, so every resource would differ; allowed: the same stack (--stack {base_stack}), or "
            "--across-stacks to compare them anyway")


def cmd_diff(args: argparse.Namespace) -> int:
    import json
    import tempfile

    from triarch.baseline import base_plan, base_source
    from triarch.cost import capacity_change
    from triarch.diff import diff_plans, load_capacity, load_plan
    from triarch.effects import traffic_effects
    from triarch.report.changes import diff_markdown, diff_text
    from triarch.report.planning import plan_stack
    from triarch.report.validation import validate_stack_file
    from triarch.service_rules import refusals

    with tempfile.TemporaryDirectory() as scratch:
        if args.plan:
            head_dir = Path(args.plan)
            head = load_plan(head_dir, option="--plan")
            name = str(head.get("stack") or head_dir.name)
            head_source = f"the plan in {head_dir}"
            stack_args, base_from = base_source(args.base, name, None)
            base, base_capacity = base_plan(args.base, stack_args)
            _same_stack(base, name, base_from, args.across_stacks)
        else:
            name, path = _stack_source(args)
            head_source = str(path)
            # A git base is planned with its own stack file: the same file as of that ref (or, for a file
            # outside the repository, the ref's stack of that name), never the edited one.
            stack_args, base_from = base_source(args.base, name, path if args.stack_file else None)
            base, base_capacity = base_plan(args.base, stack_args)
            _same_stack(base, name, base_from, args.across_stacks)
            validated = validate_stack_file(name, path)
            head_dir = Path(scratch)
            with progress(f"planning stack {name} and comparing it with {args.base}"):
                plan_stack(validated, head_dir)
            head = load_plan(head_dir)
        refused = refusals(base, head)
        if refused:  # what AWS would refuse, before any table says "updated in place"
            raise TriarchError(refused[0])
        result = diff_plans(base, head, intended=args.intended or [])
        head_capacity = load_capacity(head_dir)
        result.capacity = capacity_change(base_capacity, head_capacity)
        result.effects = traffic_effects(result, base, head, base_capacity, head_capacity)
    compared = f"compared: base {base_from}, head {head_source}"
    if args.format == "json":
        print(json.dumps({**result.as_json(), "compared": {"base": base_from, "head": head_source}}, indent=2,
                         sort_keys=True))
    elif args.format == "markdown":
        print(diff_markdown(result, name, args.base, compared))
    else:
        print(diff_text(result, name, args.base, compared))
    return 1 if result.blocking else 0


def cmd_comment(args: argparse.Namespace) -> int:
    from triarch.review import failures, review_markdown

    directory = Path(args.directory)
    if not (directory / "head").is_dir():
        raise TriarchError(f"comment: {str(directory)!r} has no head/ directory; allowed: the directory the review "
                           "workflow writes (head/<stack>, base/<stack>, check/<stack>.json, diff/<stack>.json)")
    markdown = review_markdown(directory, args.base_ref, args.head_ref)
    if args.out:
        Path(args.out).write_text(markdown, encoding="utf-8")
    else:
        print(markdown, end="")
    failing = failures(directory)
    for failure in failing:
        print(f"review: {failure}", file=sys.stderr)
    return 1 if args.strict and failing else 0


TUNE_FLAGS = (
    ("try more GPUs (gpus_available), a quantized checkpoint, kv_cache_dtype='fp8' or a smaller max_model_len",
     "try more GPUs (--gpus, or more nodes with --nodes), a quantized checkpoint, --kv-cache-dtype fp8 or a smaller "
     "--max-model-len"),
    ("fp8 KV or more GPUs", "--kv-cache-dtype fp8 or more GPUs (--gpus)"),
    ("more memory per replica (a larger gpu_memory_utilization or GPU) keeps the defaults",
     "more memory per replica (a larger --gpu-memory-utilization or --gpu) keeps the defaults; --no-enforce-eager "
     "and --max-num-batched-tokens set them yourself"),
)
"""The tuner's refusal and note hints as `triarch tune`'s flags (a stack says them in stack keys)."""


def in_flags(message: str) -> str:
    for tuner, flags in TUNE_FLAGS:
        message = message.replace(tuner, flags)
    return message


def cmd_tune(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from triarch.catalog import Gpu, catalog
    from triarch.tuner import GIB, Task, TuneError, load_arch, tune
    from triarch.tuner.nodes import NodesRefused, tune_nodes
    from triarch.tuner.releases import default_image

    arch = load_arch(args.model or args.model_config)
    if args.gpu is not None:
        gpus = catalog().gpus
        if args.gpu not in gpus:
            from triarch.config.pools import unknown

            raise unknown("--gpu", args.gpu, "GPU", sorted(gpus), "templates/compat/gpus.yaml")
        gpu = gpus[args.gpu]
    elif args.kv_cache_memory_bytes is not None:
        # The KV budget is given: the GPU only has to be large enough to hold it next to the weights.
        gpu = Gpu("unspecified", "unspecified GPU (KV budget given)", "unknown", "0.0", 1 << 30, "0.0", True, None)
    else:
        raise TriarchError("--gpu: missing; allowed: a GPU from templates/compat/gpus.yaml, or pass "
                           "--kv-cache-memory-bytes to size the KV cache without one")
    task: Task = args.task or ("embed" if "embedding" in arch.label.lower() else "generate")
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
        print(json.dumps(document, indent=2, sort_keys=True))
        return 0
    pinned = "" if args.vllm_version else f", the version in {default_image()}"
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
              f"{sizing.available_kv_bytes_low / GIB:.2f} GiB, {sizing.kv_cache_tokens_low:,} tokens; the engine "
              "args start there too")
    for note in sizing.notes:
        print(f"  note: {in_flags(note)}")
    print("engine args: " + " ".join(f"--{k.replace('_', '-')}={v}" for k, v in sizing.engine_args.items()))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from triarch.catalog import catalog
    from triarch.planners.nodegroups import plan_pool
    from triarch.report.validation import validate_stack_file
    from triarch.verify.base import report
    from triarch.verify.cluster import Cluster, KubectlFailed, Unreachable
    from triarch.verify.run import verify

    name, path = _stack_source(args)
    validated = validate_stack_file(name, path)
    endpoints: dict[str, str] = {}
    for given in args.endpoint or []:
        model, sep, url = given.partition("=")
        if not sep or not url.startswith(("http://", "https://")):
            raise TriarchError(f"--endpoint: {given!r} is not NAME=URL; allowed: e.g. chat=http://127.0.0.1:8000")
        endpoints[model] = url
    stack = validated.stack
    pools = [plan_pool(stack, group, catalog()) for group in stack.node_groups]
    cluster = Cluster(args.context)
    try:
        cluster.reachable()
        findings = verify(cluster, stack, validated.models, pools, catalog(), endpoints)
    except Unreachable as why:
        print(f"verify {name}: skipped, no cluster reachable ({why})", file=sys.stderr)
        return 0
    except KubectlFailed as why:
        print(f"verify {name}: the cluster answered but {why}", file=sys.stderr)
        return 1
    print(f"verify {name} against its plan")
    print(report(findings))
    return 1 if any(not f.ok for f in findings) else 0


def cmd_local_build(args: argparse.Namespace) -> int:
    import json

    from triarch.local.engines import build_all, describe

    if args.list:
        print(json.dumps(describe(), indent=2))
        return 0
    build_all(args.engines or None, force=args.force)
    return 0


def cmd_local_up(args: argparse.Namespace) -> int:
    from triarch.local.lifecycle import up
    from triarch.local.stack import spec_for_stack
    from triarch.report.validation import validate_stack_file

    for option, given in (("--crds", args.crds), ("--charts", args.charts)):
        missing = [d for d in given or [] if not Path(d).is_dir()]
        if missing:
            raise TriarchError(f"{option} {missing[0]}: no such directory")
    name, path = _stack_source(args)
    validated = validate_stack_file(name, path)
    spec = spec_for_stack(args.name or name, validated.stack, [Path(d) for d in args.crds or []], args.all_crds,
                          args.from_zero, [Path(d) for d in args.charts or []])
    plane = up(spec)
    print(f"run commands on it: triarch local exec --name {spec.name} -- kubectl get nodes")
    print(f"bring it down:      triarch local down --name {spec.name}")
    print(f"(kubeconfig {plane.kubeconfig}; Pulumi state and plugins in {plane.directory})")
    return 0


def cmd_local_exec(args: argparse.Namespace) -> int:
    from triarch.local.lifecycle import exec_in
    from triarch.local.plane import only_plane

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    return exec_in(args.name or only_plane(), command)


def cmd_refdata_fill(args: argparse.Namespace) -> int:
    from triarch import refdata

    source: Path | str | None = None
    if args.source:
        source = args.source if refdata.is_mirror_url(args.source) else Path(args.source)
    problems = refdata.fill(source, log=print)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    listed = len(refdata.load_sources())
    print(f"{listed - len(problems)} of {listed} reference files cached and verified in {refdata.cache_root()}")
    return 1 if problems else 0


def cmd_refdata_status(args: argparse.Namespace) -> int:
    from triarch import refdata

    states = refdata.status()
    for rel, state in states.items():
        if state != "ok" or args.verbose:
            print(f"{state}: {rel}")
    bad = sum(state != "ok" for state in states.values())
    print(f"{len(states) - bad} of {len(states)} reference files cached and verified in {refdata.cache_root()}"
          + (f"; bring the rest with `{refdata.FILL_FROM_SHARED}`" if bad else ""))
    return 1 if bad else 0


def cmd_review(args: argparse.Namespace) -> int:
    from triarch.rehearsal import Refs, resolve_refs, review, stacks

    known = stacks()
    for stack in args.stack or []:
        if stack not in known:
            raise TriarchError(f"--stack: {stack!r} is not a stack of this project; allowed: {', '.join(known)}")
    refs = resolve_refs(args.base)
    if args.head_ref:
        refs = Refs(refs.base, args.head_ref)
    out = Path(args.out)
    comment = review(out, refs, args.stack)
    print(f"wrote {comment} (and head/, base/, check/, diff/ beside it; logs/ holds what each step printed)")
    if args.strict:
        from triarch.review import failures

        failing = failures(out)
        for failure in failing:
            print(f"review: {failure}", file=sys.stderr)
        return 1 if failing else 0
    return 0


def cmd_reference(args: argparse.Namespace) -> int:
    from triarch.config import reference

    into = Path(args.out) if args.out else reference.DOCS_DIR
    for path in reference.write(into):
        print(path)
    return 0


def cmd_local_netns(args: argparse.Namespace) -> int:
    """Which network namespace a plane would get here, and why; exit 1 where none works (CI runs it before the
    40-minute build, so a runner that cannot make one fails in a minute)."""
    from triarch.local import netns

    try:
        print(netns.choose().line)
    except netns.NetnsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def cmd_local_down(args: argparse.Namespace) -> int:
    from triarch.local.lifecycle import down
    from triarch.local.plane import only_plane

    down(args.name or only_plane())
    return 0


def _add_stack_source(parser: argparse.ArgumentParser, plan: bool = False, manifests: bool = False) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--stack", help="a stack of this project (stacks/Pulumi.<stack>.yaml)")
    source.add_argument("--stack-file", help="any Pulumi stack file")
    if plan:
        source.add_argument("--plan", help="a plan directory written by `triarch plan` (nothing is planned again)")
    if manifests:
        source.add_argument("--manifests", nargs="+", metavar="PATH",
                            help="Kubernetes YAML files or directories, or - for standard input (e.g. helm template "
                                 "... | triarch check --manifests -); the same rules, no stack needed")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("triarch")
    except PackageNotFoundError:
        return "unknown (not installed)"


class _Commands:
    """Subcommands whose one-line help is also their description (`triarch plan --help` says what plan does)."""

    def __init__(self, actions: Any) -> None:
        self.actions = actions

    def add_parser(self, name: str, *, help: str) -> argparse.ArgumentParser:
        description = help[0].upper() + help[1:] + "."
        parser: argparse.ArgumentParser = self.actions.add_parser(name, help=help, description=description)
        return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="triarch", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}",
                        help="print Triarch's version and exit")
    commands = _Commands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    plan = commands.add_parser("plan", help="plan a stack offline under Pulumi's mock engine: write plan.json, the "
                                            "manifests and capacity.json, and print a summary")
    _add_stack_source(plan)
    plan.add_argument("--out", help="output directory (default: out/<stack>)")
    plan.add_argument("--at", metavar="REF", help="plan the stack as of a git ref (its code and stack file, in a "
                                                  "temporary worktree), e.g. a pull request's base")
    plan.set_defaults(handler=cmd_plan)

    check = commands.add_parser("check", help="plan a stack offline and evaluate the triarch-guardrails policies, "
                                              "or evaluate them on any Kubernetes YAML (--manifests)")
    _add_stack_source(check, plan=True, manifests=True)
    check.add_argument("--policy-config", help="policy pack config JSON (as for pulumi --policy-pack-config)")
    check.add_argument("--format", choices=["text", "json", "markdown"], default="text",
                       help="text for a terminal (default), json for tools, markdown for a comment")
    check.add_argument("--out", help="also write the plan here (default: a temporary directory)")
    check.set_defaults(handler=cmd_check)

    diff = commands.add_parser("diff", help="compare two plans of a stack (a base plan or git ref against the "
                                            "head): what the change adds, removes, changes and replaces, and what "
                                            "it does to running traffic (exit 1 on an unintended stateful "
                                            "replacement or removal)")
    diff.add_argument("--base", required=True, help="a plan directory, or a git ref of this repository (planned in a "
                                                    "temporary worktree with its own code and stack file)")
    head = diff.add_mutually_exclusive_group(required=True)
    head.add_argument("--stack", "--head", dest="stack", help="a stack of this project (the head)")
    head.add_argument("--stack-file", help="any Pulumi stack file (a git base plans the same file as of that ref, "
                                           "or the ref's stack of that name for a file outside the repository)")
    head.add_argument("--plan", help="a plan directory written by `triarch plan` (the head, planned already)")
    diff.add_argument("--format", choices=["text", "json", "markdown"], default="text",
                      help="text for a terminal (default), json for tools, markdown for a comment")
    diff.add_argument("--across-stacks", action="store_true",
                      help="compare plans of two different stacks (every URN differs)")
    diff.add_argument("--intended", action="append", metavar="NAME",
                      help="a resource (name or URN) whose replacement is intended; repeatable")
    diff.set_defaults(handler=cmd_diff)

    verify = commands.add_parser("verify", help="check a live cluster against the stack's plan, layer by layer (GPU "
                                                 "nodes, drivers, add-ons, Ray Serve, each vLLM server)")
    source = verify.add_mutually_exclusive_group(required=True)
    source.add_argument("--stack", help="a stack of this project (stacks/Pulumi.<stack>.yaml)")
    source.add_argument("--stack-file", help="any Pulumi stack file")
    verify.add_argument("--context", help="the kubeconfig context (default: kubectl's current one)")
    verify.add_argument("--endpoint", action="append", metavar="NAME=URL",
                        help="reach model NAME at URL instead of through kubectl port-forward; repeatable")
    verify.set_defaults(handler=cmd_verify)

    comment = commands.add_parser("comment", help="write the pull-request comment (markdown) from a review directory: "
                                                   "guardrails, diff, capacity and cost of every stack")
    comment.add_argument("directory", help="head/<stack>, base/<stack>, check/<stack>.json, diff/<stack>.json")
    comment.add_argument("--base-ref", help="the base commit, for the heading")
    comment.add_argument("--head-ref", help="the head commit, for the heading")
    comment.add_argument("--out", help="write the markdown here (default: standard output)")
    comment.add_argument("--strict", action="store_true",
                         help="exit 1 on a mandatory violation or an unintended stateful replacement")
    comment.set_defaults(handler=cmd_comment)

    tune = commands.add_parser("tune", help="size vLLM's KV cache and engine args for a model on a GPU")
    model = tune.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", help="a model of templates/models (e.g. Qwen/Qwen3-8B)")
    model.add_argument("--model-config", help="path to any Hugging Face config.json")
    tune.add_argument("--gpu", help="a GPU of templates/compat/gpus.yaml (e.g. l4, a100-80gb)")
    tune.add_argument("--gpus", type=int, default=8, help="GPUs per node the tensor-parallel search may use")
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

    local = commands.add_parser("local", help="run a local Kubernetes control plane on the real engines (etcd, the API "
                                              "server, scheduler, controller manager, kwok) and the real Pulumi CLI")
    steps = _Commands(local.add_subparsers(dest="step", required=True, metavar="STEP"))
    build = steps.add_parser("build", help="build the engines from the Go module proxy into a cache outside the "
                                           "work tree (tools/engines/engines.yaml); cached builds are kept")
    build.add_argument("engines", nargs="*", help="only these (default: all)")
    build.add_argument("--force", action="store_true", help="rebuild even if cached")
    build.add_argument("--list", action="store_true", help="print what is pinned and built, build nothing")
    build.set_defaults(handler=cmd_local_build)
    start = steps.add_parser("up", help="start a plane for a stack: its nodes as kwok nodes, the CRDs of the "
                                        "components it says the cluster runs, its kubeconfig context")
    source = start.add_mutually_exclusive_group()
    source.add_argument("--stack", default="lab", help="a stack of this project (default: lab)")
    source.add_argument("--stack-file", help="any Pulumi stack file")
    start.add_argument("--name", help="the plane's name (default: the stack's)")
    start.add_argument("--crds", action="append", metavar="DIR",
                       help="a directory laid out like the reference data, whose charts' CRDs are used before the "
                            "reference cache (`triarch refdata fill`) and the Go modules")
    start.add_argument("--all-crds", action="store_true",
                       help="install every CRD set Triarch's objects use (KubeRay, Prometheus Operator, KEDA, "
                            "Karpenter), not only those of the stack's existing components")
    start.add_argument("--from-zero", action="store_true",
                       help="a created stack's Karpenter pools start with no node: real Karpenter (its kwok "
                            "provider) launches them for pending pods, from the instance types Triarch knows")
    start.add_argument("--charts", action="append", metavar="DIR",
                       help="for a stack that pulls its charts from the plane's mirror (triarch:registry.charts "
                            "oci://127.0.0.1:5000/charts): the chart archives (*.tgz) it serves, from your own "
                            "mirror's export (default: the reference cache's charts/)")
    start.set_defaults(handler=cmd_local_up)
    run = steps.add_parser("exec", help="run a command inside the plane's network namespace, with KUBECONFIG and "
                                        "the built kubectl and pulumi on the PATH")
    run.add_argument("--name", help="the plane (default: the only one up)")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    run.set_defaults(handler=cmd_local_exec)
    ns = steps.add_parser("netns", help="say how a plane gets its network namespace here (root: ip netns; else "
                                        "an unprivileged user namespace; else passwordless sudo for ip netns) and "
                                        "why; exit 1 where none works (TRIARCH_NETNS forces one)")
    ns.set_defaults(handler=cmd_local_netns)
    stop = steps.add_parser("down", help="stop every process of the plane and remove its namespace and state")
    stop.add_argument("--name", help="the plane (default: the only one up)")
    stop.set_defaults(handler=cmd_local_down)

    refs = commands.add_parser("refdata", help="bring the upstream reference data tests and `triarch local` read "
                                               "(tools/reference/sources.yaml) into a cache outside the work tree, "
                                               "each file held to its pinned sha256")
    refsteps = _Commands(refs.add_subparsers(dest="step", required=True, metavar="STEP"))
    fill = refsteps.add_parser("fill", help="copy every listed file from a directory or mirror laid out like "
                                            "../shared/reference, or download it from its source; exit 1 if any "
                                            "file could not be brought")
    fill.add_argument("--from", dest="source", metavar="DIR|URL",
                      help="copy from this directory (e.g. ../shared/reference) or download from this mirror's URL "
                           "(<URL>/<file>) instead of from each file's upstream source")
    fill.set_defaults(handler=cmd_refdata_fill)
    state = refsteps.add_parser("status", help="say which listed files are cached and verified; exit 1 if any is "
                                               "missing or differs")
    state.add_argument("--verbose", action="store_true", help="list the verified files too")
    state.set_defaults(handler=cmd_refdata_status)

    rev = commands.add_parser("review", help="build what the pull-request workflow builds (every stack planned at "
                                             "the head and at the base, checked, diffed; the comment) into a "
                                             "directory, to read the comment before pushing")
    rev.add_argument("--base", default="main", help="the branch or commit the change goes into (default: main); "
                                                     "its merge base with HEAD is planned")
    rev.add_argument("--out", default="review", help="where to write it (default: review/, which git ignores)")
    rev.add_argument("--stack", action="append", help="only this stack (repeatable; default: every stack)")
    rev.add_argument("--head-ref", help="the head's name in the comment's heading (default: HEAD's commit, marked "
                                        "'+ working tree' where files changed)")
    rev.add_argument("--strict", action="store_true",
                     help="exit 1 on a mandatory violation or an unintended stateful replacement or removal")
    rev.set_defaults(handler=cmd_review)

    ref = commands.add_parser("reference", help="write the stack keys' reference (docs/stack-keys.md) and the JSON "
                                                "Schema editors validate stack files with (docs/stack.schema.json)")
    ref.add_argument("--out", help="write both here instead of docs/")
    ref.set_defaults(handler=cmd_reference)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from triarch.local.engines import EngineError

    try:
        code: int = args.handler(args)
    except EngineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except TriarchError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    return code


if __name__ == "__main__":
    sys.exit(main())
