"""The prefill/decode split of a Ray Serve model (issue 37, D2): off by default; each role tuned on its pool; Ray
2.60's P/D application with vLLM 0.29.0's NIXL connector, over UCX unless LIBFABRIC can load; what the pods
need; the placement proof, the cost report and `triarch diff` covering both roles; one line for each bad input.
The Serve config is held to Ray 2.60's own schema and to the P/D builder's own source (ray[serve]==2.60.0 in the
test extra; its LLMConfig imports vLLM, so PDServingArgs is read, not imported). Expected values are written here
by hand."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from conftest import MutatedConfig, plan_config, plan_refusal, reference_file, stack_document, write_stack_file
from test_engine_args import planned
from test_prefix_routing import TRIARCH_ROUTER, ray_deployment_options
from triarch import cli
from triarch.catalog import catalog
from triarch.config import from_pulumi_config
from triarch.diff import diff_plans
from triarch.effects import traffic_effects
from triarch.guardrails.base import Resource
from triarch.guardrails.check import evaluate, resources_of_plan
from triarch.guardrails.placement import prove
from triarch.guardrails.workloads import llm_configs
from triarch.offline import plan_document
from triarch.planners.efa import efa_image_warnings
from triarch.planners.models import plan_models
from triarch.report.summary import split_lines

RAY = Path(next(iter(importlib.util.find_spec("ray").submodule_search_locations or [])))  # type: ignore[union-attr]
PD_SOURCE = RAY / "llm" / "_internal" / "serve" / "serving_patterns" / "prefill_decode" / "builder.py"
NIXL_SOURCE = RAY / "llm" / "_internal" / "serve" / "engines" / "vllm" / "kv_transfer" / "nixl.py"
LLM_CONFIG_SOURCE = RAY / "llm" / "_internal" / "serve" / "core" / "configs" / "llm_config.py"
KV_TRANSFER_FIELDS = {"kv_connector", "engine_id", "kv_buffer_device", "kv_buffer_size", "kv_role", "kv_rank",
                      "kv_parallel_size", "kv_ip", "kv_port", "kv_connector_extra_config", "kv_connector_module_path",
                      "enable_permute_local_kv", "kv_load_failure_policy"}
"""vLLM 0.29.0's KVTransferConfig (vllm/config/kv_transfer.py in its PyPI wheel), written out by hand."""
SPLIT = {"prefill": {"replicas": 1}, "decode": {"replicas": 2}}


def split_qwen(config: dict[str, Any], **split: Any) -> None:
    """prod with qwen (Qwen3-8B on the L4 pool) split: one prefill and two decode replicas; the L4 pool's max
    raised for them (embed's two and a rollout's one, three Ray pods and a RayService upgrade's three)."""
    next(g for g in config["triarch:nodeGroups"] if g["name"] == "l4")["max"] = 10
    qwen = next(m for m in config["triarch:models"] if m["name"] == "qwen")
    qwen.pop("autoscaling")
    qwen["disaggregation"] = {**SPLIT, **split}


def applications(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    [service] = [o for o in objects if o["kind"] == "RayService"]
    document = yaml.safe_load(service["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(document)  # Ray's own schema of a Serve config
    return {app["name"]: app for app in document["applications"]}


def deployment_options(llm: dict[str, Any]) -> Any:
    """A role's deployment_config as serve.deployment takes it: Ray validates every option, and the router with
    RequestRouterConfig (test_prefix_routing's reading, the router class by its internal path)."""
    return ray_deployment_options(llm)


def class_fields(source: Path, name: str) -> set[str]:
    tree = ast.parse(source.read_text(encoding="utf-8"))
    [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    return {s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}


@pytest.fixture(scope="module")
def split_objects(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    from triarch.offline import read_stack_config
    config = stack_document("prod")
    split_qwen(config)
    path = write_stack_file(tmp_path_factory.mktemp("split") / "Pulumi.split.yaml", config)
    return planned(read_stack_config(path)[0])


# --- off by default, and Ray's own word on what is emitted ------------------------------------------------------

@pytest.mark.parametrize("stack", ["prod", "large", "dev", "fresh", "lab"])
def test_only_freshs_split_model_is_split(stack_config: Any, stack: str) -> None:
    """Off unless a model asks: the fresh stack's `split` is the one shipped split (its prefill role planned as
    `split-prefill`, over UCX: the local plane's pools have no EFA)."""
    for app in applications(planned(stack_config(stack))).values() if stack in ("prod", "large", "fresh") else []:
        split = stack == "fresh" and app["name"] == "split"
        builder = "build_pd_openai_app" if split else "build_openai_app"
        assert app["import_path"] == f"ray.serve.llm:{builder}"
    plans = plan_models(from_pulumi_config(stack_config(stack)), catalog())
    roles = {p.name: (p.role, p.kv_backend) for p in plans if p.role is not None or p.kv_backend is not None}
    assert roles == ({"split": ("decode", "UCX"), "split-prefill": ("prefill", "UCX")} if stack == "fresh" else {})


def test_the_split_model_is_rays_pd_application(split_objects: list[dict[str, Any]]) -> None:
    apps = applications(split_objects)
    qwen = apps["qwen"]
    assert qwen["import_path"] == "ray.serve.llm:build_pd_openai_app" and qwen["route_prefix"] == "/qwen"
    assert set(qwen["args"]) == {"prefill_config", "decode_config"}
    assert set(qwen["args"]) <= class_fields(PD_SOURCE, "PDServingArgs")
    assert apps["chat"]["import_path"] == "ray.serve.llm:build_openai_app"  # the other model stays whole
    prefill, decode = qwen["args"]["prefill_config"], qwen["args"]["decode_config"]
    # PDServingArgs' validators (read in the release): one model id, a kv_transfer_config on both roles
    source = PD_SOURCE.read_text(encoding="utf-8")
    assert "P/D model id mismatch" in source and "kv_transfer_config is required for P/D" in source
    assert prefill["model_loading_config"] == decode["model_loading_config"] == {
        "model_id": "qwen", "model_source": "Qwen/Qwen3-8B"}
    fields = class_fields(LLM_CONFIG_SOURCE, "LLMConfig")
    for role in (prefill, decode):
        assert set(role) <= fields
        assert deployment_options(role).max_ongoing_requests == role["engine_kwargs"]["max_num_seqs"]
        assert set(role["engine_kwargs"]) <= set(reference_file("vllm-0.29.0", "engine-args.txt")
                                                 .read_text(encoding="utf-8").split())
        assert set(role["engine_kwargs"]["kv_transfer_config"]) <= KV_TRANSFER_FIELDS
    # Ray 2.60 takes a router on each role's deployment: routed by prefix where the role has replicas to choose
    # between (decode's two), Serve's default for the one prefill replica
    assert deployment_options(decode).request_router_config.request_router_class == TRIARCH_ROUTER
    assert "request_router_config" not in prefill["deployment_config"]


def test_the_builder_is_rays_public_path() -> None:
    tree = ast.parse((RAY / "serve" / "llm" / "__init__.py").read_text(encoding="utf-8"))
    [builder] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "build_pd_openai_app"]
    assert [a.arg for a in builder.args.args] == ["pd_serving_args"]


def test_nixl_in_its_roles_with_rays_port_bases(split_objects: list[dict[str, Any]]) -> None:
    args = applications(split_objects)["qwen"]["args"]
    assert args["prefill_config"]["engine_kwargs"]["kv_transfer_config"] == {
        "kv_connector": "NixlConnector", "kv_role": "kv_producer", "kv_connector_extra_config": {"backends": ["UCX"]}}
    assert args["decode_config"]["engine_kwargs"]["kv_transfer_config"] == {
        "kv_connector": "NixlConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"backends": ["UCX"]}}
    assert args["prefill_config"]["experimental_configs"] == {"NIXL_SIDE_CHANNEL_PORT_BASE": 20000}
    assert args["decode_config"]["experimental_configs"] == {"NIXL_SIDE_CHANNEL_PORT_BASE": 22000}
    # Ray's own defaults, which Triarch writes out: the NIXL backend's base and PDServingArgs' decode base
    assert '"NIXL_SIDE_CHANNEL_PORT_BASE", 20000' in NIXL_SOURCE.read_text(encoding="utf-8")
    assert '"NIXL_SIDE_CHANNEL_PORT_BASE", 22000' in PD_SOURCE.read_text(encoding="utf-8")
    # Ray sets each replica's side channel (host and port) itself: a fixed one in the pod would collide
    for obj in split_objects:
        if obj["kind"] == "RayService":
            for group in obj["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
                env = {e["name"] for c in group["template"]["spec"]["containers"] for e in c.get("env", [])}
                assert not {"VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT"} & env


# --- the tuner sizes each role ----------------------------------------------------------------------------------

def test_each_role_is_tuned_decode_the_batch_prefill_for_throughput(split_objects: list[dict[str, Any]]) -> None:
    """Qwen3-8B on one L4, whole: a batch of 8, 2048 tokens a step, 16384-token requests (test_prefix_routing).
    Split: decode keeps that batch; prefill is no longer held to one prompt at a time (a held KV cache is not a
    running request): it takes the batch the same GPU holds at the same length, 8. Its larger step (16384) does not
    fit the L4 beside one 16384-token request, so vLLM's 2048 stays and the plan says why."""
    args = applications(split_objects)["qwen"]["args"]
    prefill, decode = args["prefill_config"], args["decode_config"]
    assert (decode["engine_kwargs"]["max_num_seqs"], decode["engine_kwargs"]["max_num_batched_tokens"]) == (8, 2048)
    assert (prefill["engine_kwargs"]["max_num_seqs"], prefill["engine_kwargs"]["max_num_batched_tokens"]) == (8, 2048)
    assert prefill["engine_kwargs"]["max_model_len"] == decode["engine_kwargs"]["max_model_len"] == 16384
    assert (prefill["deployment_config"]["num_replicas"], decode["deployment_config"]["num_replicas"]) == (1, 2)
    assert prefill["deployment_config"]["max_ongoing_requests"] == 8


def prefill_on_a100(config: dict[str, Any], **prefill: Any) -> None:
    split_qwen(config, prefill={"replicas": 2, "nodeGroup": "a100", **prefill})


def test_a_prefill_role_on_a_larger_gpu_takes_the_throughput_step_and_its_prompts(
        mutated_config: MutatedConfig) -> None:
    """Prefill on the A100 (80 GB): 16384 tokens a step (vLLM's advice for throughput is more than 8192), and as many
    prompts as its KV cache holds at the expected length, up to vLLM's 256: at 2048 tokens, its KV tokens / 2048 (to
    a multiple of 8); told to expect 8192-token prompts, a quarter of that."""
    def role(**prefill: Any) -> tuple[int, int, int]:
        config = mutated_config("prod", lambda c: prefill_on_a100(c, **prefill))
        [plan] = [p for p in plan_models(from_pulumi_config(config), catalog()) if p.name == "qwen-prefill"]
        kwargs = applications(planned(config))["qwen"]["args"]["prefill_config"]["engine_kwargs"]
        assert not plan.sizing.notes, plan.sizing.notes
        return kwargs["max_num_seqs"], kwargs["max_num_batched_tokens"], plan.sizing.kv_cache_tokens
    seqs, step, kv = role()
    assert step == 16384 and 8 < seqs <= 256 and seqs == min(256, kv // 2048 // 8 * 8)
    long_seqs, long_step, long_kv = role(promptLength=8192)
    assert long_step == 16384 and long_seqs == min(256, long_kv // 8192 // 8 * 8) and long_seqs < seqs


def test_the_prefill_step_holds_one_expected_prompt() -> None:
    """16384 tokens a step at least; a longer expected prompt is computed in one step."""
    from triarch.config.schema import DisaggregationConfig
    from triarch.planners.models import prefill_step
    assert prefill_step(DisaggregationConfig.model_validate({})) == 16384
    assert prefill_step(DisaggregationConfig.model_validate({"prefill": {"promptLength": 30000}})) == 30000
    assert prefill_step(DisaggregationConfig.model_validate({"prefill": {"promptLength": 4000}})) == 16384


def test_an_expected_prompt_as_long_as_a_request_is_refused(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(tmp_path, capsys, lambda c: split_qwen(c, prefill={"replicas": 1, "promptLength": 16384}))
    assert line == ("error: triarch:models[2].disaggregation.prefill.promptLength: 16384 leaves no room for an "
                    "answer in the 16384 tokens a request may hold (the decode role's max_model_len); allowed: "
                    "16..16383"), line


def test_each_roles_router_balances_at_its_own_batch(mutated_config: MutatedConfig) -> None:
    """Two prefill replicas on the A100 and two decode replicas on the L4 at batch 8, each role routed by prefix:
    each router balances past half its own role's batch."""
    config = mutated_config("prod", prefill_on_a100)
    args = applications(planned(config))["qwen"]["args"]
    found = {role: (args[role]["deployment_config"]["max_ongoing_requests"],
                    args[role]["deployment_config"]["request_router_config"]["request_router_kwargs"][
                        "imbalanced_threshold"]) for role in ("prefill_config", "decode_config")}
    prefill_batch = args["prefill_config"]["engine_kwargs"]["max_num_seqs"]
    assert prefill_batch > 8
    assert found == {"prefill_config": (prefill_batch, prefill_batch // 2), "decode_config": (8, 4)}


def test_a_threshold_a_roles_queues_cannot_exceed_is_refused(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """imbalancedThreshold 8 suits the prefill role's batch on the A100 but not decode's batch of 8: refused, naming
    the role."""
    def tuned(config: dict[str, Any]) -> None:
        prefill_on_a100(config)
        config["triarch:models"][2]["prefixRouting"] = {"imbalancedThreshold": 8}
    line = refused(tmp_path, capsys, tuned)
    assert line.startswith("error: triarch:models[2].prefixRouting.imbalancedThreshold: 8 is not below the 8 "
                           "requests a replica of the decode role of 'qwen' takes at once"), line


def test_each_role_scales_on_its_own_load(mutated_config: MutatedConfig, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """prefill 1 to 3 replicas, decode 2 to 4: each role's deployment gets its own autoscaling_config (Ray 2.60
    takes each LLMConfig's deployment_config, and Ray validates the options), scaling out at half the role's batch
    in flight per replica; the L4 worker group runs 3 to 7 pods (1 + 2 to 3 + 4, a pod per one-GPU replica), the
    head runs Ray's autoscaler, and the plan says each role's range."""
    def scaled(config: dict[str, Any]) -> None:
        split_qwen(config, prefill={"autoscaling": {"min": 1, "max": 3}}, decode={"autoscaling": {"min": 2, "max": 4}})
        next(g for g in config["triarch:nodeGroups"] if g["name"] == "l4")["max"] = 12  # and an upgrade's cluster
    objects = planned(mutated_config("prod", scaled))
    args = applications(objects)["qwen"]["args"]
    for role, low, high in (("prefill_config", 1, 3), ("decode_config", 2, 4)):
        deployment = args[role]["deployment_config"]
        assert deployment["autoscaling_config"] == {"min_replicas": low, "max_replicas": high,
                                                    "target_ongoing_requests": 4}
        assert "num_replicas" not in deployment
        deployment_options(args[role])
    [service] = [o for o in objects if o["kind"] == "RayService"]
    cluster = service["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    [group] = [g for g in cluster["workerGroupSpecs"] if g["groupName"] == "l4-1gpu"]
    assert (group["minReplicas"], group["maxReplicas"]) == (3, 7)
    config = stack_document("prod")
    scaled(config)
    path = write_stack_file(tmp_path / "Pulumi.scaled.yaml", config)
    assert cli.main(["plan", "--stack-file", str(path), "--out", str(tmp_path / "out")]) == 0
    assert "    qwen: prefill 1-3 x 1 GPU on 'l4' (batch 8), decode 2-4 x 1 GPU on 'l4' (batch 8);" in (
        capsys.readouterr().out)


def test_a_role_on_another_pool_is_tuned_there(mutated_config: MutatedConfig) -> None:
    """Prefill on the A100 pool (80 GB): its own tensor-parallel size and accelerator, decode's length."""
    config = mutated_config("prod", lambda c: split_qwen(c, prefill={"replicas": 1, "nodeGroup": "a100"}))
    args = applications(planned(config))["qwen"]["args"]
    assert args["prefill_config"]["accelerator_type"] == "A100"
    assert args["decode_config"]["accelerator_type"] == "L4"
    assert args["prefill_config"]["engine_kwargs"]["max_model_len"] == 16384
    plans = {p.name: p for p in plan_models(from_pulumi_config(config), catalog())}
    assert plans["qwen-prefill"].pool.name == "a100" and plans["qwen"].pool.name == "l4"
    assert plans["qwen-prefill"].role == "prefill" and plans["qwen"].role == "decode"


def test_without_a_length_the_prefill_role_takes_the_decode_roles(mutated_config: MutatedConfig) -> None:
    """No maxModelLen: decode's length is derived on the L4 (below Qwen3-8B's 40960), and prefill on the A100,
    which would derive a longer one, takes decode's: a request decode takes must fit prefill."""
    def derived(config: dict[str, Any]) -> None:
        split_qwen(config, prefill={"replicas": 1, "nodeGroup": "a100"})
        config["triarch:models"][2].pop("maxModelLen")
    args = applications(planned(mutated_config("prod", derived)))["qwen"]["args"]
    length = args["decode_config"]["engine_kwargs"]["max_model_len"]
    assert length < 40960 and args["prefill_config"]["engine_kwargs"]["max_model_len"] == length


# --- what the pods need -----------------------------------------------------------------------------------------

def efa_split(config: dict[str, Any]) -> None:
    """large with llama replaced by Qwen3-8B split on the h100 pool (p5.48xlarge, EFA on)."""
    config["triarch:models"][1] = {"name": "llama", "model": "Qwen/Qwen3-8B", "engine": "ray-serve",
                                   "nodeGroup": "h100", "disaggregation": SPLIT}


def test_over_efa_the_roles_use_ucx_and_their_gpus_share_of_the_interfaces(mutated_config: MutatedConfig) -> None:
    config = mutated_config("large", efa_split)
    objects = planned(config)
    args = applications(objects)["llama"]["args"]
    for role in ("prefill_config", "decode_config"):
        assert args[role]["engine_kwargs"]["kv_transfer_config"]["kv_connector_extra_config"] == {"backends": ["UCX"]}
    [service] = [o for o in objects if o["kind"] == "RayService"]
    [group] = [g for g in service["spec"]["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == "h100-1gpu"]
    [container] = group["template"]["spec"]["containers"]
    # p5.48xlarge: 32 EFA interfaces for 8 GPUs, so a one-GPU pod takes 4 (and 8 such pods fill a node)
    assert container["resources"]["requests"]["vpc.amazonaws.com/efa"] == "4"
    assert container["resources"]["limits"]["vpc.amazonaws.com/efa"] == "4"
    assert group["minReplicas"] == group["maxReplicas"] == 3  # one prefill, two decode
    # the nodes' EFA interfaces carry the security group open to itself (EC2's requirement for EFA traffic)
    [node_class] = [o for o in objects if o["kind"] == "EC2NodeClass" and o["metadata"]["name"] == "h100"]
    assert {"tags": {"triarch.dev/efa": "llm-large"}} in node_class["spec"]["securityGroupSelectorTerms"]
    # UCX's EFA transport links libefa.so.1 from the image, which the stock ray-llm image is not known to carry
    stack = from_pulumi_config(config)
    [warning] = [w for w in efa_image_warnings(stack, plan_models(stack, catalog())) if "'llama'" in w]
    assert warning.startswith("model 'llama' hands its KV cache between EFA pools over NIXL's UCX backend, but "
                              "rayproject/ray-llm:2.60.0-py312-cu130 is not known to carry libefa"), warning
    assert "ucx/libuct_ib_efa.so) links libefa.so.1 from the image" in warning
    assert warning.endswith("as triarch:images.rayLlm {image, release}"), warning


DLC_VLLM = "public.ecr.aws/deep-learning-containers/vllm:0.27.1-gpu-py312-cu130-ubuntu22.04-ec2"
"""An image efa-images.yaml knows to carry the EFA installer."""


def libfabric(config: dict[str, Any]) -> None:
    efa_split(config)
    config["triarch:models"][1]["disaggregation"] = {**SPLIT, "backend": "LIBFABRIC"}


def test_libfabric_is_planned_only_with_an_image_that_carries_it(mutated_config: MutatedConfig, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """NIXL's LIBFABRIC plugin links libfabric.so.1 from the image: asked for with the stock image, refused in one
    line; with an image known to carry the EFA installer, planned, and no image warning for the split."""
    line = large_refused(tmp_path, capsys, libfabric)
    assert line.startswith("error: triarch:models[1].disaggregation.backend: 'LIBFABRIC' cannot load in "
                           "rayproject/ray-llm:2.60.0-py312-cu130: NIXL's LIBFABRIC plugin in nixl-cu13 1.3.2 "
                           "(libplugin_LIBFABRIC.so) links libfabric.so.1 from the image"), line
    assert line.endswith("allowed: UCX, or an image with the EFA installer as triarch:images.rayLlm "
                         "{image, release}"), line

    def with_image(config: dict[str, Any]) -> None:
        libfabric(config)
        config["triarch:images"] = {"rayLlm": {"image": DLC_VLLM, "release": "rayproject/ray-llm:2.60.0-py312-cu130"}}
    config = mutated_config("large", with_image)
    args = applications(planned(config))["llama"]["args"]
    for role in ("prefill_config", "decode_config"):
        assert args[role]["engine_kwargs"]["kv_transfer_config"]["kv_connector_extra_config"] == {
            "backends": ["LIBFABRIC"]}
    stack = from_pulumi_config(config)
    assert not [w for w in efa_image_warnings(stack, plan_models(stack, catalog())) if "'llama'" in w]


def test_libfabric_without_efa_on_both_roles_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(tmp_path, capsys, lambda c: split_qwen(c, backend="LIBFABRIC"))
    assert line.startswith("error: triarch:models[2].disaggregation.backend: 'LIBFABRIC' moves the KV cache over "
                           "libfabric's EFA provider, but the roles' pools are not both EFA pools"), line
    assert line.endswith("allowed: UCX, or both roles on pools with efa: true"), line


def test_one_role_off_efa_hands_over_with_ucx_and_asks_for_no_interfaces(mutated_config: MutatedConfig) -> None:
    """Decode on a second p5 pool without EFA: RDMA needs both ends, so UCX, and no role asks for EFA."""
    def mixed(config: dict[str, Any]) -> None:
        efa_split(config)
        config["triarch:nodeGroups"].append({"name": "h100-tcp", "instanceType": "p5.48xlarge",
                                             "amiRelease": "v20260714", "min": 0, "max": 2})
        config["triarch:models"][1]["disaggregation"] = {**SPLIT, "decode": {"replicas": 2, "nodeGroup": "h100-tcp"}}
    objects = planned(mutated_config("large", mixed))
    args = applications(objects)["llama"]["args"]
    for role in ("prefill_config", "decode_config"):
        assert args[role]["engine_kwargs"]["kv_transfer_config"]["kv_connector_extra_config"] == {"backends": ["UCX"]}
    [service] = [o for o in objects if o["kind"] == "RayService"]
    for name in ("h100-1gpu", "h100-tcp-1gpu"):
        [group] = [g for g in service["spec"]["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == name]
        assert "vpc.amazonaws.com/efa" not in group["template"]["spec"]["containers"][0]["resources"]["requests"]


def test_the_guardrails_see_both_roles_engines(split_objects: list[dict[str, Any]]) -> None:
    """Every rule that reads a RayService's LLMConfigs (vLLM's memory, parallelism, Serve's shutdown) reads each role
    as an engine of its own."""
    [service] = [o for o in split_objects if o["kind"] == "RayService"]
    found = {app: llm["engine_kwargs"]["max_num_seqs"] for app, llm in llm_configs(service)}
    assert found == {"chat": 256, "qwen prefill": 8, "qwen decode": 8}


def test_each_roles_alerts_and_panels_read_its_own_replicas(split_objects: list[dict[str, Any]]) -> None:
    """vLLM labels both roles' series with the served model name (qwen), so each role's alerts and panels keep the
    series of its own replicas, those of its Serve deployment (Prefill:qwen, Decode:qwen, as Ray 2.60 names them),
    with its own batch; none selects a name no engine reports (qwen-prefill). The split adds its KV transfers."""
    import json
    [rules] = [o for o in split_objects if o["kind"] == "PrometheusRule"]
    alerts = {r["alert"]: r["expr"] for g in rules["spec"]["groups"] for r in g["rules"]}
    [board_map] = [o for o in split_objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "triarch-layers"]
    board = json.loads(next(iter(board_map["data"].values())))
    titles = {p["title"]: [t["expr"] for t in p.get("targets", [])] for p in board["panels"]}
    assert "qwen-prefill" not in json.dumps(rules) + json.dumps(board)
    for role, deployment, batch in (("Prefill", "Prefill:qwen", 8), ("Decode", "Decode:qwen", 8)):
        full = alerts[f"Qwen{role}KvCacheFull"]
        assert 'model_name="qwen"' in full and f'deployment="{deployment}"' in full, full
        assert f"> {batch} and" in alerts[f"Qwen{role}RequestsQueuedGpusIdle"]
        assert f'deployment="{deployment}"' in alerts[f"Qwen{role}RequestsQueuedGpusIdle"]
        [kv] = titles[f"qwen ({role.lower()}): KV cache use"]
        assert f'deployment="{deployment}"' in kv, kv
    assert not [name for name in alerts if name.startswith("QwenKvCacheFull")]
    assert "ray_vllm_nixl_xfer_time_seconds_bucket" in json.dumps(titles["qwen: KV transfer time and the first token"])
    assert {"QwenKvTransfersFailing", "QwenKvCacheExpiredUnread"} <= set(alerts)


def test_the_roles_reach_each_other_through_the_ray_pods_policy(split_objects: list[dict[str, Any]]) -> None:
    """NIXL's side channel (20000 + rank x GPUs, 22000 + ...) and UCX's own ports are picked at run time: the
    Ray pods admit each other on every port, and nothing else in."""
    [policy] = [o for o in split_objects if o["kind"] == "NetworkPolicy"
                and o["metadata"]["name"] == "allow-ray-internal"]
    ray_pods = {"matchLabels": {"ray.io/is-ray-node": "yes"}}
    assert policy["spec"] == {"podSelector": ray_pods, "policyTypes": ["Ingress"],
                              "ingress": [{"from": [{"podSelector": ray_pods}]}]}


# --- the placement proof, the cost report ----------------------------------------------------------------------

def test_the_placement_proof_covers_both_roles_on_their_pools(tmp_path: Path) -> None:
    config = stack_document("prod")
    split_qwen(config, prefill={"replicas": 1, "nodeGroup": "a100"})
    plan = plan_config("prod", config, tmp_path)
    proof = prove([Resource(r.type, r.name, r.inputs, r.urn) for r in plan.run.resources if r.custom])
    assert proof.findings == []
    placed = {p.workload.where: p for p in proof.placements}
    prefill = next(p for where, p in placed.items() if "a100-1gpu" in where)
    decode = next(p for where, p in placed.items() if "l4-1gpu" in where)
    assert prefill.pools == ["a100"] and decode.pools == ["l4"]
    assert prefill.workload.replicas == 1 and decode.workload.replicas == 2


def test_the_plan_says_the_split_and_the_cost_report_counts_both_roles(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = stack_document("prod")
    split_qwen(config)
    path = write_stack_file(tmp_path / "Pulumi.split.yaml", config)
    assert cli.main(["plan", "--stack-file", str(path), "--out", str(tmp_path / "out")]) == 0
    said = capsys.readouterr().out
    assert ("    qwen: prefill 1 x 1 GPU on 'l4' (batch 8), decode 2 x 1 GPU on 'l4' (batch 8); the KV cache crosses "
            "over NIXL's UCX backend: TCP between nodes without EFA (see the kv-transfer-over-tcp advisory)\n") in said
    assert ("prefill steps of 2048 tokens (max_num_batched_tokens), not 16384: a larger step's activations would "
            "leave NVIDIA L4 too little KV cache for one 16384-token request") in " ".join(said.split())
    import json
    capacity = json.loads((tmp_path / "out" / "capacity.json").read_text(encoding="utf-8"))
    uses = {m["name"]: m for m in capacity["models"]}
    assert (uses["qwen"]["role"], uses["qwen"]["replicasMax"], uses["qwen"]["gpusPerReplica"]) == ("decode", 2, 1)
    assert (uses["qwen-prefill"]["role"], uses["qwen-prefill"]["replicasMax"]) == ("prefill", 1)
    assert "role" not in uses["chat"]
    [l4] = [p for p in capacity["pools"] if p["name"] == "l4"]
    assert l4["gpusIdle"] == 2 + 1 + 2  # embed's two replicas, one prefill, two decode


# --- the advisory guardrail -------------------------------------------------------------------------------------

def test_a_split_without_efa_draws_the_advisory_naming_the_measured_cost(tmp_path: Path) -> None:
    config = stack_document("prod")
    split_qwen(config)
    plan = plan_config("prod", config, tmp_path)
    found = [f for f in evaluate(resources_of_plan(plan_document(plan.run))) if f.rule.name == "kv-transfer-over-tcp"]
    [finding] = found
    assert finding.enforcement == "advisory"
    assert "application qwen: prefill hands the KV cache to decode over NixlConnector with backends UCX" in \
        finding.message
    assert "about 98 s time to first token over TCP against about 1 s over EFA" in finding.message
    assert "https://docs.nvidia.com/dynamo/" in finding.message


def test_a_split_over_efa_draws_no_advisory(tmp_path: Path) -> None:
    """UCX between EFA pools: no advisory (both roles' worker groups ask for EFA), and the plan says it crosses
    over EFA."""
    config = stack_document("large")
    efa_split(config)
    plan = plan_config("large", config, tmp_path)
    found = evaluate(resources_of_plan(plan_document(plan.run)))
    assert not [f for f in found if f.rule.name == "kv-transfer-over-tcp"]
    [line] = split_lines(plan_models(from_pulumi_config(config), catalog()))
    assert line.endswith("the KV cache crosses over NIXL's UCX backend: EFA between the roles' pools"), line


# --- triarch diff -----------------------------------------------------------------------------------------------

SPLIT_EFFECT = ("the application's deployments are replaced (LLMServer:<model> by Prefill:<model> and "
                "Decode:<model>, or back), and Ray Serve stops the old ones as it starts the new")


def whole_qwen(config: dict[str, Any]) -> None:
    split_qwen(config)
    config["triarch:models"][2]["disaggregation"] = {"enabled": False}
    config["triarch:models"][2]["replicas"] = 3


@pytest.mark.parametrize(("base_edit", "head_edit", "way"), [(whole_qwen, split_qwen, "on"),
                                                              (split_qwen, whole_qwen, "off")])
def test_turning_the_split_on_or_off_replaces_the_applications_deployments(tmp_path: Path, base_edit: Any,
                                                                           head_edit: Any, way: str) -> None:
    configs = []
    for edit in (base_edit, head_edit):
        config = stack_document("prod")
        edit(config)
        configs.append(plan_document(plan_config("prod", config, tmp_path / edit.__name__).run))
    base, head = configs
    found = traffic_effects(diff_plans(base, head), base, head, None, None)
    split = [e for e in found if "prefill/decode split" in e]
    assert split == [f"RayService rayservice-llm-llm: the prefill/decode split turns {way} for qwen: {SPLIT_EFFECT}, "
                     "each old replica finishing its requests first: the model answers nothing until the new "
                     "replicas have loaded it (its cold start), and its requests in the meantime fail or wait in "
                     "the proxy"]
    assert not [e for e in found if "prefix-aware routing turns" in e]  # said once, as the split


# --- bad input: one line naming the key, exit 2 ------------------------------------------------------------------

def refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Any) -> str:
    config = stack_document("prod")
    edit(config)
    return plan_refusal(tmp_path, capsys, config)


def test_a_connector_the_pinned_vllm_lacks_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(tmp_path, capsys, lambda c: split_qwen(c, connector="P2pNcclConnector"))
    assert line.startswith("error: triarch:models[2].disaggregation.connector: 'P2pNcclConnector' is not a KV "
                           "connector of vLLM 0.29.0 (triarch:images.rayLlm "
                           "rayproject/ray-llm:2.60.0-py312-cu130)"), line
    assert "allowed: NixlConnector (vLLM 0.29.0 registers ExampleConnector," in line


def test_a_connector_triarch_does_not_plan_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(tmp_path, capsys, lambda c: split_qwen(c, connector="LMCacheConnectorV1"))
    assert line.startswith("error: triarch:models[2].disaggregation.connector: 'LMCacheConnectorV1' is a KV connector "
                           "of vLLM 0.29.0 that Triarch plans no split with (Triarch plans NixlConnector only: "
                           "LMCacheConnectorV1 needs the lmcache package"), line
    assert line.endswith("allowed: NixlConnector"), line


def test_a_pool_too_small_for_both_roles_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def too_many(config: dict[str, Any]) -> None:
        split_qwen(config, prefill={"replicas": 4}, decode={"replicas": 7})
    line = refused(tmp_path, capsys, too_many)
    assert line.startswith("error: triarch:models[2].disaggregation: 'qwen' needs 11 GPUs on node group 'l4' "
                           "(prefill 4 x 1 + decode 7 x 1 GPUs per replica), which holds 10 at most (max 10 x 1)"), line


def test_a_rayllm_image_of_an_unlisted_vllm_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def older(config: dict[str, Any]) -> None:
        split_qwen(config)
        config["triarch:images"] = {"rayLlm": "rayproject/ray-llm:2.58.0-py312-cu130"}
    line = refused(tmp_path, capsys, older)
    assert line.startswith("error: triarch:models[2].disaggregation.connector: 'NixlConnector' cannot be checked "
                           "against the vLLM of triarch:images.rayLlm (rayproject/ray-llm:2.58.0-py312-cu130: vLLM "
                           "0.26.0)"), line


def large_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Any) -> str:
    config = stack_document("large")
    edit(config)
    return plan_refusal(tmp_path, capsys, config)


def split_llama(config: dict[str, Any]) -> None:
    """large's Llama 3.1 405B (tensorParallelSize 8 x pipelineParallelSize 2 on p5.48xlarge) split."""
    config["triarch:models"][1]["disaggregation"] = {"prefill": {"replicas": 1}, "decode": {"replicas": 1}}


def split_deepseek_on_ray(config: dict[str, Any]) -> None:
    """large's DeepSeek-V3 (627 GiB of weights: the tuner spreads it over two p5.48xlarge) on Ray Serve, split."""
    deepseek = config["triarch:models"].pop(0)
    deepseek.pop("weightsUri")
    config["triarch:models"][0] = {**deepseek, "engine": "ray-serve", "disaggregation": {
        "prefill": {"replicas": 1}, "decode": {"replicas": 1}}}


def test_a_decode_role_over_pipeline_stages_is_refused_at_the_key_that_asked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM 0.29.0's NIXL consumer refuses pipeline parallelism when its engine starts; the plan refuses first, at
    the model's pipelineParallelSize, or where the tuner spread the model, at the decode role's pool."""
    line = large_refused(tmp_path, capsys, split_llama)
    assert line.startswith("error: triarch:models[1].pipelineParallelSize: 2 spreads the decode role (a NIXL "
                           "consumer) over 2 pipeline stages, which vLLM 0.29.0 refuses at engine start"), line
    assert '"consumer (decode) does not support pipeline_parallel_size > 1" (nixl/base_worker.py' in line
    assert line.endswith("allowed: 1 beside disaggregation (the decode role within one node: a pool of larger GPUs "
                         "for disaggregation.decode.nodeGroup), or disaggregation.enabled: false"), line
    line = large_refused(tmp_path, capsys, split_deepseek_on_ray)
    assert line.startswith("error: triarch:models[0].nodeGroup: 'h100' holds no decode replica within a node: the "
                           "tuner spreads the decode role (a NIXL consumer) over 2 pipeline stages"), line


def test_a_prefill_role_over_pipeline_stages_is_planned(tmp_path: Path) -> None:
    """Only the consumer is refused: DeepSeek-V3's prefill role spread over two p5.48xlarge by the tuner, its decode
    role on a pool of B200s (8 x 180 GB hold the weights in one node)."""
    config = stack_document("large")
    split_deepseek_on_ray(config)
    config["triarch:nodeGroups"].append({"name": "b200", "instanceType": "p6-b200.48xlarge",
                                         "amiRelease": "v20260714", "min": 0, "max": 2})
    config["triarch:models"][0]["disaggregation"]["decode"]["nodeGroup"] = "b200"
    args = applications(plan_config("large", config, tmp_path).objects())["deepseek"]["args"]
    assert args["decode_config"]["engine_kwargs"].get("pipeline_parallel_size", 1) == 1
    assert args["prefill_config"]["engine_kwargs"]["pipeline_parallel_size"] == 2


@pytest.mark.parametrize(("edit", "start"), [
    (lambda c: c["triarch:models"][0].update(disaggregation=SPLIT),
     "error: triarch:models[0].disaggregation.enabled: True splits prefill from decode with Ray Serve LLM's P/D"),
    (lambda c: c["triarch:models"][2].update(task="embed", disaggregation=SPLIT),
     "error: triarch:models[2].disaggregation.enabled: True splits a request's prompt from its generated tokens"),
    (lambda c: c["triarch:models"][2].update(disaggregation=SPLIT),
     "error: triarch:models[2].autoscaling: {'min': 1, 'max': 3} would be ignored beside disaggregation (each role "
     "scales on its own load); allowed: disaggregation.prefill.autoscaling and disaggregation.decode.autoscaling"),
    (lambda c: (split_qwen(c), c["triarch:models"][2].update(replicas=2)),
     "error: triarch:models[2].replicas: 2 would be ignored beside disaggregation"),
    (lambda c: split_qwen(c, prefill={"replicas": 2, "autoscaling": {"min": 1, "max": 3}}),
     "error: triarch:models[2].disaggregation.prefill.replicas: 2 would be ignored beside prefill.autoscaling"),
    (lambda c: split_qwen(c, decode={"autoscaling": {"min": 4, "max": 3}}),
     "error: triarch:models[2].disaggregation.decode.autoscaling.min: 4 is greater than autoscaling.max (3)"),
    (lambda c: split_qwen(c, prefill={"autoscaling": {"min": 1, "max": 6}}, decode={"autoscaling": {"max": 6}}),
     "error: triarch:models[2].disaggregation: 'qwen' needs 12 GPUs on node group 'l4' (prefill 6 x 1 + decode 6 x "
     "1 GPUs per replica), which holds 10 at most"),
    (lambda c: split_qwen(c, decode={"nodeGroup": "h100"}),
     "error: triarch:models[2].disaggregation.decode.nodeGroup: 'h100' is not a node group of this stack"),
    (lambda c: split_qwen(c, prefill={"tensorParallelSize": 2}),
     "error: triarch:models[2].disaggregation.prefill.tensorParallelSize: 2 exceeds the 1 GPU(s) per node of node "
     "group 'l4'"),
    (lambda c: (split_qwen(c), c["triarch:models"][1].update(name="qwen-prefill")),
     "error: triarch:models[2].name: 'qwen' names its prefill role 'qwen-prefill', which is the name of another "
     "model"),
    (lambda c: (split_qwen(c), c["triarch:models"][2].update(disaggregation={"enabled": False, "connector": "X"})),
     "error: triarch:models[2].disaggregation.connector: 'X' would be ignored: disaggregation.enabled is false"),
    (lambda c: (split_qwen(c), c["triarch:models"][2].update(disaggregation={"enabled": False,
                                                                              "backend": "LIBFABRIC"})),
     "error: triarch:models[2].disaggregation.backend: 'LIBFABRIC' would be ignored: disaggregation.enabled is false"),
])
def test_a_split_where_it_cannot_run_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Any,
                                                start: str) -> None:
    line = refused(tmp_path, capsys, edit)
    assert line.startswith(start), line
