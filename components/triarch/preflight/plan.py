"""What `triarch preflight` checks, decided from the validated stack alone (no account is asked here): the pools'
instance types in their zones and the vCPUs they can hold at their max, each pool's pinned AMI release, the
administrators, the API endpoint's public ranges, the secrets provider's key and the state backend. Findings are
one line each, with the fix; a blocker makes the command exit 1."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from triarch.catalog import Catalog
from triarch.config import StackConfig, admin_key, pool_provisioner
from triarch.datafiles import read_yaml
from triarch.paths import COMPAT_DIR

PREFLIGHT_FILE = COMPAT_DIR / "preflight.yaml"
SYSTEM_POOL = "system"
SYSTEM_AMI_TYPE = "AL2023_x86_64_STANDARD"
"""The system nodes' AMI type (triarch.components.cluster.SYSTEM_AMI_TYPE, which imports Pulumi)."""
Severity = Literal["blocker", "warning", "ok"]
Capacity = Literal["on-demand", "spot"]


@dataclass(frozen=True)
class Finding:
    """One thing preflight found: what, and where it is not ok, how to fix it."""

    severity: Severity
    check: str
    message: str
    fix: str | None = None

    def line(self) -> str:
        return f"{self.severity:<7} {self.check}: {self.message}" + (f"; fix: {self.fix}" if self.fix else "")


def exit_code(findings: list[Finding]) -> int:
    return 1 if any(f.severity == "blocker" for f in findings) else 0


# --- facts (templates/compat/preflight.yaml) -----------------------------------------------------------------------

@dataclass(frozen=True)
class Quota:
    code: str
    name: str


@dataclass(frozen=True)
class QuotaClass:
    key: str
    families: tuple[str, ...]
    on_demand: Quota
    spot: Quota


@dataclass(frozen=True)
class PreflightFacts:
    service_code: str
    classes: tuple[QuotaClass, ...]
    ami_path: str
    ami_types: dict[str, dict[str, str]]
    egress_url: str

    def quota_class(self, instance_type: str) -> QuotaClass | None:
        """The quota class of an instance type's family: the letters its name starts with (g6e -> g)."""
        match = re.match(r"[a-z]+", instance_type)
        family = match.group(0) if match else ""
        return next((c for c in self.classes if family in c.families), None)

    def ami_parameter(self, ami_type: str, kubernetes: str, release: str) -> str:
        names = self.ami_types[ami_type]
        return self.ami_path.format(kubernetes=kubernetes, release=release, amiPath=names["amiPath"],
                                    amiName=names["amiName"])


def load_facts(path: Path = PREFLIGHT_FILE) -> PreflightFacts:
    raw = read_yaml(path)
    quotas = raw["quotas"]
    classes = tuple(QuotaClass(key, tuple(c["families"]), Quota(c["onDemand"]["code"], c["onDemand"]["name"]),
                               Quota(c["spot"]["code"], c["spot"]["name"]))
                    for key, c in quotas["classes"].items())
    return PreflightFacts(quotas["serviceCode"], classes, raw["amiParameters"]["path"],
                          {k: dict(v) for k, v in raw["amiParameters"]["amiTypes"].items()},
                          raw["egressAddress"]["url"])


@cache
def preflight_facts() -> PreflightFacts:
    return load_facts()


# --- the plan ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pool:
    """A group of nodes the stack can launch: a GPU pool or the system node group."""

    name: str
    instance_type: str
    vcpus: int
    zones: tuple[str, ...]
    min: int
    max: int
    capacity: Capacity
    managed: bool
    """An EKS managed node group (its min nodes launch during `pulumi up`); else a Karpenter pool."""
    ami_type: str
    ami_release: str


@dataclass(frozen=True)
class QuotaNeed:
    """The vCPUs one quota must hold: what `pulumi up` itself launches, or one node of its largest type (the
    least that lets the pools run at all), and what its pools hold at their max."""

    quota: Quota
    capacity: Capacity
    at_least: int
    at_max: int
    pools: tuple[str, ...]


@dataclass(frozen=True)
class AmiCheck:
    parameter: str
    release: str
    ami_type: str
    pools: tuple[str, ...]


@dataclass(frozen=True)
class StateBackend:
    url: str | None
    bucket: str | None
    """The bucket of an s3:// backend (the one kind preflight can reach with AWS credentials)."""
    region: str | None


@dataclass(frozen=True)
class SecretsKey:
    """The KMS key of an awskms:// secrets provider."""

    provider: str
    key_id: str
    region: str | None


@dataclass(frozen=True)
class PreflightPlan:
    stack: str
    region: str | None
    create: bool
    kubernetes: str
    pools: tuple[Pool, ...]
    unquoted: tuple[Pool, ...]
    """Pools whose family no quota of preflight.yaml covers (said, not checked)."""
    quotas: tuple[QuotaNeed, ...]
    amis: tuple[AmiCheck, ...]
    admins: tuple[str, ...]
    public_cidrs: tuple[IPv4Network, ...]
    private_cidrs: tuple[IPv4Network, ...]
    actions: tuple[str, ...]
    secrets: SecretsKey | str | None
    """The awskms:// key, another provider's URL (not checked), or None (Pulumi's passphrase default)."""
    backend: StateBackend


def pools_of(stack: StackConfig, facts: Catalog) -> tuple[Pool, ...]:
    """The system node group and every GPU pool of a created cluster, as EC2 sees them."""
    cluster = stack.cluster
    if not cluster.create:
        return ()
    system = cluster.system_node_group
    pools = [Pool(SYSTEM_POOL, system.instance_type, facts.instances[system.instance_type].vcpus,
                  tuple(cluster.zones), system.min, system.max, "on-demand", True, SYSTEM_AMI_TYPE,
                  system.ami_release or "")]
    for group in stack.node_groups:
        assert group.instance_type is not None
        pools.append(Pool(group.name, group.instance_type, facts.instances[group.instance_type].vcpus,
                          tuple(group.zones or cluster.zones), group.min, group.max,
                          "spot" if group.capacity_type == "SPOT" else "on-demand",
                          pool_provisioner(cluster, group) == "managedNodeGroup", group.ami_type,
                          group.ami_release or ""))
    return tuple(pools)


def quota_needs(pools: tuple[Pool, ...], facts: PreflightFacts) -> tuple[QuotaNeed, ...]:
    needs: dict[tuple[str, Capacity], list[Pool]] = {}
    for pool in pools:
        found = facts.quota_class(pool.instance_type)
        if found is not None:
            needs.setdefault((found.key, pool.capacity), []).append(pool)
    classes = {c.key: c for c in facts.classes}
    result = []
    for (key, capacity), members in needs.items():
        quota = classes[key].on_demand if capacity == "on-demand" else classes[key].spot
        launched = sum(p.min * p.vcpus for p in members if p.managed)
        result.append(QuotaNeed(quota, capacity, max(launched, max(p.vcpus for p in members)),
                                sum(p.max * p.vcpus for p in members), tuple(p.name for p in members)))
    return tuple(result)


def ami_checks(stack: StackConfig, pools: tuple[Pool, ...], facts: PreflightFacts) -> tuple[AmiCheck, ...]:
    """One SSM parameter per (AMI type, release): the image of that release for the cluster's Kubernetes minor."""
    kubernetes = stack.cluster.kubernetes_version
    found: dict[str, AmiCheck] = {}
    for pool in pools:
        name = facts.ami_parameter(pool.ami_type, kubernetes, pool.ami_release)
        before = found.get(name)
        found[name] = AmiCheck(name, pool.ami_release, pool.ami_type,
                               (*before.pools, pool.name) if before else (pool.name,))
    return tuple(found.values())


def secrets_key(provider: str | None) -> SecretsKey | str | None:
    """awskms://alias/name?region=r, awskms://<key id>?region=r or awskms:///arn:aws:kms:...: Pulumi's forms."""
    if not provider or not provider.startswith("awskms://"):
        return provider
    parts = urlsplit(provider)
    key = (parts.netloc + parts.path).lstrip("/")
    region: str | None = (parse_qs(parts.query).get("region") or [""])[0] or None
    if region is None and key.startswith("arn:"):
        region = key.split(":")[3] or None
    return SecretsKey(provider, key, region)


def state_backend(url: str | None) -> StateBackend:
    if not url or not url.startswith("s3://"):
        return StateBackend(url or None, None, None)
    parts = urlsplit(url)
    return StateBackend(url, parts.netloc, (parse_qs(parts.query).get("region") or [""])[0] or None)


def backend_url(environ: dict[str, str], project: dict[str, Any] | None) -> str | None:
    """Where `pulumi up` keeps state: PULUMI_BACKEND_URL, else Pulumi.yaml's backend.url."""
    if environ.get("PULUMI_BACKEND_URL"):
        return environ["PULUMI_BACKEND_URL"]
    backend = (project or {}).get("backend") or {}
    return str(backend["url"]) if isinstance(backend, dict) and backend.get("url") else None


def plan_preflight(name: str, stack: StackConfig, catalog: Catalog, facts: PreflightFacts, actions: tuple[str, ...],
                   secrets_provider: str | None, backend: str | None) -> PreflightPlan:
    cluster = stack.cluster
    pools = pools_of(stack, catalog)
    return PreflightPlan(
        stack=name, region=stack.aws_region, create=cluster.create, kubernetes=cluster.kubernetes_version,
        pools=pools,
        unquoted=tuple(p for p in pools if facts.quota_class(p.instance_type) is None),
        quotas=quota_needs(pools, facts), amis=ami_checks(stack, pools, facts) if cluster.create else (),
        admins=tuple(cluster.admin_role_arns) if cluster.create else (),
        public_cidrs=tuple(cluster.endpoint_public_access_cidrs or ()) if cluster.create else (),
        private_cidrs=tuple(cluster.private_access_cidrs) if cluster.create else (),
        actions=actions if cluster.create else (), secrets=secrets_key(secrets_provider),
        backend=state_backend(backend))


# --- judging what the account answered (pure) ----------------------------------------------------------------------

def principal_of(arn: str) -> tuple[str, str, str] | None:
    """(account, kind, name) of the IAM role or user behind a caller ARN: an assumed role's session is its role
    (arn:aws:sts::1:assumed-role/NAME/SESSION -> role NAME); None for the root user or a federated user, which
    IAM cannot simulate."""
    parts = arn.split(":", 5)
    if len(parts) != 6:
        return None
    account, resource = parts[4], parts[5]
    if parts[2] == "sts" and resource.startswith("assumed-role/"):
        return account, "role", resource.split("/")[1]
    if parts[2] == "iam" and resource.startswith(("role/", "user/")):
        kind = resource.split("/", 1)[0]
        return account, kind, admin_key(resource)
    return None


def role_arn(arn: str, name: str) -> str:
    """The role ARN of an assumed-role session, where IAM would not say its path (GetRole denied)."""
    partition, account = arn.split(":")[1], arn.split(":")[4]
    return f"arn:{partition}:iam::{account}:role/{name}"


def admin_finding(caller: tuple[str, str, str], principal: str, admins: tuple[str, ...]) -> Finding:
    """The cluster's creator gets no access of its own (authentication mode API): `pulumi up` reaches the cluster
    only as one of adminRoleArns."""
    listed = {principal_of(a) for a in admins}
    if caller in listed:
        return Finding("ok", "admin", f"{principal} is among triarch:cluster.adminRoleArns")
    return Finding("blocker", "admin", f"{principal} (the caller) is not among triarch:cluster.adminRoleArns, so "
                   "`pulumi up` could create the cluster but not reach it", f"add {principal} to "
                   "triarch:cluster.adminRoleArns, or run preflight and `pulumi up` as one of them")


def quota_finding(need: QuotaNeed, value: float, region: str | None) -> Finding:
    where = f" in {region}" if region else ""
    what = (f"{need.quota.name} ({need.quota.code}){where} is {value:g} vCPUs; pools {', '.join(need.pools)} "
            f"need {need.at_max} at their max")
    fix = (f"request {need.at_max} vCPUs: aws service-quotas request-service-quota-increase --service-code ec2 "
           f"--quota-code {need.quota.code} --desired-value {need.at_max}" + (f" --region {region}" if region
                                                                              else ""))
    if value < need.at_least:
        return Finding("blocker", "quota", f"{what} and {need.at_least} to launch any", fix)
    if value < need.at_max:
        return Finding("warning", "quota", f"{what}: they cannot all run at once", fix)
    return Finding("ok", "quota", what)


def offering_findings(pools: tuple[Pool, ...], offered: set[tuple[str, str]]) -> list[Finding]:
    """Each pool's instance type in each of its zones (a managed node group with a zone that lacks it fails to
    create; Karpenter launches in the others)."""
    findings = []
    for pool in pools:
        missing = [z for z in pool.zones if (pool.instance_type, z) not in offered]
        if not missing:
            findings.append(Finding("ok", "offering", f"{pool.instance_type} ({pool.name}) is offered in "
                                    f"{', '.join(pool.zones)}"))
            continue
        where = "triarch:cluster.zones" if pool.name == SYSTEM_POOL else f"the pool {pool.name}'s zones"
        severity: Severity = "blocker" if pool.managed or len(missing) == len(pool.zones) else "warning"
        findings.append(Finding(severity, "offering", f"{pool.instance_type} ({pool.name}) is not offered in "
                                f"{', '.join(missing)}", f"drop {', '.join(missing)} from {where}, or pick an "
                                "instance type offered there (aws ec2 describe-instance-type-offerings "
                                "--location-type availability-zone)"))
    return findings


def ami_finding(check: AmiCheck, image: str | None, kubernetes: str, region: str | None) -> Finding:
    pools = ", ".join(check.pools)
    if image:
        return Finding("ok", "ami", f"{check.ami_type} release {check.release} for Kubernetes {kubernetes} is "
                       f"published{f' in {region}' if region else ''} ({image}; {pools})")
    key = "triarch:cluster.systemNodeGroup.amiRelease" if check.pools == (SYSTEM_POOL,) else "amiRelease"
    return Finding("blocker", "ami", f"{check.ami_type} release {check.release} for Kubernetes {kubernetes} is not "
                   f"published{f' in {region}' if region else ''} (no {check.parameter}; {pools})",
                   f"set {key} to a release of templates/compat/amis.yaml published there")


def endpoint_finding(public: tuple[IPv4Network, ...], private: tuple[IPv4Network, ...],
                     egress: IPv4Address | None, error: str | None = None) -> Finding:
    """`pulumi up` reaches the API server it creates through the public endpoint's ranges, or from inside."""
    if not public:
        if private:
            return Finding("ok", "endpoint", "the API endpoint is private: `pulumi up` must run from "
                           f"{', '.join(map(str, private))} (triarch:cluster.privateAccessCidrs)")
        return Finding("blocker", "endpoint", "the API endpoint is private and no privateAccessCidrs names a way "
                       "in: `pulumi up` would create the cluster, then fail to reach it",
                       "set triarch:cluster.endpointPublicAccessCidrs to your egress address as /32, or "
                       "privateAccessCidrs to your VPN's or peered VPC's range")
    if egress is None:
        return Finding("warning", "endpoint", f"could not read this machine's egress address ({error})",
                       "compare `curl -s https://checkip.amazonaws.com` with "
                       "triarch:cluster.endpointPublicAccessCidrs")
    if any(egress in cidr for cidr in public):
        return Finding("ok", "endpoint", f"the egress address {egress} is in endpointPublicAccessCidrs")
    return Finding("blocker", "endpoint", f"the egress address {egress} is in none of endpointPublicAccessCidrs "
                   f"({', '.join(map(str, public))}), so `pulumi up` could not reach the API server it creates",
                   f"add {egress}/32 to triarch:cluster.endpointPublicAccessCidrs")


def denied_finding(principal: str, denied: list[str]) -> Finding:
    if not denied:
        return Finding("ok", "permissions", f"{principal} is allowed every action `pulumi up` needs")
    return Finding("blocker", "permissions", f"{principal} is denied {len(denied)} action(s) `pulumi up` needs: "
                   + ", ".join(denied), "attach docs/iam-policy.json (or grant those actions) to the principal")

