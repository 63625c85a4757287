"""Pins of the numbers a refusal suggests and of what a prefill/decode split fits (issue 53): each expected value is
written by hand from the docs, or computed here from the data files' raw facts (a model's config.json in
templates/models, templates/compat/vllm-releases.yaml, templates/compat/instances.yaml) by the documented formula,
never by the code under test. Each suggestion is also followed where it says a stack or a flag would plan."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from conftest import COMPAT_DIR, ROOT, stack_document, write_stack_file
from test_first_hour import MINIMAL
from triarch import cli

Config = dict[str, Any]
MIB = 1024**2
GIB = 1024**3
BLOCK = 16
"""vLLM's default block size (tokens per KV page), the one `triarch tune` sizes with unless told."""


def model_config(model: str) -> dict[str, Any]:
    """A model's config.json as the catalog keeps it (templates/models/<org>--<name>.json)."""
    data: dict[str, Any] = json.loads((ROOT / "templates" / "models" / f"{model.replace('/', '--')}.json").read_text())
    return data


def kv_bytes_per_token(model: str, tp: int) -> int:
    """Full attention's KV cache per token and GPU: K and V x layers x the KV heads a rank holds x head_dim x 2
    bytes (bf16), head_dim = hidden_size / num_attention_heads (Llama's config names none)."""
    c = model_config(model)
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    return int(2 * c["num_hidden_layers"] * (c["num_key_value_heads"] // tp) * head_dim * 2)


def llama_parameters(model: str) -> int:
    """A Llama checkpoint's parameters from its config: untied embedding and LM head, per layer q/o (hidden^2),
    k/v (hidden x kv_heads x head_dim), gate/up/down (hidden x intermediate) and two RMSNorms, and the final norm."""
    c = model_config(model)
    h, layers = c["hidden_size"], c["num_hidden_layers"]
    kv = c["num_key_value_heads"] * (h // c["num_attention_heads"])
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * c["intermediate_size"] + 2 * h
    return int(layers * per_layer + 2 * c["vocab_size"] * h + h)


def null_block(release: str) -> int:
    """1 where the release's admission check leaves out the block pool's null block (vllm-releases.yaml)."""
    data = yaml.safe_load((COMPAT_DIR / "vllm-releases.yaml").read_text())
    return 1 if data["releases"][release]["nullBlockReserved"] else 0


def tune(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """`triarch tune` with these flags: its exit code and its error line (empty when it sizes)."""
    code = cli.main(["tune", *args])
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return code, err


def plan(tmp_path: Path, config: Config, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`triarch plan` of a stack: its exit code and its error line (empty when it plans)."""
    path = write_stack_file(tmp_path / "Pulumi.pins.yaml", config)
    code = cli.main(["plan", "--stack-file", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    return code, lines[0] if lines else ""


# --- a length the KV cache cannot hold: "ask for at most N" -----------------------------------------------------

KV_BUDGET = 4_000_000_000
"""`--kv-cache-memory-bytes`: the KV cache is this budget exactly, whatever the memory profile (docs/tuning.md), so
its blocks are budget // (block x KV bytes per token), at both ends of the estimate."""
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def _length_args(length: int, release: str) -> list[str]:
    return ["--model", LLAMA_8B, "--gpu", "h100-80gb", "--tensor-parallel-size", "1", "--kv-cache-memory-bytes",
            str(KV_BUDGET), "--max-model-len", str(length), "--vllm-version", release]


@pytest.mark.parametrize("release", ["0.33.0", "0.19.0"])
def test_a_length_refusal_names_the_longest_request_the_kv_cache_holds(release: str,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-3.1-8B (32 layers, 8 KV heads of 128, bf16: 128 KiB a token) in a 4 GB KV cache at TP 1: 1907 blocks
    of 16 tokens; one request may take them all but the null block where the release reserves it (0.33.0: 30496
    tokens; 0.19.0: 30512). fp8 halves a token: 3814 blocks still hold no 131072-token request, so it is not
    offered."""
    blocks = KV_BUDGET // (BLOCK * kv_bytes_per_token(LLAMA_8B, tp=1))
    most = (blocks - null_block(release)) * BLOCK
    assert (blocks, most) == (1907, {"0.33.0": 30496, "0.19.0": 30512}[release])  # the arithmetic, by hand
    code, line = tune(capsys, *_length_args(131072, release))
    assert code == 2, line
    assert line.startswith(f"error: max_model_len 131072 does not fit: the KV cache holds {blocks * BLOCK} tokens "
                           f"({blocks} blocks) at tensor_parallel_size=1"), line
    assert f"; ask for at most {most}, more GPUs (--gpus; --kv-cache-dtype fp8 would not hold it either)" in line, line


@pytest.mark.parametrize("release", ["0.33.0", "0.19.0"])
def test_the_length_a_refusal_suggests_is_the_boundary(release: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Followed, "ask for at most N" sizes (exit 0); one token more is refused again: N is the longest, not a
    guess below it (the same hand-computed N as above)."""
    blocks = KV_BUDGET // (BLOCK * kv_bytes_per_token(LLAMA_8B, tp=1))
    most = (blocks - null_block(release)) * BLOCK
    code, line = tune(capsys, *_length_args(most, release))
    assert code == 0, line
    code, line = tune(capsys, *_length_args(most + 1, release))
    assert code == 2 and f"ask for at most {most}," in line, line


def test_a_length_fp8_would_hold_offers_fp8_first(capsys: pytest.CaptureFixture[str]) -> None:
    """40000 tokens need 2500 blocks: bf16's 1906 usable do not hold them, fp8's 3813 (the same 4 GB at one byte per
    element) do, so the refusal offers fp8 before more GPUs (remedies.py LENGTH_HINT, in the CLI's flags)."""
    fp8_blocks = KV_BUDGET // (BLOCK * kv_bytes_per_token(LLAMA_8B, tp=1) // 2)
    assert math.ceil(40000 / BLOCK) <= fp8_blocks - 1
    code, line = tune(capsys, *_length_args(40000, "0.33.0"))
    assert code == 2 and line.endswith("ask for at most 30496, --kv-cache-dtype fp8 or more GPUs (--gpus)"), line


# --- weights larger than the GPU: the numbers of the refusal -----------------------------------------------------

@pytest.mark.parametrize("gpus", [1, 2])
def test_a_weights_refusal_says_the_weights_and_the_block_it_could_not_place(
        gpus: int, capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-3.1-70B on L4s: 70.55B bf16 parameters are 131.4 GiB (65.7 a GPU at TP 2); a block of 16 tokens is
    16 x 2 x 80 layers x (8 KV heads / TP) x 128 x 2 bytes: 5.0 MiB at TP 1, 2.5 at TP 2. The refusal names the
    largest TP the GPUs allow, and offers no KV setting (the weights alone do not fit)."""
    model = "meta-llama/Llama-3.1-70B-Instruct"
    total = llama_parameters(model) * 2
    block_mib = BLOCK * kv_bytes_per_token(model, tp=gpus) / MIB
    code, line = tune(capsys, "--model", model, "--gpu", "l4", "--gpus", str(gpus))
    assert code == 2, line
    assert line.startswith(f"error: {model} needs {total / gpus / GIB:.1f} GiB of weights per GPU "
                           f"(tensor_parallel_size={gpus}, the most {gpus} GPU(s) allow; {total / GIB:.1f} GiB in "
                           "all); NVIDIA L4"), line
    assert f"(one block of 16 tokens needs {block_mib:.1f} MiB)" in line, line
    assert "fp8" not in line and "a quantized checkpoint" in line, line


# --- pools too small: ">= N nodes" on nodes of several GPUs --------------------------------------------------------

def four_gpu_pool(**model: Any) -> Config:
    """test_first_hour's minimal stack on one g6.12xlarge (4 x L4, templates/compat/instances.yaml), its model
    updated."""
    config = cast(Config, copy.deepcopy(MINIMAL))
    config["triarch:nodeGroups"][0].update(instanceType="g6.12xlarge", max=1)
    config["triarch:models"][0].update(model)
    return config


def gpus_per_node(instance: str) -> int:
    data = yaml.safe_load((COMPAT_DIR / "instances.yaml").read_text())
    found = [v for group in data.values() if isinstance(group, dict) for k, v in group.items() if k == instance]
    assert found, instance
    gpus: int = found[0]["gpus"]
    return gpus


def test_vllm_replicas_beyond_the_pool_ask_for_the_nodes_rounded_up(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """5 one-GPU vLLM replicas on nodes of 4 GPUs need ceil(5 / 4) = 2 nodes (docs: every pool holds its models at
    their largest); followed, the stack plans."""
    per_node = gpus_per_node("g6.12xlarge")
    config = four_gpu_pool(engine="vllm", replicas=5)
    code, line = plan(tmp_path, config, capsys)
    assert code == 2, line
    assert line == (f"error: triarch:nodeGroups[0].max: 1 holds {per_node} GPU(s), but its models need 5 at their "
                    "largest on pool 'l4' (replicas x GPUs per replica: 'chat' 5); allowed: >= "
                    f"{math.ceil(5 / per_node)} nodes, or fewer replicas at the largest (triarch:models[0].replicas)")
    config["triarch:nodeGroups"][0]["max"] = math.ceil(5 / per_node)
    assert plan(tmp_path, config, capsys) == (0, "")


def test_ray_serve_replicas_beyond_the_pool_count_the_upgrade_apart(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """5 Ray Serve replicas: 5 GPUs, and 5 more for a RayService upgrade's second cluster (docs/scaling: KubeRay's
    NewCluster upgrade runs both): ceil(10 / 4) = 3 nodes, of which ceil(5 / 4) = 2 hold the models."""
    code, line = plan(tmp_path, four_gpu_pool(engine="ray-serve", replicas=5), capsys)
    assert code == 2 and line.endswith(
        "allowed: >= 3 nodes (2 for the models at their largest, the rest for a RayService upgrade), or fewer "
        "replicas at the largest (triarch:models[0].replicas)"), line


def test_an_upgrade_beyond_the_pool_counts_the_new_cluster_at_its_fewest(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """autoscaling 1..4: the running cluster at its largest (4) fits, the upgrade's new cluster starts at its
    fewest (1): 5 GPUs, ceil(5 / 4) = 2 nodes."""
    code, line = plan(tmp_path, four_gpu_pool(engine="ray-serve", autoscaling={"min": 1, "max": 4}), capsys)
    assert code == 2 and line == (
        "error: triarch:nodeGroups[0].max: 1 holds 4 GPU(s), but a RayService upgrade on pool 'l4' needs 5: the "
        "models fit (4), but an upgrade of 'chat' starts a new Ray cluster (1) beside the running one at its largest "
        "(4); allowed: >= 2 nodes, or fewer replicas at the largest (triarch:models[0].autoscaling.max)"), line


def test_warm_replicas_beyond_the_pool_ask_for_the_nodes_rounded_up(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """3 replicas and 2 warm on 4-GPU nodes: 5 GPUs at the quietest, ceil(5 / 4) = 2 nodes; followed, it plans."""
    config = four_gpu_pool(engine="vllm", replicas=3, warmReplicas=2)
    code, line = plan(tmp_path, config, capsys)
    assert code == 2 and line == (
        "error: triarch:nodeGroups[0].max: 1 holds 4 GPU(s), too few to keep 2 warm ('chat' 2 x 1) beside the 3 its "
        "models hold at their fewest replicas; allowed: >= 2 nodes, or fewer warmReplicas"), line
    config["triarch:nodeGroups"][0]["max"] = 2
    assert plan(tmp_path, config, capsys) == (0, "")


def test_stages_off_whole_nodes_suggest_the_stages_of_whole_nodes(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """TP 4 x PP 3 = 12 GPUs on 8-GPU p5 nodes is 1.5 nodes; the example that keeps whole nodes is TP 8 x
    ceil(12 / 8) = 2 stages (a replica beyond one node takes whole nodes, docs/multi-node)."""
    config = stack_document("large")
    config["triarch:models"][1].update(tensorParallelSize=4, pipelineParallelSize=3)
    code, line = plan(tmp_path, config, capsys)
    assert code == 2 and line.endswith(
        "allowed: tensor x pipeline a multiple of 8 (e.g. tensorParallelSize 8, pipelineParallelSize 2)"), line


def test_a_node_group_name_too_long_for_eks_names_the_longest_that_fits(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """EKS's node group name is <cluster>-<pool>-<6-character hash>, at most 63 characters: with a 32-character
    cluster name a pool may be named 63 - 32 - 2 - 6 = 23 characters; 24 are refused saying so, 23 plan."""
    config = cast(Config, copy.deepcopy(MINIMAL))
    config["triarch:cluster"]["name"] = "c" * 32
    longest = 63 - 32 - 2 - 6

    def named(length: int) -> Config:
        edited = copy.deepcopy(config)
        name = "l4-" + "x" * (length - 3)
        edited["triarch:nodeGroups"][0].update(name=name, provisioner="managedNodeGroup", min=2, max=2)
        edited["triarch:models"][0]["nodeGroup"] = name
        return edited

    code, line = plan(tmp_path, named(longest + 1), capsys)
    assert code == 2 and line.startswith("error: triarch:nodeGroups[0].name: ") and line.endswith(
        f"allowed: at most {longest} characters"), line
    assert plan(tmp_path, named(longest), capsys) == (0, "")


# --- the prefill/decode split's capacity ---------------------------------------------------------------------------

def split(prefill: int, decode: int, nodes: int) -> Config:
    """Qwen3-8B split on 4-GPU L4 nodes (one GPU a role replica), the pool's max `nodes`."""
    config = four_gpu_pool(disaggregation={"enabled": True, "prefill": {"replicas": prefill},
                                           "decode": {"replicas": decode}})
    config["triarch:nodeGroups"][0]["max"] = nodes
    return config


def test_a_split_beyond_its_pool_names_both_roles_and_the_nodes_that_hold_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """prefill 2 + decode 3 one-GPU replicas need 5 GPUs, one 4-GPU node holds 4 (docs/prefill-decode.md: a split
    its pools cannot hold is refused). The advice counts a RayService upgrade too (both roles again, at their fixed
    replicas): ceil((5 + 5) / 4) = 3 nodes; followed, it plans."""
    code, line = plan(tmp_path, split(2, 3, nodes=1), capsys)
    assert code == 2, line
    assert line.startswith(
        "error: triarch:models[0].disaggregation: 'chat' needs 5 GPUs on node group 'l4' (prefill 2 x 1 + decode 3 x "
        "1 GPUs per replica), which holds 4 at most (max 1 x 4); allowed: triarch:nodeGroups[0].max >= 3 (the "
        "pool's other models and a RayService upgrade counted)"), line
    assert plan(tmp_path, split(2, 3, nodes=math.ceil((5 + 5) / 4)), capsys) == (0, "")


def test_a_split_that_fits_a_node_of_several_gpus_plans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """prefill 1 + decode 2 (3 GPUs, 6 during an upgrade) on two 4-GPU nodes: the pool holds 8 GPUs, not 2 (a
    pool's GPUs are its max nodes x the GPUs of a node)."""
    assert plan(tmp_path, split(1, 2, nodes=2), capsys) == (0, "")
