"""Karpenter on a created cluster: what it needs in AWS (node role, instance profile and access entry, the
interruption queue and its EventBridge rules, its own IAM through Pod Identity), its CRDs and chart, and one
NodePool + EC2NodeClass per GPU pool it scales."""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from triarch.catalog import Chart
from triarch.components.cluster import EksCluster
from triarch.components.manifests import helm_release, register
from triarch.components.nodegroups import NodeRole
from triarch.planners import karpenter as plan
from triarch.planners.iam import pod_identity_trust


class Karpenter(pulumi.ComponentResource):
    def __init__(self, name: str, eks: EksCluster, cluster: str, region: str, charts: tuple[Chart, Chart],
                 provider: k8s.Provider, opts: pulumi.ResourceOptions | None = None,
                 monitor_labels: dict[str, str] | None = None, after: list[pulumi.Resource] | None = None,
                 pull_through: str | None = None, docker_config: pulumi.Input[str] | None = None,
                 efa: bool = False, placement_groups: list[str] | None = None,
                 capacity_buffers: bool = False, capacity_reservations: bool = False,
                 node_repair: bool = False) -> None:
        super().__init__("triarch:karpenter:Karpenter", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        # What EFA pools' node classes select: a security group open to itself (EFA's requirement between nodes),
        # and a cluster placement group per pool that asks for one (Karpenter selects them, never creates them).
        self.node_class_needs: list[pulumi.Resource] = []
        if efa:
            self_only = [{"protocol": "-1", "from_port": 0, "to_port": 0, "self": True,
                          "description": "EFA between the nodes of EFA pools"}]
            self.node_class_needs.append(aws.ec2.SecurityGroup(
                f"{name}-efa", name=plan.efa_security_group_name(cluster), vpc_id=eks.network.vpc.id,
                description=f"EFA traffic between the GPU nodes of {cluster}", ingress=self_only, egress=self_only,
                tags={plan.EFA_SECURITY_GROUP_TAG: cluster, "Name": plan.efa_security_group_name(cluster)},
                opts=child))
        for group in placement_groups or []:
            self.node_class_needs.append(aws.ec2.PlacementGroup(f"{name}-{group}", name=group, strategy="cluster",
                                                                opts=child))
        # Its own node role: EKS already holds an access entry for the managed node groups' role, and a second
        # entry for the same principal is refused.
        self.node_role = NodeRole(f"{name}-nodes", pull_through, opts=child)
        self.instance_profile = aws.iam.InstanceProfile(
            f"{name}-nodes", name=plan.instance_profile_name(cluster), role=self.node_role.role.name,
            opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True))
        self.access_entry = aws.eks.AccessEntry(
            f"{name}-nodes", cluster_name=eks.cluster.name, principal_arn=self.node_role.role.arn, type="EC2_LINUX",
            opts=child)

        self.queue = aws.sqs.Queue(f"{name}-interruptions", name=plan.queue_name(cluster),
                                   message_retention_seconds=plan.QUEUE_RETENTION_SECONDS,
                                   sqs_managed_sse_enabled=True,
                                   opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True))
        self.queue_policy = aws.sqs.QueuePolicy(
            f"{name}-interruptions", queue_url=self.queue.url,
            policy=self.queue.arn.apply(lambda arn: json.dumps(plan.queue_policy(arn))), opts=child)
        self.rules: dict[str, aws.cloudwatch.EventRule] = {}
        for event in plan.INTERRUPTION_EVENTS:
            rule = aws.cloudwatch.EventRule(f"{name}-{event}", event_pattern=plan.event_pattern(event),
                                            description=f"Karpenter interruption events of {cluster}", opts=child)
            aws.cloudwatch.EventTarget(f"{name}-{event}", rule=rule.name, arn=self.queue.arn, opts=child)
            self.rules[event] = rule

        self.controller_role = aws.iam.Role(
            f"{name}-controller",
            assume_role_policy=pod_identity_trust(cluster, plan.NAMESPACE, plan.SERVICE_ACCOUNT), opts=child)
        policy = pulumi.Output.all(eks.cluster.arn, self.node_role.role.arn, self.queue.arn,
                                   self.instance_profile.arn).apply(lambda arns: json.dumps(plan.controller_policy(
                                       cluster=cluster, region=region, cluster_arn=str(arns[0]),
                                       node_role_arn=str(arns[1]), queue_arn=str(arns[2]),
                                       instance_profile_arn=str(arns[3]), placement_groups=bool(placement_groups),
                                       capacity_reservations=capacity_reservations)))
        self.controller_policy = aws.iam.RolePolicy(f"{name}-controller", role=self.controller_role.id,
                                                    policy=policy, opts=child)
        self.pod_identity = aws.eks.PodIdentityAssociation(
            f"{name}-controller", cluster_name=eks.cluster.name, namespace=plan.NAMESPACE,
            service_account=plan.SERVICE_ACCOUNT, role_arn=self.controller_role.arn,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[eks.addons["eks-pod-identity-agent"]]))

        crd_chart, chart = charts
        # CRDs from their own chart (under templates/, so a version bump upgrades them); the controller's chart
        # then skips its crds/, which Helm would install once and never upgrade.
        self.crds = helm_release(f"{plan.RELEASE}-crd", crd_chart, plan.NAMESPACE, {},
                                 pulumi.ResourceOptions(parent=self, provider=provider))
        self.release = helm_release(
            plan.RELEASE, chart, plan.NAMESPACE,
            plan.controller_values(cluster, monitor_labels, capacity_buffers, node_repair),
            pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[
                self.crds, self.pod_identity, self.controller_policy, self.queue_policy, self.access_entry,
                eks.addons["coredns"], *(after or [])]),
            skip_crds=True, docker_config=docker_config)
        self.register_outputs({"interruptionQueue": self.queue.name})


class KarpenterPool(pulumi.ComponentResource):
    """One GPU pool as an EC2NodeClass and its NodePool (in that order in `objects`). Both depend on the
    controller, so a destroy removes them (and Karpenter drains and terminates their nodes) before it goes."""

    def __init__(self, name: str, objects: list[dict[str, Any]], karpenter: Karpenter, provider: k8s.Provider,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:karpenter:KarpenterPool", name, None, opts)
        node_class, node_pool = objects
        self.node_class = register(node_class, pulumi.ResourceOptions(
            parent=self, provider=provider,
            depends_on=[karpenter.release, karpenter.instance_profile, *karpenter.node_class_needs]))
        self.node_pool = register(node_pool, pulumi.ResourceOptions(
            parent=self, provider=provider, depends_on=[karpenter.release, self.node_class]))
        self.register_outputs({"nodePool": node_pool["metadata"]["name"]})
