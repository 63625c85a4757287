"""A shared model cache for a created cluster: EFS, its CSI driver (pod identity, no node permissions) and a
StorageClass, so every replica of a model, on any node and zone, reads one copy of the weights."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from triarch.components.cluster import EksCluster, pinned_addon_version
from triarch.components.manifests import register
from triarch.planners.iam import file_system_policy, pod_identity_trust
from triarch.planners.pods import RUN_AS
from triarch.planners.serving import BLOCK_STORAGE_CLASS, EFS_STORAGE_CLASS, block_storage_class

EFS_CSI_POLICY = "arn:aws:iam::aws:policy/service-role/AmazonEFSCSIDriverPolicy"
EFS_CSI_SERVICE_ACCOUNT = "efs-csi-controller-sa"
EBS_CSI_POLICY = "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"
EBS_CSI_SERVICE_ACCOUNT = "ebs-csi-controller-sa"
"""The policy and service account the EKS add-on documents for the EBS CSI driver (docs.aws.amazon.com/eks/latest/
userguide/add-ons-aws-ebs-csi-driver.html; Pod Identity since v1.26.0-eksbuild.1, retreive-iam-info.html)."""



def csi_driver(name: str, eks: EksCluster, cluster_name: str, kubernetes_version: str, addon: str,
               service_account: str, policy_arn: str, parent: pulumi.Resource) -> tuple[aws.iam.Role, aws.eks.Addon]:
    """An AWS CSI driver as its EKS add-on, pinned, with a role of its own through Pod Identity (no node
    permissions): the role `<name>`, its policy, and the add-on `<name>-driver`."""
    child = pulumi.ResourceOptions(parent=parent)
    role = aws.iam.Role(name, assume_role_policy=pod_identity_trust(cluster_name, "kube-system", service_account),
                        opts=child)
    policy = aws.iam.RolePolicyAttachment(name, role=role.name, policy_arn=policy_arn, opts=child)
    driver = aws.eks.Addon(
        f"{name}-driver", cluster_name=eks.cluster.name, addon_name=addon,
        addon_version=pinned_addon_version(kubernetes_version, addon),
        resolve_conflicts_on_create="OVERWRITE", resolve_conflicts_on_update="PRESERVE",
        pod_identity_associations=[{"role_arn": role.arn, "service_account": service_account}],
        opts=pulumi.ResourceOptions(parent=parent, depends_on=[eks.system_nodes, eks.addons["eks-pod-identity-agent"],
                                                               policy]))
    return role, driver


class SharedModelStore(pulumi.ComponentResource):
    def __init__(self, name: str, eks: EksCluster, cluster_name: str, kubernetes_version: str,
                 provider: k8s.Provider, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:storage:SharedModelStore", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        network = eks.network
        self.security_group = aws.ec2.SecurityGroup(
            f"{name}-nfs", vpc_id=network.vpc.id, description="NFS from the cluster VPC to the model cache",
            # Only the nodes: EKS puts the cluster security group on every node (managed node groups by default,
            # Karpenter's EC2NodeClass selects it by its tag), never on other hosts in the VPC.
            ingress=[{"protocol": "tcp", "from_port": 2049, "to_port": 2049,
                      "security_groups": [eks.cluster.vpc_config.cluster_security_group_id],
                      "description": "NFS from the cluster's nodes"}],
            opts=child)
        # Encrypted with the cluster's key. The key of an existing file system cannot change in place (a new file
        # system would lose the cache): one created before this key keeps the AWS-managed key.
        self.file_system = aws.efs.FileSystem(
            f"{name}-fs", encrypted=True, kms_key_id=eks.secrets_key.arn, performance_mode="generalPurpose",
            throughput_mode="elastic", tags={"Name": f"{name}-model-cache"},
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["kmsKeyId"]))
        self.file_system_policy = aws.efs.FileSystemPolicy(
            f"{name}-fs", file_system_id=self.file_system.id,
            policy=self.file_system.arn.apply(lambda arn: json.dumps(file_system_policy(arn))), opts=child)
        self.mount_targets = [
            aws.efs.MountTarget(f"{name}-mt-{zone}", file_system_id=self.file_system.id, subnet_id=subnet.id,
                                security_groups=[self.security_group.id], opts=child)
            for zone, subnet in network.private_subnet_by_zone.items()
        ]
        self.driver_role, self.driver = csi_driver(f"{name}-efs-csi", eks, cluster_name, kubernetes_version,
                                                   "aws-efs-csi-driver", EFS_CSI_SERVICE_ACCOUNT, EFS_CSI_POLICY, self)
        self.storage_class = register({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": EFS_STORAGE_CLASS, "labels": {"app.kubernetes.io/managed-by": "triarch"}},
            "provisioner": "efs.csi.aws.com",
            # One access point per claim, owned by the serving user.
            "parameters": {"provisioningMode": "efs-ap", "fileSystemId": self.file_system.id,
                           "directoryPerms": "700", "uid": str(RUN_AS), "gid": str(RUN_AS),
                           "basePath": "/triarch"},
            "reclaimPolicy": "Retain",
            "volumeBindingMode": "Immediate",
        }, pulumi.ResourceOptions(parent=self, provider=provider,
                                  depends_on=[self.driver, self.file_system_policy, *self.mount_targets]))
        self.register_outputs({"fileSystemId": self.file_system.id})


class BlockStorage(pulumi.ComponentResource):
    """EBS for what needs a local filesystem (Prometheus' TSDB: its docs refuse NFS, EFS included): the EBS CSI
    driver (pod identity, no node permissions) and an encrypted gp3 class that binds where the pod lands."""

    def __init__(self, name: str, eks: EksCluster, cluster_name: str, kubernetes_version: str,
                 provider: k8s.Provider, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:storage:BlockStorage", name, None, opts)
        self.driver_role, self.driver = csi_driver(f"{name}-ebs-csi", eks, cluster_name, kubernetes_version,
                                                   "aws-ebs-csi-driver", EBS_CSI_SERVICE_ACCOUNT, EBS_CSI_POLICY, self)
        self.storage_class = register(block_storage_class(), pulumi.ResourceOptions(
            parent=self, provider=provider, depends_on=[self.driver]))
        self.register_outputs({"storageClass": BLOCK_STORAGE_CLASS})
