"""`triarch preflight` against an account that botocore's Stubber answers (no packet leaves the machine; no fake of
AWS's API is written here: the clients are botocore's own, their answers checked against AWS's service models), and
the IAM policy Triarch ships, held against the program's plans and the file in docs/."""

from __future__ import annotations

import copy
import datetime
import json
import re
from collections.abc import Callable
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

import botocore.session
import pytest
import yaml
from botocore.exceptions import NoCredentialsError
from botocore.stub import Stubber

from conftest import ROOT, STACK_NAMES, plan_config, stack_document, write_stack_file
from triarch.catalog import catalog
from triarch.cli import main
from triarch.config import from_pulumi_config
from triarch.offline import read_stack_config
from triarch.preflight import aws
from triarch.preflight.permissions import POLICY_FILE, deploy_permissions, load_permissions, policy_text
from triarch.preflight.plan import (
    Finding,
    PreflightPlan,
    backend_url,
    exit_code,
    plan_preflight,
    preflight_facts,
    principal_of,
)

READ_ONLY = re.compile(r"^(Get|Describe|List|Simulate|Head)[A-Z]")
ACCOUNT = "111122223333"
CALLER = f"arn:aws:sts::{ACCOUNT}:assumed-role/deployer/ci-run-7"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/ops/deployer"
EGRESS = "198.18.0.7"

CONFIG: dict[str, Any] = {
    "aws:region": "us-east-1",
    "triarch:cluster": {
        "create": True, "name": "pf", "kubernetesVersion": "1.35", "zones": ["us-east-1a", "us-east-1b"],
        "endpointPublicAccessCidrs": ["198.18.0.0/24"],
        "systemNodeGroup": {"instanceType": "m7i.xlarge", "min": 2, "max": 4, "amiRelease": "v20260714"},
        "adminRoleArns": [ROLE],
    },
    "triarch:nodeGroups": [
        {"name": "l4", "instanceType": "g6.2xlarge", "amiRelease": "v20260714", "min": 0, "max": 3},
        {"name": "cheap", "instanceType": "g6e.xlarge", "amiRelease": "v20260714", "min": 0, "max": 2,
         "capacityType": "SPOT"},
        {"name": "big", "instanceType": "p5.48xlarge", "amiRelease": "v20260714", "min": 1, "max": 1,
         "provisioner": "managedNodeGroup", "zones": ["us-east-1a"]},
    ],
    "triarch:models": [{"name": "embed", "model": "Qwen/Qwen3-Embedding-0.6B", "engine": "vllm", "nodeGroup": "l4"}],
}
"""A created cluster with every kind of pool: Karpenter on-demand (g6.2xlarge, 8 vCPUs), Karpenter spot
(g6e.xlarge, 4), a managed node group of P (p5.48xlarge, 192) in one zone, and the system nodes (m7i.xlarge, 4)."""

NVIDIA_AMI = ("/aws/service/eks/optimized-ami/1.35/amazon-linux-2023/x86_64/nvidia/"
              "amazon-eks-node-al2023-x86_64-nvidia-1.35-v20260714/image_id")
STANDARD_AMI = ("/aws/service/eks/optimized-ami/1.35/amazon-linux-2023/x86_64/standard/"
                "amazon-eks-node-al2023-x86_64-standard-1.35-v20260714/image_id")
QUOTAS = {"L-1216C47A": 16.0, "L-DB2E81BA": 24.0, "L-3819A6DF": 8.0, "L-417A185B": 192.0}
"""Exactly what the pools above hold at their max: standard 4 x 4, G on-demand 3 x 8, G spot 2 x 4, P 1 x 192."""
OFFERED = [("m7i.xlarge", "us-east-1a"), ("m7i.xlarge", "us-east-1b"), ("g6.2xlarge", "us-east-1a"),
           ("g6.2xlarge", "us-east-1b"), ("g6e.xlarge", "us-east-1a"), ("g6e.xlarge", "us-east-1b"),
           ("p5.48xlarge", "us-east-1a")]


# --- the account: botocore clients under Stubber ------------------------------------------------------------------

class Account:
    """One stubbed botocore client per service, every call recorded (operation, parameters)."""

    def __init__(self) -> None:
        self.session = botocore.session.Session()
        self.clients: dict[str, Any] = {}
        self.stubs: dict[str, Stubber] = {}
        self.called: list[tuple[str, dict[str, Any]]] = []
        self.stubbed: list[str] = []

    def client(self, service: str, region: str | None = None) -> Any:
        if service not in self.clients:
            client = self.session.create_client(service, region_name=region or "us-east-1",
                                                aws_access_key_id="testing", aws_secret_access_key="testing")

            def record(model: Any, params: Any, **_: Any) -> None:
                self.called.append((model.name, dict(params)))

            client.meta.events.register("before-parameter-build", record)  # every call, as the caller made it
            stub = Stubber(client)
            stub.activate()
            self.clients[service], self.stubs[service] = client, stub
        return self.clients[service]

    __call__ = client

    def answer(self, service: str, operation: str, response: dict[str, Any],
               params: dict[str, Any] | None = None) -> None:
        self.client(service)
        self.stubbed.append(operation)
        self.stubs[service].add_response(operation, response, params)

    def refuse(self, service: str, operation: str, code: str, status: int = 400,
               params: dict[str, Any] | None = None) -> None:
        self.client(service)
        self.stubbed.append(operation)
        self.stubs[service].add_client_error(operation, code, f"{code} (stubbed)", status, expected_params=params)

    def done(self) -> None:
        for stub in self.stubs.values():
            stub.assert_no_pending_responses()


def stack_plan(tmp_path: Path, config: dict[str, Any] | None = None, secrets: str | None = None,
               backend: str | None = "s3://pf-state") -> PreflightPlan:
    path = write_stack_file(tmp_path / "Pulumi.pf.yaml", config or CONFIG)
    values, _ = read_stack_config(path)
    return plan_preflight("pf", from_pulumi_config(values), catalog(), preflight_facts(),
                          deploy_permissions().deploy_actions(), secrets, backend)


def queue(account: Account, *, quotas: dict[str, float] | None = None, offered: list[tuple[str, str]] | None = None,
          invalid: tuple[str, ...] = (), denied: tuple[str, ...] = (), key_state: str | None = None,
          bucket: Callable[[Account], None] | None = None, role: str = ROLE, caller: str = CALLER) -> None:
    """A healthy account's answers, in the order preflight asks, with what a test changes."""
    account.answer("sts", "get_caller_identity", {"UserId": "AROAEXAMPLEEXAMPLE:ci-run-7", "Account": ACCOUNT,
                                                  "Arn": caller})
    name = caller.split("/")[1]
    account.answer("iam", "get_role", {"Role": {"Path": "/ops/", "RoleName": name, "RoleId": "AROAEXAMPLEEXAMPLE",
                                                "Arn": role, "CreateDate": datetime.datetime(2026, 1, 1)}},
                   {"RoleName": name})
    for code, value in (quotas or QUOTAS).items():
        account.answer("service-quotas", "get_service_quota",
                       {"Quota": {"ServiceCode": "ec2", "QuotaCode": code, "Value": value}},
                       {"ServiceCode": "ec2", "QuotaCode": code})
    account.answer("ec2", "describe_instance_type_offerings", {"InstanceTypeOfferings": [
        {"InstanceType": t, "LocationType": "availability-zone", "Location": z} for t, z in (offered or OFFERED)]},
        {"LocationType": "availability-zone", "Filters": [
            {"Name": "instance-type", "Values": ["g6.2xlarge", "g6e.xlarge", "m7i.xlarge", "p5.48xlarge"]},
            {"Name": "location", "Values": ["us-east-1a", "us-east-1b"]}]})
    account.answer("ssm", "get_parameters", {
        "Parameters": [{"Name": n, "Type": "String", "Value": "ami-0123456789abcdef0"}
                       for n in (STANDARD_AMI, NVIDIA_AMI) if n not in invalid],
        **({"InvalidParameters": list(invalid)} if invalid else {})}, {"Names": [STANDARD_AMI, NVIDIA_AMI]})
    if key_state is not None:
        account.answer("kms", "describe_key", {"KeyMetadata": {"KeyId": "1234abcd-12ab-34cd-56ef-1234567890ab",
                                                               "KeyState": key_state}},
                       {"KeyId": "alias/pulumi-pf"})
    if bucket is None:
        account.answer("s3", "head_bucket", {}, {"Bucket": "pf-state"})
    else:
        bucket(account)
    actions = deploy_permissions().deploy_actions()
    for start in range(0, len(actions), aws.SIMULATE_BATCH):
        chunk = actions[start:start + aws.SIMULATE_BATCH]
        account.answer("iam", "simulate_principal_policy", {"EvaluationResults": [
            {"EvalActionName": a, "EvalDecision": "implicitDeny" if a in denied else "allowed"} for a in chunk],
            "IsTruncated": False}, {"PolicySourceArn": role, "ActionNames": list(chunk)})


def run(account: Account, plan: PreflightPlan, egress: str = EGRESS) -> list[Finding]:
    findings = aws.run_preflight(plan, account, lambda: egress)
    account.done()
    assert [op for op, _ in account.called if not READ_ONLY.match(op)] == [], "preflight called a write API"
    return findings


def of(findings: list[Finding], check: str) -> list[Finding]:
    return [f for f in findings if f.check == check]


# --- a healthy account, then each check failing -------------------------------------------------------------------

def test_a_healthy_account_has_no_blocker_and_only_reads(tmp_path: Path) -> None:
    account = Account()
    queue(account)
    findings = run(account, stack_plan(tmp_path))
    assert [f for f in findings if f.severity != "ok"] == []
    assert exit_code(findings) == 0
    assert {f.check for f in findings} == {"identity", "admin", "quota", "offering", "ami", "endpoint", "secrets",
                                           "backend", "permissions"}
    assert set(account.stubbed) <= {"get_caller_identity", "get_role", "get_service_quota",
                                    "describe_instance_type_offerings", "get_parameters", "head_bucket",
                                    "simulate_principal_policy"}
    assert all(READ_ONLY.match(re.sub(r"(^|_)([a-z])", lambda m: m.group(2).upper(), op)) for op in account.stubbed)
    simulated = [a for op, p in account.called if op == "SimulatePrincipalPolicy" for a in p["ActionNames"]]
    assert sorted(simulated) == sorted(deploy_permissions().deploy_actions())
    assert {"eks:CreateCluster", "iam:PassRole", "ec2:CreateVpc", "kms:CreateGrant"} <= set(simulated)


def test_the_caller_not_among_the_admins_is_a_blocker(tmp_path: Path) -> None:
    account = Account()
    other = f"arn:aws:iam::{ACCOUNT}:role/someone-else"
    queue(account, caller=f"arn:aws:sts::{ACCOUNT}:assumed-role/someone-else/s", role=other)
    [admin] = of(run(account, stack_plan(tmp_path)), "admin")
    assert admin.severity == "blocker"
    assert admin.line() == (f"blocker admin: {other} (the caller) is not among triarch:cluster.adminRoleArns, so "
                            "`pulumi up` could create the cluster but not reach it; fix: add "
                            f"{other} to triarch:cluster.adminRoleArns, or run preflight and `pulumi up` as one of "
                            "them")


def test_quotas_below_one_node_block_and_below_the_max_warn(tmp_path: Path) -> None:
    account = Account()
    queue(account, quotas={"L-1216C47A": 12.0, "L-DB2E81BA": 0.0, "L-3819A6DF": 8.0, "L-417A185B": 96.0})
    findings = run(account, stack_plan(tmp_path))
    lines = {f.message.split(" (")[0]: f for f in of(findings, "quota")}
    standard = lines["Running On-Demand Standard"]
    assert standard.severity == "warning"  # 12 >= the 8 the system's 2 nodes launch, < the 16 of their max 4
    assert "is 12 vCPUs; pools system need 16 at their max" in standard.message
    assert standard.fix is not None and "--quota-code L-1216C47A --desired-value 16 --region us-east-1" in standard.fix
    g = lines["Running On-Demand G and VT instances"]
    assert g.severity == "blocker" and "need 24 at their max and 8 to launch any" in g.message
    p = lines["Running On-Demand P instances"]
    assert p.severity == "blocker" and "need 192 at their max and 192 to launch any" in p.message
    assert lines["All G and VT Spot Instance Requests"].severity == "ok"
    assert exit_code(findings) == 1


def test_a_quota_never_changed_reads_the_aws_default(tmp_path: Path) -> None:
    plan = stack_plan(tmp_path)
    account = Account()
    account.answer("sts", "get_caller_identity", {"UserId": "U", "Account": ACCOUNT, "Arn": CALLER})
    account.refuse("iam", "get_role", "AccessDenied", 403)
    account.refuse("service-quotas", "get_service_quota", "NoSuchResourceException",
                   params={"ServiceCode": "ec2", "QuotaCode": "L-1216C47A"})
    account.answer("service-quotas", "get_aws_default_service_quota",
                   {"Quota": {"ServiceCode": "ec2", "QuotaCode": "L-1216C47A", "Value": 5.0}},
                   {"ServiceCode": "ec2", "QuotaCode": "L-1216C47A"})
    for code in ("L-DB2E81BA", "L-3819A6DF", "L-417A185B"):
        account.refuse("service-quotas", "get_service_quota", "AccessDeniedException", 403,
                       {"ServiceCode": "ec2", "QuotaCode": code})
    account.refuse("ec2", "describe_instance_type_offerings", "UnauthorizedOperation", 403)
    account.refuse("ssm", "get_parameters", "AccessDeniedException", 403)
    account.refuse("s3", "head_bucket", "404", 404)
    account.refuse("iam", "simulate_principal_policy", "AccessDenied", 403)
    findings = run(account, plan)
    quota = of(findings, "quota")
    assert quota[0].severity == "blocker" and "is 5 vCPUs" in quota[0].message  # below the 8 of 2 system nodes
    assert [f.line() for f in quota[1:]] == ["warning quota: not checked: the caller may not call "
                                             "servicequotas:GetServiceQuota (AccessDeniedException); fix: grant "
                                             "servicequotas:GetServiceQuota (docs/iam-policy.json's Preflight "
                                             "statement)"] * 3
    assert [f.severity for f in of(findings, "offering")] == ["warning"]
    assert "ec2:DescribeInstanceTypeOfferings" in of(findings, "offering")[0].line()
    assert [f.severity for f in of(findings, "ami")] == ["warning"]
    [backend] = of(findings, "backend")
    assert backend.severity == "blocker" and "pf-state does not exist" in backend.message
    # GetRole denied: the role's ARN without its path is simulated, and that simulation is denied too.
    [permissions] = of(findings, "permissions")
    assert permissions.line() == ("warning permissions: not checked: the caller may not call "
                                  "iam:SimulatePrincipalPolicy (AccessDenied); fix: grant iam:SimulatePrincipalPolicy "
                                  "(docs/iam-policy.json's Preflight statement)")
    [admin] = of(findings, "admin")
    assert admin.severity == "ok"  # the role's name and account match arn:...:role/ops/deployer
    [(_, request)] = [c for c in account.called if c[0] == "SimulatePrincipalPolicy"]
    assert request["PolicySourceArn"] == f"arn:aws:iam::{ACCOUNT}:role/deployer"


def test_instance_types_missing_in_a_zone(tmp_path: Path) -> None:
    account = Account()
    offered = [o for o in OFFERED if o not in {("m7i.xlarge", "us-east-1b"), ("g6.2xlarge", "us-east-1b"),
                                                 ("p5.48xlarge", "us-east-1a")}]
    queue(account, offered=offered)
    offering = {f.message.split(" ")[1]: f for f in of(run(account, stack_plan(tmp_path)), "offering")}
    assert offering["(system)"].severity == "blocker"  # a managed node group fails to create
    assert offering["(system)"].fix is not None and "drop us-east-1b from triarch:cluster.zones" in offering[
        "(system)"].fix
    assert offering["(l4)"].severity == "warning"  # Karpenter launches in us-east-1a
    assert offering["(l4)"].fix is not None and "drop us-east-1b from the pool l4's zones" in offering["(l4)"].fix
    assert offering["(big)"].severity == "blocker"
    assert offering["(cheap)"].severity == "ok"


def test_an_ami_release_not_published_is_a_blocker(tmp_path: Path) -> None:
    account = Account()
    queue(account, invalid=(NVIDIA_AMI,))
    ami = of(run(account, stack_plan(tmp_path)), "ami")
    assert [f.severity for f in ami] == ["ok", "blocker"]
    assert ami[1].message == (f"AL2023_x86_64_NVIDIA release v20260714 for Kubernetes 1.35 is not published in "
                              f"us-east-1 (no {NVIDIA_AMI}; l4, cheap, big)")
    assert ami[1].fix == "set amiRelease to a release of templates/compat/amis.yaml published there"


@pytest.mark.parametrize(("egress", "severity"), [("198.18.0.200", "ok"), ("198.18.1.7", "blocker")])
def test_the_egress_address_against_the_public_ranges(tmp_path: Path, egress: str, severity: str) -> None:
    account = Account()
    queue(account)
    [endpoint] = of(run(account, stack_plan(tmp_path), egress), "endpoint")
    assert endpoint.severity == severity
    if severity == "blocker":
        assert endpoint.fix == "add 198.18.1.7/32 to triarch:cluster.endpointPublicAccessCidrs"


@pytest.mark.parametrize(("private", "severity"), [(["10.200.0.0/16"], "ok"), ([], "blocker")])
def test_a_private_endpoint_needs_a_named_way_in(tmp_path: Path, private: list[str], severity: str) -> None:
    """No egress address to compare: a private endpoint is reached from the ranges privateAccessCidrs names, and
    without one the up would make the cluster and then fail to reach it."""
    config = copy.deepcopy(CONFIG)
    config["triarch:cluster"].update(endpointPublicAccessCidrs=[], privateAccessCidrs=private)
    account = Account()
    queue(account)
    [endpoint] = of(run(account, stack_plan(tmp_path, config), "198.18.1.7"), "endpoint")
    assert endpoint.severity == severity
    if private:
        assert "must run from 10.200.0.0/16 (triarch:cluster.privateAccessCidrs)" in endpoint.message
    else:
        assert endpoint.message.startswith("the API endpoint is private and no privateAccessCidrs names a way in")


def test_an_unreadable_egress_address_is_a_warning(tmp_path: Path) -> None:
    account = Account()
    queue(account)

    def offline() -> str:
        raise OSError("network is unreachable")

    findings = aws.run_preflight(stack_plan(tmp_path), account, offline)
    [endpoint] = of(findings, "endpoint")
    assert endpoint.severity == "warning" and "network is unreachable" in endpoint.message


@pytest.mark.parametrize(("state", "severity"), [("Enabled", "ok"), ("PendingDeletion", "blocker")])
def test_the_secrets_providers_key(tmp_path: Path, state: str, severity: str) -> None:
    account = Account()
    queue(account, key_state=state)
    plan = stack_plan(tmp_path, secrets="awskms://alias/pulumi-pf?region=us-east-1")
    [secrets] = of(run(account, plan), "secrets")
    assert secrets.severity == severity
    if severity == "blocker":
        assert "alias/pulumi-pf is PendingDeletion" in secrets.message


def test_a_missing_secrets_key_is_a_blocker(tmp_path: Path) -> None:
    account = Account()
    queue(account, bucket=lambda a: (a.refuse("kms", "describe_key", "NotFoundException"),
                                     a.answer("s3", "head_bucket", {}, {"Bucket": "pf-state"})))
    plan = stack_plan(tmp_path, secrets="awskms://alias/pulumi-pf?region=us-east-1")
    [secrets] = of(run(account, plan), "secrets")
    assert secrets.severity == "blocker" and "alias/pulumi-pf does not exist in us-east-1" in secrets.message


@pytest.mark.parametrize(("code", "status", "words"), [("404", 404, "does not exist"),
                                                       ("403", 403, "refuses the caller")])
def test_the_state_bucket(tmp_path: Path, code: str, status: int, words: str) -> None:
    account = Account()
    queue(account, bucket=lambda a: a.refuse("s3", "head_bucket", code, status, {"Bucket": "pf-state"}))
    [backend] = of(run(account, stack_plan(tmp_path)), "backend")
    assert backend.severity == "blocker" and words in backend.message


def test_a_backend_not_in_s3_is_not_checked(tmp_path: Path) -> None:
    account = Account()
    queue(account, bucket=lambda a: None)
    [backend] = of(run(account, stack_plan(tmp_path, backend="file:///var/pulumi")), "backend")
    assert backend.line() == "ok      backend: state backend file:///var/pulumi: not an s3:// bucket, not checked"
    assert backend_url({"PULUMI_BACKEND_URL": "s3://a"}, {"backend": {"url": "s3://b"}}) == "s3://a"
    assert backend_url({}, {"backend": {"url": "s3://b"}}) == "s3://b"
    assert backend_url({}, {"name": "triarch"}) is None


def test_denied_actions_are_listed_and_block(tmp_path: Path) -> None:
    account = Account()
    queue(account, denied=("eks:CreateCluster", "iam:PassRole"))
    findings = run(account, stack_plan(tmp_path))
    [permissions] = of(findings, "permissions")
    assert permissions.line() == (f"blocker permissions: {ROLE} is denied 2 action(s) `pulumi up` needs: "
                                  "eks:CreateCluster, iam:PassRole; fix: attach docs/iam-policy.json (or grant those "
                                  "actions) to the principal")
    assert exit_code(findings) == 1


def test_a_truncated_simulation_is_read_to_its_end(tmp_path: Path) -> None:
    plan = stack_plan(tmp_path)
    account = Account()
    first = list(plan.actions[:aws.SIMULATE_BATCH])
    account.answer("iam", "simulate_principal_policy", {"EvaluationResults": [
        {"EvalActionName": a, "EvalDecision": "allowed"} for a in first[:50]], "IsTruncated": True,
        "Marker": "page-2"}, {"PolicySourceArn": ROLE, "ActionNames": first})
    account.answer("iam", "simulate_principal_policy", {"EvaluationResults": [
        {"EvalActionName": a, "EvalDecision": "explicitDeny" if a == first[70] else "allowed"} for a in first[50:]],
        "IsTruncated": False}, {"PolicySourceArn": ROLE, "ActionNames": first, "Marker": "page-2"})
    rest = list(plan.actions[aws.SIMULATE_BATCH:])
    account.answer("iam", "simulate_principal_policy", {"EvaluationResults": [
        {"EvalActionName": a, "EvalDecision": "allowed"} for a in rest], "IsTruncated": False},
        {"PolicySourceArn": ROLE, "ActionNames": rest})
    finding = aws._simulate(ROLE, plan.actions, account, "us-east-1")
    account.done()
    assert finding.severity == "blocker" and finding.message.endswith(f"denied 1 action(s) `pulumi up` needs: "
                                                                      f"{first[70]}")


def test_missing_credentials_are_one_line() -> None:
    def no_credentials(service: str, region: str | None) -> Any:
        raise NoCredentialsError()

    plan = stack_plan_default()
    findings = aws.run_preflight(plan, no_credentials, lambda: EGRESS)
    assert [f.line() for f in findings] == [
        "blocker identity: no AWS credentials found (environment, profile, SSO or instance role); fix: export "
        "AWS_PROFILE, run `aws sso login`, or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, as `pulumi up` would "
        "run"]
    assert exit_code(findings) == 1


def stack_plan_default() -> PreflightPlan:
    values = {k: v if isinstance(v, str) else json.dumps(v) for k, v in CONFIG.items()}
    return plan_preflight("pf", from_pulumi_config(values), catalog(), preflight_facts(),
                          deploy_permissions().deploy_actions(), None, None)


def test_an_adopted_cluster_is_asked_only_who_runs_it(tmp_path: Path) -> None:
    config = stack_document("lab")
    account = Account()
    account.answer("sts", "get_caller_identity", {"UserId": "U", "Account": ACCOUNT,
                                                  "Arn": f"arn:aws:iam::{ACCOUNT}:user/alice"})
    findings = run(account, stack_plan(tmp_path, config, backend=None))
    assert [(f.severity, f.check) for f in findings] == [("ok", "identity"), ("ok", "secrets"),
                                                         ("warning", "backend")]


# --- the pure parts -----------------------------------------------------------------------------------------------

def test_the_principal_behind_a_caller() -> None:
    assert principal_of(CALLER) == (ACCOUNT, "role", "deployer")
    assert principal_of(ROLE) == (ACCOUNT, "role", "deployer")
    assert principal_of(f"arn:aws:iam::{ACCOUNT}:user/team/alice") == (ACCOUNT, "user", "alice")
    assert principal_of(f"arn:aws:iam::{ACCOUNT}:root") is None
    assert principal_of(f"arn:aws:sts::{ACCOUNT}:federated-user/bob") is None


@pytest.mark.parametrize(("instance_type", "code"), [("g6e.xlarge", "L-DB2E81BA"), ("g4dn.12xlarge", "L-DB2E81BA"),
                                                     ("p5.48xlarge", "L-417A185B"), ("p6-b200.48xlarge", "L-417A185B"),
                                                     ("m7i.xlarge", "L-1216C47A"), ("c7i.large", "L-1216C47A"),
                                                     ("inf2.xlarge", None)])
def test_the_quota_an_instance_type_draws_on(instance_type: str, code: str | None) -> None:
    found = preflight_facts().quota_class(instance_type)
    assert (found.on_demand.code if found else None) == code


def test_the_plan_of_a_stack(tmp_path: Path) -> None:
    plan = stack_plan(tmp_path)
    needs = {(n.quota.code, n.capacity): (n.at_least, n.at_max, n.pools) for n in plan.quotas}
    assert needs == {("L-1216C47A", "on-demand"): (8, 16, ("system",)),
                     ("L-DB2E81BA", "on-demand"): (8, 24, ("l4",)),
                     ("L-3819A6DF", "spot"): (4, 8, ("cheap",)),
                     ("L-417A185B", "on-demand"): (192, 192, ("big",))}
    assert [(a.parameter, a.pools) for a in plan.amis] == [(STANDARD_AMI, ("system",)),
                                                           (NVIDIA_AMI, ("l4", "cheap", "big"))]
    assert {p.name: p.zones for p in plan.pools}["big"] == ("us-east-1a",)
    assert plan.public_cidrs == (IPv4Network("198.18.0.0/24"),)
    assert IPv4Address(EGRESS) in plan.public_cidrs[0]


def test_secrets_provider_urls() -> None:
    from triarch.preflight.plan import secrets_key

    key = secrets_key("awskms:///arn:aws:kms:eu-west-1:111122223333:key/1234abcd")
    assert not isinstance(key, str) and key is not None
    assert (key.key_id, key.region) == ("arn:aws:kms:eu-west-1:111122223333:key/1234abcd", "eu-west-1")
    alias = secrets_key("awskms://alias/pulumi?region=us-west-2")
    assert not isinstance(alias, str) and alias is not None
    assert (alias.key_id, alias.region) == ("alias/pulumi", "us-west-2")
    assert secrets_key("passphrase") == "passphrase"


# --- the command --------------------------------------------------------------------------------------------------

def test_the_command_exits_1_on_a_blocker_and_0_without(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = write_stack_file(tmp_path / "Pulumi.pf.yaml", CONFIG)
    monkeypatch.setattr(aws, "checkip", lambda url: lambda: EGRESS)
    monkeypatch.setenv("PULUMI_BACKEND_URL", "s3://pf-state")
    for denied, code in (((), 0), (("ec2:CreateVpc",), 1)):
        account = Account()
        queue(account, denied=denied)
        monkeypatch.setattr(aws, "boto3_clients", account)
        assert main(["preflight", "--stack-file", str(path)]) == code
        out = capsys.readouterr().out
        assert out.splitlines()[-1] == ("stack pf: no blocker found" if code == 0 else
                                        "stack pf: 1 blocker(s): fix them before `pulumi up`")
        account.done()


def test_a_bad_stack_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = json.loads(json.dumps(CONFIG))
    config["triarch:nodeGroups"][0]["instanceType"] = "g6.huge"
    path = write_stack_file(tmp_path / "Pulumi.pf.yaml", config)
    assert main(["preflight", "--stack-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("error: triarch:nodeGroups[0].instanceType: 'g6.huge'")


# --- the permissions and the policy Triarch ships -----------------------------------------------------------------

@pytest.fixture(scope="module")
def created_plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """The AWS resource types of every shipped stack that creates a cluster, planned through the whole program."""
    created = {n: stack_document(n) for n in STACK_NAMES if stack_document(n).get("triarch:cluster", {}).get("create")}
    # and what only a key the shipped stacks leave empty creates: a private endpoint's way in
    created["dev-private"] = stack_document("dev")
    created["dev-private"]["triarch:cluster"]["privateAccessCidrs"] = ["10.200.0.0/16"]
    return {n: {r.type for r in plan_config(n.split("-")[0], config, tmp_path_factory.mktemp(n)).resources
                if r.type.startswith("aws:")} for n, config in created.items()}


def test_every_aws_resource_type_the_program_creates_has_its_permissions(created_plans: dict[str, set[str]]) -> None:
    assert len(created_plans) >= 2, created_plans  # dev, prod, large at the time of writing
    missing = {n: sorted(t - set(deploy_permissions().resources)) for n, t in created_plans.items()}
    assert all(not m for m in missing.values()), (
        f"add these resource types to templates/compat/deploy-permissions.yaml with the actions and source: {missing}")
    assert {"aws:eks/cluster:Cluster", "aws:iam/role:Role", "aws:ec2/vpc:Vpc"} <= set().union(*created_plans.values())


def test_the_shipped_policy_is_generated_from_the_permissions() -> None:
    assert POLICY_FILE == ROOT / "docs" / "iam-policy.json"
    assert POLICY_FILE.read_text(encoding="utf-8") == policy_text(deploy_permissions()), (
        "docs/iam-policy.json is stale: regenerate it with `uv run triarch preflight --policy docs/iam-policy.json`")


def test_the_policy_grants_every_action_and_fits_a_managed_policy() -> None:
    document = json.loads(POLICY_FILE.read_text(encoding="utf-8"))
    granted = {a for s in document["Statement"] if s["Effect"] == "Allow" and s["Resource"] == "*"
               for a in s["Action"]}
    permissions = deploy_permissions()
    assert granted == set(permissions.deploy_actions()) | set(permissions.preflight)
    assert {"ec2:DescribeInstanceTypeOfferings", "iam:SimulatePrincipalPolicy", "ssm:GetParameters",
            "servicequotas:GetServiceQuota", "s3:ListBucket"} <= granted
    # IAM: a managed policy holds at most 6,144 characters, whitespace not counted
    # (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_iam-quotas.html).
    assert len(re.sub(r"\s", "", POLICY_FILE.read_text(encoding="utf-8"))) <= 6144


def test_a_permissions_file_with_a_bad_action_is_refused(tmp_path: Path) -> None:
    raw = yaml.safe_load((ROOT / "templates" / "compat" / "deploy-permissions.yaml").read_text(encoding="utf-8"))
    raw["resources"]["aws:ec2/vpc:Vpc"]["create"].append("ec2:Create*")
    bad = tmp_path / "deploy-permissions.yaml"
    bad.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ValueError, match=r"aws:ec2/vpc:Vpc\.create"):
        load_permissions(bad)
    raw["resources"]["aws:ec2/vpc:Vpc"]["create"].pop()
    raw["resources"]["aws:ec2/vpc:Vpc"]["source"] = " "
    bad.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ValueError, match="no source"):
        load_permissions(bad)


# --- the deploy workflow ------------------------------------------------------------------------------------------

def test_the_deploy_runs_preflight_with_the_deploying_role_before_pulumi_up() -> None:
    path = ROOT / ".github" / "actions" / "pulumi" / "action.yml"
    if not path.is_file():  # bench/mutants.py's copy of the project carries no .github
        pytest.skip("no .github in this copy of the project")
    action = yaml.safe_load(path.read_text(encoding="utf-8"))
    steps = action["runs"]["steps"]
    uses = [str(s.get("uses", "")).split("@")[0] for s in steps]
    [at] = [i for i, s in enumerate(steps) if "triarch preflight" in s.get("run", "")]
    assert uses.index("aws-actions/configure-aws-credentials") < at < uses.index("pulumi/actions")
    step = steps[at]
    assert step["if"] == "inputs.command == 'up'"
    assert step["env"]["PULUMI_BACKEND_URL"] == "${{ inputs.backend-url }}"
    argv = step["run"].split("triarch ", 1)[1].replace('"$STACK"', "dev").split()
    from triarch.cli import build_parser

    assert build_parser().parse_args(argv).stack == "dev"
