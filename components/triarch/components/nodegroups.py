"""Node groups: the role nodes run as, EKS-managed groups (GPU and system), and existing GPU nodes joined by patch."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from triarch.planners.nodegroups import EksPoolPlan, PoolPlan, node_patch
from triarch.scheduling import POOL_LABEL

NODE_POLICIES = {
    "worker": "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "ecr-pull": "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly",
}
"""Only what a node needs: join the cluster and pull images. The VPC CNI's permissions go to its own role
(EKS Pod Identity), so a pod that reaches the node's credentials cannot assign addresses."""

EC2_ASSUME_ROLE = """{"Version": "2012-10-17", "Statement": [{"Effect": "Allow",
 "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}"""


class NodeRole(pulumi.ComponentResource):
    """The IAM role EC2 nodes run as (managed node groups and Karpenter nodes each get their own)."""

    def __init__(self, name: str, pull_through: str | None = None, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:nodegroups:NodeRole", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.role = aws.iam.Role(f"{name}-role", assume_role_policy=EC2_ASSUME_ROLE, opts=child)
        self.attachments = [
            aws.iam.RolePolicyAttachment(f"{name}-{key}", role=self.role.name, policy_arn=arn, opts=child)
            for key, arn in NODE_POLICIES.items()
        ]
        # Pulls through the stack's ECR pull-through cache: import and first-pull repository creation, scoped to
        # its mirror's repositories (planners/registry.py).
        self.pull_through = None if pull_through is None else aws.iam.RolePolicy(
            f"{name}-pull-through", role=self.role.id, policy=pull_through, opts=child)
        self.register_outputs({"arn": self.role.arn})


class ManagedNodeGroup(pulumi.ComponentResource):
    """An EKS managed node group behind a launch template that enforces IMDSv2 and an encrypted root volume.

    Nothing autoscales a managed node group here (GPU pools that scale are Karpenter's), so Pulumi owns its
    desired size: it is `min`, and `max` is headroom for a rolling update or a manual scale-out."""

    def __init__(self, name: str, *, cluster_name: pulumi.Input[str], node_group_name: str, name_base: str,
                 instance_type: str, ami_type: str, release_version: str, capacity_type: str,
                 min_size: int, max_size: int, template: dict[str, Any], subnet_ids: list[pulumi.Output[str]],
                 node_role: NodeRole, labels: dict[str, str], eks_taints: list[dict[str, str]],
                 cluster_for_tags: str, pool: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:nodegroups:ManagedNodeGroup", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.launch_template = aws.ec2.LaunchTemplate(
            f"{name}-lt", name_prefix=f"{name_base}-", update_default_version=True,
            **template, opts=child)
        self.node_group = aws.eks.NodeGroup(
            name,
            cluster_name=cluster_name,
            node_group_name=node_group_name,
            node_role_arn=node_role.role.arn,
            subnet_ids=subnet_ids,
            instance_types=[instance_type],
            ami_type=ami_type,
            release_version=release_version,
            capacity_type=capacity_type,
            scaling_config={"min_size": min_size, "max_size": max_size, "desired_size": min_size},
            update_config={"max_unavailable": 1},
            labels=labels,
            taints=eks_taints,
            launch_template={"id": self.launch_template.id, "version": self.launch_template.latest_version.apply(str)},
            tags={POOL_LABEL: pool},
            opts=pulumi.ResourceOptions(parent=self, depends_on=node_role.attachments))
        self.register_outputs({"nodeGroupName": self.node_group.node_group_name})


def gpu_node_group(plan: EksPoolPlan, *, cluster_name: pulumi.Input[str], cluster_for_tags: str,
                   subnet_ids: list[pulumi.Output[str]], node_role: NodeRole,
                   opts: pulumi.ResourceOptions) -> ManagedNodeGroup:
    """A fixed-size GPU pool as a managed node group (min == max, checked in the config)."""
    return ManagedNodeGroup(
        f"gpu-{plan.pool.name}", cluster_name=cluster_name, node_group_name=plan.node_group_name,
        name_base=f"{cluster_for_tags}-{plan.pool.name}",
        instance_type=plan.instance_type, ami_type=plan.ami_type, release_version=plan.release_version,
        capacity_type=plan.capacity_type, min_size=plan.min, max_size=plan.max, template=plan.launch_template,
        subnet_ids=subnet_ids, node_role=node_role, labels=plan.pool.labels, eks_taints=plan.eks_taints,
        cluster_for_tags=cluster_for_tags, pool=plan.pool.name, opts=opts)


class ExistingGpuPool(pulumi.ComponentResource):
    """Existing GPU nodes (a workstation, an adopted cluster) made members of a pool by labels and taint."""

    def __init__(self, name: str, pool: PoolPlan, nodes: list[str], provider: k8s.Provider,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:nodegroups:ExistingGpuPool", name, None, opts)
        self.pool = pool
        patches = {node: node_patch(node, pool) for node in nodes}
        self.patches = [
            k8s.core.v1.NodePatch(f"{name}-{node}", metadata=patch["metadata"], spec=patch["spec"],
                                  opts=pulumi.ResourceOptions(parent=self, provider=provider))
            for node, patch in patches.items()
        ]
        self.register_outputs({"nodes": nodes})

