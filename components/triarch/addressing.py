"""Address plan for a created cluster's VPC: one private and one public subnet per zone."""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Network

from triarch.errors import ConfigError


@dataclass(frozen=True)
class SubnetPlan:
    zone: str
    private_cidr: str
    public_cidr: str


ZONE_SLOTS = 7
"""Private subnets take seven of the VPC's eighths (slots a..g); public subnets share the eighth."""


def zone_slot(zone: str) -> int:
    """A zone's place in the address plan, from its letter (us-east-1c -> 2): a subnet's range belongs to its
    zone, not to the zone's position in the list, so reordering or adding zones never moves a subnet."""
    return ord(zone[-1]) - ord("a")


def plan_subnets(vpc_cidr: IPv4Network, zones: list[str]) -> list[SubnetPlan]:
    """Private subnets get an eighth of the VPC each (pods take VPC addresses with the VPC CNI); public subnets,
    which hold only load balancers and NAT gateways, share the last eighth."""
    if vpc_cidr.prefixlen > 20:
        raise ConfigError("triarch:cluster.vpcCidr", str(vpc_cidr), "is too small for per-zone subnets",
                          "a /20 or larger, e.g. 10.0.0.0/16")
    for i, zone in enumerate(zones):
        if not 0 <= zone_slot(zone) < ZONE_SLOTS:
            raise ConfigError(f"triarch:cluster.zones[{i}]", zone, "has no slot in the address plan",
                              "zones whose letter is a..g")
    eighths = list(vpc_cidr.subnets(prefixlen_diff=3))
    publics = list(eighths[7].subnets(prefixlen_diff=3))
    return [SubnetPlan(zone, str(eighths[zone_slot(zone)]), str(publics[zone_slot(zone)])) for zone in zones]
