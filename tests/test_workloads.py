"""The serving workloads every stack plans: vLLM Deployments, the prod RayService, the model caches and the HF token.

Each shipped stack runs through the whole program (__main__.py) once per module under Pulumi's mock engine
(`triarch.offline.run_program`). Expectations come from the stack files, templates/compat and templates/models
read as plain YAML, the vLLM name lists of the reference data (tools/reference/sources.yaml), and Kubernetes /
vLLM / Ray semantics; never from the planners' own functions.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pulumi.runtime.mocks import MockMonitor

from conftest import StackWriter, reference_file, stack_document, write_stack_file
from triarch import cli
from triarch.offline import manifests, read_stack_config, run_program
from triarch.scheduling import POOL_LABEL

ROOT = Path(__file__).resolve().parents[1]
COMPAT = ROOT / "templates" / "compat"
STACKS = ("local", "dev", "prod")
EKS_STACKS = ("dev", "prod")

GPU = "nvidia.com/gpu"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
"""The taint GPU nodes carry (NVIDIA device plugin chart convention)."""
ZONE_KEY = "topology.kubernetes.io/zone"
DEFAULT_VLLM_IMAGE = "vllm/vllm-openai:v0.33.0"
"""The image a stack gets without triarch:images.vllm: the release whose name lists the reference data has (0.33.0)."""
DEFAULT_RAY_IMAGE = "rayproject/ray-llm:2.60.0-py312-cu130"
SERVE_DEFAULT_GRACEFUL_SHUTDOWN_S = 20
"""Ray Serve's default graceful_shutdown_timeout_s when a deployment does not set it."""
RAY_SIGTERM_DRAIN_DEFAULT_S = 30
"""Ray 2.60's default RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S (ray/_private/ray_constants.py)."""
RELEASE = "kubernetes:helm.sh/v3:Release"
RAY_SERVICE = "kubernetes:ray.io/v1:RayService"


# --- planning --------------------------------------------------------------------------------------------

@dataclass
class Planned:
    name: str
    config: dict[str, Any]
    """The stack's `config:` mapping as YAML values."""
    run: Any
    objects: list[dict[str, Any]]
    dependencies: dict[str, list[str]]
    """URN -> the dependencies the program registered it with (request.dependencies)."""

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def models(self, engine: str | None = None) -> list[dict[str, Any]]:
        return [m for m in self.config.get("triarch:models", []) if engine is None or m["engine"] == engine]


def plan(name: str, config: dict[str, Any], path: Path) -> Planned:
    """Plan a stack mapping through the product's own stack-file reader and the whole program.

    The recorded `Registered` resources carry no dependencies, so the Pulumi SDK's MockMonitor.RegisterResource
    (which triarch's recording monitor calls through super()) is wrapped for this one run to read
    `request.dependencies`: the exact URNs the engine would order the resource after.
    """
    values, secrets = read_stack_config(write_stack_file(path, config))
    dependencies: dict[str, list[str]] = {}
    original = MockMonitor.RegisterResource

    def recording(self: MockMonitor, request: Any) -> Any:
        response = original(self, request)
        dependencies[response.urn] = list(request.dependencies)
        return response

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MockMonitor, "RegisterResource", recording)
        run = run_program(name, values, secrets)
    return Planned(name, config, run, manifests(run), dependencies)


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Planned]:
    return {name: plan(name, stack_document(name), tmp_path_factory.mktemp(name) / f"Pulumi.{name}.yaml")
            for name in STACKS}


# --- independent facts -----------------------------------------------------------------------------------

def compat(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((COMPAT / f"{name}.yaml").read_text(encoding="utf-8"))
    return data


def names_in(release: str, *files: str) -> set[str]:
    names: set[str] = set()
    for file in files:
        names |= set(reference_file(release, file).read_text(encoding="utf-8").split())
    return names


def node_group(config: dict[str, Any], name: str) -> dict[str, Any]:
    return next(g for g in config["triarch:nodeGroups"] if g["name"] == name)


def pool_gpu_capacity(config: dict[str, Any], pool: str) -> int:
    """Schedulable nvidia.com/gpu in a pool at its largest: nodes x GPUs per node x time-slicing replicas."""
    group = node_group(config, pool)
    if config["triarch:cluster"].get("create"):
        nodes = group["max"]
        per_node = compat("instances")["instances"][group["instanceType"]]["gpus"]
    else:
        nodes = len(group["nodes"])
        per_node = group.get("gpusPerNode", 1)
    slicing = (group.get("timeSlicing") or {}).get("replicas", 1)
    return int(nodes * per_node * slicing)


def replica_range(model: dict[str, Any]) -> tuple[int, int]:
    scaling = model.get("autoscaling")
    if scaling:
        return scaling.get("min", 1), scaling["max"]
    replicas = model.get("replicas", 1)
    return replicas, replicas


def tolerates(toleration: dict[str, Any], taint: dict[str, str]) -> bool:
    """Kubernetes' matching rule for one toleration against one taint."""
    if toleration.get("effect") not in (None, "", taint["effect"]):
        return False
    operator = toleration.get("operator", "Equal")
    if operator == "Exists":
        return toleration.get("key") in (None, "", taint["key"])
    return toleration.get("key") == taint["key"] and toleration.get("value", "") == taint["value"]


def gpu_taints(run: Planned, pool: str) -> list[dict[str, str]]:
    """The GPU taint, plus whatever taints the stack's EKS node group of the pool is registered with."""
    effects = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
    taints = [GPU_TAINT]
    for resource in run.run.resources:
        if resource.type == "aws:eks/nodeGroup:NodeGroup" and resource.inputs.get("labels", {}).get(POOL_LABEL) == pool:
            taints += [{"key": t["key"], "value": t.get("value", ""), "effect": effects[t["effect"]]}
                       for t in resource.inputs.get("taints") or []]
    return taints


def flag_value(args: list[str], flag: str) -> str | None:
    for i, token in enumerate(args):
        if token == flag:
            return args[i + 1]
        if token.startswith(flag + "="):
            return token.split("=", 1)[1]
    return None


def flags(args: list[str]) -> list[str]:
    return [token.split("=", 1)[0] for token in args if token.startswith("--")]


def executable_lines(script: str) -> str:
    """A shell script without its comment lines: what runs."""
    return "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))


def prestop_sleep(container: dict[str, Any]) -> int:
    """Seconds the preStop hook sleeps (exec `sleep N` commands, or the native sleep action)."""
    hook = container["lifecycle"]["preStop"]
    if "sleep" in hook:
        return int(hook["sleep"]["seconds"])
    script = " ".join(hook["exec"]["command"])
    seconds = [int(n) for n in re.findall(r"\bsleep\s+(\d+)", executable_lines(script))]
    assert seconds, f"preStop runs no `sleep N`: {script!r}"
    return sum(seconds)


def pod_specs(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(label, pod template) of a Deployment or each group of a RayService."""
    if obj["kind"] == "Deployment":
        yield obj["metadata"]["name"], obj["spec"]["template"]
    elif obj["kind"] == "RayService":
        cluster = obj["spec"]["rayClusterConfig"]
        yield "head", cluster["headGroupSpec"]["template"]
        for group in cluster.get("workerGroupSpecs", []):
            yield group["groupName"], group["template"]


def subset(small: dict[str, Any], big: dict[str, Any]) -> bool:
    return bool(small) and all(big.get(k) == v for k, v in small.items())


# --- vLLM Deployments ------------------------------------------------------------------------------------

VLLM_CASES = [(stack, m["name"]) for stack in STACKS for m in stack_document(stack).get("triarch:models", [])
              if m["engine"] == "vllm"]


@dataclass
class Served:
    run: Planned
    model: dict[str, Any]
    deployment: dict[str, Any]

    @property
    def pod(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.deployment["spec"]["template"]["spec"]
        return spec

    @property
    def labels(self) -> dict[str, str]:
        labels: dict[str, str] = self.deployment["spec"]["template"]["metadata"]["labels"]
        return labels

    @property
    def container(self) -> dict[str, Any]:
        [container] = [c for c in self.pod["containers"] if "vllm" in " ".join([*c.get("command", []), c["image"]])]
        return container

    @property
    def argv(self) -> list[str]:
        return [*self.container.get("command", []), *self.container.get("args", [])]

    @property
    def namespace(self) -> str:
        namespace: str = self.deployment["metadata"]["namespace"]
        return namespace


def served(planned: dict[str, Planned], stack: str, name: str) -> Served:
    run = planned[stack]
    [model] = [m for m in run.models("vllm") if m["name"] == name]
    [deployment] = [d for d in run.of_kind("Deployment") if d["metadata"]["name"] == name]
    return Served(run, model, deployment)


@pytest.mark.parametrize("stack", STACKS)
def test_one_deployment_per_vllm_model(planned: dict[str, Planned], stack: str) -> None:
    run = planned[stack]
    vllm_deployments = {d["metadata"]["name"] for d in run.of_kind("Deployment")
                        if any(c["image"].startswith("vllm/") for c in d["spec"]["template"]["spec"]["containers"])}
    assert vllm_deployments == {m["name"] for m in run.models("vllm")}


@pytest.mark.parametrize(("stack", "name"), VLLM_CASES)
def test_image_is_the_pinned_vllm(planned: dict[str, Planned], stack: str, name: str) -> None:
    case = served(planned, stack, name)
    expected = (case.run.config.get("triarch:images") or {}).get("vllm", DEFAULT_VLLM_IMAGE)
    image = case.container["image"]
    assert image == expected
    assert not image.endswith(":latest") and (":" in image.rsplit("/", 1)[-1] or "@sha256:" in image)


@pytest.mark.parametrize(("stack", "name"), VLLM_CASES)
def test_command_is_vllm_serve_of_the_model(planned: dict[str, Planned], stack: str, name: str) -> None:
    case = served(planned, stack, name)
    assert case.argv[:3] == ["vllm", "serve", case.model["model"]]


@pytest.mark.parametrize(("stack", "name"), VLLM_CASES)
def test_every_flag_is_a_vllm_033_argument(planned: dict[str, Planned], stack: str, name: str) -> None:
    known = names_in("vllm-0.33.0", "engine-args.txt", "frontend-args.txt")
    used = flags(served(planned, stack, name).argv)
    assert used
    unknown = [f for f in used if f[2:].replace("-", "_") not in known]
    assert not unknown, f"not arguments of vllm serve 0.33.0: {unknown}"


@pytest.mark.parametrize(("stack", "name"), VLLM_CASES)
def test_gpu_limit_is_tensor_times_pipeline_parallel(planned: dict[str, Planned], stack: str, name: str) -> None:
    case = served(planned, stack, name)
    tp = int(flag_value(case.argv, "--tensor-parallel-size") or 1)
    pp = int(flag_value(case.argv, "--pipeline-parallel-size") or 1)
    if "tensorParallelSize" in case.model:
        assert tp == case.model["tensorParallelSize"]
    resources = case.container["resources"]
    assert int(resources["limits"][GPU]) == tp * pp
    assert resources["requests"] == resources["limits"]


@pytest.mark.parametrize(("stack", "name"), VLLM_CASES)
def test_probes_hit_health_and_startup_waits_five_minutes(planned: dict[str, Planned], stack: str,
                                                          name: str) -> None:
    container = served(planned, stack, name).container
    port_names = {p.get("name") for p in container["ports"]} | {p["containerPort"] for p in container["ports"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health", probe
        assert container[probe]["httpGet"]["port"] in port_names, probe
    startup = container["startupProbe"]
    assert startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3) >= 5 * 60


@pytest.mark.parametrize(("stack", "name"), VLLM_CASES)
def test_grace_period_covers_prestop_and_shutdown_timeout(planned: dict[str, Planned], stack: str,
                                                          name: str) -> None:
    case = served(planned, stack, name)
    assert "preStop" in case.container.get("lifecycle", {})
    shutdown = flag_value(case.argv, "--shutdown-timeout")
    assert shutdown is not None and int(shutdown) > 0, "without --shutdown-timeout vLLM aborts in-flight requests"
    grace = case.pod.get("terminationGracePeriodSeconds", 30)
    assert grace > prestop_sleep(case.container) + int(shutdown)


def _count(value: int | str, replicas: int, round_up: bool) -> int:
    if isinstance(value, int):
        return value
    share = replicas * int(value.rstrip("%")) / 100
    return math.ceil(share) if round_up else math.floor(share)


@pytest.mark.parametrize(("stack", "name"), VLLM_CASES)
def test_rolling_update_keeps_capacity_and_can_progress(planned: dict[str, Planned], stack: str,
                                                        name: str) -> None:
    """maxUnavailable 0 keeps serving capacity during a rollout, but only works if the surge replica can be
    scheduled: the pool must have (replicas + maxSurge) x GPUs free besides the pool's other workloads at their
    largest (a RayService upgrade included). Where it cannot, maxUnavailable 0 deadlocks the rollout (the new pod
    stays Pending forever)."""
    case = served(planned, stack, name)
    strategy = case.deployment["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    replicas = case.deployment["spec"]["replicas"]
    surge = _count(strategy["rollingUpdate"].get("maxSurge", "25%"), replicas, round_up=True)
    unavailable = _count(strategy["rollingUpdate"].get("maxUnavailable", "25%"), replicas, round_up=False)
    gpus = int(case.container["resources"]["limits"][GPU])
    pool = case.model["nodeGroup"]
    others = 0
    for other in case.run.of_kind("Deployment"):
        spec = other["spec"]["template"]["spec"]
        if other["metadata"]["name"] != name and spec.get("nodeSelector", {}).get(POOL_LABEL) == pool:
            others += other["spec"]["replicas"] * sum(int(c["resources"]["limits"].get(GPU, 0))
                                                      for c in spec["containers"])
    for service in case.run.of_kind("RayService"):
        # A NewCluster upgrade runs the new Ray cluster (its groups at minReplicas) beside the old one at its largest.
        upgrade = service["spec"].get("upgradeStrategy", {}).get("type", "NewCluster") == "NewCluster"
        for group in service["spec"]["rayClusterConfig"].get("workerGroupSpecs", []):
            spec = group["template"]["spec"]
            if spec.get("nodeSelector", {}).get(POOL_LABEL) == pool:
                pods = group["maxReplicas"] + (group["minReplicas"] if upgrade else 0)
                others += pods * sum(int(c["resources"]["limits"].get(GPU, 0)) for c in spec["containers"])
    capacity = pool_gpu_capacity(case.run.config, pool)
    if (replicas + 1) * gpus + others <= capacity:  # room for one surge replica
        assert unavailable == 0
        assert surge >= 1
    else:
        assert unavailable >= 1, (
            f"rollout deadlock: pool '{pool}' has {capacity} GPU(s), {others} used by other workloads, and "
            f"{replicas} replica(s) + {surge} surge x {gpus} GPU(s) do not fit while maxUnavailable is 0")


@pytest.mark.parametrize(("stack", "name"), VLLM_CASES)
def test_budget_and_service_select_the_pods(planned: dict[str, Planned], stack: str, name: str) -> None:
    case = served(planned, stack, name)
    budgets = [b for b in case.run.of_kind("PodDisruptionBudget") if b["metadata"]["namespace"] == case.namespace
               and subset(b["spec"]["selector"]["matchLabels"], case.labels)]
    assert len(budgets) == 1
    container_ports = {p["containerPort"] for p in case.container["ports"]} | {
        p["name"] for p in case.container["ports"] if "name" in p}
    services = [s for s in case.run.of_kind("Service") if s["metadata"]["namespace"] == case.namespace
                and subset(s["spec"]["selector"], case.labels)]
    assert services
    assert any(p.get("targetPort", p["port"]) in container_ports for s in services for p in s["spec"]["ports"])


@pytest.mark.parametrize(("stack", "name"), VLLM_CASES)
def test_placement_on_the_model_pool_spread_over_zones(planned: dict[str, Planned], stack: str, name: str) -> None:
    case = served(planned, stack, name)
    pod = case.pod
    assert pod["nodeSelector"][POOL_LABEL] == case.model["nodeGroup"]
    for taint in gpu_taints(case.run, case.model["nodeGroup"]):
        assert any(tolerates(t, taint) for t in pod.get("tolerations", [])), taint
    zone = [c for c in pod.get("topologySpreadConstraints", []) if c["topologyKey"] == ZONE_KEY]
    assert zone
    assert all(c["maxSkew"] <= 1 and subset(c["labelSelector"]["matchLabels"], case.labels) for c in zone)


REVISION_LABELS = {"Deployment": ["pod-template-hash"], "RayService": ["ray.io/cluster"]}
"""The label each controller gives the pods of one revision: a ReplicaSet's hash, a RayCluster's name."""


@pytest.mark.parametrize("stack", STACKS)
def test_each_spread_counts_one_revisions_pods(planned: dict[str, Planned], stack: str) -> None:
    """A rollout's new pods, and the new Ray cluster of a RayService upgrade, spread among themselves: counted with
    the pods they replace, they would be refused every zone those fill (the upgrade then waits forever on a full
    pool; tests/test_real_ray.py shows it on the real scheduler)."""
    run = planned[stack]
    templates = [("Deployment", d["spec"]["template"]["spec"]) for d in run.of_kind("Deployment")
                 if d["spec"]["template"]["spec"].get("nodeSelector", {}).get(POOL_LABEL)]
    templates += [("RayService", g["template"]["spec"]) for s in run.of_kind("RayService")
                  for g in s["spec"]["rayClusterConfig"].get("workerGroupSpecs", [])]
    assert {kind for kind, _ in templates} == set(REVISION_LABELS) or stack != "prod", templates  # both kinds
    for kind, spec in templates:
        spreads = spec["topologySpreadConstraints"]
        assert spreads and all(c["matchLabelKeys"] == REVISION_LABELS[kind] for c in spreads), (kind, spreads)


@pytest.mark.parametrize(("stack", "name"), VLLM_CASES)
def test_model_cache_is_a_claim_that_exists(planned: dict[str, Planned], stack: str, name: str) -> None:
    case = served(planned, stack, name)
    [hf_home] = [e["value"] for e in case.container["env"] if e["name"] == "HF_HOME"]
    mounts = [m for m in case.container["volumeMounts"]
              if hf_home == m["mountPath"] or hf_home.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mounts, f"nothing is mounted at HF_HOME={hf_home}"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    [volume] = [v for v in case.pod["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" not in volume
    claim = volume["persistentVolumeClaim"]["claimName"]
    assert [c for c in case.run.of_kind("PersistentVolumeClaim")
            if c["metadata"]["name"] == claim and c["metadata"]["namespace"] == case.namespace]


@pytest.mark.parametrize("stack", STACKS)
def test_serving_pods_are_unprivileged_and_non_root(planned: dict[str, Planned], stack: str) -> None:
    checked = 0
    for obj in planned[stack].objects:
        for label, template in pod_specs(obj):
            pod = template["spec"]
            pod_non_root = (pod.get("securityContext") or {}).get("runAsNonRoot")
            for container in pod.get("initContainers", []) + pod["containers"]:
                where = f"{obj['kind']} {label} {container['name']}"
                context = container.get("securityContext") or {}
                assert context.get("privileged") is not True, where
                assert not (context.get("capabilities") or {}).get("add"), where
                assert context.get("allowPrivilegeEscalation") is False, where
                assert context.get("runAsNonRoot", pod_non_root) is True, where
                checked += 1
    assert checked >= len(planned[stack].models("vllm"))


# --- embedding models ------------------------------------------------------------------------------------

EMBED_CASES = [(s, m["name"]) for s in STACKS for m in stack_document(s).get("triarch:models", [])
               if "embedding" in m["model"].lower()]


def test_every_stack_serves_an_embedding_model() -> None:
    assert {s for s, _ in EMBED_CASES} == set(STACKS)


@pytest.mark.parametrize(("stack", "name"), EMBED_CASES)
def test_embedding_models_run_the_pooling_runner(planned: dict[str, Planned], stack: str, name: str) -> None:
    argv = served(planned, stack, name).argv
    assert flag_value(argv, "--runner") == "pooling"
    assert flag_value(argv, "--convert") == "embed"


@pytest.mark.parametrize("stack", STACKS)
def test_no_task_flag_anywhere(planned: dict[str, Planned], stack: str) -> None:
    """`--task` was removed from vLLM (0.33 has --runner/--convert); it must appear in no args or engine kwargs."""
    for deployment in planned[stack].of_kind("Deployment"):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            assert "--task" not in flags(container.get("command", []) + container.get("args", []))
    for service in planned[stack].of_kind("RayService"):
        for app in yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]:
            for llm in app["args"]["llm_configs"]:
                assert "task" not in llm.get("engine_kwargs", {})


# --- prod's RayService -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def prod(planned: dict[str, Planned]) -> Planned:
    return planned["prod"]


@pytest.fixture(scope="module")
def ray_service(prod: Planned) -> dict[str, Any]:
    [service] = prod.of_kind("RayService")
    return service


@pytest.fixture(scope="module")
def serve_config(ray_service: dict[str, Any]) -> dict[str, Any]:
    text = ray_service["spec"]["serveConfigV2"]
    assert isinstance(text, str)
    config: dict[str, Any] = yaml.safe_load(text)
    return config


def llm_configs(serve_config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """HF model id -> its LLMConfig."""
    return {llm["model_loading_config"]["model_source"]: llm
            for app in serve_config["applications"] for llm in app["args"]["llm_configs"]}


def test_ray_service_api(ray_service: dict[str, Any]) -> None:
    assert ray_service["apiVersion"] == "ray.io/v1"
    assert ray_service["kind"] == "RayService"


def test_one_openai_application_per_ray_model(prod: Planned, serve_config: dict[str, Any]) -> None:
    apps = serve_config["applications"]
    models = prod.models("ray-serve")
    assert len(apps) == len(models) >= 1
    assert all(app["import_path"] == "ray.serve.llm:build_openai_app" for app in apps)
    prefixes = [app["route_prefix"] for app in apps]
    assert len(set(prefixes)) == len(prefixes)
    assert all(p.startswith("/") for p in prefixes)
    assert sorted(llm_configs(serve_config)) == sorted(m["model"] for m in models)


def test_deepseek_on_two_a100s(serve_config: dict[str, Any]) -> None:
    llm = llm_configs(serve_config)["deepseek-ai/DeepSeek-V2-Lite-Chat"]
    assert llm["engine_kwargs"]["tensor_parallel_size"] == 2
    # Ray detects an A100's accelerator type from the device name "NVIDIA A100-SXM4-80GB" as "A100".
    assert llm["accelerator_type"] == "A100"


def test_engine_kwargs_exist_in_the_ray_images_vllm(prod: Planned, serve_config: dict[str, Any]) -> None:
    image = (prod.config.get("triarch:images") or {}).get("rayLlm", DEFAULT_RAY_IMAGE)
    repository, tag = image.rsplit(":", 1)
    version = compat("images")["images"][repository][tag]["vllm"]
    assert version == "0.29.0"
    known = names_in(f"vllm-{version}", "engine-args.txt")
    for model, llm in llm_configs(serve_config).items():
        unknown = sorted(set(llm["engine_kwargs"]) - known)
        assert not unknown, f"{model}: {unknown} are not EngineArgs of vLLM {version}"


def test_head_runs_no_replicas_and_holds_no_gpu(ray_service: dict[str, Any]) -> None:
    head = ray_service["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    for container in head["template"]["spec"]["containers"]:
        for amounts in (container.get("resources") or {}).values():
            assert GPU not in amounts


def worker_groups(ray_service: dict[str, Any]) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = ray_service["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert groups
    return groups


def group_gpus(group: dict[str, Any]) -> int:
    [container] = [c for c in group["template"]["spec"]["containers"] if GPU in c["resources"].get("limits", {})]
    assert container["resources"]["requests"] == container["resources"]["limits"]
    return int(container["resources"]["limits"][GPU])


def models_by_group(prod: Planned, ray_service: dict[str, Any],
                    serve_config: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Worker group -> the stack's ray-serve models whose replicas fit it: same pool, GPUs = TP x PP."""
    configs = llm_configs(serve_config)
    result: dict[str, list[dict[str, Any]]] = {g["groupName"]: [] for g in worker_groups(ray_service)}
    for model in prod.models("ray-serve"):
        kwargs = configs[model["model"]]["engine_kwargs"]
        gpus = kwargs.get("tensor_parallel_size", 1) * kwargs.get("pipeline_parallel_size", 1)
        homes = [g["groupName"] for g in worker_groups(ray_service)
                 if g["template"]["spec"].get("nodeSelector", {}).get(POOL_LABEL) == model["nodeGroup"]
                 and group_gpus(g) == gpus]
        assert len(homes) == 1, f"{model['name']}: worker groups for {gpus} GPU(s) on {model['nodeGroup']}: {homes}"
        result[homes[0]].append(model)
    return result


def test_every_worker_group_hosts_models_of_its_gpu_count(prod: Planned, ray_service: dict[str, Any],
                                                          serve_config: dict[str, Any]) -> None:
    for group, models in models_by_group(prod, ray_service, serve_config).items():
        assert models, f"worker group {group} serves no model"


def test_worker_groups_select_and_tolerate_a_gpu_pool(prod: Planned, ray_service: dict[str, Any]) -> None:
    gpu_pools = {g["name"] for g in prod.config["triarch:nodeGroups"]}
    for group in worker_groups(ray_service):
        pod = group["template"]["spec"]
        pool = pod["nodeSelector"][POOL_LABEL]
        assert pool in gpu_pools
        for taint in gpu_taints(prod, pool):
            assert any(tolerates(t, taint) for t in pod.get("tolerations", [])), (group["groupName"], taint)


def test_worker_replicas_add_up_to_the_models(prod: Planned, ray_service: dict[str, Any],
                                              serve_config: dict[str, Any]) -> None:
    hosted = models_by_group(prod, ray_service, serve_config)
    for group in worker_groups(ray_service):
        models = hosted[group["groupName"]]
        assert group["minReplicas"] == sum(replica_range(m)[0] for m in models)
        assert group["maxReplicas"] == sum(replica_range(m)[1] for m in models)
        assert group["minReplicas"] <= group.get("replicas", group["minReplicas"]) <= group["maxReplicas"]


def test_autoscaling_models_scale_in_serve(prod: Planned, serve_config: dict[str, Any]) -> None:
    configs = llm_configs(serve_config)
    for model in prod.models("ray-serve"):
        deployment = configs[model["model"]]["deployment_config"]
        if model.get("autoscaling"):
            low, high = replica_range(model)
            scaling = deployment["autoscaling_config"]
            assert (scaling["min_replicas"], scaling["max_replicas"]) == (low, high)
        else:
            assert deployment["num_replicas"] == model.get("replicas", 1)


def test_in_tree_autoscaling_follows_the_models(prod: Planned, ray_service: dict[str, Any]) -> None:
    autoscaled = any(m.get("autoscaling") for m in prod.models("ray-serve"))
    assert autoscaled, "prod is expected to autoscale a ray-serve model"
    assert ray_service["spec"]["rayClusterConfig"].get("enableInTreeAutoscaling") is True


def test_worker_prestop_drains_without_killing_ray(prod: Planned, ray_service: dict[str, Any],
                                                   serve_config: dict[str, Any]) -> None:
    configs = llm_configs(serve_config)
    hosted = models_by_group(prod, ray_service, serve_config)
    for group in worker_groups(ray_service):
        pod = group["template"]["spec"]
        [container] = [c for c in pod["containers"] if GPU in c["resources"].get("limits", {})]
        hook = container["lifecycle"]["preStop"]
        script = " ".join(hook["exec"]["command"]) if "exec" in hook else ""
        # Comment lines explaining why `ray stop` is absent do not run; only the executable lines count.
        runs = executable_lines(script)
        assert "ray stop" not in runs
        assert "nvidia-smi" not in runs
        shutdown = max(configs[m["model"]]["deployment_config"].get("graceful_shutdown_timeout_s",
                                                                     SERVE_DEFAULT_GRACEFUL_SHUTDOWN_S)
                       for m in hosted[group["groupName"]])
        # On SIGTERM Ray drains the node once more, for RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S (Ray's default 30).
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        sigterm = float(env.get("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", RAY_SIGTERM_DRAIN_DEFAULT_S))
        grace = pod.get("terminationGracePeriodSeconds", 30)
        assert grace > prestop_sleep(container) + sigterm + shutdown, group["groupName"]


def test_ray_service_waits_for_the_kuberay_operator(prod: Planned) -> None:
    """The RayService CRD comes with the operator chart; the RayService must be registered with depends_on the
    release. Dependencies come from the wrapped MockMonitor.RegisterResource (see `plan`)."""
    chart = yaml.safe_load(reference_file("kuberay-v1.7.0", "Chart.yaml").read_text(encoding="utf-8"))
    [release] = [r for r in prod.run.resources if r.type == RELEASE and r.inputs.get("chart") == "kuberay-operator"]
    assert (release.inputs["chart"], release.inputs["version"]) == (chart["name"], str(chart["version"]))
    [service] = [r for r in prod.run.resources if r.type == RAY_SERVICE]
    assert release.urn in prod.dependencies[service.urn]


# --- the Hugging Face token ------------------------------------------------------------------------------

def hf_env(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for c in deployment["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])
            if e["name"] == "HF_TOKEN"]


def test_no_token_no_secret(planned: dict[str, Planned]) -> None:
    dev = planned["dev"]
    assert "triarch:hfToken" not in dev.config
    assert not [s for s in dev.of_kind("Secret") if s["metadata"]["namespace"] == "llm"]  # Grafana's is elsewhere
    assert all(not hf_env(d) for d in dev.of_kind("Deployment"))


def test_token_becomes_a_masked_secret_read_by_the_pods(write_stack: StackWriter, tmp_path: Path) -> None:
    config = stack_document("dev")
    config["triarch:hfToken"] = {"secure": "v1:abc"}
    out = tmp_path / "out"
    stderr = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        code = cli.main(["plan", "--stack-file", str(write_stack(config)), "--out", str(out)])
    assert code == 0, stderr.getvalue()
    document = json.loads((out / "plan.json").read_text(encoding="utf-8"))
    assert "v1:abc" not in json.dumps(document)
    [secret] = [r for r in document["resources"] if r["type"] == "kubernetes:core/v1:Secret"
                and r["inputs"]["metadata"]["namespace"] == "llm"]
    string_data = secret["inputs"]["stringData"]
    assert string_data and set(string_data.values()) == {"[secret]"}
    deployments = [yaml.safe_load(p.read_text(encoding="utf-8")) for p in (out / "manifests").glob("*.yaml")]
    deployments = [d for d in deployments if d["kind"] == "Deployment"]
    assert deployments
    for deployment in deployments:
        [env] = hf_env(deployment)
        reference = env["valueFrom"]["secretKeyRef"]
        assert reference["name"] == secret["inputs"]["metadata"]["name"]
        assert secret["inputs"]["metadata"]["namespace"] == deployment["metadata"]["namespace"]
        # The key the pods read must be a key of the Secret as planned (not an SDK wrapper's keys).
        assert reference["key"] in string_data, f"Secret stringData keys {sorted(string_data)}"


# --- serving config errors -------------------------------------------------------------------------------

def plan_error(name: str, config: dict[str, Any], write_stack: StackWriter, tmp_path: Path) -> tuple[int, str]:
    stderr = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        code = cli.main(["plan", "--stack-file", str(write_stack(config)), "--out", str(tmp_path / "out")])
    return code, stderr.getvalue()


def test_unknown_architecture_names_the_model_key(write_stack: StackWriter, tmp_path: Path) -> None:
    config = stack_document("dev")
    config["triarch:models"][0]["model"] = "acme/unknown-model"
    code, message = plan_error("dev", config, write_stack, tmp_path)
    assert code == 2
    assert "triarch:models[0].model" in message
    assert "acme/unknown-model" in message
    assert not (tmp_path / "out" / "plan.json").exists()


def test_a_model_too_large_for_the_gpu_is_refused_with_sizes(write_stack: StackWriter, tmp_path: Path) -> None:
    # Llama 3.1 70B in bf16 is ~141 GB of weights; dev's g6.xlarge has one 24 GB L4.
    config = stack_document("dev")
    config["triarch:models"][0].update(model="meta-llama/Llama-3.1-70B-Instruct", name="llama")
    code, message = plan_error("dev", config, write_stack, tmp_path)
    assert code == 2
    assert "triarch:models[0]" in message
    assert "GiB" in message


def test_route_prefix_on_a_vllm_model_is_rejected(write_stack: StackWriter, tmp_path: Path) -> None:
    config = stack_document("dev")
    config["triarch:models"][0]["routePrefix"] = "/embed"
    code, message = plan_error("dev", config, write_stack, tmp_path)
    assert code == 2
    assert "triarch:models[0].routePrefix" in message


@pytest.mark.parametrize("prefixes", [("/v1", "/v1"), ("/qwen", None)], ids=["both-explicit", "explicit-vs-default"])
def test_duplicate_ray_route_prefixes_are_rejected(write_stack: StackWriter, tmp_path: Path,
                                                   prefixes: tuple[str, str | None]) -> None:
    """Two ray-serve applications cannot share a route; prod's `qwen` has the default prefix /qwen."""
    config = stack_document("prod")
    ray_models = [m for m in config["triarch:models"] if m["engine"] == "ray-serve"]
    assert [m["name"] for m in ray_models] == ["chat", "qwen"]
    for model, prefix in zip(ray_models, prefixes, strict=True):
        if prefix is not None:
            model["routePrefix"] = prefix
    code, message = plan_error("prod", config, write_stack, tmp_path)
    assert code == 2
    assert re.search(r"triarch:models\[\d+\]\.routePrefix", message), message
    assert prefixes[0] in message


# --- model cache storage ---------------------------------------------------------------------------------

def test_adopted_cluster_uses_default_class_rwo_and_no_aws(planned: dict[str, Planned]) -> None:
    local = planned["local"]
    assert local.config["triarch:cluster"]["create"] is False
    claims = local.of_kind("PersistentVolumeClaim")
    assert claims
    for claim in claims:
        assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
        assert "storageClassName" not in claim["spec"]
    assert not local.of_kind("StorageClass")
    aws = [r.type for r in local.run.resources if r.type.startswith(("aws:", "pulumi:providers:aws"))]
    assert aws == []


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_created_cluster_caches_on_shared_efs(planned: dict[str, Planned], stack: str) -> None:
    run = planned[stack]
    assert run.config["triarch:cluster"]["create"] is True
    claims = run.of_kind("PersistentVolumeClaim")
    assert len(claims) >= len(run.models("vllm")) + (1 if run.models("ray-serve") else 0)
    for claim in claims:
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
        assert claim["spec"]["storageClassName"] == "triarch-efs"
    [storage_class] = [c for c in run.of_kind("StorageClass") if c["metadata"]["name"] == "triarch-efs"]
    assert storage_class["provisioner"] == "efs.csi.aws.com"


# --- what `pulumi up` waits for ----------------------------------------------------------------------------
# pulumi-kubernetes 4.25.0 (pkg/await, the provider the real-engine tier runs) waits on a claim until it is Bound,
# for at most 5 minutes of its own, or only until it is Pending where it reads the claim's class and finds
# WaitForFirstConsumer (a claim that names no class gets the default class's name from the API server at creation,
# seen on the real one); on a Deployment until its rollout is available, every claim it mounts Bound included, and
# on a Service with a selector until it has ready endpoints, each 10 minutes unless the object's
# `pulumi.com/timeoutSeconds` says otherwise.

AWAIT_TIMEOUT = "pulumi.com/timeoutSeconds"
PROVIDER_DEFAULT_SECONDS = 600
DEPLOYMENT_PROGRESS_DEFAULT_SECONDS = 600
"""A Deployment's progressDeadlineSeconds when unset (apps/v1 API reference)."""


@pytest.mark.parametrize("stack", STACKS)
def test_no_model_cache_claim_holds_up_pulumi_up(planned: dict[str, Planned], stack: str) -> None:
    """A claim's binding is awaited once, by the Deployment that mounts it, on the rollout's budget; awaited on its
    own too, a claim whose class binds later than the provider's fixed 5 minutes (a provisioner still starting, a
    volume bound by hand on an adopted cluster) would fail the update while the rollout still had time."""
    claims = planned[stack].of_kind("PersistentVolumeClaim")
    assert claims
    for claim in claims:
        assert claim["metadata"].get("annotations", {}).get("pulumi.com/skipAwait") == "true", \
            claim["metadata"]["name"]


@pytest.mark.parametrize(("stack", "name"), VLLM_CASES)
def test_pulumi_waits_for_a_replica_as_long_as_it_may_take_to_load(planned: dict[str, Planned], stack: str,
                                                                   name: str) -> None:
    """The rollout and the Service in front of it are awaited (that is how `pulumi up` proves the model serves),
    for at least the startup probe's whole budget plus a node from zero; the Deployment's own progress deadline
    is as long, so a replica still loading weights is not reported as a failed rollout."""
    case = served(planned, stack, name)
    startup = case.container["startupProbe"]
    loading = startup["periodSeconds"] * startup["failureThreshold"]
    assert loading >= case.model.get("startupMinutes", 30) * 60
    deployment = case.deployment
    assert "pulumi.com/skipAwait" not in deployment["metadata"].get("annotations", {})
    waited = int(deployment["metadata"]["annotations"][AWAIT_TIMEOUT])
    assert waited > loading and waited > PROVIDER_DEFAULT_SECONDS
    assert deployment["spec"]["progressDeadlineSeconds"] >= waited > DEPLOYMENT_PROGRESS_DEFAULT_SECONDS
    [service] = [s for s in case.run.of_kind("Service") if s["metadata"]["name"] == name
                 and s["spec"].get("selector")]
    assert int(service["metadata"]["annotations"][AWAIT_TIMEOUT]) >= waited
