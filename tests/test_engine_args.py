"""What a model's settings in the stack file become in the workload: each setting changed from its default, and
the flag, engine kwarg, probe or security context it must reach, by both engines. Expected values are the
literals written into the stack here, never read back from the planner."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from conftest import MutatedConfig
from triarch.catalog import catalog
from triarch.config import from_pulumi_config
from triarch.planners.models import plan_models
from triarch.planners.objects import plan_kubernetes
from triarch.planners.pods import ServingSettings
from triarch.planners.vllm import serve_args, vllm_manifests


def planned(config: dict[str, str]) -> list[dict[str, Any]]:
    """Every object the stack creates, from the pure planners (no engine)."""
    stack = from_pulumi_config(config)
    return [obj for _, obj in plan_kubernetes(stack, plan_models(stack, catalog()), catalog()).owners]


def with_model(index: int, **settings: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(config: dict[str, Any]) -> None:
        config["triarch:models"][index].update(settings)
    return mutate


def flag_value(args: list[str], flag: str) -> str:
    assert args.count(flag) == 1, (flag, args)
    return args[args.index(flag) + 1]


def vllm_container(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    [deployment] = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == name]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return container


def llm_configs(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    [service] = [o for o in objects if o["kind"] == "RayService"]
    applications = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    return {app["name"]: app["args"]["llm_configs"][0] for app in applications}


# --- vLLM ------------------------------------------------------------------------------------------------------

def test_vllm_serves_the_model_under_its_stack_name(mutated_config: MutatedConfig) -> None:
    objects = planned(mutated_config("dev", with_model(0, name="embeddings")))
    args = vllm_container(objects, "embeddings")["args"]
    assert args[0] == "Qwen/Qwen3-Embedding-0.6B"
    assert flag_value(args, "--served-model-name") == "embeddings"


@pytest.mark.parametrize(("setting", "value", "flag", "expected"), [
    ("gpuMemoryUtilization", 0.85, "--gpu-memory-utilization", "0.85"),
    ("kvCacheDtype", "fp8", "--kv-cache-dtype", "fp8"),
    ("maxModelLen", 8192, "--max-model-len", "8192"),
])
def test_a_model_setting_reaches_vllm(mutated_config: MutatedConfig, setting: str, value: Any, flag: str,
                                      expected: str) -> None:
    default = flag_value(vllm_container(planned(mutated_config("dev", with_model(0))), "embed")["args"], flag)
    assert default != expected
    args = vllm_container(planned(mutated_config("dev", with_model(0, **{setting: value}))), "embed")["args"]
    assert flag_value(args, flag) == expected


def test_startup_minutes_set_the_startup_probe_and_pulumis_wait(mutated_config: MutatedConfig) -> None:
    objects = planned(mutated_config("dev", with_model(0, startupMinutes=45)))
    probe = vllm_container(objects, "embed")["startupProbe"]
    assert probe["failureThreshold"] * probe["periodSeconds"] == 45 * 60
    [deployment] = [o for o in objects if o["kind"] == "Deployment"]
    # Pulumi waits for the node and its image (the prediction's slow end, with its margin of 1.5: Karpenter's
    # 80 s to Ready + the device plugin's 90 s + 12.64 GB pulled in parallel at 180 MB/s onto the g6's instance
    # store), then the whole start-up window.
    arrival = math.ceil((80 + 90 + 12.64 * 1000 / 180) * 1.5)
    assert deployment["metadata"]["annotations"]["pulumi.com/timeoutSeconds"] == str(arrival + 45 * 60)


def test_boolean_engine_args_are_bare_flags_and_false_ones_absent(mutated_config: MutatedConfig) -> None:
    stack = from_pulumi_config(mutated_config("dev", with_model(0)))
    [model] = plan_models(stack, catalog())
    engine_args = {"tensor_parallel_size": 1, "enforce_eager": True, "enable_prefix_caching": False,
                   "max_model_len": None}
    model = dataclasses.replace(model, sizing=dataclasses.replace(model.sizing, engine_args=engine_args))
    args = serve_args(model)
    assert args[args.index("--shutdown-timeout") + 2:] == ["--tensor-parallel-size", "1", "--enforce-eager"]


def test_the_vllm_container_is_locked_down(mutated_config: MutatedConfig) -> None:
    stack = from_pulumi_config(mutated_config("dev", with_model(0)))
    [model] = plan_models(stack, catalog())
    settings = ServingSettings("llm", None, "ReadWriteOnce", with_token=False)
    [deployment] = [o for o in vllm_manifests(model, settings) if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    [container] = pod["containers"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "privileged": False,
                                            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


# --- Ray Serve -------------------------------------------------------------------------------------------------

def test_ray_serve_serves_each_model_under_its_stack_name(mutated_config: MutatedConfig) -> None:
    configs = llm_configs(planned(mutated_config("prod", with_model(1))))
    assert {name: c["model_loading_config"] for name, c in configs.items()} == {
        "chat": {"model_id": "chat", "model_source": "deepseek-ai/DeepSeek-V2-Lite-Chat"},
        "qwen": {"model_id": "qwen", "model_source": "Qwen/Qwen3-8B"}}


@pytest.mark.parametrize(("setting", "value", "kwarg"), [
    # 0.95, not less: below 0.94, qwen's 16,384 tokens on one L4 fit only at the nominal end and the plan refuses
    ("gpuMemoryUtilization", 0.95, "gpu_memory_utilization"),
    ("kvCacheDtype", "fp8", "kv_cache_dtype"),
    ("maxModelLen", 4096, "max_model_len"),
])
def test_a_model_setting_reaches_ray_serve(mutated_config: MutatedConfig, setting: str, value: Any,
                                           kwarg: str) -> None:
    before = llm_configs(planned(mutated_config("prod", with_model(2))))
    assert before["qwen"]["engine_kwargs"][kwarg] != value
    after = llm_configs(planned(mutated_config("prod", with_model(2, **{setting: value}))))
    assert after["qwen"]["engine_kwargs"][kwarg] == value
    assert after["chat"] == before["chat"]  # the other model keeps its own


def test_every_serving_container_drops_all_capabilities(mutated_config: MutatedConfig) -> None:
    objects = planned(mutated_config("prod", with_model(0)))
    templates = [o["spec"]["template"]["spec"] for o in objects if o["kind"] == "Deployment"]
    for service in (o for o in objects if o["kind"] == "RayService"):
        cluster = service["spec"]["rayClusterConfig"]
        templates += [cluster["headGroupSpec"]["template"]["spec"],
                      *(g["template"]["spec"] for g in cluster["workerGroupSpecs"])]
    containers = [c for t in templates for c in t["containers"]]
    assert len(containers) >= 3
    for container in containers:
        context = container["securityContext"]
        assert context["capabilities"] == {"drop": ["ALL"]}, container["name"]
        assert context["allowPrivilegeEscalation"] is False and context["privileged"] is False


# --- which vLLM sizes each model ---------------------------------------------------------------------------------

def test_each_model_is_sized_by_the_vllm_of_its_engines_image(mutated_config: MutatedConfig) -> None:
    """prod runs vllm/vllm-openai:v0.33.0 for the plain vLLM model and rayproject/ray-llm:2.60.0 (ray[llm] pins
    vllm 0.29.0) for the Ray Serve models; a stack that pins another image is sized by its release."""
    stack = from_pulumi_config(mutated_config("prod", lambda c: None))
    assert {m.name: (m.config.engine, m.sizing.vllm_version) for m in plan_models(stack, catalog())} == {
        "embed": ("vllm", "0.33.0"), "chat": ("ray-serve", "0.29.0"), "qwen": ("ray-serve", "0.29.0")}
    older = from_pulumi_config(mutated_config("prod", lambda c: c.setdefault("triarch:images", {}).update(
        vllm="vllm/vllm-openai:v0.29.0")))
    assert [m.sizing.vllm_version for m in plan_models(older, catalog()) if m.config.engine == "vllm"] == ["0.29.0"]
