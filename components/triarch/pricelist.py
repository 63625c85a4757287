"""AWS's public price list, read for the on-demand price of every instance type Triarch knows, and written into
templates/compat/prices.yaml (`triarch prices refresh`). The bulk offer files need no credentials: one per region,
https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/<region>/index.json, each with its
`publicationDate`, its `products` (by SKU: productFamily and attributes) and its `terms.OnDemand` (by SKU, by offer
term: priceDimensions, each a unit and a pricePerUnit in USD).

A price Triarch uses is the one a plain node pays: Linux, shared tenancy, no pre-installed software, no licence, a
running instance (capacitystatus Used, not a reservation's unused or allocated capacity), per hour."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from triarch.datafiles import read_yaml
from triarch.errors import TriarchError
from triarch.paths import COMPAT_DIR

OFFER_BASE = "https://pricing.us-east-1.amazonaws.com"
OFFER_URL = OFFER_BASE + "/offers/v1.0/aws/AmazonEC2/current/{region}/index.json"
REGION_INDEX_URL = OFFER_BASE + "/offers/v1.0/aws/AmazonEC2/current/region_index.json"
REFRESH_COMMAND = "triarch prices refresh --region {region}"
"""What the plan names where a region has no recorded price."""

NODE_ATTRIBUTES = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
                   "capacitystatus": "Used", "licenseModel": "No License required"}
"""The attributes of the SKU a plain node is billed by; every other SKU of the type (Windows, RHEL, dedicated,
SQL Server, a reservation's capacity) is left out."""
REGION = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")


PRICE_TABLE = COMPAT_DIR / "prices.yaml"
"""Where the prices and the instance types each region sells are recorded (triarch.cost reads the prices)."""
PRICE_TABLE_NAME = "templates/compat/prices.yaml"


@cache
def types_listed(path: Path = PRICE_TABLE) -> dict[str, frozenset[str]]:
    """Region -> every instance type the price table has a row for there, priced or not offered on demand. Its
    header says a listed region's rows are every type of instances.yaml the catalog sells there: a type with no
    row in a listed region is not sold there; a region not listed says nothing (unknown, not unsold)."""
    raw = read_yaml(path)
    regions = (raw.get("regions") or {}) if isinstance(raw, dict) else {}
    return {str(region): frozenset(str(name) for name in ((entries or {}).get("instances") or {}))
            for region, entries in regions.items()}


class OfferError(TriarchError):
    """An offer file that is not in the price list's layout: one line naming the key path."""


@dataclass(frozen=True)
class RegionPrices:
    region: str
    published: str
    """The offer's publicationDate (e.g. 2026-11-20T18:04:11Z)."""
    source: str
    hourly_usd: dict[str, float]
    """Instance type -> on-demand USD per hour, for the types asked for that the offer sells on demand."""
    missing: list[str]
    """Types asked for that the offer has no on-demand Linux SKU for (not offered there, or Capacity Blocks only)."""


def _at(value: Any, path: str, kind: type) -> Any:
    if not isinstance(value, kind):
        shown = type(value).__name__
        raise OfferError(f"{path}: {shown} is not a {kind.__name__}; allowed: the AWS price list offer file layout "
                         f"({OFFER_URL.format(region='<region>')})")
    return value


def _hourly(terms: dict[str, Any], sku: str, source: str) -> float:
    """The one hourly USD price of an on-demand SKU."""
    offers = _at(terms.get(sku), f"{source}: terms.OnDemand.{sku}", dict)
    prices: list[float] = []
    for code, offer in offers.items():
        dimensions = _at(_at(offer, f"{source}: terms.OnDemand.{sku}.{code}", dict).get("priceDimensions"),
                         f"{source}: terms.OnDemand.{sku}.{code}.priceDimensions", dict)
        for rate_code, dimension in dimensions.items():
            path = f"{source}: terms.OnDemand.{sku}.{code}.priceDimensions.{rate_code}"
            dimension = _at(dimension, path, dict)
            if dimension.get("unit") != "Hrs":
                raise OfferError(f"{path}.unit: {dimension.get('unit')!r} is not an hourly price; allowed: 'Hrs'")
            usd = _at(dimension.get("pricePerUnit"), f"{path}.pricePerUnit", dict).get("USD")
            try:
                prices.append(float(usd))
            except (TypeError, ValueError):
                raise OfferError(f"{path}.pricePerUnit.USD: {usd!r} is not a price; allowed: a decimal number "
                                 "of US dollars, e.g. '0.8048000000'") from None
    if len(prices) != 1:
        raise OfferError(f"{source}: terms.OnDemand.{sku}: {len(prices)} hourly prices; allowed: exactly one")
    return prices[0]


def region_prices(offer: Any, region: str, instance_types: Iterable[str], source: str) -> RegionPrices:
    """The on-demand hourly price of each of `instance_types` in one region's offer file."""
    offer = _at(offer, source, dict)
    published = offer.get("publicationDate")
    if not isinstance(published, str) or not published:
        raise OfferError(f"{source}: publicationDate: {published!r} is missing; allowed: the offer's publication "
                         "date, e.g. '2026-11-20T18:04:11Z'")
    products = _at(offer.get("products"), f"{source}: products", dict)
    terms = _at(_at(offer.get("terms"), f"{source}: terms", dict).get("OnDemand"), f"{source}: terms.OnDemand",
                dict)
    wanted = set(instance_types)
    found: dict[str, float] = {}
    for sku, product in products.items():
        product = _at(product, f"{source}: products.{sku}", dict)
        if product.get("productFamily") != "Compute Instance":
            continue
        attributes = _at(product.get("attributes"), f"{source}: products.{sku}.attributes", dict)
        name = attributes.get("instanceType")
        if name not in wanted or any(attributes.get(k) != v for k, v in NODE_ATTRIBUTES.items()):
            continue
        code = attributes.get("regionCode")
        if code is not None and code != region:
            raise OfferError(f"{source}: products.{sku}.attributes.regionCode: {code!r} is not the region asked "
                             f"for; allowed: {region!r} (the offer file of {OFFER_URL.format(region=region)})")
        if sku not in terms:
            continue  # sold without an on-demand term (Capacity Blocks)
        if name in found:
            raise OfferError(f"{source}: products.{sku}: a second on-demand Linux SKU for {name}; allowed: one per "
                             "instance type")
        found[name] = _hourly(terms, sku, source)
    return RegionPrices(region, published, OFFER_URL.format(region=region), dict(sorted(found.items())),
                        sorted(wanted - set(found)))


def check_region(region: str, path: str = "--region") -> str:
    if not REGION.match(region):
        raise TriarchError(f"{path}: {region!r} is not an AWS region code; allowed: e.g. us-east-1, eu-west-1")
    return region


def fetch_offer(region: str) -> Any:
    """A region's offer file from AWS (tens of MB for EC2)."""
    import urllib.request

    url = OFFER_URL.format(region=region)
    try:
        with urllib.request.urlopen(url, timeout=300) as response:
            return json.load(response)
    except OSError as error:
        raise TriarchError(f"--region {region}: {url} could not be read ({error}); allowed: a reachable price list, "
                           "or --from FILE with the offer file downloaded elsewhere") from None


def read_offer(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TriarchError(f"--from: {str(path)!r} does not exist; allowed: an offer file (index.json) of the "
                           "AWS price list") from None
    except json.JSONDecodeError as error:
        raise OfferError(f"--from: {str(path)!r} is not JSON ({error.msg}, line {error.lineno}); allowed: an "
                         "offer file (index.json) of the AWS price list") from None


def _row(name: str, prices: RegionPrices) -> str:
    date = prices.published[:10]
    if name in prices.hourly_usd:
        return (f"      {name + ':':17} {{hourlyUsd: {prices.hourly_usd[name]!r}, source: {prices.source}, "
                f"sourceDate: {date}}}")
    return (f"      {name + ':':17} {{hourlyUsd: null, notOffered: \"no On-Demand Linux SKU in the offer file\", "
            f"source: {prices.source}, sourceDate: {date}}}")


def write_region(text: str, prices: RegionPrices, instance_types: Iterable[str]) -> str:
    """prices.yaml with one region's `instances:` rows replaced by the offer's (other keys and comments kept); a
    region the file lacks is added at the end of `regions:`."""
    rows = [_row(name, prices) for name in instance_types]
    header = f"  {prices.region}:\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line == header), None)
    if start is None:
        end = next(i for i, line in enumerate(lines) if line.startswith("sources:"))
        block = [header, "    instances:\n", *(r + "\n" for r in rows)]
        return "".join(lines[:end] + block + lines[end:])
    stop = next((i for i in range(start + 1, len(lines)) if lines[i].strip() and not lines[i].startswith("   ")),
                len(lines))
    inside = lines[start + 1:stop]
    at = next((i for i, line in enumerate(inside) if line.startswith("    instances:")), None)
    if at is None:
        inside = ["    instances:\n", *(r + "\n" for r in rows), *inside]
    else:
        after = next((i for i in range(at + 1, len(inside)) if inside[i].strip()
                      and not inside[i].startswith("      ")), len(inside))
        inside = [*inside[:at], "    instances:\n", *(r + "\n" for r in rows), *inside[after:]]
    return "".join(lines[:start + 1] + inside + lines[stop:])


Fetch = Callable[[str], Any]
