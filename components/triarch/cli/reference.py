"""`triarch reference`: the stack keys' reference and the stack file's JSON Schema written
(triarch.config.reference)."""

from __future__ import annotations

import argparse
from pathlib import Path

from triarch.cli.common import Commands


def cmd_reference(args: argparse.Namespace) -> int:
    from triarch.config import reference

    into = Path(args.out) if args.out else reference.DOCS_DIR
    for path in reference.write(into):
        print(path)
    return 0


def add_parser(commands: Commands) -> None:
    ref = commands.add_parser("reference", help="write the stack keys' reference (docs/stack-keys.md) and the JSON "
                                                "Schema editors validate stack files with (docs/stack.schema.json)")
    ref.add_argument("--out", help="write both here instead of docs/")
    ref.set_defaults(handler=cmd_reference)
