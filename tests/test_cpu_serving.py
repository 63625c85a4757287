"""What the data plane's tests run, checked without an engine: the tiny models keep what decides how vLLM treats a
model, a planned container becomes the CPU engine's argv with only the listed replacements, the engine's own reason
is read from its output, and each of Triarch's engines is stood for by the CPU build closest to its pinned image."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import StackPlan, compat_data
from triarch import cli
from triarch.local import dataplane
from triarch.local.cpu_serving import EngineFailed, cpu_command, engine_error, expand
from triarch.local.tiny_models import VOCABULARY, make, make_adapter, prompt, shared, tiny_config

PYTHON = Path("/venv/bin/python")


def container(args: list[str], **extra: Any) -> dict[str, Any]:
    return {"name": "vllm", "command": ["vllm", "serve"], "args": args,
            "env": [{"name": "HF_HOME", "value": "/models/huggingface"}], **extra}


def argv_after_serve(argv: list[str]) -> list[str]:
    return argv[argv.index("serve") + 1:]


def test_a_tiny_qwen3_keeps_its_context_head_size_and_grouped_attention() -> None:
    real = json.loads(Path("templates/models/Qwen--Qwen3-8B.json").read_text())
    tiny, left_out = tiny_config(real)
    assert (tiny["architectures"], tiny["model_type"]) == (["Qwen3ForCausalLM"], "qwen3")
    assert tiny["max_position_embeddings"] == 40960  # vLLM refuses a longer --max-model-len
    assert tiny["head_dim"] == 128
    assert (tiny["num_attention_heads"], tiny["num_key_value_heads"]) == (2, 1)  # 32:8 stays grouped
    assert tiny["num_hidden_layers"] == 2 and tiny["hidden_size"] == 128
    assert tiny["vocab_size"] == len(VOCABULARY)
    assert left_out == {}


def test_a_tiny_deepseek_v3_keeps_mla_and_its_yarn_context_and_drops_fp8_weights() -> None:
    real = json.loads(Path("templates/models/deepseek-ai--DeepSeek-V3.json").read_text())
    tiny, left_out = tiny_config(real)
    assert (tiny["kv_lora_rank"], tiny["qk_rope_head_dim"], tiny["qk_nope_head_dim"], tiny["v_head_dim"]) == (
        512, 64, 128, 128)
    assert tiny["rope_scaling"] == real["rope_scaling"]
    assert "head_dim" not in tiny
    assert tiny["n_routed_experts"] == 4 and tiny["num_experts_per_tok"] == 2 and tiny["n_group"] == 1
    assert "quantization_config" not in tiny and "FP8" in left_out["quantization_config"]


def test_a_tiny_model_directory_has_a_tokenizer_whose_prompts_are_as_long_as_asked(tmp_path: Path) -> None:
    model = make("Qwen/Qwen3-Embedding-0.6B", tmp_path)
    tokenizer = json.loads((tmp_path / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    text = prompt(37, seed=3)
    assert len(text.split()) == 37 and all(word in vocab for word in text.split())
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["model_max_length"] == 32768
    assert model.mla is False and json.loads((tmp_path / "config.json").read_text())["num_key_value_heads"] == 1


def test_a_shared_tiny_model_keeps_its_path_from_run_to_run(tmp_path: Path) -> None:
    """vLLM keys its compile cache by the model's path: the same model must land in the same directory each time
    (and another model elsewhere), written once, with what `make` writes."""
    first = shared("Qwen/Qwen3-8B", tmp_path)
    (first.directory / "config.json").touch()
    before = (first.directory / "config.json").stat().st_mtime_ns
    again = shared("Qwen/Qwen3-8B", tmp_path)
    other = shared("Qwen/Qwen3-Embedding-0.6B", tmp_path)
    assert again.directory == first.directory and other.directory != first.directory
    assert (first.directory / "config.json").stat().st_mtime_ns == before  # not written again
    made = make("Qwen/Qwen3-8B", tmp_path / "made")
    assert {f.name: f.read_text() for f in first.directory.iterdir()} == {
        f.name: f.read_text() for f in made.directory.iterdir()}
    assert (first.source, first.left_out, first.mla) == (made.source, made.left_out, made.mla)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no staging left


def test_the_cpu_command_replaces_only_what_cannot_run_here(tmp_path: Path) -> None:
    model = make("Qwen/Qwen3-8B", tmp_path / "m")
    planned = ["Qwen/Qwen3-8B", "--revision", "abc123", "--served-model-name", "chat", "--host", "0.0.0.0",
               "--port", "8000", "--shutdown-timeout", "60", "--tensor-parallel-size", "1", "--max-model-len",
               "8192", "--max-num-seqs", "8", "--block-size", "16", "--no-enable-prefix-caching"]
    command = cpu_command(container(planned), model, PYTHON, tmp_path / "w")
    argv = argv_after_serve(command.argv)
    assert argv == [str(model.directory), "--served-model-name", "chat", "--host", "0.0.0.0", "--port", "8000",
                    "--shutdown-timeout", "60", "--tensor-parallel-size", "1", "--max-model-len", "8192",
                    "--max-num-seqs", "8", "--block-size", "32", "--no-enable-prefix-caching", "--load-format",
                    "dummy", "--enforce-eager", "--num-gpu-blocks-override", "512"]  # two 8,192-token contexts
    assert {r.what for r in command.replacements} == {
        "command", "model", "--revision", "--load-format", "--enforce-eager", "--block-size",
        "--num-gpu-blocks-override", "env HOME",
        "env HF_HOME", "env VLLM_CACHE_ROOT", "env HF_HUB_OFFLINE", "env VLLM_CPU_KVCACHE_SPACE",
        "env VLLM_CPU_OMP_THREADS_BIND", "env OMP_NUM_THREADS", "env TMPDIR", "env VLLM_ENABLE_V1_MULTIPROCESSING"}
    assert command.env["HF_HOME"] != "/models/huggingface" and command.env["HF_HUB_OFFLINE"] == "1"
    assert command.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert (command.host, command.port) == ("127.0.0.1", 8000)


def test_engines_of_one_environment_share_its_vllm_cache_and_keep_their_own_home(tmp_path: Path) -> None:
    """The plan keeps VLLM_CACHE_ROOT on the model cache volume, shared by a pod's restarts; here every engine of an
    environment shares one, so no start works out again what vLLM cached of an architecture (or its compiled graphs)."""
    model = make("Qwen/Qwen3-8B", tmp_path / "m")
    python = tmp_path / "vllm-0.32" / "4522720ebcc1" / "venv" / "bin" / "python"
    planned = container(["Qwen/Qwen3-8B", "--port", "8000"])
    first = cpu_command(planned, model, python, tmp_path / "first")
    second = cpu_command(planned, model, python, tmp_path / "second")
    shared = str(tmp_path / "vllm-0.32" / "4522720ebcc1" / "vllm-cache")
    assert first.env["VLLM_CACHE_ROOT"] == second.env["VLLM_CACHE_ROOT"] == shared
    assert (first.env["HOME"], second.env["HOME"]) == (str(tmp_path / "first" / "home"),
                                                       str(tmp_path / "second" / "home"))
    other = cpu_command(planned, model, tmp_path / "vllm-0.29" / "d1" / "venv" / "bin" / "python", tmp_path / "third")
    assert other.env["VLLM_CACHE_ROOT"] == str(tmp_path / "vllm-0.29" / "d1" / "vllm-cache")


def test_the_engines_temporary_files_are_the_users_own(tmp_path: Path) -> None:
    """The plan sets USER=ray, so PyTorch's compile cache is /tmp/torchinductor_ray for every user of a host: the
    engines' TMPDIR is in the environment's cache, the user's own, shared by its engines (a pod's /tmp is its own)."""
    model = make("Qwen/Qwen3-8B", tmp_path / "m")
    python = tmp_path / "vllm-0.32" / "4522720ebcc1" / "venv" / "bin" / "python"
    planned = container(["Qwen/Qwen3-8B", "--port", "8000"])
    first = cpu_command(planned, model, python, tmp_path / "first")
    second = cpu_command(planned, model, python, tmp_path / "second")
    assert first.env["TMPDIR"] == second.env["TMPDIR"] == str(tmp_path / "vllm-0.32" / "4522720ebcc1" / "tmp")
    assert Path(first.env["TMPDIR"]).is_dir()  # tempfile falls back to /tmp where TMPDIR is not a directory


def test_a_gang_pod_gets_its_group_address_and_keeps_its_pipeline(tmp_path: Path) -> None:
    """LeaderWorkerSet's variables expand as Kubernetes expands $(VAR); tensor-parallel ranks shrink to one per node,
    the stages across nodes stay, the object-store streamer becomes random weights, and with pipeline stages no
    --enforce-eager is added (the CPU runner's stages need its compile warm-up)."""
    model = make("deepseek-ai/DeepSeek-V3", tmp_path / "m")
    planned = ["s3://bucket/deepseek/", "--load-format", "runai_streamer", "--model-loader-extra-config",
               '{"concurrency": 32}', "--tensor-parallel-size", "8", "--pipeline-parallel-size", "2",
               "--block-size", "16", "--nnodes", "2", "--node-rank", "$(LWS_WORKER_INDEX)", "--master-addr",
               "$(LWS_LEADER_ADDRESS)", "--headless"]
    command = cpu_command(container(planned), model, PYTHON, tmp_path / "w",
                          {"LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_WORKER_INDEX": "1"})
    argv = argv_after_serve(command.argv)
    assert argv == [str(model.directory), "--load-format", "dummy", "--tensor-parallel-size", "1",
                    "--pipeline-parallel-size", "2", "--block-size", "16", "--nnodes", "2", "--node-rank", "1",
                    "--master-addr", "127.0.0.1", "--headless"]
    replaced = {r.what: r for r in command.replacements}
    assert replaced["--load-format"].planned == "runai_streamer"
    assert replaced["--model-loader-extra-config"].used is None
    assert replaced["--tensor-parallel-size"].planned == "8"
    assert "--block-size" not in replaced and "--enforce-eager" not in replaced  # MLA keeps 16; stages compile
    assert any("quantization_config" in what for what in replaced)


def test_pods_sharing_a_namespace_each_bind_their_own_address(tmp_path: Path) -> None:
    model = make("Qwen/Qwen3-8B", tmp_path / "m")
    command = cpu_command(container(["Qwen/Qwen3-8B", "--host", "0.0.0.0", "--port", "8000"]), model, PYTHON,
                          tmp_path / "w", host="198.18.128.7")
    argv = argv_after_serve(command.argv)
    assert argv[argv.index("--host") + 1] == "198.18.128.7"
    assert (command.host, command.port) == ("198.18.128.7", 8000)


def test_only_the_given_adapters_paths_are_replaced_and_the_slots_kept(tmp_path: Path) -> None:
    model = make("Qwen/Qwen3-8B", tmp_path / "m")
    planned = ["Qwen/Qwen3-8B", "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16", "--lora-modules",
               "support=/models/adapters/support", "legal=/models/adapters/legal", "--port", "8000"]
    command = cpu_command(container(planned), model, PYTHON, tmp_path / "w", adapters={"support": tmp_path / "a"})
    argv = argv_after_serve(command.argv)
    at = argv.index("--lora-modules")
    assert argv[at + 1:at + 4] == [f"support={tmp_path / 'a'}", "legal=/models/adapters/legal", "--port"]
    assert argv[argv.index("--max-loras") + 1] == "2" and argv[argv.index("--max-lora-rank") + 1] == "16"
    [replaced] = [r for r in command.replacements if "lora" in r.what]
    assert (replaced.what, replaced.planned, replaced.used) == (
        "--lora-modules support", "/models/adapters/support", str(tmp_path / "a"))


def test_a_tiny_adapter_is_a_peft_lora_of_the_tiny_models_shapes(tmp_path: Path) -> None:
    """Qwen3's tiny model: hidden 128, two query heads and one KV head of 128 (its real head size)."""
    model = make("Qwen/Qwen3-8B", tmp_path / "m")
    adapter = make_adapter(model, tmp_path / "a", rank=8)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["target_modules"]) == ("LORA", 8, ["q_proj", "v_proj"])
    raw = (adapter / "adapter_model.safetensors").read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + length])
    assert (8 + length) % 8 == 0
    shapes = {k: v["shape"] for k, v in header.items() if k != "__metadata__"}
    assert shapes["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"] == [256, 8]
    assert shapes["base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight"] == [128, 8]
    assert shapes["base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight"] == [8, 128]
    assert len(shapes) == 8  # two layers, two modules, A and B
    assert len(raw) == 8 + length + 4 * sum(a * b for a, b in shapes.values())


def test_a_container_that_is_not_vllm_serve_is_refused(tmp_path: Path) -> None:
    model = make("Qwen/Qwen3-8B", tmp_path / "m")
    with pytest.raises(EngineFailed, match="not `vllm serve`"):
        cpu_command({"command": ["python", "-m", "x"], "args": ["Qwen/Qwen3-8B"]}, model, PYTHON, tmp_path)


def test_kubernetes_expansion_leaves_unknown_variables_as_written() -> None:
    assert expand("$(A)-$(B)-$$", {"A": "1"}) == "1-$(B)-$$"


@pytest.mark.parametrize(("log", "line"), [
    ("usage: vllm serve ...\nvllm serve: error: unrecognized arguments: --swap-space 4\n",
     "unrecognized arguments: --swap-space 4"),
    ("(APIServer pid=1) pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
     "  Value error, User-specified max_model_len (65536) is greater than the derived max_model_len\n",
     "ValidationError: 1 validation error for ModelConfig: User-specified max_model_len (65536) is greater than "
     "the derived max_model_len"),
    ("(EngineCore pid=2) ValueError: No common block size for 16.\n(APIServer pid=1) RuntimeError: Engine core "
     "initialization failed. See root cause above.\n(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: "
     "dead\n", "ValueError: No common block size for 16."),
    ("INFO all is well\n", None),
])
def test_the_engines_own_reason_is_read_from_its_output(log: str, line: str | None) -> None:
    assert engine_error(log) == line


def test_each_engine_is_stood_for_by_the_closest_cpu_build_to_its_pinned_image(shipped: dict[str, StackPlan]) -> None:
    """The plain vLLM image's release and the Ray image's vLLM, against the CPU builds the environments pin: each is
    the newest CPU build not newer than the image's vLLM."""
    images = compat_data("images")["images"]
    environments = dataplane.load_environments()
    builds = sorted({e.vllm for e in environments.values()}, key=lambda v: tuple(int(p) for p in v.split(".")))
    planned = {c["image"] for plan in shipped.values() for d in plan.objects()
               for template in ([d["spec"]["template"]] if d["kind"] == "Deployment" else [])
               for c in template["spec"]["containers"]}
    vllm_images = sorted(i for i in planned if i.startswith("vllm/vllm-openai:"))
    assert vllm_images, planned
    for image in vllm_images:
        repository, tag = image.split(":")
        release = tuple(int(p) for p in images[repository][tag]["vllm"].split("."))
        closest = [b for b in builds if tuple(int(p) for p in b.split(".")) <= release][-1]
        assert dataplane.for_engine("vllm").vllm == closest, image
    ray = dataplane.for_engine("ray-serve")
    assert ray.ray == "2.60.0" and ray.vllm == "0.29.0"


def test_an_unknown_engine_to_build_is_refused_naming_what_is_allowed(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["local", "build", "vllm-9"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "unknown engine vllm-9" in line and "vllm-0.32" in line and "kube-apiserver" not in line


def test_a_tiny_deepseek_v2_lite_keeps_its_queries_without_lora_and_routes_as_the_real_one() -> None:
    real = json.loads(Path("templates/models/deepseek-ai--DeepSeek-V2-Lite-Chat.json").read_text())
    tiny, _ = tiny_config(real)
    assert tiny["q_lora_rank"] is None
    assert (tiny["topk_method"], tiny["scoring_func"], tiny["n_group"], tiny["topk_group"]) == (
        "greedy", "softmax", 1, 1)


def test_a_missing_environment_skips_in_one_line_naming_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    from dataplane import require_dataplane

    monkeypatch.setattr(dataplane, "installed", lambda environment, cache=None: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        require_dataplane()
    line = str(skipped.value)
    assert "\n" not in line
    assert "data-plane environment vllm-0.32, ray-2.60 not built" in line
    assert "`uv run triarch local build vllm-0.32 ray-2.60`" in line


def test_a_missing_environment_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    from dataplane import require_dataplane

    monkeypatch.setattr(dataplane, "installed", lambda environment, cache=None: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"uv run triarch local build vllm-0\.32 ray-2\.60"):
        require_dataplane()


def test_an_environment_is_synced_from_the_lock_into_a_cache_keyed_by_it(tmp_path: Path) -> None:
    """`uv sync --locked` of the environment's extra into <cache>/<name>/<digest>/venv, its bytecode compiled once;
    an earlier digest's directory goes, and only a complete sync counts as built."""
    environment = dataplane.for_engine("vllm")
    stale = tmp_path / environment.name / "0123456789ab"
    stale.mkdir(parents=True)
    ran: list[list[str]] = []

    def sync(argv: list[str], env: dict[str, str]) -> None:
        ran.append(argv)
        assert env["UV_PROJECT_ENVIRONMENT"] == str(environment.directory(tmp_path) / "venv")
        assert dataplane.installed(environment, tmp_path) is None  # not built until the sync completed

    python = dataplane.build(environment, tmp_path, run=sync)
    [argv] = ran
    assert argv[1:] == ["sync", "--locked", "--project", str(dataplane.DATAPLANE_DIR), "--extra", "vllm-0-32",
                        "--python", argv[argv.index("--python") + 1], "--compile-bytecode", "--no-progress", "--quiet"]
    assert python == dataplane.installed(environment, tmp_path)
    assert not stale.exists()
