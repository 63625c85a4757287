"""What AWS and the Kubernetes API refuse on an update that each plan alone cannot see, read from the base and the
head of a diff (templates/compat/service-rules.yaml): a Kubernetes version step other than one minor up, a cluster's
subnets in a zone it was not created in, a managed node group rolled back to an earlier AMI, a volume claim that
shrinks, an immutable field of an object updated in place (replacement.yaml's `immutable`). Pure: two plan.json
documents in, refusals (and the changes that depend on the live cluster) out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from triarch.diff import immutable_changes

CLUSTER = "aws:eks/cluster:Cluster"
SUBNET = "aws:ec2/subnet:Subnet"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
POOL_LABEL = "triarch.dev/pool"
CLAIM = "kubernetes:core/v1:PersistentVolumeClaim"
CLAIM_SIZE = "spec.resources.requests.storage"
EXPANDABLE_CLASSES = {"triarch-gp3"}
"""Classes Triarch creates with allowVolumeExpansion (planners/serving.py block_storage_class)."""
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


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


def _bytes(quantity: str) -> int | None:
    """A Kubernetes storage quantity in bytes (the forms a claim's request takes), None if unreadable."""
    for suffix in sorted(UNITS, key=len, reverse=True):
        if quantity.endswith(suffix) and quantity[:-len(suffix)].isdigit():
            return int(quantity[:-len(suffix)]) * UNITS[suffix]
    return int(quantity) if quantity.isdigit() else None


def _release(version: str) -> tuple[tuple[int, ...], str] | None:
    """An EKS AMI release version (`1.35.6-20260714`) as (Kubernetes version, release date), None if unreadable."""
    kubernetes, _, date = version.partition("-")
    parts = kubernetes.split(".")
    if not date.isdigit() or not all(part.isdigit() for part in parts):
        return None
    return tuple(int(part) for part in parts), date


def _node_group_rollbacks(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[str]:
    """A managed node group that stays (same name, so updated, not replaced) and whose release goes back: EKS rolls
    a node group forward only. An earlier Kubernetes minor is the cluster's refusal, so only an earlier AMI of the
    same minor is said here."""
    before = {r["urn"]: r for r in base["resources"] if r["type"] == NODE_GROUP}
    found = []
    for group in (r for r in head["resources"] if r["type"] == NODE_GROUP and r["urn"] in before):
        old_inputs, new_inputs = before[group["urn"]]["inputs"], group["inputs"]
        if old_inputs.get("nodeGroupName") != new_inputs.get("nodeGroupName"):
            continue  # a new group is created at the release it names
        was, now = _release(str(old_inputs.get("releaseVersion"))), _release(str(new_inputs.get("releaseVersion")))
        if was is None or now is None or now[0][:2] != was[0][:2] or now >= was:
            continue
        pool = (new_inputs.get("labels") or {}).get(POOL_LABEL)
        key = ("triarch:cluster.systemNodeGroup.amiRelease" if pool == "system"
               else f"triarch:nodeGroups[].amiRelease of pool {pool}")
        found.append(f"{key}: v{was[1]} -> v{now[1]} rolls node group {group['name']} back to an earlier "
                     f"AMI ({old_inputs.get('releaseVersion')} -> {new_inputs.get('releaseVersion')}), which EKS "
                     f"refuses; allowed: v{was[1]} or a newer release (EKS moves a managed node group forward only)")
    return found


def claim_resizes(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], str, str, int]]:
    """Claims whose size Pulumi would change in place: (the head's claim, before, after, sign of the change). A size
    under the claim's ignoreChanges is never sent, so it is no change."""
    before = {r["urn"]: r for r in base["resources"] if r["type"] == CLAIM}
    found = []
    for claim in (r for r in head["resources"] if r["type"] == CLAIM and r["urn"] in before):
        if CLAIM_SIZE in (claim.get("ignoreChanges") or []):
            continue
        was = str(before[claim["urn"]]["inputs"].get("spec", {}).get("resources", {}).get("requests", {})
                  .get("storage"))
        now = str(claim["inputs"].get("spec", {}).get("resources", {}).get("requests", {}).get("storage"))
        old, new = _bytes(was), _bytes(now)
        if old is not None and new is not None and old != new:
            found.append((claim, was, now, 1 if new > old else -1))
    return found


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
    found += _node_group_rollbacks(base, head)
    for resource, field_path, was, now in immutable_changes(base, head):
        kind = resource["type"].rsplit(":", 1)[-1]
        found.append(f"{kind} {resource['name']}: {field_path} {was} -> {now}, which the Kubernetes API refuses (the "
                     "field is immutable) while Pulumi would update the object in place, so `pulumi up` would fail; "
                     f"allowed: {was}, or the object under a new name (created new, the old one deleted)")
    for claim, was, now, sign in claim_resizes(base, head):
        if sign < 0:
            metadata = claim["inputs"].get("metadata", {})
            found.append(f"claim {metadata.get('namespace')}/{metadata.get('name')}: {was} -> {now} shrinks a volume "
                         "claim, which Kubernetes refuses; allowed: "
                         f"{was} or more (the models' cacheGiB keep it), or a new claim (its models renamed)")
    return found


def claim_growth_notes(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[str]:
    """A claim that grows on a class Triarch did not create: the API server accepts it only for a bound claim whose
    class has allowVolumeExpansion, which no plan can see."""
    notes = []
    for claim, was, now, sign in claim_resizes(base, head):
        storage_class = claim["inputs"].get("spec", {}).get("storageClassName")
        if sign > 0 and storage_class not in EXPANDABLE_CLASSES:
            metadata = claim["inputs"].get("metadata", {})
            shown = f"class {storage_class}" if storage_class else "the cluster's default class"
            notes.append(f"claim {metadata.get('namespace')}/{metadata.get('name')}: grows {was} -> {now}; Kubernetes "
                         f"accepts it only if {shown} has allowVolumeExpansion (`kubectl get storageclass`), else "
                         "`pulumi up` fails on it (the models' cacheGiB keep its size)")
    return notes
