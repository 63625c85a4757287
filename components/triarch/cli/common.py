"""What every command shares: the stack it reads (--stack or --stack-file), the progress line while it plans, the
sub-parser whose help is also its description, and how a command's errors become its exit code."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from triarch.errors import EXIT_USAGE, TriarchError

Handler = Callable[[argparse.Namespace], int]
"""A command: its parsed arguments in, its exit code out."""


def shown(path: Path) -> Path:
    """A default output path as the user should read it: relative to where the command runs when it lies below,
    absolute otherwise (a command run from a subfolder still writes under the project's root)."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


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


def stack_source(args: argparse.Namespace) -> tuple[str, Path]:
    """The stack a command reads: its name and its file, from --stack or --stack-file."""
    from triarch.offline import stack_file, stack_name_of

    if args.stack_file:
        path = Path(args.stack_file)
        if path.is_dir():
            raise TriarchError(f"--stack-file: {str(path)!r} is a directory; allowed: a Pulumi stack file path")
        if not path.is_file():
            raise TriarchError(f"--stack-file: {str(path)!r} does not exist; allowed: a Pulumi stack file path")
        return stack_name_of(path), path
    return args.stack, stack_file(args.stack)


def add_stack_source(parser: argparse.ArgumentParser, plan: bool = False, manifests: bool = False) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--stack", help="a stack of this project (stacks/Pulumi.<stack>.yaml)")
    source.add_argument("--stack-file", help="any Pulumi stack file")
    if plan:
        source.add_argument("--plan", help="a plan directory written by `triarch plan` (nothing is planned again)")
    if manifests:
        source.add_argument("--manifests", nargs="+", metavar="PATH",
                            help="Kubernetes YAML files or directories, or - for standard input (e.g. helm template "
                                 "... | triarch check --manifests -); the same rules, no stack needed")


class Commands:
    """Subcommands whose one-line help is also their description (`triarch plan --help` says what plan does)."""

    def __init__(self, actions: Any) -> None:
        self.actions = actions

    def add_parser(self, name: str, *, help: str) -> argparse.ArgumentParser:
        description = help[0].upper() + help[1:] + "."
        parser: argparse.ArgumentParser = self.actions.add_parser(name, help=help, description=description)
        return parser


def run(handler: Handler, args: argparse.Namespace) -> int:
    """A command's exit code: its own, or 1 where an engine build fails and 2 where Triarch refuses the input, the
    error said on standard error (the entry point and `triarch review` run commands alike)."""
    from triarch.local.engines import EngineError

    try:
        code: int = handler(args)
    except EngineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except TriarchError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    return code
