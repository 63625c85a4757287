"""`triarch tune` end to end: the JSON contract, the no-GPU path, and one-line refusals with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from triarch.cli import main
from triarch.tuner import load_model_config


def _tune_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["tune", *args, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert isinstance(document, dict)
    return document


def test_json_has_the_documented_fields(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _tune_json(capsys, "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "a100-80gb", "--max-model-len", "8192")
    for key in ("num_parameters", "weights_bytes", "kv_bytes_per_token", "kv_cache_tokens", "kv_cache_blocks",
                "max_concurrency", "tensor_parallel_size", "engine_args"):
        assert key in doc, key
    # 32 layers x (K and V) x 8 KV heads x 128 head dim x 2 bytes (bf16), at tensor parallel 1.
    assert doc["kv_bytes_per_token"] == 32 * 2 * 8 * 128 * 2
    assert doc["kv_cache_tokens"] == doc["kv_cache_blocks"] * 16  # type: ignore[operator]
    assert doc["max_concurrency"] == pytest.approx(doc["kv_cache_tokens"] / 8192)  # type: ignore[operator]


def test_mla_kv_bytes_per_token_is_the_latent_cache(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _tune_json(capsys, "--model", "deepseek-ai/DeepSeek-V2-Lite-Chat", "--gpu", "a100-80gb",
                     "--tensor-parallel-size", "2", "--max-model-len", "32768")
    # DeepSeek-V2-Lite: 27 layers, one latent of kv_lora_rank 512 + qk_rope_head_dim 64, bf16, on every TP rank.
    assert doc["kv_bytes_per_token"] == 27 * (512 + 64) * 2
    assert doc["tensor_parallel_size"] == 2


def test_given_kv_budget_needs_no_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    budget = 4 * 1024**3
    doc = _tune_json(capsys, "--model", "Qwen/Qwen3-8B", "--kv-cache-memory-bytes", str(budget))
    assert doc["engine_args"]["kv_cache_memory_bytes"] == budget  # type: ignore[index]
    blocks = doc["kv_cache_blocks"]
    assert isinstance(blocks, int) and blocks * 16 * doc["kv_bytes_per_token"] <= budget  # type: ignore[operator]


@pytest.mark.parametrize("args, named", [
    (["--model", "nosuch/model", "--gpu", "l4"], "nosuch/model"),
    (["--model", "Qwen/Qwen3-8B", "--gpu", "tpu-v9"], "tpu-v9"),
    (["--model", "Qwen/Qwen3-8B"], "--gpu"),
    (["--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "rtx-4060-laptop", "--gpus", "1"], "GiB"),
])
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], named: str) -> None:
    assert main(["tune", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and named in err[0]


# --- the public start-up logs, reproduced through the command line ---------------------------------------------

def _case(source: str) -> dict[str, Any]:
    from conftest import reference_file

    cases = yaml.safe_load(reference_file("vllm-kv-cases.yaml").read_text(encoding="utf-8"))
    case: dict[str, Any] = next(c for c in cases if c["source"] == source)
    return case


def _config_file(tmp_path: Path, model: str, quantization: dict[str, Any]) -> Path:
    config = {**load_model_config(model), "quantization_config": quantization}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def test_cli_reproduces_the_70b_w8a8_log(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    case = _case("vllm-project/vllm PR 12569")
    settings, logged = case["settings"], case["logged"]
    w8a8 = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {"num_bits": 8}}}}
    path = _config_file(tmp_path, "meta-llama/Llama-3.1-70B-Instruct", w8a8)
    # Llama-3.1-70B: 80 layers x (K, V) x 8 KV heads x 128 head dim x 2 bytes; the log's blocks give the budget.
    budget = logged["gpu_blocks"] * settings["block_size"] * 80 * 2 * 8 * 128 * 2
    doc = _tune_json(capsys, "--model-config", str(path), "--kv-cache-memory-bytes", str(budget), "--gpus", "1",
                     "--tensor-parallel-size", str(settings["tensor_parallel_size"]),
                     "--max-model-len", str(settings["max_model_len"]))
    assert doc["kv_cache_blocks"] == logged["gpu_blocks"]
    assert doc["kv_cache_tokens"] == logged["gpu_blocks"] * settings["block_size"]
    assert round(doc["max_concurrency"], 2) == logged["max_concurrency_at_2048"]  # type: ignore[arg-type]
    assert doc["weights_bytes"] / 2**30 == pytest.approx(float(logged["model_weights"].split()[0]), rel=0.02)  # type: ignore[operator]


def test_cli_refuses_the_4bit_7b_on_8_gib_at_070(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    case = _case("vllm-project/vllm issue 13882")
    settings = case["settings"]
    path = _config_file(tmp_path, "Qwen/Qwen2.5-7B-Instruct", {"quant_method": "awq", "bits": 4, "group_size": 128})
    code = main(["tune", "--model-config", str(path), "--gpu", "rtx-4060-laptop", "--gpus", "1",
                 "--gpu-memory-utilization", str(settings["gpu_memory_utilization"]),
                 "--max-model-len", str(settings["max_model_len"])])
    assert code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "KV cache gets -" in line and "GiB" in line


def test_cli_weights_of_llama3_8b_match_the_log(capsys: pytest.CaptureFixture[str]) -> None:
    logged = _case("vllm-project/vllm issue 12330")["logged"]
    doc = _tune_json(capsys, "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "a100-40gb")
    assert round(doc["weights_bytes"] / 2**30, 2) == float(logged["model_weights"].split()[0])  # type: ignore[operator]


def test_a_refusal_proposes_the_flags_of_triarch_tune(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "l4", "--gpus", "1"]) == 2
    err = capsys.readouterr().err
    assert "--nodes" in err and "a --gpu with more memory" in err
    assert "gpus_available" not in err and "kv_cache_dtype" not in err
    # 131 GiB of weights on a 22 GiB GPU: no KV setting helps, so none is offered
    assert "--kv-cache-dtype" not in err and "--max-model-len" not in err


def test_tune_says_which_end_of_the_estimate_it_sized_for(capsys: pytest.CaptureFixture[str]) -> None:
    """The 70B on A100s: the search goes on to TP 4, where one request fits at the pessimistic end; a TP 2 asked for
    is answered at the nominal end only, with what `triarch plan` refuses it for and what fits, in tune's flags."""
    assert main(["tune", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "a100-80gb"]) == 0
    out = capsys.readouterr().out
    assert "tensor_parallel_size=4;" in out
    assert "  sized for the pessimistic end of the estimate: the engine args start there too\n" in out
    assert main(["tune", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "a100-80gb",
                 "--tensor-parallel-size", "2"]) == 0
    out = capsys.readouterr().out
    assert ("  sized for the nominal end only: at the pessimistic end of the memory estimate one request of "
            "max_model_len 8192 does not fit (0 tokens of KV cache at tensor_parallel_size=2): vLLM may refuse to "
            "start; triarch plan refuses it; what fits there: --tensor-parallel-size 4\n") in out
    assert "the engine args start there too" not in out
    assert main(["tune", "--model", "Qwen/Qwen3-8B", "--gpu", "l4", "--gpus", "1", "--max-model-len", "20000"]) == 0
    assert ("what fits there: --max-model-len 17936, --kv-cache-dtype fp8 or more GPUs per replica (--gpus, or more "
            "nodes with --nodes)\n") in capsys.readouterr().out


def test_the_gpu_is_named_as_a_stack_names_it(capsys: pytest.CaptureFixture[str]) -> None:
    """`--gpu` in any case, or an instance type (as `instanceType` in a stack): the instance's GPU, and its GPUs per
    node for the tensor-parallel search unless `--gpus` says otherwise."""
    by_key = _tune_json(capsys, "--model", "Qwen/Qwen3-8B", "--gpu", "l4")
    assert _tune_json(capsys, "--model", "Qwen/Qwen3-8B", "--gpu", "L4") == by_key
    assert _tune_json(capsys, "--model", "Qwen/Qwen3-8B", "--gpu", "g6.xlarge") == by_key
    # Gemma 3 27B's 51.1 GiB of weights: four of g6.12xlarge's four L4s, never one of g6.xlarge's one
    assert _tune_json(capsys, "--model", "google/gemma-3-27b-it", "--gpu", "g6.12xlarge")["tensor_parallel_size"] == 4
    for one_gpu in (["--gpu", "g6.xlarge"], ["--gpu", "g6.12xlarge", "--gpus", "1"]):
        assert main(["tune", "--model", "google/gemma-3-27b-it", *one_gpu]) == 2
        [line] = capsys.readouterr().err.splitlines()
        assert "the most 1 GPU(s) allow" in line, line


def test_a_gpu_neither_known_nor_an_instance_type_names_the_nearest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--model", "Qwen/Qwen3-8B", "--gpu", "g6.xlarg"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("error: --gpu: 'g6.xlarg' is not a known GPU or GPU instance type (did you mean "
                           "'g6.xlarge'?)"), line
    assert "l40s" in line and "p5.48xlarge" in line and "m6i.xlarge" not in line  # GPUs and GPU instances only
