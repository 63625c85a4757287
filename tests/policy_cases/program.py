"""A Pulumi program for tests/test_real_policy.py: one case per rule of the pack, previewed by the real CLI.

Stack config `cases:set` picks what is registered:
- `compliant`: Triarch's prod objects (baseline.yaml, generated from `triarch plan --stack prod` by generate.py),
  which every rule passes. With prod's EKS Cluster and its add-ons among them, the placement proof runs its
  created-stack mode (every pod must land on a pool of the stack; the add-ons' DaemonSets take a share of every
  node);
- `violating`: the same world with one hand-written case per rule, each a copy of a compliant object with one edit
  (or a new object), under a component named after the rule, so its objects are a component's children as
  Triarch's are. Some cases reach the pack the ways only the engine makes: an image from another resource's output
  (unknown at preview), a token held as a Pulumi secret, AWS resources built with the typed SDK.

Kubernetes objects go through the real Kubernetes provider (server-side dry run on the plane); AWS resources
through tests/aws_standin.py. The Helm charts come from the reference cache (`cases:charts`); a value the plan marks
known only after apply is registered as a value unknown at preview, as the engine sees it in a stack not yet
created."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pulumi
import pulumi_aws as aws
import yaml
from pulumi.output import UNKNOWN

from triarch.known import KNOWN_AFTER_APPLY

HERE = Path(__file__).resolve().parent
config = pulumi.Config("cases")
CHARTS = Path(config.require("charts"))
BASELINE: list[dict[str, Any]] = yaml.safe_load((HERE / "baseline.yaml").read_text())


def baseline(name: str) -> dict[str, Any]:
    """A deep copy of a baseline object's properties."""
    return copy.deepcopy(next(r["props"] for r in BASELINE if r["name"] == name))


def after_apply(value: Any) -> Any:
    """The plan's marker for a value the cloud assigns (an id, an ARN, a subnet) as a value unknown at preview."""
    if isinstance(value, dict):
        return {k: after_apply(v) for k, v in value.items()}
    if isinstance(value, list):
        return [after_apply(v) for v in value]
    return pulumi.Output.from_input(UNKNOWN) if isinstance(value, str) and value == KNOWN_AFTER_APPLY else value


def register(type_: str, name: str, props: dict[str, Any], parent: pulumi.Resource | None = None,
             depends_on: list[pulumi.Resource] | None = None) -> pulumi.CustomResource:
    return pulumi.CustomResource(type_, name, after_apply(props),
                                 pulumi.ResourceOptions(parent=parent, depends_on=depends_on))


def register_baseline() -> dict[str, pulumi.Resource]:
    made: dict[str, pulumi.Resource] = {}
    for item in BASELINE:
        props = copy.deepcopy(item["props"])
        if item["type"] == "kubernetes:helm.sh/v3:Release":
            props["chart"] = str(CHARTS / f"{props['name']}-{props['version']}.tgz")
        made[item["name"]] = register(item["type"], item["name"], props)
    return made


class Case(pulumi.ComponentResource):
    """The objects of one rule's violating case (a second case of a rule is named `<rule>-<what>`)."""

    def __init__(self, name: str) -> None:
        super().__init__("cases:policy:Violation", name)


DEPLOYMENT = "kubernetes:apps/v1:Deployment"
EMBED = "deployment-llm-embed"


def served(name: str, edit: Any = None) -> dict[str, Any]:
    """The prod embed Deployment renamed (its labels, selector and spread with it), then edited."""
    props = baseline(EMBED)
    props["metadata"]["name"] = name
    for labels in (props["metadata"]["labels"], props["spec"]["selector"]["matchLabels"],
                   props["spec"]["template"]["metadata"]["labels"],
                   *(c["labelSelector"]["matchLabels"] for c in props["spec"]["template"]["spec"]
                     ["topologySpreadConstraints"])):
        labels["app.kubernetes.io/instance"] = name
    if edit is not None:
        edit(props["spec"]["template"]["spec"], props)
    return props


def container(pod: dict[str, Any]) -> dict[str, Any]:
    first: dict[str, Any] = pod["containers"][0]
    return first


def set_flag(pod: dict[str, Any], flag: str, value: str) -> None:
    args = container(pod)["args"]
    args[args.index(flag) + 1] = value


RAY_IMAGE = next(i["props"]["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
                 for i in BASELINE if i["type"] == "kubernetes:ray.io/v1:RayService")
ADDON_SHARE_CPU = "7700m"
"""Between what a g6.2xlarge node has free for a pod with the EKS add-ons' DaemonSets (7645m, the node monitoring
agent's 10m among them) and without (7805m)."""

CASE_TAINT = {"key": "triarch.dev/case", "value": "pool-capacity", "effect": "NoSchedule"}
"""Keeps the one-GPU pool to its own case's Deployment (another case's pods, selecting no pool, would count there)."""


def pool(name: str, *, ami: str | None = None, gpus: str | None = None, taint: bool = True) -> tuple[dict, dict]:
    """A copy of the prod l4 NodePool and its EC2NodeClass as pool `name`."""
    node_pool, node_class = baseline("nodepool-l4"), baseline("ec2nodeclass-l4")
    node_pool["metadata"]["name"] = node_class["metadata"]["name"] = name
    template = node_pool["spec"]["template"]
    template["metadata"]["labels"]["triarch.dev/pool"] = name
    template["spec"]["nodeClassRef"]["name"] = name
    node_class["spec"]["tags"] = {"Name": f"llm-prod-{name}", "triarch.dev/pool": name}
    if ami is not None:
        node_class["spec"]["amiSelectorTerms"] = [{"alias": ami}]
    if gpus is not None:
        node_pool["spec"]["limits"]["nvidia.com/gpu"] = gpus
        template["spec"]["taints"].append(CASE_TAINT)
    if not taint:
        template["spec"]["taints"] = [t for t in template["spec"]["taints"] if t["key"] != "nvidia.com/gpu"]
    return node_pool, node_class


def register_pool(case: Case, name: str, **kwargs: Any) -> None:
    node_pool, node_class = pool(name, **kwargs)
    register("kubernetes:karpenter.k8s.aws/v1:EC2NodeClass", f"ec2nodeclass-{name}", node_class, case)
    register("kubernetes:karpenter.sh/v1:NodePool", f"nodepool-{name}", node_pool, case)


def deployment(rule: str, name: str, edit: Any = None) -> Case:
    case = Case(rule)
    register(DEPLOYMENT, name, served(name, edit), case)
    return case


def violations() -> None:
    def soft_zone(pod: dict[str, Any], _: Any) -> None:  # minDomains only goes with DoNotSchedule
        pod["topologySpreadConstraints"][0]["whenUnsatisfiable"] = "ScheduleAnyway"
        del pod["topologySpreadConstraints"][0]["minDomains"]
    deployment("gpu-zone-spread", "spread-soft", soft_zone)

    def no_gpu(pod: dict[str, Any], _: Any) -> None:
        for side in ("limits", "requests"):
            container(pod)["resources"][side]["nvidia.com/gpu"] = "0"
    deployment("gpu-limits", "zero-gpus", no_gpu)

    def no_toleration(pod: dict[str, Any], _: Any) -> None:
        del pod["tolerations"]
    deployment("gpu-scheduling", "no-toleration", no_toleration)

    def no_selector(pod: dict[str, Any], _: Any) -> None:
        del pod["nodeSelector"]
    deployment("gpu-node-selection", "no-selector", no_selector)

    def privileged(pod: dict[str, Any], _: Any) -> None:
        container(pod)["securityContext"].update({"privileged": True, "allowPrivilegeEscalation": True})
    deployment("no-privileged-pods", "privileged", privileged)

    def reset(pod: dict[str, Any], _: Any) -> None:
        container(pod)["lifecycle"]["preStop"]["exec"]["command"][2] = "nvidia-smi --gpu-reset -i 0; sleep 15"
    deployment("no-device-reset", "device-reset", reset)

    def latest(pod: dict[str, Any], _: Any) -> None:
        container(pod)["image"] = "vllm/vllm-openai:latest"
    deployment("pinned-images", "latest-image", latest)

    case = Case("pinned-images-helm")  # a Helm release's values, as the chart's own key for the image tag
    release = baseline("nvidia-device-plugin")
    release.update({"name": "device-plugin-latest", "chart": str(CHARTS / "nvidia-device-plugin-0.20.0.tgz")})
    release["values"]["image"]["tag"] = "latest"
    register("kubernetes:helm.sh/v3:Release", "device-plugin-latest", release, case)

    case = Case("gpu-nodegroup-labels-taint")
    register_pool(case, "l4-untainted", taint=False)

    case = Case("imdsv2-required")
    aws.ec2.LaunchTemplate("legacy-gpu-lt", name_prefix="legacy-gpu-", image_id="ami-0123456789abcdef0",
                           metadata_options={"http_endpoint": "enabled", "http_tokens": "optional",
                                             "http_put_response_hop_limit": 2},
                           opts=pulumi.ResourceOptions(parent=case))

    def cache_in_emptydir(pod: dict[str, Any], _: Any) -> None:  # an 8B model's 16 GB (the embed model is 1.2)
        container(pod)["args"][0] = "Qwen/Qwen3-8B"
        pod["volumes"][0] = {"name": "model-cache", "emptyDir": {}}
    deployment("model-cache-not-emptydir", "cache-emptydir", cache_in_emptydir)

    case = Case("ray-ports-internal")
    register("kubernetes:core/v1:Service", "ray-dashboard", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "ray-dashboard", "namespace": "llm"},
        "spec": {"type": "LoadBalancer", "selector": {"ray.io/node-type": "head"},
                 "ports": [{"name": "dashboard", "port": 8265, "targetPort": 8265}]}}, case)

    case = Case("serving-network-isolated")
    register("kubernetes:networking.k8s.io/v1:NetworkPolicy", "open-openai-http", {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "open-openai-http", "namespace": "llm"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"ports": [{"port": 8000}]}]}}, case)

    case = Case("no-cpu-hpa-on-gpu")
    scaler = baseline("scaledobject-llm-embed")
    scaler["metadata"]["name"] = "embed-on-cpu"
    scaler["spec"]["triggers"] = [{"type": "cpu", "metricType": "Utilization", "metadata": {"value": "70"}}]
    register("kubernetes:keda.sh/v1alpha1:ScaledObject", "scaledobject-embed-on-cpu", scaler, case)
    register("kubernetes:autoscaling/v2:HorizontalPodAutoscaler", "embed-on-cpu", {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "embed-on-cpu", "namespace": "llm"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "embed"},
                 "minReplicas": 2, "maxReplicas": 4,
                 "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
                     "type": "Utilization", "averageUtilization": 70}}}]}}, case)

    def short_grace(pod: dict[str, Any], _: Any) -> None:
        pod["terminationGracePeriodSeconds"] = 30
    deployment("prestop-drain", "short-grace", short_grace)

    def no_startup(pod: dict[str, Any], _: Any) -> None:
        del container(pod)["startupProbe"]
    deployment("inference-probes", "no-startup-probe", no_startup)

    def greedy(pod: dict[str, Any], _: Any) -> None:
        set_flag(pod, "--gpu-memory-utilization", "0.98")
    deployment("vllm-memory-utilization", "memory-high", greedy)

    def two_way(pod: dict[str, Any], _: Any) -> None:
        set_flag(pod, "--tensor-parallel-size", "2")
    deployment("vllm-parallelism-matches-gpus", "tp-two", two_way)

    case = Case("vllm-parallelism-matches-gpus-lws")  # a group of two 8-GPU pods serving tensor 8 x pipeline 4
    group = baseline("leaderworkerset-llm-deepseek")
    group["metadata"]["name"] = "deepseek-pp4"
    for role in ("leaderTemplate", "workerTemplate"):
        template = group["spec"]["leaderWorkerTemplate"][role]
        args = template["spec"]["containers"][0].get("args") or []
        if "--pipeline-parallel-size" in args:
            args[args.index("--pipeline-parallel-size") + 1] = "4"
    register("kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet", "leaderworkerset-deepseek-pp4", group, case)

    def no_cache(pod: dict[str, Any], _: Any) -> None:
        container(pod)["args"][0] = "Qwen/Qwen3-8B"
        pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "model-cache"]
        container(pod)["volumeMounts"] = [m for m in container(pod)["volumeMounts"] if m["name"] != "model-cache"]
    deployment("model-cache-persistent", "no-cache-volume", no_cache)

    case = Case("rwo-cache-surge")
    claim = baseline("persistentvolumeclaim-llm-embed-hf-cache")
    claim["metadata"]["name"] = "surge-cache"
    claim["spec"].update({"accessModes": ["ReadWriteOnce"], "storageClassName": "triarch-gp3"})
    register("kubernetes:core/v1:PersistentVolumeClaim", "surge-cache", claim, case)

    def surging(pod: dict[str, Any], props: dict[str, Any]) -> None:
        pod["volumes"][0]["persistentVolumeClaim"]["claimName"] = "surge-cache"
        props["spec"]["strategy"]["rollingUpdate"] = {"maxSurge": 1, "maxUnavailable": 0}
    register(DEPLOYMENT, "surge", served("surge", surging), case)

    def gpu_only(pod: dict[str, Any], _: Any) -> None:
        container(pod)["resources"] = {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}
    deployment("gpu-server-resources", "gpu-only", gpu_only)

    def floating_driver(pod: dict[str, Any], _: Any) -> None:
        pod["nodeSelector"]["cloud.google.com/gke-gpu-driver-version"] = "latest"
    deployment("pinned-gpu-driver", "floating-driver", floating_driver)

    def plaintext_token(pod: dict[str, Any], _: Any) -> None:
        token = pulumi.Output.secret("hf_NotARealTokenJustAFixture")
        container(pod)["env"].append({"name": "HF_TOKEN", "value": token})
    deployment("no-plaintext-secrets", "secret-token", plaintext_token)

    # vLLM's runtime adapter loading on a pod a public LoadBalancer reaches (the prod embed Deployment's copy selects
    # its own pods by app.kubernetes.io/instance, which served() renames)
    def runtime_lora(pod: dict[str, Any], _: Any) -> None:
        container(pod)["env"].append({"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"})
    case = deployment("runtime-lora-never-public", "runtime-lora", runtime_lora)
    register("kubernetes:core/v1:Service", "runtime-lora", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "runtime-lora", "namespace": "llm"},
        "spec": {"type": "LoadBalancer", "selector": {"app.kubernetes.io/instance": "runtime-lora"},
                 "ports": [{"name": "http", "port": 80, "targetPort": 8000}]}}, case)

    case = Case("driver-cuda-compatible")
    register_pool(case, "l4-old-driver", ami="al2023@v20250807")

    def on_old_driver(pod: dict[str, Any], _: Any) -> None:
        pod["nodeSelector"]["triarch.dev/pool"] = "l4-old-driver"
    register(DEPLOYMENT, "old-driver", served("old-driver", on_old_driver), case)

    def on_missing_pool(pod: dict[str, Any], _: Any) -> None:
        pod["nodeSelector"]["triarch.dev/pool"] = "h200"
    deployment("pod-placement", "missing-pool", on_missing_pool)

    case = Case("pool-capacity")
    register_pool(case, "l4-one-gpu", gpus="1")

    def crowded(pod: dict[str, Any], _: Any) -> None:
        pod["nodeSelector"]["triarch.dev/pool"] = "l4-one-gpu"
        pod["tolerations"].append({**{k: v for k, v in CASE_TAINT.items() if k != "value"}, "operator": "Exists"})
    register(DEPLOYMENT, "crowded", served("crowded", crowded), case)

    case = Case("pool-scale-from-zero")
    group = baseline("llm-prod-system")
    group.update({"nodeGroupName": "llm-prod-a10g", "instanceTypes": ["g5.2xlarge"], "amiType": "AL2023_x86_64_NVIDIA",
                  "scalingConfig": {"minSize": 0, "desiredSize": 0, "maxSize": 2},
                  "labels": {"triarch.dev/pool": "a10g", "triarch.dev/gpu": "a10g", "nvidia.com/gpu.present": "true"},
                  "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}]})
    group.pop("launchTemplate", None)
    register("aws:eks/nodeGroup:NodeGroup", "llm-prod-a10g", group, case)

    def on_a10g(pod: dict[str, Any], _: Any) -> None:
        pod["nodeSelector"]["triarch.dev/pool"] = "a10g"
    register(DEPLOYMENT, "on-a10g", served("on-a10g", on_a10g), case)

    # Prod's created-stack mode (its EKS Cluster in the stack): no node outside the stack's pools, so a pod that asks
    # no GPU and that no pool takes stays Pending (on an adopted cluster it may run on the cluster's own nodes: silent).
    case = Case("pod-placement-created-stack")
    proxy = served("cpu-proxy")
    pod = proxy["spec"]["template"]["spec"]
    for key in ("tolerations", "volumes", "topologySpreadConstraints"):
        del pod[key]
    pod["nodeSelector"] = {"triarch.dev/pool": "cpu"}  # prod's CPU pool is `system`
    pod["containers"] = [{"name": "proxy", "image": RAY_IMAGE, "command": ["python", "-m", "http.server", "8080"],
                          "securityContext": container(pod)["securityContext"],
                          "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "256Mi"}}}]
    register(DEPLOYMENT, "cpu-proxy", proxy, case)

    # The EKS add-ons' DaemonSets take their share of every node the stack creates: a pod asking more CPU than an l4
    # node has left after them (but less than it has without them) fits nowhere.
    def addon_share(pod: dict[str, Any], _: Any) -> None:
        container(pod)["resources"]["requests"]["cpu"] = container(pod)["resources"]["limits"]["cpu"] = ADDON_SHARE_CPU
    deployment("pod-placement-addon-share", "addon-share", addon_share)

    # The engine's shapes: an image only known once another resource exists.
    case = Case("unknown-at-preview")
    repository = aws.ecr.Repository("vllm-mirror", opts=pulumi.ResourceOptions(parent=case))

    def from_registry(pod: dict[str, Any], _: Any) -> None:
        container(pod)["image"] = repository.repository_url.apply(lambda url: f"{url}:v0.33.0")
    register(DEPLOYMENT, "from-ecr", served("from-ecr", from_registry), case)


def ray_violations(service: dict[str, Any]) -> None:
    """Edits of the prod RayService itself: Serve's shutdown too short for the chat application; the qwen
    application split into prefill and decode (Ray 2.60's P/D application) handing its KV cache over UCX, as
    Triarch plans a split on pools without EFA."""
    text = service["spec"]["serveConfigV2"]
    text = text.replace("graceful_shutdown_timeout_s: 30", "graceful_shutdown_timeout_s: 5", 1)
    config = yaml.safe_load(text)
    [qwen] = [app for app in config["applications"] if app["name"] == "qwen"]
    [llm] = qwen["args"]["llm_configs"]
    roles = {}
    for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        roles[f"{role}_config"] = copy.deepcopy(llm)
        roles[f"{role}_config"]["engine_kwargs"]["kv_transfer_config"] = {
            "kv_connector": "NixlConnector", "kv_role": kv_role, "kv_connector_extra_config": {"backends": ["UCX"]}}
    qwen["import_path"], qwen["args"] = "ray.serve.llm:build_pd_openai_app", roles
    service["spec"]["serveConfigV2"] = yaml.safe_dump(config, sort_keys=False)


def room_for_the_cases(node_pool: dict[str, Any]) -> None:
    """Prod's l4 NodePool is sized for prod's own pods on l4 (the compliant set judges it as planned); the violating
    cases are copies of the embed Deployment that land there too, so their world's pool has room for 64 GPUs (CPU
    and memory in the same proportion), and each case draws its own finding, not one pool-capacity finding for all."""
    limits = node_pool["spec"]["limits"]
    scale = 64 / int(limits["nvidia.com/gpu"])
    limits.update({"nvidia.com/gpu": "64", "cpu": str(round(int(limits["cpu"]) * scale)),
                   "memory": f"{round(int(limits['memory'].removesuffix('Gi')) * scale)}Gi"})


if config.require("set") == "violating":
    for item in BASELINE:
        if item["type"] == "kubernetes:ray.io/v1:RayService":
            ray_violations(item["props"])
        if item["name"] == "nodepool-l4":
            room_for_the_cases(item["props"])
    violations()
register_baseline()
