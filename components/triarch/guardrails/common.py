"""Helpers more than one layer's rules read: a resource's GPU pod templates, whether the plan knows a value, the
Karpenter kinds, and each vLLM server (or Ray Serve model) with its engine settings and the GPUs of one replica."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeGuard

from triarch.guardrails.base import Resource
from triarch.guardrails.workloads import (
    LWS_KIND,
    PodTemplate,
    command_line,
    flag,
    gpu_count,
    is_vllm,
    kind_of,
    llm_configs,
    name_of,
    pod_templates,
    requests_gpus,
)
from triarch.known import KNOWN_AFTER_APPLY as UNKNOWN

NODE_POOL = "karpenter.sh/v1:NodePool"
NODE_CLASS = "karpenter.k8s.aws/v1:EC2NodeClass"


def gpu_templates(resource: Resource) -> list[PodTemplate]:
    return [t for t in pod_templates(resource.type, resource.props, resource.name) if requests_gpus(t.spec)]


def known(value: object) -> TypeGuard[int | float | str]:
    """A value the plan knows (not missing, not only known after apply)."""
    return value is not None and value != UNKNOWN


@dataclass(frozen=True)
class ServerSettings:
    """One vLLM server (or Ray Serve model) and the GPUs its engine may use."""

    where: str
    settings: dict[str, Any]
    gpus: int | None
    """GPUs of one model replica (a container; a LeaderWorkerSet group; a multi-node engine's pods)."""
    ray_worker_gpus: tuple[int, ...] = ()
    """For Ray Serve: the GPUs of each worker group's pods, which replicas pack into or span."""


def _multi_node(argv: list[str]) -> bool:
    return flag(argv, "distributed_executor_backend") == "ray"


def vllm_settings(resource: Resource) -> list[ServerSettings]:
    """Each vLLM server or Ray Serve model with its engine settings and the GPUs one replica holds."""
    found: list[ServerSettings] = []
    templates = list(pod_templates(resource.type, resource.props, resource.name))
    lws = kind_of(resource.type) == LWS_KIND
    for template in templates:
        if lws and template.where.endswith(" workers"):
            continue  # the leader's engine holds the group; its workers are the rest of one replica
        for c in template.spec.get("containers") or []:
            if not is_vllm(c) or template.ray:
                continue
            argv = command_line(c)
            settings = {key: flag(argv, key) for key in
                        ("gpu_memory_utilization", "tensor_parallel_size", "pipeline_parallel_size")}
            gpus = gpu_count(c)
            if lws:
                workers = [t for t in templates if t.where.endswith(" workers")]
                size = 1 + (workers[0].replicas // max(1, template.replicas) if workers else 0)
                worker_gpus = max((gpu_count(w) or 0 for t in workers for w in t.spec.get("containers") or []),
                                  default=0)
                gpus = (gpus or 0) + (size - 1) * worker_gpus
            elif _multi_node(argv):
                gpus = None  # the engine spans pods Kubernetes does not group: nothing to compare with
            found.append(ServerSettings(f"{template.where} container {c.get('name')}", settings, gpus))
    if kind_of(resource.type).startswith("ray.io/") and kind_of(resource.type).endswith("RayService"):
        groups = tuple(sorted({g for t in templates if t.ray and not t.ray_head
                               for c in t.spec.get("containers") or [] if (g := gpu_count(c))}))
        for app, llm in llm_configs(resource.props):
            kwargs = dict(llm.get("engine_kwargs") or {})
            found.append(ServerSettings(f"RayService {name_of(resource.props, resource.name)} application {app}",
                                        kwargs, None, groups))
    return found
