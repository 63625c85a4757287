"""Stack-wide serving decisions: the namespace of the workloads and the storage of their model caches."""

from __future__ import annotations

from typing import Any

from triarch.config import StackConfig
from triarch.planners import pods

EFS_STORAGE_CLASS = "triarch-efs"
"""The shared-filesystem class a created cluster gets, so every replica reads one model cache."""


def serving_settings(stack: StackConfig, with_token: bool) -> pods.ServingSettings:
    serving = stack.serving
    created = stack.cluster.create
    storage_class = serving.storage_class or (EFS_STORAGE_CLASS if created else None)
    access_mode = serving.access_mode or ("ReadWriteMany" if created else "ReadWriteOnce")
    return pods.ServingSettings(serving.namespace, storage_class, access_mode, with_token)


KUBERAY_NAMESPACE = "kuberay-system"
RAY_NODE_LABEL = {"ray.io/is-ray-node": "yes"}
"""KubeRay sets this label on every Ray pod it creates."""


def network_policies(settings: pods.ServingSettings, with_ray: bool) -> list[dict[str, Any]]:
    """Ingress to the serving namespace: deny by default; the OpenAI port from anywhere in the cluster; Ray pods
    to each other; the KubeRay operator to the Ray dashboard (it submits the Serve config there). Nothing else
    reaches GCS, the dashboard or the Ray client port."""
    namespace = settings.namespace

    def policy(name: str, selector: dict[str, Any], ingress: list[dict[str, Any]]) -> dict[str, Any]:
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": name, "namespace": namespace, "labels": dict(pods.MANAGED_BY)},
                "spec": {"podSelector": selector, "policyTypes": ["Ingress"], "ingress": ingress}}

    http = [{"protocol": "TCP", "port": 8000}]
    policies = [
        policy("default-deny-ingress", {}, []),
        policy("allow-openai-http", {}, [{"from": [{"namespaceSelector": {}}], "ports": http}]),
    ]
    if with_ray:
        ray_pods = {"matchLabels": dict(RAY_NODE_LABEL)}
        operator = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": KUBERAY_NAMESPACE}}}
        policies += [
            policy("allow-ray-internal", ray_pods, [{"from": [{"podSelector": ray_pods}]}]),
            policy("allow-kuberay-dashboard", ray_pods,
                   [{"from": [operator], "ports": [{"protocol": "TCP", "port": 8265}]}]),
        ]
    return policies
