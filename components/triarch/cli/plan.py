"""`triarch plan`: a stack planned offline under Pulumi's mock engine (or as of a git ref), written out and
summarised."""

from __future__ import annotations

import argparse
from pathlib import Path

from triarch.cli.common import Commands, add_stack_source, progress, shown, stack_source
from triarch.paths import PROJECT_ROOT


def cmd_plan(args: argparse.Namespace) -> int:
    from triarch.report.planning import plan_stack
    from triarch.report.summary import summary
    from triarch.report.validation import validate_stack_file

    name, path = stack_source(args)
    out = Path(args.out) if args.out else shown(PROJECT_ROOT / "out" / name)
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


def add_parser(commands: Commands) -> None:
    plan = commands.add_parser("plan", help="plan a stack offline under Pulumi's mock engine: write plan.json, the "
                                            "manifests and capacity.json, and print a summary")
    add_stack_source(plan)
    plan.add_argument("--out", help="output directory (default: out/<stack> in the project's root, which git "
                                    "ignores, wherever the command runs)")
    plan.add_argument("--at", metavar="REF", help="plan the stack as of a git ref (its code and stack file, in a "
                                                  "temporary worktree), e.g. a pull request's base")
    plan.set_defaults(handler=cmd_plan)
