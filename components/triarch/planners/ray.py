"""Models served by Ray Serve: one RayService whose applications are the models, behind their route prefixes.

Ray decides *how* work is split: replicas per model, GPUs per replica (tensor x pipeline parallel), routing and
autoscaling on ongoing requests. Kubernetes only places the pods: the head on CPU nodes with `num-gpus: 0`,
one worker group per (GPU pool, GPUs per pod), each worker pod one replica's worth of GPUs, or one node of a replica
that spans several (its placement group then covers whole pods).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import yaml

from triarch.catalog import catalog
from triarch.coldfacts import cold_start_facts
from triarch.config.schema import PrefixRoutingConfig
from triarch.disaggregation import PD_BUILDER, PORT_BASE_KEY, kv_transfer_config
from triarch.disaggregation import facts as pd_facts
from triarch.kv_offload import with_offload
from triarch.paths import TEMPLATES_DIR
from triarch.planners import pods
from triarch.planners.adapters import adapter_root, engine_lora_args, ray_lora_config
from triarch.planners.kv_offload import engine_offload_args, shm_gib
from triarch.planners.model_plan import ModelPlan
from triarch.planners.models import efa_share, pod_resources, replica_bounds, uses_efa
from triarch.planners.router_memory import eviction_bounds
from triarch.planners.vllm import STREAMER_LOAD_FORMAT
from triarch.scheduling import EFA_RESOURCE, GPU_PRESENT_LABEL, ray_start_resources

RAY_SERVICE = "llm"
ROUTER_SOURCE = Path(__file__).resolve().parent.parent / "ray_pods" / "triarch_prefix_router.py"
"""Triarch's prefix-aware router: Ray 2.60's PrefixCacheAffinityRouter, routing by load what it cannot match (a
request without text, a lost prefix tree) where Ray's waits forever. It runs in the Ray pods, shipped in a ConfigMap."""
PREFIX_ROUTER = f"{ROUTER_SOURCE.stem}.ResilientPrefixRouter"
ROUTER_MOUNT = "/opt/triarch/ray"
"""Where the router's ConfigMap is mounted in every Ray container, and put on its PYTHONPATH (the Ray images set
none): the Serve controller checks the class, the ingress replicas route with it."""
SPEC_AUTHORED_HERE = {"pulumi.com/patchForce": "true"}
"""The RayService's spec is Triarch's to write, so `pulumi up` takes its fields back instead of failing on a
server-side-apply conflict. KubeRay 1.7.0 (and 1.6.2, ray-project/kuberay#4807 and #4909) adds its finalizer with
a whole-object Update, which makes the operator's field manager the owner of what its Go types write back
differently, and `rayClusterConfig.workerGroupSpecs` is an atomic list: all of it. The next change of a worker
group (its image, its replicas) then conflicts with "kuberay-operator" (seen on the plane, test_real_ray)."""
RAY_CLUSTER_LABEL = "ray.io/cluster"
"""KubeRay labels each pod with its RayCluster's name: a RayService upgrade's new cluster has its own."""
SERVE_PORT = 8000
DRAIN_SECONDS = 30
"""preStop: the worker asks Ray to drain its node (Serve stops routing to it and starts replacements) and waits
this long before Kubernetes signals it."""
SIGTERM_DRAIN_SECONDS = 30
"""RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S: on SIGTERM Ray drains the node again and waits up to this long before it
kills its processes (ray/_private/node.py, Ray 2.60; Ray's default, set so the grace period can be summed)."""
GRACEFUL_SHUTDOWN_SECONDS = 30
"""Serve's graceful_shutdown_timeout_s: in-flight requests a stopping replica still finishes."""
GRACE_MARGIN_SECONDS = 10
AUTOSCALER_SERVICE_ACCOUNT = "ray-autoscaler"
"""The head's service account. KubeRay binds its autoscaler Role (pods get/list/watch/patch, pods/resize patch,
rayclusters get/patch) to the head's service account; naming our own keeps the namespace's default account
unbound, and KubeRay then requires the account to exist rather than creating it."""
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where Ray's autoscaler reads its token and CA (ray/autoscaler/_private/kuberay/node_provider.py)."""
TOKEN_SECONDS = 3607
"""What the API server's own automount asks for: the kubelet refreshes the token, and the API server accepts a
3607-second token for longer (service-account-extend-token-expiration) from clients that read it only once."""
HEAD_CPUS = 2
HEAD_MEMORY_GIB = 8
"""The head's requests (= limits): GCS, the Serve controller and proxy, the dashboard; no replicas."""
HEAD_PORTS = {"gcs-server": 6379, "dashboard": 8265, "client": 10001, "serve": SERVE_PORT, "metrics": 8080}
"""Ray's default ports; reachable through the ClusterIP services KubeRay creates, never outside the cluster."""


@dataclass(frozen=True)
class WorkerGroupKey:
    pool: str
    gpus: int

    @property
    def name(self) -> str:
        return f"{self.pool}-{self.gpus}gpu"


def worker_grace_seconds() -> int:
    """preStop drain, then Ray's own drain on SIGTERM, then Serve's graceful shutdown of the last replica."""
    return DRAIN_SECONDS + SIGTERM_DRAIN_SECONDS + GRACEFUL_SHUTDOWN_SECONDS + GRACE_MARGIN_SECONDS


def prestop_script() -> str:
    template = jinja2.Template((TEMPLATES_DIR / "prestop" / "ray-worker-drain.sh.j2").read_text(encoding="utf-8"),
                               undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    rendered = template.render(drain_seconds=DRAIN_SECONDS)
    # The template's comments document it; the pod spec carries only what runs.
    return "\n".join(line for line in rendered.splitlines() if not line.lstrip().startswith("#")) + "\n"


def prefix_routing(plan: ModelPlan) -> bool:
    """Whether the model's Serve deployment routes by prefix: as its stack says, else where it can pay: a generate
    model (the router reads a request's messages or prompt) whose vLLM keeps prefixes, with replicas to choose
    between."""
    if plan.config.prefix_routing is not None:
        return plan.config.prefix_routing.enabled
    return (plan.config.prefix_caching and plan.config.resolved_task == "generate"
            and replica_bounds(plan)[1] > 1)


def imbalance_threshold(batch: int) -> int:
    """Triarch's default imbalanced_threshold for a replica of `batch`: Ray 2.60's router balances load once the
    busiest replica's queue exceeds the least busy's by more than it (prefix_aware_router.py), and two queues bounded
    by the batch differ by at most the batch. Half a batch, rounded down: at batch 1, 0 (any difference balances),
    where half a batch rounded up to 1 could never be exceeded."""
    return batch // 2


def request_router(plan: ModelPlan, batch: int) -> dict[str, Any]:
    """The deployment's request_router_config (ray.serve.config.RequestRouterConfig) for prefix-aware routing: the
    router's kwargs are its initialize_state's (Ray 2.60), each left to Ray's default unless the stack or Triarch
    sets it."""
    routing = plan.config.prefix_routing or PrefixRoutingConfig()
    threshold = routing.imbalanced_threshold
    kwargs: dict[str, Any] = {
        # Ray's default (infinity) follows a hot prefix onto one replica however long its queue grows.
        "imbalanced_threshold": threshold if threshold is not None else imbalance_threshold(batch),
        "do_eviction": routing.eviction,
    }
    if routing.eviction:
        kwargs["eviction_threshold_chars"], kwargs["eviction_target_chars"] = eviction_bounds(plan)
    given = {"match_rate_threshold": routing.match_rate_threshold,
             "eviction_interval_secs": routing.eviction_interval_seconds}
    kwargs.update({name: value for name, value in given.items() if value is not None})
    return {"request_router_class": PREFIX_ROUTER, "request_router_kwargs": kwargs}


def router_config_map(namespace: str) -> dict[str, Any]:
    """The router's source as a ConfigMap, named by its content: a Triarch release that changes the router changes
    the pods' template, so the processes that imported the old one are replaced (a RayService upgrade), never left
    running it beside a volume that says otherwise."""
    source = ROUTER_SOURCE.read_text(encoding="utf-8")
    digest = hashlib.sha256(source.encode()).hexdigest()[:10]
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{RAY_SERVICE}-prefix-router-{digest}", "namespace": namespace,
                         "labels": dict(pods.MANAGED_BY)},
            "immutable": True,
            "data": {ROUTER_SOURCE.name: source}}


def mount_router(spec: dict[str, Any], config_map: str) -> None:
    """The router's ConfigMap read-only on a Ray pod's containers' PYTHONPATH."""
    spec["volumes"].append({"name": "triarch-router", "configMap": {"name": config_map, "defaultMode": 0o444}})
    for container in spec["containers"]:
        container["volumeMounts"].append({"name": "triarch-router", "mountPath": ROUTER_MOUNT, "readOnly": True})
        container["env"].append({"name": "PYTHONPATH", "value": ROUTER_MOUNT})


def llm_config(plan: ModelPlan) -> dict[str, Any]:
    """Ray Serve LLM's LLMConfig for one model (field names of ray.serve.llm.LLMConfig)."""
    low, high = replica_bounds(plan)
    batch = int(plan.sizing.engine_args.get("max_num_seqs", 1))
    half_batch = max(1, batch // 2)
    deployment: dict[str, Any] = {
        # A replica takes at most what vLLM batches at once; more would queue inside the engine unseen by Serve.
        "max_ongoing_requests": batch,
        "graceful_shutdown_timeout_s": GRACEFUL_SHUTDOWN_SECONDS,
    }
    if plan.config.autoscaling:
        # Scale out at half a batch per replica, before requests wait in vLLM's queue.
        deployment["autoscaling_config"] = {"min_replicas": low, "max_replicas": high,
                                            "target_ongoing_requests": half_batch}
    else:
        deployment["num_replicas"] = low
    if prefix_routing(plan):
        # LLMServer.get_deployment_options hands deployment_config to serve.deployment (Ray 2.60).
        deployment["request_router_config"] = request_router(plan, batch)
    engine_kwargs = dict(plan.sizing.engine_args)
    if plan.serving_revision and not plan.config.weights_uri:
        engine_kwargs["revision"] = plan.serving_revision
    if not plan.config.prefix_caching:
        engine_kwargs["enable_prefix_caching"] = False
    if plan.role is None:  # a split's role offloads beside NIXL instead (role_llm_config)
        engine_kwargs.update(engine_offload_args(plan.kv_offload_gib))
    engine_kwargs.update(engine_lora_args(plan.config))  # adapters: the slots the tuner took out before the KV cache
    source = plan.config.model
    if plan.config.weights_uri:
        # Ray Serve LLM hands an s3:// source to vLLM as the model when the load format streams (Ray 2.60,
        # vllm_engine.py), and no node downloads it first.
        source = plan.config.weights_uri
        engine_kwargs.update(load_format=STREAMER_LOAD_FORMAT,
                             model_loader_extra_config={"concurrency": cold_start_facts().streamer_concurrency})
    config: dict[str, Any] = {
        "model_loading_config": {"model_id": plan.config.name, "model_source": source},
        "engine_kwargs": engine_kwargs,
        "deployment_config": deployment,
    }
    lora = ray_lora_config(plan.config)
    if lora is not None:  # adapters: loaded from their S3 root on a replica's first request for <model>:<adapter>
        config["lora_config"] = lora
    if plan.pool.gpu.ray_accelerator_type:
        config["accelerator_type"] = plan.pool.gpu.ray_accelerator_type
    return config


def role_llm_config(plan: ModelPlan) -> dict[str, Any]:
    """A split model's role as Ray Serve LLM's LLMConfig: the role's own engine args with vLLM's KV connector in
    its role (kv_transfer_config, vLLM 0.29.0's fields) and the NIXL backend its pools allow, and the side
    channel's port base Ray 2.60 adds each replica's offset to (experimental_configs)."""
    assert plan.role is not None and plan.kv_backend is not None and plan.config.disaggregation is not None
    config = llm_config(plan)
    transfer = kv_transfer_config(plan.role, plan.config.disaggregation.connector, plan.kv_backend)
    # kvOffload: kv_offloading_size would replace the role's connector (kv-offload.yaml replacesConnector), so the
    # role runs both in a MultiConnector, its own connector first.
    config["engine_kwargs"]["kv_transfer_config"] = (with_offload(transfer, plan.kv_offload_gib)
                                                     if plan.kv_offload_gib else transfer)
    config["experimental_configs"] = {PORT_BASE_KEY: pd_facts().port_base[plan.role]}
    return config


def serve_config(plans: list[ModelPlan]) -> dict[str, Any]:
    """One application per model, by name: reordering the stack's models changes nothing Serve sees. A split
    model's application is Ray Serve LLM's P/D application (ingress, then its decode deployment, which sends each
    prompt to its prefill deployment first); PDServingArgs' prefill_config and decode_config are its roles."""
    prefills = {p.config.name: p for p in plans if p.role == "prefill"}
    applications = []
    for plan in sorted((p for p in plans if p.role != "prefill"), key=lambda p: p.name):
        args: dict[str, Any]
        if plan.role == "decode":
            builder = PD_BUILDER
            args = {"prefill_config": role_llm_config(prefills[plan.config.name]),
                    "decode_config": role_llm_config(plan)}
        else:
            builder, args = "ray.serve.llm:build_openai_app", {"llm_configs": [llm_config(plan)]}
        applications.append({"name": plan.name, "route_prefix": plan.route_prefix, "import_path": builder,
                             "args": args})
    return {"applications": applications}


def _container(name: str, image: str, resources: dict[str, Any], with_token: bool) -> dict[str, Any]:
    return {
        "name": name, "image": image, "resources": resources, "env": pods.serving_env(with_token),
        # Ray writes its session files under /tmp and caches under $HOME; the root filesystem stays writable
        # for the runtime-env agent, so it is not read-only (see the pod annotation).
        "securityContext": pods.container_security(read_only_root=False),
        "volumeMounts": pods.volume_mounts(),
    }


READ_ONLY_ROOT_EXCEPTION = {
    "triarch.dev/security-exception": "readOnlyRootFilesystem=false: Ray's runtime-env agent installs into the "
                                      "image's site-packages at run time",
}


def autoscaler_token_volume() -> dict[str, Any]:
    """What the API server would automount, projected by hand so that only the autoscaler container sees it."""
    return {"name": "autoscaler-token", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_SECONDS}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
    ]}}


def head_group(image: str, claim: str, with_token: bool, autoscaled: bool) -> dict[str, Any]:
    amounts = {"cpu": str(HEAD_CPUS), "memory": f"{HEAD_MEMORY_GIB}Gi"}
    resources = {"requests": dict(amounts), "limits": dict(amounts)}
    container = _container("ray-head", image, resources, with_token)
    container["ports"] = [{"name": name, "containerPort": port, "protocol": "TCP"}
                          for name, port in HEAD_PORTS.items()]
    spec: dict[str, Any] = {
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "preference": {"matchExpressions": [
                {"key": GPU_PRESENT_LABEL, "operator": "DoesNotExist"}]}}]}},
        # No token in the Ray containers; the autoscaler sidecar gets its own (autoscalerOptions.volumeMounts).
        "automountServiceAccountToken": False,
        "securityContext": pods.pod_security(),
        "containers": [container],
        "volumes": pods.volumes(claim, shm_gib=2),
    }
    if autoscaled:
        spec["serviceAccountName"] = AUTOSCALER_SERVICE_ACCOUNT
        spec["volumes"].append(autoscaler_token_volume())
    return {
        # No GPUs and no CPUs for tasks on the head: replicas go to the GPU workers, the head keeps GCS and Serve.
        "rayStartParams": {"num-gpus": "0", "num-cpus": "0", "dashboard-host": "0.0.0.0"},
        "template": {
            "metadata": {"labels": dict(pods.MANAGED_BY), "annotations": dict(READ_ONLY_ROOT_EXCEPTION)},
            "spec": spec,
        },
    }


def advertised_resources(plans: list[ModelPlan]) -> dict[str, str]:
    """rayStartParams that let Ray's autoscaler pick the group from zero: the `accelerator_type:<X>` resource its
    replicas ask for (Ray detects it on a running node, but a group at zero has no node to detect it on). The
    value is a JSON object in quotes, as KubeRay and the autoscaler parse it."""
    accelerator = plans[0].pool.gpu.ray_accelerator_type
    if not accelerator:
        return {}
    return {"resources": ray_start_resources(accelerator)}


def worker_group(key: WorkerGroupKey, plans: list[ModelPlan], image: str, claim: str,
                 with_token: bool, compile_cache: bool = False) -> dict[str, Any]:
    """Worker pods of `key.gpus` GPUs for the models whose replicas fill them: one replica per pod, or, for a
    replica across nodes, one pod per node of it (Ray Serve LLM gives such a replica one GPU bundle per worker
    process, tensor x pipeline of them, with the PACK strategy: its whole pods). The group holds every model's
    replicas at their fewest and most, in pods."""
    low = sum(replica_bounds(p)[0] * p.nodes_per_replica for p in plans)
    high = sum(replica_bounds(p)[1] * p.nodes_per_replica for p in plans)
    # Any pod of the group may hold a replica of any of its models: each gets the largest KV offload among them.
    offload = max(plans, key=lambda p: p.kv_offload_gib)
    container = _container("ray-worker", image, pod_resources(offload), with_token)
    container["lifecycle"] = {"preStop": {"exec": {"command": ["/bin/sh", "-c", prestop_script()]}}}
    container["env"].append({"name": "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "value": str(SIGTERM_DRAIN_SECONDS)})
    if compile_cache:  # a worker group is one pool, so one GPU type
        container["env"] += pods.compile_cache_env(plans[0].pool.gpu.key)
    efa = [p for p in plans if uses_efa(p)]
    if efa:
        # The group's pods may hold a gang's stage whichever model they serve: each takes its node's interfaces.
        for amounts in container["resources"].values():
            amounts[EFA_RESOURCE] = str(efa_share(efa[0]))
        container["env"] += pods.NCCL_TRANSPORT_LOGS
    selector = {"ray.io/group": key.name}
    return {
        "groupName": key.name,
        "replicas": low, "minReplicas": low, "maxReplicas": high,
        "rayStartParams": advertised_resources(plans),
        "template": {
            # Labels from the group only: a label naming the models would change every group's pods when one
            # model is added or renamed.
            "metadata": {"labels": dict(pods.MANAGED_BY), "annotations": dict(READ_ONLY_ROOT_EXCEPTION)},
            "spec": {
                **pods.placement(plans[0].pool, selector, high, RAY_CLUSTER_LABEL),
                "terminationGracePeriodSeconds": worker_grace_seconds(),
                "automountServiceAccountToken": False,
                # S3 weights: the account the group's role trusts.
                **({"serviceAccountName": weights_account(key)} if weights_uris(plans) else {}),
                "securityContext": pods.pod_security(),
                "containers": [container],
                "volumes": pods.volumes(claim, shm_gib=shm_gib(key.gpus, offload.kv_offload_gib)),
            },
        },
    }


def weights_account(key: WorkerGroupKey) -> str:
    """The service account of a worker group whose models stream weights from S3."""
    return f"{RAY_SERVICE}-{key.name}-weights"


def weights_uris(plans: list[ModelPlan]) -> list[str]:
    """The S3 prefixes a worker group's models read: the weights they stream and their adapters' root (sorted: a
    reordered stack changes nothing). The one list the group's read-only role is scoped to."""
    roots = {adapter_root(p.config) for p in plans}
    return sorted({p.config.weights_uri for p in plans if p.config.weights_uri} | {r for r in roots if r})


def worker_groups(plans: list[ModelPlan]) -> dict[WorkerGroupKey, list[ModelPlan]]:
    """The ray-serve models by the worker group that hosts them (a pool, and the GPUs of one pod)."""
    groups: dict[WorkerGroupKey, list[ModelPlan]] = defaultdict(list)
    for plan in plans:
        if plan.config.engine == "ray-serve":
            groups[WorkerGroupKey(plan.pool.name, plan.gpus_per_pod)].append(plan)
    return groups


def autoscaler_service_account(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": AUTOSCALER_SERVICE_ACCOUNT, "namespace": namespace, "labels": dict(pods.MANAGED_BY)},
            "automountServiceAccountToken": False}


def ray_manifests(plans: list[ModelPlan], image: str, release: str,
                  settings: pods.ServingSettings) -> list[dict[str, Any]]:
    """The model cache claim, the autoscaler's service account and the RayService; empty when no model uses the
    ray-serve engine."""
    served = [p for p in plans if p.config.engine == "ray-serve"]
    if not served:
        return []
    groups = worker_groups(served)
    claim = pods.cache_claim_name(RAY_SERVICE)
    ray_version = catalog().images[release].ray
    autoscaled = any(p.config.autoscaling for p in served)
    cluster: dict[str, Any] = {
        "headGroupSpec": head_group(image, claim, settings.with_token, autoscaled),
        # Ordered by group, not by model: adding a model never reorders the groups.
        "workerGroupSpecs": [worker_group(key, groups[key], image, claim, settings.with_token,
                                                     settings.compile_cache)
                             for key in sorted(groups, key=lambda k: (k.pool, k.gpus))],
        "enableInTreeAutoscaling": autoscaled,
    }
    # Mounted whether or not a model routes by prefix now: turning routing on or off then changes the Serve config
    # alone, which KubeRay applies in place, not the pods' template, which would start a new Ray cluster.
    router = router_config_map(settings.namespace)
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        group["template"]["spec"].update(pods.pull_secrets(settings))
        mount_router(group["template"]["spec"], router["metadata"]["name"])
    if ray_version:
        cluster["rayVersion"] = ray_version
    objects = [pods.cache_claim(RAY_SERVICE, sum(p.cache_gib for p in served), settings), router]
    objects += [pods.service_account(weights_account(key), settings.namespace, settings.weights_role_arn)
                for key in sorted(groups, key=lambda k: (k.pool, k.gpus)) if weights_uris(groups[key])]
    if autoscaled:
        cluster["autoscalerOptions"] = {
            "upscalingMode": "Default", "idleTimeoutSeconds": 600,
            "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "500m", "memory": "1Gi"}},
            "securityContext": pods.container_security(read_only_root=False),
            "volumeMounts": [{"name": "autoscaler-token", "mountPath": TOKEN_DIR, "readOnly": True}],
        }
        objects.append(autoscaler_service_account(settings.namespace))
    service = {
        "apiVersion": "ray.io/v1", "kind": "RayService",
        "metadata": {"name": RAY_SERVICE, "namespace": settings.namespace, "labels": dict(pods.MANAGED_BY),
                     "annotations": {**pods.image_release(image, release), **SPEC_AUTHORED_HERE}},
        "spec": {
            "serveConfigV2": yaml.safe_dump(serve_config(served), sort_keys=False),
            # A new cluster beside the old one, traffic switched when it is ready: the pools must hold both
            # (checked in triarch.planners.models.check_ray_upgrade_capacity).
            "upgradeStrategy": {"type": "NewCluster"},
            "rayClusterConfig": cluster,
        },
    }
    return [*objects, service]
