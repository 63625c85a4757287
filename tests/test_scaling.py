"""The platform comes up and scales: every pod template Triarch creates can be placed on a pool (labels, taints,
GPUs, CPU and memory), a GPU pod pending on a pool at zero can be met by a node its provisioner launches,
replicas spread over zones in a way a scale-from-zero cannot defeat, and Ray's autoscaler can authenticate and
pick a worker group from zero.

The scheduling here is a small model of the kube-scheduler's filters (node selector, required node affinity,
taints, resource fit, topology spread with minDomains), fed with the pools as the plan declares them: a
Karpenter NodePool's template labels, requirements and taints; a managed node group's labels and taints; the
labels Triarch patches onto existing nodes. Node capacity comes from templates/compat/instances.yaml, less what
the EKS AMI reserves (cited below); DaemonSets' own requests are left to the placement proof of `triarch check`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import StackPlan, compat_data, plan_config, stack_document

INSTANCES = {**compat_data("instances")["instances"], **compat_data("instances")["cpuInstances"]}
GPUS = compat_data("gpus")["gpus"]
GPU = "nvidia.com/gpu"
ZONE = "topology.kubernetes.io/zone"
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


# --- the pools as nodes ----------------------------------------------------------------------------------------

def reserved_millicores(vcpus: int) -> int:
    """kube-reserved CPU on the EKS AL2023 AMI (nodeadm, after GKE's formula): 6% of the first core, 1% of the
    second, 0.5% of the next two, 0.25% of every core beyond four."""
    tiers = [(1, 60.0), (1, 10.0), (2, 5.0)]
    reserved, left = 0.0, vcpus
    for cores, per_core in tiers:
        taken = min(left, cores)
        reserved += taken * per_core
        left -= taken
    return int(reserved + left * 2.5)


def reserved_mib(vcpus: int) -> int:
    """kube-reserved memory on the EKS AMI: 11 MiB per pod the node may run plus 255 MiB, with max pods at most
    110 below 30 vCPUs and 250 above (the AMI's cap), and the 100 MiB hard eviction threshold."""
    max_pods = 110 if vcpus < 30 else 250
    return 11 * max_pods + 255 + 100


@dataclass(frozen=True)
class Node:
    pool: str
    labels: dict[str, str]
    taints: list[dict[str, str]]
    cpu_m: int
    memory_mib: int
    gpus: int
    zones: tuple[str, ...] | None
    max_nodes: int
    provisioner: str


def allocatable(instance_type: str) -> tuple[int, int]:
    instance = INSTANCES[instance_type]
    vcpus, memory = int(instance["vcpus"]), int(instance["memoryGiB"] * 1024)
    return vcpus * 1000 - reserved_millicores(vcpus), memory - reserved_mib(vcpus)


def nodes_of(plan: StackPlan) -> dict[str, Node]:
    """Every pool of a plan as the node it brings up."""
    config = plan.config
    cluster = config["triarch:cluster"]
    groups = {g["name"]: g for g in config["triarch:nodeGroups"]}
    nodes: dict[str, Node] = {}
    for pool in plan.objects("NodePool"):
        template = pool["spec"]["template"]
        requirements = {q["key"]: q["values"] for q in template["spec"]["requirements"]}
        [instance_type] = requirements["node.kubernetes.io/instance-type"]
        labels = {**template["metadata"]["labels"], "node.kubernetes.io/instance-type": instance_type,
                  "karpenter.sh/nodepool": pool["metadata"]["name"], "kubernetes.io/os": "linux"}
        name = labels["triarch.dev/pool"]
        cpu, memory = allocatable(instance_type)
        sliced = (groups[name].get("timeSlicing") or {}).get("replicas", 1)
        gpu_limit = int(pool["spec"]["limits"][GPU])
        per_node = INSTANCES[instance_type]["gpus"]
        nodes[name] = Node(name, labels, template["spec"].get("taints", []), cpu, memory, per_node * sliced,
                           tuple(requirements[ZONE]), gpu_limit // per_node, "karpenter")
    for group in plan.of_type("aws:eks/nodeGroup:NodeGroup"):
        inputs = group.inputs
        name = inputs["labels"]["triarch.dev/pool"]
        cpu, memory = allocatable(inputs["instanceTypes"][0])
        effects = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
        taints = [{**t, "effect": effects[t["effect"]]} for t in inputs.get("taints", [])]
        gpus = INSTANCES[inputs["instanceTypes"][0]].get("gpus", 0)
        if name in groups:
            gpus *= (groups[name].get("timeSlicing") or {}).get("replicas", 1)
        zones = tuple((groups.get(name) or {}).get("zones") or cluster["zones"])
        nodes[name] = Node(name, {**inputs["labels"], "kubernetes.io/os": "linux"}, taints, cpu, memory, gpus,
                           zones, inputs["scalingConfig"]["maxSize"], "managedNodeGroup")
    for patch in plan.of_type("kubernetes:core/v1:NodePatch"):
        labels = patch.inputs["metadata"]["labels"]
        group = groups[labels["triarch.dev/pool"]]
        gpus = group["gpusPerNode"] * (group.get("timeSlicing") or {}).get("replicas", 1)
        # An existing node of unknown size: only GPUs are compared.
        nodes[group["name"]] = Node(group["name"], {**labels, "kubernetes.io/os": "linux"},
                                    patch.inputs.get("spec", {}).get("taints", []), 10**9, 10**9, gpus, None,
                                    group["max"], "existing")
    return nodes


# --- pods -----------------------------------------------------------------------------------------------------

def quantity_m(value: str) -> int:
    value = str(value)
    return int(value[:-1]) if value.endswith("m") else int(float(value) * 1000)


def quantity_mib(value: str) -> int:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}
    for suffix, factor in units.items():
        if str(value).endswith(suffix):
            return int(float(str(value)[: -len(suffix)]) * factor)
    return int(int(value) / (1024 * 1024))


@dataclass(frozen=True)
class Pod:
    where: str
    spec: Mapping[str, Any]
    replicas: int

    def requests(self) -> tuple[int, int, int]:
        cpu = memory = gpus = 0
        for container in self.spec["containers"]:
            resources = container.get("resources") or {}
            amounts = {**resources.get("limits", {}), **resources.get("requests", {})}
            cpu += quantity_m(amounts.get("cpu", "0"))
            memory += quantity_mib(amounts.get("memory", "0Mi"))
            gpus += int(amounts.get(GPU, 0))
        return cpu, memory, gpus


def pods_of(plan: StackPlan) -> list[Pod]:
    pods = [Pod(f"Deployment {d['metadata']['name']}", d["spec"]["template"]["spec"], d["spec"]["replicas"])
            for d in plan.objects("Deployment")]
    for service in plan.objects("RayService"):
        cluster = service["spec"]["rayClusterConfig"]
        pods.append(Pod("Ray head", cluster["headGroupSpec"]["template"]["spec"], 1))
        pods += [Pod(f"Ray worker group {g['groupName']}", g["template"]["spec"], g["maxReplicas"])
                 for g in cluster["workerGroupSpecs"]]
    return pods


def helm_pods(plan: StackPlan) -> list[Pod]:
    """The pods the Helm releases run, as their values place them (only what placement reads)."""
    pods = []
    for release in plan.of_type("kubernetes:helm.sh/v3:Release"):
        values = release.inputs["values"]
        name = release.inputs["name"]
        if name == "nvidia-device-plugin":
            pods.append(Pod("device plugin DaemonSet", {"affinity": values["affinity"],
                                                         "tolerations": values["tolerations"],
                                                         "containers": []}, 0))
        elif name == "karpenter":
            # The chart's own placement (values.yaml 1.14.1): linux nodes not made by Karpenter, plus ours.
            affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "karpenter.sh/nodepool", "operator": "DoesNotExist"}]}]}}}
            resources = values["controller"]["resources"]
            pods.append(Pod("Karpenter controller", {
                "nodeSelector": {"kubernetes.io/os": "linux", **values["nodeSelector"]}, "affinity": affinity,
                "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
                "containers": [{"resources": resources}]}, 2))
        elif name == "kuberay-operator":
            pods.append(Pod("KubeRay operator", {"nodeSelector": values.get("nodeSelector", {}),
                                                 "containers": [{"resources": values["resources"]}]}, 1))
    return pods


def selects(pod: Pod, node: Node) -> bool:
    if any(node.labels.get(k) != v for k, v in (pod.spec.get("nodeSelector") or {}).items()):
        return False
    terms = ((((pod.spec.get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms"))
    if not terms:
        return True

    def matches(expression: Mapping[str, Any]) -> bool:
        value, operator = node.labels.get(expression["key"]), expression["operator"]
        if operator == "In":
            return value in expression["values"]
        if operator == "NotIn":
            return value not in expression["values"]
        if operator == "Exists":
            return value is not None
        if operator == "DoesNotExist":
            return value is None
        raise AssertionError(f"operator {operator} not modelled")

    return any(all(matches(e) for e in term.get("matchExpressions", [])) for term in terms)


def tolerated(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if toleration.get("effect") not in (None, "", taint["effect"]):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint["key"]
    return bool(toleration.get("key") == taint["key"] and toleration.get("value") == taint.get("value"))


def tolerates(pod: Pod, node: Node) -> bool:
    return all(any(tolerated(t, taint) for t in pod.spec.get("tolerations") or [])
               for taint in node.taints if taint["effect"] != "PreferNoSchedule")


def fits(pod: Pod, node: Node) -> bool:
    cpu, memory, gpus = pod.requests()
    return cpu <= node.cpu_m and memory <= node.memory_mib and gpus <= node.gpus


def placements(pod: Pod, nodes: Mapping[str, Node]) -> list[str]:
    return sorted(n.pool for n in nodes.values() if selects(pod, n) and tolerates(pod, n) and fits(pod, n))


def system_node(plan: StackPlan) -> Node | None:
    cluster = plan.config["triarch:cluster"]
    if not cluster.get("create"):
        return None
    system = cluster.get("systemNodeGroup") or {}
    instance_type = system.get("instanceType", "m7i.large")
    cpu, memory = allocatable(instance_type)
    return Node("system", {"triarch.dev/pool": "system", "kubernetes.io/os": "linux"}, [], cpu, memory, 0,
                tuple(cluster["zones"]), system.get("max", 4), "managedNodeGroup")


def all_nodes(plan: StackPlan) -> dict[str, Node]:
    nodes = nodes_of(plan)
    system = system_node(plan)
    if system is not None:
        nodes["system"] = system
    return nodes


@pytest.fixture(scope="module")
def variants(shipped: dict[str, StackPlan], tmp_path_factory: pytest.TempPathFactory) -> dict[str, StackPlan]:
    """The shipped stacks, and prod with its A100 pool as a fixed managed node group of two."""
    fixed = stack_document("prod")
    next(g for g in fixed["triarch:nodeGroups"] if g["name"] == "a100").update(
        provisioner="managedNodeGroup", min=2, max=2)
    return {**shipped, "prod-fixed": plan_config("prod", fixed, tmp_path_factory.mktemp("prod-fixed"))}


STACKS = ("local", "dev", "prod", "prod-fixed")


@pytest.mark.parametrize("stack", STACKS)
def test_every_workload_pod_lands_on_exactly_its_pool(variants: dict[str, StackPlan], stack: str) -> None:
    plan = variants[stack]
    nodes = all_nodes(plan)
    models = {m["name"]: m for m in plan.config.get("triarch:models", [])}
    pods = pods_of(plan)
    assert pods
    for pod in pods:
        found = placements(pod, nodes)
        if pod.where == "Ray head":
            # On a created cluster only the system nodes (GPU nodes are tainted); on a workstation, its node.
            assert found == (["system"] if "system" in nodes else sorted(nodes)), found
            continue
        assert len(found) == 1, (pod.where, found)
        name = pod.where.split()[-1]
        if name in models:
            assert found == [models[name]["nodeGroup"]], (pod.where, found)


@pytest.mark.parametrize("stack", STACKS)
def test_operators_land_on_the_system_pool_and_the_device_plugin_on_every_gpu_pool(variants: dict[str, StackPlan],
                                                                                  stack: str) -> None:
    plan = variants[stack]
    nodes = all_nodes(plan)
    gpu_pools = sorted(p for p in nodes if p != "system")
    for pod in helm_pods(plan):
        found = placements(pod, nodes)
        if pod.where == "device plugin DaemonSet":
            assert found == gpu_pools, found
        elif "system" in nodes:
            assert found == ["system"], (pod.where, found)


@pytest.mark.parametrize("stack", ("dev", "prod"))
def test_karpenter_replicas_fit_the_system_pool(shipped: dict[str, StackPlan], stack: str) -> None:
    """Two controller replicas with required anti-affinity per host: the system pool starts with two nodes."""
    system = shipped[stack].config["triarch:cluster"].get("systemNodeGroup", {})
    assert system.get("min", 2) >= 2


def test_a_pod_for_a_missing_pool_or_without_the_toleration_lands_nowhere(shipped: dict[str, StackPlan]) -> None:
    """The scheduling model is not vacuous."""
    plan = shipped["prod"]
    nodes = all_nodes(plan)
    [embed] = [p for p in pods_of(plan) if p.where == "Deployment embed"]
    assert placements(embed, nodes) == ["l4"]
    elsewhere = Pod(embed.where, {**embed.spec, "nodeSelector": {"triarch.dev/pool": "h100"}}, 1)
    assert placements(elsewhere, nodes) == []
    intolerant = Pod(embed.where, {**embed.spec, "tolerations": []}, 1)
    assert placements(intolerant, nodes) == []
    greedy = copy.deepcopy(dict(embed.spec))
    greedy["containers"][0]["resources"]["requests"]["memory"] = "64Gi"
    assert placements(Pod(embed.where, greedy, 1), nodes) == []


# --- scale from zero ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stack", ("dev", "prod"))
def test_every_pool_at_zero_has_a_provisioner_that_can_add_the_pending_pods_node(shipped: dict[str, StackPlan],
                                                                                  stack: str) -> None:
    plan = shipped[stack]
    config = plan.config
    assert all(g["min"] == 0 for g in config["triarch:nodeGroups"]), "the shipped EKS stacks start from zero"
    nodes = nodes_of(plan)
    for pod in [p for p in pods_of(plan) if p.requests()[2] > 0]:
        [pool] = placements(pod, nodes)
        node = nodes[pool]
        # A NodePool creates this node when the pod is pending: Karpenter reads the same labels, taints and
        # instance type, and its limits leave room for at least one node.
        assert node.provisioner == "karpenter", (pod.where, node.provisioner)
        assert node.max_nodes >= 1
        assert pod.requests()[2] <= node.gpus


def test_the_plan_summary_says_how_each_pool_scales(shipped: dict[str, StackPlan],
                                                   capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from triarch import cli

    assert cli.main(["plan", "--stack", "prod", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for group in shipped["prod"].config["triarch:nodeGroups"]:
        [line] = [x for x in out.splitlines() if x.strip().startswith(f"{group['name']}: Karpenter NodePool")]
        assert f"from 0 to {group['max']} {group['instanceType']}" in line
    assert cli.main(["plan", "--stack", "local", "--out", str(tmp_path / "local")]) == 0
    out = capsys.readouterr().out
    assert "laptop: existing node(s) (workstation) labelled by Triarch" in out


# --- zone spread ------------------------------------------------------------------------------------------------

def spread(pod: Pod) -> dict[str, Any]:
    [zone] = [c for c in pod.spec["topologySpreadConstraints"] if c["topologyKey"] == ZONE]
    return dict(zone)


def place_one_by_one(pod: Pod, node: Node) -> dict[str, int]:
    """Replicas placed one at a time on a pool scaling from zero: a zone exists for the scheduler only once a
    node runs there; a replica that fits no existing zone waits for a new node in the emptiest allowed zone.
    Returns replicas per zone."""
    constraint = spread(pod)
    assert node.zones is not None
    counts: dict[str, int] = {}
    hard = constraint["whenUnsatisfiable"] == "DoNotSchedule"
    min_domains = constraint.get("minDomains", 1)
    for _ in range(pod.replicas):
        seen = list(counts)
        global_min = 0 if len(seen) < min_domains or not seen else min(counts.values())
        allowed = [z for z in seen if counts[z] + 1 - global_min <= constraint["maxSkew"]] if hard else seen
        # Where no zone seen so far is allowed, the provisioner adds a node in another zone.
        zone = min(allowed, key=lambda z: counts[z]) if allowed else next(z for z in node.zones if z not in counts)
        counts[zone] = counts.get(zone, 0) + 1
    return counts


@pytest.mark.parametrize("stack", ("dev", "prod", "prod-fixed"))
def test_replicas_spread_over_zones_even_from_zero(variants: dict[str, StackPlan], stack: str) -> None:
    plan = variants[stack]
    nodes = nodes_of(plan)
    for pod in [p for p in pods_of(plan) if p.requests()[2] > 0]:
        [pool] = placements(pod, nodes)
        node = nodes[pool]
        assert node.zones is not None
        constraint = spread(pod)
        if pod.replicas < 2:
            continue
        assert constraint["whenUnsatisfiable"] == "DoNotSchedule", pod.where
        assert constraint["maxSkew"] == 1
        expected_domains = min(len(node.zones), node.max_nodes, pod.replicas)
        assert constraint.get("minDomains", 1) == expected_domains, pod.where
        counts = place_one_by_one(pod, node)
        assert len(counts) == expected_domains, (pod.where, counts)
        assert max(counts.values()) - min(counts.values()) <= 1, (pod.where, counts)


def test_a_soft_spread_would_put_every_replica_in_one_zone(shipped: dict[str, StackPlan]) -> None:
    """What the hard spread prevents: with ScheduleAnyway, replicas from zero all join the first node's zone."""
    plan = shipped["prod"]
    nodes = nodes_of(plan)
    [embed] = [p for p in pods_of(plan) if p.where == "Deployment embed"]
    soft = copy.deepcopy(dict(embed.spec))
    soft["topologySpreadConstraints"] = [{**spread(embed), "whenUnsatisfiable": "ScheduleAnyway"}]
    soft["topologySpreadConstraints"][0].pop("minDomains", None)
    assert len(place_one_by_one(Pod(embed.where, soft, embed.replicas), nodes["l4"])) == 1


def test_adopted_nodes_keep_a_soft_spread(shipped: dict[str, StackPlan]) -> None:
    """Existing nodes may carry no zone label at all (a workstation): a hard spread would leave pods Pending."""
    for pod in pods_of(shipped["local"]):
        if pod.requests()[2] > 0:
            assert spread(pod)["whenUnsatisfiable"] == "ScheduleAnyway"


# --- Ray: the autoscaler can act, and can pick a group from zero ------------------------------------------------

def ray_service(plan: StackPlan) -> dict[str, Any]:
    [service] = plan.objects("RayService")
    return service


def test_the_head_autoscaler_authenticates_with_its_own_service_account(shipped: dict[str, StackPlan]) -> None:
    plan = shipped["prod"]
    cluster = ray_service(plan)["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    head = cluster["headGroupSpec"]["template"]["spec"]
    namespace = ray_service(plan)["metadata"]["namespace"]
    [account] = [a for a in plan.objects("ServiceAccount") if a["metadata"]["name"] == head["serviceAccountName"]]
    assert account["metadata"]["namespace"] == namespace
    # No token in the Ray containers...
    assert head["automountServiceAccountToken"] is False
    assert account["automountServiceAccountToken"] is False
    assert all(TOKEN_DIR not in {m["mountPath"] for m in c.get("volumeMounts", [])} for c in head["containers"])
    # ...and one, projected, where Ray's autoscaler reads it (token and CA under the service-account path).
    mounts = cluster["autoscalerOptions"]["volumeMounts"]
    [mount] = [m for m in mounts if m["mountPath"] == TOKEN_DIR]
    [volume] = [v for v in head["volumes"] if v["name"] == mount["name"]]
    sources = volume["projected"]["sources"]
    assert any("serviceAccountToken" in s and s["serviceAccountToken"]["path"] == "token" for s in sources)
    assert any(s.get("configMap", {}).get("name") == "kube-root-ca.crt" and
               {"key": "ca.crt", "path": "ca.crt"} in s["configMap"]["items"] for s in sources)
    # The workers never talk to the API server.
    for group in cluster["workerGroupSpecs"]:
        spec = group["template"]["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert "serviceAccountName" not in spec


def test_the_ray_service_waits_for_the_autoscaler_service_account(shipped: dict[str, StackPlan]) -> None:
    """KubeRay refuses to build a head whose named service account does not exist yet."""
    plan = shipped["prod"]
    [service] = plan.of_type("kubernetes:ray.io/v1:RayService")
    [account] = plan.of_type("kubernetes:core/v1:ServiceAccount")
    assert account.urn in plan.dependencies[service.urn]


def test_without_ray_autoscaling_there_is_no_token_anywhere(tmp_path: Path) -> None:
    config = stack_document("prod")
    for model in config["triarch:models"]:
        if model.pop("autoscaling", None):
            model["replicas"] = 1
    plan = plan_config("prod", config, tmp_path)
    cluster = ray_service(plan)["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is False
    assert plan.objects("ServiceAccount") == []
    assert "serviceAccountName" not in cluster["headGroupSpec"]["template"]["spec"]
    assert "autoscalerOptions" not in cluster


def advertised(group: Mapping[str, Any]) -> dict[str, float]:
    """A worker group's custom resources as Ray's autoscaler parses rayStartParams.resources: the outer quotes
    cut, backslashes dropped, JSON."""
    text = group["rayStartParams"].get("resources")
    if not text:
        return {}
    parsed: dict[str, float] = json.loads(text[1:-1].replace("\\", ""))
    assert all(isinstance(v, int) for v in parsed.values()), "the autoscaler asserts integer resources"
    return parsed


def test_each_worker_group_advertises_what_its_replicas_ask_for(shipped: dict[str, StackPlan]) -> None:
    """A Serve LLM replica with accelerator_type X asks for `accelerator_type:X`; Ray detects it on a running
    node, but a group at zero has none, so the autoscaler can only pick it if the group declares it."""
    service = ray_service(shipped["prod"])
    groups = service["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    pools = {g["name"]: g for g in shipped["prod"].config["triarch:nodeGroups"]}
    for group in groups:
        pool = pools[group["template"]["spec"]["nodeSelector"]["triarch.dev/pool"]]
        gpu = INSTANCES[pool["instanceType"]]["gpu"]
        assert advertised(group) == {f"accelerator_type:{GPUS[gpu]['rayAcceleratorType']}": 1}, group["groupName"]
    serve = yaml.safe_load(service["spec"]["serveConfigV2"])
    for app in serve["applications"]:
        for llm in app["args"]["llm_configs"]:
            wanted = f"accelerator_type:{llm['accelerator_type']}"
            assert any(wanted in advertised(g) for g in groups), (app["name"], wanted)


def test_worker_groups_do_not_change_when_a_model_is_added_or_models_are_reordered(
        shipped: dict[str, StackPlan], tmp_path: Path) -> None:
    before = ray_service(shipped["prod"])["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    config = stack_document("prod")
    config["triarch:models"].reverse()
    config["triarch:models"].append({"name": "coder", "model": "Qwen/Qwen3-8B", "engine": "ray-serve",
                                     "nodeGroup": "a100", "tensorParallelSize": 2, "maxModelLen": 16384})
    after = ray_service(plan_config("prod", config, tmp_path))["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert [g["groupName"] for g in after] == [g["groupName"] for g in before]
    for old, new in zip(before, after, strict=True):
        assert new["template"] == old["template"], old["groupName"]
        assert new["rayStartParams"] == old["rayStartParams"]
    # The new model only raises its group's replica bounds.
    [a100_before] = [g for g in before if g["groupName"] == "a100-2gpu"]
    [a100_after] = [g for g in after if g["groupName"] == "a100-2gpu"]
    assert (a100_after["minReplicas"], a100_after["maxReplicas"]) == (a100_before["minReplicas"] + 1,
                                                                      a100_before["maxReplicas"] + 1)
