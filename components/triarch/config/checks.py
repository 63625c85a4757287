"""Checks that span fields or need the catalog: a stack that passes here can be planned. Each raises one
ConfigError naming the key path, before any resource is registered."""

from __future__ import annotations

import re
from ipaddress import IPv4Network

from triarch.addressing import plan_subnets
from triarch.catalog import Catalog, charts
from triarch.config.base import NAMESPACE, key_path, required_when
from triarch.config.platform import ImagePin
from triarch.config.pools import (
    SYSTEM_RELEASE_TABLE,
    check_ami_release,
    check_node_group,
    check_sold_in_region,
    gpus_per_node,
    pool_provisioner,
    unknown,
)
from triarch.config.schema import (
    DEFAULT_KV_CONNECTOR,
    SUPPORTED_KUBERNETES,
    UPSTREAM_IMAGES,
    ClusterConfig,
    DisaggregationConfig,
    ModelConfig,
    PrefixRoutingConfig,
    RoleConfig,
    StackConfig,
    admin_key,
)
from triarch.disaggregation import PREFILL_SUFFIX, ROLES
from triarch.disaggregation import facts as pd_facts
from triarch.errors import ConfigError
from triarch.images import ImageError, chart_release, parse_host, parse_prefix, release_of
from triarch.kv_offload import offload_facts


def _cluster_path(key: str) -> str:
    return f"{NAMESPACE}:cluster.{key}"


DOCUMENTATION_RANGES = (IPv4Network("192.0.2.0/24"), IPv4Network("198.51.100.0/24"), IPv4Network("203.0.113.0/24"))
"""TEST-NET-1, -2 and -3, reserved for documentation (RFC 5737, section 3): no caller's address is in them."""
EGRESS_HINT = ("your egress address as /32 (`curl -s https://checkip.amazonaws.com`) and your CI runners' ranges, "
               "or [] for a private endpoint reached through privateAccessCidrs")


def check_endpoint_access(cluster: ClusterConfig) -> None:
    """A created cluster says who reaches its API server: after EKS spends its minutes creating the cluster, the
    Kubernetes half of `pulumi up` needs a way in, and no default could be the user's address."""
    path = _cluster_path("endpointPublicAccessCidrs")
    if cluster.endpoint_public_access_cidrs is None:
        raise ConfigError(path, None, f"{required_when(path)}: who may reach the API server from outside the VPC, "
                          "`pulumi up` among them", EGRESS_HINT)
    for key, cidrs in (("endpointPublicAccessCidrs", cluster.endpoint_public_access_cidrs),
                       ("privateAccessCidrs", cluster.private_access_cidrs)):
        for i, cidr in enumerate(cidrs):
            if any(cidr.subnet_of(doc) for doc in DOCUMENTATION_RANGES):
                raise ConfigError(f"{_cluster_path(key)}[{i}]", str(cidr),
                                  "is a range reserved for documentation (RFC 5737): no caller is in it",
                                  EGRESS_HINT if key == "endpointPublicAccessCidrs" else
                                  "your VPN's, peered VPC's or bastion's range")


def endpoint_warnings(stack: StackConfig) -> list[str]:
    """A private endpoint that names no way in: the up would create the cluster and then fail to reach it."""
    cluster = stack.cluster
    if not cluster.create or cluster.endpoint_public_access_cidrs or cluster.private_access_cidrs:
        return []
    return [f"cluster '{cluster.name}' has a private API endpoint (triarch:cluster.endpointPublicAccessCidrs: []) "
            "and names no way in (triarch:cluster.privateAccessCidrs: a VPN, peered VPC or bastion range): "
            "`pulumi up` would create the cluster, then fail to reach it; set endpointPublicAccessCidrs to "
            + EGRESS_HINT.split(", or")[0] + ", or privateAccessCidrs"]


def check_stack(stack: StackConfig, facts: Catalog) -> None:
    """Every rule that spans fields or needs the catalog; raises ConfigError naming the key path."""
    cluster = stack.cluster
    if cluster.kubernetes_version not in SUPPORTED_KUBERNETES:
        raise ConfigError(_cluster_path("kubernetesVersion"), cluster.kubernetes_version,
                          "is not a supported Kubernetes version", ", ".join(SUPPORTED_KUBERNETES))
    if cluster.create:
        if stack.aws_region is None:
            raise ConfigError("aws:region", None, required_when("aws:region"), "an AWS region such as us-east-1")
        if len(cluster.zones) < 2:
            raise ConfigError(_cluster_path("zones"), cluster.zones,
                              "must list at least two zones (EKS places the control plane in two or more)",
                              f"zones of {stack.aws_region}, e.g. {stack.aws_region}a")
        for i, zone in enumerate(cluster.zones):
            if not (zone.startswith(stack.aws_region) and len(zone) == len(stack.aws_region) + 1):
                raise ConfigError(key_path(f"{NAMESPACE}:cluster", "zones", i), zone,
                                  f"is not a zone of aws:region {stack.aws_region}", f"{stack.aws_region}a, ...")
        if len(set(cluster.zones)) != len(cluster.zones):
            raise ConfigError(_cluster_path("zones"), cluster.zones, "lists a zone twice", "distinct zones")
        plan_subnets(cluster.vpc_cidr, cluster.zones)  # the address plan must hold the zones, before any resource
        for key in ("kubeconfig", "context"):
            if getattr(cluster, key) is not None:
                raise ConfigError(_cluster_path(key), getattr(cluster, key),
                                  "only applies to an adopted cluster", "remove it, or set create: false")
        check_endpoint_access(cluster)
        if not cluster.admin_role_arns:
            raise ConfigError(_cluster_path("adminRoleArns"), [],
                              f"{required_when(_cluster_path('adminRoleArns'))}, and names no administrator: the "
                              "cluster's creator gets no implicit access, so nobody (`pulumi up` included) could "
                              "reach the Kubernetes API",
                              "the IAM role ARNs that administer the cluster, the one `pulumi up` runs as among them")
        seen: dict[str, int] = {}
        for i, arn in enumerate(cluster.admin_role_arns):
            name = admin_key(arn)
            if name in seen:
                raise ConfigError(f"{_cluster_path('adminRoleArns')}[{i}]", arn,
                                  f"has the name {name!r} of entry [{seen[name]}]: each admin's access entry is named "
                                  "after it", "principals with distinct names")
            seen[name] = i
        if cluster.provisioner == "cluster-autoscaler":
            raise ConfigError(_cluster_path("nodeProvisioner"), cluster.node_provisioner,
                              "is not installed by Triarch on a created cluster",
                              "karpenter (installed, scales pools from zero), none (fixed-size pools)")
        system = cluster.system_node_group
        check_ami_release(stack, SYSTEM_RELEASE_TABLE, system.ami_release,
                           _cluster_path("systemNodeGroup.amiRelease"), facts, shown="AL2023")
        if system.instance_type not in facts.instances or facts.instances[system.instance_type].gpu:
            allowed = sorted(n for n, i in facts.instances.items() if not i.gpu)
            raise unknown(_cluster_path("systemNodeGroup.instanceType"), system.instance_type, "CPU instance type",
                          allowed, "templates/compat/instances.yaml")
        if system.min > system.max:
            raise ConfigError(_cluster_path("systemNodeGroup.min"), system.min,
                              f"is greater than systemNodeGroup.max ({system.max})", f"0..{system.max}")
        for key, mode in (("devicePlugin", stack.device_plugin.mode), ("kuberay", stack.kuberay.mode),
                          ("leaderWorkerSet", stack.leader_worker_set.mode)):
            if mode == "existing":
                raise ConfigError(f"{NAMESPACE}:{key}.mode", mode,
                                  "says the cluster already runs the component, but Triarch creates this cluster: "
                                  "nothing runs there that Triarch does not install",
                                  "install (or create: false to adopt a cluster that runs it)")
    elif cluster.context is None:
        raise ConfigError(_cluster_path("context"), None,
                          f"{required_when(_cluster_path('context'))}: the kubeconfig context of the adopted cluster",
                          "a context from `kubectl config get-contexts` (the ambient context is never used)")
    else:
        for key, given in (("adminRoleArns", cluster.admin_role_arns),
                           ("endpointPublicAccessCidrs", cluster.endpoint_public_access_cidrs),
                           ("privateAccessCidrs", cluster.private_access_cidrs)):
            if given:
                raise ConfigError(_cluster_path(key), [str(v) for v in given],
                                  "only applies to a cluster Triarch creates",
                                  "remove it (the kubeconfig context decides)")
    if cluster.create and stack.serving.weights_role_arn is not None:
        raise ConfigError(f"{NAMESPACE}:serving.weightsRoleArn", stack.serving.weights_role_arn,
                          "only applies to an adopted cluster: on a cluster it creates, Triarch gives each model with "
                          "weightsUri its own role, scoped to that prefix", "remove it")

    names: set[str] = set()
    for i, group in enumerate(stack.node_groups):
        check_node_group(stack, group, key_path(f"{NAMESPACE}:nodeGroups", i), facts)
        if group.name in names:
            raise ConfigError(key_path(f"{NAMESPACE}:nodeGroups", i, "name"), group.name, "is used twice",
                              "a distinct name per node group")
        names.add(group.name)
    check_sold_in_region(stack, facts)
    _check_node_repair(stack)

    for key, pin, upstream in (("vllm", stack.images.vllm, UPSTREAM_IMAGES["vllm"]),
                               ("rayLlm", stack.images.ray_llm, UPSTREAM_IMAGES["ray-serve"])):
        try:
            release_of(pin.image, pin.release, upstream, facts.images)
        except ImageError as error:
            raise _pin_error(key, pin, error) from None
    _check_registry(stack, facts)

    models: set[str] = set()
    for i, model in enumerate(stack.models):
        path = key_path(f"{NAMESPACE}:models", i)
        if model.name in models:
            raise ConfigError(f"{path}.name", model.name, "is used twice", "a distinct name per model")
        models.add(model.name)
        if model.node_group not in names:
            raise ConfigError(f"{path}.nodeGroup", model.node_group, "is not a node group of this stack",
                              ", ".join(sorted(names)))
        per_node = gpus_per_node(stack.node_group(model.node_group), facts)
        if model.tensor_parallel_size is not None and model.tensor_parallel_size > per_node:
            raise ConfigError(f"{path}.tensorParallelSize", model.tensor_parallel_size,
                              f"exceeds the {per_node} GPU(s) per node of node group '{model.node_group}'",
                              f"1..{per_node}")
        _check_parallelism(stack, model, path, per_node)
        _check_cold_start_settings(stack, model, path)
        if model.route_prefix is not None and model.engine != "ray-serve":
            raise ConfigError(f"{path}.routePrefix", model.route_prefix, "only applies to engine ray-serve",
                              "remove it (a vllm model gets its own Service)")
        _check_prefix_routing(model, path)
        _check_disaggregation(stack, model, path, facts)
        _check_kv_offload(stack, model, path, facts)
        _check_adapters(stack, model, path)
        if model.autoscaling is not None:
            if "replicas" in model.model_fields_set:
                raise ConfigError(f"{path}.replicas", model.replicas,
                                  "would be ignored beside autoscaling (Ray Serve keeps the replicas between "
                                  "autoscaling.min and max)", "remove replicas, or remove autoscaling")
            if model.engine == "vllm" and not (stack.observability.keda != "none"
                                               and stack.prometheus != "none"):
                raise ConfigError(f"{path}.autoscaling", model.autoscaling.model_dump(by_alias=True),
                                  "scales a vllm model with KEDA on vLLM's own metrics, which needs KEDA and a "
                                  "Prometheus in the cluster (a CPU HPA on a GPU server scales at the wrong time)",
                                  _keda_remedy(stack))
            if model.engine == "vllm" and model.autoscaling.min < 1:
                raise ConfigError(f"{path}.autoscaling.min", model.autoscaling.min,
                                  "leaves no vLLM server to queue the request that should wake one (KEDA's "
                                  "Prometheus trigger sees no waiting requests without a server)",
                                  f"1..{model.autoscaling.max} (scale to zero: engine ray-serve)")
            if model.autoscaling.min > model.autoscaling.max:
                raise ConfigError(f"{path}.autoscaling.min", model.autoscaling.min,
                                  f"is greater than autoscaling.max ({model.autoscaling.max})",
                                  f"0..{model.autoscaling.max}")


def _check_node_repair(stack: StackConfig) -> None:
    """Node repair is Karpenter's, on the nodes it launches, with the agent Triarch installs: it needs both."""
    cluster = stack.cluster
    if not cluster.node_repair:
        return
    if not cluster.create:
        raise ConfigError(_cluster_path("nodeRepair"), True,
                          "only applies to a cluster Triarch creates: on an adopted cluster it installs neither "
                          "Karpenter's NodeRepair gate nor the EKS node monitoring agent",
                          "remove it (`triarch verify` reports whether the GPU nodes carry AcceleratedHardwareReady)")
    if not any(pool_provisioner(cluster, group) == "karpenter" for group in stack.node_groups):
        raise ConfigError(_cluster_path("nodeRepair"), True,
                          "needs a GPU pool Karpenter launches: Karpenter repairs only its own nodes, and every pool "
                          "here is a managed node group", "false, or provisioner: karpenter on a GPU pool")


def _keda_remedy(stack: StackConfig) -> str:
    """What a vllm model's autoscaling lacks, and only that: `keda: install` beside the Prometheus a created cluster
    installs by default (naming `prometheus` there would turn that one off), a Prometheus where there is none."""
    missing = ([] if stack.prometheus != "none" else ["prometheus: install"]) + (
        [] if stack.observability.keda != "none" else ["keda: install"])
    existing = (" (prometheus: existing where the cluster runs a Prometheus Operator)"
                if stack.prometheus == "none" else "")
    return f"observability: {{{', '.join(missing)}}}{existing}, or engine: ray-serve"


def _check_prefix_routing(model: ModelConfig, path: str) -> None:
    """Prefix-aware routing is Ray Serve's, for requests with a prompt, and pays only where vLLM keeps prefixes."""
    routing = model.prefix_routing
    if routing is None:
        return
    key = f"{path}.prefixRouting"
    if model.engine == "vllm":
        _check_picker_routing(model, routing, key)
        return
    if not routing.enabled:
        tuned = sorted(routing.model_fields_set - {"enabled"})
        if tuned:
            field = PrefixRoutingConfig.model_fields[tuned[0]]
            raise ConfigError(f"{key}.{field.alias}", getattr(routing, tuned[0]),
                              "would be ignored: prefixRouting.enabled is false",
                              "remove it, or prefixRouting.enabled: true")
        return
    _check_routing_has_a_choice(model, key)
    if not model.prefix_caching:
        raise ConfigError(f"{key}.enabled", True,
                          "sends each request to the replica that served its prompt's start before, but "
                          "prefixCaching is false: no replica's vLLM keeps that start, so nothing is reused and "
                          "load is balanced worse", "prefixRouting.enabled: false, or prefixCaching: true")
    if model.resolved_task == "embed":
        # Ray 2.60 prefix_aware_router.py, _extract_text_from_request: a request without `messages` or `prompt`
        # raises ValueError in the router; an embeddings request carries `input`.
        raise ConfigError(f"{key}.enabled", True,
                          "routes on a request's messages or prompt, and an embeddings request has neither (Ray "
                          "2.60's router raises on it)", "prefixRouting.enabled: false, or task: generate")
    threshold, target = routing.eviction_threshold_chars, routing.eviction_target_chars
    if not routing.eviction:
        for name in ("eviction_threshold_chars", "eviction_target_chars", "eviction_interval_seconds"):
            if getattr(routing, name) is not None:
                raise ConfigError(f"{key}.{PrefixRoutingConfig.model_fields[name].alias}", getattr(routing, name),
                                  "would be ignored: prefixRouting.eviction is false",
                                  "remove it, or prefixRouting.eviction: true")
    elif target is not None and threshold is not None and target > threshold:
        # Given alone, the target is held to Triarch's threshold once the replica's KV cache is sized
        # (planners/models.py, check_router_eviction).
        raise ConfigError(f"{key}.evictionTargetChars", target,
                          f"is more than the {threshold} characters at which eviction starts (evictionThresholdChars): "
                          "a replica would be cut back to more than it holds", f"1..{threshold}")


def _check_disaggregation(stack: StackConfig, model: ModelConfig, path: str, facts: Catalog) -> None:
    """A split is Ray Serve LLM's P/D application: a generate model on engine ray-serve, each role's replicas fixed
    and on a pool of this stack, over a KV connector the image's vLLM registers and Ray 2.60 has a backend for."""
    split = model.disaggregation
    if split is None:
        return
    key = f"{path}.disaggregation"
    if not split.enabled:
        tuned = sorted(split.model_fields_set - {"enabled"})
        if tuned:
            raise ConfigError(f"{key}.{DisaggregationConfig.model_fields[tuned[0]].alias}",
                              getattr(split, tuned[0]) if tuned[0] in ("connector", "backend") else
                              getattr(split, tuned[0]).model_dump(by_alias=True, exclude_unset=True),
                              "would be ignored: disaggregation.enabled is false",
                              "remove it, or disaggregation.enabled: true")
        return
    if model.engine != "ray-serve":
        raise ConfigError(f"{key}.enabled", True,
                          "splits prefill from decode with Ray Serve LLM's P/D application (build_pd_openai_app), "
                          "which a vllm model does not run in", "engine: ray-serve, or remove disaggregation")
    if model.resolved_task == "embed":
        raise ConfigError(f"{key}.enabled", True,
                          "splits a request's prompt from its generated tokens, and an embedding request generates "
                          "none", "remove disaggregation, or task: generate")
    if model.autoscaling is not None:
        raise ConfigError(f"{path}.autoscaling", model.autoscaling.model_dump(by_alias=True),
                          "would be ignored beside disaggregation (each role scales on its own load)",
                          "disaggregation.prefill.autoscaling and disaggregation.decode.autoscaling, or remove "
                          "disaggregation")
    if "replicas" in model.model_fields_set:
        raise ConfigError(f"{path}.replicas", model.replicas,
                          "would be ignored beside disaggregation (each role has its own replicas)",
                          "disaggregation.prefill.replicas and disaggregation.decode.replicas")
    taken = f"{model.name}{PREFILL_SUFFIX}"
    if any(other.name == taken for other in stack.models):
        raise ConfigError(f"{path}.name", model.name,
                          f"names its prefill role '{taken}', which is the name of another model",
                          "distinct names (a split model's prefill role is <name>-prefill)")
    names = [group.name for group in stack.node_groups]
    for role in ROLES:
        given: RoleConfig = getattr(split, role)
        scaling = given.autoscaling
        if scaling is not None and "replicas" in given.model_fields_set:
            raise ConfigError(f"{key}.{role}.replicas", given.replicas,
                              f"would be ignored beside {role}.autoscaling (Ray Serve keeps the role's replicas "
                              "between autoscaling.min and max)", f"remove replicas, or remove {role}.autoscaling")
        if scaling is not None and scaling.min > scaling.max:
            raise ConfigError(f"{key}.{role}.autoscaling.min", scaling.min,
                              f"is greater than autoscaling.max ({scaling.max})", f"0..{scaling.max}")
        pool = given.node_group or model.node_group
        if given.node_group is not None and given.node_group not in names:
            raise ConfigError(f"{key}.{role}.nodeGroup", given.node_group, "is not a node group of this stack",
                              ", ".join(sorted(names)))
        per_node = gpus_per_node(stack.node_group(pool), facts)
        tp = given.tensor_parallel_size or model.tensor_parallel_size
        if tp is not None and tp > per_node:
            where = f"{key}.{role}.tensorParallelSize" if given.tensor_parallel_size else f"{path}.tensorParallelSize"
            raise ConfigError(where, tp, f"exceeds the {per_node} GPU(s) per node of node group '{pool}' (the "
                              f"{role} role's pool)", f"1..{per_node}")
        if stack.node_group(pool).time_slicing is not None:
            raise ConfigError(f"{key}.{role}.nodeGroup" if given.node_group else f"{path}.nodeGroup", pool,
                              f"slices each GPU, but the {role} role's NIXL agent registers its whole KV cache "
                              "for transfer", "a pool without timeSlicing")
    release = release_of(stack.images.ray_llm.image, stack.images.ray_llm.release, UPSTREAM_IMAGES["ray-serve"],
                         facts.images)
    image = facts.image(release)
    vllm = image.vllm if image is not None else None
    known = pd_facts().connectors.get(vllm or "")
    if known is None:
        raise ConfigError(f"{key}.connector", split.connector,
                          f"cannot be checked against the vLLM of triarch:images.rayLlm ({release}: vLLM {vllm}), "
                          "whose KV connectors templates/compat/prefill-decode.yaml does not list",
                          f"a rayLlm image of vLLM {', '.join(sorted(pd_facts().connectors))}")
    if split.connector not in known:
        raise ConfigError(f"{key}.connector", split.connector,
                          f"is not a KV connector of vLLM {vllm} (triarch:images.rayLlm {release})",
                          f"{DEFAULT_KV_CONNECTOR} (vLLM {vllm} registers {', '.join(known)})")
    if split.connector not in pd_facts().planned:
        raise ConfigError(f"{key}.connector", split.connector,
                          f"is a KV connector of vLLM {vllm} that Triarch plans no split with "
                          f"({pd_facts().not_planned})",
                          DEFAULT_KV_CONNECTOR)


def _check_kv_offload(stack: StackConfig, model: ModelConfig, path: str, facts: Catalog) -> None:
    """kvOffload on an image whose vLLM takes --kv-offloading-size (templates/compat/kv-offload.yaml), a size only
    where offload is on. What needs the node and the sizing (its room, a replica across nodes) is the planner's."""
    offload = model.kv_offload
    if offload is None:
        return
    key = f"{path}.kvOffload"
    if not offload.enabled:
        if offload.size_gib is not None:
            raise ConfigError(f"{key}.sizeGiB", offload.size_gib, "would be ignored: kvOffload.enabled is false",
                              "remove it, or kvOffload.enabled: true")
        return
    image_key = "vllm" if model.engine == "vllm" else "rayLlm"
    pin = stack.images.vllm if model.engine == "vllm" else stack.images.ray_llm
    release = release_of(pin.image, pin.release, UPSTREAM_IMAGES[model.engine], facts.images)
    image = facts.image(release)
    vllm = image.vllm if image is not None else None
    releases = offload_facts().releases
    if vllm not in releases:
        raise ConfigError(key, offload.model_dump(by_alias=True, exclude_unset=True),
                          f"needs vLLM's --kv-offloading-size, which Triarch has not found in vLLM {vllm} (the vLLM "
                          f"of triarch:images.{image_key} {release}; templates/compat/kv-offload.yaml lists the "
                          "releases whose engine args have it)",
                          f"an image of vLLM {', '.join(releases)}, or remove kvOffload")


def _check_adapters(stack: StackConfig, model: ModelConfig, path: str) -> None:
    """Adapters the engine can load (vLLM: a local path or the Hub; Ray Serve LLM 2.60: cloud storage), under names
    of their own, on a generate model that is not split; S3 ones under one root, read through a role."""
    if not model.adapters:
        return
    key = f"{path}.adapters"
    if model.resolved_task != "generate":
        raise ConfigError(key, [a.name for a in model.adapters], "are planned for generate models only",
                          "remove adapters, or task: generate")
    if model.disaggregation is not None:
        raise ConfigError(key, [a.name for a in model.adapters], "are not planned for a model split into prefill "
                          "and decode", "remove adapters, or disaggregation")
    seen: set[str] = set()
    for i, adapter in enumerate(model.adapters):
        at = f"{key}[{i}]"
        if adapter.name == model.name:
            raise ConfigError(f"{at}.name", adapter.name, "is the model's own served name, which the base model "
                              "answers to", "a name of its own")
        if adapter.name in seen:
            raise ConfigError(f"{at}.name", adapter.name, "names two adapters of this model", "a distinct name per "
                              "adapter")
        seen.add(adapter.name)
        if model.engine == "vllm" and adapter.s3 is not None:
            raise ConfigError(f"{at}.s3", adapter.s3, "cannot be loaded by engine vllm: vLLM resolves an adapter "
                              "from a local path or the Hub only", "hub: {id, revision}, or engine: ray-serve")
        if model.engine == "ray-serve" and adapter.hub is not None:
            raise ConfigError(f"{at}.hub", adapter.hub.id, "cannot be loaded by engine ray-serve: Ray Serve LLM 2.60 "
                              "loads adapters from cloud storage only (lora_config.dynamic_lora_loading_path)",
                              "s3: s3://bucket/<root>/<name>, or engine: vllm")
        if adapter.s3 is not None and (adapter.s3.rstrip("/").count("/") < 3
                                       or adapter.s3.rstrip("/").rsplit("/", 1)[-1] != adapter.name):
            raise ConfigError(f"{at}.s3", adapter.s3, f"must end in the adapter's name ('{adapter.name}'): Ray Serve "
                              "LLM loads <root>/<adapter name>", f"s3://bucket/<root>/{adapter.name}")
    roots = sorted({a.s3.rstrip("/").rsplit("/", 1)[0] for a in model.adapters if a.s3 is not None})
    if len(roots) > 1:
        raise ConfigError(key, roots, "are more than one S3 root: Ray Serve LLM loads a model's adapters from one "
                          "(lora_config.dynamic_lora_loading_path)", "every adapter under one root")
    if roots and not stack.cluster.create and stack.serving.weights_role_arn is None:
        raise ConfigError(key, roots[0], "names S3 adapters, but no role can read them: the serving pods of an adopted "
                          "cluster assume triarch:serving.weightsRoleArn (IRSA), which is not set",
                          "triarch:serving.weightsRoleArn: a role that may s3:GetObject and s3:ListBucket there")


def _check_routing_has_a_choice(model: ModelConfig, key: str) -> None:
    """Routing by prefix picks among replicas: a model that never has more than one gets nothing from it (a split
    model's roles have replicas of their own)."""
    if model.disaggregation is not None and model.disaggregation.enabled:
        return
    most = model.autoscaling.max if model.autoscaling is not None else model.replicas
    if most < 2:
        raise ConfigError(f"{key}.enabled", True,
                          f"picks among a model's replicas by prompt prefix, and '{model.name}' never has more than "
                          "one (replicas: 1, no autoscaling): there is no choice to make",
                          "replicas >= 2 or autoscaling.max >= 2, or " + (
                              "remove prefixRouting (on by default once a generate model can have several replicas)"
                              if model.engine == "ray-serve" else "remove prefixRouting"))


def _check_picker_routing(model: ModelConfig, routing: PrefixRoutingConfig, key: str) -> None:
    """Engine vllm: the endpoint picker (an InferencePool) takes only `enabled`; the other keys tune Ray Serve's
    router, and the picker pays only where vLLM keeps prefixes."""
    tuned = sorted(routing.model_fields_set - {"enabled"})
    if tuned:
        field = PrefixRoutingConfig.model_fields[tuned[0]]
        raise ConfigError(f"{key}.{field.alias}", getattr(routing, tuned[0]),
                          "tunes Ray Serve's prefix-aware router; a vllm model's endpoint picker scores with its "
                          "chart's own plugins", "only prefixRouting.enabled on engine vllm")
    if not routing.enabled:
        return
    _check_routing_has_a_choice(model, key)
    if not model.prefix_caching:
        raise ConfigError(f"{key}.enabled", True,
                          "puts the endpoint picker in front of the pods to send each request where its prompt's "
                          "start is cached, but prefixCaching is false: no pod's vLLM keeps that start",
                          "prefixRouting.enabled: false, or prefixCaching: true")
    if model.resolved_task == "embed":
        # schema.py prefixCaching: vLLM keeps prefixes for generate models only (is_prefix_caching_supported).
        raise ConfigError(f"{key}.enabled", True,
                          "routes by the prompt prefixes vLLM caches, and an embedding model keeps none",
                          "prefixRouting.enabled: false, or task: generate")


def _check_cold_start_settings(stack: StackConfig, model: ModelConfig, path: str) -> None:
    """Weights from S3 need a role that reads them and an engine that streams them; warm capacity needs a pool
    that scales; a shared compile cache needs a volume every replica can mount."""
    serving = stack.serving
    if model.weights_uri is not None and not stack.cluster.create and serving.weights_role_arn is None:
        raise ConfigError(f"{path}.weightsUri", model.weights_uri,
                          "names S3 weights, but no role can read them: the serving pods of an adopted cluster "
                          "assume triarch:serving.weightsRoleArn (IRSA), which is not set",
                          "triarch:serving.weightsRoleArn: arn:aws:iam::<account>:role/<a role that may "
                          "s3:GetObject and s3:ListBucket there>, or remove weightsUri")
    if model.warm_replicas:
        group = stack.node_group(model.node_group)
        scales = pool_provisioner(stack.cluster, group) == "karpenter" or (
            not stack.cluster.create and stack.cluster.provisioner != "none")
        if not scales:
            raise ConfigError(f"{path}.warmReplicas", model.warm_replicas,
                              f"keeps capacity warm on node group '{group.name}', whose nodes always run (nothing "
                              "scales it): there is no launch to skip", "0, or a pool Karpenter scales")
    compile_cache = serving.compile_cache
    mode = stack.cache_access_mode
    largest = model.autoscaling.max if model.autoscaling else model.replicas
    if compile_cache and mode == "ReadWriteOnce" and (largest > 1 or model.warm_replicas):
        raise ConfigError(f"{NAMESPACE}:serving.compileCache", True,
                          f"puts vLLM's compile cache on the ReadWriteOnce model cache that the {largest} replicas "
                          f"of '{model.name}' share: one node mounts it, a replica on another never starts",
                          "a ReadWriteMany storageClass (accessMode: ReadWriteMany), or compileCache: false")


def _check_parallelism(stack: StackConfig, model: ModelConfig, path: str, per_node: int) -> None:
    """A replica beyond one node takes whole nodes (one pod per node, all its GPUs), all at once: its GPUs are a
    whole number of nodes, the pool can hold one such group, and no GPU is a slice."""
    tp, pp = model.tensor_parallel_size, model.pipeline_parallel_size
    if pp is None:
        return
    group = stack.node_group(model.node_group)
    if group.time_slicing is not None and pp > 1:
        raise ConfigError(f"{path}.pipelineParallelSize", pp,
                          f"needs {(tp or 1) * pp} whole GPUs, but node group '{group.name}' slices each GPU "
                          f"{group.time_slicing.replicas} ways", "1, or a pool without timeSlicing")
    if tp is None:
        return  # the tuner picks TP within a node, keeping whole nodes
    gpus = tp * pp
    if gpus <= per_node:
        return
    if gpus % per_node:
        raise ConfigError(f"{path}.pipelineParallelSize", pp,
                          f"gives tensorParallelSize {tp} x pipelineParallelSize {pp} = {gpus} GPUs, "
                          f"{gpus / per_node:g} nodes of node group '{group.name}' ({per_node} GPUs each): a replica "
                          "beyond one node takes whole nodes",
                          f"tensor x pipeline a multiple of {per_node} (e.g. tensorParallelSize {per_node}, "
                          f"pipelineParallelSize {-(-gpus // per_node)})")
    nodes = gpus // per_node
    if group.max < nodes:
        raise ConfigError(f"{path}.pipelineParallelSize", pp,
                          f"spreads one replica over {nodes} nodes of node group '{group.name}' ({gpus} GPUs), "
                          f"but the pool's max is {group.max} node(s): not one replica could start",
                          f"node group '{group.name}' max >= {nodes}, or fewer stages")


def _pin_error(key: str, pin: ImagePin, error: ImageError) -> ConfigError:
    """A pin's mistake at its key (`.image` or `.release` where the pin is a mapping)."""
    path = f"{NAMESPACE}:images.{key}" + (f".{error.part}" if pin.release is not None else "")
    return ConfigError(path, pin.release if error.part == "release" else pin.image, error.reason, error.allowed)


def _check_registry(stack: StackConfig, facts: Catalog) -> None:
    """Chart images pinned under triarch:images are images of the pinned charts, of the release each chart runs;
    the registry's prefixes are registries and OCI references."""
    installed = charts()
    chart_images = {i.key: i for c in installed.values() for i in c.images}
    for key, pin in stack.images.charts.items():
        path = f"{NAMESPACE}:images.{key}"
        image = chart_images.get(key)
        if image is None:
            raise ConfigError(path, key, "is not an image Triarch deploys",
                              ", ".join(["vllm", "rayLlm", *sorted(chart_images)]))
        try:
            chart_release(pin.image, pin.release, image.image)
        except ImageError as error:
            raise _pin_error(key, pin, error) from None
    prefixes = stack.registry.images
    for host, prefix in (prefixes.items() if isinstance(prefixes, dict) else [("", prefixes)] if prefixes else []):
        path = f"{NAMESPACE}:registry.images" + (f".{host}" if host else "")
        if host and not parse_host(host):
            raise ConfigError(path, host, "is not a registry host", "docker.io, quay.io, nvcr.io, ghcr.io, "
                              "public.ecr.aws, registry.k8s.io, or another host[:port]")
        try:
            parse_prefix(prefix)
        except ImageError as error:
            raise ConfigError(path, prefix, error.reason, error.allowed) from None
    if isinstance(prefixes, dict) and stack.prometheus == "install":
        raise ConfigError(f"{NAMESPACE}:registry.images", ", ".join(sorted(prefixes)),
                          "maps registries one by one, but kube-prometheus-stack (observability.prometheus: install) "
                          "moves all its images and its subcharts' with one registry (global.imageRegistry)",
                          "one prefix for every registry, or observability.prometheus: existing")
    sources = stack.registry.charts
    for name, reference in (sources.items() if isinstance(sources, dict) else [("", sources)] if sources else []):
        path = f"{NAMESPACE}:registry.charts" + (f".{name}" if name else "")
        if name and name not in installed:
            raise ConfigError(path, name, "is not a chart Triarch installs", ", ".join(sorted(installed)))
        if not re.match(r"^oci://[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)*$", reference):
            raise ConfigError(path, reference, "is not an OCI reference",
                              "oci://<registry>/<path>, e.g. oci://123456789012.dkr.ecr.us-east-1.amazonaws.com/charts")
