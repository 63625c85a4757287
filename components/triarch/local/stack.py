"""The cluster a stack expects, as a local plane gives it: its pools as kwok nodes labelled and tainted as the
real ones (Triarch's pool labels, GPU feature discovery's product and driver labels, a zone), advertising the pool's
GPUs, plus CPU nodes for everything else; the CRDs of the components it says the cluster runs; its storage classes,
namespaces, kubeconfig path and context. Pure: manifests as plain dicts."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from triarch import refdata
from triarch.catalog import Catalog, catalog
from triarch.catalog import charts as pinned_charts
from triarch.config import StackConfig, driver_of
from triarch.cost import price_table
from triarch.local.crds import CRD_SETS, crd_files, existing_crd_sets
from triarch.local.mirror import MirrorError, read_archive
from triarch.local.plane import MIRROR_ADDRESS, MIRROR_PATH, STORAGE_CLASS, PlaneError, PlaneSpec
from triarch.planners.models import plan_models
from triarch.planners.nodegroups import PoolPlan, plan_eks_pool, plan_pool
from triarch.planners.objects import plan_kubernetes
from triarch.planners.registry import crd_sources
from triarch.planners.serving import EFS_STORAGE_CLASS
from triarch.scheduling import GPU_RESOURCE, POOL_LABEL, SYSTEM_POOL

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
"""kwok manages (heartbeats, runs the pods of) the nodes that carry this annotation."""
KWOK_MANAGED = "fake"
ZONE_LABEL = "topology.kubernetes.io/zone"
ZONES = ("lab-a", "lab-b", "lab-c")
"""The zones of an adopted stack's nodes where its pool declares none: three, so a spread shows."""
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_DRIVER = "nvidia.com/cuda.driver-version.full"
SYSTEM_NODES = 2
SYSTEM_SHAPE = {"cpu": "8", "memory": "32Gi"}
GPU_NODE_CPU_PER_GPU = 24
GPU_NODE_MEMORY_GIB_PER_GPU = 128
"""A GPU node's CPU and memory where the stack names no instance type (existing nodes): a p4d/p5 has 12-24
vCPUs and 144-256 GiB per GPU, a g6 4-24 vCPUs and 16-96 GiB, so these fit a serving pod's requests."""


def node(name: str, labels: dict[str, str], taints: list[dict[str, str]], capacity: dict[str, str]
         ) -> dict[str, Any]:
    """A kwok node: kwok keeps the labels, taints and capacity given here and reports the node Ready."""
    full = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "500Gi", **capacity}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {KWOK_ANNOTATION: KWOK_MANAGED},
                     "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                "kubernetes.io/arch": "amd64", "type": "kwok", **labels}},
        "spec": {"taints": taints} if taints else {},
        "status": {"capacity": full, "allocatable": full,
                   "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "fake",
                                "kubeProxyVersion": "fake"}},
    }


def _gpu_node(name: str, pool: PoolPlan, zone: str, driver: str, cpu: int, memory_gib: int) -> dict[str, Any]:
    labels = {**pool.labels, ZONE_LABEL: zone, GFD_PRODUCT: pool.gpu.product.replace(" ", "-"),
              GFD_DRIVER: driver, "nvidia.com/gpu.count": str(pool.gpus_per_node)}
    capacity = {"cpu": str(cpu), "memory": f"{memory_gib}Gi", GPU_RESOURCE: str(pool.schedulable_gpus_per_node)}
    return node(name, labels, pool.taints, capacity)


def plane_nodes(stack: StackConfig, facts: Catalog, from_zero: bool = False) -> list[dict[str, Any]]:
    """Every node the stack expects: an adopted stack's named nodes in three zones; a created stack's pools at
    their max, over the pool's zones, and its system nodes. From zero, the Karpenter pools have none (Karpenter
    launches them)."""
    nodes: list[dict[str, Any]] = []
    if stack.cluster.create:
        cluster_zones = stack.cluster.zones
        for i in range(stack.cluster.system_node_group.min):
            nodes.append(node(f"system-{i}", {POOL_LABEL: SYSTEM_POOL,
                                              ZONE_LABEL: cluster_zones[i % len(cluster_zones)]}, [],
                              SYSTEM_SHAPE))
        for group in stack.node_groups:
            plan = plan_eks_pool(stack, group, facts)
            if from_zero and plan.provisioner == "karpenter":
                continue
            for i in range(plan.max):
                nodes.append(_gpu_node(f"{group.name}-{i}", plan.pool, plan.zones[i % len(plan.zones)],
                                       plan.nvidia_driver, plan.vcpus, int(plan.memory_gib)))
        return nodes
    for i in range(SYSTEM_NODES):
        nodes.append(node(f"system-{i}", {ZONE_LABEL: ZONES[i % len(ZONES)]}, [], SYSTEM_SHAPE))
    for group in stack.node_groups:
        pool = plan_pool(stack, group, facts)
        zones = pool.zones or ZONES
        for i, name in enumerate(group.nodes):
            nodes.append(_gpu_node(name, pool, zones[i % len(zones)], driver_of(group, facts),
                                   GPU_NODE_CPU_PER_GPU * pool.gpus_per_node,
                                   GPU_NODE_MEMORY_GIB_PER_GPU * pool.gpus_per_node))
    return nodes


def instance_types(stack: StackConfig, facts: Catalog) -> list[dict[str, Any]]:
    """Every instance type Triarch knows a price for in the stack's region, offered in each of its zones, in the
    form Karpenter's kwok provider parses (its kwok/cloudprovider InstanceTypeOptions: an offering is a price and
    node-selector requirements). Capacity types both; the list prices have no spot rows, so spot is offered at the
    on-demand price: the simulation compares types, it bills nothing."""
    region, zones = stack.aws_region, stack.cluster.zones
    offered = []
    for name, instance in sorted(facts.instances.items()):
        price = price_table().instance(region, name)
        if price is None:
            continue
        resources = {"cpu": str(instance.vcpus), "memory": f"{instance.memory_gib:g}Gi", "pods": "110",
                     "ephemeral-storage": "500Gi"}
        if instance.gpus:
            resources[GPU_RESOURCE] = str(instance.gpus)
        offered.append({"name": name, "architecture": "amd64", "operatingSystems": ["linux"], "resources": resources,
                        "offerings": [{"Price": price.hourly_usd, "Available": True, "Requirements": [
                            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": [capacity]},
                            {"key": ZONE_LABEL, "operator": "In", "values": [zone]}]}
                            for zone in zones for capacity in ("on-demand", "spot")]})
    return offered


def on_kwok(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A created stack's NodePools for Karpenter's kwok provider: each EC2NodeClass becomes a KWOKNodeClass of the
    same name, and each NodePool's nodeClassRef points at it; everything else about the pool is the plan's."""
    found = []
    for manifest in manifests:
        if manifest["kind"] == "EC2NodeClass":
            found.append({"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass",
                          "metadata": {"name": manifest["metadata"]["name"]}})
        elif manifest["kind"] == "NodePool":
            pool = copy.deepcopy(manifest)
            ref = pool["spec"]["template"]["spec"]["nodeClassRef"]
            pool["spec"]["template"]["spec"]["nodeClassRef"] = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass",
                                                                "name": ref["name"]}
            found.append(pool)
    return found


MIRROR_CHARTS = f"oci://{MIRROR_ADDRESS}/{MIRROR_PATH}"
MIRROR_FILES = f"https://{MIRROR_ADDRESS}/files/"


CRDS_BESIDE_CHART = {"llm-d-router-standalone": "gateway-api-inference-extension-v1.6.0"}
"""Charts that ship no crds/ for an API they render, and the reference directory of that API's release: the
standalone endpoint picker renders an InferencePool (the Gateway API Inference Extension's CRD, v1.6.0)."""


def chart_mirror(stack: StackConfig, chart_dirs: list[Path]) -> tuple[tuple[Path, ...], dict[str, bytes]]:
    """What the plane's mirror serves for a stack that pulls from it (triarch:registry.charts at
    oci://127.0.0.1:5000/charts): every chart archive of the first directory given, else of the reference cache;
    and under /files/ each CRD file the stack takes apart from its chart, as the chart packages it in crds/.
    Nothing for a stack that pulls elsewhere."""
    given = stack.registry.charts
    if not (isinstance(given, str) and given.rstrip("/") == MIRROR_CHARTS):
        return (), {}
    missing = [directory for directory in chart_dirs if not directory.is_dir()]
    if missing:
        raise PlaneError(f"--charts {missing[0]}: no such directory")
    try:
        source = chart_dirs[0] if chart_dirs else refdata.directory("charts")
    except refdata.ReferenceMissing as absent:
        raise PlaneError(f"{absent} (or give the archives with --charts DIR)") from None
    archives = tuple(sorted(source.glob("*.tgz")))
    if not archives:
        raise PlaneError(f"no chart archive (*.tgz) in {source}: the stack pulls every chart from the plane's mirror")
    try:
        read = {chart.name: chart for chart in map(read_archive, archives)}
    except MirrorError as error:
        raise PlaneError(str(error)) from None
    files: dict[str, bytes] = {}
    for name in sorted(pinned_charts()):
        for each in crd_sources(name, stack):
            if not each.url.startswith(MIRROR_FILES):
                continue
            data = read[name].file(f"crds/{each.file}") if name in read else None
            if data is None and name in CRDS_BESIDE_CHART:
                try:  # the reference cache holds it to the sha256 charts.yaml pins
                    data = refdata.path(f"{CRDS_BESIDE_CHART[name]}/{each.file}").read_bytes()
                except refdata.ReferenceMissing as absent:
                    raise PlaneError(str(absent)) from None
            if data is None:
                raise PlaneError(f"the chart {name} in {source} has no crds/{each.file}, which the stack takes from "
                                 f"{each.url}")
            files[each.url.removeprefix(MIRROR_FILES)] = data
    return archives, files


def spec_for_stack(name: str, stack: StackConfig, references: list[Path], all_crds: bool = False,
                   from_zero: bool = False, chart_dirs: list[Path] | None = None) -> PlaneSpec:
    """The plane an adopted stack's kubeconfig and context name (a created stack gets a context of its own). From
    zero (a created stack whose pools Karpenter scales), the GPU pools start empty and Karpenter's kwok provider
    runs, offering the instance types Triarch knows."""
    cluster = stack.cluster
    if from_zero and not (cluster.create and cluster.provisioner == "karpenter"):
        raise PlaneError("--from-zero needs a stack whose cluster Triarch creates with Karpenter "
                         "(triarch:cluster.create: true, nodeProvisioner karpenter), e.g. --stack prod")
    classes = [STORAGE_CLASS]
    wanted = stack.serving.storage_class or (EFS_STORAGE_CLASS if cluster.create else None)
    if wanted and wanted not in classes:
        classes.append(wanted)
    copy = Path(cluster.kubeconfig_path) if not cluster.create and cluster.kubeconfig else None
    sets = list(CRD_SETS) if all_crds else existing_crd_sets(stack) + (["karpenter"] if from_zero else [])
    archives, files = chart_mirror(stack, chart_dirs or [])
    operators = tuple(name for name, runs in (
        ("kuberay", stack.kuberay.mode == "existing" and any(m.engine == "ray-serve" for m in stack.models)),
        ("keda", stack.observability.keda == "existing"),
        # a vllm model with stages may span nodes (the tuner says whether): a LeaderWorkerSet needs its controller
        ("lws", stack.leader_worker_set.mode == "existing" and any(
            m.engine == "vllm" and (m.pipeline_parallel_size or 1) > 1 for m in stack.models)),
        # In place of the pods of the charts the stack installs from the plane's mirror, once Helm installed them:
        ("kuberay-chart", bool(archives) and stack.kuberay.mode == "install"
         and any(m.engine == "ray-serve" for m in stack.models)),
        ("keda-chart", bool(archives) and stack.observability.keda == "install"),
        ("lws-chart", bool(archives) and stack.leader_worker_set.mode == "install" and any(
            m.engine == "vllm" and (m.pipeline_parallel_size or 1) > 1 for m in stack.models))) if runs)
    return PlaneSpec(
        name=name,
        context=cluster.context or f"triarch-{name}",
        nodes=plane_nodes(stack, catalog(), from_zero),
        crds=crd_files(sets, references),
        storage_classes=tuple(classes),
        namespaces=(stack.observability.namespace,) if stack.prometheus == "existing" else (),
        operators=(*operators, "karpenter") if from_zero else operators,
        instance_types=instance_types(stack, catalog()) if from_zero else [],
        objects=on_kwok([m for pool in plan_kubernetes(stack, plan_models(stack, catalog()), catalog())
                         .node_pools.values() for m in pool]) if from_zero else [],
        kubeconfig_copy=copy,
        charts=archives,
        files=files,
    )
