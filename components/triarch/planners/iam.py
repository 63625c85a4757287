"""IAM and resource policies of a created cluster, as plain data: who may assume each role, who may use the KMS
key, and how the model cache's file system may be mounted."""

from __future__ import annotations

import json
from typing import Any

CLUSTER_ADMIN_POLICY = "arn:{partition}:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
"""The EKS access policy that makes a principal a cluster admin (EKS access entries)."""
VPC_CNI_SERVICE_ACCOUNT = ("kube-system", "aws-node")
VPC_CNI_POLICY = "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy"


def partition_of(region: str) -> str:
    """The AWS partition of a region (ARNs differ in China and GovCloud)."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def pod_identity_trust(cluster: str, namespace: str, service_account: str) -> str:
    """A role only one service account of this cluster can assume through EKS Pod Identity: the session tags
    EKS Pod Identity sets, used as conditions as the EKS user guide shows ("Create IAM role with trust policy
    required by EKS Pod Identity")."""
    return json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"Service": "pods.eks.amazonaws.com"},
        "Action": ["sts:AssumeRole", "sts:TagSession"],
        "Condition": {"StringEquals": {"aws:RequestTag/eks-cluster-name": cluster,
                                       "aws:RequestTag/kubernetes-namespace": namespace,
                                       "aws:RequestTag/kubernetes-service-account": service_account}},
    }]})


def account_root(principal_arn: str) -> str:
    """The account principal (`arn:<partition>:iam::<account>:root`) of an IAM role or user ARN."""
    partition, account = principal_arn.split(":")[1], principal_arn.split(":")[4]
    return f"arn:{partition}:iam::{account}:root"


def key_policy(account_root_arn: str, region: str, log_group: str) -> dict[str, Any]:
    """The secrets key's policy, explicit: the account administers and uses it through IAM (EKS and EFS take
    grants with the deploying principal's permissions), CloudWatch Logs encrypts the control plane's log group with
    it (that group only, as "Encrypt log data in CloudWatch Logs using AWS KMS" shows), and nobody else."""
    partition, account = account_root_arn.split(":")[1], account_root_arn.split(":")[4]
    domain = "amazonaws.com.cn" if partition == "aws-cn" else "amazonaws.com"
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "AccountAdministersThroughIam", "Effect": "Allow", "Principal": {"AWS": account_root_arn},
         "Action": "kms:*", "Resource": "*"},
        {"Sid": "CloudWatchLogsEncryptsTheControlPlaneLogs", "Effect": "Allow",
         "Principal": {"Service": f"logs.{region}.{domain}"},
         "Action": ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
         "Resource": "*",
         "Condition": {"ArnEquals": {
             "kms:EncryptionContext:aws:logs:arn": f"arn:{partition}:logs:{region}:{account}:log-group:{log_group}"}}},
    ]}


def control_plane_log_group(cluster: str) -> str:
    """Where EKS writes a cluster's control-plane logs (a fixed name: EKS creates it unless it exists)."""
    return f"/aws/eks/{cluster}/cluster"


def file_system_policy(file_system_arn: str) -> dict[str, Any]:
    """Clients mount the model cache through its mount targets only, and never without TLS."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "MountThroughMountTargets", "Effect": "Allow", "Principal": {"AWS": "*"},
         "Action": ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"],
         "Resource": file_system_arn,
         "Condition": {"Bool": {"elasticfilesystem:AccessedViaMountTarget": "true"}}},
        {"Sid": "DenyWithoutTls", "Effect": "Deny", "Principal": {"AWS": "*"}, "Action": "*",
         "Resource": file_system_arn, "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
    ]}


def cluster_admin_policy(region: str) -> str:
    return CLUSTER_ADMIN_POLICY.format(partition=partition_of(region))


def s3_location(uri: str) -> tuple[str, str]:
    """s3://bucket/some/prefix/ -> ("bucket", "some/prefix/")."""
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    return bucket, prefix


def weights_read_policy(uris: list[str], region: str) -> dict[str, Any]:
    """Read these weights and nothing else: their objects, and the listing of their prefixes (the streamer lists the
    safetensors files before reading them)."""
    partition = partition_of(region)
    located = [s3_location(uri) for uri in sorted(uris)]
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "ReadTheWeights", "Effect": "Allow", "Action": "s3:GetObject",
         "Resource": [f"arn:{partition}:s3:::{bucket}/{prefix}*" for bucket, prefix in located]},
        *({"Sid": f"ListTheWeights{i}", "Effect": "Allow", "Action": "s3:ListBucket",
           "Resource": f"arn:{partition}:s3:::{bucket}",
           "Condition": {"StringLike": {"s3:prefix": sorted(f"{p}*" for b, p in located if b == bucket)}}}
          for i, bucket in enumerate(sorted({b for b, _ in located}))),
    ]}
