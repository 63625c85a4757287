"""How: Ray's layer, which splits the work. GPU servers scale on their queue, not on CPU (no HPA or KEDA trigger on
CPU or memory), a model replica's tensor x pipeline parallelism matches the GPUs it is given (a container, a
LeaderWorkerSet group, or Ray worker pods it packs into or spans), and Ray Serve lets a replica finish its
requests when it scales down."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from triarch.disaggregation import PD_BUILDER, facts
from triarch.guardrails.base import Config, Resource, rule, stack_rule
from triarch.guardrails.common import gpu_templates, known, vllm_settings
from triarch.guardrails.workloads import kind_of, llm_configs, name_of, serve_applications
from triarch.kv_offload import MULTI_CONNECTOR
from triarch.scheduling import ACCELERATOR_RESOURCE_PREFIX, EFA_RESOURCE, read_ray_start_resources

CPU_METRICS = ("cpu", "memory")


def _resource_metric(metric: Mapping[str, Any]) -> str | None:
    """The resource a Resource or ContainerResource metric scales on."""
    if metric.get("type") == "Resource":
        return (metric.get("resource") or {}).get("name")
    if metric.get("type") == "ContainerResource":
        return (metric.get("containerResource") or {}).get("name")
    return None


def no_cpu_hpa(resources: list[Resource], config: Config) -> list[tuple[Resource, str]]:
    gpu_targets = set()
    for r in resources:
        kind = kind_of(r.type)
        if kind in ("apps/v1:Deployment", "apps/v1:StatefulSet") and gpu_templates(r):
            namespace = (r.props.get("metadata") or {}).get("namespace", "default")
            gpu_targets.add((namespace, kind.rsplit(":", 1)[-1], name_of(r.props, r.name)))
    found = []
    for r in resources:
        if kind_of(r.type) == "keda.sh/v1alpha1:ScaledObject":
            spec = r.props.get("spec") or {}
            target = spec.get("scaleTargetRef") or {}
            namespace = (r.props.get("metadata") or {}).get("namespace", "default")
            key = (namespace, target.get("kind") or "Deployment", target.get("name"))
            cpu = [t.get("type") for t in spec.get("triggers") or [] if t.get("type") in CPU_METRICS]
            if key in gpu_targets and cpu:
                found.append((r, f"ScaledObject {name_of(r.props, r.name)}: scales the GPU server {key[1]} "
                                 f"{key[2]} on {', '.join(cpu)}; trigger on vllm:num_requests_waiting and "
                                 "vllm:kv_cache_usage_perc (type prometheus) instead"))
            continue
        if not kind_of(r.type).endswith(":HorizontalPodAutoscaler"):
            continue
        spec = r.props.get("spec") or {}
        target = spec.get("scaleTargetRef") or {}
        namespace = (r.props.get("metadata") or {}).get("namespace", "default")
        if (namespace, target.get("kind"), target.get("name")) not in gpu_targets:
            continue
        metrics = spec.get("metrics")
        resource_metrics = [m for m in metrics or [] if _resource_metric(m) in CPU_METRICS]
        v2_default = "autoscaling/v2" in r.type and not metrics  # no metrics: 80% CPU
        v1 = "autoscaling/v1" in r.type  # v1 scales on CPU only
        if resource_metrics or v2_default or v1 or spec.get("targetCPUUtilizationPercentage") is not None:
            found.append((r, f"HorizontalPodAutoscaler {name_of(r.props, r.name)}: scales the GPU server "
                             f"{target.get('kind')} {target.get('name')} on CPU/memory; remove it, or scale on "
                             "vllm:num_requests_waiting (or serve it with Ray Serve autoscaling)"))
    return found


NO_CPU_HPA_ON_GPU = stack_rule(
    "no-cpu-hpa-on-gpu", "Ray",
    "A GPU server is busy when its batch is full, not when its CPU is: an HPA on CPU or memory scales it at the "
    "wrong time and fights Ray Serve's own autoscaler. Scale on requests (Ray Serve) or on vLLM's queue metrics.",
    no_cpu_hpa)


def parallelism(resource: Resource, config: Config) -> list[str]:
    messages = []
    for server in vllm_settings(resource):
        tp = int(server.settings.get("tensor_parallel_size") or 1)
        pp = int(server.settings.get("pipeline_parallel_size") or 1)
        needed = tp * pp
        if server.gpus is not None and needed != server.gpus:
            messages.append(f"{server.where}: tensor_parallel_size {tp} x pipeline_parallel_size {pp} = {needed} "
                            f"but the replica holds {server.gpus} GPU(s); make its GPUs equal {needed}")
        groups = server.ray_worker_gpus
        if groups and not any(g % needed == 0 or (needed % g == 0 and tp <= g) for g in groups):
            messages.append(f"{server.where}: a replica needs {needed} GPU(s) (tensor {tp} x pipeline {pp}); no worker "
                            f"group's pods ({', '.join(str(g) for g in groups)} GPU(s) each) hold a whole number of "
                            "replicas or a whole number of its pipeline stages; size a worker group to fit")
    return messages


VLLM_PARALLELISM_MATCHES_GPUS = rule(
    "vllm-parallelism-matches-gpus", "vLLM",
    "vLLM starts one worker per GPU of tensor x pipeline parallelism per model replica: fewer GPUs than that and "
    "it cannot start, more and they sit idle. A replica is a container, a LeaderWorkerSet group, or for Ray Serve "
    "a placement group that packs into a worker pod or spans several (pipeline stages).",
    parallelism)


def serve_graceful_shutdown(resource: Resource, config: Config) -> list[str]:
    if not kind_of(resource.type).endswith("RayService"):
        return []
    least = int(config["minSeconds"])
    messages = []
    for app, llm in llm_configs(resource.props):
        value = (llm.get("deployment_config") or {}).get("graceful_shutdown_timeout_s")
        if known(value) and float(value) < least:
            messages.append(f"RayService {name_of(resource.props, resource.name)} application {app}: "
                            f"graceful_shutdown_timeout_s {value} cuts long generations at every downscale; set it "
                            f">= {least} (and a grace period that covers it)")
    for application in serve_applications(resource.props):
        for deployment in application.get("deployments") or []:
            value = deployment.get("graceful_shutdown_timeout_s") if isinstance(deployment, Mapping) else None
            if known(value) and float(value) < least:
                messages.append(f"RayService {name_of(resource.props, resource.name)} application "
                                f"{application.get('name', '?')} deployment {deployment.get('name', '?')}: "
                                f"graceful_shutdown_timeout_s {value}; set it >= {least}")
    return messages


SERVE_GRACEFUL_SHUTDOWN = rule(
    "serve-graceful-shutdown", "Ray",
    "Ray Serve gives a replica graceful_shutdown_timeout_s to finish its requests when it scales down or is "
    "replaced; a few seconds cuts every long generation at each downscale. A value set below `minSeconds` is "
    "flagged (Serve's own default, 20 s, is not).",
    serve_graceful_shutdown, enforcement="advisory",
    config={"minSeconds": {"type": "integer", "minimum": 0, "default": 10}})


def efa_accelerators(props: Mapping[str, Any]) -> set[str]:
    """The Ray accelerator types every worker group offering them asks for EFA interfaces in: a Serve replica of
    such a type lands on a pod with EFA wherever Ray places it."""
    offered: dict[str, list[bool]] = {}
    groups = (((props.get("spec") or {}).get("rayClusterConfig") or {}).get("workerGroupSpecs")) or []
    for group in groups if isinstance(groups, list) else []:
        if not isinstance(group, Mapping):
            continue
        containers = ((group.get("template") or {}).get("spec") or {}).get("containers") or []
        efa = any(EFA_RESOURCE in ((c.get("resources") or {}).get("requests") or {}) for c in containers
                  if isinstance(c, Mapping))
        for name in read_ray_start_resources(group.get("rayStartParams")):
            if name.startswith(ACCELERATOR_RESOURCE_PREFIX):
                offered.setdefault(name[len(ACCELERATOR_RESOURCE_PREFIX):], []).append(efa)
    return {accelerator for accelerator, efa in offered.items() if all(efa)}


def kv_transfer_over_tcp(resource: Resource, config: Config) -> list[str]:
    """A P/D application whose roles hand the KV cache over NIXL between pods without EFA on both sides: whatever
    the backend, it crosses over TCP. A role's pods have EFA where every worker group of its accelerator type asks
    for EFA interfaces."""
    if not kind_of(resource.type).endswith("RayService"):
        return []
    found = facts()
    efa = efa_accelerators(resource.props)
    messages = []
    for application in serve_applications(resource.props):
        if not str(application.get("import_path", "")).endswith(PD_BUILDER.rsplit(":", 1)[1]):
            continue
        args = application.get("args") or {}
        roles = [args.get(f"{role}_config") for role in ("prefill", "decode")] if isinstance(args, Mapping) else []
        prefill, decode = [role if isinstance(role, Mapping) else {} for role in roles] or [{}, {}]
        transfer = (decode.get("engine_kwargs") or {}).get("kv_transfer_config")
        if not isinstance(transfer, Mapping):
            continue
        if all(str(role.get("accelerator_type")) in efa for role in (prefill, decode)):
            continue  # both roles' pods on EFA: the backend can cross over it
        connectors = (transfer.get("kv_connector_extra_config") or {}).get("connectors")
        if transfer.get("kv_connector") == MULTI_CONNECTOR and connectors and isinstance(connectors[0], Mapping):
            transfer = connectors[0]  # kvOffload beside the split: the role's own connector is the first
        backends = (transfer.get("kv_connector_extra_config") or {}).get("backends") or [found.default_backend]
        shown = ", ".join(str(b) for b in backends) if isinstance(backends, list) else str(backends)
        messages.append(f"RayService {name_of(resource.props, resource.name)} application "
                        f"{application.get('name', '?')}: prefill hands the KV cache to decode over "
                        f"{transfer.get('kv_connector', '?')} with backends {shown}, TCP between nodes; "
                        f"NVIDIA Dynamo's EFA guide measured {found.tcp_figure} "
                        f"({found.tcp_source}); put both roles on EFA pools (nodeGroups[].efa), or serve the model "
                        "whole (disaggregation.enabled: false)")
    return messages


KV_TRANSFER_OVER_TCP = rule(
    "kv-transfer-over-tcp", "Ray",
    "A prefill/decode split moves each prompt's KV cache from a prefill replica to a decode replica. Without RDMA "
    "between their pods (EFA on AWS, asked for by both roles' worker groups) it crosses over TCP, and the first "
    "token waits for "
    "it: a published measurement (NVIDIA Dynamo's EFA guide) puts the cost at seconds to minutes per long prompt.",
    kv_transfer_over_tcp, enforcement="advisory")
