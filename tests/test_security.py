"""The security defaults of a created cluster, as the plan hands them to AWS: who administers the cluster, what
the nodes and the add-ons may do, how the model cache and the secrets key are reached, where the control plane
logs go, the vLLM API key; and every bad setting of them refused before anything registers."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from conftest import StackPlan, plan_config, stack_document, write_stack_file
from triarch import cli
from triarch.components.cluster import kubeconfig
from triarch.offline import KNOWN_AFTER_APPLY, SECRET
from triarch.planners.iam import account_root, file_system_policy, key_policy

EKS_STACKS = ("dev", "prod")
ADMIN_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"


def refusal(tmp_path: Path, config: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> str:
    path = write_stack_file(tmp_path / "Pulumi.test.yaml", config)
    code = cli.main(["plan", "--stack-file", str(path), "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 2, captured.out
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "planning stack" not in captured.out + captured.err and not (tmp_path / "out").exists()
    return lines[0].removeprefix("error: ")


def one(plan: StackPlan, type_: str) -> Any:
    [resource] = plan.of_type(type_)
    return resource


def urn_of(plan: StackPlan, type_: str, name: str) -> str:
    [resource] = [r for r in plan.of_type(type_) if r.name == name]
    return resource.urn


# --- access to the cluster -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("stack", EKS_STACKS)
def test_only_the_named_admins_administer_the_cluster(shipped: dict[str, StackPlan], stack: str) -> None:
    plan = shipped[stack]
    cluster = one(plan, "aws:eks/cluster:Cluster")
    assert cluster.inputs["accessConfig"] == {"authenticationMode": "API",
                                              "bootstrapClusterCreatorAdminPermissions": False}
    admins = plan.config["triarch:cluster"]["adminRoleArns"]
    assert admins == ["arn:aws:iam::123456789012:role/triarch-admin"]
    entries = [e for e in plan.of_type("aws:eks/accessEntry:AccessEntry") if e.inputs["type"] == "STANDARD"]
    assert [e.inputs["principalArn"] for e in entries] == admins
    [association] = plan.of_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
    assert association.inputs == {"accessScope": {"type": "cluster"}, "clusterName": cluster.inputs["name"],
                                  "policyArn": ADMIN_POLICY, "principalArn": admins[0]}
    # The association waits for its entry (EKS refuses a policy for a principal without one).
    assert association.property_dependencies["principalArn"] == (entries[0].urn,)
    # The Kubernetes provider waits for the admins: nothing reaches the API before someone may.
    [provider] = [r for r in plan.resources if r.type == "pulumi:providers:kubernetes"]
    assert association.urn in plan.dependencies[provider.urn]


def test_admins_are_named_by_role_so_reordering_replaces_nothing(tmp_path: Path) -> None:
    config = stack_document("dev")
    config["triarch:cluster"]["adminRoleArns"] = ["arn:aws:iam::123456789012:role/platform/ops",
                                                  "arn:aws:iam::123456789012:user/ci-deployer"]
    first = plan_config("dev", config, tmp_path / "a")
    config["triarch:cluster"]["adminRoleArns"].reverse()
    second = plan_config("dev", config, tmp_path / "b")
    names = sorted(r.name for r in first.of_type("aws:eks/accessEntry:AccessEntry") if r.inputs["type"] == "STANDARD")
    assert names == ["llm-dev-admin-ci-deployer", "llm-dev-admin-ops"]
    by_urn = {r.urn: r.inputs for r in first.resources if r.type.startswith("aws:eks/access")}
    assert by_urn == {r.urn: r.inputs for r in second.resources if r.type.startswith("aws:eks/access")}


@pytest.mark.parametrize(("admins", "expected"), [
    ([], "triarch:cluster.adminRoleArns: [] is required when the cluster is created (triarch:cluster.create: "
         "true), and names no administrator"),
    (["arn:aws:iam::123456789012:role/a/ops", "arn:aws:iam::210987654321:role/ops"],
     "triarch:cluster.adminRoleArns[1]: 'arn:aws:iam::210987654321:role/ops' has the name 'ops' of entry [0]"),
    (["arn:aws:iam::123456789012:group/ops"], "triarch:cluster.adminRoleArns[0]: "),
    (["arn:aws:sts::123456789012:assumed-role/ops/session"], "triarch:cluster.adminRoleArns[0]: "),
])
def test_bad_admin_lists_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], admins: list[str],
                                     expected: str) -> None:
    config = stack_document("dev")
    config["triarch:cluster"]["adminRoleArns"] = admins
    assert refusal(tmp_path, config, capsys).startswith(expected)


def test_admins_on_an_adopted_cluster_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = stack_document("local")
    config["triarch:cluster"]["adminRoleArns"] = ["arn:aws:iam::123456789012:role/ops"]
    line = refusal(tmp_path, config, capsys)
    assert line.startswith("triarch:cluster.adminRoleArns: ") and "only applies to a cluster Triarch creates" in line


# --- reaching the API server ---------------------------------------------------------------------------------------

PRIVATE_ENDPOINT_WARNING = ("cluster 'llm-dev' has a private API endpoint (triarch:cluster.endpointPublicAccessCidrs: "
                            "[]) and names no way in")


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_a_shipped_stack_opens_no_documentation_range_and_warns_it_has_no_way_in(shipped: dict[str, StackPlan],
                                                                               stack: str) -> None:
    """A shipped file cannot know the user's address: its endpoint is private and the plan says what to set, rather
    than a documentation range that would pass the plan and fail the up after EKS made the cluster."""
    plan = shipped[stack]
    cluster = one(plan, "aws:eks/cluster:Cluster")
    assert cluster.inputs["vpcConfig"]["endpointPrivateAccess"] is True
    assert cluster.inputs["vpcConfig"]["endpointPublicAccess"] is False
    assert "publicAccessCidrs" not in cluster.inputs["vpcConfig"]
    name = plan.config["triarch:cluster"]["name"]
    [warning] = [w for w in plan.run.warnings if "private API endpoint" in w]
    assert warning.startswith(f"cluster '{name}' has a private API endpoint")
    assert "curl -s https://checkip.amazonaws.com" in warning


def test_a_public_endpoint_opens_only_the_named_ranges_and_warns_nothing(tmp_path: Path) -> None:
    config = stack_document("dev")
    config["triarch:cluster"]["endpointPublicAccessCidrs"] = ["198.18.7.9/32", "100.64.0.0/10"]
    plan = plan_config("dev", config, tmp_path)
    vpc = one(plan, "aws:eks/cluster:Cluster").inputs["vpcConfig"]
    assert (vpc["endpointPublicAccess"], vpc["publicAccessCidrs"]) == (True, ["198.18.7.9/32", "100.64.0.0/10"])
    assert not [w for w in plan.run.warnings if "API endpoint" in w]
    assert not plan.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")


def test_a_private_endpoint_admits_https_from_each_named_range_by_its_range(tmp_path: Path) -> None:
    """The way in through a VPN or peered VPC: the cluster's security group admits 443 from each range, each rule
    named after its range, so reordering the list replaces nothing; the Kubernetes provider waits for them."""
    config = stack_document("dev")
    config["triarch:cluster"]["privateAccessCidrs"] = ["10.200.0.0/16", "172.20.0.0/16"]
    first = plan_config("dev", config, tmp_path / "a")
    rules = first.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
    assert sorted(r.name for r in rules) == ["llm-dev-api-from-10-200-0-0-16", "llm-dev-api-from-172-20-0-0-16"]
    cluster = one(first, "aws:eks/cluster:Cluster")
    for rule in rules:
        assert rule.inputs["ipProtocol"] == "tcp" and rule.inputs["fromPort"] == rule.inputs["toPort"] == 443
        assert rule.property_dependencies["securityGroupId"] == (cluster.urn,)
    assert {r.inputs["cidrIpv4"] for r in rules} == {"10.200.0.0/16", "172.20.0.0/16"}
    [provider] = [r for r in first.resources if r.type == "pulumi:providers:kubernetes"]
    assert {r.urn for r in rules} <= set(first.dependencies[provider.urn])
    assert not [w for w in first.run.warnings if "API endpoint" in w]
    config["triarch:cluster"]["privateAccessCidrs"].reverse()
    second = plan_config("dev", config, tmp_path / "b")
    assert ({r.urn: r.inputs for r in rules} ==
            {r.urn: r.inputs for r in second.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")})


def test_a_created_cluster_exports_its_kubeconfig_as_a_secret_and_an_adopted_one_none(
        shipped: dict[str, StackPlan]) -> None:
    assert shipped["dev"].run.outputs["kubeconfig"] == SECRET
    assert "kubeconfig" not in shipped["local"].run.outputs


def test_the_kubeconfig_holds_no_credential_and_gets_a_token_from_the_aws_cli() -> None:
    """What `pulumi stack output kubeconfig --show-secrets` gives (docs/deploy.md): kubectl asks `aws eks get-token`
    for a token at each use, in the cluster's region; its only context is the cluster's name."""
    config = json.loads(kubeconfig("llm-dev", "https://ABC.gr7.us-east-1.eks.amazonaws.com", "Q0E=", "us-east-1"))
    assert config["current-context"] == "llm-dev"
    assert config["contexts"] == [{"name": "llm-dev", "context": {"cluster": "llm-dev", "user": "llm-dev"}}]
    assert config["clusters"] == [{"name": "llm-dev", "cluster": {
        "server": "https://ABC.gr7.us-east-1.eks.amazonaws.com", "certificate-authority-data": "Q0E="}}]
    assert config["users"] == [{"name": "llm-dev", "user": {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws",
        "args": ["eks", "get-token", "--cluster-name", "llm-dev", "--region", "us-east-1"],
        "interactiveMode": "Never"}}}]


@pytest.mark.parametrize(("key", "cidrs", "expected"), [
    ("endpointPublicAccessCidrs", ["198.18.7.9/32", "203.0.113.0/24"],
     "triarch:cluster.endpointPublicAccessCidrs[1]: '203.0.113.0/24' is a range reserved for documentation (RFC "
     "5737): no caller is in it; allowed: your egress address as /32 (`curl -s https://checkip.amazonaws.com`)"),
    ("endpointPublicAccessCidrs", ["192.0.2.16/28"], "triarch:cluster.endpointPublicAccessCidrs[0]: '192.0.2.16/28' "
     "is a range reserved for documentation"),
    ("privateAccessCidrs", ["198.51.100.0/24"], "triarch:cluster.privateAccessCidrs[0]: '198.51.100.0/24' is a "
     "range reserved for documentation (RFC 5737): no caller is in it; allowed: your VPN's, peered VPC's or "
     "bastion's range"),
])
def test_a_documentation_range_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str,
                                          cidrs: list[str], expected: str) -> None:
    config = stack_document("dev")
    config["triarch:cluster"][key] = cidrs
    assert refusal(tmp_path, config, capsys).startswith(expected)


def test_a_missing_endpoint_list_names_how_to_find_the_egress_address(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    config = stack_document("dev")
    del config["triarch:cluster"]["endpointPublicAccessCidrs"]
    assert refusal(tmp_path, config, capsys) == (
        "triarch:cluster.endpointPublicAccessCidrs: is required when the cluster is created (triarch:cluster.create: "
        "true): who may reach the API server from outside the VPC, `pulumi up` among them; allowed: your egress "
        "address as /32 (`curl -s https://checkip.amazonaws.com`) and your CI runners' ranges, or [] for a private "
        "endpoint reached through privateAccessCidrs")


@pytest.mark.parametrize("key", ["endpointPublicAccessCidrs", "privateAccessCidrs"])
def test_endpoint_ranges_on_an_adopted_cluster_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           key: str) -> None:
    config = stack_document("local")
    config["triarch:cluster"][key] = ["10.1.0.0/16"]
    line = refusal(tmp_path, config, capsys)
    assert line.startswith(f"triarch:cluster.{key}: ['10.1.0.0/16'] only applies to a cluster Triarch creates")


# --- what the nodes and add-ons may do -----------------------------------------------------------------------------

@pytest.mark.parametrize("stack", EKS_STACKS)
def test_the_vpc_cni_has_its_own_role_and_the_nodes_none_of_its_permissions(shipped: dict[str, StackPlan],
                                                                             stack: str) -> None:
    plan = shipped[stack]
    [cni] = [a for a in plan.of_type("aws:eks/addon:Addon") if a.inputs["addonName"] == "vpc-cni"]
    assert cni.inputs["podIdentityAssociations"] == [{"roleArn": KNOWN_AFTER_APPLY, "serviceAccount": "aws-node"}]
    [role_urn] = cni.property_dependencies["podIdentityAssociations"]
    attachments = [r for r in plan.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                   if r.inputs["policyArn"] == "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy"]
    assert [a.property_dependencies["role"] for a in attachments] == [(role_urn,)]
    # The add-on comes up after the agent that hands out its credentials.
    [agent] = [a for a in plan.of_type("aws:eks/addon:Addon") if a.inputs["addonName"] == "eks-pod-identity-agent"]
    assert agent.urn in plan.dependencies[cni.urn]
    # NetworkPolicy is enforced (the serving namespace's policies rely on it).
    assert json.loads(cni.inputs["configurationValues"]) == {"enableNetworkPolicy": "true"}


# --- the secrets key and the control plane's logs ------------------------------------------------------------------

def test_the_key_policy_leaves_the_key_to_its_account_and_its_log_group() -> None:
    assert account_root("arn:aws:iam::123456789012:role/llm-prod-role-1a2b3c") == "arn:aws:iam::123456789012:root"
    assert account_root("arn:aws-cn:iam::123456789012:role/x") == "arn:aws-cn:iam::123456789012:root"
    assert key_policy("arn:aws:iam::123456789012:root", "us-east-1", "/aws/eks/llm-prod/cluster") == {
        "Version": "2012-10-17", "Statement": [
            {"Sid": "AccountAdministersThroughIam", "Effect": "Allow",
             "Principal": {"AWS": "arn:aws:iam::123456789012:root"}, "Action": "kms:*", "Resource": "*"},
            {"Sid": "CloudWatchLogsEncryptsTheControlPlaneLogs", "Effect": "Allow",
             "Principal": {"Service": "logs.us-east-1.amazonaws.com"},
             "Action": ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
             "Resource": "*", "Condition": {"ArnEquals": {"kms:EncryptionContext:aws:logs:arn":
                                                          "arn:aws:logs:us-east-1:123456789012:log-group:"
                                                          "/aws/eks/llm-prod/cluster"}}}]}
    china = key_policy("arn:aws-cn:iam::123456789012:root", "cn-north-1", "/aws/eks/x/cluster")["Statement"][1]
    assert china["Principal"] == {"Service": "logs.cn-north-1.amazonaws.com.cn"}
    assert china["Condition"]["ArnEquals"]["kms:EncryptionContext:aws:logs:arn"].startswith("arn:aws-cn:logs:")


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_the_secrets_key_has_a_policy_an_alias_and_rotation(shipped: dict[str, StackPlan], stack: str) -> None:
    plan = shipped[stack]
    name = plan.config["triarch:cluster"]["name"]
    key = one(plan, "aws:kms/key:Key")
    assert key.inputs["enableKeyRotation"] is True
    assert key.inputs["policy"] == KNOWN_AFTER_APPLY  # the account comes from the cluster role's ARN
    assert key.property_dependencies["policy"] == (urn_of(plan, "aws:iam/role:Role", f"{name}-role"),)
    alias = one(plan, "aws:kms/alias:Alias")
    assert alias.inputs["name"] == f"alias/{name}-secrets"
    assert alias.property_dependencies["targetKeyId"] == (key.urn,)
    cluster = one(plan, "aws:eks/cluster:Cluster")
    assert cluster.property_dependencies["encryptionConfig"] == (key.urn,)


@pytest.mark.parametrize(("stack", "days"), [("dev", 90), ("prod", 365)])
def test_the_control_plane_logs_go_to_a_managed_group_with_retention(shipped: dict[str, StackPlan], stack: str,
                                                                     days: int) -> None:
    plan = shipped[stack]
    name = plan.config["triarch:cluster"]["name"]
    group = one(plan, "aws:cloudwatch/logGroup:LogGroup")
    # The name EKS writes to: created first, so EKS does not create it without a retention or the key.
    assert group.inputs == {"name": f"/aws/eks/{name}/cluster", "retentionInDays": days,
                            "kmsKeyId": KNOWN_AFTER_APPLY}
    assert group.property_dependencies["kmsKeyId"] == (one(plan, "aws:kms/key:Key").urn,)
    cluster = one(plan, "aws:eks/cluster:Cluster")
    assert group.urn in plan.dependencies[cluster.urn]
    assert sorted(cluster.inputs["enabledClusterLogTypes"]) == ["api", "audit", "authenticator",
                                                                "controllerManager", "scheduler"]


def test_a_retention_cloudwatch_does_not_accept_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = stack_document("dev")
    config["triarch:cluster"]["logRetentionDays"] = 100
    line = refusal(tmp_path, config, capsys)
    assert line.startswith("triarch:cluster.logRetentionDays: 100 ") and "90" in line and "3653" in line


# --- the model cache -----------------------------------------------------------------------------------------------

def test_the_file_system_policy_requires_tls_and_mount_targets() -> None:
    arn = "arn:aws:elasticfilesystem:us-east-1:123456789012:file-system/fs-0123"
    assert file_system_policy(arn) == {"Version": "2012-10-17", "Statement": [
        {"Sid": "MountThroughMountTargets", "Effect": "Allow", "Principal": {"AWS": "*"},
         "Action": ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"], "Resource": arn,
         "Condition": {"Bool": {"elasticfilesystem:AccessedViaMountTarget": "true"}}},
        {"Sid": "DenyWithoutTls", "Effect": "Deny", "Principal": {"AWS": "*"}, "Action": "*", "Resource": arn,
         "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_the_model_cache_is_encrypted_with_the_key_and_reached_by_the_nodes_only(shipped: dict[str, StackPlan],
                                                                                 stack: str) -> None:
    plan = shipped[stack]
    file_system = one(plan, "aws:efs/fileSystem:FileSystem")
    key = one(plan, "aws:kms/key:Key")
    assert file_system.inputs["encrypted"] is True
    assert file_system.property_dependencies["kmsKeyId"] == (key.urn,)
    policy = one(plan, "aws:efs/fileSystemPolicy:FileSystemPolicy")
    assert policy.property_dependencies["fileSystemId"] == (file_system.urn,)
    group = one(plan, "aws:ec2/securityGroup:SecurityGroup")
    [rule] = group.inputs["ingress"]
    # NFS only, only from the cluster security group (which EKS puts on every node), never from an address range.
    assert (rule["protocol"], rule["fromPort"], rule["toPort"]) == ("tcp", 2049, 2049)
    assert rule["securityGroups"] == [KNOWN_AFTER_APPLY]
    assert "cidrBlocks" not in rule and "ipv6CidrBlocks" not in rule
    assert group.property_dependencies["ingress"] == (one(plan, "aws:eks/cluster:Cluster").urn,)
    for mount_target in plan.of_type("aws:efs/mountTarget:MountTarget"):
        assert mount_target.property_dependencies["securityGroups"] == (group.urn,)
    # The StorageClass waits for the policy, so no volume is provisioned on an unprotected file system.
    [storage_class] = [r for r in plan.of_type("kubernetes:storage.k8s.io/v1:StorageClass")
                       if r.inputs["metadata"]["name"] == "triarch-efs"]
    assert policy.urn in plan.dependencies[storage_class.urn]


# --- the vLLM API key ----------------------------------------------------------------------------------------------

API_KEY = "sk-PlantedApiKeyDoNotLeak42"


def vllm_only(config: dict[str, Any]) -> dict[str, Any]:
    config = copy.deepcopy(config)
    for model in config["triarch:models"]:
        model["engine"] = "vllm"
    return config


def test_an_api_key_reaches_every_vllm_server_from_a_secret(tmp_path: Path) -> None:
    config = vllm_only(stack_document("dev"))
    config["triarch:vllmApiKey"] = {"secure": "AAABA" + API_KEY}
    plan = plan_config("dev", config, tmp_path)
    secrets = {s["metadata"]["name"]: s for s in plan.objects("Secret") if s["metadata"]["namespace"] == "llm"}
    assert set(secrets) == {"vllm-api-key"}
    [secret] = [r for r in plan.of_type("kubernetes:core/v1:Secret") if r.inputs["metadata"]["namespace"] == "llm"]
    assert secret.inputs["stringData"] == {"key": "[secret]"}
    deployments = plan.objects("Deployment")
    assert deployments
    for deployment in deployments:
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        [env] = [e for e in container["env"] if e["name"] == "VLLM_API_KEY"]
        assert env == {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "vllm-api-key", "key": "key"}}}
        assert not any("api-key" in arg for arg in container["args"])  # never on the command line
    assert API_KEY not in json.dumps([r.inputs for r in plan.resources])


def test_without_a_key_no_server_asks_for_one(shipped: dict[str, StackPlan]) -> None:
    for deployment in shipped["dev"].objects("Deployment"):
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        assert "VLLM_API_KEY" not in [e["name"] for e in container["env"]]


def test_an_api_key_with_a_ray_serve_model_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = stack_document("prod")
    config["triarch:vllmApiKey"] = {"secure": "AAABA" + API_KEY}
    line = refusal(tmp_path, config, capsys)
    assert line.startswith("triarch:vllmApiKey: is checked by vLLM's own server only"), line
    ray_models = [m["name"] for m in config["triarch:models"] if m.get("engine") == "ray-serve"]
    assert len(ray_models) == 2
    assert f"so {', '.join(ray_models)} (engine ray-serve) would answer without it" in line
    assert API_KEY not in line


def test_a_plain_text_api_key_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = vllm_only(stack_document("dev"))
    config["triarch:vllmApiKey"] = API_KEY
    line = refusal(tmp_path, config, capsys)
    assert "pulumi config set --secret triarch:vllmApiKey" in line and API_KEY not in line


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_no_usage_reports_leave_the_cluster(shipped: dict[str, StackPlan], stack: str) -> None:
    plan = shipped[stack]
    containers = [c for d in plan.objects("Deployment") for c in d["spec"]["template"]["spec"]["containers"]]
    for service in plan.objects("RayService"):
        cluster = service["spec"]["rayClusterConfig"]
        for template in [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]:
            containers += template["spec"]["containers"]
    assert containers
    for container in containers:
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["VLLM_NO_USAGE_STATS"] == "1" and env["RAY_USAGE_STATS_ENABLED"] == "0", container["name"]
