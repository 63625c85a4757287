"""Karpenter for a created cluster's GPU pools, as plain data: one NodePool + EC2NodeClass per pool, the
controller's Helm values, its IAM policy and the interruption events it listens to.

Karpenter decides *where* capacity appears (which instance, which zone, when a node goes away); the pool's
labels, taint, AMI release and size limit are the same facts an EKS managed node group carries, so every layer
above (device plugin, workloads, guardrails) sees one GPU pool whatever brings its nodes up.
"""

from __future__ import annotations

import json
from typing import Any

from triarch.planners.iam import partition_of
from triarch.planners.nodegroups import BASELINE_PULL, IMDS_HOP_LIMIT, EksPoolPlan, user_data
from triarch.planners.pods import MANAGED_BY
from triarch.planners.repair import facts as repair_facts
from triarch.scheduling import (
    CAPACITY_TYPE_LABEL,
    GPU_RESOURCE,
    POOL_LABEL,
    RESERVED_CAPACITY,
    RESERVED_NODES_ANNOTATION,
    SYSTEM_POOL,
)

NAMESPACE = "kube-system"
"""Where Karpenter's docs install it: API Priority and Fairness gives kube-system's service accounts and leader
election their own FlowSchemas, so the controller is not throttled behind workloads when it is busiest."""
RELEASE = "karpenter"
"""The Helm release name; the chart derives its service account and deployment names from it."""
SERVICE_ACCOUNT = "karpenter"
"""The chart's service account (serviceAccount.name), which the Pod Identity association names."""
NODE_CLASS_GROUP = "karpenter.k8s.aws"
DISCOVERY_TAG = "karpenter.sh/discovery"
"""Tag on the private subnets Karpenter may launch GPU nodes into (value: the cluster name)."""
CLUSTER_SECURITY_GROUP_TAG = "aws:eks:cluster-name"
"""EKS tags the cluster security group it creates with this key; managed node groups use that group too."""
EFA_SECURITY_GROUP_TAG = "triarch.dev/efa"
"""Tag (value: the cluster name) of the security group EFA pools add: all traffic to and from itself, which EFA
needs between nodes (EC2 User Guide, "Prepare an EFA-enabled security group")."""


def efa_security_group_name(cluster: str) -> str:
    return f"{cluster}-efa"

CONSOLIDATE_AFTER = "10m"
"""An empty GPU node stays this long: a rollout or a Ray scale-down followed by a scale-up reuses it instead of
waiting ~10 minutes for a new node (boot, driver, a 10+ GB image)."""
DISRUPTION_BUDGETS = [{"nodes": "1"}]
"""At most one node of a pool is disrupted at a time (emptied, drifted to a new AMI release), so a pool never
loses more than one node's replicas to Karpenter; PodDisruptionBudgets still hold each workload."""
EXPIRE_AFTER = "Never"
"""Karpenter v1 expiry is forceful (it drains past budgets). AMIs are pinned by release, so nodes are rotated
on purpose: bump amiRelease, and drift replaces nodes one at a time within the budget."""

ARCHITECTURES = {"AL2023_x86_64_NVIDIA": "amd64", "AL2023_ARM_64_NVIDIA": "arm64"}
CAPACITY_TYPES = {"ON_DEMAND": "on-demand", "SPOT": "spot"}
"""The EKS spelling of a capacity type -> the karpenter.sh/capacity-type label value."""

INTERRUPTION_EVENTS = {
    "scheduled-change": ("aws.health", "AWS Health Event"),
    "spot-interruption": ("aws.ec2", "EC2 Spot Instance Interruption Warning"),
    "rebalance": ("aws.ec2", "EC2 Instance Rebalance Recommendation"),
    "instance-state-change": ("aws.ec2", "EC2 Instance State-change Notification"),
    "capacity-reservation-interruption": ("aws.ec2", "EC2 Capacity Reservation Instance Interruption Warning"),
}
"""EventBridge rules feeding the interruption queue: name -> (source, detail-type), as Karpenter's getting-started
template (v1.14.1) defines them. With them Karpenter drains a node before EC2 takes it away."""
QUEUE_RETENTION_SECONDS = 300
"""An interruption message older than five minutes is moot (a spot notice is two minutes)."""

CONTROLLER_RESOURCES = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}
"""Memory request = limit (the controller caches every node and pod; an OOM kill stops provisioning); CPU is
a request only, so a burst of pending pods is not throttled."""


def node_class_name(plan: EksPoolPlan) -> str:
    return plan.pool.name


def instance_profile_name(cluster: str) -> str:
    """Triarch creates the nodes' instance profile (so the controller needs no IAM write access); its name is
    known before apply, so the EC2NodeClass is complete in a plan."""
    return f"{cluster}-karpenter-node"


def root_volume(plan: EksPoolPlan) -> dict[str, Any]:
    """An encrypted gp3 root volume, at the throughput the pool's image pull needs where it is above gp3's
    included baseline."""
    ebs: dict[str, Any] = {"volumeSize": f"{plan.disk_gib}Gi", "volumeType": "gp3", "encrypted": True,
                           "deleteOnTermination": True}
    if plan.pull.root_mib_s != BASELINE_PULL.root_mib_s:
        ebs.update(throughput=plan.pull.root_mib_s, iops=plan.pull.root_iops)
    return ebs


def node_class(plan: EksPoolPlan, cluster: str) -> dict[str, Any]:
    """The EC2NodeClass of a pool: its pinned AMI release, IMDSv2 with one hop, an encrypted gp3 root volume; the
    instance store as RAID0 and parallel image pull where the pool has them (Karpenter sets up the array itself
    from instanceStorePolicy, so only the feature gate goes in user data); for EFA, the EFA security group, no
    public address and the pool's placement group."""
    node: dict[str, Any] = {
        "apiVersion": f"{NODE_CLASS_GROUP}/v1", "kind": "EC2NodeClass",
        "metadata": {"name": node_class_name(plan), "labels": dict(MANAGED_BY)},
        "spec": {
            # The alias resolves to the NVIDIA variant of the release for GPU instance types, so the driver the
            # matrix checked (templates/compat/amis.yaml) is the driver the node boots with.
            "amiSelectorTerms": [{"alias": f"al2023@{plan.ami_release}"}],
            "instanceProfile": instance_profile_name(cluster),
            "subnetSelectorTerms": [{"tags": {DISCOVERY_TAG: cluster}}],
            "securityGroupSelectorTerms": [{"tags": {CLUSTER_SECURITY_GROUP_TAG: cluster}}],
            "metadataOptions": {"httpEndpoint": "enabled", "httpProtocolIPv6": "disabled",
                                "httpPutResponseHopLimit": IMDS_HOP_LIMIT, "httpTokens": "required"},
            "blockDeviceMappings": [{"deviceName": "/dev/xvda", "rootVolume": True, "ebs": root_volume(plan)}],
            "tags": {"Name": f"{cluster}-{plan.pool.name}", POOL_LABEL: plan.pool.name},
        },
    }
    spec: dict[str, Any] = node["spec"]
    if plan.pull.instance_store:
        spec["instanceStorePolicy"] = "RAID0"
    data = user_data(plan.pull.node_config(local_storage=False))
    if data:
        spec["userData"] = data
    if plan.pool.efa_interfaces:
        # Karpenter gives every EFA interface the node class's security groups; EC2 refuses a public address with
        # more than one interface (the pool's subnets are private; said here so a subnet default cannot change it).
        spec["securityGroupSelectorTerms"].append({"tags": {EFA_SECURITY_GROUP_TAG: cluster}})
        spec["associatePublicIPAddress"] = False
    if plan.placement_group:
        spec["placementGroupSelector"] = {"name": plan.placement_group}
    if plan.reservations:
        spec["capacityReservationSelectorTerms"] = reservation_terms(plan)
    return node


def reservation_terms(plan: EksPoolPlan) -> list[dict[str, Any]]:
    """The pool's reservations as Karpenter selects them (EC2NodeClass capacityReservationSelectorTerms, 1.14.1):
    an id alone, or tags with the owning account. Karpenter finds each reservation's type (ODCR or Capacity Block)
    in EC2 itself."""
    terms: list[dict[str, Any]] = []
    for term in plan.reservations:
        if term.id is not None:
            terms.append({"id": term.id})
        else:
            terms.append({"tags": dict(term.tags or {}), **({"ownerID": term.owner_id} if term.owner_id else {})})
    return terms


def capacity_types(plan: EksPoolPlan) -> list[str]:
    """The NodePool's karpenter.sh/capacity-type values: reserved first where the pool has reservations (Karpenter
    prefers it whatever the order), then the pool's own capacity type unless it is to run on reservations only."""
    own = [CAPACITY_TYPES[plan.capacity_type]]
    if not plan.reservations:
        return own
    return [RESERVED_CAPACITY] if plan.reserved_only else [RESERVED_CAPACITY, *own]


def reserved_nodes(plan: EksPoolPlan) -> int | None:
    """The instances the pool's reservations hold, where every one's count is given; None otherwise."""
    counts = [term.count for term in plan.reservations]
    return sum(c for c in counts if c is not None) if counts and None not in counts else None


def pool_limits(plan: EksPoolPlan) -> dict[str, str]:
    """`max` nodes' worth of GPUs, CPUs and memory: Karpenter stops adding nodes at the first limit reached."""
    return {
        GPU_RESOURCE: str(plan.max * plan.pool.gpus_per_node),
        "cpu": str(plan.max * plan.vcpus),
        "memory": f"{int(plan.max * plan.memory_gib)}Gi",
    }


def node_pool(plan: EksPoolPlan) -> dict[str, Any]:
    """The NodePool of a pool: its labels and GPU taint on every node, its instance type, zones and capacity
    type, disruption that never consolidates a node with pods on it, and limits from `max`."""
    requirements = [
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [plan.instance_type]},
        {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": capacity_types(plan)},
        # Sorted: reordering the stack's zones must not touch the NodePool.
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": sorted(plan.zones)},
        {"key": "kubernetes.io/arch", "operator": "In", "values": [ARCHITECTURES[plan.ami_type]]},
        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
    ]
    metadata: dict[str, Any] = {"name": plan.pool.name, "labels": dict(MANAGED_BY)}
    reserved = reserved_nodes(plan)
    if reserved is not None:
        metadata["annotations"] = {RESERVED_NODES_ANNOTATION: str(reserved)}
    return {
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
        "metadata": metadata,
        "spec": {
            "template": {
                "metadata": {"labels": dict(plan.pool.labels)},
                "spec": {
                    "nodeClassRef": {"group": NODE_CLASS_GROUP, "kind": "EC2NodeClass",
                                     "name": node_class_name(plan)},
                    "requirements": requirements,
                    "taints": [dict(t) for t in plan.pool.taints],
                    "expireAfter": EXPIRE_AFTER,
                },
            },
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": CONSOLIDATE_AFTER,
                           "budgets": [dict(b) for b in DISRUPTION_BUDGETS]},
            "limits": pool_limits(plan),
        },
    }


def queue_name(cluster: str) -> str:
    return f"{cluster}-karpenter"


def controller_values(cluster: str, monitor_labels: dict[str, str] | None = None,
                      capacity_buffers: bool = False, node_repair: bool = False) -> dict[str, Any]:
    """The chart's values: this cluster and its interruption queue, on the system nodes, with fixed resources, and
    a ServiceMonitor (with the labels the cluster's Prometheus selects) where one runs; the CapacityBuffer feature
    gate (alpha, off by default) where a model keeps warm capacity; the NodeRepair gate (alpha, off by default)
    where the stack repairs its GPU nodes (planners/repair.py). Every key exists in the chart's values.yaml
    (1.14.1); the image stays the one the chart release stamps."""
    settings: dict[str, Any] = {"clusterName": cluster, "interruptionQueue": queue_name(cluster)}
    if capacity_buffers:
        settings["featureGates"] = {"capacityBuffer": True}
    if node_repair:
        settings.setdefault("featureGates", {})[repair_facts().feature_gate] = True
    values: dict[str, Any] = {
        "settings": settings,
        "serviceAccount": {"create": True, "name": SERVICE_ACCOUNT},
        "nodeSelector": {POOL_LABEL: SYSTEM_POOL},
        "controller": {"resources": CONTROLLER_RESOURCES},
    }
    if monitor_labels is not None:
        values["serviceMonitor"] = {"enabled": True, "additionalLabels": dict(monitor_labels)}
    return values


def controller_policy(*, cluster: str, region: str, cluster_arn: str, node_role_arn: str, queue_arn: str,
                      instance_profile_arn: str, placement_groups: bool = False,
                      capacity_reservations: bool = False) -> dict[str, Any]:
    """What the controller may do, scoped to this cluster: launch and tag instances only with this cluster's
    ownership tags, terminate only what it launched, pass only the node role, read only its queue.

    Written for Triarch's setup, narrower than Karpenter's getting-started policy: Triarch creates the instance
    profile (the controller creates, tags and deletes none), and zonal shift is not used; placement groups only where
    a pool has one (Karpenter resolves its placementGroupSelector); capacity reservations only where a pool has
    some (Karpenter describes them and launches into them, as the getting-started policy allows).
    """
    arn = f"arn:{partition_of(region)}:ec2:{region}"
    owned = {f"aws:ResourceTag/kubernetes.io/cluster/{cluster}": "owned"}
    launched = {"aws:ResourceTag/karpenter.sh/nodepool": "*"}
    tagged_at_launch = {f"aws:RequestTag/kubernetes.io/cluster/{cluster}": "owned",
                        "aws:RequestTag/eks:eks-cluster-name": cluster}
    created = [f"{arn}:*:{kind}/*" for kind in ("fleet", "instance", "volume", "network-interface",
                                                "launch-template", "spot-instances-request")]
    statements: list[dict[str, Any]] = [
        {"Sid": "LaunchFromImagesSubnetsAndSecurityGroups", "Effect": "Allow",
         "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
         "Resource": [f"{arn}::image/*", f"{arn}::snapshot/*", f"{arn}:*:security-group/*", f"{arn}:*:subnet/*",
                      *([f"{arn}:*:capacity-reservation/*"] if capacity_reservations else [])]},
        {"Sid": "LaunchWithOwnLaunchTemplates", "Effect": "Allow",
         "Action": ["ec2:RunInstances", "ec2:CreateFleet"], "Resource": f"{arn}:*:launch-template/*",
         "Condition": {"StringEquals": owned, "StringLike": launched}},
        {"Sid": "CreateOnlyClusterOwnedResources", "Effect": "Allow",
         "Action": ["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate"], "Resource": created,
         "Condition": {"StringEquals": tagged_at_launch,
                       "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"}}},
        {"Sid": "TagOnCreation", "Effect": "Allow", "Action": "ec2:CreateTags", "Resource": created,
         "Condition": {"StringEquals": {**tagged_at_launch,
                                        "ec2:CreateAction": ["RunInstances", "CreateFleet", "CreateLaunchTemplate"]},
                       "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"}}},
        {"Sid": "TagOwnInstances", "Effect": "Allow", "Action": "ec2:CreateTags", "Resource": f"{arn}:*:instance/*",
         "Condition": {"StringEquals": owned, "StringLike": launched,
                       "StringEqualsIfExists": {"aws:RequestTag/eks:eks-cluster-name": cluster},
                       "ForAllValues:StringEquals": {"aws:TagKeys": ["eks:eks-cluster-name", "karpenter.sh/nodeclaim",
                                                                     "Name"]}}},
        {"Sid": "DeleteOnlyOwnInstancesAndTemplates", "Effect": "Allow",
         "Action": ["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"],
         "Resource": [f"{arn}:*:instance/*", f"{arn}:*:launch-template/*"],
         "Condition": {"StringEquals": owned, "StringLike": launched}},
        {"Sid": "PassOnlyTheNodeRole", "Effect": "Allow", "Action": "iam:PassRole", "Resource": node_role_arn,
         "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}},
        {"Sid": "ReadTheNodeInstanceProfile", "Effect": "Allow", "Action": "iam:GetInstanceProfile",
         "Resource": instance_profile_arn},
        # The instance-profile garbage collector lists profiles by path on every run; the API has no narrower
        # resource. Read-only, and the controller has no action that changes a profile.
        {"Sid": "ListInstanceProfiles", "Effect": "Allow", "Action": "iam:ListInstanceProfiles", "Resource": "*"},
        {"Sid": "DiscoverTheClusterEndpoint", "Effect": "Allow", "Action": "eks:DescribeCluster",
         "Resource": cluster_arn},
        {"Sid": "ReadTheInterruptionQueue", "Effect": "Allow",
         "Action": ["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"], "Resource": queue_arn},
        {"Sid": "DescribeInThisRegion", "Effect": "Allow", "Resource": "*",
         "Action": ["ec2:DescribeImages", "ec2:DescribeInstances", "ec2:DescribeInstanceStatus",
                    "ec2:DescribeInstanceTypeOfferings", "ec2:DescribeInstanceTypes", "ec2:DescribeLaunchTemplates",
                    "ec2:DescribeSecurityGroups", "ec2:DescribeSpotPriceHistory", "ec2:DescribeSubnets",
                    *(["ec2:DescribePlacementGroups"] if placement_groups else []),
                    *(["ec2:DescribeCapacityReservations"] if capacity_reservations else [])],
         "Condition": {"StringEquals": {"aws:RequestedRegion": region}}},
        {"Sid": "ResolveAmiAliases", "Effect": "Allow", "Action": "ssm:GetParameter",
         "Resource": f"arn:{partition_of(region)}:ssm:{region}::parameter/aws/service/*"},
        {"Sid": "ReadPrices", "Effect": "Allow", "Action": "pricing:GetProducts", "Resource": "*"},
    ]
    return {"Version": "2012-10-17", "Statement": statements}


def queue_policy(queue_arn: str) -> dict[str, Any]:
    """EventBridge (and SQS itself) may send to the queue; nothing may use it without TLS."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "EventsSendInterruptions", "Effect": "Allow",
         "Principal": {"Service": ["events.amazonaws.com", "sqs.amazonaws.com"]},
         "Action": "sqs:SendMessage", "Resource": queue_arn},
        {"Sid": "DenyWithoutTls", "Effect": "Deny", "Principal": "*", "Action": "sqs:*", "Resource": queue_arn,
         "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
    ]}


def event_pattern(event: str) -> str:
    source, detail_type = INTERRUPTION_EVENTS[event]
    return json.dumps({"source": [source], "detail-type": [detail_type]})
