"""Replicas larger than one node (issue 22): the tuner across nodes, a vllm replica as a LeaderWorkerSet group, a
Ray Serve replica over whole worker pods, the gang arithmetic of capacity and placement, and the refusals.

The shipped `large` stack serves DeepSeek-V3 (engine vllm, two p5 per replica: the tuner's choice) and Llama 3.1
405B FP8 (engine ray-serve, pipelineParallelSize 2)."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import (
    StackPlan,
    compat_data,
    crd_schema,
    reference_file,
    stack_document,
    stack_path,
    unknown_fields,
)
from test_placement import resources
from test_stack_checks import refusal
from test_workloads import names_in
from triarch.catalog import Gpu, catalog
from triarch.config import from_pulumi_config
from triarch.guardrails.placement import prove
from triarch.offline import read_stack_config
from triarch.planners.models import plan_models
from triarch.tuner import TuneError, load_arch
from triarch.tuner.nodes import NodesRefused, tune_nodes
from triarch.tuner.quantization import read_quantization
from triarch.tuner.units import GIB
from triarch.tuner.weights import pipeline_stages, stage_weight_bytes, weight_bytes

H100 = catalog().gpus["h100-80gb"]
LWS_LABELS = ("leaderworkerset.sigs.k8s.io/name", "leaderworkerset.sigs.k8s.io/worker-index",
              "leaderworkerset.sigs.k8s.io/group-key")


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


# --- the tuner across nodes -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("layers", "stages", "sizes"), [
    (61, 2, [31, 30]),       # vllm 0.33.0 distributed/utils.py get_pp_indices: the remainder before the last stage
    (61, 4, [15, 15, 16, 15]),
    (126, 2, [63, 63]),
    (32, 4, [8, 8, 8, 8]),
    (10, 4, [2, 3, 3, 2]),
])
def test_layers_split_over_stages_as_vllm_splits_them(layers: int, stages: int, sizes: list[int]) -> None:
    split = pipeline_stages(layers, stages)
    assert [len(s) for s in split] == sizes
    assert split[0].start == 0 and split[-1].stop == layers
    assert all(a.stop == b.start for a, b in itertools.pairwise(split))


def test_the_first_stage_holds_the_embedding_and_the_last_the_lm_head() -> None:
    """DeepSeek-V3 at PP 2: the first stage has 31 layers, 3 of them dense (smaller), and the embedding; the last
    30 MoE layers and the LM head. Both ends together are the whole model."""
    arch = load_arch("deepseek-ai/DeepSeek-V3")
    first, last = stage_weight_bytes(arch, 2)
    assert abs(first + last - weight_bytes(arch)) < GIB / 100
    assert last > first  # 30 MoE layers outweigh 28 MoE + 3 dense; the ends weigh the same (untied, same shape)
    moe = set(arch.moe_layer_indices)
    assert min(moe) == 3 and len(moe) == 58


def test_a_model_one_node_cannot_hold_spans_the_fewest_whole_nodes() -> None:
    """627 GiB of FP8 weights (DeepSeek-V3) do not fit 8 x H100 80 GB: TP 8 within a node, PP 2 across two."""
    arch = load_arch("deepseek-ai/DeepSeek-V3")
    with pytest.raises(TuneError):
        tune_nodes(arch, H100, gpus_per_node=8, max_nodes=1)
    sizing = tune_nodes(arch, H100, gpus_per_node=8, max_nodes=4, max_model_len=32768)
    assert (sizing.tensor_parallel_size, sizing.pipeline_parallel_size, sizing.nodes) == (8, 2, 2)
    assert sizing.engine_args["pipeline_parallel_size"] == 2
    assert sizing.memory.weights == max(sizing.stage_weights)  # the fullest GPU sizes every stage's KV cache
    assert sizing.kv_cache_tokens > 32768


def test_a_model_one_node_holds_stays_on_one_node() -> None:
    sizing = tune_nodes(load_arch("Qwen/Qwen3-8B"), H100, gpus_per_node=8, max_nodes=4)
    assert (sizing.nodes, sizing.pipeline_parallel_size, sizing.tensor_parallel_size) == (1, 1, 1)


def test_nodes_are_never_added_for_the_pessimistic_end_of_the_estimate() -> None:
    """Llama 3.1 70B on 8 GPUs of 24,000 MiB: TP 8 on one node holds a request of 8,192 tokens nominally, none at
    the pessimistic end. A second node is a choice of cost, as for a longer context: the one-node shape comes back
    sized for the nominal end (which `triarch plan` refuses); two nodes asked for hold it at the pessimistic end."""
    arch = load_arch("meta-llama/Llama-3.1-70B-Instruct")
    small = Gpu("test-24000", "Test GPU 24000 MiB", "test", "9.0", 24000, "12.0", True, None)
    one = tune_nodes(arch, small, gpus_per_node=8, max_nodes=3, max_model_len=8192)
    assert (one.tensor_parallel_size, one.nodes, one.sized_for, one.kv_cache_tokens_low) == (8, 1, "nominal", 0)
    assert one.fits_instead == ()  # no larger TP within a node, no shorter request, no fp8 fits there
    two = tune_nodes(arch, small, gpus_per_node=8, max_nodes=3, max_model_len=8192, tensor_parallel_size=8,
                     pipeline_parallel_size=2)
    assert (two.tensor_parallel_size, two.pipeline_parallel_size, two.nodes, two.sized_for) == (8, 2, 2,
                                                                                               "pessimistic")


def test_a_model_too_large_for_the_pools_max_names_the_nodes_it_needs() -> None:
    arch = load_arch("deepseek-ai/DeepSeek-V3")
    with pytest.raises(NodesRefused) as refused:
        tune_nodes(arch, catalog().gpus["l40s"], gpus_per_node=8, max_nodes=2)
    assert refused.value.nodes_needed == 3  # 627 GiB over 3 x 8 x 48 GB
    assert "needs" in str(refused.value.one_node) and "GiB" in str(refused.value.one_node)


def test_stages_given_keep_whole_nodes() -> None:
    """pipelineParallelSize 2 on 8-GPU nodes: TP is searched within the node, but only where the replica fills
    whole nodes (TP 4 x PP 2 = 8 GPUs, one node; TP 8 x PP 2, two)."""
    arch = load_arch("meta-llama/Llama-3.1-405B-Instruct-FP8")
    sizing = tune_nodes(arch, H100, gpus_per_node=8, max_nodes=2, pipeline_parallel_size=2,
                        tensor_parallel_size=8, max_model_len=131072)
    assert (sizing.nodes, sizing.gpus_per_node) == (2, 8)


def test_stages_given_without_tp_stay_in_a_node_where_they_fit_else_take_a_node_each() -> None:
    small = tune_nodes(load_arch("Qwen/Qwen3-8B"), H100, gpus_per_node=8, max_nodes=2, pipeline_parallel_size=2)
    assert (small.tensor_parallel_size, small.pipeline_parallel_size, small.nodes) == (1, 2, 1)
    large = tune_nodes(load_arch("deepseek-ai/DeepSeek-V3"), H100, gpus_per_node=8, max_nodes=2,
                       pipeline_parallel_size=2, max_model_len=32768)
    assert (large.tensor_parallel_size, large.pipeline_parallel_size, large.nodes) == (8, 2, 2)


def test_attention_kept_in_every_layer_counts_as_kept() -> None:
    """Meta's FP8 405B lists q/k/v/o of all 126 layers in modules_to_not_convert: vLLM loads them in BF16 (about
    450 GiB in all, Hugging Face's "8xH100 + 450GB"); the same list for some layers only stays negligible."""
    arch = load_arch("meta-llama/Llama-3.1-405B-Instruct-FP8")
    assert arch.quant_kept == ("attention",)
    assert 440 * GIB < weight_bytes(arch) < 460 * GIB
    some = {"quantization_config": {"quant_method": "fbgemm_fp8", "modules_to_not_convert": [
        f"model.layers.{i}.self_attn.q_proj" for i in range(3)]}}
    quant = read_quantization(some, num_layers=126)
    assert quant is not None and quant.kept == ()


def test_tune_cli_shows_the_stages(capsys: pytest.CaptureFixture[str]) -> None:
    from triarch import cli
    assert cli.main(["tune", "--model", "deepseek-ai/DeepSeek-V3", "--gpu", "h100-80gb", "--nodes", "2",
                     "--max-model-len", "32768"]) == 0
    out = capsys.readouterr().out
    assert "2 node(s) of 8 GPU(s): tensor_parallel_size=8 within a node, pipeline_parallel_size=2" in out
    assert "stage 0 (node 0)" in out and "+ embedding" in out and "stage 1 (node 1)" in out and "+ LM head" in out
    assert cli.main(["tune", "--model", "deepseek-ai/DeepSeek-V3", "--gpu", "l40s", "--nodes", "2"]) == 2
    err = capsys.readouterr().err
    assert "across nodes it needs 3 of 8 GPU(s)" in err


# --- the shipped large stack: a LeaderWorkerSet and a Ray Serve replica over whole pods --------------------------

@pytest.fixture(scope="module")
def large(shipped: dict[str, StackPlan]) -> StackPlan:
    return shipped["large"]


def test_a_vllm_replica_across_nodes_is_one_leaderworkerset_group(large: StackPlan) -> None:
    [lws] = large.objects("LeaderWorkerSet")
    assert lws["metadata"]["name"] == "deepseek"
    assert not [d for d in large.objects("Deployment") if d["metadata"]["name"] == "deepseek"]
    spec = lws["spec"]
    template = spec["leaderWorkerTemplate"]
    assert spec["replicas"] == 1 and template["size"] == 2
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"
    [leader] = template["leaderTemplate"]["spec"]["containers"]
    [worker] = template["workerTemplate"]["spec"]["containers"]
    for container in (leader, worker):
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"  # a whole p5 per pod
        assert flag(container["args"], "--tensor-parallel-size") == "8"
        assert flag(container["args"], "--pipeline-parallel-size") == "2"
        assert flag(container["args"], "--nnodes") == "2"
        assert flag(container["args"], "--master-addr") == "$(LWS_LEADER_ADDRESS)"
    assert flag(leader["args"], "--node-rank") == "0" and "--headless" not in leader["args"]
    assert flag(worker["args"], "--node-rank") == "$(LWS_WORKER_INDEX)" and "--headless" in worker["args"]
    assert "readinessProbe" in leader and "ports" in leader and "ports" not in worker
    [service] = [s for s in large.objects("Service") if s["metadata"]["name"] == "deepseek"]
    assert service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"  # leaders only


def test_a_groups_pods_share_a_zone_and_the_groups_spread(large: StackPlan) -> None:
    [lws] = large.objects("LeaderWorkerSet")
    template = lws["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        [term] = template[role]["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "topology.kubernetes.io/zone"
        assert term["matchLabelKeys"] == ["leaderworkerset.sigs.k8s.io/group-key"]
        assert term["labelSelector"] == {"matchLabels": {"leaderworkerset.sigs.k8s.io/name": "deepseek"}}
    spreads = template["leaderTemplate"]["spec"]["topologySpreadConstraints"]
    by_zone = next(c for c in spreads if c["topologyKey"] == "topology.kubernetes.io/zone")
    assert by_zone["labelSelector"]["matchLabels"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    # The leaders of a rolling update's new revision spread among themselves, not against the groups they replace.
    assert all(c["matchLabelKeys"] == ["leaderworkerset.sigs.k8s.io/template-revision-hash"] for c in spreads)
    assert "topologySpreadConstraints" not in template["workerTemplate"]["spec"]  # workers follow their leader


def test_the_leaderworkerset_fits_its_pinned_crd(large: StackPlan) -> None:
    schema = crd_schema("lws-v0.10.0", "crds", "leaderworkerset.x-k8s.io_leaderworkersets.yaml")
    [lws] = large.objects("LeaderWorkerSet")
    assert unknown_fields(lws, schema) == []


def test_the_gang_flags_are_vllm_033s(large: StackPlan) -> None:
    """--nnodes, --node-rank and --master-addr are EngineArgs of the pinned release; --headless is `vllm serve`'s
    own (entrypoints/common/cli_args.py), listed with its source in templates/compat/vllm-serve-flags.yaml."""
    known = names_in("vllm-0.33.0", "engine-args.txt", "frontend-args.txt") | set(
        compat_data("vllm-serve-flags")["0.33.0"])
    [lws] = large.objects("LeaderWorkerSet")
    for role in ("leaderTemplate", "workerTemplate"):
        [container] = lws["spec"]["leaderWorkerTemplate"][role]["spec"]["containers"]
        used = [a[2:].replace("-", "_") for a in container["args"] if a.startswith("--")]
        assert used and [u for u in used if u not in known] == []


def test_the_controller_is_installed_with_its_crds_apart(large: StackPlan) -> None:
    [release] = [r for r in large.of_type("kubernetes:helm.sh/v3:Release") if r.inputs.get("name") == "lws"]
    assert release.inputs["namespace"] == "lws-system"  # the CRD's conversion webhook names lws-system
    assert release.inputs["version"] == "v0.10.0" and release.inputs["skipCrds"] is True
    values = release.inputs["values"]
    assert values["image"]["manager"]["tag"] == "v0.10.0" and values["nodeSelector"] == {"triarch.dev/pool": "system"}
    crds = [r for r in large.resources if r.type == "kubernetes:yaml/v2:ConfigFile" and "lws-crd" in r.name]
    assert len(crds) == 3
    [group_policy] = [p for p in large.objects("NetworkPolicy") if p["metadata"]["name"] == "allow-group-internal"]
    assert group_policy["spec"]["ingress"] == [{"from": [{"podSelector": group_policy["spec"]["podSelector"]}]}]


def test_a_ray_replica_across_nodes_takes_whole_worker_pods(large: StackPlan) -> None:
    [service] = large.objects("RayService")
    [group] = service["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert group["groupName"] == "h100-8gpu"
    assert (group["minReplicas"], group["maxReplicas"]) == (2, 2)  # one replica, two nodes
    [container] = group["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    [app] = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    [llm] = app["args"]["llm_configs"]
    assert llm["engine_kwargs"]["tensor_parallel_size"] == 8 and llm["engine_kwargs"]["pipeline_parallel_size"] == 2
    # Ray Serve LLM's own bundles: one {GPU: 1} per worker, PACK (ray 2.60 vllm_models.py placement_bundles)
    assert "placement_group_config" not in llm


def test_placement_counts_whole_groups_with_the_rolling_updates_extra_group(large: StackPlan) -> None:
    proof = prove(resources(large))
    peaks = {p.workload.where: (p.workload.peak, p.nodes_needed) for p in proof.placements}
    assert peaks["LeaderWorkerSet deepseek leader"] == (2, 2)   # one group, plus one during a rolling update
    assert peaks["LeaderWorkerSet deepseek workers"] == (2, 2)
    assert peaks["RayService llm worker group h100-8gpu"] == (4, 4)  # and the RayService upgrade's second cluster
    assert not [f for f in proof.findings if "h100" in f.message]


# --- refusals: one line, exit 2, with the numbers ---------------------------------------------------------------

def _large() -> dict[str, Any]:
    return copy.deepcopy(stack_document("large"))


def test_a_pool_that_cannot_hold_the_gangs_and_their_upgrade_is_refused(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    config = _large()
    config["triarch:nodeGroups"][0]["max"] = 5
    line = refusal(tmp_path, config, capsys)
    # 16 GPUs for DeepSeek's group, 16 for Llama's Ray replica and 16 for the RayService upgrade's second cluster
    assert line.startswith("triarch:nodeGroups[0].max: 5 holds 40 GPU(s), but a RayService upgrade on pool 'h100' "
                           "needs 48"), line


def test_stages_that_do_not_fill_whole_nodes_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _large()
    config["triarch:models"][1].update(tensorParallelSize=4, pipelineParallelSize=3)
    line = refusal(tmp_path, config, capsys)
    assert line.startswith("triarch:models[1].pipelineParallelSize: 3 gives tensorParallelSize 4 x "
                           "pipelineParallelSize 3 = 12 GPUs, 1.5 nodes"), line


def test_a_pool_smaller_than_one_group_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _large()
    config["triarch:models"][1].update(pipelineParallelSize=16)
    line = refusal(tmp_path, config, capsys)
    assert "spreads one replica over 16 nodes" in line and "max is 8" in line, line


def test_a_model_no_node_count_of_the_pool_holds_is_refused_with_the_count_that_would(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _large()
    config["triarch:nodeGroups"][0].update(instanceType="g6e.48xlarge", max=2, efa=False,  # 8 x L40S 48 GB
                                           placementGroup=False)
    config["triarch:models"] = config["triarch:models"][:1]
    line = refusal(tmp_path, config, capsys)
    assert line.startswith("triarch:models[0]: 'deepseek-ai/DeepSeek-V3' cannot be served on node group 'h100'")
    assert "allowed: triarch:nodeGroups[0].max >= 3" in line, line


def test_an_autoscaled_vllm_model_across_nodes_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _large()
    config["triarch:observability"] = {"keda": "install"}
    config["triarch:models"][0]["autoscaling"] = {"min": 1, "max": 2}
    line = refusal(tmp_path, config, capsys)
    assert line.startswith("triarch:models[0].autoscaling:") and "spans 2 nodes" in line, line


def test_a_cache_one_node_mounts_is_refused_for_a_replica_across_nodes(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    config = _large()
    config["triarch:serving"]["accessMode"] = "ReadWriteOnce"
    line = refusal(tmp_path, config, capsys)
    assert line.startswith("triarch:serving.accessMode: 'ReadWriteOnce'") and "spans 2 nodes" in line, line


def test_stages_on_a_sliced_pool_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = copy.deepcopy(stack_document("dev"))
    config["triarch:nodeGroups"][0]["timeSlicing"] = {"replicas": 2}
    config["triarch:models"][0]["pipelineParallelSize"] = 2
    line = refusal(tmp_path, config, capsys)
    assert line.startswith("triarch:models[0].pipelineParallelSize: 2 needs 2 whole GPUs"), line


# --- EFA: close together, fast between -----------------------------------------------------------------------------

def test_an_efa_pools_nodes_get_the_efa_security_group_no_public_address_and_the_placement_group(
        large: StackPlan) -> None:
    [node_class] = large.objects("EC2NodeClass")
    spec = node_class["spec"]
    assert {"tags": {"triarch.dev/efa": "llm-large"}} in spec["securityGroupSelectorTerms"]
    assert {"tags": {"aws:eks:cluster-name": "llm-large"}} in spec["securityGroupSelectorTerms"]
    assert spec["associatePublicIPAddress"] is False
    assert spec["placementGroupSelector"] == {"name": "llm-large-h100"}
    [group] = large.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert group.inputs == {"name": "llm-large-h100", "strategy": "cluster"}
    [security] = [r for r in large.of_type("aws:ec2/securityGroup:SecurityGroup") if r.name == "karpenter-efa"]
    for direction in ("ingress", "egress"):  # all traffic to and from itself, and nothing else
        assert [(r["protocol"], r["self"], r.get("cidrBlocks")) for r in security.inputs[direction]] == [
            ("-1", True, None)]
    assert security.inputs["tags"]["triarch.dev/efa"] == "llm-large"
    # Karpenter resolves the selector itself: its role may describe placement groups where a pool has one
    # (the policy's ARNs are known only after apply, so the planner's function is checked)
    from triarch.planners.karpenter import controller_policy
    arns = {"cluster": "llm-large", "region": "us-east-1", "cluster_arn": "c", "node_role_arn": "n",
            "queue_arn": "q", "instance_profile_arn": "i"}
    assert "ec2:DescribePlacementGroups" in str(controller_policy(**arns, placement_groups=True))
    assert "ec2:DescribePlacementGroups" not in str(controller_policy(**arns))


def test_a_stack_without_efa_has_none_of_it(shipped: dict[str, StackPlan]) -> None:
    prod = shipped["prod"]
    assert not prod.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert all("placementGroupSelector" not in c["spec"] and "associatePublicIPAddress" not in c["spec"]
               for c in prod.objects("EC2NodeClass"))
    assert "efa" not in str([r.inputs.get("name") for r in prod.of_type("kubernetes:helm.sh/v3:Release")])
    assert "vpc.amazonaws.com/efa" not in yaml.safe_dump(prod.objects())


def test_a_gangs_pods_take_every_efa_interface_of_their_node_and_log_their_transport(large: StackPlan) -> None:
    [lws] = large.objects("LeaderWorkerSet")
    [service] = large.objects("RayService")
    containers = [lws["spec"]["leaderWorkerTemplate"][role]["spec"]["containers"][0]
                  for role in ("leaderTemplate", "workerTemplate")]
    containers.append(service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0])
    for container in containers:
        for side in ("requests", "limits"):
            assert container["resources"][side]["vpc.amazonaws.com/efa"] == "32"  # p5.48xlarge's 32 interfaces
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["NCCL_DEBUG"] == "INFO" and "NET" in env["NCCL_DEBUG_SUBSYS"]
        assert "IPC_LOCK" not in str(container["securityContext"])  # uid 1000 would not hold it anyway


def test_the_efa_device_plugin_runs_on_the_efa_pools_only(large: StackPlan) -> None:
    [release] = [r for r in large.of_type("kubernetes:helm.sh/v3:Release")
                 if r.inputs.get("name") == "aws-efa-k8s-device-plugin"]
    assert release.inputs["namespace"] == "aws-efa" and release.inputs["version"] == "v0.5.30"
    values = release.inputs["values"]
    assert values["supportedInstanceLabels"] == {"keys": ["triarch.dev/pool"], "values": ["h100"]}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in values["tolerations"]
    assert values["image"]["repository"] == ("602401143452.dkr.ecr.us-east-1.amazonaws.com/eks/"
                                             "aws-efa-k8s-device-plugin")  # the stack's region's copy
    [nvidia] = [r for r in large.of_type("kubernetes:helm.sh/v3:Release")
                if r.inputs.get("name") == "nvidia-device-plugin"]
    assert nvidia.inputs["values"]["mofedEnabled"] is False  # else it hands the EFA devices to GPU pods


def test_efa_over_an_image_without_its_libraries_is_warned(large: StackPlan) -> None:
    from triarch.catalog import efa_image_patterns
    warnings = [w for w in large.run.warnings if "over EFA" in w]
    assert len(warnings) == 2 and "vllm/vllm-openai:v0.33.0" in warnings[0] and "triarch:images.vllm" in warnings[0]
    dlc = "public.ecr.aws/deep-learning-containers/vllm:0.27.1-gpu-py312-cu130-ubuntu22.04-ec2"
    assert any(p.search(dlc) for p in efa_image_patterns())
    assert not any(p.search("vllm/vllm-openai:v0.33.0") for p in efa_image_patterns())


@pytest.mark.parametrize(("edit", "start"), [
    ({"instanceType": "g6e.48xlarge", "placementGroup": False}, "triarch:nodeGroups[0].efa: True asks for EFA on "
                                                                "g6e.48xlarge, which has none"),
    ({"provisioner": "managedNodeGroup", "min": 8}, "triarch:nodeGroups[0].efa: True needs a Karpenter pool"),
    ({"efa": False}, "triarch:nodeGroups[0].placementGroup: True only serves nodes that talk over EFA"),
    ({"zones": ["us-east-1a", "us-east-1b"]}, "triarch:nodeGroups[0].zones: ['us-east-1a', 'us-east-1b'] spread "
                                              "the pool over 2 zones, but a cluster placement group lives in one"),
])
def test_efa_and_placement_groups_where_they_cannot_work_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: dict[str, Any], start: str) -> None:
    config = _large()
    config["triarch:nodeGroups"][0].update(edit)
    line = refusal(tmp_path, config, capsys)
    assert line.startswith(start), line


@pytest.mark.parametrize(("log", "transport"), [
    ("NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 32 nics)\nNCCL INFO Using network Libfabric",
     "efa"),
    ("NCCL INFO Using network AWS Libfabric", "efa"),
    ("NCCL INFO NET/Plugin: Could not find: libnccl-net.so\nNCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>\n"
     "NCCL INFO Using network Socket", "tcp"),
    ("INFO: Started server process", None),
])
def test_verify_reads_the_transport_nccl_chose(log: str, transport: str | None) -> None:
    from triarch.verify.when import check_nccl, nccl_transport
    assert nccl_transport(log) == transport
    stack = from_pulumi_config(read_stack_config(stack_path("large"))[0])
    [plan] = [m for m in plan_models(stack, catalog()) if m.name == "deepseek"]
    finding = check_nccl(plan, "deepseek-0", log)
    assert finding.ok == (transport == "efa")
    assert ("TCP" in finding.message) == (transport == "tcp")


def test_the_plan_says_an_efa_pool_in_a_placement_group_lives_in_one_zone(capsys: pytest.CaptureFixture[str],
                                                                           tmp_path: Path) -> None:
    from triarch import cli
    assert cli.main(["plan", "--stack", "large", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert ("EFA: a pod across nodes takes its node's 32 interfaces; in cluster placement group llm-large-h100, so "
            "in one zone: a zone outage takes every replica") in out
    assert "8 x PP 2 (2 nodes)" in out


def test_a_plane_for_a_stack_with_stages_runs_the_leaderworkerset_controller(tmp_path: Path) -> None:
    from conftest import write_stack_file
    from triarch.local.stack import spec_for_stack
    reference_file("lws-v0.10.0", "crds", "leaderworkerset.x-k8s.io_leaderworkersets.yaml")  # the CRDs it installs

    def operators(config: dict[str, Any]) -> tuple[str, ...]:
        path = write_stack_file(tmp_path / "Pulumi.t.yaml", config)
        return spec_for_stack("t", from_pulumi_config(read_stack_config(path)[0]), []).operators

    config = copy.deepcopy(stack_document("lab"))
    assert "lws" not in operators(config)
    config["triarch:leaderWorkerSet"] = {"mode": "existing"}
    config["triarch:models"][0].update(pipelineParallelSize=2, tensorParallelSize=1)
    assert "lws" in operators(config)


def test_a_refusal_proposes_stack_keys_not_the_tuners_arguments(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 24's wording for the tuner's refusals of a stack: what to change, in the stack file's keys."""
    config = _large()
    config["triarch:nodeGroups"][0].update(instanceType="g6e.48xlarge", max=2, efa=False, placementGroup=False)
    config["triarch:models"] = config["triarch:models"][:1]
    line = refusal(tmp_path, config, capsys)
    for python in ("gpus_available", "kv_cache_dtype", "tensor_parallel_size", "pipeline_parallel_size"):
        assert python not in line, line
    assert "tensorParallelSize 8 x pipelineParallelSize 3" in line
    # Its weights leave no KV cache on one node, and fp8 KV fits no more within the pool's two: not offered.
    assert "a pool of larger GPUs or a quantized checkpoint" in line and "kvCacheDtype" not in line
