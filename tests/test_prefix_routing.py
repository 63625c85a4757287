"""Prefix-aware routing of Ray Serve models (issue 37): on where it can pay, tunable, refused where it cannot work,
and the serve config Triarch emits checked by Ray 2.60's own schema (ray[serve]==2.60.0, the release inside the
pinned rayproject/ray-llm image), not only by ours. Expected values are written here by hand."""

from __future__ import annotations

import importlib
import inspect
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ray import serve
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
    PrefixCacheAffinityRouter as InternalRouter,
)
from ray.serve.config import RequestRouterConfig
from ray.serve.schema import ServeDeploySchema

from conftest import MutatedConfig, plan_refusal, reference_file, stack_document, stack_path
from test_engine_args import llm_configs, planned, vllm_container, with_model
from triarch.config.schema import RAY_EVICTION_THRESHOLD_CHARS
from triarch.errors import ConfigError
from triarch.offline import read_stack_config
from triarch.planners.ray import ROUTER_SOURCE, imbalance_threshold


def engine_args(release: str) -> set[str]:
    return set(reference_file(release, "engine-args.txt").read_text(encoding="utf-8").split())


TRIARCH_ROUTER = "triarch_prefix_router.ResilientPrefixRouter"
"""Triarch's router (components/triarch/ray_pods), which the Ray pods import from the ConfigMap on their PYTHONPATH;
the tests import it from the same directory."""
sys.path.insert(0, str(ROUTER_SOURCE.parent))

SHIPPED_ROUTING = {
    "prod": {"chat": True, "qwen": True},   # generate models, autoscaled to 4 and 3 replicas
    "large": {"llama": False},              # one replica: nothing to choose between
    "fresh": {"embed": False,               # an embedding model: no prompt to route on
              "split": False},              # each role one replica
    "lab": {"embed": False},
}


def serve_applications(config: dict[str, Any]) -> list[dict[str, Any]]:
    [service] = [o for o in planned(config) if o["kind"] == "RayService"]
    document = yaml.safe_load(service["spec"]["serveConfigV2"])
    assert isinstance(document, dict)
    validated = ServeDeploySchema.model_validate(document)  # Ray's own schema of a Serve config
    assert [app.name for app in validated.applications] == [app["name"] for app in document["applications"]]
    applications: list[dict[str, Any]] = document["applications"]
    return applications


def ray_deployment_options(llm: dict[str, Any]) -> Any:
    """The LLMConfig's deployment_config as Ray Serve LLM hands it to serve.deployment (LLMServer
    .get_deployment_options, Ray 2.60): Ray validates every option there, and the router config with
    RequestRouterConfig, importing the router class and serializing it."""
    options = dict(llm["deployment_config"])
    if "request_router_config" in options:
        options["request_router_config"] = RequestRouterConfig(**options["request_router_config"])
    class Stand:  # the deployment's class does not matter to its options
        pass
    return serve.deployment(Stand, **options)._deployment_config


@pytest.mark.parametrize("stack", sorted(SHIPPED_ROUTING))
def test_every_shipped_serve_config_passes_rays_own_schema(stack: str) -> None:
    config = read_stack_config(stack_path(stack))[0]
    routed = {}
    for app in serve_applications(config):
        args = app["args"]
        for llm in args.get("llm_configs") or [args[role] for role in ("prefill_config", "decode_config")]:
            options = ray_deployment_options(llm)
            routed[app["name"]] = options.request_router_config.request_router_class == TRIARCH_ROUTER
            assert options.max_ongoing_requests == llm["deployment_config"]["max_ongoing_requests"]
    assert routed == SHIPPED_ROUTING[stack]


def test_triarchs_router_is_rays_with_its_failure_paths_overridden() -> None:
    """The class the plan names is Ray 2.60's PrefixCacheAffinityRouter with the methods that read a request's text or
    call the tree actor taken over (a lost tree or a request without text is routed by load), nothing else."""
    module = importlib.import_module(TRIARCH_ROUTER.rsplit(".", 1)[0])
    router = getattr(module, TRIARCH_ROUTER.rsplit(".", 1)[1])
    assert router.__mro__[1] is InternalRouter
    own = {name for name, value in vars(router).items() if inspect.isfunction(value)}
    assert own == {"initialize_state", "routable_text", "_prefix_match_best_replicas", "on_request_routed",
                   "update_replicas", "on_replica_actor_died", "replace_tree"}
    assert own - {"routable_text", "replace_tree"} <= set(vars(InternalRouter))  # each overrides a method of Ray's


def test_the_defaults_triarch_names_as_rays_are_rays() -> None:
    defaults = {name: p.default for name, p in inspect.signature(InternalRouter.initialize_state).parameters.items()
                if name != "self"}
    assert defaults["imbalanced_threshold"] == math.inf  # never balance: why Triarch sets its own
    assert defaults["do_eviction"] is False             # never forget: why Triarch turns eviction on
    assert (defaults["match_rate_threshold"], defaults["eviction_threshold_chars"], defaults["eviction_target_chars"],
            defaults["eviction_interval_secs"]) == (0.1, 400_000, 360_000, 10)
    assert defaults["eviction_threshold_chars"] == RAY_EVICTION_THRESHOLD_CHARS


TUNED = {"imbalancedThreshold": 6, "matchRateThreshold": 0.25, "evictionThresholdChars": 2_000_000,
         "evictionTargetChars": 1_500_000, "evictionIntervalSeconds": 30}


def test_every_key_reaches_the_router_as_its_kwarg(mutated_config: MutatedConfig) -> None:
    before = llm_configs(planned(mutated_config("prod", with_model(2))))
    config = mutated_config("prod", with_model(2, prefixRouting=TUNED))
    after = llm_configs(planned(config))
    assert after["qwen"]["deployment_config"]["request_router_config"] == {
        "request_router_class": TRIARCH_ROUTER,
        "request_router_kwargs": {"imbalanced_threshold": 6, "do_eviction": True, "match_rate_threshold": 0.25,
                                  "eviction_threshold_chars": 2_000_000, "eviction_target_chars": 1_500_000,
                                  "eviction_interval_secs": 30}}
    assert after["chat"] == before["chat"]
    parameters = set(inspect.signature(InternalRouter.initialize_state).parameters)
    kwargs = after["qwen"]["deployment_config"]["request_router_config"]["request_router_kwargs"]
    assert set(kwargs) <= parameters
    options = ray_deployment_options(after["qwen"])
    assert options.request_router_config.request_router_kwargs == kwargs
    serve_applications(config)


def test_the_default_threshold_is_below_every_batch() -> None:
    """Ray 2.60's router balances when two queues differ by more than the threshold, and a replica's queue is bounded
    by its batch: half a batch rounded down, so at a batch of 1 any difference balances (0). Rounded up to 1, one
    replica took every request of a hot prompt (tests/test_dataplane_ray.py, on Ray itself)."""
    assert [imbalance_threshold(batch) for batch in (1, 2, 3, 4, 8, 9, 256)] == [0, 1, 1, 2, 4, 4, 128]


def test_by_default_the_router_balances_past_half_a_batch_and_forgets(mutated_config: MutatedConfig) -> None:
    """qwen on prod's L4 pool is tuned to a batch of 8 (max_ongoing_requests): autoscaling targets 4 per replica,
    and the router balances load once the busiest replica leads by more than that."""
    llm = llm_configs(planned(mutated_config("prod", with_model(2))))["qwen"]
    deployment = llm["deployment_config"]
    assert deployment["max_ongoing_requests"] == 8
    assert deployment["request_router_config"]["request_router_kwargs"] == {
        "imbalanced_threshold": 4, "do_eviction": True,
        # what a replica's KV cache holds: 26,368 tokens (`triarch plan --stack prod`), at 4 characters a token
        # (templates/compat/prefix-routing.yaml), and Ray's share of it, 0.9, rounded down
        "eviction_threshold_chars": 105_472, "eviction_target_chars": 94_924}


def test_the_router_remembers_per_replica_what_its_kv_cache_holds(mutated_config: MutatedConfig) -> None:
    """prod's chat caches 1,884,960 tokens a replica (DeepSeek-V2-Lite's MLA on two A100s), qwen 26,368 (Qwen3-8B on
    one L4): the one remembers about 7.5M characters of prompts, the other about 105,000, where Ray's bound is 400,000
    for both; a threshold given alone keeps the 0.9 share, a target given alone under the derived threshold is the
    stack's."""
    kwargs = {name: llm["deployment_config"]["request_router_config"]["request_router_kwargs"]
              for name, llm in llm_configs(planned(mutated_config("prod", with_model(1)))).items()
              if "request_router_config" in llm["deployment_config"]}
    assert (kwargs["chat"]["eviction_threshold_chars"], kwargs["chat"]["eviction_target_chars"]) == (
        7_539_840, 6_785_856)
    given = llm_configs(planned(mutated_config("prod", with_model(2, prefixRouting={
        "evictionThresholdChars": 50_000}))))["qwen"]["deployment_config"]["request_router_config"]
    assert (given["request_router_kwargs"]["eviction_threshold_chars"],
            given["request_router_kwargs"]["eviction_target_chars"]) == (50_000, 45_000)
    alone = llm_configs(planned(mutated_config("prod", with_model(2, prefixRouting={
        "evictionTargetChars": 100_000}))))["qwen"]["deployment_config"]["request_router_config"]
    assert (alone["request_router_kwargs"]["eviction_threshold_chars"],
            alone["request_router_kwargs"]["eviction_target_chars"]) == (105_472, 100_000)


def test_a_target_over_the_derived_threshold_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Given alone, evictionTargetChars is held to the threshold from qwen's KV cache (105,472), not Ray's 400,000."""
    line = refused(tmp_path, capsys, 2, prefixRouting={"evictionTargetChars": 200_000})
    assert line.startswith("error: triarch:models[2].prefixRouting.evictionTargetChars: 200000 is more than the "
                           "105472 characters at which eviction starts (Triarch's bound: the 26368 tokens a replica "
                           "of 'qwen' caches, at 4 characters each)"), line
    assert line.endswith("allowed: 1..105472, or evictionThresholdChars as well"), line


@pytest.mark.parametrize(("threshold", "batch"), [(8, 8), (9, 8)])
def test_a_threshold_the_queues_can_never_exceed_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            threshold: int, batch: int) -> None:
    """Two queues bounded by qwen's batch of 8 differ by 8 at most: a threshold of 8 or more never balances."""
    line = refused(tmp_path, capsys, 2, prefixRouting={"imbalancedThreshold": threshold})
    assert line.startswith(f"error: triarch:models[2].prefixRouting.imbalancedThreshold: {threshold} is not below "
                           f"the {batch} requests a replica of 'qwen' takes at once"), line
    assert line.endswith(f"allowed: 0..{batch - 1}, or remove it (half the batch)"), line


def test_a_threshold_of_zero_reaches_the_router(mutated_config: MutatedConfig) -> None:
    """0: balance on any difference (the schema allows it, and `or` must not read it as unset)."""
    llm = llm_configs(planned(mutated_config("prod", with_model(2, prefixRouting={"imbalancedThreshold": 0}))))
    kwargs = llm["qwen"]["deployment_config"]["request_router_config"]["request_router_kwargs"]
    assert kwargs["imbalanced_threshold"] == 0


def test_eviction_off_leaves_the_tree_unbounded_as_ray_does(mutated_config: MutatedConfig) -> None:
    llm = llm_configs(planned(mutated_config("prod", with_model(1, prefixRouting={"eviction": False}))))["chat"]
    kwargs = llm["deployment_config"]["request_router_config"]["request_router_kwargs"]
    assert kwargs["do_eviction"] is False and "eviction_threshold_chars" not in kwargs


def test_routing_off_leaves_serves_default_router(mutated_config: MutatedConfig) -> None:
    configs = llm_configs(planned(mutated_config("prod", with_model(1, prefixRouting={"enabled": False}))))
    assert "request_router_config" not in configs["chat"]["deployment_config"]
    assert "request_router_config" in configs["qwen"]["deployment_config"]
    assert "enable_prefix_caching" not in configs["chat"]["engine_kwargs"]  # caching stays vLLM's default: on


def test_caching_off_turns_routing_off_by_default_and_reaches_vllm(mutated_config: MutatedConfig) -> None:
    configs = llm_configs(planned(mutated_config("prod", with_model(1, prefixCaching=False))))
    assert configs["chat"]["engine_kwargs"]["enable_prefix_caching"] is False
    assert "request_router_config" not in configs["chat"]["deployment_config"]
    assert "enable_prefix_caching" in engine_args("vllm-0.29.0")  # the vLLM inside ray[llm] 2.60.0


def test_caching_off_reaches_vllm_serve_as_its_no_flag(mutated_config: MutatedConfig) -> None:
    assert "--no-enable-prefix-caching" not in vllm_container(planned(mutated_config("dev", with_model(0))),
                                                              "embed")["args"]
    args = vllm_container(planned(mutated_config("dev", with_model(0, prefixCaching=False))), "embed")["args"]
    assert args[-1] == "--no-enable-prefix-caching"
    assert "enable_prefix_caching" in engine_args("vllm-0.33.0")  # a bool EngineArgs field: --no- is its negation


def test_one_replica_gets_no_router_and_asking_for_one_is_refused(mutated_config: MutatedConfig) -> None:
    """docs/serving.md: routing by prefix buys nothing with one replica (there is no choice to make)."""
    def fixed(config: dict[str, Any]) -> None:
        config["triarch:models"][1].pop("autoscaling")
        config["triarch:models"][1]["replicas"] = 1
    assert "request_router_config" not in llm_configs(planned(mutated_config("prod", fixed)))["chat"][
        "deployment_config"]

    def asked(config: dict[str, Any]) -> None:
        fixed(config)
        config["triarch:models"][1]["prefixRouting"] = {"enabled": True}
    with pytest.raises(ConfigError) as refused:
        planned(mutated_config("prod", asked))
    assert refused.value.path == "triarch:models[1].prefixRouting.enabled" and "never has more than one" in str(
        refused.value)


def test_two_fixed_replicas_are_routed(mutated_config: MutatedConfig) -> None:
    def two(config: dict[str, Any]) -> None:
        config["triarch:models"][1].pop("autoscaling")
        config["triarch:models"][1]["replicas"] = 2
    deployment = llm_configs(planned(mutated_config("prod", two)))["chat"]["deployment_config"]
    assert deployment["num_replicas"] == 2 and "request_router_config" in deployment


# --- bad input: one line naming the key, exit 2 ------------------------------------------------------------------

def refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], index: int, **settings: Any) -> str:
    config = stack_document("prod")
    config["triarch:models"][index].update(settings)
    return plan_refusal(tmp_path, capsys, config)


def test_routing_on_with_caching_off_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(tmp_path, capsys, 1, prefixCaching=False, prefixRouting={"enabled": True})
    assert line.startswith("error: triarch:models[1].prefixRouting.enabled: True sends each request"), line
    assert "prefixCaching is false" in line
    assert line.endswith("allowed: prefixRouting.enabled: false, or prefixCaching: true"), line


def test_tuning_the_router_with_caching_off_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(tmp_path, capsys, 2, prefixCaching=False, prefixRouting={"matchRateThreshold": 0.3})
    assert "triarch:models[2].prefixRouting.enabled" in line and "prefixCaching is false" in line, line


def test_routing_a_vllm_embedding_model_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(tmp_path, capsys, 0, prefixRouting={"enabled": True})  # prod's embed, engine vllm
    assert line.startswith("error: triarch:models[0].prefixRouting.enabled: True routes by the prompt prefixes"), line
    assert line.endswith("allowed: prefixRouting.enabled: false, or task: generate"), line


def test_routing_an_embedding_model_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(tmp_path, capsys, 2, task="embed", prefixRouting={"enabled": True})
    assert line.startswith("error: triarch:models[2].prefixRouting.enabled: True routes on a request's messages"), line


def test_a_tuning_key_beside_routing_off_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(tmp_path, capsys, 1, prefixRouting={"enabled": False, "imbalancedThreshold": 8})
    assert line.startswith("error: triarch:models[1].prefixRouting.imbalancedThreshold: 8 would be ignored"), line


def test_an_eviction_key_beside_eviction_off_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(tmp_path, capsys, 1, prefixRouting={"eviction": False, "evictionIntervalSeconds": 5})
    assert line.startswith("error: triarch:models[1].prefixRouting.evictionIntervalSeconds: 5 would be ignored"), line


@pytest.mark.parametrize(("routing", "limit"), [
    ({"evictionThresholdChars": 1000, "evictionTargetChars": 1001}, "1000 characters"),
    ({"evictionTargetChars": 7_539_841}, "7539840 characters"),  # chat's derived threshold (1,884,960 tokens x 4)
])
def test_an_eviction_target_above_its_threshold_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           routing: dict[str, int], limit: str) -> None:
    line = refused(tmp_path, capsys, 1, prefixRouting=routing)
    target = routing["evictionTargetChars"]
    assert line.startswith(f"error: triarch:models[1].prefixRouting.evictionTargetChars: {target} is more than "
                           f"the {limit}"), line


def test_an_eviction_target_at_its_threshold_is_accepted(mutated_config: MutatedConfig) -> None:
    config = mutated_config("prod", with_model(1, prefixRouting={"evictionTargetChars": 7_539_840}))
    kwargs = llm_configs(planned(config))["chat"]["deployment_config"]["request_router_config"]["request_router_kwargs"]
    assert (kwargs["eviction_threshold_chars"], kwargs["eviction_target_chars"]) == (7_539_840, 7_539_840)
    both = mutated_config("prod", with_model(2, prefixRouting={"evictionThresholdChars": 50_000,
                                                               "evictionTargetChars": 50_000}))
    kwargs = llm_configs(planned(both))["qwen"]["deployment_config"]["request_router_config"]["request_router_kwargs"]
    assert (kwargs["eviction_threshold_chars"], kwargs["eviction_target_chars"]) == (50_000, 50_000)


def test_a_match_rate_above_one_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(tmp_path, capsys, 1, prefixRouting={"matchRateThreshold": 1.5})
    assert "triarch:models[1].prefixRouting.matchRateThreshold" in line, line



def test_an_embedding_model_with_replicas_to_choose_between_gets_no_router(mutated_config: MutatedConfig) -> None:
    """lab's embed on Ray Serve, at two replicas: the router would raise on its requests (no messages, no prompt)."""
    configs = llm_configs(planned(mutated_config("lab", with_model(1, replicas=2))))
    assert configs["embed"]["deployment_config"]["num_replicas"] == 2
    assert "request_router_config" not in configs["embed"]["deployment_config"]


@pytest.mark.parametrize("stack", ["prod", "fresh", "large", "lab"])
def test_every_ray_container_imports_the_router_from_the_configmap_on_its_python_path(stack: str) -> None:
    """The class path's module is a file of the ConfigMap the plan ships, holding Triarch's router source as is,
    mounted read-only in every Ray container (head and workers) at the directory on its PYTHONPATH, whether or not a
    model routes by prefix now (turning routing on then changes the Serve config alone)."""
    objects = planned(read_stack_config(stack_path(stack))[0])
    [service] = [o for o in objects if o["kind"] == "RayService"]
    [config_map] = [o for o in objects
                    if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("llm-prefix-router-")]
    assert config_map["immutable"] is True
    assert config_map["data"] == {"triarch_prefix_router.py": ROUTER_SOURCE.read_text(encoding="utf-8")}
    cluster = service["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        spec = group["template"]["spec"]
        [volume] = [v for v in spec["volumes"] if v.get("configMap", {}).get("name") == config_map["metadata"]["name"]]
        for container in spec["containers"]:
            [path] = [e["value"] for e in container["env"] if e["name"] == "PYTHONPATH"]
            [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
            assert (mount["mountPath"], mount["readOnly"]) == (path, True)
    assert len(groups) >= 2


def test_the_router_configmap_is_named_by_its_content(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Another router source, another ConfigMap name (so the pods that imported the old one are replaced with the
    template); the same source, the same name in every plan."""
    from triarch.planners import ray

    first, again = ray.router_config_map("llm"), ray.router_config_map("llm")
    assert first == again and first["metadata"]["name"] != "llm-prefix-router"
    edited = tmp_path / "triarch_prefix_router.py"
    edited.write_text(ROUTER_SOURCE.read_text(encoding="utf-8") + "\n# a change\n", encoding="utf-8")
    monkeypatch.setattr(ray, "ROUTER_SOURCE", edited)
    assert ray.router_config_map("llm")["metadata"]["name"] != first["metadata"]["name"]
