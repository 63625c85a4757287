"""What AWS refuses on an update that each plan alone cannot see, read from the base and the head of a diff
(templates/compat/service-rules.yaml): a Kubernetes version step other than one minor up, a cluster's subnets in a
zone it was not created in. Pure: two plan.json documents in, refusals out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CLUSTER = "aws:eks/cluster:Cluster"
SUBNET = "aws:ec2/subnet:Subnet"


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def _clusters(plan: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {r["urn"]: r for r in plan["resources"] if r["type"] == CLUSTER}


def _zones(plan: Mapping[str, Any], cluster: Mapping[str, Any]) -> set[str]:
    """The zones of the subnets a cluster's vpcConfig takes (through the engine's property dependencies)."""
    subnets = {r["urn"]: r for r in plan["resources"] if r["type"] == SUBNET}
    return {str(subnets[urn]["inputs"].get("availabilityZone")) for urn in
            cluster.get("propertyDependencies", {}).get("vpcConfig", []) if urn in subnets}


def refusals(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[str]:
    """One line per change AWS would refuse, saying what works instead."""
    found = []
    before = _clusters(base)
    for urn, cluster in sorted(_clusters(head).items()):
        if urn not in before:
            continue  # a new cluster is created, not updated
        was, now = str(before[urn]["inputs"].get("version")), str(cluster["inputs"].get("version"))
        if was != now:
            (old_major, old_minor), (new_major, new_minor) = _minor(was), _minor(now)
            if (new_major, new_minor) < (old_major, old_minor):
                found.append(f"triarch:cluster.kubernetesVersion: {was} -> {now} goes down, which EKS refuses; "
                             f"allowed: {was} or newer (an older version needs a new cluster, a new cluster.name)")
            elif new_major != old_major or new_minor > old_minor + 1:
                step = f"{old_major}.{old_minor + 1}"
                found.append(f"triarch:cluster.kubernetesVersion: {was} -> {now} skips a minor, which EKS refuses "
                             f"(one minor per update); allowed: {step} first (a `pulumi up`), then {now}")
        added = sorted(_zones(head, cluster) - _zones(base, before[urn]))
        if added:
            created = ", ".join(sorted(_zones(base, before[urn])))
            found.append(f"triarch:cluster.zones: {', '.join(added)} is not a zone the cluster was created in "
                         f"({created}), and EKS takes new subnets only there; allowed: the zones it has, or a new "
                         "cluster (a new cluster.name)")
    return found
