"""Triarch's Pulumi components under Pulumi's mock engine.

Resource registration is asynchronous: a test that builds a component and then looks at it checks nothing.
Every test here goes through `triarch.offline.run_program`, which runs the program to completion (all
register-resource RPCs awaited), and then asserts on the inputs the mock monitor recorded.

Expected values are derived from the stack files and from templates/compat (through triarch.catalog), not from
the planners' own output.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from ipaddress import IPv4Network, ip_network
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pytest
import yaml
from pulumi.runtime.mocks import MockMonitor

from triarch import scheduling
from triarch.addressing import plan_subnets
from triarch.catalog import Catalog, charts, load_catalog
from triarch.components.device_plugin import DevicePlugin
from triarch.components.nodegroups import NodeRole
from triarch.offline import KNOWN_AFTER_APPLY, PlanRun, Registered, read_stack_config, run_program

ROOT = Path(__file__).resolve().parents[1]
STACKS = ("local", "dev", "prod")
EKS_STACKS = ("dev", "prod")

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
ASG_TAG = "aws:autoscaling/tag:Tag"
POLICY_ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
K8S_PROVIDER = "pulumi:providers:kubernetes"
RELEASE = "kubernetes:helm.sh/v3:Release"
NODE_PATCH = "kubernetes:core/v1:NodePatch"
NODE_POOL = "kubernetes:karpenter.sh/v1:NodePool"
NODE_CLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
INSTANCE_PROFILE = "aws:iam/instanceProfile:InstanceProfile"

NODE_POLICY_ARNS = {
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly",
}
VPC_CNI_POLICY_ARN = "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy"
CLUSTER_POLICY_ARN = "arn:aws:iam::aws:policy/AmazonEKSClusterPolicy"
EFS_CSI_POLICY_ARN = "arn:aws:iam::aws:policy/service-role/AmazonEFSCSIDriverPolicy"
EBS_CSI_POLICY_ARN = "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"
BROAD_POLICIES = ("AdministratorAccess", "PowerUserAccess", "IAMFullAccess", "FullAccess")


# --- running programs -----------------------------------------------------------------------------------

@dataclass
class Planned:
    """A finished run plus, per URN, the provider reference the program registered the resource with.

    The provider is not part of `Registered`. Rather than subclass anything in the product, the Pulumi SDK's
    own MockMonitor.RegisterResource (which triarch's recording monitor calls through super()) is wrapped for
    the duration of one run and reads `request.provider`: exactly the reference the engine would receive, so
    an explicit provider (or its absence, "") is observed directly instead of inferred from the parent chain.
    """

    run: PlanRun
    provider_of: dict[str, str]

    @property
    def resources(self) -> list[Registered]:
        return self.run.resources


def plan(stack: str, config: dict[str, str], secret_keys: list[str] | None = None,
         program: Callable[[], object] | None = None) -> Planned:
    provider_of: dict[str, str] = {}
    original = MockMonitor.RegisterResource

    def recording(self: MockMonitor, request: Any) -> Any:
        response = original(self, request)
        provider_of[response.urn] = request.provider
        return response

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MockMonitor, "RegisterResource", recording)
        run = run_program(stack, config, secret_keys or [], program=program)
    return Planned(run, provider_of)


def stack_yaml(name: str) -> dict[str, Any]:
    """The `config:` mapping of stacks/Pulumi.<name>.yaml as plain YAML (a fresh copy)."""
    document = yaml.safe_load((ROOT / "stacks" / f"Pulumi.{name}.yaml").read_text(encoding="utf-8"))
    return copy.deepcopy(document["config"])


def pulumi_config(config: dict[str, Any], tmp: Path) -> tuple[dict[str, str], list[str]]:
    """A YAML config mapping as the engine hands it to the program (through the product's own reader)."""
    path = tmp / "Pulumi.variant.yaml"
    path.write_text(yaml.safe_dump({"config": config}, sort_keys=False), encoding="utf-8")
    return read_stack_config(path)


@pytest.fixture(scope="module")
def facts() -> Catalog:
    """templates/compat read afresh (not the product's cached catalog)."""
    return load_catalog(ROOT / "templates" / "compat")


def sliced_dev(config: dict[str, Any]) -> dict[str, Any]:
    """dev with its L4 group on a 4-GPU instance, time-sliced 4 ways: gpus x replicas = 16, not 4."""
    group = config["triarch:nodeGroups"][0]
    group["instanceType"] = "g6.12xlarge"
    group["timeSlicing"] = {"replicas": 4}
    return config


def sliced_local(config: dict[str, Any]) -> dict[str, Any]:
    """local with the GPU taint back on and time-slicing 2 ways (an 8 GB GPU holds two embedding servers)."""
    group = config["triarch:nodeGroups"][0]
    group["taint"] = True
    group["timeSlicing"] = {"replicas": 2}
    return config


def fixed_a100(config: dict[str, Any]) -> dict[str, Any]:
    """prod with its A100 pool as a fixed-size managed node group of two nodes; L4 stays with Karpenter."""
    group = next(g for g in config["triarch:nodeGroups"] if g["name"] == "a100")
    group.update(provisioner="managedNodeGroup", min=2, max=2)
    return config


VARIANTS: dict[str, tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "dev-sliced": ("dev", sliced_dev),
    "local-sliced": ("local", sliced_local),
    "prod-fixed": ("prod", fixed_a100),
}


@pytest.fixture(scope="module")
def configs() -> dict[str, dict[str, Any]]:
    """Stack name (shipped stacks and variants) -> YAML config mapping."""
    result = {name: stack_yaml(name) for name in STACKS}
    for variant, (base, mutate) in VARIANTS.items():
        result[variant] = mutate(stack_yaml(base))
    return result


@pytest.fixture(scope="module")
def planned(configs: dict[str, dict[str, Any]],
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, Planned]:
    """Every shipped stack and variant planned once per module (whole program, __main__.py)."""
    result = {}
    for name, config in configs.items():
        base = VARIANTS[name][0] if name in VARIANTS else name
        values, secrets = pulumi_config(config, tmp_path_factory.mktemp(name))
        result[name] = plan(base, values, secrets)
    return result


# --- looking at a run -----------------------------------------------------------------------------------

def of_type(run: Planned | PlanRun, type_: str) -> list[Registered]:
    resources = run.resources
    return [r for r in resources if r.type == type_]


def siblings(run: Planned, resource: Registered, type_: str) -> list[Registered]:
    """Resources of `type_` registered by the same component as `resource`."""
    return [r for r in run.resources if r.type == type_ and r.parent == resource.parent]


def gpu_node_groups(run: Planned) -> list[Registered]:
    return [r for r in of_type(run, NODE_GROUP) if "NVIDIA" in r.inputs.get("amiType", "")]


def node_group_of(run: Planned, group: str) -> Registered:
    found = [r for r in gpu_node_groups(run) if r.inputs["labels"].get(scheduling.POOL_LABEL) == group]
    assert len(found) == 1, f"expected one GPU node group with {scheduling.POOL_LABEL}={group}: {found}"
    return found[0]


def node_pool_of(run: Planned, group: str) -> dict[str, Any]:
    found = [r.inputs for r in of_type(run, NODE_POOL)
             if r.inputs["spec"]["template"]["metadata"]["labels"].get(scheduling.POOL_LABEL) == group]
    assert len(found) == 1, f"expected one NodePool with {scheduling.POOL_LABEL}={group}: {found}"
    return found[0]


def node_class_of(run: Planned, pool: dict[str, Any]) -> dict[str, Any]:
    name = pool["spec"]["template"]["spec"]["nodeClassRef"]["name"]
    [found] = [r.inputs for r in of_type(run, NODE_CLASS) if r.inputs["metadata"]["name"] == name]
    return found


def requirement(pool: dict[str, Any], key: str) -> list[str]:
    [found] = [q for q in pool["spec"]["template"]["spec"]["requirements"] if q["key"] == key]
    assert found["operator"] == "In"
    values: list[str] = found["values"]
    return values


def groups_of(config: dict[str, Any]) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = config["triarch:nodeGroups"]
    return groups


def group_spec(config: dict[str, Any], group: str) -> dict[str, Any]:
    """The stack file's entry for one node group."""
    return next(g for g in groups_of(config) if g["name"] == group)


def walk(value: Any) -> Iterator[Any]:
    yield value
    if isinstance(value, dict):
        for item in value.values():
            yield from walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from walk(item)


GPU_STACKS = ("dev", "prod", "dev-sliced", "prod-fixed")
KARPENTER_POOLS = [("dev", "l4"), ("prod", "l4"), ("prod", "a100"), ("dev-sliced", "l4"), ("prod-fixed", "l4")]
MANAGED_POOLS = [("prod-fixed", "a100")]


def test_pool_parametrisation_covers_every_group(configs: dict[str, dict[str, Any]]) -> None:
    every = [(stack, g["name"]) for stack in GPU_STACKS for g in groups_of(configs[stack])]
    assert sorted(KARPENTER_POOLS + MANAGED_POOLS) == sorted(every)
    fixed = [(stack, g["name"]) for stack, g in ((s, g) for s in GPU_STACKS for g in groups_of(configs[s]))
             if g.get("provisioner") == "managedNodeGroup"]
    assert fixed == MANAGED_POOLS


# --- GPU pools: what brings their nodes up ---------------------------------------------------------------

@pytest.mark.parametrize("stack", GPU_STACKS)
def test_every_gpu_pool_is_a_configured_group(planned: dict[str, Planned],
                                              configs: dict[str, dict[str, Any]], stack: str) -> None:
    """No GPU pool escapes the per-pool checks below: one NodePool or managed node group per configured group."""
    run = planned[stack]
    pools = [g.inputs.get("labels", {}).get(scheduling.POOL_LABEL, "<unlabelled>") for g in gpu_node_groups(run)]
    pools += [r.inputs["spec"]["template"]["metadata"]["labels"].get(scheduling.POOL_LABEL, "<unlabelled>")
              for r in of_type(run, NODE_POOL)]
    assert sorted(pools) == sorted(g["name"] for g in groups_of(configs[stack]))
    assert len(of_type(run, NODE_CLASS)) == len(of_type(run, NODE_POOL))


@pytest.mark.parametrize(("stack", "group"), KARPENTER_POOLS)
def test_node_pool_carries_the_pool_labels_taint_and_shape(
        planned: dict[str, Planned], configs: dict[str, dict[str, Any]], facts: Catalog,
        stack: str, group: str) -> None:
    spec = group_spec(configs[stack], group)
    pool = node_pool_of(planned[stack], group)
    template = pool["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert labels[scheduling.GPU_PRESENT_LABEL] == "true"
    assert labels[scheduling.POOL_LABEL] == group
    assert labels[scheduling.GPU_LABEL] == facts.instances[spec["instanceType"]].gpu
    assert template["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    assert requirement(pool, "node.kubernetes.io/instance-type") == [spec["instanceType"]]
    zones = spec.get("zones") or configs[stack]["triarch:cluster"]["zones"]
    assert requirement(pool, "topology.kubernetes.io/zone") == zones
    capacity = {"ON_DEMAND": "on-demand", "SPOT": "spot"}[spec.get("capacityType", "ON_DEMAND")]
    assert requirement(pool, "karpenter.sh/capacity-type") == [capacity]
    assert requirement(pool, "kubernetes.io/arch") == ["amd64"]


@pytest.mark.parametrize(("stack", "group"), KARPENTER_POOLS)
def test_node_pool_limits_come_from_max(planned: dict[str, Planned], configs: dict[str, dict[str, Any]],
                                        facts: Catalog, stack: str, group: str) -> None:
    spec = group_spec(configs[stack], group)
    instance = facts.instances[spec["instanceType"]]
    limits = node_pool_of(planned[stack], group)["spec"]["limits"]
    # Physical GPUs: Karpenter counts the instance type's GPUs, not the device plugin's time-sliced ones.
    assert limits["nvidia.com/gpu"] == str(spec["max"] * instance.gpus)
    assert limits["cpu"] == str(spec["max"] * instance.vcpus)


@pytest.mark.parametrize(("stack", "group"), KARPENTER_POOLS)
def test_node_pool_disrupts_only_empty_nodes_one_at_a_time(planned: dict[str, Planned], stack: str,
                                                           group: str) -> None:
    pool = node_pool_of(planned[stack], group)
    disruption = pool["spec"]["disruption"]
    assert disruption["consolidationPolicy"] == "WhenEmpty"
    assert re.fullmatch(r"[1-9]\d*m", disruption["consolidateAfter"]), disruption
    assert disruption["budgets"] == [{"nodes": "1"}]
    # Expiry in Karpenter v1 drains past budgets: nodes are rotated by an AMI bump (drift), not by age.
    assert pool["spec"]["template"]["spec"]["expireAfter"] == "Never"


@pytest.mark.parametrize(("stack", "group"), KARPENTER_POOLS)
def test_node_class_pins_the_ami_release_and_hardens_the_node(
        planned: dict[str, Planned], configs: dict[str, dict[str, Any]], stack: str, group: str) -> None:
    spec = group_spec(configs[stack], group)
    node_class = node_class_of(planned[stack], node_pool_of(planned[stack], group))["spec"]
    assert node_class["amiSelectorTerms"] == [{"alias": f"al2023@{spec['amiRelease']}"}]
    metadata = node_class["metadataOptions"]
    assert (metadata["httpTokens"], metadata["httpPutResponseHopLimit"]) == ("required", 1)
    [root] = node_class["blockDeviceMappings"]
    assert root["rootVolume"] is True
    assert root["ebs"] == {"volumeSize": f"{spec.get('diskGiB', 200)}Gi", "volumeType": "gp3", "encrypted": True,
                           "deleteOnTermination": True}
    cluster = configs[stack]["triarch:cluster"]["name"]
    assert node_class["subnetSelectorTerms"] == [{"tags": {"karpenter.sh/discovery": cluster}}]
    assert node_class["securityGroupSelectorTerms"] == [{"tags": {"aws:eks:cluster-name": cluster}}]
    [profile] = [r for r in of_type(planned[stack], INSTANCE_PROFILE)]
    assert node_class["instanceProfile"] == profile.inputs["name"]


@pytest.mark.parametrize("stack", ("dev", "prod"))
def test_karpenter_discovers_only_the_private_subnets(planned: dict[str, Planned],
                                                      configs: dict[str, dict[str, Any]], stack: str) -> None:
    cluster = configs[stack]["triarch:cluster"]["name"]
    subnets = of_type(planned[stack], "aws:ec2/subnet:Subnet")
    tagged = sorted(s.inputs["availabilityZone"] for s in subnets
                    if s.inputs["tags"].get("karpenter.sh/discovery") == cluster)
    assert tagged == sorted(configs[stack]["triarch:cluster"]["zones"])
    assert all("kubernetes.io/role/internal-elb" in s.inputs["tags"] for s in subnets
               if "karpenter.sh/discovery" in s.inputs["tags"])


@pytest.mark.parametrize("stack", ("dev", "prod"))
def test_the_private_subnets_reach_s3_through_a_gateway_endpoint(planned: dict[str, Planned],
                                                                  configs: dict[str, dict[str, Any]],
                                                                  stack: str) -> None:
    """One S3 gateway endpoint in the stack's region (com.amazonaws.<region>.s3, the VPC User Guide), on the route
    table of every private subnet (one per zone), so weights streamed from S3 and ECR's layers skip the NAT
    gateways' per-GB charge; named from the cluster, never from a list position."""
    [endpoint] = of_type(planned[stack], "aws:ec2/vpcEndpoint:VpcEndpoint")
    region = configs[stack]["aws:region"]
    assert endpoint.inputs["serviceName"] == f"com.amazonaws.{region}.s3"
    assert endpoint.inputs["vpcEndpointType"] == "Gateway"
    private = [r for r in of_type(planned[stack], "aws:ec2/routeTable:RouteTable")
               if any("natGatewayId" in route for route in r.inputs.get("routes", []))]
    assert len(private) == len(configs[stack]["triarch:cluster"]["zones"])
    assert len(endpoint.inputs["routeTableIds"]) == len(private)
    assert endpoint.name.endswith("-net-s3")


@pytest.mark.parametrize(("stack", "group"), MANAGED_POOLS)
def test_managed_node_group_carries_scheduling_labels_taint_and_fixed_size(
        planned: dict[str, Planned], configs: dict[str, dict[str, Any]], facts: Catalog,
        stack: str, group: str) -> None:
    spec = group_spec(configs[stack], group)
    inputs = node_group_of(planned[stack], group).inputs
    assert inputs["instanceTypes"] == [spec["instanceType"]]
    labels = inputs["labels"]
    assert labels[scheduling.GPU_PRESENT_LABEL] == "true"
    assert labels[scheduling.POOL_LABEL] == group
    assert labels[scheduling.GPU_LABEL] == facts.instances[spec["instanceType"]].gpu
    gpu_taints = [t for t in inputs["taints"] if t["key"] == scheduling.GPU_TAINT_KEY]
    assert gpu_taints == [{"key": "nvidia.com/gpu", "value": scheduling.GPU_TAINT_VALUE, "effect": "NO_SCHEDULE"}]
    scaling = inputs["scalingConfig"]
    assert scaling == {"minSize": spec["min"], "maxSize": spec["max"], "desiredSize": spec["min"]}
    assert spec["min"] == spec["max"]
    # Nothing autoscales a managed node group: no cluster-autoscaler tags pretend otherwise.
    assert of_type(planned[stack], ASG_TAG) == []


@pytest.mark.parametrize(("stack", "group"), MANAGED_POOLS)
def test_managed_node_group_pins_the_ami_release(
        planned: dict[str, Planned], configs: dict[str, dict[str, Any]], facts: Catalog,
        stack: str, group: str) -> None:
    spec = group_spec(configs[stack], group)
    kubernetes = configs[stack]["triarch:cluster"]["kubernetesVersion"]
    inputs = node_group_of(planned[stack], group).inputs
    release = inputs.get("releaseVersion")
    assert isinstance(release, str) and re.fullmatch(r"\d+\.\d+\.\d+-\d{8}", release), release
    assert release.startswith(kubernetes + ".")
    ami_type = spec.get("amiType", "AL2023_x86_64_NVIDIA")
    assert inputs["amiType"] == ami_type
    assert release == facts.amis[ami_type][spec["amiRelease"]].release_versions[kubernetes]


@pytest.mark.parametrize("stack", ("dev", "prod", "dev-sliced", "prod-fixed"))
def test_every_node_group_has_a_hardened_launch_template(planned: dict[str, Planned], stack: str) -> None:
    node_groups = of_type(planned[stack], NODE_GROUP)
    assert node_groups  # at least the system group
    for node_group in node_groups:
        templates = siblings(planned[stack], node_group, LAUNCH_TEMPLATE)
        assert len(templates) == 1, f"{node_group.name}: {len(templates)} launch templates"
        template = templates[0].inputs
        assert set(node_group.inputs["launchTemplate"]) == {"id", "version"}
        metadata = template["metadataOptions"]
        assert metadata["httpTokens"] == "required"
        assert metadata["httpPutResponseHopLimit"] == 1
        assert metadata.get("httpEndpoint", "enabled") == "enabled"
        roots = [m for m in template["blockDeviceMappings"] if m["deviceName"] == "/dev/xvda"]
        assert len(roots) == 1, template["blockDeviceMappings"]
        assert roots[0]["ebs"]["encrypted"] in ("true", True)
        # The AMI is chosen by amiType + releaseVersion on the node group, never hidden in the template.
        assert "imageId" not in template


@pytest.mark.parametrize("stack", ("dev", "prod"))
def test_system_nodes_follow_their_own_ami_release(planned: dict[str, Planned], configs: dict[str, dict[str, Any]],
                                                   facts: Catalog, stack: str) -> None:
    cluster = configs[stack]["triarch:cluster"]
    [system] = [r for r in of_type(planned[stack], NODE_GROUP) if "NVIDIA" not in r.inputs["amiType"]]
    release = cluster["systemNodeGroup"]["amiRelease"]
    kubernetes = cluster["kubernetesVersion"]
    assert system.inputs["releaseVersion"] == facts.amis["AL2023_x86_64_NVIDIA"][release].release_versions[
        kubernetes]
    assert system.inputs["scalingConfig"]["desiredSize"] == system.inputs["scalingConfig"]["minSize"]


def test_bumping_a_gpu_pool_release_leaves_the_system_nodes_alone(
        planned: dict[str, Planned], configs: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    """The Ray head and Karpenter run on the system nodes: a GPU pool's AMI bump must not roll them."""
    config = copy.deepcopy(configs["prod"])
    for group in groups_of(config):
        group["amiRelease"] = "v20260610"
    values, secrets = pulumi_config(config, tmp_path)
    bumped = plan("prod", values, secrets)

    def system(run: Planned) -> dict[str, Any]:
        [group] = [r for r in of_type(run, NODE_GROUP) if "NVIDIA" not in r.inputs["amiType"]]
        return group.inputs

    assert system(bumped) == system(planned["prod"])
    aliases = {node_class_of(bumped, node_pool_of(bumped, g["name"]))["spec"]["amiSelectorTerms"][0]["alias"]
               for g in groups_of(config)}
    assert aliases == {"al2023@v20260610"}


# --- the node role --------------------------------------------------------------------------------------

def test_node_role_component_alone_has_exactly_the_two_policies() -> None:
    def program() -> None:
        NodeRole("nodes")

    run = plan("unit", {}, program=program)
    assert [r.type for r in run.resources if not r.custom] == ["triarch:nodegroups:NodeRole"]
    roles = of_type(run, "aws:iam/role:Role")
    assert len(roles) == 1
    trust = json.loads(roles[0].inputs["assumeRolePolicy"])
    assert [s["Principal"] for s in trust["Statement"]] == [{"Service": "ec2.amazonaws.com"}]
    arns = [r.inputs["policyArn"] for r in of_type(run, POLICY_ATTACHMENT)]
    assert sorted(arns) == sorted(NODE_POLICY_ARNS)
    assert not [r for r in run.resources if r.type.startswith(("aws:iam/rolePolicy:", "aws:iam/policy:"))]


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_stack_grants_only_the_node_cluster_and_storage_driver_policies(planned: dict[str, Planned],
                                                                        configs: dict[str, dict[str, Any]],
                                                                        stack: str) -> None:
    run = planned[stack]
    roles = [r for r in run.resources if r.type == "triarch:nodegroups:NodeRole"]
    # One role for the managed node groups, one for Karpenter's nodes (EKS holds one access entry per role).
    assert len(roles) == 2
    for role_component in roles:
        node_arns = [r.inputs["policyArn"] for r in of_type(run, POLICY_ATTACHMENT) if r.parent == role_component.urn]
        assert sorted(node_arns) == sorted(NODE_POLICY_ARNS)
    all_arns = [r.inputs["policyArn"] for r in of_type(run, POLICY_ATTACHMENT)]
    # The nodes carry no network permissions: the VPC CNI has its own role.
    assert sorted(all_arns) == sorted([*NODE_POLICY_ARNS, *NODE_POLICY_ARNS, CLUSTER_POLICY_ARN, EFS_CSI_POLICY_ARN,
                                       EBS_CSI_POLICY_ARN, VPC_CNI_POLICY_ARN])
    # Pod roles are assumed through EKS Pod Identity by one service account of this cluster: Karpenter's through
    # an association of its own, the add-ons' (VPC CNI, EFS CSI) through the add-on.
    roles_by_urn = {r.urn: r for r in of_type(run, "aws:iam/role:Role")}
    cluster_name = configs[stack]["triarch:cluster"]["name"]
    pod_roles: dict[str, tuple[str, str]] = {}
    for association in of_type(run, "aws:eks/podIdentityAssociation:PodIdentityAssociation"):
        [role_urn] = association.property_dependencies["roleArn"]
        pod_roles[role_urn] = (association.inputs["namespace"], association.inputs["serviceAccount"])
    for addon in of_type(run, "aws:eks/addon:Addon"):
        for entry in addon.inputs.get("podIdentityAssociations", []):
            [role_urn] = addon.property_dependencies["podIdentityAssociations"]
            pod_roles[role_urn] = ("kube-system", entry["serviceAccount"])
    assert sorted(pod_roles.values()) == [("kube-system", "aws-node"), ("kube-system", "ebs-csi-controller-sa"),
                                          ("kube-system", "efs-csi-controller-sa"), ("kube-system", "karpenter")]
    for role_urn, (namespace, service_account) in pod_roles.items():
        [statement] = json.loads(roles_by_urn[role_urn].inputs["assumeRolePolicy"])["Statement"]
        assert statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}
        assert statement["Condition"]["StringEquals"] == {
            "aws:RequestTag/eks-cluster-name": cluster_name, "aws:RequestTag/kubernetes-namespace": namespace,
            "aws:RequestTag/kubernetes-service-account": service_account}
    iam = json.dumps([r.inputs for r in run.resources if r.type.startswith("aws:iam/")])
    for broad in BROAD_POLICIES:
        assert broad not in iam
    # The only inline policy is Karpenter's controller policy, scoped to this cluster (tested in test_karpenter).
    inline = [r.name for r in run.resources if r.type.startswith(("aws:iam/rolePolicy:", "aws:iam/policy:"))]
    assert inline == ["karpenter-controller"]


# --- Kubernetes resources and their provider ------------------------------------------------------------

@pytest.mark.parametrize("stack", [*STACKS, "local-sliced"])
def test_every_kubernetes_resource_has_the_explicit_provider(planned: dict[str, Planned], stack: str) -> None:
    run = planned[stack]
    providers = [r.urn for r in of_type(run, K8S_PROVIDER)]
    assert len(providers) == 1
    kube = [r for r in run.resources if r.type.startswith("kubernetes:")]
    assert kube, "no Kubernetes resources registered"
    for resource in kube:
        reference = run.provider_of.get(resource.urn, "")
        assert reference, f"{resource.type} {resource.name} uses the ambient default provider"
        assert reference.rsplit("::", 1)[0] == providers[0], (resource.name, reference)


def test_device_plugin_component_uses_the_provider_it_is_given() -> None:
    chart = charts()["nvidia-device-plugin"]

    def program() -> None:
        provider = k8s.Provider("explicit", kubeconfig="{}", context="unit-test")
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "nvidia-device-plugin"}}
        DevicePlugin("dp", chart, {"gfd": {"enabled": False}}, namespace, provider)

    run = plan("unit", {}, program=program)
    [provider] = of_type(run, K8S_PROVIDER)
    assert provider.inputs["context"] == "unit-test"
    kube = [r for r in run.resources if r.type.startswith("kubernetes:")]
    assert sorted(r.type for r in kube) == ["kubernetes:core/v1:Namespace", RELEASE]
    by_urn = {r.urn: r for r in run.resources}
    for resource in kube:
        assert run.provider_of[resource.urn].rsplit("::", 1)[0] == provider.urn
        assert by_urn[resource.parent or ""].type == "triarch:deviceplugin:DevicePlugin"


def test_local_provider_names_its_kubeconfig_context(planned: dict[str, Planned],
                                                     configs: dict[str, dict[str, Any]]) -> None:
    [provider] = of_type(planned["local"], K8S_PROVIDER)
    assert provider.inputs["context"] == configs["local"]["triarch:cluster"]["context"]


def device_plugin_release(run: Planned) -> Registered:
    """The stack's device plugin release (the KubeRay operator is another Helm release)."""
    [release] = [r for r in of_type(run, RELEASE) if r.inputs["chart"] == "nvidia-device-plugin"]
    return release


@pytest.mark.parametrize("stack", STACKS)
def test_device_plugin_release_is_pinned(planned: dict[str, Planned], stack: str) -> None:
    release = device_plugin_release(planned[stack])
    inputs = release.inputs
    assert inputs["chart"] == "nvidia-device-plugin"
    assert inputs["version"] == "0.20.0"
    repository = inputs.get("repositoryOpts", {}).get("repo", "")
    assert repository.startswith("https://"), repository
    [namespace] = [n for n in of_type(planned[stack], "kubernetes:core/v1:Namespace") if n.parent == release.parent]
    assert inputs["namespace"] == namespace.inputs["metadata"]["name"]


# --- the local stack: existing nodes, no AWS ------------------------------------------------------------

@pytest.mark.parametrize("stack", ("local", "local-sliced"))
def test_local_stack_registers_nothing_on_aws(planned: dict[str, Planned], stack: str) -> None:
    aws = [r.type for r in planned[stack].resources if r.type.startswith(("aws:", "pulumi:providers:aws"))]
    assert aws == []


@pytest.mark.parametrize("stack", ("local", "local-sliced"))
def test_local_stack_patches_the_named_node_with_pool_labels(
        planned: dict[str, Planned], configs: dict[str, dict[str, Any]], stack: str) -> None:
    [group] = groups_of(configs[stack])
    patches = of_type(planned[stack], NODE_PATCH)
    assert sorted(p.inputs["metadata"]["name"] for p in patches) == sorted(group["nodes"])
    for patch in patches:
        labels = patch.inputs["metadata"]["labels"]
        assert labels[scheduling.GPU_PRESENT_LABEL] == "true"
        assert labels[scheduling.POOL_LABEL] == group["name"]
        assert labels[scheduling.GPU_LABEL] == group["gpu"]
        taints = patch.inputs.get("spec", {}).get("taints", [])
        if group.get("taint", True):
            assert taints == [scheduling.gpu_taint()]
        else:
            assert taints == []


# --- time-slicing ---------------------------------------------------------------------------------------

def _sliced_config(planned: Planned, label_value: str) -> dict[str, Any]:
    config = device_plugin_release(planned).inputs["values"]["config"]
    assert label_value in config["map"], sorted(config["map"])
    assert config["default"] in config["map"]
    entry = yaml.safe_load(config["map"][label_value])
    assert entry["version"] == "v1"
    return entry


def test_time_slicing_on_an_eks_group(planned: dict[str, Planned], facts: Catalog) -> None:
    run = planned["dev-sliced"]
    pool = node_pool_of(run, "l4")
    label_value = pool["spec"]["template"]["metadata"]["labels"][scheduling.DEVICE_PLUGIN_CONFIG_LABEL]
    entry = _sliced_config(run, label_value)
    sharing = entry["sharing"]["timeSlicing"]
    assert {"name": "nvidia.com/gpu", "replicas": 4} in sharing["resources"]
    # A pod asking for two slices would get two slices of one GPU, not two GPUs: the plugin refuses it instead.
    assert sharing["failRequestsGreaterThanOne"] is True


def test_time_slicing_on_existing_nodes(planned: dict[str, Planned]) -> None:
    run = planned["local-sliced"]
    [patch] = of_type(run, NODE_PATCH)
    label_value = patch.inputs["metadata"]["labels"][scheduling.DEVICE_PLUGIN_CONFIG_LABEL]
    entry = _sliced_config(run, label_value)
    assert {"name": "nvidia.com/gpu", "replicas": 2} in entry["sharing"]["timeSlicing"]["resources"]


@pytest.mark.parametrize("stack", STACKS)
def test_without_time_slicing_there_is_no_device_plugin_config(planned: dict[str, Planned],
                                                               stack: str) -> None:
    run = planned[stack]
    assert "config" not in device_plugin_release(run).inputs["values"]
    labelled = [r for r in [*gpu_node_groups(run), *of_type(run, NODE_POOL), *of_type(run, NODE_PATCH)]
                if scheduling.DEVICE_PLUGIN_CONFIG_LABEL in json.dumps(r.inputs)]
    assert labelled == []


# --- how values come back -------------------------------------------------------------------------------

@pytest.mark.parametrize("stack", [*STACKS, *VARIANTS])
def test_integers_stay_integers(planned: dict[str, Planned], stack: str) -> None:
    run = planned[stack]
    for node_group in of_type(run, NODE_GROUP):
        scaling = node_group.inputs["scalingConfig"]
        for key in ("minSize", "maxSize", "desiredSize"):
            assert type(scaling[key]) is int, (node_group.name, key, scaling[key])
    for template in of_type(run, LAUNCH_TEMPLATE):
        assert type(template.inputs["metadataOptions"]["httpPutResponseHopLimit"]) is int
        assert type(template.inputs["blockDeviceMappings"][0]["ebs"]["volumeSize"]) is int
    floats = [(r.type, r.name, v) for r in run.resources for v in walk(r.inputs)
              if isinstance(v, float) and v.is_integer()]
    assert floats == []


def test_eks_group_sizes_are_the_configured_integers(planned: dict[str, Planned],
                                                     configs: dict[str, dict[str, Any]]) -> None:
    for stack, group in MANAGED_POOLS:
        spec = group_spec(configs[stack], group)
        scaling = node_group_of(planned[stack], group).inputs["scalingConfig"]
        assert (scaling["minSize"], scaling["maxSize"]) == (spec["min"], spec["max"])


@pytest.mark.parametrize("stack", [*EKS_STACKS, "prod-fixed"])
def test_unknown_values_are_marked_known_after_apply(planned: dict[str, Planned], stack: str) -> None:
    run = planned[stack]
    for node_group in of_type(run, NODE_GROUP):
        assert node_group.inputs["nodeRoleArn"] == KNOWN_AFTER_APPLY
        assert node_group.inputs["launchTemplate"]["id"] == KNOWN_AFTER_APPLY
        assert node_group.inputs["subnetIds"]
        assert set(node_group.inputs["subnetIds"]) == {KNOWN_AFTER_APPLY}
    [provider] = of_type(run, K8S_PROVIDER)
    assert provider.inputs["kubeconfig"] == KNOWN_AFTER_APPLY
    raw = json.dumps([r.inputs for r in run.resources])
    assert "04da6b54-80e4-46f7-96ec-b56ff0331ba9" not in raw  # the SDK's raw unknown sentinel


def test_component_program_resources_are_all_recorded() -> None:
    """A program that builds components and returns immediately still has every child recorded."""

    def program() -> None:
        for i in range(3):
            NodeRole(f"nodes-{i}", opts=pulumi.ResourceOptions())

    run = plan("unit", {}, program=program)
    assert len(of_type(run, POLICY_ATTACHMENT)) == 3 * len(NODE_POLICY_ARNS)
    assert all(r.parent for r in of_type(run, POLICY_ATTACHMENT))


# --- the address plan -------------------------------------------------------------------------------------------

def test_each_zone_owns_its_ranges_by_letter() -> None:
    """A zone's subnets follow its letter: an eighth of the VPC each for pods, an eighth of the last eighth for
    the public side; listing zones in another order, or adding one, moves no range."""
    vpc = IPv4Network("10.0.0.0/16")
    expected = {"us-east-1a": ("10.0.0.0/19", "10.0.224.0/22"), "us-east-1b": ("10.0.32.0/19", "10.0.228.0/22"),
                "us-east-1c": ("10.0.64.0/19", "10.0.232.0/22"), "us-east-1f": ("10.0.160.0/19", "10.0.244.0/22")}
    for zones in (["us-east-1a", "us-east-1b", "us-east-1c"], ["us-east-1c", "us-east-1a"],
                  ["us-east-1f", "us-east-1b", "us-east-1a", "us-east-1c"]):
        plans = plan_subnets(vpc, zones)
        assert [p.zone for p in plans] == zones
        assert {p.zone: (p.private_cidr, p.public_cidr) for p in plans} == {z: expected[z] for z in zones}


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_no_two_subnets_overlap(planned: dict[str, Planned], configs: dict[str, dict[str, Any]], stack: str) -> None:
    ranges = [ip_network(s.inputs["cidrBlock"]) for s in of_type(planned[stack], "aws:ec2/subnet:Subnet")]
    assert len(ranges) == 2 * len(configs[stack]["triarch:cluster"]["zones"])  # a private and a public per zone
    for i, first in enumerate(ranges):
        for second in ranges[i + 1:]:
            assert not first.overlaps(second), (first, second)
