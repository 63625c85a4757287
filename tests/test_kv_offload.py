"""KV offload to host memory (issue 52, D2): `models[].kvOffload` sized by the tuner from the node's memory (what the
pod may take after the system reserve), planned as vLLM's --kv-offloading-size (engine vllm) or engine_kwargs
(ray-serve), a memory-backed /dev/shm of that size and the memory request and limit raised to match; a split's roles
offload beside NIXL in a MultiConnector; refused in one line where it cannot work; counted at $0 in the cost report;
`triarch diff` says the replicas restart. Every expected size is worked out by hand here from instances.yaml and
node-overhead.yaml (the arithmetic in each test's comment), never by the code under test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from conftest import compat_data, plan_config, plan_refusal, reference_file, stack_document, write_stack_file
from test_engine_args import flag_value, planned, vllm_container
from test_prefill_decode import KV_TRANSFER_FIELDS, RAY, applications, split_qwen
from triarch import cli
from triarch.catalog import catalog
from triarch.guardrails.base import Resource
from triarch.guardrails.check import evaluate, resources_of_plan
from triarch.guardrails.placement import prove
from triarch.local.cpu_serving import Kwargs, cpu_engine_args
from triarch.local.tiny_models import TinyModel
from triarch.offline import plan_document, read_stack_config
from triarch.tuner.offload import host_memory

GIB = 1 << 30


def objects_of(config: dict[str, Any], tmp_path: Path) -> list[dict[str, Any]]:
    return planned(read_stack_config(write_stack_file(tmp_path / "Pulumi.offload.yaml", config))[0])


def offload(config: dict[str, Any], name: str, value: dict[str, Any]) -> dict[str, Any]:
    next(m for m in config["triarch:models"] if m["name"] == name)["kvOffload"] = value
    return config


def pod_spec_of(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return cast(dict[str, Any], found["spec"]["template"]["spec"])


def worker_group(objects: list[dict[str, Any]], group: str) -> dict[str, Any]:
    [service] = [o for o in objects if o["kind"] == "RayService"]
    [found] = [g for g in service["spec"]["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == group]
    return cast(dict[str, Any], found["template"]["spec"])


def shm(spec: dict[str, Any]) -> dict[str, Any]:
    [volume] = [v for v in spec["volumes"] if v["name"] == "shm"]
    return cast(dict[str, Any], volume["emptyDir"])


def engine_arg_names(release: str) -> set[str]:
    return set(reference_file(f"vllm-{release}", "engine-args.txt").read_text(encoding="utf-8").split())


# --- the tuner's size, for named instance types ---------------------------------------------------------------------

@pytest.mark.parametrize(("instance_type", "share", "room", "engine", "size"), [
    # 32 GiB; reserve 58 pods x 11 + 255 + 100 = 993 MiB; (32768 - 993 - 1024) / 1024 = 30.03 -> 30; int(32 x 0.8) = 25
    ("g6.2xlarge", 1.0, 30, 25, 5),
    # 1152 GiB; reserve 737 x 11 + 355 = 8462 MiB; (1179648 - 8462 - 1024) x 2/8 / 1024 = 285.7 -> 285;
    # int(1152 x 0.25 x 0.8) = 230
    ("p4de.24xlarge", 0.25, 285, 230, 55),
    # 2048 GiB; reserve 100 x 11 + 355 = 1455 MiB; (2097152 - 1455 - 1024) / 1024 = 2045.6 -> 2045; int(2048 x 0.8)
    ("p5.48xlarge", 1.0, 2045, 1638, 407),
    # g6.xlarge (16 GiB, 58 pods: 993 MiB) sliced 4 ways: (16384 - 993 - 1024) x 1/4 / 1024 = 3.5 -> 3; the engine's
    # floor is 4 GiB (int(16 x 0.25 x 0.8) = 3): nothing left
    ("g6.xlarge", 0.25, 3, 4, 0),
])
def test_the_tuner_sizes_the_offload_from_what_the_pod_may_take(instance_type: str, share: float, room: int,
                                                                engine: int, size: int) -> None:
    found = host_memory(instance_type, catalog().instances[instance_type], share)
    assert (found.pod_room_gib, found.engine_gib, found.offload_gib) == (room, engine, size)


# --- engine vllm: the flag, /dev/shm, the memory limit -----------------------------------------------------------

def test_a_vllm_model_gets_the_flag_its_shm_and_its_memory(tmp_path: Path) -> None:
    """prod's embed on the L4 pool (g6.2xlarge): 5 GiB sized by the tuner (above)."""
    objects = objects_of(offload(stack_document("prod"), "embed", {}), tmp_path)
    container = vllm_container(objects, "embed")
    assert flag_value(container["args"], "--kv-offloading-size") == "5"
    assert "kv_offloading_size" in engine_arg_names("0.33.0")  # the flag of the vLLM the image bundles
    # 25 GiB the engine keeps + 5 GiB offload, requests equal to limits (Guaranteed)
    assert container["resources"]["requests"]["memory"] == container["resources"]["limits"]["memory"] == "30Gi"
    # NCCL's 2 GiB per GPU + the 5 GiB region vLLM creates in /dev/shm at start
    assert shm(pod_spec_of(objects, "Deployment", "embed")) == {"medium": "Memory", "sizeLimit": "7Gi"}
    assert {"name": "shm", "mountPath": "/dev/shm"} in container["volumeMounts"]


def test_without_kvoffload_nothing_changes(tmp_path: Path) -> None:
    objects = objects_of(stack_document("prod"), tmp_path)
    container = vllm_container(objects, "embed")
    assert "--kv-offloading-size" not in container["args"]
    assert container["resources"]["limits"]["memory"] == "25Gi"
    assert shm(pod_spec_of(objects, "Deployment", "embed"))["sizeLimit"] == "2Gi"


def test_a_given_size_is_kept(tmp_path: Path) -> None:
    objects = objects_of(offload(stack_document("prod"), "embed", {"sizeGiB": 3}), tmp_path)
    container = vllm_container(objects, "embed")
    assert flag_value(container["args"], "--kv-offloading-size") == "3"
    assert container["resources"]["limits"]["memory"] == "28Gi"
    assert shm(pod_spec_of(objects, "Deployment", "embed"))["sizeLimit"] == "5Gi"


# --- engine ray-serve: engine_kwargs and the worker group's pods ---------------------------------------------------

def test_a_ray_serve_model_gets_the_engine_kwarg_and_its_worker_group_the_memory(tmp_path: Path) -> None:
    """prod's chat (DeepSeek-V2-Lite, TP=2) on p4de.24xlarge: 55 GiB sized by the tuner (above)."""
    objects = objects_of(offload(stack_document("prod"), "chat", {}), tmp_path)
    [llm] = applications(objects)["chat"]["args"]["llm_configs"]
    assert llm["engine_kwargs"]["kv_offloading_size"] == 55
    assert "kv_offloading_size" in engine_arg_names("0.29.0")  # the vLLM of ray-llm 2.60.0
    spec = worker_group(objects, "a100-2gpu")
    [container] = spec["containers"]
    assert container["resources"]["limits"]["memory"] == container["resources"]["requests"]["memory"] == "285Gi"
    assert shm(spec) == {"medium": "Memory", "sizeLimit": "59Gi"}  # 2 x 2 GiB + 55 GiB
    # the other worker group (qwen on the L4 pool) is untouched
    assert worker_group(objects, "l4-1gpu")["containers"][0]["resources"]["limits"]["memory"] == "25Gi"


def test_a_worker_group_holds_the_largest_offload_of_its_models(tmp_path: Path) -> None:
    """embed moved to Ray Serve shares the L4 pool's one-GPU worker group with qwen, which offloads: any pod of the
    group may hold either's replica, so every pod gets qwen's 5 GiB; embed's engine gets none."""
    config = offload(stack_document("prod"), "qwen", {})
    config["triarch:models"][0]["engine"] = "ray-serve"
    next(g for g in config["triarch:nodeGroups"] if g["name"] == "l4")["max"] = 8  # a RayService upgrade's room
    objects = objects_of(config, tmp_path)
    spec = worker_group(objects, "l4-1gpu")
    assert spec["containers"][0]["resources"]["limits"]["memory"] == "30Gi" and shm(spec)["sizeLimit"] == "7Gi"
    apps = applications(objects)
    assert "kv_offloading_size" not in apps["embed"]["args"]["llm_configs"][0]["engine_kwargs"]
    assert apps["qwen"]["args"]["llm_configs"][0]["engine_kwargs"]["kv_offloading_size"] == 5


# --- a split: NIXL and the offload in one MultiConnector ------------------------------------------------------------

MULTI = {
    "prefill": {"kv_connector": "MultiConnector", "kv_role": "kv_producer",
                "kv_connector_extra_config": {"connectors": [
        {"kv_connector": "NixlConnector", "kv_role": "kv_producer", "kv_connector_extra_config": {"backends": ["UCX"]}},
        {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
         "kv_connector_extra_config": {"cpu_bytes_to_use": 5 * GIB}}]}},
    "decode": {"kv_connector": "MultiConnector", "kv_role": "kv_consumer",
               "kv_connector_extra_config": {"connectors": [
        {"kv_connector": "NixlConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"backends": ["UCX"]}},
        {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
         "kv_connector_extra_config": {"cpu_bytes_to_use": 5 * GIB}}]}},
}
"""Both roles of prod's qwen on the L4 pool, 5 GiB each (5 x 2^30 bytes, as vLLM turns GiB into cpu_bytes_to_use)."""


def test_a_split_offloads_beside_nixl_in_a_multiconnector(tmp_path: Path) -> None:
    config = stack_document("prod")
    split_qwen(config)
    objects = objects_of(offload(config, "qwen", {}), tmp_path)
    args = applications(objects)["qwen"]["args"]
    for role in ("prefill", "decode"):
        kwargs = args[f"{role}_config"]["engine_kwargs"]
        assert kwargs["kv_transfer_config"] == MULTI[role]
        # the flag would replace NIXL (vllm/config/vllm.py _post_init_kv_transfer_config): never beside a split
        assert "kv_offloading_size" not in kwargs
        for connector in [kwargs["kv_transfer_config"], *kwargs["kv_transfer_config"]["kv_connector_extra_config"][
                "connectors"]]:
            assert set(connector) <= KV_TRANSFER_FIELDS
            assert connector["kv_connector"] in compat_data("prefill-decode")["kvConnectors"]["0.29.0"]
    # Ray 2.60 has a MultiConnector backend and takes the P/D protocol from its first sub-connector
    backends = RAY / "llm" / "_internal" / "serve" / "engines" / "vllm" / "kv_transfer"
    factory = (backends / "factory.py").read_text(encoding="utf-8")
    assert '"MultiConnector": "ray.llm._internal.serve.engines.vllm.kv_transfer.multi_connector' in factory
    multi = (backends / "multi_connector.py").read_text(encoding="utf-8")
    assert "return self._connector_backends[0]" in multi
    # each role's pod holds its offload (25 + 5 GiB, /dev/shm 2 + 5 GiB)
    spec = worker_group(objects, "l4-1gpu")
    assert spec["containers"][0]["resources"]["limits"]["memory"] == "30Gi" and shm(spec)["sizeLimit"] == "7Gi"


def test_the_placement_proof_holds_the_raised_pods(tmp_path: Path) -> None:
    """The pods with their offload still fit their nodes beside the kubelet's reserve and the DaemonSets (the proof
    of `triarch check`, on the whole program's resources)."""
    config = offload(offload(stack_document("prod"), "embed", {}), "chat", {})
    plan = plan_config("prod", config, tmp_path)
    proof = prove([Resource(r.type, r.name, r.inputs, r.urn) for r in plan.run.resources if r.custom])
    assert proof.findings == []
    memory = {p.workload.where: p.workload.requests.memory_mib for p in proof.placements}
    assert 285 * 1024 in memory.values() and 30 * 1024 in memory.values()


def test_the_tcp_advisory_reads_the_roles_own_connector_inside_the_multiconnector(tmp_path: Path) -> None:
    config = stack_document("prod")
    split_qwen(config)
    plan = plan_config("prod", offload(config, "qwen", {}), tmp_path)
    [found] = [f for f in evaluate(resources_of_plan(plan_document(plan.run))) if f.rule.name == "kv-transfer-over-tcp"]
    assert "prefill hands the KV cache to decode over NixlConnector with backends UCX, TCP between nodes" in \
        found.message


# --- the cost report and the plan's words ---------------------------------------------------------------------------

def test_the_cost_report_counts_the_offload_in_the_nodes_price(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    costs = []
    for name, config in (("base", stack_document("prod")), ("head", offload(stack_document("prod"), "chat", {}))):
        path = write_stack_file(tmp_path / f"Pulumi.{name}.yaml", config)
        assert cli.main(["plan", "--stack-file", str(path), "--out", str(tmp_path / name)]) == 0
        costs.append(json.loads((tmp_path / name / "capacity.json").read_text(encoding="utf-8")))
    said = capsys.readouterr().out
    base, head = costs
    [chat] = [m for m in head["models"] if m["name"] == "chat"]
    assert chat["kvOffload"] == {"gibPerReplica": 55, "podMemoryGiB": 285, "instanceType": "p4de.24xlarge",
                                 "nodeMemoryGiB": 1152, "monthlyUsd": 0.0,
                                 "why": "host memory is in the node's price: nothing beyond the pool's nodes"}
    assert all("kvOffload" not in m for m in base["models"])
    for key in ("monthlyUsdIdle", "monthlyUsdAtMin", "monthlyUsdAtMax"):
        assert head[key] == base[key]  # no dollar more
    assert ("chat: KV offload 55 GiB of host memory per replica (--kv-offloading-size); p4de.24xlarge: 1152 GiB less "
            "8462 MiB system reserve and 1024 MiB for DaemonSets, x 0.25 of the node = 285 GiB the pod may take, of "
            "which the engine keeps 230 GiB") in said
    assert ("KV offload to host memory (in the nodes' price, $0 more; a larger instance type costs as its pool's row "
            "says): chat 55 GiB per replica (pod memory 285 GiB of a 1152 GiB p4de.24xlarge)") in said


# --- triarch diff ----------------------------------------------------------------------------------------------------

def test_diff_says_turning_offload_on_restarts_the_replicas(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    base = write_stack_file(tmp_path / "Pulumi.prod.yaml", stack_document("prod"))
    assert cli.main(["plan", "--stack-file", str(base), "--out", str(tmp_path / "base")]) == 0
    (tmp_path / "head").mkdir()
    head = write_stack_file(tmp_path / "head" / "Pulumi.prod.yaml", offload(stack_document("prod"), "embed", {}))
    capsys.readouterr()
    cli.main(["diff", "--base", str(tmp_path / "base"), "--stack-file", str(head)])
    said = " ".join(capsys.readouterr().out.split())
    assert ("model embed: KV offload to host memory turns on (5 GiB per replica): every replica restarts with the new "
            "engine arg, /dev/shm and memory limit, and the KV blocks offloaded so far are lost (they live in the old "
            "pods' memory); each new replica commits 5 GiB of its node at start") in said
    assert "Deployment deployment-llm-embed: every pod is replaced with the new pod template" in said
    assert "Engine args embed: kv_offloading_size None -> 5" in said


# --- refusals: one line, exit 2 --------------------------------------------------------------------------------------

def test_a_size_the_node_cannot_hold_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = plan_refusal(tmp_path, capsys, offload(stack_document("prod"), "embed", {"sizeGiB": 6}))
    assert line == ("error: triarch:models[0].kvOffload.sizeGiB: 6 GiB does not fit beside the engine on node group "
                    "'l4' (g6.2xlarge: 32 GiB less 993 MiB system reserve and 1024 MiB for DaemonSets, x 1 of the "
                    "node = 30 GiB the pod may take, of which the engine keeps 25 GiB: 5 GiB left); allowed: 1..5, or "
                    "a pool of an instance type with more memory per GPU")


def test_a_node_with_no_room_left_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = offload(stack_document("prod"), "embed", {})
    l4 = next(g for g in config["triarch:nodeGroups"] if g["name"] == "l4")
    l4.update(instanceType="g6.xlarge", timeSlicing={"replicas": 4})
    config["triarch:models"] = [m for m in config["triarch:models"] if m["name"] != "qwen"]
    line = plan_refusal(tmp_path, capsys, config)
    assert line.startswith("error: triarch:models[0].kvOffload: {} leaves no host memory to offload to on node group "
                           "'l4' (g6.xlarge: 16 GiB less 993 MiB system reserve and 1024 MiB for DaemonSets, x 0.25 "
                           "of the node = 3 GiB the pod may take, of which the engine keeps 4 GiB)"), line
    assert line.endswith("allowed: a pool of an instance type with more memory per GPU, or remove kvOffload"), line


def test_a_vllm_release_without_the_flag_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = offload(stack_document("prod"), "embed", {})
    config["triarch:images"] = {"vllm": "vllm/vllm-openai:v0.20.0"}
    line = plan_refusal(tmp_path, capsys, config)
    assert line == ("error: triarch:models[0].kvOffload: {} needs vLLM's --kv-offloading-size, which Triarch has not "
                    "found in vLLM 0.20.0 (the vLLM of triarch:images.vllm vllm/vllm-openai:v0.20.0; "
                    "templates/compat/kv-offload.yaml lists the releases whose engine args have it); allowed: an "
                    "image of vLLM 0.29.0, 0.33.0, or remove kvOffload")


def test_a_replica_across_nodes_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """large's llama: tensorParallelSize 8 x pipelineParallelSize 2 on p5.48xlarge, two whole nodes."""
    line = plan_refusal(tmp_path, capsys, offload(stack_document("large"), "llama", {"sizeGiB": 100}))
    assert line.startswith("error: triarch:models[1].kvOffload: {'sizeGiB': 100} offloads a replica that spans 2 nodes "
                           "of node group 'h100': every worker maps the whole region"), line
    assert line.endswith("allowed: a replica within one node (a pool with more GPUs per node), or remove kvOffload")


def test_existing_nodes_need_a_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = plan_refusal(tmp_path, capsys, offload(stack_document("local"), "embed", {}))
    assert line == ("error: triarch:models[0].kvOffload: {} sizes the offload from the node's memory, but node group "
                    "'laptop' is existing nodes whose memory Triarch does not know; allowed: kvOffload.sizeGiB: the "
                    "GiB one replica's node can spare (its memory request and limit grow by as much)")


def test_a_size_with_offload_off_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = plan_refusal(tmp_path, capsys, offload(stack_document("prod"), "embed", {"enabled": False, "sizeGiB": 4}))
    assert line == ("error: triarch:models[0].kvOffload.sizeGiB: 4 would be ignored: kvOffload.enabled is false; "
                    "allowed: remove it, or kvOffload.enabled: true")


def test_a_size_below_one_gib_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = plan_refusal(tmp_path, capsys, offload(stack_document("prod"), "embed", {"sizeGiB": 0}))
    assert line.startswith("error: triarch:models[0].kvOffload.sizeGiB: 0 "), line


# --- the releases listed, and the CPU build ---------------------------------------------------------------------------

def test_the_listed_releases_are_those_whose_engine_args_have_the_flag() -> None:
    data = yaml.safe_load(Path("templates/compat/kv-offload.yaml").read_text(encoding="utf-8"))
    assert data["releases"] == ["0.29.0", "0.33.0"]
    for release in data["releases"]:
        assert data["flag"] in engine_arg_names(release)
    # the engines' images carry listed releases (vllm 0.33.0, ray-llm 2.60.0's vLLM 0.29.0)
    images = compat_data("images")["images"]
    assert images["vllm/vllm-openai"]["v0.33.0"]["vllm"] == "0.33.0"


def test_the_cpu_data_plane_drops_the_offload_and_says_why() -> None:
    kwargs: dict[str, Any] = {"kv_offloading_size": 5, "max_num_seqs": 8}
    done = cpu_engine_args(Kwargs(kwargs), cast(TinyModel, type("Tiny", (), {"mla": False})()))
    assert "kv_offloading_size" not in kwargs
    [dropped] = [r for r in done if r.what == "engine_kwargs.kv_offloading_size"]
    assert (dropped.planned, dropped.used) == ("5", None) and "CUDA, ROCm and XPU only" in dropped.reason
    split: dict[str, Any] = {"kv_transfer_config": MULTI["decode"]}
    done = cpu_engine_args(Kwargs(split), cast(TinyModel, type("Tiny", (), {"mla": False})()))
    assert split["kv_transfer_config"] == {"kv_connector": "NixlConnector", "kv_role": "kv_consumer",
                                           "kv_connector_extra_config": {"backends": ["UCX"]}}
    assert any(r.what == "engine_kwargs.kv_transfer_config" for r in done)
