"""`triarch review`: what the pull-request workflow builds, built here, so a reviewer reads the comment before
pushing. Every stack is planned at the head (the working tree, uncommitted changes included) and at the base
commit (its own code and stack file, in a temporary worktree), checked against the guardrails, diffed, and the
comment written, each step by the command that does it alone (plan, check, diff, comment); the workflow runs this
same command, so the two cannot drift."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from triarch.cli.check import cmd_check
from triarch.cli.comment import cmd_comment
from triarch.cli.common import Commands, Handler, run, shown
from triarch.cli.diff import cmd_diff
from triarch.cli.plan import cmd_plan
from triarch.errors import TriarchError
from triarch.paths import PROJECT_ROOT, STACKS_DIR

POLICY_DIR = PROJECT_ROOT / "policies"


@dataclass(frozen=True)
class Refs:
    base: str
    """The base commit (full sha)."""
    head: str
    """The head as the comment's heading names it: a sha, with `+ working tree` where files changed since it."""


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True, check=False)
    if done.returncode:
        raise TriarchError(f"review: git {' '.join(args)} failed: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout.strip()


def resolve_refs(base: str) -> Refs:
    """The base as the merge base of HEAD and `base` (what a pull request against it compares with)."""
    try:
        _git("rev-parse", "--verify", "--quiet", f"{base}^{{commit}}")
    except TriarchError:
        raise TriarchError(f"--base: {base!r} is not a commit of this repository; allowed: a branch, tag or sha "
                           "(e.g. main, origin/main)") from None
    merge_base = _git("merge-base", "HEAD", base)
    head = _git("rev-parse", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    return Refs(merge_base, f"{head[:12]} + working tree" if dirty else head)


def stacks() -> list[str]:
    return sorted(path.name.removeprefix("Pulumi.").removesuffix(".yaml") for path in STACKS_DIR.glob("Pulumi.*.yaml"))


def policy_config(stack: str) -> Path:
    """The policy pack config the workflow uses for a stack: its own where it has one."""
    own = POLICY_DIR / f"config.{stack}.json"
    return own if own.is_file() else POLICY_DIR / "config.json"


def _run(handler: Handler, args: argparse.Namespace, output: Path, log: Path) -> int:
    """One command in this process: what it prints into `output`, what it tells into `log`."""
    with output.open("w", encoding="utf-8") as printed, log.open("w", encoding="utf-8") as told, \
            contextlib.redirect_stdout(printed), contextlib.redirect_stderr(told):
        return run(handler, args)


def _annotate(level: str, message: str) -> None:
    """A line for the terminal, or a GitHub annotation in a workflow."""
    prefix = f"::{level}::" if os.environ.get("GITHUB_ACTIONS") == "true" else f"{level}: "
    print(prefix + message, file=sys.stderr)


def review(out: Path, refs: Refs, only: list[str] | None = None) -> Path:
    """Plan, check and diff each stack into `out` (head/, base/, check/, diff/, errors/, logs/), then write the
    comment; returns its path. A stack that does not plan at the head is reported and left out, as in CI."""
    for part in ("head", "base", "check", "diff", "errors", "logs"):
        (out / part).mkdir(parents=True, exist_ok=True)
    chosen = only or stacks()
    logs = out / "logs"
    for stack in chosen:
        head, base = out / "head" / stack, out / "base" / stack
        errors = out / "errors" / f"{stack}.txt"
        print(f"review: {stack}: planning the head, checking, planning the base {refs.base[:12]}, diffing",
              file=sys.stderr, flush=True)
        planned = argparse.Namespace(stack=stack, stack_file=None, out=str(head), at=None)
        if _run(cmd_plan, planned, logs / f"{stack}-head.txt", errors) != 0:
            lines = errors.read_text(encoding="utf-8").strip().splitlines()
            _annotate("error", f"{stack} does not plan: {lines[-1] if lines else '(no message)'}")
            continue
        errors.unlink()
        checked = argparse.Namespace(stack=None, stack_file=None, plan=str(head), manifests=None, out=None,
                                     policy_config=str(policy_config(stack)), format="json")
        _run(cmd_check, checked, out / "check" / f"{stack}.json", logs / f"{stack}-check.txt")
        at_base = argparse.Namespace(stack=stack, stack_file=None, out=str(base), at=refs.base)
        if _run(cmd_plan, at_base, logs / f"{stack}-base.txt", logs / f"{stack}-base-errors.txt") == 0:
            compared = argparse.Namespace(base=str(base), stack=None, stack_file=None, plan=str(head), format="json",
                                          across_stacks=False, intended=None)
            _run(cmd_diff, compared, out / "diff" / f"{stack}.json", logs / f"{stack}-diff.txt")
        else:
            _annotate("notice", f"{stack} has no plan at the base commit (a new stack, or the base does not plan it)")
    comment = out / "comment.md"
    commented = argparse.Namespace(directory=str(out), base_ref=refs.base, head_ref=refs.head, out=str(comment),
                                   strict=False)
    _run(cmd_comment, commented, logs / "comment.txt", logs / "comment-verdict.txt")
    return comment


def cmd_review(args: argparse.Namespace) -> int:
    known = stacks()
    for stack in args.stack or []:
        if stack not in known:
            raise TriarchError(f"--stack: {stack!r} is not a stack of this project; allowed: {', '.join(known)}")
    refs = resolve_refs(args.base)
    if args.head_ref:
        refs = Refs(refs.base, args.head_ref)
    out = Path(args.out) if args.out else shown(PROJECT_ROOT / "review")
    comment = review(out, refs, args.stack)
    print(f"wrote {comment} (and head/, base/, check/, diff/ beside it; logs/ holds what each step printed)")
    if args.strict:
        from triarch.review import failures

        failing = failures(out)
        for failure in failing:
            print(f"review: {failure}", file=sys.stderr)
        return 1 if failing else 0
    return 0


def add_parser(commands: Commands) -> None:
    rev = commands.add_parser("review", help="build what the pull-request workflow builds (every stack planned at "
                                             "the head and at the base, checked, diffed; the comment) into a "
                                             "directory, to read the comment before pushing")
    rev.add_argument("--base", default="main", help="the branch or commit the change goes into (default: main); "
                                                     "its merge base with HEAD is planned")
    rev.add_argument("--out", help="where to write it (default: review/ in the project's root, which git ignores)")
    rev.add_argument("--stack", action="append", help="only this stack (repeatable; default: every stack)")
    rev.add_argument("--head-ref", help="the head's name in the comment's heading (default: HEAD's commit, marked "
                                        "'+ working tree' where files changed)")
    rev.add_argument("--strict", action="store_true",
                     help="exit 1 on a mandatory violation or an unintended stateful replacement or removal")
    rev.set_defaults(handler=cmd_review)
