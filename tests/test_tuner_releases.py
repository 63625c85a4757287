"""The tuner release by release: context limits as each vLLM derives them, hybrid attention paged as vLLM's hybrid
KV-cache manager pages it (checked against the numbers vLLM 0.19.0 printed), refusals for what it cannot size,
quantized and multimodal weights, and torch-visible GPU totals."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from triarch.catalog import catalog
from triarch.cli import main
from triarch.tuner import GIB, LengthRefused, TuneError, arch_from_hf_config, load_arch, load_model_config, tune
from triarch.tuner.kv import kv_layout
from triarch.tuner.releases import modelled_releases, release_for

YARN_CONFIG = Path(__file__).parent / "fixtures" / "qwen3-8b-yarn"
H100 = catalog().gpus["h100-80gb"]


# --- context limits -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.19.0", "0.29.0"])
def test_yarn_context_is_the_original_length_times_the_factor_before_0_33(version: str) -> None:
    """vllm-0.29.0/vllm/config/model.py:2457-2469: yarn replaces the length by original_max_position_embeddings
    (32768) and multiplies it by the factor (4)."""
    arch = load_arch(YARN_CONFIG)
    served = tune(arch, H100, max_model_len=131072, vllm_version=version)
    assert served.context_limit == 131072
    assert served.engine_args["max_model_len"] == 131072


def test_yarn_context_is_not_scaled_by_0_33_and_a_longer_request_is_refused_as_vllm_words_it() -> None:
    """vllm-0.33.0/vllm/config/model.py:2613-2620 takes yarn's max_position_embeddings as already scaled."""
    arch = load_arch(YARN_CONFIG)
    assert tune(arch, H100, vllm_version="0.33.0").context_limit == 40960
    with pytest.raises(LengthRefused) as refused:
        tune(arch, H100, max_model_len=131072, vllm_version="0.33.0")
    vllm_words = ('"User-specified max_model_len (131072) is greater than the derived max_model_len '
                  "(max_position_embeddings=40960.0 or model_max_length=None in model's config.json).\"")
    assert vllm_words in str(refused.value)


def test_tune_cli_takes_the_release_and_says_which(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--model-config", str(YARN_CONFIG), "--gpu", "h100-80gb", "--vllm-version", "0.29.0",
                 "--max-model-len", "131072"]) == 0
    out = capsys.readouterr().out
    assert "as vLLM 0.29.0 sizes it" in out and "derives: 131,072 tokens" in out and "--max-model-len=131072" in out
    assert main(["tune", "--model-config", str(YARN_CONFIG), "--gpu", "h100-80gb"]) == 0
    assert "as vLLM 0.33.0 sizes it, the version in vllm/vllm-openai:v0.33.0" in capsys.readouterr().out
    assert main(["tune", "--model-config", str(YARN_CONFIG), "--gpu", "h100-80gb", "--vllm-version", "0.33.0",
                 "--max-model-len", "131072"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: vLLM 0.33.0 refuses max_model_len 131072")


def _embedding(tmp_path: Path, sentence_bert: dict[str, Any] | None, tokenizer: dict[str, Any] | None) -> Path:
    config = {"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16,
              "vocab_size": 30000, "max_position_embeddings": 32768, "position_embedding_type": "absolute"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    if sentence_bert is not None:
        (tmp_path / "sentence_bert_config.json").write_text(json.dumps(sentence_bert))
    if tokenizer is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return tmp_path


def test_a_pooling_models_tokenizer_caps_its_context(tmp_path: Path) -> None:
    """vllm/config/model.py get_and_verify_max_len reads tokenizer_config.json for pooling models with absolute
    positions only."""
    arch = load_arch(_embedding(tmp_path, None, {"model_max_length": 512}))
    assert tune(arch, H100, task="embed").context_limit == 512
    assert tune(arch, H100, task="generate").context_limit == 32768


def test_sentence_transformers_length_needs_do_lower_case_until_0_33(tmp_path: Path) -> None:
    """vllm-0.29.0 transformers_utils/config.py:966 wants max_seq_length and do_lower_case; 0.33.0 (:1163) only
    max_seq_length; either way it replaces the derived length."""
    arch = load_arch(_embedding(tmp_path, {"max_seq_length": 8192}, None))
    assert tune(arch, H100, task="embed", vllm_version="0.29.0").context_limit == 32768
    assert tune(arch, H100, task="embed", vllm_version="0.33.0").context_limit == 8192
    both = load_arch(_embedding(tmp_path, {"max_seq_length": 8192, "do_lower_case": False}, None))
    assert tune(both, H100, task="embed", vllm_version="0.29.0").context_limit == 8192


# --- hybrid attention against vLLM 0.19.0's own numbers --------------------------------------------------------


@pytest.mark.parametrize(("model", "tp", "blocks", "tokens", "concurrency"), [
    # "num_gpu_blocks is" / "GPU KV cache size" / "Maximum concurrency" of llm-d-planner's v0.19.0 H100 logs
    # (bench/llmd-vllm-0.19.0.yaml), max_model_len 8192, max_num_batched_tokens 8192
    ("google/gemma-3-12b-it", 1, 48867, 130304, 15.88),
    ("google/gemma-3-27b-it", 1, 15997, 36560, 4.46),
    ("google/gemma-2-9b-it", 1, 21110, 168880, 20.60),
    ("openai/gpt-oss-20b", 2, 323972, 2591776, 316.07),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", 4, 91495, 365968, 44.68),
])
def test_hybrid_layouts_reproduce_vllm_0_19_tokens_and_concurrency(model: str, tp: int, blocks: int, tokens: int,
                                                                   concurrency: float) -> None:
    arch = load_arch(model)
    per_block = kv_layout(arch, tensor_parallel_size=tp).bytes_per_block
    sizing = tune(arch, H100, tensor_parallel_size=tp, max_model_len=8192, vllm_version="0.19.0",
                  kv_cache_memory_bytes=blocks * per_block, max_num_batched_tokens=8192, max_num_seqs=1024)
    assert sizing.kv_cache_blocks == blocks
    assert sizing.kv_cache_tokens == tokens
    assert sizing.max_concurrency is not None and round(sizing.max_concurrency, 2) == concurrency


def test_sliding_windows_pay_off_beyond_the_window() -> None:
    """gemma-3-12b at 32768 tokens: the full-attention group needs 2048 pages, each of the five sliding groups
    cdiv(min(1023 + 8192, 32768), 16) + 1 = 577 (0.19.0); full attention everywhere would need 6 x 2048."""
    arch = load_arch("google/gemma-3-12b-it")
    assert kv_layout(arch).bytes_per_block == 8 * 16 * 2 * 8 * 256 * 2  # 8 layers a group, 8 KV heads of 256
    sizing = tune(arch, H100, max_model_len=32768, vllm_version="0.19.0", kv_cache_memory_bytes=48867 << 20,
                  max_num_batched_tokens=8192, max_num_seqs=1024)
    assert sizing.kv_cache_blocks == 48867
    assert sizing.max_concurrency == pytest.approx(48867 / (2048 + 5 * 577))
    # 0.29+ keeps two steps in flight (async scheduling): 1023 + 16384 tokens per sliding group
    newer = tune(arch, H100, max_model_len=32768, vllm_version="0.33.0", kv_cache_memory_bytes=48867 << 20,
                 max_num_batched_tokens=8192, max_num_seqs=1024)
    assert newer.max_concurrency == pytest.approx(48867 / (2048 + 5 * 1089))


def test_hybrid_models_get_longer_contexts_than_full_attention_would_allow() -> None:
    gpt_oss = tune(load_arch("openai/gpt-oss-20b"), H100)
    assert gpt_oss.max_model_len == 131072
    full = load_model_config("openai/gpt-oss-20b")
    full["layer_types"] = ["full_attention"] * 24
    as_full = tune(arch_from_hf_config(full), H100)
    assert gpt_oss.max_concurrency is not None and as_full.max_concurrency is not None
    assert gpt_oss.max_concurrency > 1.7 * as_full.max_concurrency


# --- refusals ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("config", "reason"), [
    ({"model_type": "qwen3_next"}, "gated DeltaNet"),
    ({"model_type": "nemotron_h"}, "mamba2"),
    ({"model_type": "llama", "layer_types": ["linear_attention", "full_attention"]}, "linear_attention"),
    ({"model_type": "mystery"}, "not one the tuner knows"),
    ({}, "names no model_type"),
])
def test_what_the_tuner_cannot_size_is_refused(config: dict[str, Any], reason: str) -> None:
    base = {"hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 1000}
    with pytest.raises(TuneError, match=reason):
        arch_from_hf_config({**base, **config})


def test_an_unknown_hybrid_is_refused_by_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16,
        "vocab_size": 151936}))
    assert main(["tune", "--model-config", str(tmp_path), "--gpu", "h100-80gb"]) == 2
    assert "refuses rather than size the state as KV cache" in capsys.readouterr().err


# --- weights ------------------------------------------------------------------------------------------------------


def test_mxfp4_quantizes_the_experts_and_keeps_attention_in_bf16() -> None:
    arch = load_arch("openai/gpt-oss-20b")
    assert arch.quant_method == "mxfp4" and arch.quant_kept == ("attention",)
    assert arch.quantized_bytes_per_weight == 0.5 + 1 / 32  # 4 bits and one 8-bit scale per 32
    config = load_model_config("openai/gpt-oss-20b")
    config["quantization_config"] = {"quant_method": "mxfp4"}
    all_quantized = arch_from_hf_config(config)
    assert all_quantized.quant_kept == ()
    from triarch.tuner import weight_bytes

    # vLLM 0.19.0 logged "Model loading took 13.64 GiB" for gpt-oss-20b on one H100 (bench/llmd-vllm-0.19.0.yaml)
    assert weight_bytes(all_quantized) < weight_bytes(arch) < 13.64 * GIB * 1.1


def test_a_vision_tower_is_loaded_with_the_language_model() -> None:
    gemma = load_arch("google/gemma-3-27b-it")
    assert 0.3e9 < gemma.tower_parameters < 0.5e9  # SigLIP-so400m at 27 layers of 1152
    sizing = tune(gemma, H100, vllm_version="0.19.0", gpu_memory_utilization=0.95)
    # vLLM 0.19.0: "Model loading took 51.45 GiB" for gemma-3-27b-it
    assert sizing.memory.weights / GIB == pytest.approx(51.45, rel=0.02)


# --- GPUs and releases --------------------------------------------------------------------------------------------


def test_vllm_requests_a_share_of_the_total_torch_sees() -> None:
    """vLLM 0.19.0 on H100: "total_memory=79.19GiB" and "worker requested memory: 75.23GiB" at 0.95."""
    sizing = tune(load_arch("meta-llama/Llama-3.1-8B-Instruct"), H100, gpu_memory_utilization=0.95,
                  vllm_version="0.19.0")
    assert round(sizing.memory.requested / GIB, 2) == 75.23
    assert sizing.memory.requested == math.ceil(79.19 * GIB * 0.95)


def test_cuda_graphs_come_off_before_the_kv_cache_from_0_29_on() -> None:
    arch = load_arch("meta-llama/Llama-3.1-8B-Instruct")
    old = tune(arch, H100, gpu_memory_utilization=0.92, max_model_len=8192, vllm_version="0.19.0")
    new = tune(arch, H100, gpu_memory_utilization=0.92, max_model_len=8192, vllm_version="0.29.0")
    assert old.memory.cuda_graphs == new.memory.cuda_graphs > 0
    assert old.available_kv_bytes - new.available_kv_bytes == new.memory.cuda_graphs


def test_release_defaults_and_the_nearest_release() -> None:
    releases = modelled_releases()
    assert list(releases) == ["0.19.0", "0.29.0", "0.33.0"]
    assert releases["0.19.0"].gpu_memory_utilization == 0.9 and releases["0.33.0"].gpu_memory_utilization == 0.92
    assert tune(load_arch("Qwen/Qwen3-8B"), H100, vllm_version="0.19.0").engine_args["gpu_memory_utilization"] == 0.9
    for version in releases:  # H100: 8192 tokens / 1024 sequences for `vllm serve`; A100: 2048 / 256
        assert releases[version].batch_defaults(79.19, "NVIDIA H100 80GB HBM3") == (8192, 1024)
        assert releases[version].batch_defaults(79.15, "NVIDIA A100-SXM4-80GB") == (2048, 256)
    assert releases["0.19.0"].batch_defaults(178.35, "NVIDIA B200") == (8192, 1024)
    assert releases["0.33.0"].batch_defaults(178.35, "NVIDIA B200") == (16384, 1024)
    release, note = release_for("0.27.0")
    assert release.version == "0.29.0" and note is not None and "0.27.0 is not modelled" in note
    assert release_for(None)[0].version == "0.33.0"
    with pytest.raises(TuneError, match="not a release number"):
        release_for("latest")


def test_near_equal_buckets_share_one_group_size() -> None:
    """vLLM groups by the smallest bucket of layers, or by the largest when it is under 1.5 times the smallest
    (kv_cache_utils.py, 0.19.0 ``_get_kv_cache_groups_uniform_page_size``): 10 full and 14 sliding layers make two
    groups of 14 (the full one padded), not one of 10 and two of sliding layers."""
    config = {"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 8,
              "num_key_value_heads": 8, "vocab_size": 1000, "sliding_window": 512,
              "layer_types": ["full_attention"] * 10 + ["sliding_attention"] * 14}
    layout = kv_layout(arch_from_hf_config(config))
    assert layout.group_size == 14
    assert [(g.kind, g.layers) for g in layout.groups] == [("full", 10), ("sliding", 14)]
    assert layout.bytes_per_block == 14 * 16 * 2 * 8 * 128 * 2


def test_the_first_pipeline_stage_holds_the_embedding() -> None:
    """vLLM 0.19.0 logs "Model loading took 7.51 GiB" and "4.26 GiB" on the first stage of Llama-3.1-8B at PP=2 and
    PP=4 (an even split would be 7.50 and 3.75)."""
    arch = load_arch("meta-llama/Llama-3.1-8B-Instruct")
    for pp, logged in ((2, 7.51), (4, 4.26)):
        sizing = tune(arch, H100, pipeline_parallel_size=pp, tensor_parallel_size=1, gpus_available=pp,
                      vllm_version="0.19.0", max_model_len=8192)
        assert sizing.memory.weights / GIB == pytest.approx(logged, rel=0.01)


def test_0_29_on_reports_tokens_as_concurrency_times_length() -> None:
    """0.29+ prints int(max concurrency x max_model_len) (kv_cache_utils.py get_kv_cache_capacity): for the same
    48,867 blocks of gemma-3-12b, 48867 / 3077 x 8192 = 130,100 tokens where 0.19.0 printed 130,304."""
    arch = load_arch("google/gemma-3-12b-it")
    sizing = tune(arch, H100, tensor_parallel_size=1, max_model_len=8192, vllm_version="0.33.0",
                  kv_cache_memory_bytes=48867 * kv_layout(arch).bytes_per_block, max_num_batched_tokens=8192,
                  max_num_seqs=1024)
    assert sizing.kv_cache_blocks == 48867 and sizing.kv_cache_tokens == 130100
    assert sizing.log_lines()[-1] == ("GPU KV cache size: 130,100 tokens, Maximum concurrency for 8,192 tokens per "
                                      "request: 15.88x")
