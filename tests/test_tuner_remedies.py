"""What the tuner tries before refusing a model on a small GPU or slice: a smaller batch, eager mode, or both.

The expected numbers are worked out here from the model's config.json (templates/models), the GPU's torch total
(templates/compat/gpus.yaml) and the memory model's constants, for Qwen3-Embedding-0.6B on an RTX 4060 Laptop GPU
(8.00 GiB) under vLLM 0.33.0 (the pinned image's release: CUDA graphs come out before the KV cache, the block
pool keeps a null block)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from triarch import cli
from triarch.catalog import catalog
from triarch.engine_changes import engine_args
from triarch.tuner import GIB, MIB, TuneError, load_arch, tune
from triarch.tuner.nodes import tune_nodes

ROOT = Path(__file__).resolve().parents[1]
EMBED = "Qwen/Qwen3-Embedding-0.6B"
CONFIG = json.loads((ROOT / "templates" / "models" / "Qwen--Qwen3-Embedding-0.6B.json").read_text(encoding="utf-8"))
SPREAD = yaml.safe_load((ROOT / "templates" / "compat" / "vllm-releases.yaml").read_text(encoding="utf-8"))[
    "estimateSpread"]

# --- the arithmetic, by hand ---------------------------------------------------------------------------------
# hidden 1024, 28 layers, 16 query heads and 8 KV heads of 128, MLP 3072, vocabulary 151669, tied, bf16.
TOTAL = 8 * GIB  # torchTotalGiB 8.00
# embedding 151669 x 1024 + 28 x (q/o 2 x 1024 x 2048 + k/v 2 x 1024 x 1024 + MLP 3 x 1024 x 3072 + two norms of
# 1024 + q/k norms of 128) + the final norm of 1024 = 595,776,512 parameters (pooling loads no LM head), 2 bytes each
WEIGHTS = 2 * (151669 * 1024 + 28 * (2 * 1024 * 2048 + 2 * 1024 * 1024 + 3 * 1024 * 3072 + 2 * 1024 + 2 * 128) + 1024)
NON_TORCH = 256 * MIB  # one GPU, no TP group
GRAPHS = (300 + 17 * 28) * MIB  # 776 MiB
# one token of the profile's forward: four hidden-size buffers, q + k + v + attention output, gate/up/down; x 1.1
ACTIVATION_PER_TOKEN = 2 * (4 * 1024 + (2 * 16 + 2 * 8) * 128 + 3 * 3072)  # 38,912 bytes before the slack
BLOCK = 16 * 28 * 2 * 8 * 128 * 2  # 16 tokens of K and V in 28 layers: 1,835,008 bytes


def activation(batched: int, *, pessimistic: bool = False) -> int:
    peak = int(batched * ACTIVATION_PER_TOKEN * 1.1)
    return math.ceil(peak * SPREAD["activationPeak"]) if pessimistic else peak


def available_kv(util: float, batched: int, *, eager: bool, pessimistic: bool = False) -> int:
    """total x utilization - weights - non-torch - activation peak - CUDA graphs (at the pessimistic end, each
    times its estimateSpread factor)."""
    requested = math.ceil(TOTAL * util)
    if not pessimistic:
        return requested - WEIGHTS - NON_TORCH - activation(batched) - (0 if eager else GRAPHS)
    return (requested - math.ceil(WEIGHTS * SPREAD["weights"]) - math.ceil(NON_TORCH * SPREAD["nonTorch"])
            - activation(batched, pessimistic=True) - (0 if eager else math.ceil(GRAPHS * SPREAD["cudaGraphs"])))


def longest(util: float, batched: int, *, eager: bool, pessimistic: bool = False) -> int:
    """The longest request the block pool holds: its blocks less the null block, 16 tokens each."""
    blocks = available_kv(util, batched, eager=eager, pessimistic=pessimistic) // BLOCK
    return max(0, blocks - 1) * 16


def laptop(util: float, **options: Any) -> Any:
    return tune(load_arch(EMBED), catalog().gpus["rtx-4060-laptop"], gpu_memory_utilization=util, gpus_available=1,
                task="embed", vllm_version="0.33.0", **options)


def test_the_hand_arithmetic_reproduces_the_refusal_of_today() -> None:
    """The repro's numbers: with the defaults (a 32768-token pooling step, CUDA graphs) a quarter of the GPU leaves
    the KV cache -1.58 GiB."""
    assert WEIGHTS == 1_191_553_024 and round(activation(32768) / GIB, 1) == 1.3
    assert round(available_kv(0.23, 32768, eager=False) / GIB, 2) == -1.58


def test_a_quarter_of_a_laptop_gpu_runs_eager_with_a_smaller_batch() -> None:
    """Neither remedy alone fits: a smaller batch keeps 0.8 GiB of graphs that 0.23 x 8 GiB cannot hold next to the
    weights; eager mode alone keeps a 1.3 GiB activation peak. Both: 8192 tokens a step leave 88 usable blocks
    (1408 tokens), 4096 leave 184 (2944), 2048 hold 2048 (the batch caps a pooling request); 4096 gives the longest
    request at the pessimistic end too (144 usable blocks, 2304 tokens: the max_model_len)."""
    assert available_kv(0.23, 512, eager=False) < 0 and available_kv(0.23, 32768, eager=True) < 0
    assert longest(0.23, 8192, eager=True) == 1408 and longest(0.23, 4096, eager=True) == 2944
    assert longest(0.23, 4096, eager=True, pessimistic=True) == 2304
    assert longest(0.23, 2048, eager=True, pessimistic=True) > 2048
    sizing = laptop(0.23)
    assert sizing.engine_args["enforce_eager"] is True
    assert sizing.engine_args["max_num_batched_tokens"] == 4096
    assert sizing.max_model_len == sizing.engine_args["max_model_len"] == 2304
    assert sizing.memory.cuda_graphs == 0 and sizing.memory.activation_peak == activation(4096)
    assert sizing.available_kv_bytes == available_kv(0.23, 4096, eager=True)
    assert sizing.available_kv_bytes_low == available_kv(0.23, 4096, eager=True, pessimistic=True)
    # 185 blocks over 144 per 2304-token request, at 512 tokens each: 5 sequences
    assert sizing.engine_args["max_num_seqs"] == 5
    [note] = [n for n in sizing.notes if n.startswith("enforce_eager")]
    assert note.startswith("enforce_eager and max_num_batched_tokens 4096 (not 32768): with 0.8 GiB of CUDA graphs "
                           "and a 1.3 GiB activation peak for 32768 tokens a step the KV cache would get -1.58 GiB")
    assert "max_model_len is at most 4096" in note


def test_a_smaller_batch_alone_keeps_the_cuda_graphs_where_it_suffices() -> None:
    """At 0.35 of the GPU the default step leaves -0.62 GiB, but 4096 tokens a step with the graphs leave 303 blocks
    (4832 tokens): the batch caps a request at 4096, more than 8192 tokens a step give (207 blocks, 3312)."""
    assert round(available_kv(0.35, 32768, eager=False) / GIB, 2) == -0.62
    assert longest(0.35, 8192, eager=False) == 3312 and longest(0.35, 4096, eager=False) == 4832
    sizing = laptop(0.35)
    assert "enforce_eager" not in sizing.engine_args and sizing.memory.cuda_graphs == GRAPHS
    assert sizing.engine_args["max_num_batched_tokens"] == 4096 and sizing.max_model_len == 4096
    assert sizing.kv_cache_blocks == available_kv(0.35, 4096, eager=False) // BLOCK == 303
    assert any(n.startswith("max_num_batched_tokens 4096 (not 32768): with a 1.3 GiB activation peak") for n in
               sizing.notes)
    assert any("capped to 4096: a pooling request is taken in one step of max_num_batched_tokens 4096" in n
               for n in sizing.notes)


def test_a_batch_the_caller_fixed_is_kept_and_eager_mode_alone_is_tried() -> None:
    sizing = laptop(0.23, max_num_batched_tokens=4096)
    assert sizing.engine_args["max_num_batched_tokens"] == 4096 and sizing.engine_args["enforce_eager"] is True
    # with the graphs, 4096 tokens a step leave 0.23 x 8 GiB - weights - non-torch - activation - 776 MiB
    assert round(available_kv(0.23, 4096, eager=False) / GIB, 2) == -0.44
    [note] = [n for n in sizing.notes if "enforce_eager" in n]
    assert note.startswith("enforce_eager: with 0.8 GiB of CUDA graphs the KV cache would get -0.44 GiB")
    assert "max_num_batched_tokens" not in note.split(";")[0]


def test_cuda_graphs_the_caller_asked_for_are_kept_and_the_refusal_says_a_smaller_batch_was_tried() -> None:
    with pytest.raises(TuneError) as refused:
        laptop(0.23, enforce_eager=False)
    message = str(refused.value)
    # the fewest tokens a step may take: one typical 512-token embedding request
    assert round(available_kv(0.23, 512, eager=False) / GIB, 2) == -0.30
    assert ("a smaller batch was tried too: with max_num_batched_tokens 512 (the fewest a request needs) the KV "
            "cache still gets -0.30 GiB") in message
    assert "eager" not in message


def test_eager_mode_the_caller_asked_for_is_its_own_and_only_the_batch_is_remedied() -> None:
    sizing = laptop(0.23, enforce_eager=True)
    assert sizing.engine_args["enforce_eager"] is True
    assert sizing.engine_args["max_num_batched_tokens"] == 4096 and sizing.max_model_len == 2304  # as both above
    [note] = [n for n in sizing.notes if "not 32768" in n]
    # the eager default already leaves -0.83 GiB for 32768 tokens a step: the note is about the batch alone
    assert round(available_kv(0.23, 32768, eager=True) / GIB, 2) == -0.83
    assert note.startswith("max_num_batched_tokens 4096 (not 32768): with a 1.3 GiB activation peak for 32768 "
                           "tokens a step the KV cache would get -0.83 GiB")
    assert "enforce_eager" not in note and "CUDA graphs" not in note


def test_where_even_both_remedies_fail_the_refusal_says_they_were_tried() -> None:
    """0.15 x 8 GiB does not hold the weights and the non-torch memory: nothing a step could save helps."""
    with pytest.raises(TuneError) as refused:
        laptop(0.15)
    assert round(available_kv(0.15, 512, eager=True) / GIB, 2) == -0.18
    assert ("eager mode and a smaller batch were tried too: with enforce_eager and max_num_batched_tokens 512 (the "
            "fewest a request needs) the KV cache still gets -0.18 GiB") in str(refused.value)


def test_a_generation_batch_is_not_cut_below_a_typical_request() -> None:
    """On an 8 GB GPU generation steps 2048 tokens already (one typical request): only eager mode is tried, and it
    gives back the 300 MiB + 17 MiB per layer of graphs (80 layers: 1660 MiB)."""
    with pytest.raises(TuneError) as refused:
        tune(load_arch("meta-llama/Llama-3.1-70B-Instruct"), catalog().gpus["rtx-4060-laptop"], gpus_available=1)
    message = str(refused.value)
    default = re.search(r"so the KV cache gets (-?\d+\.\d\d) GiB", message)
    eager = re.search(r"eager mode was tried too: with enforce_eager the KV cache still gets (-?\d+\.\d\d) GiB",
                      message)
    assert default and eager, message
    assert float(eager[1]) - float(default[1]) == pytest.approx(1660 / 1024, abs=0.011)


def test_a_pool_of_several_nodes_adds_nodes_before_it_takes_a_remedy() -> None:
    """Qwen3-8B on L4 at 0.23: one node of 8 does not hold it with the defaults, two (TP 8 x PP 2) do; eager mode
    on one node is only the answer when the pool has one node."""
    arch, l4 = load_arch("Qwen/Qwen3-8B"), catalog().gpus["l4"]
    two = tune_nodes(arch, l4, gpus_per_node=8, max_nodes=2, gpu_memory_utilization=0.23)
    assert two.pipeline_parallel_size == 2 and "enforce_eager" not in two.engine_args and not any(
        "enforce_eager" in n for n in two.notes)
    one = tune_nodes(arch, l4, gpus_per_node=8, max_nodes=1, gpu_memory_utilization=0.23)
    assert one.pipeline_parallel_size == 1 and one.engine_args["enforce_eager"] is True


def test_tune_json_and_flags_carry_the_remedy(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["tune", "--model", EMBED, "--gpu", "rtx-4060-laptop", "--gpus", "1", "--gpu-memory-utilization", "0.23"]
    assert cli.main([*base, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["engine_args"]["enforce_eager"] is True
    assert document["engine_args"]["max_num_batched_tokens"] == 4096
    assert document["memory"]["cuda_graphs"] == 0
    assert any(n.startswith("enforce_eager and max_num_batched_tokens 4096") for n in document["notes"])
    assert cli.main(base) == 0
    printed = capsys.readouterr().out
    assert "--no-enforce-eager and --max-num-batched-tokens set them yourself" in printed
    assert "--enforce-eager=True" in printed and "--max-num-batched-tokens=4096" in printed
    assert cli.main([*base, "--no-enforce-eager"]) == 2
    assert "a smaller batch was tried too" in capsys.readouterr().err


def test_the_local_stack_sliced_four_ways_plans_with_the_remedy(tmp_path: Path) -> None:
    """The laptop stack with timeSlicing 4: each replica gets 0.92 / 4 = 0.23 of the GPU."""
    document = yaml.safe_load((ROOT / "stacks" / "Pulumi.local.yaml").read_text(encoding="utf-8"))
    document["config"]["triarch:nodeGroups"][0]["timeSlicing"] = {"replicas": 4}
    stack = tmp_path / "Pulumi.local.yaml"
    stack.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    out = tmp_path / "out"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
        code = cli.main(["plan", "--stack-file", str(stack), "--out", str(out)])
    assert code == 0
    flags = engine_args(json.loads((out / "plan.json").read_text(encoding="utf-8")))["embed"]
    assert flags["enforce_eager"] is True and flags["max_num_batched_tokens"] == "4096"
    assert flags["max_model_len"] == "2304" and flags["gpu_memory_utilization"] == "0.23"
    summary = printed.getvalue()
    assert ("embed: enforce_eager and max_num_batched_tokens 4096 (not 32768): with 0.8 GiB of CUDA graphs and a "
            "1.3 GiB activation peak for 32768 tokens a step the KV cache would get -1.58 GiB at tensorParallelSize 1"
            ) in summary
    assert "(a larger gpuMemoryUtilization, fewer timeSlicing replicas per GPU or a pool of larger GPUs)" in summary
    assert "vLLM's profile and start in eager mode" in summary  # the cold start's engine part follows


def test_a_given_kv_budget_is_made_room_for_by_a_smaller_batch() -> None:
    """With kv_cache_memory_bytes the whole GPU is the budget (graphs come out of the headroom): 6.8 GB of KV cache
    beside the weights, the non-torch memory and a 8192-token step is 20.7 MB too much, beside a 4096-token one not."""
    given = 6_800_000_000
    assert TOTAL - WEIGHTS - NON_TORCH - activation(8192) < given <= TOTAL - WEIGHTS - NON_TORCH - activation(4096)
    sizing = laptop(0.92, kv_cache_memory_bytes=given)
    assert sizing.engine_args["max_num_batched_tokens"] == 4096 and "enforce_eager" not in sizing.engine_args
    assert sizing.memory.spare >= 0
    over = (WEIGHTS + NON_TORCH + activation(32768) + given - TOTAL) / GIB
    assert any(f"kv_cache_memory_bytes={given} would be {over:.1f} GiB more than the GPU holds" in n
               for n in sizing.notes)
