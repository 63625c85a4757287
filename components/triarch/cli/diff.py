"""`triarch diff`: two plans of a stack compared (a base plan or git ref against the head): what the change
replaces, adds, removes and changes, what AWS would refuse, and what it does to running traffic."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from triarch.cli.common import Commands, progress, stack_source
from triarch.errors import TriarchError


def same_stack(base: dict[str, Any], name: str, base_from: str, across: bool) -> None:
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
            same_stack(base, name, base_from, args.across_stacks)
        else:
            name, path = stack_source(args)
            head_source = str(path)
            # A git base is planned with its own stack file: the same file as of that ref (or, for a file
            # outside the repository, the ref's stack of that name), never the edited one.
            stack_args, base_from = base_source(args.base, name, path if args.stack_file else None)
            base, base_capacity = base_plan(args.base, stack_args)
            same_stack(base, name, base_from, args.across_stacks)
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


def add_parser(commands: Commands) -> None:
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
