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
    filled = refdata.fill(source, log=print)
    for line in filled.need_mirror:
        print(f"warning: {line}", file=sys.stderr)
    for problem in filled.problems:
        print(f"error: {problem}", file=sys.stderr)
    listed = len(refdata.load_sources())
    cached = sum(state == "ok" for state in refdata.status().values())  # a problem's line may stand for many files
    print(f"{cached} of {listed} reference files cached and verified in {refdata.cache_root()}"
          + (f"; {len(filled.need_mirror)} need a mirror (recorded in {refdata.NEEDS_MIRROR}: under CI their tests "
             f"skip)" if filled.need_mirror else ""))
    return 1 if filled.problems else 0


def cmd_refdata_status(args: argparse.Namespace) -> int:
    from triarch import refdata

    states = refdata.status()
    for rel, state in states.items():
        if state != "ok" or args.verbose:
            print(f"{state}: {rel}")
    ok = sum(state == "ok" for state in states.values())
    mirror = sum(state == refdata.NEEDS_A_MIRROR for state in states.values())
    bad = len(states) - ok - mirror
    print(f"{ok} of {len(states)} reference files cached and verified in {refdata.cache_root()}"
          + (f"; {mirror} need a mirror, as the last fill from upstream recorded: bring them with "
             f"{refdata.FILL_FROM_MIRROR}" if mirror else "")
          + (f"; bring the rest with `{refdata.FILL_FROM_UPSTREAM}` (from upstream; or "
             f"`{refdata.FILL_FROM_SHARED}` where it is beside the clone)" if bad else ""))
    return 1 if bad else 0


def add_parser(commands: Commands) -> None:
    refs = commands.add_parser("refdata", help="bring the upstream reference data tests and `triarch local` read "
                                               "(tools/reference/sources.yaml) into a cache outside the work tree, "
                                               "each file held to its pinned sha256")
    refsteps = Commands(refs.add_subparsers(dest="step", required=True, metavar="STEP"))
    fill = refsteps.add_parser("fill", help="copy every listed file from a directory or mirror laid out like "
                                            "../shared/reference, or download it from its source; exit 1 if any "
                                            "file could not be brought (from upstream, a file that only a mirror "
                                            "holds is named and recorded, not a failure)")
    fill.add_argument("--from", dest="source", metavar="DIR|URL",
                      help="copy from this directory (e.g. ../shared/reference) or download from this mirror's URL "
                           "(<URL>/<file>) instead of from each file's upstream source")
    fill.set_defaults(handler=cmd_refdata_fill)
    state = refsteps.add_parser("status", help="say which listed files are cached and verified; exit 1 if any is "
                                               "missing or differs (not one the last fill from upstream recorded "
                                               "as needing a mirror)")
    state.add_argument("--verbose", action="store_true", help="list the verified files too")
    state.set_defaults(handler=cmd_refdata_status)
