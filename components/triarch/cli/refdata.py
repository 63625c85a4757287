"""`triarch refdata`: the upstream reference data brought into its cache (fill) and checked there (status), each
file held to its pinned sha256 (triarch.refdata)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from triarch.cli.common import Commands


def cmd_refdata_fill(args: argparse.Namespace) -> int:
    from triarch import refdata

    source: Path | str | None = None
    if args.source:
        source = args.source if refdata.is_mirror_url(args.source) else Path(args.source)
    problems = refdata.fill(source, log=print)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    listed = len(refdata.load_sources())
    print(f"{listed - len(problems)} of {listed} reference files cached and verified in {refdata.cache_root()}")
    return 1 if problems else 0


def cmd_refdata_status(args: argparse.Namespace) -> int:
    from triarch import refdata

    states = refdata.status()
    for rel, state in states.items():
        if state != "ok" or args.verbose:
            print(f"{state}: {rel}")
    bad = sum(state != "ok" for state in states.values())
    print(f"{len(states) - bad} of {len(states)} reference files cached and verified in {refdata.cache_root()}"
          + (f"; bring the rest with `{refdata.FILL_FROM_SHARED}`" if bad else ""))
    return 1 if bad else 0


def add_parser(commands: Commands) -> None:
    refs = commands.add_parser("refdata", help="bring the upstream reference data tests and `triarch local` read "
                                               "(tools/reference/sources.yaml) into a cache outside the work tree, "
                                               "each file held to its pinned sha256")
    refsteps = Commands(refs.add_subparsers(dest="step", required=True, metavar="STEP"))
    fill = refsteps.add_parser("fill", help="copy every listed file from a directory or mirror laid out like "
                                            "../shared/reference, or download it from its source; exit 1 if any "
                                            "file could not be brought")
    fill.add_argument("--from", dest="source", metavar="DIR|URL",
                      help="copy from this directory (e.g. ../shared/reference) or download from this mirror's URL "
                           "(<URL>/<file>) instead of from each file's upstream source")
    fill.set_defaults(handler=cmd_refdata_fill)
    state = refsteps.add_parser("status", help="say which listed files are cached and verified; exit 1 if any is "
                                               "missing or differs")
    state.add_argument("--verbose", action="store_true", help="list the verified files too")
    state.set_defaults(handler=cmd_refdata_status)
