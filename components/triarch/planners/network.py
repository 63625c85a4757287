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


def plan_subnets(vpc_cidr: IPv4Network, zones: list[str]) -> list[SubnetPlan]:
    """Private subnets get an eighth of the VPC each (pods take VPC addresses with the VPC CNI);
    public subnets, which hold only load balancers and NAT gateways, share the last eighth."""
    if vpc_cidr.prefixlen > 20:
        raise ConfigError("triarch:cluster.vpcCidr", str(vpc_cidr), "is too small for per-zone subnets",
                          "a /20 or larger, e.g. 10.0.0.0/16")
    if len(zones) > 7:
        raise ConfigError("triarch:cluster.zones", zones, "lists more zones than the address plan holds", "1..7")
    eighths = list(vpc_cidr.subnets(prefixlen_diff=3))
    publics = list(eighths[7].subnets(prefixlen_diff=3))
    return [SubnetPlan(zone, str(eighths[i]), str(publics[i])) for i, zone in enumerate(zones)]
