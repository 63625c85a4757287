"""`triarch prices refresh`: each region's on-demand prices of the instance types Triarch knows, read from AWS's
public price list (or an offer file downloaded elsewhere) into templates/compat/prices.yaml, each row dated with the
offer's publication date and its source URL (triarch.pricelist)."""

from __future__ import annotations

import argparse
from pathlib import Path

from triarch.cli.common import Commands
from triarch.errors import TriarchError


def cmd_prices_refresh(args: argparse.Namespace) -> int:
    from triarch import pricelist
    from triarch.catalog import catalog
    from triarch.paths import COMPAT_DIR

    regions = [pricelist.check_region(r) for r in args.regions]
    if args.source and len(regions) != 1:
        raise TriarchError(f"--from: one offer file is one region's, but --region names {len(regions)}; allowed: "
                           "exactly one --region with --from")
    target = Path(args.file) if args.file else COMPAT_DIR / "prices.yaml"
    if not target.is_file():
        raise TriarchError(f"--file: {str(target)!r} does not exist; allowed: a price table laid out like "
                           "templates/compat/prices.yaml")
    types = list(catalog().instances)
    text = target.read_text(encoding="utf-8")
    for region in regions:
        offer = pricelist.read_offer(Path(args.source)) if args.source else pricelist.fetch_offer(region)
        prices = pricelist.region_prices(offer, region, types, args.source or pricelist.OFFER_URL.format(
            region=region))
        text = pricelist.write_region(text, prices, types)
        print(f"{region}: {len(prices.hourly_usd)} of {len(types)} instance types priced, offer published "
              f"{prices.published}" + (f"; no on-demand Linux price for {', '.join(prices.missing)}"
                                       if prices.missing else ""))
    target.write_text(text, encoding="utf-8")
    print(f"wrote {target}")
    return 0


def add_parser(commands: Commands) -> None:
    prices = commands.add_parser("prices", help="record on-demand instance prices per region from AWS's public "
                                                "price list (templates/compat/prices.yaml)")
    steps = Commands(prices.add_subparsers(dest="step", required=True, metavar="STEP"))
    refresh = steps.add_parser("refresh", help="read each region's EC2 offer file (no credentials needed) and "
                                               "write the on-demand Linux price of every instance type of "
                                               "templates/compat/instances.yaml, dated with the offer's "
                                               "publication date")
    refresh.add_argument("--region", dest="regions", action="append", required=True, metavar="REGION",
                         help="an AWS region code (repeat for several), e.g. us-west-2")
    refresh.add_argument("--from", dest="source", metavar="FILE",
                         help="an offer file (index.json) already downloaded from "
                              "https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/<region>/"
                              "index.json, for one --region")
    refresh.add_argument("--file", help="the price table to write (default: templates/compat/prices.yaml)")
    refresh.set_defaults(handler=cmd_prices_refresh)
