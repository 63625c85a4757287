"""The GPU instance types EKS offers (issue 36): each in the catalog with its GPU, planned and tuned by what it
holds; Trainium/Inferentia and G5g refused with the reason. Expected figures are AWS's as Karpenter v1.14's
generated instance-type reference lists them (templates/compat/instances.yaml cites it), written out here."""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import StackWriter, compat_data, stack_document
from triarch import cli
from triarch.catalog import catalog
from triarch.config import from_pulumi_config
from triarch.errors import ConfigError
from triarch.offline import read_stack_config
from triarch.planners.models import plan_models


@pytest.mark.parametrize(("name", "gpu", "gpus", "vcpus", "memory_gib", "efa"), [
    ("p5.4xlarge", "h100-80gb", 1, 16, 256, 1),
    ("p5en.48xlarge", "h200", 8, 192, 2048, 16),
    ("p6-b200.48xlarge", "b200", 8, 192, 2048, 8),
    ("g4dn.xlarge", "t4", 1, 4, 16, 0),
    ("g4dn.12xlarge", "t4", 4, 48, 192, 0),
    ("g4dn.16xlarge", "t4", 1, 64, 256, 0),
    ("g4dn.metal", "t4", 8, 96, 384, 0),
])
def test_the_new_types_hold_what_aws_lists(name: str, gpu: str, gpus: int, vcpus: int, memory_gib: int,
                                          efa: int) -> None:
    instance = catalog().instances[name]
    assert (instance.gpu, instance.gpus, instance.vcpus, instance.memory_gib, instance.efa) == \
        (gpu, gpus, vcpus, memory_gib, efa)


def test_every_gpu_of_an_instance_type_is_in_the_gpu_catalog_with_a_source() -> None:
    gpus = compat_data("gpus")["gpus"]
    for name, instance in compat_data("instances")["instances"].items():
        assert instance["gpu"] in gpus, name
        assert gpus[instance["gpu"]]["source"], name
    assert gpus["t4"]["computeCapability"] == "7.5" and gpus["t4"]["memoryMiB"] == 15360


def test_every_new_type_has_its_max_pods() -> None:
    max_pods = compat_data("node-overhead")["maxPods"]
    assert {n: max_pods[n] for n in ("p5.4xlarge", "p5en.48xlarge", "p6-b200.48xlarge", "g4dn.xlarge",
                                     "g4dn.12xlarge", "g4dn.metal")} == \
        {"p5.4xlarge": 118, "p5en.48xlarge": 198, "p6-b200.48xlarge": 198, "g4dn.xlarge": 29, "g4dn.12xlarge": 234,
         "g4dn.metal": 737}


def large_on(instance_type: str) -> dict[str, Any]:
    config = stack_document("large")
    config["triarch:nodeGroups"][0]["instanceType"] = instance_type
    return config


@pytest.mark.parametrize(("instance_type", "nodes"), [
    ("p5.48xlarge", 2),        # 8 x H100 80 GB cannot hold DeepSeek-V3's 627 GiB of weights and a KV cache
    ("p5en.48xlarge", 1),      # 8 x H200 141 GB can
    ("p6-b200.48xlarge", 1),   # 8 x B200 180 GB can
])
def test_deepseek_v3_is_sized_by_the_gpus_of_the_type(instance_type: str, nodes: int,
                                                       write_stack: StackWriter) -> None:
    stack = from_pulumi_config(read_stack_config(write_stack(large_on(instance_type)))[0])
    [plan] = [p for p in plan_models(stack, catalog()) if p.name == "deepseek"]
    assert plan.nodes_per_replica == nodes
    assert plan.sizing.tensor_parallel_size == 8
    assert plan.pool.gpu.key == catalog().instances[instance_type].gpu


def test_a_stack_on_p6_b200_plans_and_prices_what_is_recorded(write_stack: StackWriter, tmp_path: Any,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = write_stack(large_on("p6-b200.48xlarge"))
    assert cli.main(["plan", "--stack-file", str(path), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    # SkyPilot's catalog (prices.yaml, skypilot) gives p6-b200.48xlarge's us-east-1 price: $113.9328 an hour.
    assert "no price is recorded" not in out and "triarch prices refresh" not in out
    capacity = json.loads((tmp_path / "out" / "capacity.json").read_text(encoding="utf-8"))
    assert {p["instanceType"]: p["hourlyUsdPerNode"] for p in capacity["pools"]}["p6-b200.48xlarge"] == 113.9328


def test_tune_sizes_for_the_t4s_memory(capsys: pytest.CaptureFixture[str]) -> None:
    # Qwen3-8B's 16.4 GB of bf16 weights do not fit one T4's 14.58 GiB (gpus.yaml): split over two.
    assert cli.main(["tune", "--model", "Qwen/Qwen3-8B", "--gpu", "t4", "--gpus", "4", "--json"]) == 0
    sized = json.loads(capsys.readouterr().out)
    assert sized["memory"]["total"] == round(14.58 * (1 << 30))
    assert sized["engine_args"]["tensor_parallel_size"] == 2


@pytest.mark.parametrize(("instance_type", "words"), [
    ("trn1.32xlarge", "Neuron devices (aws.amazon.com/neuron), not NVIDIA GPUs"),
    ("inf2.48xlarge", "Neuron devices (aws.amazon.com/neuron), not NVIDIA GPUs"),
    ("trn2.48xlarge", "Neuron devices"),
    ("g5g.xlarge", "records no AL2023_ARM_64_NVIDIA release"),
])
def test_what_triarch_does_not_plan_is_refused_with_the_reason(instance_type: str, words: str,
                                                               write_stack: StackWriter) -> None:
    config = stack_document("dev")
    config["triarch:nodeGroups"][0]["instanceType"] = instance_type
    with pytest.raises(ConfigError) as caught:
        plan_models(from_pulumi_config(read_stack_config(write_stack(config))[0]), catalog())
    message = str(caught.value)
    assert message.startswith(f"triarch:nodeGroups[0].instanceType: {instance_type!r} is not planned by Triarch: ")
    assert words in message and "\n" not in message


def test_a_type_neither_known_nor_refused_is_still_unknown(write_stack: StackWriter) -> None:
    config = stack_document("dev")
    config["triarch:nodeGroups"][0]["instanceType"] = "p5en.24xlarge"
    with pytest.raises(ConfigError) as caught:
        plan_models(from_pulumi_config(read_stack_config(write_stack(config))[0]), catalog())
    assert "is not a known GPU instance type (did you mean 'p5en.48xlarge'?)" in str(caught.value)
