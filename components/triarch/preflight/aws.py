"""Asking the account what `triarch preflight` planned to check: boto3's read calls only (Get, Describe, List,
Simulate, Head), each answer judged by triarch.preflight.plan. A check the caller may not run, or AWS does not
answer, is a warning line naming what to grant; missing credentials end the run with one blocker line."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from ipaddress import IPv4Address
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError

from triarch.preflight.plan import (
    Finding,
    PreflightPlan,
    admin_finding,
    ami_finding,
    denied_finding,
    endpoint_finding,
    offering_findings,
    principal_of,
    quota_finding,
    role_arn,
)

Clients = Callable[[str, str | None], Any]
"""(service, region) -> a boto3 client; tests hand in clients under botocore's Stubber."""
Egress = Callable[[], str]
"""This machine's public address, as checkip.amazonaws.com says it."""
DENIED_CODES = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnauthorizedAccess"}
SSM_BATCH = 10
"""GetParameters takes at most 10 names a call (the SSM API reference, GetParameters: Names, maximum 10 items)."""
SIMULATE_BATCH = 100
"""Actions per SimulatePrincipalPolicy call, to keep each answer short (the API pages it: Marker, IsTruncated)."""


def boto3_clients(service: str, region: str | None) -> Any:
    import boto3

    return boto3.session.Session().client(service, region_name=region)


def checkip(url: str, timeout: float = 5.0) -> Egress:
    def fetch() -> str:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # a fixed https URL (preflight.yaml)
            return str(response.read().decode("ascii").strip())

    return fetch


class Unchecked(Exception):
    """A check AWS did not answer; its finding says why."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.line())
        self.finding = finding


@contextmanager
def answered(check: str, action: str) -> Iterator[None]:
    """A call's failure as one warning line: denied (grant `action`), or any other AWS or network error."""
    try:
        yield
    except NoCredentialsError:
        raise
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "")
        if code in DENIED_CODES:
            raise Unchecked(Finding("warning", check, f"not checked: the caller may not call {action} ({code})",
                                    f"grant {action} (docs/iam-policy.json's Preflight statement)")) from None
        message = error.response.get("Error", {}).get("Message", "")
        raise Unchecked(Finding("warning", check, f"not checked: {action} failed ({code}: {message})")) from None
    except BotoCoreError as error:
        raise Unchecked(Finding("warning", check, f"not checked: {action} failed ({error})")) from None


def run_preflight(plan: PreflightPlan, clients: Clients, egress: Egress) -> list[Finding]:
    """Every finding of the plan, in order: identity first (without it nothing else is asked)."""
    try:
        return list(_run(plan, clients, egress))
    except NoCredentialsError:
        return [Finding("blocker", "identity", "no AWS credentials found (environment, profile, SSO or instance "
                        "role)", "export AWS_PROFILE, run `aws sso login`, or set AWS_ACCESS_KEY_ID and "
                        "AWS_SECRET_ACCESS_KEY, as `pulumi up` would run")]
    except NoRegionError:
        return [Finding("blocker", "identity", "no AWS region: the stack names none (aws:region) and the "
                        "environment neither", "set aws:region in the stack, or AWS_REGION")]


def _run(plan: PreflightPlan, clients: Clients, egress: Egress) -> Iterator[Finding]:
    region = plan.region
    try:
        with answered("identity", "sts:GetCallerIdentity"):
            caller = clients("sts", region).get_caller_identity()["Arn"]
    except Unchecked as unchecked:
        yield Finding("blocker", "identity", unchecked.finding.message.replace("not checked: ", ""),
                      "check the credentials `pulumi up` runs with (aws sts get-caller-identity)")
        return
    yield Finding("ok", "identity", f"running as {caller}")
    principal = principal_of(caller)
    resolved = _principal_arn(caller, principal, clients, region)
    if plan.create:
        if principal is None:
            yield Finding("warning", "admin", f"{caller} is not an IAM role or user, so it cannot be among "
                          "triarch:cluster.adminRoleArns", "run `pulumi up` as one of adminRoleArns")
        else:
            yield admin_finding(principal, resolved or caller, plan.admins)
    yield from _checked(lambda: _quotas(plan, clients))
    yield from _checked(lambda: _offerings(plan, clients))
    yield from _checked(lambda: _amis(plan, clients))
    if plan.create:
        yield _endpoint(plan, egress)
    yield from _checked(lambda: _secrets(plan, clients))
    yield from _checked(lambda: _backend(plan, clients))
    if plan.actions:
        if resolved is None:
            yield Finding("warning", "permissions", f"{caller} cannot be simulated (IAM simulates roles and users "
                          "only)", "run preflight as the role or user `pulumi up` runs as")
        else:
            yield from _checked(lambda: [_simulate(resolved, plan.actions, clients, region)])


def _checked(check: Callable[[], list[Finding]]) -> list[Finding]:
    try:
        return check()
    except Unchecked as unchecked:
        return [unchecked.finding]


def _principal_arn(caller: str, principal: tuple[str, str, str] | None, clients: Clients,
                   region: str | None) -> str | None:
    """The IAM ARN to simulate: the caller's own for a user; for an assumed role, its role's (GetRole gives its
    path, which the session ARN leaves out)."""
    if principal is None:
        return None
    if principal[1] == "user":
        return caller
    try:
        with answered("permissions", "iam:GetRole"):
            return str(clients("iam", region).get_role(RoleName=principal[2])["Role"]["Arn"])
    except Unchecked:
        return role_arn(caller, principal[2])


def _quotas(plan: PreflightPlan, clients: Clients) -> list[Finding]:
    findings = [Finding("warning", "quota", f"no quota of templates/compat/preflight.yaml covers {p.instance_type} "
                        f"({p.name}): not checked", "compare its vCPUs with the account's EC2 quotas")
                for p in plan.unquoted]
    if not plan.quotas:
        return findings
    client = clients("service-quotas", plan.region)
    for need in plan.quotas:
        try:
            with answered("quota", "servicequotas:GetServiceQuota"):
                try:
                    value = client.get_service_quota(ServiceCode="ec2", QuotaCode=need.quota.code)["Quota"]["Value"]
                except client.exceptions.NoSuchResourceException:  # never changed here: AWS's default applies
                    value = client.get_aws_default_service_quota(ServiceCode="ec2",
                                                                 QuotaCode=need.quota.code)["Quota"]["Value"]
        except Unchecked as unchecked:
            findings.append(unchecked.finding)
            continue
        findings.append(quota_finding(need, float(value), plan.region))
    return findings


def _offerings(plan: PreflightPlan, clients: Clients) -> list[Finding]:
    if not plan.pools:
        return []
    types = sorted({p.instance_type for p in plan.pools})
    zones = sorted({z for p in plan.pools for z in p.zones})
    offered: set[tuple[str, str]] = set()
    with answered("offering", "ec2:DescribeInstanceTypeOfferings"):
        pages = clients("ec2", plan.region).get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": types}, {"Name": "location", "Values": zones}])
        for page in pages:
            offered |= {(o["InstanceType"], o["Location"]) for o in page["InstanceTypeOfferings"]}
    return offering_findings(plan.pools, offered)


def _amis(plan: PreflightPlan, clients: Clients) -> list[Finding]:
    if not plan.amis:
        return []
    images: dict[str, str] = {}
    client = clients("ssm", plan.region)
    names = [check.parameter for check in plan.amis]
    with answered("ami", "ssm:GetParameters"):
        for start in range(0, len(names), SSM_BATCH):
            answer = client.get_parameters(Names=names[start:start + SSM_BATCH])
            images |= {p["Name"]: p["Value"] for p in answer["Parameters"]}
    return [ami_finding(check, images.get(check.parameter), plan.kubernetes, plan.region) for check in plan.amis]


def _endpoint(plan: PreflightPlan, egress: Egress) -> Finding:
    if not plan.public_cidrs:
        return endpoint_finding(plan.public_cidrs, plan.private_cidrs, None)
    try:
        address = IPv4Address(egress().strip())
    except (OSError, ValueError) as error:
        return endpoint_finding(plan.public_cidrs, plan.private_cidrs, None, str(error))
    return endpoint_finding(plan.public_cidrs, plan.private_cidrs, address)


def _secrets(plan: PreflightPlan, clients: Clients) -> list[Finding]:
    secrets = plan.secrets
    if secrets is None:
        return [Finding("ok", "secrets", "the stack names no secretsprovider (Pulumi's passphrase provider): "
                        "nothing to check in AWS")]
    if isinstance(secrets, str):
        return [Finding("ok", "secrets", f"secrets provider {secrets.split('?')[0]}: not an AWS KMS key, not "
                        "checked")]
    with answered("secrets", "kms:DescribeKey"):
        try:
            key = clients("kms", secrets.region or plan.region).describe_key(KeyId=secrets.key_id)["KeyMetadata"]
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != "NotFoundException":
                raise
            return [Finding("blocker", "secrets", f"the secrets provider's key {secrets.key_id} does not exist"
                            f"{f' in {secrets.region}' if secrets.region else ''}", "fix the stack's "
                            "secretsprovider (awskms://alias/<name>?region=<region>), or create the key")]
    if key.get("KeyState") != "Enabled":
        return [Finding("blocker", "secrets", f"the secrets provider's key {secrets.key_id} is "
                        f"{key.get('KeyState')}, so Pulumi cannot decrypt the stack's secrets",
                        "enable the key (aws kms enable-key / cancel-key-deletion)")]
    return [Finding("ok", "secrets", f"the secrets provider's key {secrets.key_id} is enabled")]


def _backend(plan: PreflightPlan, clients: Clients) -> list[Finding]:
    backend = plan.backend
    if backend.url is None:
        return [Finding("warning", "backend", "no state backend named (PULUMI_BACKEND_URL, Pulumi.yaml backend.url): "
                        "`pulumi up` uses whatever `pulumi login` chose", "export PULUMI_BACKEND_URL=s3://<bucket>")]
    if backend.bucket is None:
        return [Finding("ok", "backend", f"state backend {backend.url.split('?')[0]}: not an s3:// bucket, not "
                        "checked")]
    with answered("backend", "s3:ListBucket"):
        try:
            clients("s3", backend.region or plan.region).head_bucket(Bucket=backend.bucket)
        except ClientError as error:
            code = str(error.response.get("Error", {}).get("Code", ""))
            if code in ("404", "NoSuchBucket"):
                return [Finding("blocker", "backend", f"the state bucket {backend.bucket} does not exist",
                                f"create it (aws s3 mb s3://{backend.bucket}) or fix PULUMI_BACKEND_URL")]
            if code in ("403", "AccessDenied"):
                return [Finding("blocker", "backend", f"the state bucket {backend.bucket} refuses the caller (403)",
                                "grant s3:ListBucket, s3:GetObject, s3:PutObject and s3:DeleteObject on it")]
            raise
    return [Finding("ok", "backend", f"the state bucket {backend.bucket} is reachable")]


def _simulate(principal: str, actions: tuple[str, ...], clients: Clients, region: str | None) -> Finding:
    client = clients("iam", region)
    denied: list[str] = []
    with answered("permissions", "iam:SimulatePrincipalPolicy"):
        for start in range(0, len(actions), SIMULATE_BATCH):
            request: dict[str, Any] = {"PolicySourceArn": principal,
                                       "ActionNames": list(actions[start:start + SIMULATE_BATCH])}
            while True:
                answer = client.simulate_principal_policy(**request)
                denied += [r["EvalActionName"] for r in answer["EvaluationResults"] if r["EvalDecision"] != "allowed"]
                if not answer.get("IsTruncated"):
                    break
                request["Marker"] = answer["Marker"]
    return denied_finding(principal, sorted(set(denied)))
