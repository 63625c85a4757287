"""What a change does to running traffic, beyond which resources change: the controllers' reactions that the
resource tables do not show. A renamed cluster takes every Kubernetes object to a new one. KubeRay starts a whole
new Ray cluster when the cluster's spec changes (every Ray Serve model restarts there), Karpenter replaces the
nodes of a pool whose template drifts or whose AMI alias follows an upgraded control plane, EKS rolls a managed
node group, a workload whose pod template changes (an image bump) replaces every pod, clients lose a Service
name or a Ray Serve route, and Pulumi deletes last, so a model's old replicas
hold their GPUs while its new ones start; Ray Serve, told a new serveConfigV2, starts the new applications as it
stops the removed ones, within its worker groups' maxReplicas, and restarts a model whose prefix-aware routing turns
on or off. Pure: the diff, both plans and both capacity
reports in, sentences out."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from triarch.diff import Diff, Difference
from triarch.engine_changes import serve_applications
from triarch.planners import repair
from triarch.planners.adapters import adapter_effects
from triarch.planners.kv_offload import offload_effects
from triarch.scheduling import CAPACITY_TYPE_LABEL
from triarch.service_rules import claim_growth_notes

RAY_SERVICE = "kubernetes:ray.io/v1:RayService"
NODE_POOL = "kubernetes:karpenter.sh/v1:NodePool"
NODE_CLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
SERVICE = "kubernetes:core/v1:Service"
CLUSTER = "aws:eks/cluster:Cluster"
MOVED = re.compile(r"^its provider changes to another target \((\S+) -> (\S+)\)")
"""A Kubernetes resource whose provider now targets another cluster (triarch.diff): created there, deleted here."""
OUTSIDE_CLUSTER_HASH = re.compile(
    r"^spec\.rayClusterConfig\.(workerGroupSpecs\[\d+\]\.(replicas|minReplicas|maxReplicas)$"
    r"|(headGroupSpec|workerGroupSpecs\[\d+\])\.template\.spec\.(tolerations|schedulingGates)(\[|\.|$))")
"""The cluster fields KubeRay leaves out of a RayService's cluster hash: worker counts, and the pod templates'
tolerations and scheduling gates (ray-operator controllers/ray/utils/util.go,
GenerateHashWithoutReplicasAndWorkersToDelete, 1.6.2 and 1.7.0 alike). A change of only these starts no new Ray
cluster, and is not applied to the running one either (rayservice_controller.go, shouldUpdateCluster: equal hashes,
nothing to update): it takes effect with the next new cluster. Any other change of the cluster's spec makes KubeRay
start a new Ray cluster and switch to it once it serves (its zero-downtime upgrade)."""
POD_TEMPLATES = {
    "kubernetes:apps/v1:Deployment": ("spec.template",),
    "kubernetes:apps/v1:StatefulSet": ("spec.template",),
    "kubernetes:apps/v1:DaemonSet": ("spec.template",),
    "kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet": ("spec.leaderWorkerTemplate.leaderTemplate",
                                                              "spec.leaderWorkerTemplate.workerTemplate"),
}
"""Where each workload keeps its pods' template: a change there (an image, an arg, a label) makes the controller
replace every pod, as a rolling update (Kubernetes docs, Deployments: "A Deployment's rollout is triggered if and
only if the Deployment's Pod template (that is, .spec.template) is changed"; LeaderWorkerSet v0.10.0 rolls whole
groups on a change of either template)."""
IMAGE = re.compile(r"\.(containers|initContainers)\[\d+\]\.image$")
NODE_GROUP_ROLL = ("launchTemplate", "releaseVersion", "version", "amiType", "instanceTypes")
"""Managed node group inputs EKS applies by replacing the group's nodes one by one (an update, not a new group)."""


def _new_ray_cluster(difference: Difference) -> list[str]:
    """The RayService inputs whose change makes KubeRay start a new Ray cluster."""
    return [p for p in difference.inputs
            if p.startswith("spec.rayClusterConfig") and not OUTSIDE_CLUSTER_HASH.match(p)]


def _shown(paths: list[str]) -> str:
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


def _ray_effects(difference: Difference) -> list[str]:
    cluster = [p for p in difference.inputs if p.startswith("spec.rayClusterConfig")]
    new_cluster = _new_ray_cluster(difference)
    if new_cluster:
        return [f"RayService {difference.name}: KubeRay starts a new Ray cluster beside the running one and moves "
                f"traffic once it serves; every Ray Serve model restarts there (caused by {_shown(new_cluster)})"]
    found = []
    if any(p.startswith("spec.serveConfigV2") for p in difference.inputs):
        found.append(f"RayService {difference.name}: the Serve applications are redeployed on the running Ray "
                     "cluster (serveConfigV2); the changed models' replicas restart, the others keep serving")
    if cluster:
        found.append(f"RayService {difference.name}: KubeRay does not apply {_shown(cluster)} to the running Ray "
                     "cluster (worker counts, tolerations and scheduling gates alone start no new cluster and update "
                     "none): the Ray autoscaler keeps the old bounds until a change that starts a new cluster")
    return found


PREFIX_ROUTERS = (".PrefixCacheAffinityRouter", ".ResilientPrefixRouter")
"""How a Serve application's LLMConfig names a prefix-aware router: Ray Serve LLM's, as stacks deployed before
Triarch shipped its own did, or Triarch's (planners/ray.py, PREFIX_ROUTER)."""


def _prefix_routed(plan: Mapping[str, Any]) -> dict[str, dict[str, bool]]:
    """RayService (its resource name) -> {Serve application: whether its deployment routes by prefix}."""
    found: dict[str, dict[str, bool]] = {}
    for resource in plan["resources"]:
        apps = serve_applications(resource) if resource["type"] == RAY_SERVICE else None
        if apps is None:
            continue
        found[str(resource["name"])] = {
            str(app.get("name")): any(
                str(((llm.get("deployment_config") or {}).get("request_router_config") or {}).get(
                    "request_router_class", "")).endswith(PREFIX_ROUTERS)
                for llm in _app_llm_configs(app))
            for app in apps}
    return found


PD_BUILDER = ":build_pd_openai_app"
"""How a Serve application names Ray Serve LLM's P/D builder (planners/ray.py)."""


def _app_llm_configs(app: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """An application's LLMConfigs: its models (build_openai_app), or its two roles (build_pd_openai_app)."""
    args = app.get("args") or {}
    roles = [args.get(key) for key in ("prefill_config", "decode_config")]
    return [*(args.get("llm_configs") or []), *(r for r in roles if isinstance(r, Mapping))]


def _split_apps(plan: Mapping[str, Any]) -> dict[str, dict[str, bool]]:
    """RayService (its resource name) -> {Serve application: whether it is a P/D application}."""
    found: dict[str, dict[str, bool]] = {}
    for resource in plan["resources"]:
        apps = serve_applications(resource) if resource["type"] == RAY_SERVICE else None
        if apps is not None:
            found[str(resource["name"])] = {str(app.get("name")): str(app.get("import_path", "")).endswith(PD_BUILDER)
                                            for app in apps}
    return found


def _split_changes(base: Mapping[str, Any], head: Mapping[str, Any]) -> dict[str, tuple[list[str], list[str]]]:
    """RayService -> (applications the split turns on for, off for), of the applications in both plans."""
    after = _split_apps(head)
    found = {}
    for service, apps in sorted(_split_apps(base).items()):
        kept = {app: split for app, split in apps.items() if app in after.get(service, {})}
        on = sorted(app for app, split in kept.items() if not split and after[service][app])
        off = sorted(app for app, split in kept.items() if split and not after[service][app])
        if on or off:
            found[service] = (on, off)
    return found


def _split_effects(base: Mapping[str, Any], head: Mapping[str, Any], new_clusters: set[str]) -> list[str]:
    """The prefill/decode split turned on or off for a model that stays. Its application's builder changes
    (build_openai_app <-> build_pd_openai_app), and with it the deployments: LLMServer:<model> against
    Prefill:<model> and Decode:<model> (Ray 2.60 core/server/builder.py name_prefix, prefill_decode/builder.py).
    Serve deletes a deployment the new target lacks in the same step it deploys the new ones (ray 2.60
    serve/_private/application_state.py, "Delete outdated deployments"), without waiting for them to serve."""
    found = []
    for service, (on, off) in _split_changes(base, head).items():
        what = _turned(on, off)
        if service in new_clusters:
            found.append(f"RayService {service}: the prefill/decode split {what} on the new Ray cluster, where every "
                         "model starts anyway")
            continue
        found.append(f"RayService {service}: the prefill/decode split {what}: the application's deployments are "
                     "replaced (LLMServer:<model> by Prefill:<model> and Decode:<model>, or back), and Ray Serve "
                     "stops the old ones as it starts the new, each old replica finishing its requests first: the "
                     "model answers nothing until the new replicas have loaded it (its cold start), and its requests "
                     "in the meantime fail or wait in the proxy")
    return found


def _turned(on: list[str], off: list[str]) -> str:
    """'turns on for a, b and turns off for c': what a switch did to which models."""
    return " and ".join(f"turns {way} for {', '.join(names)}" for way, names in (("on", on), ("off", off)) if names)


def _routing_effects(base: Mapping[str, Any], head: Mapping[str, Any], new_clusters: set[str]) -> list[str]:
    """Prefix-aware routing turned on or off for a model that stays. The router is part of the model's LLMConfig,
    the application's `args`, which Ray Serve hashes into the application's code version (ray 2.60,
    serve/_private/deploy_utils.py get_app_code_version): a new version rebuilds the application and restarts its
    replicas (version.py requires_actor_restart), max(1, 20%) of the target at a time (deployment_state.py,
    rolling_update_percentage 0.2) and each stopped before its replacement starts (max_surge_percent 0, config.py)."""
    found = []
    after = _prefix_routed(head)
    split = _split_changes(base, head)
    for service, apps in sorted(_prefix_routed(base).items()):
        # an application the split turns on or off is replaced whole: said once, by _split_effects
        moved = {app for changed in split.get(service, ([], [])) for app in changed}
        kept = {app: routed for app, routed in apps.items() if app in after.get(service, {}) and app not in moved}
        on = sorted(app for app, routed in kept.items() if not routed and after[service][app])
        off = sorted(app for app, routed in kept.items() if routed and not after[service][app])
        if not on and not off:
            continue
        what = _turned(on, off)
        if service in new_clusters:
            found.append(f"RayService {service}: prefix-aware routing {what} on the new Ray cluster, where every "
                         "model starts anyway")
            continue
        found.append(f"RayService {service}: prefix-aware routing {what}: a new LLMConfig, so Ray Serve rebuilds "
                     "the application and restarts its replicas, a fifth at a time (at least one), each stopped "
                     "before its replacement starts: fewer replicas serve until it ends (a one-replica model none), "
                     "and each new replica's prefix cache starts empty")
    return found


RESERVATION_TERMS = "spec.capacityReservationSelectorTerms"
"""An EC2NodeClass's reservation terms: outside its drift hash (karpenter-provider-aws v1.14.1,
pkg/apis/v1/ec2nodeclass.go, `hash:"ignore"`), so a change drifts only the nodes whose reservation it drops
(pkg/cloudprovider/drift.go, isCapacityReservationDrifted: CapacityReservationDrift)."""
REQUIREMENT = re.compile(r"^spec\.template\.spec\.requirements\[(\d+)\]")


def _drifting(difference: Difference, head: Mapping[str, Any]) -> list[str]:
    """The changed inputs that drift every node of a pool: not its reservation terms, nor its NodePool's
    karpenter.sh/capacity-type requirement (a NodePool's requirements are outside its drift hash too,
    sigs.k8s.io/karpenter v1.14.1 pkg/apis/v1/nodepool.go; a node drifts only where its own labels leave them,
    nodeclaim/disruption/drift.go areRequirementsDrifted): what those do is said per reservation."""
    inputs: Mapping[str, Any] = next((r["inputs"] for r in head["resources"] if r["urn"] == difference.urn), {})
    requirements = ((((inputs.get("spec") or {}).get("template") or {}).get("spec") or {}).get("requirements") or [])

    def capacity_type(path: str) -> bool:
        match = REQUIREMENT.match(path)
        index = int(match.group(1)) if match else -1
        return 0 <= index < len(requirements) and requirements[index].get("key") == CAPACITY_TYPE_LABEL

    return [p for p in difference.inputs if not p.startswith(RESERVATION_TERMS) and not capacity_type(p)]


def _pool_effects(difference: Difference, head: Mapping[str, Any]) -> list[str]:
    if difference.type in (NODE_POOL, NODE_CLASS) and difference.kind == "changed":
        difference = Difference(difference.kind, difference.type, difference.name, difference.urn,
                                _drifting(difference, head), difference.stateful, difference.cause)
    if difference.type == NODE_POOL and any(p.startswith("spec.template") for p in difference.inputs):
        return [f"NodePool {difference.name}: Karpenter replaces every node of the pool (drift), as its disruption "
                "budget allows; their pods move"]
    if difference.type == NODE_CLASS and any(p.startswith("spec") for p in difference.inputs):
        return [f"EC2NodeClass {difference.name}: Karpenter replaces every node launched with it (drift), as the "
                "NodePool's disruption budget allows; their pods move"]
    if difference.type == NODE_GROUP and difference.kind == "changed" and any(
            p.split(".")[0].split("[")[0] in NODE_GROUP_ROLL for p in difference.inputs):
        return [f"node group {difference.name}: EKS rolls its nodes one by one; their pods move"]
    if difference.type == NODE_GROUP and difference.kind == "replaced":
        return [f"node group {difference.name}: a new group comes up, then the old one drains and goes; every pod "
                "there moves (the Ray heads run on the system nodes)"]
    return []


def _rollout(difference: Difference, head: Mapping[str, Any]) -> list[str]:
    """A workload whose pod template changes replaces every pod (an image bump most often): each new replica
    starts cold, and how many serve meanwhile is the rollout strategy's (read from the head's inputs)."""
    templates = POD_TEMPLATES.get(difference.type, ())
    paths = [p for p in difference.inputs if any(p.startswith(t + ".") for t in templates)]
    if not paths:
        return []
    images = [p for p in paths if IMAGE.search(p)]
    inputs: Mapping[str, Any] = next((r["inputs"] for r in head["resources"] if r["urn"] == difference.urn), {})
    spec = inputs.get("spec") or {}
    group = difference.type.endswith("LeaderWorkerSet")
    rolling = ((spec.get("rolloutStrategy") or {}).get("rollingUpdateConfiguration") if group
               else (spec.get("strategy") or {}).get("rollingUpdate")) or {}
    surge, unavailable = rolling.get("maxSurge"), rolling.get("maxUnavailable")
    unit = "group" if group else "replica"
    if surge is None and unavailable is None:
        how = "as the controller's default rolling update allows"
    elif str(surge) in ("0", "0%"):
        how = (f"maxSurge {surge}, maxUnavailable {unavailable}: each old {unit} stops before its replacement "
               f"starts, so fewer serve until each new one is Ready")
    else:
        how = f"maxSurge {surge}, maxUnavailable {unavailable}: new {unit}s start before old ones stop"
    kind = difference.type.rsplit(":", 1)[-1]
    what = "onto the new image" if images else "with the new pod template"
    return [f"{kind} {difference.name}: every {'pod group' if group else 'pod'} is replaced {what}, one rolling "
            f"update ({how}); each new {unit} starts cold before it serves (caused by {_shown(images or paths)})"]


def _upgrade_drift(result: Diff, head: Mapping[str, Any]) -> list[str]:
    """A control plane upgraded in place: an EC2NodeClass whose AMI is an alias resolves it for the cluster's
    Kubernetes version, so its nodes drift although the class itself does not change (Karpenter FAQ, "How do I
    upgrade an EKS Cluster with Karpenter?": "Karpenter's Drift feature can automatically upgrade the
    Karpenter-provisioned nodes to stay in-sync with the EKS control plane")."""
    if not any(d.type == CLUSTER and d.kind == "changed" and "version" in d.inputs for d in result.differences):
        return []
    changed = {d.name for d in result.differences if d.type == NODE_CLASS}
    return [f"EC2NodeClass {r['name']}: its AMI alias resolves for the new Kubernetes version, so Karpenter replaces "
            "every node launched with it (drift) once the control plane is upgraded; their pods move"
            for r in sorted(head["resources"], key=lambda r: str(r["name"]))
            if r["type"] == NODE_CLASS and r["name"] not in changed
            and any("alias" in term for term in (r["inputs"].get("spec") or {}).get("amiSelectorTerms") or [])]


def _service_names(plan: Mapping[str, Any]) -> set[str]:
    return {str(r["inputs"].get("metadata", {}).get("name")) for r in plan["resources"] if r["type"] == SERVICE}


PICKER_SELECTORS = ("llm-d-router-proxy", "llm-d-router-gateway")
"""The labels a Service selects to send to an endpoint picker's proxies (planners/picker.py): the proxies' own
Deployment, or, as stacks planned before it did, the picker's pod with its sidecar proxy."""


def _service_backends(plan: Mapping[str, Any]) -> dict[str, str | None]:
    """Service name -> the endpoint picker's proxy it sends to, or None where it selects the pods themselves."""
    found: dict[str, str | None] = {}
    for resource in plan["resources"]:
        if resource["type"] != SERVICE:
            continue
        selector = (resource["inputs"].get("spec") or {}).get("selector") or {}
        found[str(resource["inputs"].get("metadata", {}).get("name"))] = next(
            (str(selector[key]) for key in PICKER_SELECTORS if key in selector), None)
    return found


RELEASE = "kubernetes:helm.sh/v3:Release"
PICKER_CHART_SUFFIX = "/llm-d-router-standalone"
PICKER_POD_INPUTS = ("chart", "version", "postrender", "values.router.epp")
"""A picker release's inputs that change its pickers' pod template: the chart and its version (templates, labels),
the post-renderer (the pods' security context and pull Secret), and the pickers' own values."""


def _picker_roll(difference: Difference, head: Mapping[str, Any]) -> list[str]:
    """A picker release whose pickers' pods change: the chart runs them as a Recreate Deployment, so both go before
    the new ones start, and the proxies have no picker to ask until one of those leads."""
    inputs: Mapping[str, Any] = next((r["inputs"] for r in head["resources"] if r["urn"] == difference.urn), {})
    if not str(inputs.get("chart", "")).endswith(PICKER_CHART_SUFFIX):
        return []
    changed = sorted(p for p in difference.inputs
                     if any(p == key or p.startswith((f"{key}.", f"{key}[")) for key in PICKER_POD_INPUTS))
    if not changed:
        return []
    return [f"Helm release {inputs.get('name', difference.name)}: its endpoint pickers' pods are replaced both at "
            f"once (the chart's Deployment is Recreate; caused by {', '.join(changed)}): requests through the model's "
            "proxies fail until a new picker leads"]


def _picker_effects(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[str]:
    """A vllm model's Service moving to its endpoint picker's proxies (prefixRouting on), back (off), or from a
    picker's sidecar proxy to proxies of their own."""
    before, after = _service_backends(base), _service_backends(head)
    found = []
    for name in sorted(set(before) & set(after)):
        old, new = before[name], after[name]
        if old is None and new is not None:
            found.append(f"Service {name}: its backends move from the vLLM pods to the endpoint picker's proxies "
                         f"({new}): open connections stay on their pod, new ones go through a proxy, which sends "
                         "each request to the pod the picker chose by its prompt's start; four more pods (two "
                         "pickers, one leading, and two proxies) run beside the add-ons")
        elif old is not None and new is None:
            found.append(f"Service {name}: its backends move from the endpoint picker's proxies ({old}) back to the "
                         "vLLM pods, connections spread over them without regard to their prefix caches; the "
                         "picker's pods are removed")
        elif old is not None and new is not None and old != new:
            found.append(f"Service {name}: its backends move from the endpoint picker's pod and its sidecar proxy "
                         f"({old}) to two proxies of their own ({new}), and a second picker waits to lead: the "
                         "picker's release upgrades and its old pod goes (Recreate): requests fail until the new "
                         "proxies are ready and a picker leads")
    return found


def _serve_routes(plan: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """RayService (its metadata name) -> {Serve application: its route prefix}, from serveConfigV2."""
    found: dict[str, dict[str, str]] = {}
    for resource in plan["resources"]:
        if resource["type"] != RAY_SERVICE:
            continue
        apps = serve_applications(resource)
        if apps is None:
            continue
        name = str((resource["inputs"].get("metadata") or {}).get("name", resource["name"]))
        found[name] = {str(app.get("name")): str(app.get("route_prefix", "/")) for app in apps}
    return found


def _serve_clients(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[str]:
    """A Ray Serve application renamed or removed: its route (and the model id, the same name) goes for clients."""
    found = []
    after = _serve_routes(head)
    for service, apps in sorted(_serve_routes(base).items()):
        if service not in after:
            continue
        gone = sorted(set(apps) - set(after[service]))
        if gone:
            came = sorted(set(after[service]) - set(apps))
            shown = ", ".join(f"{a} ({apps[a]})" for a in gone)
            found.append(f"clients: Ray Serve application(s) {shown} of RayService {service} go"
                         + (f", {', '.join(f'{a} ({after[service][a]})' for a in came)} come" if came else "")
                         + ": clients calling the old route (and served model name) fail until they change")
    return found


def _gpus(model: Mapping[str, Any], bound: str) -> int:
    return int(model[bound]) * int(model["gpusPerReplica"])


def _transient_serve_gpus(base_capacity: Mapping[str, Any], head_capacity: Mapping[str, Any]) -> list[str]:
    """Ray Serve, told a new serveConfigV2, deploys the head's applications and deletes the removed ones in the same
    step (ray python/ray/serve/_private/controller.py apply_config: "Delete live applications not listed in the
    config"); a removed application's replicas hold their GPUs until they stop (graceful_shutdown_timeout_s), while
    the new ones start at their minimum. The Ray autoscaler adds no worker past a group's maxReplicas (KubeRay
    raycluster_types.go: "the maximum number of desired Pods for this worker group"), which Triarch sets to the
    head's models at their most (planners/ray.py worker_group), nor the pool a node past its max."""
    found = []
    base_names = {m["name"] for m in base_capacity.get("models", [])}
    head_models = list(head_capacity.get("models", []))
    head_names = {m["name"] for m in head_models}
    pools = {p["name"]: p for p in head_capacity.get("pools", [])}
    leaving: dict[str, list[Mapping[str, Any]]] = {}
    for model in base_capacity.get("models", []):
        if model["name"] not in head_names and model.get("engine") == "ray-serve" and model["pool"] in pools:
            leaving.setdefault(model["pool"], []).append(model)
    for pool, gone in sorted(leaving.items()):
        ray = [m for m in head_models if m["pool"] == pool and m.get("engine") == "ray-serve"]
        new = [m for m in ray if m["name"] not in base_names]
        if not new:
            continue  # nothing starts that the removed replicas could keep waiting
        held = sum(_gpus(m, "replicasMax") for m in gone)
        at_once = held + sum(_gpus(m, "replicasMin" if m in new else "replicasMax") for m in ray)
        ray_cap = sum(_gpus(m, "replicasMax") for m in ray)
        others = sum(_gpus(m, "replicasMax") for m in head_models if m["pool"] == pool and m not in ray)
        room = min(ray_cap, int(pools[pool]["gpusAtMax"]) - others)
        if at_once > room:
            where = (f"its Ray worker groups hold {ray_cap} (maxReplicas)" if room == ray_cap else
                     f"the pool holds {pools[pool]['gpusAtMax']}, {others} of them for other models")
            old, started = ", ".join(m["name"] for m in gone), ", ".join(m["name"] for m in new)
            found.append(
                f"pool {pool}: Ray Serve stops {old} as it starts {started} (one serveConfigV2); at their most that is "
                f"{at_once} GPU(s) at once, and {where}: {started} wait(s) for {old} to stop "
                f"(graceful_shutdown_timeout_s); to run both at once, add {started} in one `pulumi up` and remove "
                f"{old} in the next")
    return found


def _transient_gpus(base_capacity: Mapping[str, Any], head_capacity: Mapping[str, Any]) -> list[str]:
    """Pulumi deletes last: a vLLM model gone from the head keeps its GPUs until the update's end, while the head's
    replicas start. Where a pool cannot hold both, the new replicas wait."""
    found = []
    head_models = {m["name"]: m for m in head_capacity.get("models", [])}
    pools = {p["name"]: p for p in head_capacity.get("pools", [])}
    leaving: dict[str, int] = {}
    for model in base_capacity.get("models", []):
        if model["name"] not in head_models and model.get("engine") == "vllm":
            leaving[model["pool"]] = leaving.get(model["pool"], 0) + int(model["replicasMax"]) * int(
                model["gpusPerReplica"])
    for pool, gpus in sorted(leaving.items()):
        if pool not in pools:
            continue
        demand = sum(int(m["replicasMax"]) * int(m["gpusPerReplica"]) for m in head_models.values()
                     if m["pool"] == pool)
        holds = int(pools[pool]["gpusAtMax"])
        if demand + gpus > holds:
            found.append(f"pool {pool}: the removed models' {gpus} GPU(s) stay in use until Pulumi deletes them, "
                         f"last, while the head needs {demand}: {demand + gpus} at once, and the pool holds {holds}; "
                         "the new replicas wait Pending until then (or raise the pool's max first)")
    return found


CAPACITY_BLOCK_DRAIN = ("40 minutes before it ends, Karpenter deletes its nodes, 10 minutes before EC2 starts "
                        "terminating them (Karpenter 1.14.1, capacityreservation.expiration; EC2 User Guide, "
                        "\"Work with Capacity Blocks\": thirty minutes before the end)")
"""What a Capacity Block's end does: karpenter-provider-aws v1.14.1 pkg/controllers/capacityreservation/expiration
deletes the NodeClaims of a block within 40 minutes of its end (pkg/apis/v1/ec2nodeclass_status.go,
capacityReservationExpirationPeriod), and a deleted NodeClaim's node is drained; EC2 terminates what still runs
from 30 minutes before the end."""
ODCR_END = ("its running nodes stay, billed on-demand from then: Karpenter relabels them on-demand (Karpenter 1.14.1, "
            "capacityreservation.capacitytype)")
"""What an On-Demand Capacity Reservation's end does: the instances keep running as on-demand, and
karpenter-provider-aws v1.14.1 pkg/controllers/capacityreservation/capacitytype demotes their NodeClaims and nodes
from reserved to on-demand."""


def _reservations(capacity: Mapping[str, Any]) -> dict[str, tuple[Mapping[str, Any], dict[str, Mapping[str, Any]]]]:
    """Pool name -> (its capacity row, {reservation name: its row}), for the pools with reservations."""
    return {str(p["name"]): (p, {str(r["reservation"]): r for r in p.get("reservations") or []})
            for p in capacity.get("pools", [])}


def _displaced(pool: Mapping[str, Any]) -> str:
    """Where the replicas of a pool's reserved nodes go when those nodes go."""
    if pool.get("reservedOnly"):
        return "their replicas wait Pending until a reservation of the pool has room (reservedOnly: no on-demand node)"
    kind = str(pool.get("capacityType") or "ON_DEMAND").lower().replace("_", "-")
    return f"their replicas move to {kind} nodes Karpenter launches for them, each starting cold"


def reservation_effects(base_capacity: Mapping[str, Any], head_capacity: Mapping[str, Any]) -> list[str]:
    """A pool's reservations added, dropped or given an end, and reservedOnly turned on: what Karpenter does to the
    nodes and so to the replicas on them. Read from both capacity reports (each pool's `reservations`)."""
    found: list[str] = []
    before = _reservations(base_capacity)
    for name, (pool, after) in sorted(_reservations(head_capacity).items()):
        was_pool, was = before.get(name, ({}, {}))
        added = sorted(set(after) - set(was))
        removed = sorted(set(was) - set(after))
        if added:
            found.append(f"pool {name}: new nodes launch into {', '.join(added)} first (Karpenter's reserved capacity "
                         "type, ahead of on-demand); running nodes stay (reservation terms are outside the "
                         "EC2NodeClass's drift hash)")
        if removed:
            odcrs = [r for r in removed if was[r].get("type") != "capacityBlock"]
            billing = (f"; Triarch cancels no reservation: {', '.join(odcrs)} bill(s) at the on-demand rate until you "
                       "cancel it in EC2" if odcrs else "")
            found.append(f"pool {name}: nodes running in {', '.join(removed)} drift (CapacityReservationDrift, "
                         "Karpenter 1.14.1) and Karpenter replaces them as the pool's disruption budget allows; "
                         f"{_displaced(pool)}{billing}")
        if pool.get("reservedOnly") and not was_pool.get("reservedOnly") and was:
            found.append(f"pool {name}: reservedOnly: its nodes outside the reservations drift (their capacity type "
                         "leaves the NodePool's requirement) and Karpenter replaces them in the reservations as far "
                         "as they hold; the rest of their replicas wait Pending")
        for reservation, row in sorted(after.items()):
            old = was.get(reservation)
            ends = row.get("endsAt")
            if ends is None or (old is not None and old.get("endsAt") == ends and old.get("type") == row.get("type")):
                continue
            if row.get("type") == "capacityBlock":
                found.append(f"pool {name}: Capacity Block {reservation} ends {ends}: {CAPACITY_BLOCK_DRAIN}; "
                             f"{_displaced(pool)}")
            else:
                tail = ("; then they drift off the reservations-only NodePool, and their replicas wait Pending"
                        if pool.get("reservedOnly") else "")
                found.append(f"pool {name}: reservation {reservation} ends {ends}: {ODCR_END}{tail}")
    return found


ADDON = "aws:eks/addon:Addon"
KARPENTER_CHART_SUFFIX = "/karpenter"


def _repair_gate(plan: Mapping[str, Any]) -> bool | None:
    """Karpenter's NodeRepair gate in a plan's karpenter release (False where its values leave the chart's default,
    off), or None where the plan installs no Karpenter."""
    for resource in plan["resources"]:
        inputs = resource["inputs"]
        if resource["type"] == RELEASE and str(inputs.get("chart", "")).endswith(KARPENTER_CHART_SUFFIX):
            gates = ((inputs.get("values") or {}).get("settings") or {}).get("featureGates") or {}
            return bool(gates.get(repair.facts().feature_gate))
    return None


def _addons(plan: Mapping[str, Any]) -> set[str]:
    return {str(r["inputs"].get("addonName")) for r in plan["resources"] if r["type"] == ADDON}


def _repair_effects(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[str]:
    """Node repair turned on or off (cluster.nodeRepair): Karpenter's controller restarts with or without its gate,
    and the node monitoring agent's add-on comes or goes. Neither replaces a running node by itself."""
    f = repair.facts()
    found = []
    before, after = _repair_gate(base), _repair_gate(head)
    if before is not None and after is not None and before != after:
        found.append(
            f"Helm release karpenter: node repair turns on (settings.featureGates.{f.feature_gate}): the controller "
            f"restarts with it, and from then on a GPU node the node monitoring agent marks {f.condition}={f.status} "
            f"(Xid {repair.xids_text()}, ...) is terminated {f.toleration_minutes} minutes later without a drain; "
            "its replicas restart on a new node" if after else
            f"Helm release karpenter: node repair turns off (settings.featureGates.{f.feature_gate}): the "
            "controller restarts without it; a GPU node that fails stays, holding its replicas' GPUs, until it is "
            "replaced by hand")
    came, went = _addons(head) - _addons(base), _addons(base) - _addons(head)
    if f.addon in came:
        found.append(f"EKS add-on {f.addon} comes: its DaemonSet starts on every node and dcgm-server on the GPU "
                     "nodes; they only report node conditions, no serving pod restarts")
    if f.addon in went:
        found.append(f"EKS add-on {f.addon} goes: nothing marks a failed GPU node any more, so no node is repaired")
    return found


def traffic_effects(result: Diff, base: Mapping[str, Any], head: Mapping[str, Any],
                    base_capacity: Mapping[str, Any] | None, head_capacity: Mapping[str, Any] | None) -> list[str]:
    """One sentence per effect on running traffic, in a fixed order."""
    found: list[str] = []
    moved = [(d, m) for d in result.differences if (m := MOVED.match(d.cause))]
    for old, new in sorted({m.groups() for _, m in moved}):
        count = sum(1 for _, m in moved if m.groups() == (old, new))
        found.append(f"cluster: {count} Kubernetes resource(s) move to another cluster ({old} -> {new}): every model "
                     "starts there from no node, and clients move to its endpoint; the old cluster serves until "
                     "Pulumi deletes it, last")
    for difference in sorted(result.differences, key=lambda d: (d.type, d.name)):
        if MOVED.match(difference.cause):
            continue  # no drift or Ray upgrade in a cluster it leaves: said once above
        if difference.type == RAY_SERVICE and difference.kind in ("changed", "replaced"):
            found += _ray_effects(difference)
        elif difference.type in POD_TEMPLATES and difference.kind == "changed":
            found += _rollout(difference, head)
        elif difference.type == RELEASE and difference.kind == "changed":
            found += _picker_roll(difference, head)
        elif difference.kind in ("changed", "replaced"):
            found += _pool_effects(difference, head)
    gone = sorted(_service_names(base) - _service_names(head))
    if gone:
        came = sorted(_service_names(head) - _service_names(base))
        found.append(f"clients: Service(s) {', '.join(gone)} go" + (f", {', '.join(came)} come" if came else "")
                     + ": clients calling the old name (and served model name) fail until they change")
    found += _picker_effects(base, head)
    found += _upgrade_drift(result, head)
    found += _serve_clients(base, head)
    new_clusters = {d.name for d in result.differences if d.type == RAY_SERVICE and _new_ray_cluster(d)}
    found += _routing_effects(base, head, new_clusters)
    found += _split_effects(base, head, new_clusters)
    found += _repair_effects(base, head)
    found += claim_growth_notes(base, head)
    if base_capacity and head_capacity:
        found += reservation_effects(base_capacity, head_capacity)
        found += offload_effects(base_capacity, head_capacity)
        found += adapter_effects(base_capacity, head_capacity)
        found += _transient_gpus(base_capacity, head_capacity)
        if not any(d.type == RAY_SERVICE and d.kind in ("changed", "replaced") and _new_ray_cluster(d)
                   for d in result.differences):
            # a new Ray cluster starts every application beside the old one: the plan's placement proof holds it
            found += _transient_serve_gpus(base_capacity, head_capacity)
    return found
