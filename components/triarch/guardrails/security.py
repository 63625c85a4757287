"""Security: what a serving stack must not open. No privileged pods or GPU resets from a pod, pinned images and
charts, IMDSv2 on the nodes, Ray's ports inside the cluster, the serving namespaces closed both ways, and no
plaintext secrets in env."""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any

from triarch.datafiles import read_yaml
from triarch.guardrails.base import Config, Resource, rule, stack_rule
from triarch.guardrails.common import NODE_CLASS, gpu_templates, known
from triarch.guardrails.workloads import (
    command_line,
    containers,
    hook_commands,
    kind_of,
    name_of,
    pod_templates,
    ray_cluster_spec,
)
from triarch.images import FLOATING_TAGS, ImageError
from triarch.images import parse as parse_image
from triarch.known import KNOWN_AFTER_APPLY as UNKNOWN
from triarch.paths import COMPAT_DIR

EXEMPTION = {"type": "object", "required": ["name", "reason"],
             "properties": {"namespace": {"type": "string"}, "name": {"type": "string"},
                            "reason": {"type": "string", "minLength": 1}}}


def _exempt(resource: Resource, exemptions: list[Mapping[str, Any]]) -> bool:
    """Whether the config exempts the resource (by name, and namespace when given; each exemption has a reason)."""
    metadata = resource.props.get("metadata") or {}
    name, namespace = name_of(resource.props, resource.name), metadata.get("namespace")
    return any(e.get("name") == name and e.get("namespace") in (None, namespace) for e in exemptions)


@cache
def agent_needs() -> tuple[dict[str, str], ...]:
    """The privileges node agents document a need for (templates/compat/node-agent-needs.yaml)."""
    data = read_yaml(COMPAT_DIR / "node-agent-needs.yaml")
    return tuple(data["needs"])


def documented_need(images: list[str], privilege: str) -> dict[str, str] | None:
    """The need a node agent's image documents for `privilege` (a capability or a host field), if any."""
    for image in images:
        try:
            repository = parse_image(image).repository
        except ImageError:
            continue
        for need in agent_needs():
            if (repository == need["image"] or repository.endswith("/" + need["image"])) and privilege in (
                    need.get("capability"), need.get("host")):
                return need
    return None


def _needed(where: str, privilege: str, need: dict[str, str]) -> str:
    return (f"{where}: {privilege} is what {need['agent']} needs for {need['for']} ({need['source']}); without it "
            f"{need['without']}. Keep it by listing this agent in `exempt` with that reason, or remove it and lose "
            "them")


def no_privileged(resource: Resource, config: Config) -> list[str]:
    if _exempt(resource, list(config["exempt"])):
        return []
    allowed = {str(c).upper().removeprefix("CAP_") for c in config["allowedCapabilities"]}
    messages = []
    for template in pod_templates(resource.type, resource.props, resource.name):
        images = [str(c.get("image") or "") for c in containers(template.spec)]
        for host in ("hostPID", "hostIPC", "hostNetwork"):
            if template.spec.get(host):
                need = documented_need(images, host)
                messages.append(_needed(template.where, host, need) if need else
                                f"{template.where}: {host} is true; remove it (or exempt this node agent with its "
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
            where = f"{template.where} container {c.get('name')}"
            needed = {cap: documented_need([str(c.get("image") or "")], cap) for cap in sorted(added - allowed)}
            messages += [_needed(where, cap, need) for cap, need in needed.items() if need]
            extra = [cap for cap, need in needed.items() if not need]
            if extra:
                messages.append(f"{where}: adds {extra}; drop them (the device plugin, not a capability, gives "
                                "access to the GPU), or exempt this node agent")
    return messages


NO_PRIVILEGED_PODS = rule(
    "no-privileged-pods", "Kubernetes",
    "GPUs reach containers through the device plugin and the container toolkit: a serving workload needs no "
    "privileged mode, no host PID, IPC or network namespace, no Unconfined seccomp profile and no capability "
    "beyond `allowedCapabilities`; each hands the node to anyone who compromises the pod. Node agents that need one "
    "(a DCGM exporter collecting profiling metrics) are listed in `exempt` with the reason.",
    no_privileged,
    config={"allowedCapabilities": {"type": "array", "items": {"type": "string"}, "default": ["NET_BIND_SERVICE"]},
            "exempt": {"type": "array", "items": EXEMPTION, "default": []}})


DEVICE_RESET = re.compile(r"nvidia-smi\b[^;&|\n]*\s(-r|--gpu-reset|-rgc|--reset-gpu-clocks)\b|--gpu-reset"
                          r"|/sys/bus/pci/devices/[^\s]*/(reset|remove)")
"""nvidia-smi's reset switches wherever they sit (`nvidia-smi -i 0 -r`), and PCI resets through sysfs."""


def no_device_reset(resource: Resource, config: Config) -> list[str]:
    messages = []
    for template in pod_templates(resource.type, resource.props, resource.name):
        for c in containers(template.spec):
            texts = [*hook_commands(c), " ".join(command_line(c))]
            if any(DEVICE_RESET.search(text) for text in texts):
                messages.append(f"{template.where} container {c.get('name')}: resets the GPU device; remove the "
                                "reset and drain requests in preStop instead")
    return messages


NO_DEVICE_RESET = rule(
    "no-device-reset", "Kubernetes",
    "Resetting a GPU from a pod (nvidia-smi --gpu-reset in a hook) needs exclusive root access to the device and "
    "kills every other process on it; drain instead.",
    no_device_reset)


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


PINNED_IMAGES = rule(
    "pinned-images", "Kubernetes",
    "A moving tag changes the CUDA inside the image under a pinned driver: every image carries a version tag "
    "or a digest, never :latest.",
    pinned_images)


def _pinned_release(resource: Resource) -> list[str]:
    """A Helm release pins its chart version, and any image tag it sets in values is not :latest."""
    messages = []
    name = resource.props.get("name") or resource.name
    if not known(resource.props.get("version")):
        messages.append(f"Helm release {name}: chart {resource.props.get('chart')} has no version; pin one")
    tag = ((resource.props.get("values") or {}).get("image") or {}).get("tag")
    if tag in FLOATING_TAGS:
        messages.append(f"Helm release {name}: values image.tag is {tag}, which moves; pin a version tag")
    return messages


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
    if known(hops) and int(hops) > int(config["maxHopLimit"]):
        messages.append(f"{where}: hop limit {hops} lets pods reach IMDS; set "
                        f"httpPutResponseHopLimit <= {config['maxHopLimit']}")
    return messages


IMDSV2_REQUIRED = rule(
    "imdsv2-required", "Kubernetes",
    "Pods must not reach the node's instance credentials: launch templates require IMDSv2 tokens with a hop "
    "limit that stops at the node.",
    imdsv2, config={"maxHopLimit": {"type": "integer", "minimum": 1, "default": 1}})


RAY_PORTS = {6379: "GCS", 8265: "dashboard", 10001: "Ray client"}


RAY_PORT_NAMES = {6379: "gcs-server", 8265: "dashboard", 10001: "client"}
"""The names KubeRay gives those ports on the head pod."""


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


RAY_PORTS_INTERNAL = rule(
    "ray-ports-internal", "Ray",
    "The Ray dashboard, GCS and client ports run arbitrary code on the cluster: they never leave it through a "
    "LoadBalancer, NodePort or Ingress.",
    ray_ports)


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


def serving_network(resources: list[Resource], config: Config) -> list[tuple[Resource, str]]:
    serving: dict[str, Resource] = {}
    for r in resources:
        if gpu_templates(r):
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


SERVING_NETWORK_ISOLATED = stack_rule(
    "serving-network-isolated", "Kubernetes",
    "A GPU server's namespace is closed both ways by default: a NetworkPolicy selecting every pod for Ingress "
    "and one for Egress, and no rule admitting every namespace or address. Otherwise any pod in the cluster "
    "calls the models (and Ray's ports), and a model server can reach the API server and the nodes. Judged where "
    "the namespace is created or policed in the same resources.",
    serving_network)


RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
"""vLLM's switch for /v1/load_lora_adapter and /v1/unload_lora_adapter on the serving port (vllm/envs.py, 0.29.0:
true for "1" or "true", any case; vllm/entrypoints/serve/lora/api_router.py mounts them only then)."""
INTERNAL_LB_ANNOTATIONS = {"service.beta.kubernetes.io/aws-load-balancer-scheme": "internal",
                           "service.beta.kubernetes.io/aws-load-balancer-internal": "true"}
"""A LoadBalancer Service the AWS load balancer controller (or the in-tree provider) keeps inside the VPC."""
TEMPLATE_KINDS = {"apps/v1:Deployment", "apps/v1:StatefulSet", "apps/v1:ReplicaSet", "apps/v1:DaemonSet"}


def _runtime_lora_pods(resource: Resource) -> list[tuple[str, Mapping[str, Any]]]:
    """(where, pod labels) of each pod template of `resource` whose containers turn runtime adapter loading on."""
    kind = kind_of(resource.type)
    props = resource.props
    spec = props.get("spec") or {}
    if kind in TEMPLATE_KINDS:
        template = spec.get("template") or {}
    elif kind == "core/v1:Pod":
        template = props
    else:
        return []
    pod = template.get("spec") or {}
    on = any(str(e.get("name")) == RUNTIME_LORA_ENV and str(e.get("value", "")).strip().lower() in ("1", "true")
             for c in containers(pod) for e in c.get("env") or [])
    labels = (template.get("metadata") or {}).get("labels") or {}
    return [(f"{kind.rsplit(':', 1)[-1]} {name_of(props, resource.name)}", labels)] if on else []


def _routes_from_outside(resources: list[Resource]) -> tuple[dict[tuple[str, str], str], set[tuple[str, str]]]:
    """Services by (namespace, name) that take traffic from outside the cluster themselves (LoadBalancer not kept
    internal, NodePort), with how; and the (namespace, Service) pairs an Ingress or an HTTPRoute sends to."""
    exposed: dict[tuple[str, str], str] = {}
    routed: set[tuple[str, str]] = set()
    for r in resources:
        kind, props = kind_of(r.type), r.props
        spec = props.get("spec") or {}
        where = (_namespace_of(r), name_of(props, r.name))
        if kind == "core/v1:Service" and spec.get("type") in ("LoadBalancer", "NodePort"):
            annotations = (props.get("metadata") or {}).get("annotations") or {}
            if spec["type"] == "NodePort" or not any(str(annotations.get(k, "")).lower() == v
                                                     for k, v in INTERNAL_LB_ANNOTATIONS.items()):
                exposed[where] = f"Service {where[1]} ({spec['type']})"
        elif kind == "networking.k8s.io/v1:Ingress":
            backends = [path.get("backend") or {} for rule_ in spec.get("rules") or []
                        for path in ((rule_.get("http") or {}).get("paths") or [])]
            backends.append(spec.get("defaultBackend") or {})
            routed |= {(where[0], str(b["service"]["name"])) for b in backends if (b.get("service") or {}).get("name")}
        elif kind.startswith("gateway.networking.k8s.io/") and kind.endswith(":HTTPRoute"):
            for rule_ in spec.get("rules") or []:
                routed |= {(str(ref.get("namespace") or where[0]), str(ref["name"]))
                           for ref in rule_.get("backendRefs") or [] if ref.get("name") and
                           ref.get("kind", "Service") == "Service"}
    return exposed, routed


def runtime_lora_public(resources: list[Resource], config: Config) -> list[tuple[Resource, str]]:
    exposed, routed = _routes_from_outside(resources)
    selectors = {(_namespace_of(r), name_of(r.props, r.name)): (r.props.get("spec") or {}).get("selector") or {}
                 for r in resources if kind_of(r.type) == "core/v1:Service"}
    found = []
    for resource in resources:
        for where, labels in _runtime_lora_pods(resource):
            namespace = _namespace_of(resource)
            for (ns, service), selector in sorted(selectors.items()):
                if ns != namespace or not selector or any(labels.get(k) != v for k, v in selector.items()):
                    continue
                route = exposed.get((ns, service)) or (f"an Ingress or HTTPRoute to Service {service}"
                                                       if (ns, service) in routed else None)
                if route:
                    found.append((resource, f"{where} sets {RUNTIME_LORA_ENV}, and {route} takes traffic from "
                                            "outside the cluster: any client may load or unload adapters; load them "
                                            "at start (--lora-modules) or keep the route inside the cluster"))
    return found


RUNTIME_LORA_NEVER_PUBLIC = stack_rule(
    "runtime-lora-never-public", "Kubernetes",
    "vLLM's runtime adapter loading (VLLM_ALLOW_RUNTIME_LORA_UPDATING) lets any caller of the serving port load an "
    "adapter from a path or repo it names, or unload one others use: never on a pod a LoadBalancer (not annotated "
    "internal), NodePort, Ingress or HTTPRoute reaches from outside the cluster. Triarch loads adapters at start.",
    runtime_lora_public)


SECRET_ENV = re.compile(r"(TOKEN|API_KEY|APIKEY|SECRET|PASSWORD|ACCESS_KEY)$", re.IGNORECASE)
"""Environment variable names that carry credentials (HF_TOKEN, HUGGING_FACE_HUB_TOKEN, VLLM_API_KEY, ...)."""


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


NO_PLAINTEXT_SECRETS = rule(
    "no-plaintext-secrets", "Kubernetes",
    "A token or key written into a manifest's env (`value:`) is in every copy of the manifest, its Git history "
    "and `kubectl get -o yaml` for anyone who may read the workload; take it from a Secret (`valueFrom`). "
    "Placeholders count too: the manifest invites pasting the real token in.",
    no_plaintext_secrets)
