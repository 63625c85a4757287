"""What a stack must hold beyond each object being valid: no two objects claim one name, names and labels fit
Kubernetes' limits, a RayService upgrade fits the pools, drains fit a spot notice, a replica on a time-sliced
GPU is sized for its share, and the serving containers can start as uid 1000.

Each refusal is checked through `triarch plan` as a user meets it: exit code 2, one line naming the key path,
nothing written. Expected numbers are computed here from the stack files and templates/compat.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import StackPlan, compat_data, plan_config, stack_document, write_stack_file
from triarch import cli
from triarch.errors import ConfigError
from triarch.planners.capacity import spot_drain_problem
from triarch.planners.objects import Owner, check_objects

INSTANCES = compat_data("instances")["instances"]
GPUS = compat_data("gpus")["gpus"]


def refusal(tmp_path: Path, config: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line `triarch plan` prints for a stack it refuses (exit 2, nothing written)."""
    path = write_stack_file(tmp_path / "Pulumi.test.yaml", config)
    out = tmp_path / "out"
    code = cli.main(["plan", "--stack-file", str(path), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2, captured.out
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert not out.exists()
    return lines[0].removeprefix("error: ")


def add_model(config: dict[str, Any], **model: Any) -> dict[str, Any]:
    config = copy.deepcopy(config)
    config["triarch:models"].append(model)
    return config


# --- collisions, names and labels --------------------------------------------------------------------------

def test_a_model_named_like_the_ray_service_cache_is_refused(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A vLLM model `llm` would share the PersistentVolumeClaim llm-hf-cache with the RayService `llm`."""
    config = stack_document("prod")
    config["triarch:models"][0]["name"] = "llm"
    line = refusal(tmp_path, config, capsys)
    assert line.startswith("triarch:models[0].name: 'llm' gives PersistentVolumeClaim llm/llm-hf-cache"), line
    assert "RayService" in line


def test_a_model_named_like_a_kuberay_service_is_refused(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    config = stack_document("prod")
    config["triarch:models"][0]["name"] = "llm-serve-svc"
    line = refusal(tmp_path, config, capsys)
    assert line.startswith("triarch:models[0].name: 'llm-serve-svc' gives Service llm/llm-serve-svc"), line


@pytest.mark.parametrize("namespace", ["kuberay-system", "nvidia-device-plugin"])
def test_a_serving_namespace_of_another_component_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             namespace: str) -> None:
    config = stack_document("prod")
    config["triarch:serving"] = {"namespace": namespace}
    line = refusal(tmp_path, config, capsys)
    assert line.startswith(f"triarch:serving.namespace: '{namespace}' gives Namespace {namespace}"), line


def test_a_namespace_every_cluster_has_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = stack_document("dev")
    config["triarch:serving"] = {"namespace": "kube-system"}
    assert refusal(tmp_path, config, capsys).startswith("triarch:serving.namespace: 'kube-system'")


def test_long_label_values_and_names_are_refused() -> None:
    owner = Owner("triarch:models[0].name", "m")
    long_label = {"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": "m", "namespace": "llm", "labels": {"app.kubernetes.io/instance": "x" * 64}}}
    with pytest.raises(ConfigError, match="at most 63 characters"):
        check_objects([(owner, long_label)])
    check_objects([(owner, {**long_label, "metadata": {**long_label["metadata"], "labels": {"a": "x" * 63}}})])
    selector = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "m", "namespace": "llm"},
                "spec": {"template": {"spec": {"nodeSelector": {"triarch.dev/pool": "bad value"}}}}}
    with pytest.raises(ConfigError, match=r"spec\.template\.spec\.nodeSelector"):
        check_objects([(owner, selector)])
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s" * 64, "namespace": "llm"}}
    with pytest.raises(ConfigError, match="DNS label"):
        check_objects([(owner, service)])


def labels_in(value: Any) -> list[str]:
    if isinstance(value, dict):
        found = []
        for key, child in value.items():
            if key in ("labels", "matchLabels", "nodeSelector") and isinstance(child, dict):
                found += [str(v) for v in child.values()]
            else:
                found += labels_in(child)
        return found
    if isinstance(value, list):
        return [v for item in value for v in labels_in(item)]
    return []


def test_the_longest_names_the_config_allows_plan_within_kubernetes_limits(tmp_path: Path) -> None:
    """Cluster, pool and model names at the config's 32-character limit: every object is still accepted."""
    config = stack_document("prod")
    config["triarch:cluster"]["name"] = "c" * 32
    for group in config["triarch:nodeGroups"]:
        old, group["name"] = group["name"], (group["name"] + "-" + "p" * 32)[:32]
        for model in config["triarch:models"]:
            if model["nodeGroup"] == old:
                model["nodeGroup"] = group["name"]
    for model in config["triarch:models"]:
        model["name"] = (model["name"] + "-" + "m" * 32)[:32]
    plan = plan_config("prod", config, tmp_path)
    objects = plan.objects()
    assert objects
    for obj in objects:
        assert len(obj["metadata"]["name"]) <= 63, obj["metadata"]["name"]
        for value in labels_in(obj):
            assert len(value) <= 63, (obj["kind"], value)
    groups = [g for o in plan.objects("RayService") for g in o["spec"]["rayClusterConfig"]["workerGroupSpecs"]]
    assert groups and all(len(g["groupName"]) <= 63 for g in groups)


# --- a RayService upgrade fits the pools --------------------------------------------------------------------

def test_an_upgrade_that_needs_more_gpus_than_the_pool_holds_is_refused(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    config = stack_document("prod")
    l4 = next(i for i, g in enumerate(config["triarch:nodeGroups"]) if g["name"] == "l4")
    group = config["triarch:nodeGroups"][l4]
    qwen = next(m for m in config["triarch:models"] if m["name"] == "qwen")
    embed = next(m for m in config["triarch:models"] if m["name"] == "embed")
    qwen["autoscaling"]["max"] += 1
    gpus = INSTANCES[group["instanceType"]]["gpus"]
    capacity = group["max"] * gpus
    # During a NewCluster upgrade: the old Ray cluster at its largest, the new one at its smallest, the vLLM model.
    need = (qwen["autoscaling"]["max"] + qwen["autoscaling"]["min"] + embed["replicas"]) * gpus
    assert need == capacity + 1
    line = refusal(tmp_path, config, capsys)
    assert line.startswith(f"triarch:nodeGroups[{l4}].max: {group['max']} holds {capacity} GPU(s)"), line
    assert f"needs {need}" in line
    assert f"allowed: >= {need // gpus} nodes" in line


def test_an_upgrade_that_fits_exactly_is_planned(tmp_path: Path) -> None:
    config = stack_document("prod")
    qwen = next(m for m in config["triarch:models"] if m["name"] == "qwen")
    # prod: l4 holds 6 GPUs; qwen at 3 + 1 during an upgrade, embed 2: exactly 6.
    assert qwen["autoscaling"] == {"min": 1, "max": 3}
    plan = plan_config("prod", config, tmp_path)
    assert plan.objects("RayService")


def test_a_system_node_too_small_for_the_ray_head_is_refused(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """System nodes chosen as m7i.large (2 vCPU, 8 GiB) cannot hold the Ray head's 2 CPU and 8 GiB (left unset,
    they default to m7i.xlarge beside a ray-serve model: tests/test_first_hour.py)."""
    config = add_model(stack_document("dev"), name="chat", model="Qwen/Qwen3-8B", engine="ray-serve",
                       nodeGroup="l4", maxModelLen=4096)
    config["triarch:cluster"]["systemNodeGroup"]["instanceType"] = "m7i.large"
    config["triarch:nodeGroups"][0]["max"] = 3  # room for a RayService upgrade beside the vLLM model
    line = refusal(tmp_path, config, capsys)
    expected = "triarch:cluster.systemNodeGroup.instanceType: 'm7i.large' (2 vCPU, 8 GiB) cannot hold the Ray head"
    assert line.startswith(expected), line
    assert "m7i.xlarge" in line.partition("allowed: ")[2]
    config["triarch:cluster"]["systemNodeGroup"]["instanceType"] = "m7i.xlarge"
    assert plan_config("dev", config, tmp_path / "larger").objects("RayService")


# --- spot -----------------------------------------------------------------------------------------------------

def test_drains_fit_a_spot_notice(tmp_path: Path) -> None:
    """On a spot pool every GPU pod's grace period ends at least 15 s before EC2's two-minute notice runs out."""
    config = stack_document("prod")
    for group in config["triarch:nodeGroups"]:
        group["capacityType"] = "SPOT"
    plan = plan_config("prod", config, tmp_path)
    templates = [d["spec"]["template"]["spec"] for d in plan.objects("Deployment")]
    templates += [g["template"]["spec"] for r in plan.objects("RayService")
                  for g in r["spec"]["rayClusterConfig"]["workerGroupSpecs"]]
    assert len(templates) == 3
    for spec in templates:
        assert spec["terminationGracePeriodSeconds"] <= 120 - 15
    assert all(p["spec"]["template"]["spec"]["requirements"][1] == {
        "key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]} for p in plan.objects("NodePool"))


def test_a_grace_period_beyond_the_spot_notice_is_refused() -> None:
    assert spot_drain_problem(105) is None
    problem = spot_drain_problem(106)
    assert problem is not None and "106s" in problem and "at most 105s" in problem


# --- time slicing ---------------------------------------------------------------------------------------------

def sliced_dev(replicas: int) -> dict[str, Any]:
    config = stack_document("dev")
    group = config["triarch:nodeGroups"][0]
    group["instanceType"] = "g6.12xlarge"
    group["timeSlicing"] = {"replicas": replicas}
    return config


def vllm_flag(plan: StackPlan, name: str) -> str:
    [deployment] = plan.objects("Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    value: str = args[args.index(f"--{name}") + 1]
    return value


def test_a_replica_on_a_gpu_slice_is_sized_for_its_share(tmp_path: Path) -> None:
    whole = plan_config("dev", stack_document("dev"), tmp_path / "whole")
    sliced = plan_config("dev", sliced_dev(4), tmp_path / "sliced")
    assert float(vllm_flag(whole, "gpu-memory-utilization")) == 0.92
    assert float(vllm_flag(sliced, "gpu-memory-utilization")) == pytest.approx(0.92 / 4, abs=1e-4)
    assert vllm_flag(sliced, "tensor-parallel-size") == "1"


def test_a_model_too_large_for_its_slice_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An eighth of an 8 GB GPU: even eager mode and the smallest batch leave no KV cache (a quarter fits with
    them: tests/test_tuner_remedies.py)."""
    config = stack_document("local")
    config["triarch:nodeGroups"][0].update(taint=True, timeSlicing={"replicas": 8})
    line = refusal(tmp_path, config, capsys)
    assert line.startswith("triarch:models[0]: 'Qwen/Qwen3-Embedding-0.6B' cannot be served on node group 'laptop'")
    assert "1/8 of each GPU" in line and "gpu_memory_utilization 0.115" in line, line
    assert "eager mode and a smaller batch were tried too" in line, line
    assert "try fewer timeSlicing replicas per GPU (a bigger slice)" in line, line
    assert "more GPUs per node" not in line, line


def test_tensor_parallelism_on_a_sliced_pool_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = sliced_dev(2)
    config["triarch:models"][0]["tensorParallelSize"] = 2
    line = refusal(tmp_path, config, capsys)
    assert line.startswith("triarch:models[0].tensorParallelSize: 2 needs whole GPUs"), line


# --- uid 1000 and the serving images ------------------------------------------------------------------------

@pytest.mark.parametrize("stack", ["dev", "prod", "local"])
def test_every_serving_container_has_a_user_name(shipped: dict[str, StackPlan], stack: str) -> None:
    """uid 1000 has no passwd entry in the vLLM image; PyTorch's getpass.getuser() then fails unless LOGNAME or
    USER is set (vllm-project/vllm#44548). HOME must be writable too."""
    containers = [c for d in shipped[stack].objects("Deployment") for c in d["spec"]["template"]["spec"]["containers"]]
    for service in shipped[stack].objects("RayService"):
        cluster = service["spec"]["rayClusterConfig"]
        specs = [cluster["headGroupSpec"]["template"]["spec"],
                 *(g["template"]["spec"] for g in cluster["workerGroupSpecs"])]
        containers += [c for spec in specs for c in spec["containers"]]
    assert containers
    for container in containers:
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert env.get("USER") and env.get("LOGNAME"), container["name"]
        assert env.get("HOME") == "/tmp", container["name"]
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert "/tmp" in mounts


def test_plans_are_deterministic(shipped: dict[str, StackPlan], tmp_path: Path) -> None:
    again = plan_config("prod", stack_document("prod"), tmp_path)
    first = [(r.type, r.name, json.dumps(r.inputs, sort_keys=True)) for r in shipped["prod"].resources]
    second = [(r.type, r.name, json.dumps(r.inputs, sort_keys=True)) for r in again.resources]
    assert sorted(first) == sorted(second)
    assert yaml.safe_dump(shipped["prod"].objects("RayService")) == yaml.safe_dump(again.objects("RayService"))


# --- never yes to what may not start (issue 36) ------------------------------------------------------------------

def _llama_70b_on_a100(**model: Any) -> dict[str, Any]:
    """prod with its chat model swapped for Llama 3.1 70B (8 x A100 80 GB per node, up to 2 nodes)."""
    config = stack_document("prod")
    chat = config["triarch:models"][1]
    chat.pop("tensorParallelSize")
    chat.pop("maxModelLen")
    chat.update(model="meta-llama/Llama-3.1-70B-Instruct", autoscaling={"min": 1, "max": 2}, **model)
    return config


def test_a_model_that_fits_only_at_the_nominal_end_is_refused_with_what_fits(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refusal(tmp_path, _llama_70b_on_a100(tensorParallelSize=2), capsys)
    assert line == ("triarch:models[1]: 'meta-llama/Llama-3.1-70B-Instruct' may not start on node group 'a100' "
                    "(NVIDIA A100-SXM4-80GB): at the pessimistic end of the memory estimate one request of "
                    "max_model_len 8192 does not fit (0 tokens of KV cache at tensorParallelSize 2): vLLM may refuse "
                    "to start; allowed: what fits there: tensorParallelSize: 4")


def test_a_length_asked_for_that_fits_only_nominally_is_refused_with_a_shorter_one_and_fp8(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Qwen3-8B on prod's one-L4 nodes: 17,936 tokens fit one request at the pessimistic end (test_tuner)."""
    config = stack_document("prod")
    config["triarch:models"][2]["maxModelLen"] = 20000
    line = refusal(tmp_path, config, capsys)
    assert line.startswith("triarch:models[2]: 'Qwen/Qwen3-8B' may not start on node group 'l4' (NVIDIA L4)"), line
    assert line.endswith("allowed: what fits there: maxModelLen: 17936, kvCacheDtype: fp8 or more GPUs per replica "
                         "(a pool with more GPUs per node, or more nodes with pipelineParallelSize)"), line


def test_the_70b_left_to_the_tuner_plans_at_four_gpus_with_a_length_that_fits_at_the_pessimistic_end(
        tmp_path: Path) -> None:
    from triarch.catalog import catalog
    from triarch.config import from_pulumi_config
    from triarch.offline import read_stack_config
    from triarch.planners.models import plan_models

    path = write_stack_file(tmp_path / "Pulumi.llama.yaml", _llama_70b_on_a100())
    [chat] = [m for m in plan_models(from_pulumi_config(read_stack_config(path)[0]), catalog()) if m.name == "chat"]
    sizing = chat.sizing
    assert sizing.tensor_parallel_size == 4 and chat.gpus_per_replica == 4 and sizing.sized_for == "pessimistic"
    assert sizing.max_model_len is not None and sizing.kv_cache_tokens_low >= sizing.max_model_len
