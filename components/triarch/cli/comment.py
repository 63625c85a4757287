"""`triarch comment`: the pull-request comment (markdown) written from a review directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from triarch.cli.common import Commands
from triarch.errors import TriarchError


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


def add_parser(commands: Commands) -> None:
    comment = commands.add_parser("comment", help="write the pull-request comment (markdown) from a review directory: "
                                                   "guardrails, diff, capacity and cost of every stack")
    comment.add_argument("directory", help="head/<stack>, base/<stack>, check/<stack>.json, diff/<stack>.json")
    comment.add_argument("--base-ref", help="the base commit, for the heading")
    comment.add_argument("--head-ref", help="the head commit, for the heading")
    comment.add_argument("--out", help="write the markdown here (default: standard output)")
    comment.add_argument("--strict", action="store_true",
                         help="exit 1 on a mandatory violation or an unintended stateful replacement")
    comment.set_defaults(handler=cmd_comment)
