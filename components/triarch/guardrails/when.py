"""When: what a vLLM server needs to take requests and keep them. A preStop drain and a grace period that covers
it, readiness (and startup) probes, headroom in gpu_memory_utilization, weights cached on a volume that survives
a restart (and a rollout that can attach it), and CPU and memory requests beside the GPUs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from triarch.guardrails.base import Config, Resource, rule, stack_rule
from triarch.guardrails.common import gpu_templates, known, vllm_settings
from triarch.guardrails.workloads import (
    LWS_KIND,
    PodTemplate,
    command_line,
    containers,
    flag,
    gpu_count,
    hook_commands,
    is_placeholder,
    is_vllm,
    kind_of,
    name_of,
    pod_templates,
    prestop_seconds,
    ray_sigterm_drain_seconds,
    serve_graceful_shutdown_seconds,
)
from triarch.tuner import TuneError, load_arch, weight_bytes


def _inference_containers(template: PodTemplate) -> list[Mapping[str, Any]]:
    return [c for c in template.spec.get("containers") or []
            if ((gpu_count(c) or 0) > 0 or is_vllm(c)) and not is_placeholder(c)]


UNMANAGED_KINDS = ("core/v1:Pod", "batch/v1:Job", "serving.kserve.io/v1beta1:InferenceService",
                   "serving.kserve.io/v1alpha1:LLMInferenceService")
"""Pods no Service's endpoints follow through a rollout Triarch's drain rules speak of: bare Pods and Jobs (deleted
by hand), and KServe's, whose controller and queue proxy own the drain and the probes."""


def _behind_endpoints(resource: Resource, template: PodTemplate) -> bool:
    """Whether the template's pods serve through endpoints a rollout or scale-down removes them from."""
    kind = kind_of(resource.type)
    if kind in UNMANAGED_KINDS:
        return False
    return not (kind == LWS_KIND and template.where.endswith(" workers"))  # the leader serves the group


def prestop_drain(resource: Resource, config: Config) -> list[str]:
    messages = []
    minimum = int(config["minDrainSeconds"])
    for template in pod_templates(resource.type, resource.props, resource.name):
        if template.ray_head or not _behind_endpoints(resource, template):
            continue
        grace = int(template.spec.get("terminationGracePeriodSeconds", 30))
        for c in _inference_containers(template):
            pre = prestop_seconds(c)
            if pre is None and template.ray:
                pre = 0  # a Ray worker takes no traffic from endpoints: Ray's own drain on SIGTERM is what counts
            elif pre is None:
                messages.append(f"{template.where} container {c.get('name')}: no preStop hook; add one that waits "
                                "for endpoints to drain (and never `ray stop`)")
                continue
            if any("ray stop" in text for text in hook_commands(c)):
                messages.append(f"{template.where} container {c.get('name')}: preStop runs `ray stop`, which drops "
                                "in-flight requests; drain the Ray node instead")
            if template.ray:
                sigterm = ray_sigterm_drain_seconds(c)
                serve = serve_graceful_shutdown_seconds(resource.props)
                parts = f"preStop {pre}s + Ray's SIGTERM drain {sigterm}s + Serve's graceful shutdown {serve}s"
                need = pre + max(sigterm + serve, minimum)
            else:
                drain = int(flag(command_line(c), "shutdown_timeout") or 0) if is_vllm(c) else 0
                parts = f"preStop {pre}s + drain {max(drain, minimum)}s"
                need = pre + max(drain, minimum)
            if grace < need:
                messages.append(f"{template.where} container {c.get('name')}: terminationGracePeriodSeconds {grace} < "
                                f"{parts}; set it to >= {need}")
    return messages


PRESTOP_DRAIN = rule(
    "prestop-drain", "vLLM",
    "Requests in flight when a pod stops are dropped unless a preStop hook lets endpoints drain and the grace "
    "period covers the hook plus the server's own drain: vLLM's --shutdown-timeout, or for a Ray worker Ray's "
    "drain on SIGTERM (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S) plus Serve's graceful_shutdown_timeout_s.",
    prestop_drain, config={"minDrainSeconds": {"type": "integer", "minimum": 0, "default": 10}})


def inference_probes(resource: Resource, config: Config) -> list[str]:
    messages = []
    for template in pod_templates(resource.type, resource.props, resource.name):
        if template.ray or not _behind_endpoints(resource, template):
            continue  # KubeRay injects the probes of Ray pods; bare Pods, Jobs and KServe's are not rolled here
        for c in _inference_containers(template):
            # without a liveness probe nothing kills a long download, so a startup probe is needed only beside one
            wanted = ("readinessProbe", "startupProbe") if c.get("livenessProbe") else ("readinessProbe",)
            missing = [p for p in wanted if not c.get(p)]
            if missing:
                messages.append(f"{template.where} container {c.get('name')}: missing {', '.join(missing)}; probe "
                                "/health, with a startup probe long enough for the model download")
    return messages


INFERENCE_PROBES = rule(
    "inference-probes", "vLLM",
    "Without a readiness probe a loading server gets traffic; with a liveness probe but no startup probe, the "
    "liveness probe kills it mid-download.",
    inference_probes)


def memory_utilization(resource: Resource, config: Config) -> list[str]:
    messages = []
    for server in vllm_settings(resource):
        value = server.settings.get("gpu_memory_utilization")
        if known(value) and float(value) > float(config["max"]):
            messages.append(f"{server.where}: gpu_memory_utilization {value} > {config['max']}; lower it (Triarch's "
                            "tuner sizes the KV cache at 0.92)")
    return messages


VLLM_MEMORY_UTILIZATION = rule(
    "vllm-memory-utilization", "vLLM",
    "gpu_memory_utilization near 1.0 leaves no room for CUDA graphs, NCCL buffers and fragmentation: vLLM "
    "fails at start or under load.",
    memory_utilization, config={"max": {"type": "number", "minimum": 0.1, "maximum": 1.0, "default": 0.95}})


CACHE_PATHS = ("/root/.cache/huggingface", "/models")


def model_cache(resource: Resource, config: Config) -> list[str]:
    messages = []
    for template in gpu_templates(resource):
        volumes = {v.get("name"): v for v in template.spec.get("volumes") or []}
        for c in containers(template.spec):
            env = {e.get("name"): e.get("value") for e in c.get("env") or []}
            cache_paths = [p for p in (env.get("HF_HOME"), *CACHE_PATHS) if p]
            if _model_gib(_served_model(c)) < float(config["minModelGiB"]):
                continue
            for mount in c.get("volumeMounts") or []:
                path = str(mount.get("mountPath", ""))
                covers_cache = any(path == p or p.startswith(path.rstrip("/") + "/") for p in cache_paths)
                if covers_cache and "emptyDir" in (volumes.get(mount.get("name")) or {}):
                    messages.append(f"{template.where} container {c.get('name')}: model cache {path} is an "
                                    "emptyDir; mount a PersistentVolumeClaim there")
    return messages


MODEL_CACHE_NOT_EMPTYDIR = rule(
    "model-cache-not-emptydir", "Kubernetes",
    "Weights on emptyDir are downloaded again on every restart and reschedule (minutes to hours for large "
    "models, and a hub rate limit); cache them on a PersistentVolumeClaim.",
    model_cache, config={"minModelGiB": {"type": "number", "minimum": 0, "default": 2}})


def _served_model(container: Mapping[str, Any]) -> str | None:
    """The model a vLLM container serves: `vllm serve <model>` or `--model <model>`."""
    if not is_vllm(container):
        return None
    argv = command_line(container)
    if argv[:2] == ["vllm", "serve"]:
        argv = argv[2:]
    # `vllm serve MODEL`, or the image's own entrypoint with the model as the first argument.
    positional = next((w for w in argv[:1] if "/" in w and not w.startswith(("-", "/"))), None)
    return flag(argv, "model") or positional


def _model_gib(model: str | None) -> float:
    """Weights of a catalog model in GiB; unknown models count as large."""
    if not model:
        return float("inf")
    try:
        return weight_bytes(load_arch(model)) / (1 << 30)
    except TuneError:
        return float("inf")


def _covers(mount_path: str, paths: list[str]) -> bool:
    return any(mount_path == p or p.startswith(mount_path.rstrip("/") + "/") for p in paths)


def model_cache_persistent(resource: Resource, config: Config) -> list[str]:
    messages = []
    for template in gpu_templates(resource):
        for c in containers(template.spec):
            if not is_vllm(c) or _model_gib(_served_model(c)) < float(config["minModelGiB"]):
                continue
            env = {e.get("name"): e.get("value") for e in c.get("env") or []}
            paths = [str(p) for p in (env.get("HF_HOME"), *CACHE_PATHS) if p]
            if not any(_covers(str(m.get("mountPath", "")), paths) for m in c.get("volumeMounts") or []):
                messages.append(f"{template.where} container {c.get('name')}: no volume at the model cache "
                                f"({', '.join(paths)}); mount a PersistentVolumeClaim there (or at HF_HOME)")
    return messages


MODEL_CACHE_PERSISTENT = rule(
    "model-cache-persistent", "Kubernetes",
    "A vLLM server with no volume at its model cache (HF_HOME, ~/.cache/huggingface, /models) downloads the "
    "weights into the container's own filesystem on every start: minutes to hours per restart for a large "
    "model, and the node's disk fills. Advisory: weights may come another way (a model streamer, a baked image).",
    model_cache_persistent, enforcement="advisory",
    config={"minModelGiB": {"type": "number", "minimum": 0, "default": 2}})


def _claims(resources: list[Resource]) -> dict[tuple[str, str], Mapping[str, Any]]:
    return {((r.props.get("metadata") or {}).get("namespace", "default"), name_of(r.props, r.name)): r.props
            for r in resources if kind_of(r.type) == "core/v1:PersistentVolumeClaim"}


def rwo_cache_surge(resources: list[Resource], config: Config) -> list[tuple[Resource, str]]:
    claims = _claims(resources)
    found = []
    for r in resources:
        if kind_of(r.type) != "apps/v1:Deployment":
            continue
        spec = r.props.get("spec") or {}
        strategy = spec.get("strategy") or {}
        if strategy.get("type") == "Recreate" or str((strategy.get("rollingUpdate") or {}).get("maxSurge", "25%")) in (
                "0", "0%"):
            continue
        namespace = (r.props.get("metadata") or {}).get("namespace", "default")
        for volume in ((spec.get("template") or {}).get("spec") or {}).get("volumes") or []:
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            modes = ((claims.get((namespace, str(claim))) or {}).get("spec") or {}).get("accessModes") or []
            if claim and modes == ["ReadWriteOnce"]:
                found.append((r, f"Deployment {name_of(r.props, r.name)}: mounts the ReadWriteOnce claim {claim} and "
                                 "rolls out with a surge; set strategy Recreate (or rollingUpdate.maxSurge 0), or "
                                 "use a ReadWriteMany claim"))
    return found


RWO_CACHE_SURGE = stack_rule(
    "rwo-cache-surge", "Kubernetes",
    "A Deployment that mounts a ReadWriteOnce claim and rolls out with a surge starts the new pod beside the old "
    "one: on another node it cannot attach the volume and the rollout hangs (on the same node it may work). "
    "Recreate, maxSurge 0, or a ReadWriteMany claim.",
    rwo_cache_surge, enforcement="advisory")


def gpu_server_resources(resource: Resource, config: Config) -> list[str]:
    messages = []
    for template in gpu_templates(resource):
        for c in template.spec.get("containers") or []:
            if not (gpu_count(c) or 0):
                continue
            resources_ = c.get("resources") or {}
            # a limit is also the request where none is given
            given = {**(resources_.get("limits") or {}), **(resources_.get("requests") or {})}
            missing = [k for k in ("cpu", "memory") if k not in given]
            if missing:
                messages.append(f"{template.where} container {c.get('name')}: no {' or '.join(missing)} request; set "
                                "requests (equal to limits for Guaranteed QoS)")
    return messages


GPU_SERVER_RESOURCES = rule(
    "gpu-server-resources", "Kubernetes",
    "A GPU server without CPU and memory requests is scheduled as if it needed none and is the first evicted "
    "when the node runs short (BestEffort or Burstable QoS): tokenization, the API server and the weights' page "
    "cache need both. Advisory.",
    gpu_server_resources, enforcement="advisory")
