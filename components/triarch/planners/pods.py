"""Pod pieces every GPU inference workload shares, whichever engine runs it: placement on its pool (where),
zone spread, the model cache volume, the Hugging Face token, and a locked-down security context."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from triarch.planners.models import ModelPlan
from triarch.scheduling import POOL_LABEL, gpu_toleration

ZONE_KEY = "topology.kubernetes.io/zone"
HOSTNAME_KEY = "kubernetes.io/hostname"
CACHE_MOUNT = "/models"
HF_HOME = f"{CACHE_MOUNT}/huggingface"
HF_TOKEN_SECRET = "hf-token"
HF_TOKEN_KEY = "token"
RUN_AS = 1000
"""The vLLM and Ray images' serving user (rayproject images ship user `ray`, uid 1000)."""

MANAGED_BY = {"app.kubernetes.io/managed-by": "triarch"}

SCANNER_EXCEPTIONS = {
    "checkov.io/skip1": "CKV_K8S_43=images are pinned by version tag in templates/compat/images.yaml, whose CUDA "
                        "the driver matrix checks; a digest needs the registry at plan time",
    "checkov.io/skip2": "CKV_K8S_15=pinned tags never move; IfNotPresent avoids re-pulling a 10+ GB image (and "
                        "registry rate limits) on every restart",
    "checkov.io/skip3": "CKV_K8S_40=the serving images' user is uid 1000 (rayproject's `ray`), which owns the "
                        "model cache access point",
}
"""Scanner findings Triarch accepts, with the reason, on the objects they concern."""


def model_labels(plan: ModelPlan, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": component, "app.kubernetes.io/instance": plan.name,
            "triarch.dev/model": plan.name, **MANAGED_BY}


def cache_claim_name(owner: str) -> str:
    return f"{owner}-hf-cache"


def placement(pool: str, selector: dict[str, str]) -> dict[str, Any]:
    """Only the pool's nodes, tolerating their GPU taint; replicas spread over zones, then hosts.

    ScheduleAnyway: GPU capacity is often short in one zone, and a Pending replica serves nobody; the skew
    stays bounded (maxSkew 1) whenever capacity allows.
    """
    return {
        "nodeSelector": {POOL_LABEL: pool},
        "tolerations": [gpu_toleration()],
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": selector}}
            for key in (ZONE_KEY, HOSTNAME_KEY)
        ],
    }


def pod_security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
            "fsGroupChangePolicy": "OnRootMismatch", "seccompProfile": {"type": "RuntimeDefault"}}


def container_security(read_only_root: bool) -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "privileged": False, "readOnlyRootFilesystem": read_only_root,
            "capabilities": {"drop": ["ALL"]}}


def cache_env(with_token: bool) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "HF_HOME", "value": HF_HOME},
        {"name": "HOME", "value": "/tmp"},
    ]
    if with_token:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": HF_TOKEN_SECRET, "key": HF_TOKEN_KEY}}})
    return env


def volumes(claim: str, shm_gib: int) -> list[dict[str, Any]]:
    """The model cache (a claim, never emptyDir: weights survive restarts), scratch, and shared memory for NCCL."""
    return [
        {"name": "model-cache", "persistentVolumeClaim": {"claimName": claim}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_gib}Gi"}},
    ]


def volume_mounts() -> list[dict[str, Any]]:
    return [
        {"name": "model-cache", "mountPath": CACHE_MOUNT},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]


@dataclass(frozen=True)
class ServingSettings:
    """Where serving workloads go and how their caches are stored: decided once per stack."""

    namespace: str
    storage_class: str | None
    access_mode: str
    with_token: bool
    """Whether a Hugging Face token secret exists for the pods to read."""


def cache_claim(owner: str, size_gib: int, settings: ServingSettings) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": [settings.access_mode],
                            "resources": {"requests": {"storage": f"{size_gib}Gi"}}}
    if settings.storage_class:
        spec["storageClassName"] = settings.storage_class
    # Claims of a WaitForFirstConsumer class bind only when a pod arrives: Pulumi must not wait for them.
    metadata = {"name": cache_claim_name(owner), "namespace": settings.namespace, "labels": dict(MANAGED_BY),
                "annotations": {"pulumi.com/skipAwait": "true"}}
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": spec}


def namespace(name: str, pod_security: str, why: str) -> dict[str, Any]:
    """A namespace with its Pod Security Standard enforced, and the reason for the level on the object."""
    return {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {"pod-security.kubernetes.io/enforce": pod_security,
                       "pod-security.kubernetes.io/enforce-version": "latest", **MANAGED_BY},
            "annotations": {"triarch.dev/pod-security-reason": why},
        },
    }
