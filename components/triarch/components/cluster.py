"""The cluster and the one Kubernetes provider every Kubernetes resource is given (never the ambient kubeconfig)."""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from triarch.catalog import Catalog, addon_versions
from triarch.components.network import Network
from triarch.components.nodegroups import ManagedNodeGroup, NodeRole
from triarch.config import ClusterConfig, StackConfig, admin_key
from triarch.planners import repair
from triarch.planners.iam import (
    VPC_CNI_POLICY,
    VPC_CNI_SERVICE_ACCOUNT,
    account_root,
    cluster_admin_policy,
    control_plane_log_group,
    key_policy,
    pod_identity_trust,
)
from triarch.planners.nodegroups import launch_template, managed_node_group_name
from triarch.planners.registry import pull_through_policy
from triarch.scheduling import POOL_LABEL, SYSTEM_POOL

CLUSTER_POLICY = "arn:aws:iam::aws:policy/AmazonEKSClusterPolicy"
SYSTEM_AMI_TYPE = "AL2023_x86_64_STANDARD"
CONTROL_PLANE_LOGS = ["api", "audit", "authenticator", "controllerManager", "scheduler"]

ADDON_CONFIGURATION = {"vpc-cni": json.dumps({"enableNetworkPolicy": "true"}),
                       repair.facts().addon: repair.addon_configuration()}
"""The VPC CNI enforces NetworkPolicy only when asked (the serving namespace relies on it); the node monitoring
agent's DCGM host engine tolerates the GPU taint (planners/repair.py), or a tainted GPU node reads as failed."""

EKS_ASSUME_ROLE = """{"Version": "2012-10-17", "Statement": [{"Effect": "Allow",
 "Principal": {"Service": "eks.amazonaws.com"}, "Action": "sts:AssumeRole"}]}"""


def pinned_addon_version(kubernetes: str, addon: str) -> str | None:
    """The add-on version pinned in templates/compat/eks-addons.yaml; without one EKS installs its default for
    the cluster version, which the plan says."""
    version = addon_versions().get(kubernetes, {}).get(addon)
    if version is None:
        pulumi.log.warn(f"EKS add-on {addon} has no pinned version for Kubernetes {kubernetes} in "
                        "templates/compat/eks-addons.yaml; EKS installs its default")
    return version


def range_key(cidr: object) -> str:
    """An address range as a resource name's part: 10.200.0.0/16 -> 10-200-0-0-16."""
    return str(cidr).replace(".", "-").replace("/", "-")


def kubeconfig(name: str, endpoint: str, certificate_authority: str, region: str) -> str:
    """A kubeconfig built only from stable cluster facts, so the provider is not replaced on every run;
    credentials come from `aws eks get-token` at use time and never enter state."""
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws",
                     "args": ["eks", "get-token", "--cluster-name", name, "--region", region],
                     "interactiveMode": "Never"}}
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name,
                      "cluster": {"server": endpoint, "certificate-authority-data": certificate_authority}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "users": [{"name": name, "user": user}],
    })


class EksCluster(pulumi.ComponentResource):
    """VPC, control plane (private endpoint, secrets encrypted with KMS, API authentication), a CPU system node
    group for add-ons, operators and Ray heads, and the core add-ons."""

    def __init__(self, name: str, stack: StackConfig, facts: Catalog, system_release_version: str,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:cluster:EksCluster", name, None, opts)
        config: ClusterConfig = stack.cluster
        assert stack.aws_region is not None
        child = pulumi.ResourceOptions(parent=self)
        self.network = Network(f"{name}-net", config, stack.aws_region, opts=child)
        self.role = aws.iam.Role(f"{name}-role", assume_role_policy=EKS_ASSUME_ROLE, opts=child)
        policy = aws.iam.RolePolicyAttachment(f"{name}-cluster-policy", role=self.role.name,
                                              policy_arn=CLUSTER_POLICY, opts=child)
        region = stack.aws_region
        log_group = control_plane_log_group(config.name)
        # The key's account is the cluster role's (created in the deploying account): no call a preview must make.
        self.secrets_key = aws.kms.Key(
            f"{name}-secrets", description=f"EKS secrets and model cache of {config.name}", enable_key_rotation=True,
            deletion_window_in_days=30,
            policy=self.role.arn.apply(lambda arn: json.dumps(key_policy(account_root(arn), region, log_group))),
            opts=child)
        self.secrets_key_alias = aws.kms.Alias(f"{name}-secrets", name=f"alias/{config.name}-secrets",
                                               target_key_id=self.secrets_key.key_id, opts=child)
        # EKS writes the control plane's logs here; created first so it is Triarch's: a retention, the cluster's key.
        self.log_group = aws.cloudwatch.LogGroup(f"{name}-logs", name=log_group, kms_key_id=self.secrets_key.arn,
                                                 retention_in_days=config.log_retention_days, opts=child)
        public_cidrs = [str(c) for c in config.endpoint_public_access_cidrs or []]
        self.cluster = aws.eks.Cluster(
            name,
            name=config.name,
            version=config.kubernetes_version,
            role_arn=self.role.arn,
            vpc_config={
                "subnet_ids": [s.id for s in self.network.private_subnets + self.network.public_subnets],
                "endpoint_private_access": True,
                "endpoint_public_access": bool(public_cidrs),
                "public_access_cidrs": public_cidrs or None,
            },
            # Access only through the access entries below: the creator of the cluster gets nothing implicitly.
            access_config={"authentication_mode": "API", "bootstrap_cluster_creator_admin_permissions": False},
            encryption_config={"provider": {"key_arn": self.secrets_key.arn}, "resources": ["secrets"]},
            enabled_cluster_log_types=CONTROL_PLANE_LOGS,
            bootstrap_self_managed_addons=False,
            # The creator's access is fixed at creation: a cluster created with it keeps it rather than being
            # replaced (revoke it with `aws eks delete-access-entry`).
            opts=pulumi.ResourceOptions(parent=self, depends_on=[policy, self.log_group],
                                        ignore_changes=["accessConfig.bootstrapClusterCreatorAdminPermissions"]))
        # The private endpoint's way in from a VPN, peered VPC or bastion: HTTPS into the security group EKS made for
        # the cluster (it admits only itself otherwise). Each rule is named after its range, never its position.
        self.private_access = [
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-api-from-{range_key(cidr)}",
                security_group_id=self.cluster.vpc_config.cluster_security_group_id, cidr_ipv4=str(cidr),
                ip_protocol="tcp", from_port=443, to_port=443,
                description=f"Kubernetes API from {cidr} (triarch:cluster.privateAccessCidrs)", opts=child)
            for cidr in config.private_access_cidrs]
        self.admins = [self._admin(name, arn, region) for arn in config.admin_role_arns]
        self.node_role = NodeRole(f"{name}-nodes", pull_through_policy(stack), opts=child)
        self.cni_role = aws.iam.Role(f"{name}-vpc-cni", assume_role_policy=pod_identity_trust(
            config.name, *VPC_CNI_SERVICE_ACCOUNT), opts=child)
        cni_policy = aws.iam.RolePolicyAttachment(f"{name}-vpc-cni", role=self.cni_role.name,
                                                  policy_arn=VPC_CNI_POLICY, opts=child)

        def addon(addon_name: str, after: list[pulumi.Resource], **extra: Any) -> aws.eks.Addon:
            return aws.eks.Addon(
                f"{name}-{addon_name}", cluster_name=self.cluster.name, addon_name=addon_name,
                addon_version=pinned_addon_version(config.kubernetes_version, addon_name),
                resolve_conflicts_on_create="OVERWRITE", resolve_conflicts_on_update="PRESERVE",
                configuration_values=ADDON_CONFIGURATION.get(addon_name), **extra,
                opts=pulumi.ResourceOptions(parent=self, depends_on=after))

        # Nodes only become Ready once the network add-ons run (the cluster bootstraps none itself), and
        # CoreDNS needs Ready nodes: so network add-ons, then nodes, then CoreDNS. The VPC CNI takes its AWS
        # permissions through Pod Identity (the agent runs on the host network, before any pod address exists),
        # so the nodes' own role carries none of them.
        self.addons = {"eks-pod-identity-agent": addon("eks-pod-identity-agent", [])}
        self.addons["vpc-cni"] = addon("vpc-cni", [cni_policy, self.addons["eks-pod-identity-agent"]],
                                       pod_identity_associations=[{"role_arn": self.cni_role.arn,
                                                                   "service_account": VPC_CNI_SERVICE_ACCOUNT[1]}])
        self.addons["kube-proxy"] = addon("kube-proxy", [])
        self.node_prerequisites: list[pulumi.Resource] = list(self.addons.values())
        system = config.system_node_group
        self.system_nodes = ManagedNodeGroup(
            f"{name}-system", cluster_name=self.cluster.name, name_base=f"{config.name}-{SYSTEM_POOL}",
            node_group_name=managed_node_group_name(config.name, SYSTEM_POOL, instance_type=system.instance_type,
                                                    ami_type=SYSTEM_AMI_TYPE, capacity_type="ON_DEMAND",
                                                    zones=config.zones),
            instance_type=system.instance_type, ami_type=SYSTEM_AMI_TYPE,
            release_version=system_release_version, capacity_type="ON_DEMAND", min_size=system.min,
            max_size=system.max, template=launch_template(config.name, SYSTEM_POOL, system.disk_gib),
            subnet_ids=[s.id for s in self.network.private_subnets], node_role=self.node_role,
            labels={POOL_LABEL: SYSTEM_POOL}, eks_taints=[], cluster_for_tags=config.name, pool=SYSTEM_POOL,
            opts=pulumi.ResourceOptions(parent=self, depends_on=self.node_prerequisites))
        self.addons["coredns"] = addon("coredns", [self.system_nodes])
        if repair.repairs(stack):
            # Node repair's eyes: a DaemonSet on every node (and DCGM's on the GPU nodes), once nodes run.
            self.addons[repair.facts().addon] = addon(repair.facts().addon, [self.system_nodes])
        self.kubeconfig = pulumi.Output.all(
            self.cluster.name, self.cluster.endpoint, self.cluster.certificate_authority.data
        ).apply(lambda args: kubeconfig(str(args[0]), str(args[1]), str(args[2]), stack.aws_region or ""))
        self.provider = k8s.Provider(f"{name}-k8s", kubeconfig=self.kubeconfig,
                                     opts=pulumi.ResourceOptions(parent=self,
                                                                 depends_on=[*self.addons.values(), *self.admins,
                                                                             *self.private_access]))
        self.register_outputs({"clusterName": self.cluster.name, "endpoint": self.cluster.endpoint})

    def _admin(self, name: str, principal: str, region: str) -> aws.eks.AccessPolicyAssociation:
        """An administrator of the cluster: an access entry and the cluster-admin access policy, cluster-wide."""
        key = admin_key(principal)
        entry = aws.eks.AccessEntry(f"{name}-admin-{key}", cluster_name=self.cluster.name, principal_arn=principal,
                                    type="STANDARD", opts=pulumi.ResourceOptions(parent=self))
        return aws.eks.AccessPolicyAssociation(
            f"{name}-admin-{key}", cluster_name=self.cluster.name, principal_arn=entry.principal_arn,
            policy_arn=cluster_admin_policy(region), access_scope={"type": "cluster"},
            opts=pulumi.ResourceOptions(parent=self))


class AdoptedCluster(pulumi.ComponentResource):
    """An existing cluster, reached through an explicit kubeconfig file and context."""

    def __init__(self, name: str, config: ClusterConfig, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:cluster:AdoptedCluster", name, None, opts)
        self.provider = k8s.Provider(f"{name}-k8s", kubeconfig=config.kubeconfig_path, context=config.context,
                                     opts=pulumi.ResourceOptions(parent=self))
        self.register_outputs({"context": config.context})
