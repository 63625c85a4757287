"""A model served by plain vLLM: Deployment + Service + PodDisruptionBudget + model cache claim.

vLLM decides *when* each request runs; this planner only hands it the engine args the tuner computed and
makes sure Kubernetes never cuts a request short: readiness gates traffic, the startup probe waits for the
download, preStop lets endpoints drain, and `--shutdown-timeout` lets vLLM finish what it accepted.
"""

from __future__ import annotations

import json
import math
from typing import Any

from triarch.coldfacts import cold_start_facts
from triarch.planners import picker, pods
from triarch.planners.adapters import fetch_container, vllm_lora_flags
from triarch.planners.kv_offload import engine_offload_args, shm_gib
from triarch.planners.model_plan import ModelPlan
from triarch.planners.models import pod_resources, replica_bounds, uses_efa
from triarch.scheduling import POOL_LABEL, gpu_toleration

PORT = 8000
ENDPOINT_DRAIN_SECONDS = 15
"""preStop sleep: time for endpoint removal to reach kube-proxy and load balancers before vLLM is signalled."""
SHUTDOWN_TIMEOUT_SECONDS = 60
"""vLLM's --shutdown-timeout: how long it keeps serving accepted requests after SIGTERM."""
GRACE_MARGIN_SECONDS = 15
PROBE_PERIOD_SECONDS = 10
NO_PREFIX_CACHING = "--no-enable-prefix-caching"
"""prefixCaching: false, as `vllm serve` takes it (vLLM turns prefix caching on by default)."""


def grace_period_seconds() -> int:
    return ENDPOINT_DRAIN_SECONDS + SHUTDOWN_TIMEOUT_SECONDS + GRACE_MARGIN_SECONDS


def engine_flags(plan: ModelPlan) -> list[str]:
    """The tuned engine args as `vllm serve` flags (a true boolean is a bare flag, false or None none)."""
    args: list[str] = []
    for key, value in plan.sizing.engine_args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is not False and value is not None:
            args += [flag, str(value)]
    if not plan.config.prefix_caching:
        # A boolean EngineArgs field is an argparse.BooleanOptionalAction: its --no- form turns off what vLLM turns
        # on by default (vllm/engine/arg_utils.py, 0.33.0:384-386 and 0.29.0:387-389).
        args.append(NO_PREFIX_CACHING)
    for key, value in engine_offload_args(plan.kv_offload_gib).items():  # kvOffload: GiB for the whole instance
        args += ["--" + key.replace("_", "-"), str(value)]
    return args + vllm_lora_flags(plan.config)  # adapters: the slots, and those loaded at start


STREAMER_LOAD_FORMAT = "runai_streamer"
"""vLLM's loader for weights in object storage (s3://): the Run:ai Model Streamer reads the safetensors files
concurrently straight into GPU memory, where the default loader would need them on a filesystem first."""


def model_source(plan: ModelPlan) -> list[str]:
    """What vLLM loads: the hub repo (into the model cache), or the model's S3 prefix through the streamer at the
    concurrency its benchmark found fastest (templates/compat/cold-start.yaml)."""
    if plan.config.weights_uri is None:
        revision = plan.serving_revision
        return [plan.config.model, *(["--revision", revision] if revision else [])]
    concurrency = cold_start_facts().streamer_concurrency
    return [plan.config.weights_uri, "--load-format", STREAMER_LOAD_FORMAT,
            "--model-loader-extra-config", json.dumps({"concurrency": concurrency})]


def serve_args(plan: ModelPlan) -> list[str]:
    """`vllm serve` arguments: the model, where to listen, the drain window and the tuned engine args."""
    return [*model_source(plan), "--served-model-name", plan.name, "--host", "0.0.0.0", "--port", str(PORT),
            "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_SECONDS), *engine_flags(plan)]


def server_env(plan: ModelPlan, settings: pods.ServingSettings) -> list[dict[str, Any]]:
    """What every vLLM process of the model reads: the serving env, and the compile cache's root where shared."""
    env = pods.serving_env(settings.with_token)
    return env + (pods.compile_cache_env(plan.pool.gpu.key) if settings.compile_cache else [])


def rolling_update(plan: ModelPlan) -> dict[str, int]:
    """Never below serving capacity (a new replica is Ready before an old one goes) where the pool has room for
    the extra replica; where it has not (a one-GPU workstation), replace one at a time instead of waiting forever."""
    if plan.surge_fits:
        return {"maxUnavailable": 0, "maxSurge": 1}
    return {"maxUnavailable": 1, "maxSurge": 0}


def _probe(failures: int, period: int) -> dict[str, Any]:
    return {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": period, "timeoutSeconds": 5,
            "failureThreshold": failures}


NODE_PROVISIONING_SECONDS = 900
"""Time allowed for a GPU node and its image before the startup probe runs, where the prediction cannot say (a node
type or disk Triarch does not know)."""


def startup_seconds(plan: ModelPlan) -> int:
    """The startup probe's budget: the cold-start prediction's (planners/coldstart.py), or startupMinutes."""
    assert plan.cold_start is not None
    return plan.cold_start.budget_seconds


def rollout_seconds(plan: ModelPlan) -> int:
    """How long a new replica may take to serve: a node from zero and its image (the prediction's slow end with its
    margin, or NODE_PROVISIONING_SECONDS where unknown), then the startup probe's whole budget. What `pulumi up`
    waits on (the Deployment and its Service) and the Deployment's progress deadline get this long."""
    assert plan.cold_start is not None
    before = plan.cold_start.before_container
    margin = plan.cold_start.margin
    arrival = NODE_PROVISIONING_SECONDS if before is None else math.ceil(before.high * margin)
    return arrival + startup_seconds(plan)


def replica_count(plan: ModelPlan) -> dict[str, int]:
    """`spec.replicas` where the stack fixes the count; none where KEDA scales the model. The HPA KEDA creates owns
    the field through the scale subresource, so a manifest that also sets it conflicts with the HPA's manager
    under server-side apply, and the next `pulumi up` fails (pulumi-kubernetes 2491, 2569; Kubernetes' HPA docs,
    "Migrating Deployments and StatefulSets to horizontal autoscaling"). Left out, the API server starts the
    Deployment at one replica, which the HPA raises to autoscaling.min."""
    return {} if plan.config.autoscaling else {"replicas": plan.config.replicas}


LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"
LWS_REVISION_KEY = "leaderworkerset.sigs.k8s.io/template-revision-hash"
"""Labels LeaderWorkerSet v0.10.0 puts on a group's pods (its controller and pod webhook): the set's name, the
pod's index in its group (0: the leader), and a key shared by one group's pods."""


def gang_args(plan: ModelPlan, leader: bool) -> list[str]:
    """How the pods of one multi-node replica find each other, without Ray: vLLM's multiprocessing executor over
    `nnodes` nodes, rank 0 on the leader (which serves the API), the others headless, all meeting at the leader's
    address (LWS_LEADER_ADDRESS and LWS_WORKER_INDEX, which LWS's webhook sets; Kubernetes expands them)."""
    rank = "0" if leader else "$(LWS_WORKER_INDEX)"
    args = ["--nnodes", str(plan.nodes_per_replica), "--node-rank", rank, "--master-addr", "$(LWS_LEADER_ADDRESS)"]
    return args if leader else [*args, "--headless"]


def worker_args(plan: ModelPlan) -> list[str]:
    """A headless worker: the model and the engine args (the same as the leader's: every node builds the same
    config), none of the API server's."""
    return [*model_source(plan), *engine_flags(plan), *gang_args(plan, leader=False)]


def _server_container(plan: ModelPlan, settings: pods.ServingSettings) -> dict[str, Any]:
    """The vLLM container that serves the OpenAI API: a Deployment's pod, or a multi-node replica's leader."""
    args = serve_args(plan) + (gang_args(plan, leader=True) if plan.multi_node else [])
    return {
        "name": "vllm",
        "image": plan.image,
        "command": ["vllm", "serve"],
        "args": args,
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "env": server_env(plan, settings) + ([{"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {
            "name": pods.API_KEY_SECRET, "key": pods.API_KEY_KEY}}}] if settings.with_api_key else []),
        "resources": pod_resources(plan),
        "startupProbe": _probe(startup_seconds(plan) // PROBE_PERIOD_SECONDS, PROBE_PERIOD_SECONDS),
        "readinessProbe": _probe(3, 5),
        "livenessProbe": _probe(3, PROBE_PERIOD_SECONDS),
        "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", f"sleep {ENDPOINT_DRAIN_SECONDS}"]}}},
        "securityContext": pods.container_security(read_only_root=True),
        "volumeMounts": pods.volume_mounts(),
    }


def _pod_spec(plan: ModelPlan, settings: pods.ServingSettings, container: dict[str, Any],
              placement: dict[str, Any]) -> dict[str, Any]:
    # adapters: the Hub adapters fetched at their commits into the model cache before vLLM starts
    fetch = fetch_container(plan.config, plan.image, pods.serving_env(settings.with_token))
    return {
        **placement,
        "terminationGracePeriodSeconds": grace_period_seconds(),
        "automountServiceAccountToken": False,
        # S3 weights: the account their role trusts (its token comes from the pod identity webhook's own volume).
        **({"serviceAccountName": pods.weights_service_account(plan.name)} if plan.config.weights_uri else {}),
        **pods.pull_secrets(settings),
        "securityContext": pods.pod_security(),
        "containers": [container],
        **({"initContainers": [fetch]} if fetch else {}),
        "volumes": pods.volumes(pods.cache_claim_name(plan.name), shm_gib=shm_gib(plan.gpus_per_pod,
                                                                                plan.kv_offload_gib)),
    }


def _service_and_budget(plan: ModelPlan, settings: pods.ServingSettings, labels: dict[str, str],
                        selector: dict[str, str], budget_selector: dict[str, str]) -> list[dict[str, Any]]:
    service = {
        "apiVersion": "v1", "kind": "Service",
        # Pulumi waits for a Service with a selector to have ready endpoints (10 minutes by default, as long as
        # a replica may take to load): the same budget as the workload it fronts.
        "metadata": {"name": plan.name, "namespace": settings.namespace, "labels": labels,
                     "annotations": {"pulumi.com/timeoutSeconds": str(rollout_seconds(plan))}},
        "spec": {"type": "ClusterIP", "selector": selector,
                 "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}]},
    }
    budgets = []
    if picker.routed(plan):
        # Behind the endpoint picker: the Service's backends are its proxies, at their port; a proxy sends each
        # request on to the vLLM pod the picker chose (the InferencePool's, on vLLM's port).
        service["spec"] = {"type": "ClusterIP", "selector": picker.proxy_pod_selector(plan.name), "ports": [
            {"name": "http", "port": PORT, "targetPort": picker.PROXY_PORT, "protocol": "TCP"}]}
        budgets.append(picker.proxy_budget(plan.name, settings.namespace, labels))
    budget = {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": plan.name, "namespace": settings.namespace, "labels": labels},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": budget_selector}},
    }
    return [service, budget, *budgets]


def vllm_manifests(plan: ModelPlan, settings: pods.ServingSettings) -> list[dict[str, Any]]:
    if plan.multi_node:
        return leader_worker_manifests(plan, settings)
    labels = pods.model_labels(plan, "vllm")
    selector = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": plan.name}
    _, most = replica_bounds(plan)
    container = _server_container(plan, settings)
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": plan.name, "namespace": settings.namespace, "labels": labels, "annotations": {
            # `pulumi up` waits for the rollout: a node from zero, then the download, then the load.
            "pulumi.com/timeoutSeconds": str(rollout_seconds(plan)),
            **pods.image_release(plan.image, plan.release), **pods.scanner_exceptions(plan.image)}},
        "spec": {
            **replica_count(plan),
            # The controller's own deadline (600 s by default) would mark a rollout that is still loading weights
            # as failed (ProgressDeadlineExceeded, which Pulumi reports): it gets the same budget.
            "progressDeadlineSeconds": rollout_seconds(plan),
            "selector": {"matchLabels": selector},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling_update(plan)},
            "template": {
                "metadata": {"labels": labels},
                "spec": _pod_spec(plan, settings, container,
                                  pods.placement(plan.pool, selector, most, pods.DEPLOYMENT_REVISION_KEY)),
            },
        },
    }
    claim = pods.cache_claim(plan.name, plan.cache_gib, settings)
    return [*_identity(plan, settings), claim, deployment,
            *_service_and_budget(plan, settings, labels, selector, selector)]


def leader_worker_manifests(plan: ModelPlan, settings: pods.ServingSettings) -> list[dict[str, Any]]:
    """A replica across nodes as a LeaderWorkerSet: one group per replica, a pod per node (all its GPUs), the leader
    serving the API; a group restarts as a whole (one lost stage stops the replica); the Service sends to leaders
    only. Groups spread over zones; a group's pods stay in one zone (see `pods.gang_placement`)."""
    labels = pods.model_labels(plan, "vllm")
    selector = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": plan.name}
    leaders = {**selector, LWS_WORKER_INDEX: "0"}
    _, most = replica_bounds(plan)
    together = pods.gang_affinity({LWS_NAME_LABEL: plan.name}, LWS_GROUP_KEY)
    leader_spec = _pod_spec(plan, settings, _server_container(plan, settings),
                            {**pods.placement(plan.pool, leaders, most, LWS_REVISION_KEY), "affinity": together})
    leader_env = leader_spec["containers"][0]["env"]
    worker_env = server_env(plan, settings)
    if uses_efa(plan):
        leader_env += pods.NCCL_TRANSPORT_LOGS
        worker_env += pods.NCCL_TRANSPORT_LOGS
    worker = {
        "name": "vllm-worker", "image": plan.image, "command": ["vllm", "serve"], "args": worker_args(plan),
        "env": worker_env, "resources": pod_resources(plan),
        "securityContext": pods.container_security(read_only_root=True), "volumeMounts": pods.volume_mounts(),
    }
    worker_spec = _pod_spec(plan, settings, worker,
                            {"nodeSelector": {POOL_LABEL: plan.pool.name}, "tolerations": [gpu_toleration()],
                             "affinity": together})
    lws = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": plan.name, "namespace": settings.namespace, "labels": labels, "annotations": {
            **pods.image_release(plan.image, plan.release), **pods.scanner_exceptions(plan.image)}},
        "spec": {
            "replicas": plan.config.replicas,
            # Workers start with their leader, not after it is Ready: the leader waits for them to load its model.
            "startupPolicy": "LeaderCreated",
            # A headless Service per group, named after its leader pod. With the default (Shared) the controller
            # makes one named after the set, which is the name of the model's own Service below: made first, it
            # fails Triarch's apply (a field conflict); made second, the controller takes Triarch's ClusterIP
            # Service for it and the group's pods get no DNS names (both met on a real `pulumi up`, LWS 0.9.0).
            "networkConfig": {"subdomainPolicy": "UniquePerReplica"},
            "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": rolling_update(plan)},
            "leaderWorkerTemplate": {
                "size": plan.nodes_per_replica,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {"metadata": {"labels": {**labels, "triarch.dev/role": "leader"}},
                                   "spec": leader_spec},
                "workerTemplate": {"metadata": {"labels": {**labels, "triarch.dev/role": "worker"}},
                                   "spec": worker_spec},
            },
        },
    }
    claim = pods.cache_claim(plan.name, plan.cache_gib, settings)
    return [*_identity(plan, settings), claim, lws, *_service_and_budget(plan, settings, labels, leaders, selector)]


def _identity(plan: ModelPlan, settings: pods.ServingSettings) -> list[dict[str, Any]]:
    """The service account of a model whose weights come from S3 (before the pods that name it)."""
    if plan.config.weights_uri is None:
        return []
    return [pods.service_account(pods.weights_service_account(plan.name), settings.namespace,
                                 settings.weights_role_arn)]
