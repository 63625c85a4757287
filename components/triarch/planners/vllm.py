"""A model served by plain vLLM: Deployment + Service + PodDisruptionBudget + model cache claim.

vLLM decides *when* each request runs; this planner only hands it the engine args the tuner computed and
makes sure Kubernetes never cuts a request short: readiness gates traffic, the startup probe waits for the
download, preStop lets endpoints drain, and `--shutdown-timeout` lets vLLM finish what it accepted.
"""

from __future__ import annotations

from typing import Any

from triarch.planners import pods
from triarch.planners.models import ModelPlan, pod_resources, replica_bounds

PORT = 8000
ENDPOINT_DRAIN_SECONDS = 15
"""preStop sleep: time for endpoint removal to reach kube-proxy and load balancers before vLLM is signalled."""
SHUTDOWN_TIMEOUT_SECONDS = 60
"""vLLM's --shutdown-timeout: how long it keeps serving accepted requests after SIGTERM."""
GRACE_MARGIN_SECONDS = 15
PROBE_PERIOD_SECONDS = 10


def grace_period_seconds() -> int:
    return ENDPOINT_DRAIN_SECONDS + SHUTDOWN_TIMEOUT_SECONDS + GRACE_MARGIN_SECONDS


def serve_args(plan: ModelPlan) -> list[str]:
    """`vllm serve` arguments: the model, where to listen, the drain window and the tuned engine args."""
    args = [plan.config.model, "--served-model-name", plan.name, "--host", "0.0.0.0", "--port", str(PORT),
            "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_SECONDS)]
    for key, value in plan.sizing.engine_args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is not False and value is not None:
            args += [flag, str(value)]
    return args


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
"""Time for the autoscaler to bring a GPU node from zero (boot, driver, image pull) before the startup probe runs."""


def rollout_seconds(plan: ModelPlan) -> int:
    """How long a new replica may take to serve: a node from zero, then the startup probe's whole budget. What
    `pulumi up` waits on (the Deployment and its Service) and the Deployment's progress deadline get this long."""
    return NODE_PROVISIONING_SECONDS + plan.config.startup_minutes * 60


def replica_count(plan: ModelPlan) -> dict[str, int]:
    """`spec.replicas` where the stack fixes the count; none where KEDA scales the model. The HPA KEDA creates owns
    the field through the scale subresource, so a manifest that also sets it conflicts with the HPA's manager
    under server-side apply, and the next `pulumi up` fails (pulumi-kubernetes 2491, 2569; Kubernetes' HPA docs,
    "Migrating Deployments and StatefulSets to horizontal autoscaling"). Left out, the API server starts the
    Deployment at one replica, which the HPA raises to autoscaling.min."""
    return {} if plan.config.autoscaling else {"replicas": plan.config.replicas}


def vllm_manifests(plan: ModelPlan, settings: pods.ServingSettings) -> list[dict[str, Any]]:
    labels = pods.model_labels(plan, "vllm")
    selector = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": plan.name}
    _, most = replica_bounds(plan)
    container = {
        "name": "vllm",
        "image": plan.image,
        "command": ["vllm", "serve"],
        "args": serve_args(plan),
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "env": pods.serving_env(settings.with_token) + ([{"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {
            "name": pods.API_KEY_SECRET, "key": pods.API_KEY_KEY}}}] if settings.with_api_key else []),
        "resources": pod_resources(plan),
        "startupProbe": _probe(plan.config.startup_minutes * 60 // PROBE_PERIOD_SECONDS, PROBE_PERIOD_SECONDS),
        "readinessProbe": _probe(3, 5),
        "livenessProbe": _probe(3, PROBE_PERIOD_SECONDS),
        "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", f"sleep {ENDPOINT_DRAIN_SECONDS}"]}}},
        "securityContext": pods.container_security(read_only_root=True),
        "volumeMounts": pods.volume_mounts(),
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": plan.name, "namespace": settings.namespace, "labels": labels, "annotations": {
            # `pulumi up` waits for the rollout: a node from zero, then the download, then the load.
            "pulumi.com/timeoutSeconds": str(rollout_seconds(plan)),
            **pods.image_release(plan.image, plan.release), **pods.SCANNER_EXCEPTIONS}},
        "spec": {
            **replica_count(plan),
            # The controller's own deadline (600 s by default) would mark a rollout that is still loading weights
            # as failed (ProgressDeadlineExceeded, which Pulumi reports): it gets the same budget.
            "progressDeadlineSeconds": rollout_seconds(plan),
            "selector": {"matchLabels": selector},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling_update(plan)},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    **pods.placement(plan.pool, selector, most),
                    "terminationGracePeriodSeconds": grace_period_seconds(),
                    "automountServiceAccountToken": False,
                    **pods.pull_secrets(settings),
                    "securityContext": pods.pod_security(),
                    "containers": [container],
                    "volumes": pods.volumes(pods.cache_claim_name(plan.name), shm_gib=2 * plan.gpus_per_replica),
                },
            },
        },
    }
    service = {
        "apiVersion": "v1", "kind": "Service",
        # Pulumi waits for a Service with a selector to have ready endpoints (10 minutes by default, as long as
        # a replica may take to load): the same budget as the Deployment it fronts.
        "metadata": {"name": plan.name, "namespace": settings.namespace, "labels": labels,
                     "annotations": {"pulumi.com/timeoutSeconds": str(rollout_seconds(plan))}},
        "spec": {"type": "ClusterIP", "selector": selector,
                 "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}]},
    }
    budget = {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": plan.name, "namespace": settings.namespace, "labels": labels},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}},
    }
    claim = pods.cache_claim(plan.name, plan.cache_gib, settings)
    return [claim, deployment, service, budget]
