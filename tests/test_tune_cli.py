"""`triarch tune` end to end: the JSON contract, the no-GPU path, and one-line refusals with exit code 2."""

from __future__ import annotations

import json

import pytest

from triarch.cli import main


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
