"""triarch: LLM inference on Kubernetes, set up right the first time. Plan a stack offline under Pulumi's mock
engine (no cloud, no credentials), check it against the guardrails, diff two plans, size vLLM for a model and a
GPU, review a change as its pull request would be, and verify a live cluster. `pulumi up` deploys what it plans."""

from __future__ import annotations

import argparse
import signal
import sys

from triarch.cli import (
    check,
    comment,
    diff,
    local,
    model,
    plan,
    preflight,
    prices,
    refdata,
    reference,
    review,
    tune,
    verify,
)
from triarch.cli.common import Commands, run

COMMANDS = (plan, check, diff, verify, comment, tune, model, local, refdata, prices, review, reference, preflight)
"""Every command's module, in the order `triarch --help` lists them; each adds its own sub-parser and handler.
(The help's first paragraph is this package's docstring.)"""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("triarch")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="triarch", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}",
                        help="print Triarch's version and exit")
    commands = Commands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


EXIT_PIPE_CLOSED = 128 + signal.SIGPIPE
"""The exit code of a shell tool whose reader went away (`... | head`): a SIGPIPE'd process's."""


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = run(args.handler, args)
        sys.stdout.flush()  # a reader that went away shows here, not in Python's own flush at exit
    except BrokenPipeError:  # `triarch plan ... | head`: stop quietly, as a shell tool does on SIGPIPE
        return EXIT_PIPE_CLOSED
    return code

