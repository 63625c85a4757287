"""Reading workloads out of resource properties, whatever kind carries them (Deployment, RayService, ...)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from triarch.known import KNOWN_AFTER_APPLY as UNKNOWN
from triarch.scheduling import GPU_RESOURCE

POD_TEMPLATE_KINDS = ("apps/v1:Deployment", "apps/v1:StatefulSet", "apps/v1:DaemonSet", "batch/v1:Job")
RAY_KINDS = tuple(f"ray.io/{version}:{kind}" for version in ("v1", "v1alpha1")
                  for kind in ("RayService", "RayCluster", "RayJob"))
LWS_KIND = "leaderworkerset.x-k8s.io/v1:LeaderWorkerSet"
KSERVE_KINDS = ("serving.kserve.io/v1beta1:InferenceService", "serving.kserve.io/v1alpha1:LLMInferenceService")

ACCELERATORS = ("nvidia.com/gpu", "amd.com/gpu", "google.com/tpu")
ACCELERATOR_PREFIXES = ("aws.amazon.com/neuron",)
"""Extended resources that are accelerators: NVIDIA and AMD GPUs, TPUs, and AWS Neuron (neuron, neuroncore,
neurondevice) devices."""


@dataclass(frozen=True)
class PodTemplate:
    """One pod template and where it came from (`Deployment embed`, `RayService llm worker group l4-1gpu`)."""

    where: str
    spec: Mapping[str, Any]
    replicas: int
    ray: bool = False
    ray_head: bool = False


def kind_of(resource_type: str) -> str:
    """'kubernetes:apps/v1:Deployment' -> 'apps/v1:Deployment'; '' for anything not Kubernetes."""
    if not resource_type.startswith("kubernetes:"):
        return ""
    return resource_type.split(":", 1)[1]


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def name_of(props: Mapping[str, Any], fallback: str = "") -> str:
    metadata = props.get("metadata") or {}
    return str(metadata.get("name") or fallback)


def ray_cluster_spec(kind: str, props: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = props.get("spec") or {}
    if kind.endswith("RayService"):
        return spec.get("rayClusterConfig") or {}
    if kind.endswith("RayJob"):
        return spec.get("rayClusterSpec") or {}
    return spec


def _kserve_templates(kind: str, spec: Mapping[str, Any], label: str) -> Iterator[PodTemplate]:
    """KServe's pod specs: an InferenceService predictor (its containers, or the model/runtime container KServe
    builds from `model`), an LLMInferenceService's template, worker and prefill templates."""
    if kind.endswith("InferenceService") and not kind.endswith("LLMInferenceService"):
        predictor = spec.get("predictor") or {}
        pod = dict(predictor)
        model = predictor.get("model")
        if isinstance(model, Mapping) and not pod.get("containers"):
            pod["containers"] = [{"name": "kserve-container", **{k: v for k, v in model.items()
                                                                 if k in ("image", "args", "command", "env",
                                                                          "resources", "ports")}}]
        replicas = max(_int(predictor.get("minReplicas"), 1), _int(predictor.get("maxReplicas"), 1))
        yield PodTemplate(f"{label} predictor", pod, replicas)
        return
    replicas = _int(spec.get("replicas"), 1)
    for part, where in ((spec, ""), (spec.get("prefill") or {}, " prefill")):
        for key in ("template", "worker"):
            if isinstance(part.get(key), Mapping):
                yield PodTemplate(f"{label}{where} {key}", part[key], _int(part.get("replicas"), replicas))


def pod_templates(resource_type: str, props: Mapping[str, Any], name: str = "") -> Iterator[PodTemplate]:
    kind = kind_of(resource_type)
    label = f"{kind.rsplit(':', 1)[-1]} {name_of(props, name)}"
    spec = props.get("spec") or {}
    if kind in POD_TEMPLATE_KINDS:
        replicas = 1 if kind.endswith(("DaemonSet", "Job")) else _int(spec.get("replicas", 1), 1)
        yield PodTemplate(label, (spec.get("template") or {}).get("spec") or {}, replicas)
    elif kind == "core/v1:Pod":
        yield PodTemplate(label, spec, 1)
    elif kind == LWS_KIND:
        groups = _int(spec.get("replicas"), 1)
        template = spec.get("leaderWorkerTemplate") or {}
        size = _int(template.get("size"), 1)
        leader = template.get("leaderTemplate") or template.get("workerTemplate") or {}
        yield PodTemplate(f"{label} leader", leader.get("spec") or {}, groups)
        if size > 1:
            yield PodTemplate(f"{label} workers", (template.get("workerTemplate") or {}).get("spec") or {},
                              groups * (size - 1))
    elif kind in KSERVE_KINDS:
        yield from _kserve_templates(kind, spec, label)
    elif kind in RAY_KINDS:
        cluster = ray_cluster_spec(kind, props)
        head = cluster.get("headGroupSpec") or {}
        yield PodTemplate(f"{label} head", (head.get("template") or {}).get("spec") or {}, 1, ray=True, ray_head=True)
        for group in cluster.get("workerGroupSpecs") or []:
            replicas = max(_int(group.get("maxReplicas"), 1), _int(group.get("replicas"), 1))
            yield PodTemplate(f"{label} worker group {group.get('groupName', '?')}",
                              (group.get("template") or {}).get("spec") or {}, replicas, ray=True)


def required_node_terms(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pod's required node-affinity terms (any one must match)."""
    return list((((pod.get("affinity") or {}).get("nodeAffinity") or {})
                  .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])


def containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]


def is_accelerator(resource: str) -> bool:
    return resource in ACCELERATORS or resource.startswith(ACCELERATOR_PREFIXES)


def gpu_count(container: Mapping[str, Any], section: str = "limits") -> int | None:
    """Accelerators the container asks for in `section` (every kind of :data:`ACCELERATORS` summed); None when it
    names none."""
    amounts = (container.get("resources") or {}).get(section) or {}
    values = [_int(v, 0) for k, v in amounts.items() if is_accelerator(str(k))]
    return sum(values) if values else None


def nvidia_gpu_count(container: Mapping[str, Any], section: str = "limits") -> int | None:
    value = ((container.get("resources") or {}).get(section) or {}).get(GPU_RESOURCE)
    return None if value is None else _int(value, 0)


def requests_gpus(pod: Mapping[str, Any]) -> bool:
    return any((gpu_count(c, "limits") or 0) > 0 or (gpu_count(c, "requests") or 0) > 0
               for c in containers(pod))


VAR_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def command_line(container: Mapping[str, Any]) -> list[str]:
    """The container's command and args as one argv, `$(VAR)` expanded from its env as the kubelet does; a `sh -c`
    script is split into words."""
    env = {str(e.get("name")): str(e["value"]) for e in container.get("env") or []
           if isinstance(e, Mapping) and e.get("value") is not None}

    def expand(word: str) -> str:
        return VAR_REFERENCE.sub(lambda m: env.get(m.group(1), m.group(0)), word)

    words = [expand(str(w)) for w in [*(container.get("command") or []), *(container.get("args") or [])]]
    if len(words) >= 3 and words[0].endswith("sh") and words[1] == "-c":
        try:
            return [*words[:2], *shlex.split(words[2])]
        except ValueError:
            return words
    return words


def is_placeholder(container: Mapping[str, Any]) -> bool:
    """A container that only sleeps and listens on nothing (warm capacity's placeholder: it holds a node's GPUs until
    a serving pod preempts it, and pulls the image it runs): it serves nothing, whatever its image."""
    return command_line(container) == ["sleep", "infinity"] and not container.get("ports")


def is_vllm(container: Mapping[str, Any]) -> bool:
    if is_placeholder(container):
        return False
    argv = command_line(container)
    return "vllm" in str(container.get("image", "")) or any(w in ("vllm", "vllm.entrypoints.openai.api_server")
                                                            for w in argv)


SHORT_FLAGS = {"tensor_parallel_size": "-tp", "pipeline_parallel_size": "-pp"}
"""vLLM's short aliases."""


def flag(argv: list[str], name: str) -> str | None:
    """The value of a vLLM flag given as `--name V`, `--name=V`, with dashes or underscores, or by its short
    alias (the last one wins, as argparse does). `name` uses underscores: `tensor_parallel_size`."""
    spellings = {f"--{name.replace('_', '-')}", f"--{name}", *([SHORT_FLAGS[name]] if name in SHORT_FLAGS else [])}
    found = None
    for i, word in enumerate(argv):
        if word in spellings and i + 1 < len(argv):
            found = argv[i + 1]
        elif "=" in word and word.split("=", 1)[0] in spellings:
            found = word.split("=", 1)[1]
    return found


def hook_commands(container: Mapping[str, Any]) -> list[str]:
    """Every command the container's lifecycle hooks run, as text."""
    texts = []
    lifecycle = container.get("lifecycle") or {}
    for hook in (lifecycle.get("preStop"), lifecycle.get("postStart")):
        command = ((hook or {}).get("exec") or {}).get("command") or []
        if command:
            text = " ".join(str(c) for c in command)
            texts.append("\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    return texts


SLEEP = re.compile(r"\bsleep\s+(\d+)")


def prestop_seconds(container: Mapping[str, Any]) -> int | None:
    """How long the preStop hook takes at most: the sum of its `sleep N`s (None without a preStop)."""
    pre_stop = (container.get("lifecycle") or {}).get("preStop")
    if not pre_stop:
        return None
    if "sleep" in pre_stop:  # the native sleep action
        return _int((pre_stop["sleep"] or {}).get("seconds"), 0)
    command = " ".join(str(c) for c in ((pre_stop.get("exec") or {}).get("command") or []))
    return sum(int(n) for n in SLEEP.findall(command))


def serve_applications(props: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    text = (props.get("spec") or {}).get("serveConfigV2")
    if not isinstance(text, str) or text == UNKNOWN:
        return []
    try:
        config = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        return []
    return list(config.get("applications") or []) if isinstance(config, dict) else []


PD_ROLES = ("prefill_config", "decode_config")
"""A P/D application's LLMConfigs (Ray 2.60 build_pd_openai_app's PDServingArgs), each an engine of its own."""


def application_llm_configs(app: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """(where in the application's args, LLMConfig) for every engine one Serve application runs: `llm_configs[i]`
    of an OpenAI application, `prefill_config` and `decode_config` of a P/D one. The configs are the application's
    own objects (a caller may edit them in place)."""
    args = app.get("args") or {}
    if not isinstance(args, Mapping):
        return
    for index, config in enumerate(args.get("llm_configs") or []):
        if isinstance(config, Mapping):
            yield f"llm_configs[{index}]", config
    for role in PD_ROLES:
        config = args.get(role)
        if isinstance(config, Mapping):
            yield role, config


def llm_configs(props: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(application name, LLMConfig) for every vLLM engine a RayService's Serve config runs: each model of an
    OpenAI application, and both roles of a P/D application (named `<application> prefill|decode`)."""
    for app in serve_applications(props):
        name = str(app.get("name", "?"))
        for where, config in application_llm_configs(app):
            yield (f"{name} {where.split('_')[0]}" if where in PD_ROLES else name), config


RAY_SIGTERM_DRAIN_ENV = "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"
RAY_SIGTERM_DRAIN_DEFAULT = 30
"""On SIGTERM a Ray node drains for up to this long before it stops its processes (Ray 2.60 ray_constants)."""
SERVE_GRACEFUL_SHUTDOWN_DEFAULT = 20
"""Ray Serve's default graceful_shutdown_timeout_s (ray/serve/_private/constants.py, Ray 2.60)."""


def env_value(container: Mapping[str, Any], name: str) -> str | None:
    return next((str(e.get("value")) for e in container.get("env") or [] if e.get("name") == name
                 and e.get("value") is not None), None)


def ray_sigterm_drain_seconds(container: Mapping[str, Any]) -> int:
    """How long a Ray container drains after SIGTERM (0 or less disables it)."""
    value = env_value(container, RAY_SIGTERM_DRAIN_ENV)
    try:
        seconds = float(value) if value is not None else RAY_SIGTERM_DRAIN_DEFAULT
    except ValueError:
        seconds = RAY_SIGTERM_DRAIN_DEFAULT
    return max(0, int(seconds + 0.999))


def serve_graceful_shutdown_seconds(props: Mapping[str, Any]) -> int:
    """The longest graceful_shutdown_timeout_s of a RayService's Serve deployments (LLMConfig deployment_config
    or a plain application's deployments), Serve's default where none is set."""
    found = []
    for app in serve_applications(props):
        for deployment in app.get("deployments") or []:
            if isinstance(deployment, Mapping) and "graceful_shutdown_timeout_s" in deployment:
                found.append(deployment["graceful_shutdown_timeout_s"])
    for _, config in llm_configs(props):
        deployment = config.get("deployment_config") or {}
        if isinstance(deployment, Mapping) and "graceful_shutdown_timeout_s" in deployment:
            found.append(deployment["graceful_shutdown_timeout_s"])
    seconds = [_int(v, SERVE_GRACEFUL_SHUTDOWN_DEFAULT) for v in found]
    return max(seconds, default=SERVE_GRACEFUL_SHUTDOWN_DEFAULT)
