"""Where, for the pools: the GPU nodes a stack declares (EKS node groups, Karpenter NodePools) carry the labels and
taint workloads rely on, pin a driver that runs every image scheduled there, and can hold what is placed on them
(the placement proof of triarch.guardrails.placement)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from triarch.catalog import catalog
from triarch.guardrails.base import Config, Resource, StackCheck, rule, stack_rule
from triarch.guardrails.common import NODE_CLASS, NODE_POOL, gpu_templates
from triarch.guardrails.placement import prove
from triarch.guardrails.workloads import PodTemplate, kind_of, name_of, required_node_terms
from triarch.images import IMAGE_RELEASE
from triarch.known import KNOWN_AFTER_APPLY as UNKNOWN
from triarch.matrix import Node, check_image_on_node
from triarch.scheduling import GPU_LABEL, GPU_PRESENT_LABEL, GPU_TAINT_EFFECT, GPU_TAINT_KEY, POOL_LABEL

GPU_REQUIREMENT_KEYS = ("karpenter.k8s.aws/instance-gpu-count", "karpenter.k8s.aws/instance-gpu-name",
                        "karpenter.k8s.aws/instance-gpu-manufacturer", "karpenter.k8s.aws/instance-gpu-memory")
"""Karpenter requirement keys that only GPU instance types satisfy (unless the operator is DoesNotExist)."""


def _gpu_node_group(props: Mapping[str, Any]) -> bool:
    """A GPU AMI type, or an instance type the catalog knows to carry GPUs."""
    ami_type = str(props.get("amiType", ""))
    if "NVIDIA" in ami_type or "GPU" in ami_type:
        return True
    instances = catalog().instances
    return any((instances[t].gpus if t in instances else 0) > 0 for t in props.get("instanceTypes") or [])


def _node_pool_template(props: Mapping[str, Any]) -> Mapping[str, Any]:
    return ((props.get("spec") or {}).get("template") or {})


def _requirements(props: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((_node_pool_template(props).get("spec") or {}).get("requirements") or [])


def _gpu_node_pool(props: Mapping[str, Any]) -> bool:
    """A NodePool whose instance types all carry GPUs, or that asks for GPU instances by Karpenter's labels."""
    instances = catalog().instances
    for requirement in _requirements(props):
        key, operator = requirement.get("key"), requirement.get("operator")
        values = [str(v) for v in requirement.get("values") or []]
        if key in GPU_REQUIREMENT_KEYS and operator != "DoesNotExist":
            return True
        if key == "node.kubernetes.io/instance-type" and operator == "In":
            known = [instances[v] for v in values if v in instances]
            if known and all(i.gpus > 0 for i in known):
                return True
    return False


def _missing_gpu_labels(where: str, labels: Mapping[str, Any]) -> list[str]:
    missing = [key for key in (POOL_LABEL, GPU_LABEL, GPU_PRESENT_LABEL) if key not in labels]
    return [f"{where}: missing labels {missing}; set them on its nodes"] if missing else []


def nodegroup_labels(resource: Resource, config: Config) -> list[str]:
    if resource.type == "aws:eks/nodeGroup:NodeGroup" and _gpu_node_group(resource.props):
        where = f"node group {resource.name}"
        messages = _missing_gpu_labels(where, resource.props.get("labels") or {})
        taints = resource.props.get("taints") or []
        if not any(t.get("key") == GPU_TAINT_KEY and t.get("effect") == "NO_SCHEDULE" for t in taints):
            messages.append(f"{where}: no {GPU_TAINT_KEY} NO_SCHEDULE taint; add it")
        return messages
    if kind_of(resource.type) == NODE_POOL and _gpu_node_pool(resource.props):
        template = _node_pool_template(resource.props)
        where = f"NodePool {name_of(resource.props, resource.name)}"
        messages = _missing_gpu_labels(where, (template.get("metadata") or {}).get("labels") or {})
        taints = (template.get("spec") or {}).get("taints") or []
        if not any(t.get("key") == GPU_TAINT_KEY and t.get("effect") == GPU_TAINT_EFFECT for t in taints):
            messages.append(f"{where}: no {GPU_TAINT_KEY} {GPU_TAINT_EFFECT} taint in its template; add it")
        return messages
    return []


GPU_NODEGROUP_LABELS_TAINT = rule(
    "gpu-nodegroup-labels-taint", "Kubernetes",
    "GPU pools (EKS node groups, Karpenter NodePools) carry the pool labels workloads select and the GPU taint "
    "that keeps other pods off; without them GPU pods stay Pending or CPU pods fill the GPU nodes.",
    nodegroup_labels)


AMI_ALIAS = re.compile(r"^al2023@(?P<release>.+)$")


ARCH_AMI_TYPES = {"amd64": "AL2023_x86_64_NVIDIA", "arm64": "AL2023_ARM_64_NVIDIA"}


def _node_pool_nodes(resources: list[Resource]) -> tuple[dict[str, Node], list[tuple[Resource, str]]]:
    """GPU pools as Karpenter brings them up: the NodePool's labels, and the AMI release its EC2NodeClass pins
    by alias (`al2023@v20260714`), whose NVIDIA variant the node boots on a GPU instance."""
    facts = catalog()
    classes = {name_of(r.props, r.name): r for r in resources if kind_of(r.type) == NODE_CLASS}
    nodes: dict[str, Node] = {}
    problems: list[tuple[Resource, str]] = []
    for r in resources:
        if kind_of(r.type) != NODE_POOL:
            continue
        template = _node_pool_template(r.props)
        labels = (template.get("metadata") or {}).get("labels") or {}
        pool, gpu = labels.get(POOL_LABEL), labels.get(GPU_LABEL)
        if not pool or gpu not in facts.gpus:
            continue
        class_name = ((template.get("spec") or {}).get("nodeClassRef") or {}).get("name")
        node_class = classes.get(str(class_name))
        if node_class is None:
            continue  # a class the stack does not define: nothing to read the AMI from
        where = f"NodePool {name_of(r.props, r.name)}"
        terms = (node_class.props.get("spec") or {}).get("amiSelectorTerms") or []
        aliases = [str(t["alias"]) for t in terms if t.get("alias")]
        match = AMI_ALIAS.match(aliases[0]) if len(aliases) == 1 else None
        arch = next((str(v) for q in _requirements(r.props) if q.get("key") == "kubernetes.io/arch"
                     for v in q.get("values") or []), "amd64")
        release = facts.amis.get(ARCH_AMI_TYPES.get(arch, ""), {}).get(match["release"]) if match else None
        if release is None:
            shown = ", ".join(aliases) or "AMI selector terms without an alias"
            problems.append((r, f"{where}: EC2NodeClass {class_name} selects {shown}, not an al2023@<release> of "
                                "templates/compat/amis.yaml, so the NVIDIA driver its nodes boot is unknown; pin "
                                "amiSelectorTerms to one alias al2023@<known release>"))
            continue
        nodes[pool] = Node(pool, facts.gpus[gpu], release.nvidia_driver, f"pins AMI release {release.release}")
    return nodes, problems


def _pool_nodes(resources: list[Resource]) -> tuple[dict[str, Node], list[tuple[Resource, str]]]:
    facts = catalog()
    nodes, problems = _node_pool_nodes(resources)
    for r in resources:
        if r.type != "aws:eks/nodeGroup:NodeGroup":
            continue
        labels = r.props.get("labels") or {}
        pool, gpu = labels.get(POOL_LABEL), labels.get(GPU_LABEL)
        if not pool or gpu not in facts.gpus:
            continue
        ami_type, version = r.props.get("amiType"), r.props.get("releaseVersion")
        release = next((a for a in facts.amis.get(str(ami_type), {}).values()
                        if version in a.release_versions.values()), None)
        if release is None:
            problems.append((r, f"node group {r.name}: AMI {ami_type} release {version} is not in "
                                "templates/compat/amis.yaml, so its NVIDIA driver is unknown; pin a known release"))
            continue
        nodes[pool] = Node(pool, facts.gpus[gpu], release.nvidia_driver, f"pins AMI release {release.release}")
    return nodes, problems


def driver_cuda(resources: list[Resource], config: Config) -> list[tuple[Resource, str]]:
    nodes, found = _pool_nodes(resources)
    for r in resources:
        for template in gpu_templates(r):
            for pool in _selected_pools(template.spec, nodes):
                found += _images_on_pool(r, template, nodes[pool])
    return found


DRIVER_CUDA_COMPATIBLE = stack_rule(
    "driver-cuda-compatible", "Kubernetes",
    "A node driver older than the CUDA inside the serving image fails at start (cudaGetDeviceCount errors): "
    "every image scheduled on a GPU pool must run on that pool's pinned driver.",
    driver_cuda)


def _selected_pools(pod: Mapping[str, Any], nodes: Mapping[str, Node]) -> list[str]:
    """The pools a pod can land on, by the pool or GPU label, in its nodeSelector or required node affinity."""
    def matching(key: str, values: set[str]) -> set[str]:
        if key == POOL_LABEL:
            return values & set(nodes)
        if key == GPU_LABEL:
            return {name for name, node in nodes.items() if node.gpu.key in values}
        return set()

    pools: set[str] | None = None
    for key, value in (pod.get("nodeSelector") or {}).items():
        chosen = matching(key, {str(value)})
        if key in (POOL_LABEL, GPU_LABEL):
            pools = chosen if pools is None else pools & chosen
    for term in required_node_terms(pod):
        for expression in term.get("matchExpressions") or []:
            if expression.get("operator") == "In" and expression.get("key") in (POOL_LABEL, GPU_LABEL):
                chosen = matching(expression["key"], {str(v) for v in expression.get("values") or []})
                pools = chosen if pools is None else pools | chosen
    return sorted(pools or [])


def _images_on_pool(r: Resource, template: PodTemplate, node: Node) -> list[tuple[Resource, str]]:
    facts = catalog()
    found = []
    declared = ((r.props.get("metadata") or {}).get("annotations") or {}).get(IMAGE_RELEASE)
    for c in template.spec.get("containers") or []:
        image_ref = str(declared or c.get("image") or "")
        if image_ref == UNKNOWN:  # another resource's output at preview: judged at `pulumi up` (guardrails.unknowns)
            continue
        image = facts.image(image_ref)
        if image is None:
            found.append((r, f"{template.where}: image {image_ref} is not in templates/compat/images.yaml, so its "
                             "CUDA version is unknown; add it with its CUDA version and source"))
            continue
        verdict = check_image_on_node(image, node, facts)
        if verdict.level == "error":
            found.append((r, f"{template.where}: {verdict.message}"))
    return found


def _placement_rule(rule_id: str) -> StackCheck:
    def check(resources: list[Resource], config: Config) -> list[tuple[Resource, str]]:
        by_urn = {r.urn: r for r in resources}
        return [(by_urn.get(f.urn) or Resource(f.resource_type, f.resource_name, {}, f.urn), f.message)
                for f in prove(resources).findings if f.rule == rule_id]
    return check


POD_PLACEMENT = stack_rule(
    "pod-placement", "Kubernetes",
    "Every pod template can run somewhere: some pool's nodes match its node selector and affinity, it tolerates "
    "their taints, and one pod fits a node's allocatable CPU, memory and GPUs after the kubelet's reserve and the "
    "DaemonSets there. Otherwise its pods stay Pending for ever.",
    _placement_rule("pod-placement"))

POOL_CAPACITY = stack_rule(
    "pool-capacity", "Kubernetes",
    "At their largest (maximum replicas, a rollout's surge, a RayService upgrade's second cluster) a pool's "
    "workloads fit its maximum node count, and a hard zone spread can be met with the pool's zones and nodes.",
    _placement_rule("pool-capacity"))

POOL_SCALE_FROM_ZERO = stack_rule(
    "pool-scale-from-zero", "Kubernetes",
    "A pool that may have no node needs something that adds one when a pod is pending (a Karpenter NodePool); "
    "a managed node group at zero stays at zero.",
    _placement_rule("pool-scale-from-zero"))
