"""Prefix-aware routing for a plain vLLM model: the Gateway API Inference Extension's InferencePool over the model's
pods, with llm-d-router's endpoint picker (EPP) and Envoy proxies in front of them (the standalone chart, no
Gateway). One release per model: an InferencePool selects one model's pods, and the picker's prefix index is per
pool. The model's Service then selects the proxies (their port) instead of the vLLM pods; a proxy asks the picker
which pod should answer and sends the request there, to vLLM's port.

No single pod carries the model's traffic: two pickers, one leading (the chart's leader election), and two proxies in
a Deployment of their own (the chart's service mode) behind a PodDisruptionBudget."""

from __future__ import annotations

from typing import Any

import yaml

from triarch.catalog import charts
from triarch.config import StackConfig
from triarch.images import parse
from triarch.planners.model_plan import ModelPlan
from triarch.scheduling import POOL_LABEL, SYSTEM_POOL

PICKER_CHART = "llm-d-router-standalone"
PROXY_PORT = 8081
"""The Envoy sidecar's listener (the chart's envoy preset, listener `vllm`, and its extraServicePorts `http`)."""
EXT_PROC_PORT = 9002
"""The picker's ext_proc gRPC port (router.epp.extProcPort), which the proxies call through the picker's Service."""
METRICS_PORT = 9090
"""The picker's metrics (its container port `metrics`, the Service's `http-metrics`)."""
VLLM_PORT = 8000
"""The InferencePool's target port: vLLM's own (planners/vllm.py PORT)."""
PICKER_REPLICAS = 2
"""Pickers per model: above one the chart runs them active/passive (--ha-enable-leader-election, a Lease): only the
leader answers (the other's gRPC health is not serving, so the EPP Service sends to the leader alone), and the other
takes the Lease when the leader's pod goes, after the Lease runs out. No PodDisruptionBudget for them: with one of
two ready, any budget that keeps the leader blocks every drain of its node, and a drain is what the other is for."""
PROXY_REPLICAS = 2
"""Envoy proxies per model (the chart's service mode: a Deployment and Service of their own, reaching the picker
through its Service): both serve, and a PodDisruptionBudget keeps one while nodes drain."""
MODE_LABEL = {"llm-d.ai/igw-mode": "llm-d-router-gateway"}
"""Every picker pod's label when the chart renders an InferencePool (routerlib _helpers.tpl, modeLabels)."""
POSTRENDER_DIR = "./.venv/bin"
"""Where the post-renderer is, as the Release names it: the project's virtualenv (Pulumi.yaml: `virtualenv: .venv`,
no `main`), relative to the project's root, the same string on every machine (an absolute path would differ between
a laptop and CI, and every `pulumi up` from the other would update the Release). Helm (v3.18.6 in the
pulumi-kubernetes provider 4.25.0, pkg/postrender/exec.go getFullPath) looks a name without a separator up on PATH,
and resolves a path with one against its working directory; the provider runs in the Pulumi CLI's plugin working
directory, the project's root (pkg/engine/project.go getPwdMain, sdk/go/common/resource/plugin/plugin.go
`cmd.Dir = pwd`), where the uv toolchain makes .venv. So the post-renderer is found with .venv/bin off the PATH,
as under pulumi/actions in CI."""
POSTRENDER_COMMAND = "triarch-restrict-pods"
"""The Helm post-renderer (a console script of this package) that gives the chart's pods the restricted Pod Security
context: the chart (v0.10.0) takes none for the picker's container or its pod from values, and the serving
namespace enforces `restricted`."""
POSTRENDER_PULLING_COMMAND = "triarch-restrict-pods-pulling"
"""The same, that also names the registry's pull Secret in every pod (the chart has no value for it): for a stack
whose registry takes credentials (triarch:registryPassword)."""


def postrender(with_pull_secret: bool) -> str:
    """The Release's post-renderer: which one says whether the chart's pods pull with the registry's Secret, so the
    Release's inputs carry it (a stack gaining credentials updates the release, and its pods roll)."""
    command = POSTRENDER_PULLING_COMMAND if with_pull_secret else POSTRENDER_COMMAND
    return f"{POSTRENDER_DIR}/{command}"


PICKER_RESOURCES = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
PROXY_RESOURCES = {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}}
"""Triarch's requests for the picker and its proxy, not a measurement: the chart's (EPP 8 CPU and 8 GiB, proxy 4 CPU
and 8 GiB, sized for a large pool's traffic) fit no system node Triarch runs (m7i.large: 2 vCPU, 8 GiB) nor a local
plane's; these fit one beside the add-ons (the placement proof checks it). Raise them for heavy traffic."""


def routed(plan: ModelPlan) -> bool:
    """Whether a vllm model runs behind the endpoint picker: only where its stack turns it on (it adds a pod and
    moves the Service's backends), on one node per replica (an InferencePool selects pods, a LeaderWorkerSet's
    workers are pods too)."""
    routing = plan.config.prefix_routing
    return plan.config.engine == "vllm" and routing is not None and routing.enabled and not plan.multi_node


def release_name(model: str) -> str:
    """The release (and InferencePool) of a model's picker: from its name, so no edit but a rename moves it."""
    return f"{model}-pool"


def picker_name(model: str) -> str:
    """The chart's name for the picker's Deployment, Service and ServiceAccount: `<release>-epp` (routerlib
    _helpers.tpl llm-d-router.name, the release name cut to 40 characters)."""
    return f"{release_name(model)[:40]}-epp"


def picker_pod_selector(model: str) -> dict[str, str]:
    """The picker pod's own label (routerlib selectorLabels, InferencePool mode): what the model's Service selects."""
    return {"llm-d-router-gateway": picker_name(model)}


def proxy_pod_selector(model: str) -> dict[str, str]:
    """The proxies' own label in service mode (routerlib _helpers.tpl, proxySelectorLabels: `<release>-proxy`, the
    release cut to 40 characters): what the model's Service and the proxies' budget select."""
    return {"llm-d-router-proxy": f"{release_name(model)[:40]}-proxy"}


PROXY_POD = {"matchExpressions": [{"key": "llm-d-router-proxy", "operator": "Exists"}]}
"""Every model's proxies (the chart labels them with their release's proxy name)."""


def proxy_budget(model: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    """One proxy of the two kept while nodes drain: the model's traffic goes through them."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": f"{release_name(model)}-proxy", "namespace": namespace, "labels": labels},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": proxy_pod_selector(model)}}}


def model_pod_selector(model: str) -> dict[str, str]:
    """What the InferencePool selects: the model's vLLM pods (planners/vllm.py selector)."""
    return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": model}


def proxy_config_map(model: str) -> str:
    """The Envoy sidecar's ConfigMap, one per release (the chart's preset names every one `envoy`)."""
    return f"{release_name(model)}-envoy"


LORA_PLUGINS_FILE = "lora-plugins.yaml"
"""The picker's config for a model with adapters (router.epp.pluginsCustomConfig, a file of the chart's ConfigMap
that router.epp.pluginsConfigFile names)."""
DEFAULT_SCORERS = (("queue-scorer", 2), ("kv-cache-utilization-scorer", 2), ("prefix-cache-scorer", 3))
"""The chart's default profile (llm-d-router-standalone v0.10.0, charts/router/templates/_config.yaml,
default-plugins.yaml without the latency predictor): its scorers and weights, kept as they are."""
LORA_SCORER = ("lora-affinity-scorer", 1)
"""llm-d-router's LoRA-aware scorer (pkg/epp/framework/plugins/.../loraaffinity, type `lora-affinity-scorer`,
registered by v0.10.0's runner, cmd/epp/runner/runner.go): 1.0 for a pod with the request's adapter active, 0.8 where
one more adapter fits, read from vllm:lora_requests_info's running_lora_adapters, waiting_lora_adapters and max_lora
labels by the core-metrics-extractor (extractor/metrics, v0.10.0), the labels vLLM's CPU engine was seen to emit
(tests/test_dataplane_vllm.py). The chart's default profile leaves it out. Weight 1 (Triarch's choice): with every
adapter loaded at start and a slot for each, every pod can take any adapter, so it only breaks ties toward a pod
already running the adapter."""


def lora_plugins() -> dict[str, Any]:
    """The chart's default picker config (vLLM over HTTP, no latency predictor, no parsers) with the LoRA-aware
    scorer added to its profile."""
    scorers = (*DEFAULT_SCORERS, LORA_SCORER)
    return {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig",
            "plugins": [*({"type": name} for name, _ in scorers),
                        {"type": "metrics-data-source",
                         "parameters": {"scheme": "http", "path": "/metrics", "insecureSkipVerify": True}},
                        {"type": "core-metrics-extractor"}],
            "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": name, "weight": weight}
                                                                   for name, weight in scorers]}]}


def picker_values(stack: StackConfig, plan: ModelPlan) -> dict[str, Any]:
    """The chart's values for one model. Every key exists in the chart's values (v0.10.0, standalone values.yaml
    and routerlib's under `router`): the pool over the model's pods on vLLM's port, the picker's image at the pinned
    tag, pulled once; two pickers (leader election) and two proxies in their own Deployment (PICKER_REPLICAS,
    PROXY_REPLICAS); on the system nodes of a created cluster, the pickers on different nodes where they can be,
    with Triarch's requests (PICKER_RESOURCES, PROXY_RESOURCES) in place of the chart's.

    failOpen false: the chart's "fail open" passes a request on without the picker's destination header, and the
    proxy's original-destination cluster, which takes its endpoint from that header, then has none to send it to (a
    503 either way, Envoy's original_dst load balancer): false says so at once, under the picker's error."""
    endpoint_picker = next(i for i in charts()[PICKER_CHART].images if i.key == "endpointPicker")
    apart = {"topologyKey": "kubernetes.io/hostname",
             "labelSelector": {"matchLabels": picker_pod_selector(plan.name)}}
    spread = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": apart}]}}
    router: dict[str, Any] = {
        "modelServers": {"matchLabels": model_pod_selector(plan.name), "targetPorts": [{"number": VLLM_PORT}]},
        "epp": {"image": {"tag": parse(endpoint_picker.image).tag, "pullPolicy": "IfNotPresent"},
                "replicas": PICKER_REPLICAS, "resources": PICKER_RESOURCES, "affinity": spread},
        "proxy": {"enabled": True, "mode": "service", "replicas": PROXY_REPLICAS, "failOpen": False,
                  "resources": PROXY_RESOURCES,
                  # The envoy preset names its ConfigMap `envoy` in every release, so a second routed model's
                  # release in the namespace fails on it; the preset is merged under these (mergeOverwrite), its
                  # envoy.yaml kept, and the proxies' volume follows the name.
                  "configMap": {"name": proxy_config_map(plan.name)},
                  "volumes": [{"name": "config", "configMap": {"name": proxy_config_map(plan.name), "items": [
                      {"key": "envoy.yaml", "path": "envoy.yaml"}]}}]},
        # Metrics without a bearer token (the EPP's --metrics-endpoint-auth=false): Triarch's PodMonitor scrapes
        # them as it does vLLM's, inside a namespace whose policies admit only Prometheus' namespace there.
        "monitoring": {"prometheus": {"auth": {"enabled": False}}},
    }
    if plan.config.adapters:  # the chart's default profile leaves the LoRA-aware scorer out
        router["epp"].update(pluginsConfigFile=LORA_PLUGINS_FILE,
                             pluginsCustomConfig={LORA_PLUGINS_FILE: yaml.safe_dump(lora_plugins(), sort_keys=False)})
    if stack.cluster.create:
        router["epp"]["affinity"]["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": POOL_LABEL, "operator": "In", "values": [SYSTEM_POOL]}]}]}}
    return {"router": router}
