"""The base of a diff: a plan directory, or a git ref of this repository planned in a temporary worktree with
that ref's own code, templates and stack files (so the diff shows what the change of code and config does)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from triarch.diff import load_capacity, load_plan
from triarch.errors import ConfigError
from triarch.paths import PROJECT_ROOT

BASE_PROGRAM = "import sys; sys.path.insert(0, sys.argv.pop(1)); from triarch.cli import main; sys.exit(main())"
"""Runs the worktree's own `triarch` (its package first on the path) with this environment's dependencies."""


def _git(*args: str, cwd: Path = PROJECT_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)


def base_plan(base: str, stack_args: list[str]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The base plan and its capacity.json (None where that code wrote none): `base` is a directory holding
    plan.json, or a git ref planned with `stack_args` (`--stack NAME` plans the ref's own stack file;
    `--stack-file PATH` plans that file with the ref's code)."""
    directory = Path(base)
    if directory.is_dir():
        return load_plan(directory), load_capacity(directory)
    with tempfile.TemporaryDirectory(prefix="triarch-base-") as scratch:
        out = Path(scratch) / "plan"
        plan_at(base, stack_args, out, option="--base")
        return load_plan(out), load_capacity(out)


def base_source(base: str, stack: str, stack_file: Path | None) -> tuple[list[str], str]:
    """How a git base is planned, and the words that say what the base is: a plan directory as it is; a ref with
    its own stack file (the same path as of that ref for a file in this repository, else the ref's stack of that
    name)."""
    if Path(base).is_dir():
        return [], f"the plan in {base}"
    if stack_file is not None:
        try:
            relative = stack_file.resolve().relative_to(PROJECT_ROOT.resolve())
        except ValueError:
            relative = None
        if relative is not None:
            return ["--stack-file", str(relative)], f"{base}:{relative}"
    return ["--stack", stack], f"{base}:stacks/Pulumi.{stack}.yaml"


def plan_at(ref: str, stack_args: list[str], out: Path, option: str = "--at") -> str:
    """`triarch plan` as of a git ref: the ref's code, templates and stack files in a temporary worktree, this
    environment's dependencies; the plan (plan.json, manifests, and what that ref's code writes besides) in `out`.
    Returns what that `triarch plan` printed."""
    if _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").returncode != 0:
        raise ConfigError(option, ref, "is neither a plan directory nor a git ref of this repository",
                          "a directory written by `triarch plan`, or a commit, branch or tag")
    with tempfile.TemporaryDirectory(prefix="triarch-ref-") as scratch:
        worktree = Path(scratch) / "tree"
        added = _git("worktree", "add", "--detach", "--quiet", str(worktree), ref)
        if added.returncode != 0:
            raise ConfigError(option, ref, f"could not be checked out ({added.stderr.strip()})",
                              "a commit, branch or tag of this repository")
        try:
            done = subprocess.run([sys.executable, "-c", BASE_PROGRAM, str(worktree / "components"), "plan",
                                   *stack_args, "--out", str(out.resolve())], cwd=worktree, capture_output=True,
                                  text=True, check=False)
            if done.returncode != 0:
                reason = (done.stderr.strip().splitlines() or ["no output"])[-1].removeprefix("error: ")
                raise ConfigError(option, ref, f"does not plan: {reason}", "a ref whose stack plans")
            return done.stdout
        finally:
            _git("worktree", "remove", "--force", str(worktree))
