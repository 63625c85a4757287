"""Every guardrail, in one place and in the order the policy pack, `triarch check` and the tests see them. Each
rule lives in the module of the layer that decides what it checks: where_pods and where_pools (Kubernetes
scheduling: the pods, then the GPU pools and the placement proof), how (Ray), when (vLLM), security. A rule's
`layer` is the scheduler its findings are reported under; the note beside each says it and the default
enforcement (a stack's policy config may change the enforcement)."""

from __future__ import annotations

from triarch.guardrails import how, security, when, where_pods, where_pools
from triarch.guardrails.base import Rule

RULES: tuple[Rule, ...] = (
    where_pods.GPU_ZONE_SPREAD,                   # Kubernetes  mandatory
    where_pods.GPU_LIMITS,                        # Kubernetes  mandatory
    where_pods.GPU_SCHEDULING,                    # Kubernetes  advisory
    where_pods.GPU_NODE_SELECTION,                # Kubernetes  advisory
    security.NO_PRIVILEGED_PODS,                  # Kubernetes  mandatory
    security.NO_DEVICE_RESET,                     # Kubernetes  mandatory
    security.PINNED_IMAGES,                       # Kubernetes  mandatory
    where_pools.GPU_NODEGROUP_LABELS_TAINT,       # Kubernetes  mandatory
    security.IMDSV2_REQUIRED,                     # Kubernetes  mandatory
    when.MODEL_CACHE_NOT_EMPTYDIR,                # Kubernetes  mandatory
    security.RAY_PORTS_INTERNAL,                  # Ray         mandatory
    security.SERVING_NETWORK_ISOLATED,            # Kubernetes  mandatory
    how.NO_CPU_HPA_ON_GPU,                        # Ray         mandatory
    when.PRESTOP_DRAIN,                           # vLLM        mandatory
    when.INFERENCE_PROBES,                        # vLLM        mandatory
    when.VLLM_MEMORY_UTILIZATION,                 # vLLM        mandatory
    how.VLLM_PARALLELISM_MATCHES_GPUS,            # vLLM        mandatory
    when.MODEL_CACHE_PERSISTENT,                  # Kubernetes  advisory
    when.RWO_CACHE_SURGE,                         # Kubernetes  advisory
    when.GPU_SERVER_RESOURCES,                    # Kubernetes  advisory
    where_pods.PINNED_GPU_DRIVER,                 # Kubernetes  mandatory
    how.SERVE_GRACEFUL_SHUTDOWN,                  # Ray         advisory
    security.NO_PLAINTEXT_SECRETS,                # Kubernetes  mandatory
    where_pools.DRIVER_CUDA_COMPATIBLE,           # Kubernetes  mandatory
    where_pools.POD_PLACEMENT,                    # Kubernetes  mandatory
    where_pools.POOL_CAPACITY,                    # Kubernetes  mandatory
    where_pools.POOL_SCALE_FROM_ZERO,             # Kubernetes  mandatory
    how.KV_TRANSFER_OVER_TCP,                     # Ray         advisory
    security.RUNTIME_LORA_NEVER_PUBLIC,           # Kubernetes  mandatory
)
"""The policy pack lists its policies, and `triarch check` its findings, in this order."""
