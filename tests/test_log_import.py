"""bench/import_vllm_logs.py reads what a vLLM V1 start-up log prints, and why a failed start failed."""
# ruff: noqa: E501  (the log lines are quoted whole, as vLLM prints them)

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from conftest import bench_module

BENCH = Path(__file__).resolve().parents[1] / "bench"


def importer() -> ModuleType:
    return bench_module("import_vllm_logs")


LOG = """\
(APIServer pid=1) INFO 04-22 00:03:35 [entrypoints/utils.py:233] non-default args: {'model_tag': 'm', 'model': 'org/m', 'max_model_len': 8192, 'gpu_memory_utilization': 0.95, 'enable_prefix_caching': False}
(APIServer pid=1) DEBUG 04-22 00:03:35 [engine/arg_utils.py:2232] Defaulting max_num_batched_tokens to 8192 for OPENAI_API_SERVER usage context.
(APIServer pid=1) DEBUG 04-22 00:03:35 [engine/arg_utils.py:2242] Defaulting max_num_seqs to 1024 for OPENAI_API_SERVER usage context.
(EngineCore pid=242) INFO 04-22 00:03:46 [v1/engine/core.py:105] Initializing a V1 LLM engine (v0.19.0) with config: model='org/m', dtype=torch.bfloat16, max_seq_len=8192, quantization=None, kv_cache_dtype=auto, x=1
(EngineCore pid=242) DEBUG 04-22 00:03:47 [v1/worker/gpu_worker.py:284] worker init memory snapshot: torch_peak=0.0GiB, free_memory=78.68GiB, total_memory=79.19GiB, cuda_memory=0.51GiB, torch_memory=0.0GiB, non_torch_memory=0.51GiB, timestamp=1.0, auto_measure=True
(EngineCore pid=242) INFO 04-22 00:04:02 [v1/worker/gpu_model_runner.py:4820] Model loading took 14.99 GiB memory and 14.429680 seconds
(EngineCore pid=242) DEBUG 04-22 00:04:20 [v1/worker/gpu_worker.py:435] Memory profiling takes 17.96 seconds. Total non KV cache memory: 17.12GiB; torch peak memory increase: 1.89GiB; non-torch forward increase memory: 0.25GiB; weights memory: 14.99GiB.
(EngineCore pid=242) INFO 04-22 00:04:20 [v1/worker/gpu_worker.py:436] Available KV cache memory: 58.11 GiB
(EngineCore pid=242) INFO 04-22 00:04:20 [v1/core/kv_cache_utils.py:1319] GPU KV cache size: 476,016 tokens
(EngineCore pid=242) INFO 04-22 00:04:20 [v1/core/kv_cache_utils.py:1324] Maximum concurrency for 8,192 tokens per request: 58.11x
(APIServer pid=1) DEBUG 04-22 00:04:31 [v1/metrics/loggers.py:273] Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: 29751
"""


def test_a_started_log_gives_its_settings_and_numbers(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    path.write_text(LOG)
    case = importer().read_log(path)
    assert case["model"] == "org/m" and "failed" not in case
    assert case["settings"] == {"max_model_len": 8192, "gpu_memory_utilization": 0.95, "dtype": "bfloat16",
                                "max_num_seqs": 1024, "max_num_batched_tokens": 8192}
    assert case["logged"] == {"vllm_version": "0.19.0", "total_gib": 79.19, "init_non_torch_gib": 0.51,
                              "weights_gib": 14.99, "non_kv_gib": 17.12, "activation_gib": 1.89, "non_torch_gib": 0.25,
                              "available_kv_gib": 58.11, "kv_tokens": 476016, "kv_blocks": 29751,
                              "max_concurrency": 58.11}


def test_a_failed_start_keeps_vllms_reason(tmp_path: Path) -> None:
    path = tmp_path / "run.FAILED.log"
    path.write_text(LOG.splitlines()[0] + "\n(APIServer pid=1)   Value error, User-specified max_model_len (8192) is "
                    "greater than the derived max_model_len (max_position_embeddings=2048.0 or model_max_length=None "
                    "in model's config.json).\n")
    case = importer().read_log(path)
    assert case["failed"].startswith("User-specified max_model_len (8192) is greater than the derived")
