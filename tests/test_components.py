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
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pytest
import yaml
from pulumi.runtime.mocks import MockMonitor

from triarch import scheduling
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
NODE_TEMPLATE = "k8s.io/cluster-autoscaler/node-template"

NODE_POLICY_ARNS = {
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly",
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
}
CLUSTER_POLICY_ARN = "arn:aws:iam::aws:policy/AmazonEKSClusterPolicy"
EFS_CSI_POLICY_ARN = "arn:aws:iam::aws:policy/service-role/AmazonEFSCSIDriverPolicy"
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
    """local with the GPU taint back on and time-slicing 4 ways."""
    group = config["triarch:nodeGroups"][0]
    group["taint"] = True
    group["timeSlicing"] = {"replicas": 4}
    return config


VARIANTS: dict[str, tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "dev-sliced": ("dev", sliced_dev),
    "local-sliced": ("local", sliced_local),
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


def asg_tags(run: Planned, node_group: Registered) -> dict[str, str]:
    tags = [r.inputs["tag"] for r in siblings(run, node_group, ASG_TAG)]
    as_dict = {t["key"]: t["value"] for t in tags}
    assert len(as_dict) == len(tags), f"duplicate autoscaler tag keys: {tags}"
    return as_dict


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


GPU_STACKS = ("dev", "prod", "dev-sliced")


def eks_groups(configs: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    return [(stack, g["name"]) for stack in GPU_STACKS for g in groups_of(configs[stack])]


EKS_GROUPS = [("dev", "l4"), ("prod", "l4"), ("prod", "a100"), ("dev-sliced", "l4")]


def test_eks_group_parametrisation_covers_every_group(configs: dict[str, dict[str, Any]]) -> None:
    assert sorted(EKS_GROUPS) == sorted(eks_groups(configs))


# --- GPU node groups ------------------------------------------------------------------------------------

@pytest.mark.parametrize("stack", GPU_STACKS)
def test_every_gpu_node_group_is_a_configured_pool(planned: dict[str, Planned],
                                                  configs: dict[str, dict[str, Any]], stack: str) -> None:
    """No GPU node group escapes the per-group checks below: one per configured group, each labelled."""
    groups = gpu_node_groups(planned[stack])
    pools = sorted(g.inputs.get("labels", {}).get(scheduling.POOL_LABEL, "<unlabelled>") for g in groups)
    assert pools == sorted(g["name"] for g in groups_of(configs[stack]))


@pytest.mark.parametrize(("stack", "group"), EKS_GROUPS)
def test_gpu_node_group_carries_scheduling_labels_and_taint(
        planned: dict[str, Planned], configs: dict[str, dict[str, Any]], facts: Catalog,
        stack: str, group: str) -> None:
    spec = group_spec(configs[stack], group)
    node_group = node_group_of(planned[stack], group)
    inputs = node_group.inputs
    assert inputs["instanceTypes"] == [spec["instanceType"]]
    labels = inputs["labels"]
    assert labels[scheduling.GPU_PRESENT_LABEL] == "true"
    assert labels[scheduling.POOL_LABEL] == group
    assert labels[scheduling.GPU_LABEL] == facts.instances[spec["instanceType"]].gpu
    gpu_taints = [t for t in inputs["taints"] if t["key"] == scheduling.GPU_TAINT_KEY]
    expected = {"key": "nvidia.com/gpu", "value": scheduling.GPU_TAINT_VALUE, "effect": "NO_SCHEDULE"}
    assert gpu_taints == [expected]


@pytest.mark.parametrize(("stack", "group"), EKS_GROUPS)
def test_gpu_node_group_pins_the_ami_release(
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


@pytest.mark.parametrize("stack", ("dev", "prod", "dev-sliced"))
def test_every_node_group_has_a_hardened_launch_template(planned: dict[str, Planned], stack: str) -> None:
    node_groups = of_type(planned[stack], NODE_GROUP)
    assert len(node_groups) >= 2  # the system group and at least one GPU group
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


@pytest.mark.parametrize(("stack", "group"), EKS_GROUPS)
def test_autoscaler_node_template_tags(
        planned: dict[str, Planned], configs: dict[str, dict[str, Any]], facts: Catalog,
        stack: str, group: str) -> None:
    spec = group_spec(configs[stack], group)
    cluster = configs[stack]["triarch:cluster"]["name"]
    node_group = node_group_of(planned[stack], group)
    tags = asg_tags(planned[stack], node_group)
    assert tags["k8s.io/cluster-autoscaler/enabled"] == "true"
    assert tags[f"k8s.io/cluster-autoscaler/{cluster}"] == "owned"
    for key, value in node_group.inputs["labels"].items():
        assert tags[f"{NODE_TEMPLATE}/label/{key}"] == value
    for key in (scheduling.GPU_PRESENT_LABEL, scheduling.POOL_LABEL, scheduling.GPU_LABEL):
        assert f"{NODE_TEMPLATE}/label/{key}" in tags
    assert tags[f"{NODE_TEMPLATE}/taint/nvidia.com/gpu"] == "present:NoSchedule"
    gpus = facts.instances[spec["instanceType"]].gpus
    replicas = (spec.get("timeSlicing") or {}).get("replicas", 1)
    assert tags[f"{NODE_TEMPLATE}/resources/nvidia.com/gpu"] == str(gpus * replicas)


def test_prod_has_two_gpu_node_groups_of_different_gpus(planned: dict[str, Planned], facts: Catalog) -> None:
    groups = gpu_node_groups(planned["prod"])
    assert len(groups) >= 2
    gpus = {g.inputs["labels"][scheduling.GPU_LABEL] for g in groups}
    assert len(gpus) == len(groups), gpus
    assert {facts.instances[g.inputs["instanceTypes"][0]].gpu for g in groups} == gpus


# --- the node role --------------------------------------------------------------------------------------

def test_node_role_component_alone_has_exactly_the_three_policies() -> None:
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
                                                                        stack: str) -> None:
    run = planned[stack]
    [role_component] = [r for r in run.resources if r.type == "triarch:nodegroups:NodeRole"]
    node_arns = [r.inputs["policyArn"] for r in of_type(run, POLICY_ATTACHMENT)
                 if r.parent == role_component.urn]
    assert sorted(node_arns) == sorted(NODE_POLICY_ARNS)
    all_arns = [r.inputs["policyArn"] for r in of_type(run, POLICY_ATTACHMENT)]
    assert sorted(all_arns) == sorted([*NODE_POLICY_ARNS, CLUSTER_POLICY_ARN, EFS_CSI_POLICY_ARN])
    # The EFS CSI driver's policy goes to a role only its pods assume (EKS pod identity), never to the nodes.
    [efs] = [r for r in of_type(run, POLICY_ATTACHMENT) if r.inputs["policyArn"] == EFS_CSI_POLICY_ARN]
    [efs_role] = [r for r in of_type(run, "aws:iam/role:Role") if r.parent == efs.parent and r.name == efs.name]
    trust = json.loads(efs_role.inputs["assumeRolePolicy"])
    assert [s["Principal"] for s in trust["Statement"]] == [{"Service": "pods.eks.amazonaws.com"}]
    iam = json.dumps([r.inputs for r in run.resources if r.type.startswith("aws:iam/")])
    for broad in BROAD_POLICIES:
        assert broad not in iam
    inline = [r for r in run.resources if r.type.startswith(("aws:iam/rolePolicy:", "aws:iam/policy:"))]
    assert inline == []


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
        DevicePlugin("dp", chart, {"gfd": {"enabled": False}}, provider)

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
    node_group = node_group_of(run, "l4")
    label_value = node_group.inputs["labels"][scheduling.DEVICE_PLUGIN_CONFIG_LABEL]
    entry = _sliced_config(run, label_value)
    assert {"name": "nvidia.com/gpu", "replicas": 4} in entry["sharing"]["timeSlicing"]["resources"]
    tags = asg_tags(run, node_group)
    assert tags[f"{NODE_TEMPLATE}/label/{scheduling.DEVICE_PLUGIN_CONFIG_LABEL}"] == label_value
    assert tags[f"{NODE_TEMPLATE}/resources/nvidia.com/gpu"] == str(facts.instances["g6.12xlarge"].gpus * 4)


def test_time_slicing_on_existing_nodes(planned: dict[str, Planned]) -> None:
    run = planned["local-sliced"]
    [patch] = of_type(run, NODE_PATCH)
    label_value = patch.inputs["metadata"]["labels"][scheduling.DEVICE_PLUGIN_CONFIG_LABEL]
    entry = _sliced_config(run, label_value)
    assert {"name": "nvidia.com/gpu", "replicas": 4} in entry["sharing"]["timeSlicing"]["resources"]


@pytest.mark.parametrize("stack", STACKS)
def test_without_time_slicing_there_is_no_device_plugin_config(planned: dict[str, Planned],
                                                               stack: str) -> None:
    run = planned[stack]
    assert "config" not in device_plugin_release(run).inputs["values"]
    labelled = [r for r in [*gpu_node_groups(run), *of_type(run, NODE_PATCH)]
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
    for group in groups_of(configs["prod"]):
        scaling = node_group_of(planned["prod"], group["name"]).inputs["scalingConfig"]
        assert (scaling["minSize"], scaling["maxSize"]) == (group["min"], group["max"])


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_unknown_values_are_marked_known_after_apply(planned: dict[str, Planned], stack: str) -> None:
    run = planned[stack]
    for node_group in gpu_node_groups(run):
        assert node_group.inputs["nodeRoleArn"] == KNOWN_AFTER_APPLY
        assert node_group.inputs["launchTemplate"]["id"] == KNOWN_AFTER_APPLY
        assert node_group.inputs["subnetIds"]
        assert set(node_group.inputs["subnetIds"]) == {KNOWN_AFTER_APPLY}
        for tag in siblings(run, node_group, ASG_TAG):
            assert tag.inputs["autoscalingGroupName"] == KNOWN_AFTER_APPLY
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
