"""`triarch`: plan a stack offline (and, as the project grows, tune and check)."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

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
        if not path.is_file():
            raise TriarchError(f"--stack-file: {str(path)!r} does not exist; allowed: a Pulumi stack file path")
        return stack_name_of(path), path
    return args.stack, stack_file(args.stack)


def cmd_plan(args: argparse.Namespace) -> int:
    from triarch.report import plan_stack, summary, validate_stack_file

    name, path = _stack_source(args)
    out = Path(args.out) if args.out else Path("out") / name
    validated = validate_stack_file(name, path)
    with progress(f"planning stack {name} (Pulumi mock engine, no cloud calls)"):
        result = plan_stack(validated, out)
    print(summary(result))
    print(f"\nwrote {out / 'plan.json'} and {len(result.manifest_paths)} manifest(s) in {out / 'manifests'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="triarch", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("plan", help="register a stack under Pulumi's mock engine; write plan.json + manifests")
    source = plan.add_mutually_exclusive_group(required=True)
    source.add_argument("--stack", help="a stack of this project (stacks/Pulumi.<stack>.yaml)")
    source.add_argument("--stack-file", help="any Pulumi stack file")
    plan.add_argument("--out", help="output directory (default: out/<stack>)")
    plan.set_defaults(handler=cmd_plan)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
    except TriarchError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    return code


if __name__ == "__main__":
    sys.exit(main())
