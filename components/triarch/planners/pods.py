"""Pod pieces every GPU inference workload shares, whichever engine runs it: placement on its pool (where),
zone spread, the model cache volume, the Hugging Face token, and a locked-down security context."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from triarch.images import IMAGE_RELEASE
from triarch.planners.model_plan import ModelPlan
from triarch.planners.nodegroups import PoolPlan
from triarch.scheduling import POOL_LABEL, gpu_toleration

EFS_STORAGE_CLASS = "triarch-efs"
"""The shared-filesystem class a created cluster gets, so every replica reads one model cache."""
BLOCK_STORAGE_CLASS = "triarch-gp3"
"""A created cluster's block storage (EBS gp3) for what needs a local filesystem: Prometheus' TSDB."""
CLAIM_SIZE = "spec.resources.requests.storage"
PULL_SECRET = "triarch-registry"
"""The image pull Secret (kubernetes.io/dockerconfigjson) in every namespace where Triarch runs pods."""


def pull_secrets(settings: ServingSettings) -> dict[str, Any]:
    """A pod spec's imagePullSecrets, where the stack's registry takes credentials."""
    return {"imagePullSecrets": [{"name": PULL_SECRET}]} if settings.with_pull_secret else {}


def image_release(image: str, release: str) -> dict[str, str]:
    return {IMAGE_RELEASE: release} if release and image != release else {}

ZONE_KEY = "topology.kubernetes.io/zone"
HOSTNAME_KEY = "kubernetes.io/hostname"
CACHE_MOUNT = "/models"
HF_HOME = f"{CACHE_MOUNT}/huggingface"
HF_TOKEN_SECRET = "hf-token"
HF_TOKEN_KEY = "token"
API_KEY_SECRET = "vllm-api-key"
API_KEY_KEY = "key"
RUN_AS = 1000
"""The vLLM and Ray images' serving user (rayproject images ship user `ray`, uid 1000)."""
RUN_AS_NAME = "ray"
"""The name of uid 1000 where an image has one (rayproject's `ray`); given to the others through USER/LOGNAME."""

MANAGED_BY = {"app.kubernetes.io/managed-by": "triarch"}


def scanner_exceptions(image: str) -> dict[str, str]:
    """Scanner findings Triarch accepts on a workload of `image`, each with its reason, as annotations on the object
    (a digest-pinned image needs no exception for its tag). Each check keeps its own key."""
    reasons = {
        "checkov.io/skip1": "CKV_K8S_43=images are pinned by version tag in templates/compat/images.yaml, whose CUDA "
                            "the driver matrix checks; a stack pins a digest with triarch:images {release, image}",
        "checkov.io/skip2": "CKV_K8S_15=pinned tags never move; IfNotPresent avoids re-pulling a 10+ GB image (and "
                            "registry rate limits) on every restart",
        "checkov.io/skip3": "CKV_K8S_40=the serving images' user is uid 1000 (rayproject's `ray`), which owns the "
                            "model cache access point",
    }
    if "@sha256:" in image:
        del reasons["checkov.io/skip1"]
    return reasons


def model_labels(plan: ModelPlan, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": component, "app.kubernetes.io/instance": plan.name,
            "triarch.dev/model": plan.name, **MANAGED_BY}


def cache_claim_name(owner: str) -> str:
    return f"{owner}-hf-cache"


def zone_spread(pool: PoolPlan, max_replicas: int) -> dict[str, Any]:
    """How a workload's replicas spread over its pool's zones.

    Hard (DoNotSchedule) where the pool's zones are known and there are two replicas or more: the scheduler drops a
    soft spread whenever it cannot be met when it places a pod (a pool scaling from zero may show it one zone, its
    first node's). Karpenter 1.14 honours a soft spread when it launches nodes (preference policy Respect, its
    default; shown on the real controller), but cluster-autoscaler and the Ignore policy do not, and the hard spread
    holds whatever launches the nodes. minDomains makes the scheduler treat the zones it has not seen yet as empty:
    the second replica waits for a node in another zone. It is capped by the zones and the pool's node count, so
    the spread can always be met. Where the zones are unknown (existing nodes, which may carry no zone label at
    all) the spread stays soft.
    """
    if pool.zones is None or max_replicas < 2:
        return {"whenUnsatisfiable": "ScheduleAnyway"}
    spread: dict[str, Any] = {"whenUnsatisfiable": "DoNotSchedule"}
    domains = min(len(pool.zones), pool.max_nodes, max_replicas)
    if domains >= 2:
        spread["minDomains"] = domains
    return spread


DEPLOYMENT_REVISION_KEY = "pod-template-hash"
"""The label the Deployment controller gives each revision's pods (its ReplicaSet's)."""


def placement(pool: PoolPlan, selector: dict[str, str], max_replicas: int, revision_key: str) -> dict[str, Any]:
    """Only the pool's nodes, tolerating their GPU taint; replicas spread over zones (see `zone_spread`), then
    softly over hosts (packing two replicas on one node is better than leaving one Pending).

    Each spread counts one revision's pods only (`matchLabelKeys` with the label its controller gives a revision:
    a ReplicaSet's hash, a Ray cluster's name, a LeaderWorkerSet's template hash; Kubernetes 1.27 beta, on by
    default). Counted with the pods they replace, the new ones of a rollout or of a RayService upgrade are refused
    every zone the old ones fill: on a pool whose one free node is in such a zone, the new Ray cluster waits for the
    old one to go, which waits for the new one to serve (shown on the real scheduler)."""
    by_zone = {"maxSkew": 1, "topologyKey": ZONE_KEY, **zone_spread(pool, max_replicas),
               "labelSelector": {"matchLabels": selector}, "matchLabelKeys": [revision_key]}
    by_host = {"maxSkew": 1, "topologyKey": HOSTNAME_KEY, "whenUnsatisfiable": "ScheduleAnyway",
               "labelSelector": {"matchLabels": selector}, "matchLabelKeys": [revision_key]}
    return {
        "nodeSelector": {POOL_LABEL: pool.name},
        "tolerations": [gpu_toleration()],
        "topologySpreadConstraints": [by_zone, by_host],
    }


def gang_affinity(members: dict[str, str], group_key: str) -> dict[str, Any]:
    """The pods of one multi-node replica in one zone: each requires the zone of the group's pods already placed
    (`matchLabelKeys` adds the pod's own group key to the selector at creation; Kubernetes 1.33 GA). The first pod
    of a group matches its own term and places freely; the zone spread of the leaders decides where groups go."""
    return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": dict(members)}, "matchLabelKeys": [group_key], "topologyKey": ZONE_KEY}]}}


def pod_security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
            "fsGroupChangePolicy": "OnRootMismatch", "seccompProfile": {"type": "RuntimeDefault"}}


def container_security(read_only_root: bool) -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "privileged": False, "readOnlyRootFilesystem": read_only_root,
            "capabilities": {"drop": ["ALL"]}}


def serving_env(with_token: bool) -> list[dict[str, Any]]:
    """The model cache, a writable HOME, and a user name: uid 1000 has no passwd entry in the vLLM image, and
    PyTorch's cache-dir lookup (getpass.getuser) fails on it unless LOGNAME or USER is set (vLLM #44548)."""
    env: list[dict[str, Any]] = [
        {"name": "HF_HOME", "value": HF_HOME},
        {"name": "HOME", "value": "/tmp"},
        {"name": "USER", "value": RUN_AS_NAME},
        {"name": "LOGNAME", "value": RUN_AS_NAME},
        # No usage reports leave the cluster (vLLM's and Ray's telemetry are on by default).
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
        {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"},
    ]
    if with_token:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": HF_TOKEN_SECRET, "key": HF_TOKEN_KEY}}})
    return env


COMPILE_CACHE_DIR = f"{CACHE_MOUNT}/vllm"


def compile_cache_env(gpu_key: str) -> list[dict[str, Any]]:
    """vLLM's cache root (its torch.compile artifacts among them) on the model cache volume, one directory per GPU
    type: vLLM keys each entry by its config (model, parallelism, engine args, vLLM version) and code hashes, which
    say nothing of the GPU the kernels were built for."""
    return [{"name": "VLLM_CACHE_ROOT", "value": f"{COMPILE_CACHE_DIR}/{gpu_key}"}]


def weights_service_account(model: str) -> str:
    """The service account of a model whose weights come from S3: the one identity its role trusts."""
    return f"{model}-weights"


IRSA_ANNOTATION = "eks.amazonaws.com/role-arn"
"""What EKS's pod identity webhook reads (IAM roles for service accounts) to give pods a role's credentials."""


def service_account(name: str, namespace: str, role_arn: str | None) -> dict[str, Any]:
    """A service account whose token is never mounted by default; annotated with a role for IRSA where given (EKS Pod
    Identity needs no annotation: its association names the account)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(MANAGED_BY)}
    if role_arn:
        metadata["annotations"] = {IRSA_ANNOTATION: role_arn}
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata, "automountServiceAccountToken": False}


NCCL_TRANSPORT_LOGS = [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "NCCL_DEBUG_SUBSYS", "value": "INIT,NET"}]
"""NCCL says at start-up which network it uses ("Using network Libfabric" over EFA, "Using network Socket" when it
fell back to TCP): `triarch verify` reads it from a pod of a replica across nodes on an EFA pool."""


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
    """Where serving workloads go, how their caches are stored, who may call them and what they may reach:
    decided once per stack."""

    namespace: str
    storage_class: str | None
    access_mode: str
    with_token: bool
    """Whether a Hugging Face token secret exists for the pods to read."""
    with_api_key: bool = False
    """Whether vLLM servers require an API key (a Secret the pods read as VLLM_API_KEY)."""
    client_namespaces: tuple[str, ...] = ()
    hub_cidrs: tuple[str, ...] = ("0.0.0.0/0",)
    vpc_cidr: str | None = None
    """The created cluster's VPC range (nodes, the API server's endpoints), kept out of the pods' egress."""
    with_pull_secret: bool = False
    """Whether the pods pull with the registry's credentials (triarch:registryPassword)."""
    compile_cache: bool = False
    """Whether vLLM keeps its compile cache on the model cache volume (serving.compileCache)."""
    weights_role_arn: str | None = None
    """An adopted cluster's role for S3 weights (IRSA), annotated on each S3 model's service account."""


def cache_claim(owner: str, size_gib: int, settings: ServingSettings) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": [settings.access_mode],
                            "resources": {"requests": {"storage": f"{size_gib}Gi"}}}
    if settings.storage_class:
        spec["storageClassName"] = settings.storage_class
    # Not awaited on its own: pulumi-kubernetes 4.25 gives a claim a fixed 5 minutes to bind (to stay Pending, where
    # it reads a WaitForFirstConsumer class), while the Deployment that mounts it already waits for it to be Bound
    # on the rollout's budget (pkg/await/deployment.go), and a class may bind later than 5 minutes.
    metadata = {"name": cache_claim_name(owner), "namespace": settings.namespace, "labels": dict(MANAGED_BY),
                "annotations": {"pulumi.com/skipAwait": "true"}}
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": spec}


def kept_at_creation(obj: dict[str, Any]) -> list[str]:
    """Inputs Pulumi sends once and never updates (the object's ignoreChanges). A claim on Triarch's EFS class: EFS
    is elastic and its driver ignores the size, while the API server refuses any size change of a claim whose class
    cannot expand; so a new Ray Serve model (whose cache adds to the shared claim's size) or a `cacheGiB` edit never
    fails `pulumi up` on it."""
    if obj.get("kind") == "PersistentVolumeClaim" and obj.get("spec", {}).get("storageClassName") == EFS_STORAGE_CLASS:
        return [CLAIM_SIZE]
    return []


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
