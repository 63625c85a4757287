"""The guardrails. Each rule says why it exists, its default enforcement, its thresholds, and a message that
names the resource and the fix. Resource rules see one resource's properties; stack rules see all of them."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeGuard

from triarch.catalog import catalog
from triarch.guardrails.placement import prove
from triarch.guardrails.workloads import (
    LWS_KIND,
    UNKNOWN,
    PodTemplate,
    command_line,
    containers,
    flag,
    gpu_count,
    hook_commands,
    is_placeholder,
    is_vllm,
    kind_of,
    llm_configs,
    name_of,
    nvidia_gpu_count,
    pod_templates,
    prestop_seconds,
    ray_cluster_spec,
    ray_sigterm_drain_seconds,
    requests_gpus,
    required_node_terms,
    serve_applications,
    serve_graceful_shutdown_seconds,
)
from triarch.images import FLOATING_TAGS, IMAGE_RELEASE, ImageError
from triarch.images import parse as parse_image
from triarch.matrix import Node, check_image_on_node
from triarch.scheduling import GPU_LABEL, GPU_PRESENT_LABEL, GPU_TAINT_EFFECT, GPU_TAINT_KEY, POOL_LABEL
from triarch.tuner import TuneError, load_arch, weight_bytes

Layer = Literal["Kubernetes", "Ray", "vLLM"]
Enforcement = Literal["mandatory", "advisory", "disabled"]
Config = Mapping[str, Any]


@dataclass(frozen=True)
class Resource:
    type: str
    name: str
    props: Mapping[str, Any]
    urn: str = ""


ResourceCheck = Callable[[Resource, Config], list[str]]
StackCheck = Callable[[list[Resource], Config], list[tuple[Resource, str]]]


@dataclass(frozen=True)
class Rule:
    name: str
    layer: Layer
    description: str
    enforcement: Enforcement
    check_resource: ResourceCheck | None = None
    check_stack: StackCheck | None = None
    config: dict[str, dict[str, Any]] = field(default_factory=dict)
    """JSON schema of each threshold, with its default."""

    def settings(self, given: Config | None) -> dict[str, Any]:
        values = {key: schema["default"] for key, schema in self.config.items()}
        values.update({k: v for k, v in (given or {}).items() if k in self.config})
        return values


RULES: list[Rule] = []


def rule(name: str, layer: Layer, description: str, enforcement: Enforcement = "mandatory",
         config: dict[str, dict[str, Any]] | None = None, stack: bool = False) -> Callable[[Any], Any]:
    def register(check: Any) -> Any:
        RULES.append(Rule(name, layer, description, enforcement,
                          None if stack else check, check if stack else None, config or {}))
        return check
    return register


def _gpu_templates(resource: Resource) -> list[PodTemplate]:
    return [t for t in pod_templates(resource.type, resource.props, resource.name) if requests_gpus(t.spec)]


def _known(value: object) -> TypeGuard[int | float | str]:
    """A value the plan knows (not missing, not only known after apply)."""
    return value is not None and value != UNKNOWN


# --- Kubernetes: where ------------------------------------------------------------------------------------

ZONE = "topology.kubernetes.io/zone"


def _largest_ray_replica(resource: Resource) -> int:
    """GPUs of the largest Ray Serve model replica of a RayService (tensor x pipeline parallel), 0 without one."""
    sizes = [int((llm.get("engine_kwargs") or {}).get("tensor_parallel_size", 1) or 1)
             * int((llm.get("engine_kwargs") or {}).get("pipeline_parallel_size", 1) or 1)
             for _, llm in llm_configs(resource.props)]
    return max(sizes, default=0)


@rule("gpu-zone-spread", "Kubernetes",
      "Replicated GPU workloads spread over zones with DoNotSchedule, so one zone's outage or GPU shortage leaves "
      "replicas serving. ScheduleAnyway is not enough: when a pool scales from zero the scheduler sees only the "
      "first node's zone, and every replica lands there. Per model replica: the workers of one LeaderWorkerSet group "
      "or the pipeline stages of one Ray Serve replica stay together. (A one-zone cluster sets this advisory.)",
      config={"maxSkew": {"type": "integer", "minimum": 1, "default": 1}})
def zone_spread(resource: Resource, config: Config) -> list[str]:
    limit = int(config["maxSkew"])
    messages = []
    largest = _largest_ray_replica(resource)
    for template in _gpu_templates(resource):
        if template.replicas < 2 or template.ray_head:
            continue
        if kind_of(resource.type) == LWS_KIND and template.where.endswith(" workers"):
            continue  # a group's workers are stages of one replica, placed together; the leaders spread
        pod_gpus = max((gpu_count(c) or 0 for c in containers(template.spec)), default=0)
        if template.ray and largest > pod_gpus:
            continue  # these workers are pipeline stages of one replica: spreading them splits the replica
        spreads = [c for c in template.spec.get("topologySpreadConstraints") or [] if c.get("topologyKey") == ZONE]
        if not spreads:
            messages.append(f"{template.where}: {template.replicas} GPU replicas with no topologySpreadConstraint on "
                            f"{ZONE}; add one with maxSkew <= {limit} and whenUnsatisfiable DoNotSchedule")
        elif any(int(c.get("maxSkew", 1)) > limit for c in spreads):
            messages.append(f"{template.where}: zone spread maxSkew above {limit}; set maxSkew <= {limit}")
        elif not any(c.get("whenUnsatisfiable") == "DoNotSchedule" for c in spreads):
            messages.append(f"{template.where}: {template.replicas} GPU replicas spread over zones only with "
                            "ScheduleAnyway, which a pool scaling from zero defeats; set whenUnsatisfiable "
                            "DoNotSchedule (and minDomains: the zones the replicas may use)")
    return messages


@rule("gpu-limits", "Kubernetes",
      "Accelerators (nvidia.com/gpu, amd.com/gpu, aws.amazon.com/neuron*, google.com/tpu) are only scheduled "
      "through limits, and a request different from the limit is rejected or misleading: a device plugin cannot "
      "overcommit.")
def gpu_limits(resource: Resource, config: Config) -> list[str]:
    messages = []
    for template in pod_templates(resource.type, resource.props, resource.name):
        for c in containers(template.spec):
            limit, request = gpu_count(c, "limits"), gpu_count(c, "requests")
            if request is not None and limit is None:
                messages.append(f"{template.where} container {c.get('name')}: an accelerator requested but not "
                                "limited; set it under resources.limits (nvidia.com/gpu, amd.com/gpu, ...)")
            elif request is not None and limit is not None and request != limit:
                messages.append(f"{template.where} container {c.get('name')}: accelerator request {request} != "
                                f"limit {limit}; make them equal")
            elif limit == 0 and is_vllm(c):
                messages.append(f"{template.where} container {c.get('name')}: a vLLM server without GPUs; set "
                                "resources.limits['nvidia.com/gpu']")
    return messages


def _tolerates_gpu_taint(pod: Mapping[str, Any]) -> bool:
    for toleration in pod.get("tolerations") or []:
        if toleration.get("operator") == "Exists" and not toleration.get("key"):
            return True
        if toleration.get("key") == GPU_TAINT_KEY and toleration.get("effect") in (None, "", GPU_TAINT_EFFECT):
            return True
    return False


GKE_LABEL_PREFIX = "cloud.google.com/gke-"
"""Pods selecting GKE node labels run on GKE, whose ExtendedResourceToleration admission adds the GPU toleration."""


@rule("gpu-scheduling", "Kubernetes",
      "NVIDIA GPU pods must tolerate the GPU nodes' nvidia.com/gpu taint where the nodes carry it (Triarch's pools, "
      "EKS's GPU node groups), else they stay Pending. Advisory by default, since untainted GPU nodes need none "
      "(Triarch's own stacks make it mandatory); pods selecting GKE labels are exempt (GKE adds the toleration); "
      "requireToleration false turns it off on platforms that add it.",
      enforcement="advisory", config={"requireToleration": {"type": "boolean", "default": True}})
def gpu_scheduling(resource: Resource, config: Config) -> list[str]:
    if not config["requireToleration"]:
        return []
    return [f"{template.where}: requests NVIDIA GPUs but does not tolerate the {GPU_TAINT_KEY}:{GPU_TAINT_EFFECT} "
            f"taint; add a toleration for key {GPU_TAINT_KEY}"
            for template in _gpu_templates(resource) if any((nvidia_gpu_count(c) or 0) > 0 for c in containers(
                template.spec)) and not _tolerates_gpu_taint(template.spec) and not _on_gke(template.spec)]


def _on_gke(pod: Mapping[str, Any]) -> bool:
    keys = set(pod.get("nodeSelector") or {})
    for term in required_node_terms(pod):
        keys |= {str(e.get("key")) for e in term.get("matchExpressions") or []}
    return any(k.startswith(GKE_LABEL_PREFIX) for k in keys)


@rule("gpu-node-selection", "Kubernetes",
      "Accelerator pods should select their nodes (a pool, a GPU product, an instance type, any label), else they "
      "may land on another GPU model than the one their engine args were sized for. Advisory: a cluster with one "
      "kind of GPU node needs no selector.", enforcement="advisory")
def gpu_node_selection(resource: Resource, config: Config) -> list[str]:
    return [f"{template.where}: requests accelerators without selecting their nodes; add a nodeSelector or a "
            f"required node affinity (e.g. {POOL_LABEL}, nvidia.com/gpu.product, node.kubernetes.io/instance-type)"
            for template in _gpu_templates(resource) if not _selects_nodes(template.spec)]


def _selects_nodes(pod: Mapping[str, Any]) -> bool:
    return bool(pod.get("nodeSelector")) or bool(required_node_terms(pod))


EXEMPTION = {"type": "object", "required": ["name", "reason"],
             "properties": {"namespace": {"type": "string"}, "name": {"type": "string"},
                            "reason": {"type": "string", "minLength": 1}}}


def _exempt(resource: Resource, exemptions: list[Mapping[str, Any]]) -> bool:
    """Whether the config exempts the resource (by name, and namespace when given; each exemption has a reason)."""
    metadata = resource.props.get("metadata") or {}
    name, namespace = name_of(resource.props, resource.name), metadata.get("namespace")
    return any(e.get("name") == name and e.get("namespace") in (None, namespace) for e in exemptions)


@rule("no-privileged-pods", "Kubernetes",
      "GPUs reach containers through the device plugin and the container toolkit: a serving workload needs no "
      "privileged mode, no host PID, IPC or network namespace, no Unconfined seccomp profile and no capability "
      "beyond `allowedCapabilities`; each hands the node to anyone who compromises the pod. Node agents that need one "
      "(a DCGM exporter collecting profiling metrics) are listed in `exempt` with the reason.",
      config={"allowedCapabilities": {"type": "array", "items": {"type": "string"}, "default": ["NET_BIND_SERVICE"]},
              "exempt": {"type": "array", "items": EXEMPTION, "default": []}})
def no_privileged(resource: Resource, config: Config) -> list[str]:
    if _exempt(resource, list(config["exempt"])):
        return []
    allowed = {str(c).upper().removeprefix("CAP_") for c in config["allowedCapabilities"]}
    messages = []
    for template in pod_templates(resource.type, resource.props, resource.name):
        for host in ("hostPID", "hostIPC", "hostNetwork"):
            if template.spec.get(host):
                messages.append(f"{template.where}: {host} is true; remove it (or exempt this node agent with its "
                                "reason)")
        pod_seccomp = ((template.spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
        if pod_seccomp == "Unconfined":
            messages.append(f"{template.where}: seccompProfile Unconfined; use RuntimeDefault")
        for c in containers(template.spec):
            security = c.get("securityContext") or {}
            if security.get("privileged"):
                messages.append(f"{template.where} container {c.get('name')}: privileged; remove it (GPUs come "
                                "from the device plugin's resource limits)")
            if (security.get("seccompProfile") or {}).get("type") == "Unconfined":
                messages.append(f"{template.where} container {c.get('name')}: seccompProfile Unconfined; use "
                                "RuntimeDefault")
            added = {str(cap).upper().removeprefix("CAP_") for cap in (security.get("capabilities") or {}).get(
                "add") or []}
            extra = sorted(added - allowed)
            if extra:
                messages.append(f"{template.where} container {c.get('name')}: adds {extra}; drop them (the device "
                                "plugin, not a capability, gives access to the GPU), or exempt this node agent")
    return messages


DEVICE_RESET = re.compile(r"nvidia-smi\b[^;&|\n]*\s(-r|--gpu-reset|-rgc|--reset-gpu-clocks)\b|--gpu-reset"
                          r"|/sys/bus/pci/devices/[^\s]*/(reset|remove)")
"""nvidia-smi's reset switches wherever they sit (`nvidia-smi -i 0 -r`), and PCI resets through sysfs."""


@rule("no-device-reset", "Kubernetes",
      "Resetting a GPU from a pod (nvidia-smi --gpu-reset in a hook) needs exclusive root access to the device and "
      "kills every other process on it; drain instead.")
def no_device_reset(resource: Resource, config: Config) -> list[str]:
    messages = []
    for template in pod_templates(resource.type, resource.props, resource.name):
        for c in containers(template.spec):
            texts = [*hook_commands(c), " ".join(command_line(c))]
            if any(DEVICE_RESET.search(text) for text in texts):
                messages.append(f"{template.where} container {c.get('name')}: resets the GPU device; remove the "
                                "reset and drain requests in preStop instead")
    return messages


@rule("pinned-images", "Kubernetes",
      "A moving tag changes the CUDA inside the image under a pinned driver: every image carries a version tag "
      "or a digest, never :latest.")
def pinned_images(resource: Resource, config: Config) -> list[str]:
    if resource.type == "kubernetes:helm.sh/v3:Release":
        return _pinned_release(resource)
    messages = []
    for template in pod_templates(resource.type, resource.props, resource.name):
        for c in containers(template.spec):
            image = str(c.get("image") or "")
            if not image or image == UNKNOWN:
                continue
            where = f"{template.where} container {c.get('name')}: image {image}"
            try:
                reference = parse_image(image)
            except ImageError as error:
                messages.append(f"{where} {error.reason}")
                continue
            if reference.pinned:
                continue  # a versioned tag, a digest, or both; from any registry
            if reference.tag is None:
                messages.append(f"{where} has no tag; pin a version tag or a digest")
            else:
                messages.append(f"{where} uses :{reference.tag}, which moves; pin a version tag or a digest")
    return messages


def _gpu_node_group(props: Mapping[str, Any]) -> bool:
    """A GPU AMI type, or an instance type the catalog knows to carry GPUs."""
    ami_type = str(props.get("amiType", ""))
    if "NVIDIA" in ami_type or "GPU" in ami_type:
        return True
    instances = catalog().instances
    return any((instances[t].gpus if t in instances else 0) > 0 for t in props.get("instanceTypes") or [])


def _pinned_release(resource: Resource) -> list[str]:
    """A Helm release pins its chart version, and any image tag it sets in values is not :latest."""
    messages = []
    name = resource.props.get("name") or resource.name
    if not _known(resource.props.get("version")):
        messages.append(f"Helm release {name}: chart {resource.props.get('chart')} has no version; pin one")
    tag = ((resource.props.get("values") or {}).get("image") or {}).get("tag")
    if tag in FLOATING_TAGS:
        messages.append(f"Helm release {name}: values image.tag is {tag}, which moves; pin a version tag")
    return messages


NODE_POOL = "karpenter.sh/v1:NodePool"
NODE_CLASS = "karpenter.k8s.aws/v1:EC2NodeClass"
GPU_REQUIREMENT_KEYS = ("karpenter.k8s.aws/instance-gpu-count", "karpenter.k8s.aws/instance-gpu-name",
                        "karpenter.k8s.aws/instance-gpu-manufacturer", "karpenter.k8s.aws/instance-gpu-memory")
"""Karpenter requirement keys that only GPU instance types satisfy (unless the operator is DoesNotExist)."""


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


@rule("gpu-nodegroup-labels-taint", "Kubernetes",
      "GPU pools (EKS node groups, Karpenter NodePools) carry the pool labels workloads select and the GPU taint "
      "that keeps other pods off; without them GPU pods stay Pending or CPU pods fill the GPU nodes.")
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


@rule("imdsv2-required", "Kubernetes",
      "Pods must not reach the node's instance credentials: launch templates require IMDSv2 tokens with a hop "
      "limit that stops at the node.",
      config={"maxHopLimit": {"type": "integer", "minimum": 1, "default": 1}})
def imdsv2(resource: Resource, config: Config) -> list[str]:
    if resource.type == "aws:ec2/launchTemplate:LaunchTemplate":
        where, options = f"launch template {resource.name}", resource.props.get("metadataOptions") or {}
    elif kind_of(resource.type) == NODE_CLASS:
        where = f"EC2NodeClass {name_of(resource.props, resource.name)}"
        options = (resource.props.get("spec") or {}).get("metadataOptions") or {}
    else:
        return []
    messages = []
    if options.get("httpTokens") != "required":
        messages.append(f"{where}: metadataOptions.httpTokens is not 'required'; set it")
    hops = options.get("httpPutResponseHopLimit")
    if _known(hops) and int(hops) > int(config["maxHopLimit"]):
        messages.append(f"{where}: hop limit {hops} lets pods reach IMDS; set "
                        f"httpPutResponseHopLimit <= {config['maxHopLimit']}")
    return messages


CACHE_PATHS = ("/root/.cache/huggingface", "/models")


@rule("model-cache-not-emptydir", "Kubernetes",
      "Weights on emptyDir are downloaded again on every restart and reschedule (minutes to hours for large "
      "models, and a hub rate limit); cache them on a PersistentVolumeClaim.",
      config={"minModelGiB": {"type": "number", "minimum": 0, "default": 2}})
def model_cache(resource: Resource, config: Config) -> list[str]:
    messages = []
    for template in _gpu_templates(resource):
        volumes = {v.get("name"): v for v in template.spec.get("volumes") or []}
        for c in containers(template.spec):
            env = {e.get("name"): e.get("value") for e in c.get("env") or []}
            cache_paths = [p for p in (env.get("HF_HOME"), *CACHE_PATHS) if p]
            if _model_gib(_served_model(c)) < float(config["minModelGiB"]):
                continue
            for mount in c.get("volumeMounts") or []:
                path = str(mount.get("mountPath", ""))
                covers_cache = any(path == p or p.startswith(path.rstrip("/") + "/") for p in cache_paths)
                if covers_cache and "emptyDir" in (volumes.get(mount.get("name")) or {}):
                    messages.append(f"{template.where} container {c.get('name')}: model cache {path} is an "
                                    "emptyDir; mount a PersistentVolumeClaim there")
    return messages


def _served_model(container: Mapping[str, Any]) -> str | None:
    """The model a vLLM container serves: `vllm serve <model>` or `--model <model>`."""
    if not is_vllm(container):
        return None
    argv = command_line(container)
    if argv[:2] == ["vllm", "serve"]:
        argv = argv[2:]
    # `vllm serve MODEL`, or the image's own entrypoint with the model as the first argument.
    positional = next((w for w in argv[:1] if "/" in w and not w.startswith(("-", "/"))), None)
    return flag(argv, "model") or positional


def _model_gib(model: str | None) -> float:
    """Weights of a catalog model in GiB; unknown models count as large."""
    if not model:
        return float("inf")
    try:
        return weight_bytes(load_arch(model)) / (1 << 30)
    except TuneError:
        return float("inf")


# --- Ray: how ---------------------------------------------------------------------------------------------

RAY_PORTS = {6379: "GCS", 8265: "dashboard", 10001: "Ray client"}
RAY_PORT_NAMES = {6379: "gcs-server", 8265: "dashboard", 10001: "client"}
"""The names KubeRay gives those ports on the head pod."""


@rule("ray-ports-internal", "Ray",
      "The Ray dashboard, GCS and client ports run arbitrary code on the cluster: they never leave it through a "
      "LoadBalancer, NodePort or Ingress.")
def ray_ports(resource: Resource, config: Config) -> list[str]:
    kind = kind_of(resource.type)
    props = resource.props
    name = name_of(props, resource.name)
    messages = []
    spec = props.get("spec") or {}
    if kind in ("v1:Service", "core/v1:Service") and spec.get("type") in ("LoadBalancer", "NodePort"):
        for port in spec.get("ports") or []:
            numbers = {port.get("port"), port.get("targetPort")}
            for number, what in RAY_PORTS.items():
                if number in numbers or str(number) in numbers or RAY_PORT_NAMES[number] in numbers:
                    messages.append(f"Service {name}: exposes the Ray {what} port {number} through "
                                    f"{spec['type']}; use ClusterIP and reach it with kubectl port-forward")
    elif kind.endswith(":Ingress"):
        backends = [path.get("backend") or {} for rule_ in spec.get("rules") or []
                    for path in ((rule_.get("http") or {}).get("paths") or [])]
        backends.append(spec.get("defaultBackend") or {})
        for backend in backends:
            port = ((backend.get("service") or {}).get("port") or {})
            backend_port = port.get("number")
            if backend_port in RAY_PORTS or port.get("name") in RAY_PORT_NAMES.values():
                what = RAY_PORTS[backend_port] if backend_port in RAY_PORTS else str(port.get("name"))
                messages.append(f"Ingress {name}: routes to the Ray {what} port; remove that path (expose only "
                                "the Serve port 8000)")
    elif kind in ("ray.io/v1:RayService", "ray.io/v1:RayCluster"):
        head = ray_cluster_spec(kind, props).get("headGroupSpec") or {}
        if head.get("serviceType") in ("LoadBalancer", "NodePort"):
            messages.append(f"{kind.rsplit(':', 1)[-1]} {name}: head serviceType {head['serviceType']} exposes the "
                            "dashboard, GCS and client ports; use ClusterIP")
    return messages


EVERY_ADDRESS = ("0.0.0.0/0", "::/0")


def _namespace_of(resource: Resource) -> str:
    return str((resource.props.get("metadata") or {}).get("namespace") or "default")


def _admits_everyone(peer: Mapping[str, Any]) -> bool:
    """An ingress peer that matches every namespace (an empty namespace selector, whatever pods it names only
    narrows by label) or every address."""
    if "namespaceSelector" in peer:
        selector = peer.get("namespaceSelector") or {}
        return not selector.get("matchLabels") and not selector.get("matchExpressions")
    return ((peer.get("ipBlock") or {}).get("cidr") in EVERY_ADDRESS)


@rule("serving-network-isolated", "Kubernetes",
      "A GPU server's namespace is closed both ways by default: a NetworkPolicy selecting every pod for Ingress "
      "and one for Egress, and no rule admitting every namespace or address. Otherwise any pod in the cluster "
      "calls the models (and Ray's ports), and a model server can reach the API server and the nodes. Judged where "
      "the namespace is created or policed in the same resources.", stack=True)
def serving_network(resources: list[Resource], config: Config) -> list[tuple[Resource, str]]:
    serving: dict[str, Resource] = {}
    for r in resources:
        if _gpu_templates(r):
            serving.setdefault(_namespace_of(r), r)
    policies = [r for r in resources if kind_of(r.type) == "networking.k8s.io/v1:NetworkPolicy"]
    # Judged only where the namespace's policies are in view: it is created here, or some are given here. A
    # manifest of workloads alone says nothing about the policies the cluster already has.
    in_view = {name_of(r.props, r.name) for r in resources if kind_of(r.type) == "core/v1:Namespace"}
    in_view |= {_namespace_of(p) for p in policies}
    found = []
    for namespace, workload in sorted(serving.items()):
        if namespace not in in_view:
            continue
        here = [p for p in policies if _namespace_of(p) == namespace]
        for direction in ("Ingress", "Egress"):
            covered = any(not ((p.props.get("spec") or {}).get("podSelector") or {})
                          and direction in ((p.props.get("spec") or {}).get("policyTypes") or ["Ingress"])
                          for p in here)
            if not covered:
                found.append((workload, f"Namespace {namespace}: no NetworkPolicy selects every pod for {direction} "
                                        f"(so all {direction.lower()} is open); add a default-deny-"
                                        f"{direction.lower()} policy and allow what the servers need"))
        for policy in here:
            for rule_ in (policy.props.get("spec") or {}).get("ingress") or []:
                peers = rule_.get("from")
                if not peers or any(_admits_everyone(peer) for peer in peers):
                    found.append((policy, f"NetworkPolicy {namespace}/{name_of(policy.props, policy.name)}: admits "
                                          "ingress from every namespace or address; name the client namespaces "
                                          "(serving.clientNamespaces)"))
                    break
    return found


CPU_METRICS = ("cpu", "memory")


def _resource_metric(metric: Mapping[str, Any]) -> str | None:
    """The resource a Resource or ContainerResource metric scales on."""
    if metric.get("type") == "Resource":
        return (metric.get("resource") or {}).get("name")
    if metric.get("type") == "ContainerResource":
        return (metric.get("containerResource") or {}).get("name")
    return None


@rule("no-cpu-hpa-on-gpu", "Ray",
      "A GPU server is busy when its batch is full, not when its CPU is: an HPA on CPU or memory scales it at the "
      "wrong time and fights Ray Serve's own autoscaler. Scale on requests (Ray Serve) or on vLLM's queue metrics.",
      stack=True)
def no_cpu_hpa(resources: list[Resource], config: Config) -> list[tuple[Resource, str]]:
    gpu_targets = set()
    for r in resources:
        kind = kind_of(r.type)
        if kind in ("apps/v1:Deployment", "apps/v1:StatefulSet") and _gpu_templates(r):
            namespace = (r.props.get("metadata") or {}).get("namespace", "default")
            gpu_targets.add((namespace, kind.rsplit(":", 1)[-1], name_of(r.props, r.name)))
    found = []
    for r in resources:
        if kind_of(r.type) == "keda.sh/v1alpha1:ScaledObject":
            spec = r.props.get("spec") or {}
            target = spec.get("scaleTargetRef") or {}
            namespace = (r.props.get("metadata") or {}).get("namespace", "default")
            key = (namespace, target.get("kind") or "Deployment", target.get("name"))
            cpu = [t.get("type") for t in spec.get("triggers") or [] if t.get("type") in CPU_METRICS]
            if key in gpu_targets and cpu:
                found.append((r, f"ScaledObject {name_of(r.props, r.name)}: scales the GPU server {key[1]} "
                                 f"{key[2]} on {', '.join(cpu)}; trigger on vllm:num_requests_waiting and "
                                 "vllm:kv_cache_usage_perc (type prometheus) instead"))
            continue
        if not kind_of(r.type).endswith(":HorizontalPodAutoscaler"):
            continue
        spec = r.props.get("spec") or {}
        target = spec.get("scaleTargetRef") or {}
        namespace = (r.props.get("metadata") or {}).get("namespace", "default")
        if (namespace, target.get("kind"), target.get("name")) not in gpu_targets:
            continue
        metrics = spec.get("metrics")
        resource_metrics = [m for m in metrics or [] if _resource_metric(m) in CPU_METRICS]
        v2_default = "autoscaling/v2" in r.type and not metrics  # no metrics: 80% CPU
        v1 = "autoscaling/v1" in r.type  # v1 scales on CPU only
        if resource_metrics or v2_default or v1 or spec.get("targetCPUUtilizationPercentage") is not None:
            found.append((r, f"HorizontalPodAutoscaler {name_of(r.props, r.name)}: scales the GPU server "
                             f"{target.get('kind')} {target.get('name')} on CPU/memory; remove it, or scale on "
                             "vllm:num_requests_waiting (or serve it with Ray Serve autoscaling)"))
    return found


# --- vLLM: when -------------------------------------------------------------------------------------------


def _inference_containers(template: PodTemplate) -> list[Mapping[str, Any]]:
    return [c for c in template.spec.get("containers") or []
            if ((gpu_count(c) or 0) > 0 or is_vllm(c)) and not is_placeholder(c)]


UNMANAGED_KINDS = ("core/v1:Pod", "batch/v1:Job", "serving.kserve.io/v1beta1:InferenceService",
                   "serving.kserve.io/v1alpha1:LLMInferenceService")
"""Pods no Service's endpoints follow through a rollout Triarch's drain rules speak of: bare Pods and Jobs (deleted
by hand), and KServe's, whose controller and queue proxy own the drain and the probes."""


def _behind_endpoints(resource: Resource, template: PodTemplate) -> bool:
    """Whether the template's pods serve through endpoints a rollout or scale-down removes them from."""
    kind = kind_of(resource.type)
    if kind in UNMANAGED_KINDS:
        return False
    return not (kind == LWS_KIND and template.where.endswith(" workers"))  # the leader serves the group


@rule("prestop-drain", "vLLM",
      "Requests in flight when a pod stops are dropped unless a preStop hook lets endpoints drain and the grace "
      "period covers the hook plus the server's own drain: vLLM's --shutdown-timeout, or for a Ray worker Ray's "
      "drain on SIGTERM (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S) plus Serve's graceful_shutdown_timeout_s.",
      config={"minDrainSeconds": {"type": "integer", "minimum": 0, "default": 10}})
def prestop_drain(resource: Resource, config: Config) -> list[str]:
    messages = []
    minimum = int(config["minDrainSeconds"])
    for template in pod_templates(resource.type, resource.props, resource.name):
        if template.ray_head or not _behind_endpoints(resource, template):
            continue
        grace = int(template.spec.get("terminationGracePeriodSeconds", 30))
        for c in _inference_containers(template):
            pre = prestop_seconds(c)
            if pre is None and template.ray:
                pre = 0  # a Ray worker takes no traffic from endpoints: Ray's own drain on SIGTERM is what counts
            elif pre is None:
                messages.append(f"{template.where} container {c.get('name')}: no preStop hook; add one that waits "
                                "for endpoints to drain (and never `ray stop`)")
                continue
            if any("ray stop" in text for text in hook_commands(c)):
                messages.append(f"{template.where} container {c.get('name')}: preStop runs `ray stop`, which drops "
                                "in-flight requests; drain the Ray node instead")
            if template.ray:
                sigterm = ray_sigterm_drain_seconds(c)
                serve = serve_graceful_shutdown_seconds(resource.props)
                parts = f"preStop {pre}s + Ray's SIGTERM drain {sigterm}s + Serve's graceful shutdown {serve}s"
                need = pre + max(sigterm + serve, minimum)
            else:
                drain = int(flag(command_line(c), "shutdown_timeout") or 0) if is_vllm(c) else 0
                parts = f"preStop {pre}s + drain {max(drain, minimum)}s"
                need = pre + max(drain, minimum)
            if grace < need:
                messages.append(f"{template.where} container {c.get('name')}: terminationGracePeriodSeconds {grace} < "
                                f"{parts}; set it to >= {need}")
    return messages


@rule("inference-probes", "vLLM",
      "Without a readiness probe a loading server gets traffic; with a liveness probe but no startup probe, the "
      "liveness probe kills it mid-download.")
def inference_probes(resource: Resource, config: Config) -> list[str]:
    messages = []
    for template in pod_templates(resource.type, resource.props, resource.name):
        if template.ray or not _behind_endpoints(resource, template):
            continue  # KubeRay injects the probes of Ray pods; bare Pods, Jobs and KServe's are not rolled here
        for c in _inference_containers(template):
            # without a liveness probe nothing kills a long download, so a startup probe is needed only beside one
            wanted = ("readinessProbe", "startupProbe") if c.get("livenessProbe") else ("readinessProbe",)
            missing = [p for p in wanted if not c.get(p)]
            if missing:
                messages.append(f"{template.where} container {c.get('name')}: missing {', '.join(missing)}; probe "
                                "/health, with a startup probe long enough for the model download")
    return messages


@dataclass(frozen=True)
class ServerSettings:
    """One vLLM server (or Ray Serve model) and the GPUs its engine may use."""

    where: str
    settings: dict[str, Any]
    gpus: int | None
    """GPUs of one model replica (a container; a LeaderWorkerSet group; a multi-node engine's pods)."""
    ray_worker_gpus: tuple[int, ...] = ()
    """For Ray Serve: the GPUs of each worker group's pods, which replicas pack into or span."""


def _multi_node(argv: list[str]) -> bool:
    return flag(argv, "distributed_executor_backend") == "ray"


def _vllm_settings(resource: Resource) -> list[ServerSettings]:
    """Each vLLM server or Ray Serve model with its engine settings and the GPUs one replica holds."""
    found: list[ServerSettings] = []
    templates = list(pod_templates(resource.type, resource.props, resource.name))
    lws = kind_of(resource.type) == LWS_KIND
    for template in templates:
        if lws and template.where.endswith(" workers"):
            continue  # the leader's engine holds the group; its workers are the rest of one replica
        for c in template.spec.get("containers") or []:
            if not is_vllm(c) or template.ray:
                continue
            argv = command_line(c)
            settings = {key: flag(argv, key) for key in
                        ("gpu_memory_utilization", "tensor_parallel_size", "pipeline_parallel_size")}
            gpus = gpu_count(c)
            if lws:
                workers = [t for t in templates if t.where.endswith(" workers")]
                size = 1 + (workers[0].replicas // max(1, template.replicas) if workers else 0)
                worker_gpus = max((gpu_count(w) or 0 for t in workers for w in t.spec.get("containers") or []),
                                  default=0)
                gpus = (gpus or 0) + (size - 1) * worker_gpus
            elif _multi_node(argv):
                gpus = None  # the engine spans pods Kubernetes does not group: nothing to compare with
            found.append(ServerSettings(f"{template.where} container {c.get('name')}", settings, gpus))
    if kind_of(resource.type).startswith("ray.io/") and kind_of(resource.type).endswith("RayService"):
        groups = tuple(sorted({g for t in templates if t.ray and not t.ray_head
                               for c in t.spec.get("containers") or [] if (g := gpu_count(c))}))
        for app, llm in llm_configs(resource.props):
            kwargs = dict(llm.get("engine_kwargs") or {})
            found.append(ServerSettings(f"RayService {name_of(resource.props, resource.name)} application {app}",
                                        kwargs, None, groups))
    return found


@rule("vllm-memory-utilization", "vLLM",
      "gpu_memory_utilization near 1.0 leaves no room for CUDA graphs, NCCL buffers and fragmentation: vLLM "
      "fails at start or under load.",
      config={"max": {"type": "number", "minimum": 0.1, "maximum": 1.0, "default": 0.95}})
def memory_utilization(resource: Resource, config: Config) -> list[str]:
    messages = []
    for server in _vllm_settings(resource):
        value = server.settings.get("gpu_memory_utilization")
        if _known(value) and float(value) > float(config["max"]):
            messages.append(f"{server.where}: gpu_memory_utilization {value} > {config['max']}; lower it (Triarch's "
                            "tuner sizes the KV cache at 0.92)")
    return messages


@rule("vllm-parallelism-matches-gpus", "vLLM",
      "vLLM starts one worker per GPU of tensor x pipeline parallelism per model replica: fewer GPUs than that and "
      "it cannot start, more and they sit idle. A replica is a container, a LeaderWorkerSet group, or for Ray Serve "
      "a placement group that packs into a worker pod or spans several (pipeline stages).")
def parallelism(resource: Resource, config: Config) -> list[str]:
    messages = []
    for server in _vllm_settings(resource):
        tp = int(server.settings.get("tensor_parallel_size") or 1)
        pp = int(server.settings.get("pipeline_parallel_size") or 1)
        needed = tp * pp
        if server.gpus is not None and needed != server.gpus:
            messages.append(f"{server.where}: tensor_parallel_size {tp} x pipeline_parallel_size {pp} = {needed} "
                            f"but the replica holds {server.gpus} GPU(s); make its GPUs equal {needed}")
        groups = server.ray_worker_gpus
        if groups and not any(g % needed == 0 or (needed % g == 0 and tp <= g) for g in groups):
            messages.append(f"{server.where}: a replica needs {needed} GPU(s) (tensor {tp} x pipeline {pp}); no worker "
                            f"group's pods ({', '.join(str(g) for g in groups)} GPU(s) each) hold a whole number of "
                            "replicas or a whole number of its pipeline stages; size a worker group to fit")
    return messages


# --- rules for workloads Triarch did not write ----------------------------------------------------------


def _covers(mount_path: str, paths: list[str]) -> bool:
    return any(mount_path == p or p.startswith(mount_path.rstrip("/") + "/") for p in paths)


@rule("model-cache-persistent", "Kubernetes",
      "A vLLM server with no volume at its model cache (HF_HOME, ~/.cache/huggingface, /models) downloads the "
      "weights into the container's own filesystem on every start: minutes to hours per restart for a large "
      "model, and the node's disk fills. Advisory: weights may come another way (a model streamer, a baked image).",
      enforcement="advisory", config={"minModelGiB": {"type": "number", "minimum": 0, "default": 2}})
def model_cache_persistent(resource: Resource, config: Config) -> list[str]:
    messages = []
    for template in _gpu_templates(resource):
        for c in containers(template.spec):
            if not is_vllm(c) or _model_gib(_served_model(c)) < float(config["minModelGiB"]):
                continue
            env = {e.get("name"): e.get("value") for e in c.get("env") or []}
            paths = [str(p) for p in (env.get("HF_HOME"), *CACHE_PATHS) if p]
            if not any(_covers(str(m.get("mountPath", "")), paths) for m in c.get("volumeMounts") or []):
                messages.append(f"{template.where} container {c.get('name')}: no volume at the model cache "
                                f"({', '.join(paths)}); mount a PersistentVolumeClaim there (or at HF_HOME)")
    return messages


def _claims(resources: list[Resource]) -> dict[tuple[str, str], Mapping[str, Any]]:
    return {((r.props.get("metadata") or {}).get("namespace", "default"), name_of(r.props, r.name)): r.props
            for r in resources if kind_of(r.type) == "core/v1:PersistentVolumeClaim"}


@rule("rwo-cache-surge", "Kubernetes",
      "A Deployment that mounts a ReadWriteOnce claim and rolls out with a surge starts the new pod beside the old "
      "one: on another node it cannot attach the volume and the rollout hangs (on the same node it may work). "
      "Recreate, maxSurge 0, or a ReadWriteMany claim.", enforcement="advisory", stack=True)
def rwo_cache_surge(resources: list[Resource], config: Config) -> list[tuple[Resource, str]]:
    claims = _claims(resources)
    found = []
    for r in resources:
        if kind_of(r.type) != "apps/v1:Deployment":
            continue
        spec = r.props.get("spec") or {}
        strategy = spec.get("strategy") or {}
        if strategy.get("type") == "Recreate" or str((strategy.get("rollingUpdate") or {}).get("maxSurge", "25%")) in (
                "0", "0%"):
            continue
        namespace = (r.props.get("metadata") or {}).get("namespace", "default")
        for volume in ((spec.get("template") or {}).get("spec") or {}).get("volumes") or []:
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            modes = ((claims.get((namespace, str(claim))) or {}).get("spec") or {}).get("accessModes") or []
            if claim and modes == ["ReadWriteOnce"]:
                found.append((r, f"Deployment {name_of(r.props, r.name)}: mounts the ReadWriteOnce claim {claim} and "
                                 "rolls out with a surge; set strategy Recreate (or rollingUpdate.maxSurge 0), or "
                                 "use a ReadWriteMany claim"))
    return found


@rule("gpu-server-resources", "Kubernetes",
      "A GPU server without CPU and memory requests is scheduled as if it needed none and is the first evicted "
      "when the node runs short (BestEffort or Burstable QoS): tokenization, the API server and the weights' page "
      "cache need both. Advisory.", enforcement="advisory")
def gpu_server_resources(resource: Resource, config: Config) -> list[str]:
    messages = []
    for template in _gpu_templates(resource):
        for c in template.spec.get("containers") or []:
            if not (gpu_count(c) or 0):
                continue
            resources_ = c.get("resources") or {}
            # a limit is also the request where none is given
            given = {**(resources_.get("limits") or {}), **(resources_.get("requests") or {})}
            missing = [k for k in ("cpu", "memory") if k not in given]
            if missing:
                messages.append(f"{template.where} container {c.get('name')}: no {' or '.join(missing)} request; set "
                                "requests (equal to limits for Guaranteed QoS)")
    return messages


FLOATING_DRIVER_SELECTORS = {"cloud.google.com/gke-gpu-driver-version": ("latest", "default")}
"""Node labels that pick a driver by a moving name (GKE installs the newest or the default driver it has)."""


@rule("pinned-gpu-driver", "Kubernetes",
      "A pod that selects nodes by a moving driver name (GKE's gke-gpu-driver-version: latest) gets whatever driver "
      "the platform ships that day: a new driver can break the serving image's CUDA (the forward-compatibility "
      "trap). Pin the driver version the image was checked against.")
def pinned_gpu_driver(resource: Resource, config: Config) -> list[str]:
    messages = []
    for template in _gpu_templates(resource):
        selector = template.spec.get("nodeSelector") or {}
        for key, moving in FLOATING_DRIVER_SELECTORS.items():
            if str(selector.get(key)) in moving:
                messages.append(f"{template.where}: nodeSelector {key}: {selector.get(key)} floats with the "
                                "platform; pin a driver version the image's CUDA is checked against")
    return messages


@rule("serve-graceful-shutdown", "Ray",
      "Ray Serve gives a replica graceful_shutdown_timeout_s to finish its requests when it scales down or is "
      "replaced; a few seconds cuts every long generation at each downscale. A value set below `minSeconds` is "
      "flagged (Serve's own default, 20 s, is not).",
      enforcement="advisory", config={"minSeconds": {"type": "integer", "minimum": 0, "default": 10}})
def serve_graceful_shutdown(resource: Resource, config: Config) -> list[str]:
    if not kind_of(resource.type).endswith("RayService"):
        return []
    least = int(config["minSeconds"])
    messages = []
    for app, llm in llm_configs(resource.props):
        value = (llm.get("deployment_config") or {}).get("graceful_shutdown_timeout_s")
        if _known(value) and float(value) < least:
            messages.append(f"RayService {name_of(resource.props, resource.name)} application {app}: "
                            f"graceful_shutdown_timeout_s {value} cuts long generations at every downscale; set it "
                            f">= {least} (and a grace period that covers it)")
    for application in serve_applications(resource.props):
        for deployment in application.get("deployments") or []:
            value = deployment.get("graceful_shutdown_timeout_s") if isinstance(deployment, Mapping) else None
            if _known(value) and float(value) < least:
                messages.append(f"RayService {name_of(resource.props, resource.name)} application "
                                f"{application.get('name', '?')} deployment {deployment.get('name', '?')}: "
                                f"graceful_shutdown_timeout_s {value}; set it >= {least}")
    return messages


SECRET_ENV = re.compile(r"(TOKEN|API_KEY|APIKEY|SECRET|PASSWORD|ACCESS_KEY)$", re.IGNORECASE)
"""Environment variable names that carry credentials (HF_TOKEN, HUGGING_FACE_HUB_TOKEN, VLLM_API_KEY, ...)."""


@rule("no-plaintext-secrets", "Kubernetes",
      "A token or key written into a manifest's env (`value:`) is in every copy of the manifest, its Git history "
      "and `kubectl get -o yaml` for anyone who may read the workload; take it from a Secret (`valueFrom`). "
      "Placeholders count too: the manifest invites pasting the real token in.")
def no_plaintext_secrets(resource: Resource, config: Config) -> list[str]:
    messages = []
    for template in pod_templates(resource.type, resource.props, resource.name):
        for c in containers(template.spec):
            for entry in c.get("env") or []:
                name = str(entry.get("name", ""))
                if SECRET_ENV.search(name) and entry.get("value") not in (None, "", UNKNOWN):
                    messages.append(f"{template.where} container {c.get('name')}: env {name} is written in the "
                                    "manifest; read it from a Secret (valueFrom.secretKeyRef)")
    return messages


# --- stack: driver/CUDA -----------------------------------------------------------------------------------


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


@rule("driver-cuda-compatible", "Kubernetes",
      "A node driver older than the CUDA inside the serving image fails at start (cudaGetDeviceCount errors): "
      "every image scheduled on a GPU pool must run on that pool's pinned driver.", stack=True)
def driver_cuda(resources: list[Resource], config: Config) -> list[tuple[Resource, str]]:
    nodes, found = _pool_nodes(resources)
    for r in resources:
        for template in _gpu_templates(r):
            for pool in _selected_pools(template.spec, nodes):
                found += _images_on_pool(r, template, nodes[pool])
    return found


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
        image = facts.image(image_ref)
        if image is None:
            found.append((r, f"{template.where}: image {image_ref} is not in templates/compat/images.yaml, so its "
                             "CUDA version is unknown; add it with its CUDA version and source"))
            continue
        verdict = check_image_on_node(image, node, facts)
        if verdict.level == "error":
            found.append((r, f"{template.where}: {verdict.message}"))
    return found


# --- stack: placement and capacity (triarch.guardrails.placement) -------------------------------------------------


def _placement_rule(rule_id: str) -> StackCheck:
    def check(resources: list[Resource], config: Config) -> list[tuple[Resource, str]]:
        by_urn = {r.urn: r for r in resources}
        return [(by_urn.get(f.urn) or Resource(f.resource_type, f.resource_name, {}, f.urn), f.message)
                for f in prove(resources).findings if f.rule == rule_id]
    return check


rule("pod-placement", "Kubernetes",
     "Every pod template can run somewhere: some pool's nodes match its node selector and affinity, it tolerates "
     "their taints, and one pod fits a node's allocatable CPU, memory and GPUs after the kubelet's reserve and the "
     "DaemonSets there. Otherwise its pods stay Pending for ever.", stack=True)(_placement_rule("pod-placement"))
rule("pool-capacity", "Kubernetes",
     "At their largest (maximum replicas, a rollout's surge, a RayService upgrade's second cluster) a pool's "
     "workloads fit its maximum node count, and a hard zone spread can be met with the pool's zones and nodes.",
     stack=True)(_placement_rule("pool-capacity"))
rule("pool-scale-from-zero", "Kubernetes",
     "A pool that may have no node needs something that adds one when a pod is pending (a Karpenter NodePool); "
     "a managed node group at zero stays at zero.", stack=True)(_placement_rule("pool-scale-from-zero"))
