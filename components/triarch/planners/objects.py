"""Every Kubernetes object Triarch creates from plain data, planned once before any resource exists.

The components register exactly these objects; the checks here run on them first, so two objects that would
claim one name, or a name or label Kubernetes refuses, stop the plan with one line naming the key that decided
it, instead of an object silently overwriting another or `pulumi up` failing halfway.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from triarch.catalog import Catalog
from triarch.config import StackConfig
from triarch.errors import ConfigError
from triarch.matrix import deployed_images, images_by_engine
from triarch.planners import karpenter, monitoring, picker, pods
from triarch.planners.capacity import check_capacity
from triarch.planners.dashboard import dashboard, dashboard_config_map
from triarch.planners.device_plugin import NAMESPACE as DEVICE_PLUGIN_NAMESPACE
from triarch.planners.efa import efa_namespace
from triarch.planners.lws import lws_namespace, needs_lws
from triarch.planners.model_plan import ModelPlan
from triarch.planners.nodegroups import plan_eks_pool
from triarch.planners.observability import observability_manifests, scrape_policy
from triarch.planners.queries import check_queries, shipped_queries
from triarch.planners.ray import RAY_SERVICE, ray_manifests
from triarch.planners.registry import ECR_HOST
from triarch.planners.serving import KUBERAY_NAMESPACE, network_policies, serving_settings
from triarch.planners.vllm import vllm_manifests
from triarch.planners.warm import priority_class, uses_placeholders, warm_manifests

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_VALUE_MAX = 63
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_LABEL_MAX = 63
DNS_SUBDOMAIN_MAX = 253
LABEL_NAMED_KINDS = {"Namespace", "Service"}
"""Kinds whose names must be DNS labels (63 characters): Kubernetes makes DNS names of them."""
RESERVED_NAMESPACES = {"default", "kube-system", "kube-public", "kube-node-lease"}
"""Namespaces every cluster has: Triarch must not try to create (and, on destroy, delete) them."""
KUBERAY_SERVICES = ("head-svc", "serve-svc")
"""Services the KubeRay operator creates for a RayService `<name>`: `<name>-head-svc`, `<name>-serve-svc`
(utils.GenerateHeadServiceName / GenerateServeServiceName, KubeRay v1.7.0)."""


@dataclass(frozen=True)
class Owner:
    """What decides an object: a stack key and its value, or Triarch itself (no key a user can change)."""

    path: str
    value: str | None = None


@dataclass(frozen=True)
class KubernetesPlan:
    """The objects of each component, and who decided each one (for the messages)."""

    device_plugin: list[dict[str, Any]] = field(default_factory=list)
    kuberay: list[dict[str, Any]] = field(default_factory=list)
    serving: list[dict[str, Any]] = field(default_factory=list)
    vllm: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    ray: list[dict[str, Any]] = field(default_factory=list)
    node_pools: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    observability: list[dict[str, Any]] = field(default_factory=list)
    """PodMonitors, the PrometheusRule and KEDA ScaledObjects (triarch.planners.observability)."""
    owners: list[tuple[Owner, dict[str, Any]]] = field(default_factory=list)
    """Every object above with what decided it, plus those created apart (the token Secret) or by an operator
    from ours (KubeRay's Services), which can collide as well."""
    lws: list[dict[str, Any]] = field(default_factory=list)
    """The LeaderWorkerSet controller's namespace, where Triarch installs it for a vllm model across nodes."""
    efa: list[dict[str, Any]] = field(default_factory=list)
    """The EFA device plugin's namespace, where a pool asks for EFA."""
    warm: list[dict[str, Any]] = field(default_factory=list)
    """Warm capacity (triarch.planners.warm): CapacityBuffers and their PodTemplates, or placeholder Deployments and
    their PriorityClass."""


def plan_kubernetes(stack: StackConfig, models: list[ModelPlan], facts: Catalog, secrets: Iterable[str] = ()
                    ) -> KubernetesPlan:
    """The objects a stack creates (`secrets`: the Triarch secret keys the stack sets, e.g. hfToken); raises
    ConfigError where two collide or one would be refused, or where the pools cannot hold what the workloads need
    over time (triarch.planners.capacity)."""
    check_capacity(stack, models, facts)
    owners: list[tuple[Owner, dict[str, Any]]] = []
    device_plugin = []
    if stack.device_plugin.mode == "install":
        device_plugin = [pods.namespace(
            DEVICE_PLUGIN_NAMESPACE, "privileged",
            "the device plugin mounts the kubelet's device-plugin socket directory (hostPath), and GPU feature "
            "discovery runs privileged as the chart ships it; nothing else runs here")]
        owners += [(Owner("the NVIDIA device plugin"), o) for o in device_plugin]

    node_pools: dict[str, list[dict[str, Any]]] = {}
    efa: list[dict[str, Any]] = []
    if stack.cluster.create and any(group.efa for group in stack.node_groups):
        efa = [efa_namespace()]
        owners += [(Owner("the EFA device plugin"), o) for o in efa]
    if stack.cluster.create:
        for i, group in enumerate(stack.node_groups):
            plan = plan_eks_pool(stack, group, facts)
            if plan.provisioner == "karpenter":
                node_pools[group.name] = [karpenter.node_class(plan, stack.cluster.name), karpenter.node_pool(plan)]
                owners += [(Owner(f"triarch:nodeGroups[{i}].name", group.name), o) for o in node_pools[group.name]]

    if "grafanaAdminPassword" in set(secrets) and stack.prometheus != "install":
        raise ConfigError("triarch:grafanaAdminPassword", None,
                          f"is set, but Triarch installs no Grafana here (observability.prometheus is "
                          f"'{stack.prometheus}')", "unset it (pulumi config rm triarch:grafanaAdminPassword), or "
                          "observability.prometheus: install", show_value=False)
    registry = stack.registry
    if "registryPassword" in set(secrets) and (registry.username is None or registry.credentials_host is None):
        raise ConfigError("triarch:registry.username" if registry.username is None else "triarch:registry.server",
                          None, "is not set, but triarch:registryPassword is (the registry's credentials)",
                          "the user the password belongs to (registry.username), and the registry host "
                          "(registry.server, unless registry.images is one prefix)", show_value=False)
    if registry.username is not None and "registryPassword" not in set(secrets):
        raise ConfigError("triarch:registryPassword", None, f"is not set, but registry.username is "
                          f"('{registry.username}')", "pulumi config set --secret triarch:registryPassword <password>",
                          show_value=False)
    if registry.username is not None and registry.credentials_host and ECR_HOST.match(registry.credentials_host):
        # An ECR password is an authorization token, valid for 12 hours (AWS ECR User Guide, "Private registry
        # authentication"): a pull Secret made of one stops working the next day. The node roles pull instead.
        raise ConfigError("triarch:registry.username", registry.username,
                          f"gives credentials for {registry.credentials_host}, an ECR registry, whose passwords "
                          "expire after 12 hours; the node roles pull from ECR with their own permissions",
                          "no registry.username and no triarch:registryPassword for ECR (pulumi config rm "
                          "triarch:registryPassword)")
    result = KubernetesPlan(device_plugin=device_plugin, node_pools=node_pools, owners=owners, efa=efa)
    if not models:
        check_objects(owners)
        return result

    given = set(secrets)
    settings = serving_settings(stack, with_token="hfToken" in given, with_api_key="vllmApiKey" in given,
                                with_pull_secret="registryPassword" in given)
    if settings.namespace in RESERVED_NAMESPACES:
        raise ConfigError("triarch:serving.namespace", settings.namespace,
                          "is a namespace every cluster has, which Triarch would create and delete",
                          "a namespace of its own, e.g. llm")
    with_ray = any(m.config.engine == "ray-serve" for m in models)
    if settings.with_api_key and with_ray:
        # Ray Serve's OpenAI app (ray.serve.llm) has no API-key check and ignores VLLM_API_KEY
        # (ray-project/ray#55369, #59578): a key would protect only some of the models.
        ray_models = [m.name for m in models if m.config.engine == "ray-serve"]
        raise ConfigError("triarch:vllmApiKey", None,
                          f"is checked by vLLM's own server only; Ray Serve does not check it, so "
                          f"{', '.join(ray_models)} (engine ray-serve) would answer without it",
                          "engine: vllm for every model, or no key (restrict callers with serving.clientNamespaces)",
                          show_value=False)
    for i, model in enumerate(models):
        routing = model.config.prefix_routing
        if model.config.engine == "vllm" and routing is not None and routing.enabled and model.multi_node:
            raise ConfigError(f"triarch:models[{i}].prefixRouting.enabled", True,
                              f"puts an endpoint picker in front of the model's pods, but a replica spans "
                              f"{model.nodes_per_replica} nodes (a LeaderWorkerSet) and the picker would route "
                              "to its workers too",
                              "prefixRouting.enabled: false, or a replica within one node")
    with_pickers = any(picker.routed(m) for m in models)
    serving = [pods.namespace(settings.namespace, "restricted",
                              "inference pods run as non-root with no added capabilities"),
               *network_policies(settings, with_ray, with_gangs=needs_lws(models), with_pickers=with_pickers),
               *scrape_policy(stack, settings.namespace, with_ray, with_pickers)]
    owners += [(Owner("triarch:serving.namespace", settings.namespace), o) for o in serving]
    for present, secret in ((settings.with_token, pods.HF_TOKEN_SECRET), (settings.with_api_key, pods.API_KEY_SECRET)):
        if present:
            owners.append((Owner(f"the Secret {secret}"), {"apiVersion": "v1", "kind": "Secret", "metadata": {
                "name": secret, "namespace": settings.namespace}}))

    vllm: dict[str, list[dict[str, Any]]] = {}
    for i, model in enumerate(models):
        if model.config.engine == "vllm":
            vllm[model.name] = vllm_manifests(model, settings)
            owners += [(Owner(f"triarch:models[{i}].name", model.name), o) for o in vllm[model.name]]

    warm: list[dict[str, Any]] = [priority_class()] if uses_placeholders(stack, models) else []
    if warm:
        owners.append((Owner("the warm capacity's placeholders"), warm[0]))
    for i, model in enumerate(models):
        found = warm_manifests(stack, model, settings)
        warm += found
        owners += [(Owner(f"triarch:models[{i}].warmReplicas", str(model.config.warm_replicas)), o) for o in found]

    lws: list[dict[str, Any]] = []
    if needs_lws(models) and stack.leader_worker_set.mode == "install":
        lws = [lws_namespace()]
        owners += [(Owner("the LeaderWorkerSet controller"), o) for o in lws]

    kuberay: list[dict[str, Any]] = []
    ray = ray_manifests(models, deployed_images(stack)["ray-serve"], images_by_engine(stack, facts)["ray-serve"],
                        settings)
    if ray and stack.kuberay.mode == "install":
        kuberay = [pods.namespace(KUBERAY_NAMESPACE, "restricted",
                                  "the operator runs non-root, read-only, with no capabilities")]
        owners += [(Owner("the KubeRay operator"), o) for o in kuberay]
    if ray:
        owners += [(Owner(f"the RayService {RAY_SERVICE} of the ray-serve models"), o) for o in ray]
        owners += [(Owner(f"the KubeRay operator (for the RayService {RAY_SERVICE})"),
                    {"apiVersion": "v1", "kind": "Service",
                     "metadata": {"name": f"{RAY_SERVICE}-{suffix}", "namespace": settings.namespace}})
                   for suffix in KUBERAY_SERVICES]
    observed = stack.observability
    if stack.prometheus == "install":
        owners.append((Owner("triarch:observability.prometheus", "install"), monitoring.prometheus_namespace(stack)))
    if stack.prometheus != "none" and observed.dcgm_exporter:
        owners.append((Owner("triarch:observability.dcgmExporter", "true"), monitoring.dcgm_namespace()))
    if observed.keda == "install":
        owners.append((Owner("triarch:observability.keda", "install"), monitoring.keda_namespace()))
    observability = observability_manifests(stack, models, settings)
    if observability:
        board = dashboard(stack, models, settings.namespace)
        check_queries(shipped_queries(observability, board))
        observability.append(dashboard_config_map(stack, board))
    owners += [(Owner("triarch:observability.prometheus", stack.prometheus), o)
               for o in observability]
    check_objects(owners)
    return KubernetesPlan(device_plugin, kuberay, serving, vllm, ray, node_pools, observability, owners, lws=lws,
                          efa=efa, warm=warm)


def _identity(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    metadata = obj.get("metadata") or {}
    return str(obj["kind"]), str(metadata.get("namespace") or ""), str(metadata.get("name"))


def _show(identity: tuple[str, str, str]) -> str:
    kind, namespace, name = identity
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def check_objects(owners: list[tuple[Owner, dict[str, Any]]]) -> None:
    """No two objects of one kind, namespace and name; every name and label value as Kubernetes accepts it."""
    seen: dict[tuple[str, str, str], Owner] = {}
    for owner, obj in owners:
        identity = _identity(obj)
        first = seen.setdefault(identity, owner)
        if first is not owner:
            # Name the key a user can change; the other side is said in words.
            blamed, other = (owner, first) if owner.value is not None else (first, owner)
            raise ConfigError(blamed.path, blamed.value,
                              f"gives {_show(identity)}, which {_describe(other)} also creates", "another name")
        problem = _name_problem(identity[0], identity[2])
        if problem:
            raise ConfigError(owner.path, owner.value, f"gives {_show(identity)}, {problem}", "a shorter name")
        for where, key, value in _labels(obj):
            if len(value) > LABEL_VALUE_MAX or not LABEL_VALUE.match(value):
                raise ConfigError(owner.path, owner.value,
                                  f"gives label {key}={value} in {_show(identity)} ({where}), which Kubernetes "
                                  f"refuses (at most {LABEL_VALUE_MAX} characters: letters, digits, '-', '_', '.')",
                                  "a shorter name")


def _describe(owner: Owner) -> str:
    return f"{owner.path} {owner.value!r}" if owner.value is not None else owner.path


def _name_problem(kind: str, name: str) -> str | None:
    if kind in LABEL_NAMED_KINDS:
        if len(name) > DNS_LABEL_MAX or not DNS_LABEL.match(name):
            return f"a name Kubernetes refuses for a {kind} (a DNS label: at most {DNS_LABEL_MAX} characters)"
    elif len(name) > DNS_SUBDOMAIN_MAX:
        return f"a name longer than the {DNS_SUBDOMAIN_MAX} characters Kubernetes allows"
    return None


def _labels(value: Any, path: str = "") -> Iterator[tuple[str, str, str]]:
    """(where, key, value) of every label map (`labels`, `matchLabels`, `nodeSelector`) anywhere in an object."""
    if isinstance(value, Mapping):
        for key, child in value.items():
            where = f"{path}.{key}" if path else str(key)
            if key in ("labels", "matchLabels", "nodeSelector") and isinstance(child, Mapping):
                for label, label_value in child.items():
                    yield where, str(label), str(label_value)
            else:
                yield from _labels(child, where)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _labels(item, f"{path}[{i}]")
