"""The base of a diff: a plan directory, or a git ref of this repository planned in a temporary worktree with
that ref's own code, templates and stack files (so the diff shows what the change of code and config does)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from triarch.diff import load_plan
from triarch.errors import ConfigError
from triarch.paths import PROJECT_ROOT

BASE_PROGRAM = "import sys; sys.path.insert(0, sys.argv.pop(1)); from triarch.cli import main; sys.exit(main())"
"""Runs the worktree's own `triarch` (its package first on the path) with this environment's dependencies."""


def _git(*args: str, cwd: Path = PROJECT_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)


def base_plan(base: str, stack_args: list[str]) -> dict[str, Any]:
    """The base plan: `base` is a directory holding plan.json, or a git ref planned with `stack_args`
    (`--stack NAME` plans the ref's own stack file; `--stack-file PATH` plans that file with the ref's code)."""
    directory = Path(base)
    if directory.is_dir():
        return load_plan(directory)
    if _git("rev-parse", "--verify", "--quiet", f"{base}^{{commit}}").returncode != 0:
        raise ConfigError("--base", base, "is neither a plan directory nor a git ref of this repository",
                          "a directory written by `triarch plan`, or a commit, branch or tag")
    with tempfile.TemporaryDirectory(prefix="triarch-base-") as scratch:
        worktree, out = Path(scratch) / "tree", Path(scratch) / "plan"
        added = _git("worktree", "add", "--detach", "--quiet", str(worktree), base)
        if added.returncode != 0:
            raise ConfigError("--base", base, f"could not be checked out ({added.stderr.strip()})",
                              "a commit, branch or tag of this repository")
        try:
            done = subprocess.run([sys.executable, "-c", BASE_PROGRAM, str(worktree / "components"), "plan",
                                   *stack_args, "--out", str(out)], cwd=worktree, capture_output=True, text=True,
                                  check=False)
            if done.returncode != 0:
                reason = (done.stderr.strip().splitlines() or ["no output"])[-1].removeprefix("error: ")
                raise ConfigError("--base", base, f"does not plan: {reason}", "a ref whose stack plans")
            return load_plan(out)
        finally:
            _git("worktree", "remove", "--force", str(worktree))
