"""A model outside templates/models, read from the Hugging Face Hub through the real huggingface_hub client: from a
Hub served on loopback in the Hub's own URL layout (tests/hub_server.py), gated, pinned, moved, and offline."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import compat_data, stack_document
from hub_server import Hub, Repo, serve
from test_workloads import names_in
from triarch import cli, hub
from triarch.tuner.model_files import hub_config

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hub"
MISTRAL = "mistralai/Mistral-7B-Instruct-v0.3"
MISTRAL_CONFIG = (FIXTURES / "mistralai--Mistral-7B-Instruct-v0.3" / "config.json").read_bytes()
MISTRAL_PARAMETERS = 7_248_023_552
"""Its safetensors' parameters: the shapes in tests/fixtures/hub/README.md added up."""
OLD = "1111111111111111111111111111111111111111"
NEW = "2222222222222222222222222222222222222222"
"""Made-up commits of the loopback Hub's repositories."""
TOKEN = "hf_loopbackTestToken0123456789"


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty Triarch Hub cache, no token, and nothing this process read before."""
    root = tmp_path / "hub-cache"
    monkeypatch.setenv("TRIARCH_HUB_CACHE", str(root))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    hub.forget()
    yield root
    hub.forget()


@pytest.fixture
def loopback(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    """Mistral-7B-Instruct-v0.3, gated as on the Hub, at commit OLD on main; HF_ENDPOINT pointing at it."""
    repos = {MISTRAL: Repo(refs={"main": OLD}, commits={OLD: {"config.json": MISTRAL_CONFIG}}, gated=True,
                           parameters={"BF16": MISTRAL_PARAMETERS})}
    with serve(Hub(repos, token=TOKEN)) as served:
        monkeypatch.setenv("HF_ENDPOINT", served.url)
        yield served


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def _tune(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert cli.main(["tune", "--model", MISTRAL, "--gpu", "l4", *args, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert isinstance(document, dict)
    return document


# --- read through the client, from the Hub's URL layout ----------------------------------------------------

def test_tune_sizes_a_model_the_catalog_lacks_from_the_hub(loopback: Hub, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    doc = _tune(capsys)
    assert doc["num_parameters"] == MISTRAL_PARAMETERS  # the tuner's count from config.json = the checkpoint's
    assert doc["kv_bytes_per_token"] == 32 * 2 * 8 * 128 * 2  # 32 layers, K and V, 8 KV heads of 128, bf16
    assert doc["hub"] == {"repo": MISTRAL, "revision": "main", "commit": OLD, "notes": []}
    base = f"/{MISTRAL}/resolve/{OLD}/config.json"
    # Exactly these, each with the token: the model's info, then its config.json pinned to the commit read.
    assert loopback.requests == [("GET", f"/api/models/{MISTRAL}/revision/main", True), ("HEAD", base, True),
                                 ("GET", base, True)]
    # Read once: the next process (a new plan) asks the Hub which commit main is, not for the file again.
    hub.forget()
    loopback.requests.clear()
    assert _tune(capsys)["hub"]["commit"] == OLD
    assert loopback.requests == [("GET", f"/api/models/{MISTRAL}/revision/main", True)]


def test_the_files_beside_config_json_are_read_too(hub_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """An embedding fine-tune: its sentence-transformers config bounds the context vLLM derives."""
    qwen = json.loads((Path(__file__).resolve().parents[1] / "templates" / "models"
                       / "Qwen--Qwen3-Embedding-0.6B.json").read_text())
    files = {"config.json": json.dumps({k: v for k, v in qwen.items() if not k.startswith("_")}).encode(),
             "sentence_bert_config.json": b'{"max_seq_length": 512, "do_lower_case": false}'}
    with serve(Hub({"acme/qwen3-embed-ft": Repo(refs={"main": NEW}, commits={NEW: files})})) as served:
        monkeypatch.setenv("HF_ENDPOINT", served.url)
        assert cli.main(["tune", "--model", "acme/qwen3-embed-ft", "--gpu", "l4", "--task", "embed", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert ("GET", f"/acme/qwen3-embed-ft/resolve/{NEW}/sentence_bert_config.json", False) in served.requests
    assert doc["context_limit"] == 512
    # Files the repository does not list are not asked for (a tokenizer_config.json here).
    assert not any("tokenizer_config" in path for _, path, _ in served.requests)


def test_the_checkpoint_dtype_fills_a_config_that_names_none(hub_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    config = {k: v for k, v in json.loads(MISTRAL_CONFIG).items() if k != "torch_dtype"}
    repos = {"acme/mistral-f32": Repo(refs={"main": NEW}, commits={NEW: {"config.json": json.dumps(config).encode()}},
                                      parameters={"F32": MISTRAL_PARAMETERS})}
    with serve(Hub(repos)) as served:
        monkeypatch.setenv("HF_ENDPOINT", served.url)
        read = hub.resolve("acme/mistral-f32")
    assert read.checkpoint_dtype == "float32" and hub_config(read)["torch_dtype"] == "float32"


# --- what the Hub refuses, in one line ---------------------------------------------------------------------

def test_a_gated_model_without_a_token_says_to_set_hf_token(loopback: Hub, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tune", "--model", MISTRAL, "--gpu", "l4"]) == 2
    line = _one_error_line(capsys)
    assert "gated" in line and "set HF_TOKEN" in line and MISTRAL in line
    assert loopback.requests == [("GET", f"/api/models/{MISTRAL}/revision/main", False)]


def test_a_token_without_access_is_refused_without_being_shown(loopback: Hub, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_notGrantedToken0123456789")
    assert cli.main(["model", "fetch", MISTRAL]) == 2
    line = _one_error_line(capsys)
    assert "refused" in line and "accept the license" in line and "hf_notGranted" not in line


def test_an_unknown_architecture_is_refused_naming_the_known_ones(hub_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    config = {**json.loads(MISTRAL_CONFIG), "model_type": "rwkv", "architectures": ["RwkvForCausalLM"]}
    repos = {"acme/rwkv-7b": Repo(refs={"main": NEW}, commits={NEW: {"config.json": json.dumps(config).encode()}})}
    with serve(Hub(repos)) as served:
        monkeypatch.setenv("HF_ENDPOINT", served.url)
        assert cli.main(["model", "fetch", "acme/rwkv-7b"]) == 2
        line = _one_error_line(capsys)
        assert cli.main(["tune", "--model", "acme/rwkv-7b", "--gpu", "l4"]) == 2
        again = _one_error_line(capsys)
    for said in (line, again):
        assert f"acme/rwkv-7b at {NEW}: model_type 'rwkv' is not one the tuner knows" in said
        assert "known: " in said and "mistral" in said and "llama" in said


@pytest.mark.parametrize("args, named", [
    (["model", "fetch", "no-slash"], "org/name"),
    (["model", "fetch", MISTRAL, "--revision", "v9"], "no revision 'v9'"),
    (["model", "fetch", "acme/absent"], "is not on the Hub"),
    (["tune", "--model-config", "x/config.json", "--revision", OLD, "--gpu", "l4"], "--revision"),
])
def test_bad_input_is_one_line_and_exit_2(loopback: Hub, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str], args: list[str], named: str) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert cli.main(args) == 2
    assert named in _one_error_line(capsys)


# --- offline: both ways in, or the cache of an earlier read ------------------------------------------------

def test_offline_a_model_never_read_names_both_ways_in(hub_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tune", "--model", MISTRAL, "--gpu", "l4"]) == 2  # HF_ENDPOINT: a closed loopback port
    line = _one_error_line(capsys)
    assert f"`triarch model fetch {MISTRAL}`" in line and "--model-config path/to/config.json" in line
    assert "cannot be reached" in line


def test_offline_a_model_read_before_is_sized_from_the_cache_saying_so(
        loopback: Hub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert cli.main(["model", "fetch", MISTRAL]) == 0
    out = capsys.readouterr().out
    assert f"{MISTRAL} at {OLD} (main): MistralForCausalLM (model_type mistral), 7.25B parameters in BF16" in out
    assert f"revision: {OLD}" in out
    hub.forget()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loopback.requests.clear()
    doc = _tune(capsys)
    assert loopback.requests == []  # HF_HUB_OFFLINE: not asked at all
    assert doc["hub"]["commit"] == OLD and doc["num_parameters"] == MISTRAL_PARAMETERS
    assert "HF_HUB_OFFLINE" in doc["hub"]["notes"][0] and f"sized at {OLD}" in doc["hub"]["notes"][0]


def test_a_hub_that_is_down_is_as_unreachable(loopback: Hub, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    loopback.down = True
    assert cli.main(["tune", "--model", MISTRAL, "--gpu", "l4"]) == 2
    line = _one_error_line(capsys)
    assert "answered 503" in line and f"`triarch model fetch {MISTRAL}`" in line
    loopback.down = False
    assert cli.main(["model", "fetch", MISTRAL]) == 0
    capsys.readouterr()
    hub.forget()
    loopback.down = True
    assert f"answered 503: {MISTRAL} is sized at {OLD}" in _tune(capsys)["hub"]["notes"][0]


# --- a stack: pinned, moved, and what a plan writes --------------------------------------------------------

def _stack(tmp_path: Path, **model: Any) -> Path:
    document = stack_document("dev")
    document["triarch:models"] = [{"name": "chat", "model": MISTRAL, "engine": "vllm", "nodeGroup": "l4",
                                   "maxModelLen": 8192, **model}]
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump({"config": document}), encoding="utf-8")
    return path


def _plan(tmp_path: Path, path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, dict[str, Any], list[str]]:
    out = tmp_path / "out"
    assert cli.main(["plan", "--stack-file", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    capacity = json.loads((out / "capacity.json").read_text())
    deployment = yaml.safe_load((out / "manifests" / "deployment-llm-chat.yaml").read_text())
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return printed, capacity["models"][0]["hub"], args


def _move_main(loopback: Hub) -> None:
    repo = loopback.repos[MISTRAL]
    repo.commits[NEW] = dict(repo.commits[OLD])
    repo.refs["main"] = NEW
    hub.forget()


def test_a_pinned_revision_is_sized_and_served_when_main_has_moved(
        loopback: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    _move_main(loopback)
    printed, read, args = _plan(tmp_path, _stack(tmp_path, revision=OLD), capsys)
    assert read == {"repo": MISTRAL, "revision": OLD, "commit": OLD, "pinned": True}
    assert args[args.index(MISTRAL) + 1: args.index(MISTRAL) + 3] == ["--revision", OLD]
    assert f"chat: {MISTRAL} at {OLD}, pinned" in printed
    # --revision is an engine arg of the vLLM the image bundles (the release's own list, reference data).
    known = names_in("vllm-0.33.0", "engine-args.txt", "frontend-args.txt") | set(
        compat_data("vllm-serve-flags")["0.33.0"])
    assert [a for a in args if a.startswith("--") and a[2:].replace("-", "_") not in known] == []
    # The Hub said it is gated and the stack gives its pods no token: the plan warns before any pod fails with 401.
    assert f"model 'chat' ({MISTRAL}) is gated on Hugging Face" in printed
    assert not any(f"/revision/{NEW}" in p or p.endswith("/revision/main") for _, p, _ in loopback.requests)


def test_an_unpinned_plan_says_main_moved_and_which_commit_it_sized(
        loopback: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    path = _stack(tmp_path)
    _, first, args = _plan(tmp_path, path, capsys)
    assert first["commit"] == OLD and "--revision" not in args
    _move_main(loopback)
    printed, read, args = _plan(tmp_path, path, capsys)
    assert read == {"repo": MISTRAL, "revision": "main", "commit": NEW, "pinned": False}
    assert "--revision" not in args  # unpinned: vLLM loads main
    assert f"chat: {MISTRAL} at {NEW} (main), not pinned" in printed and f"revision: {NEW}" in printed
    assert f"chat: revision 'main' of {MISTRAL} has moved: {NEW} now, {OLD} when last read" in printed


def test_a_plan_offline_names_modelconfig_and_the_fetch_command(hub_cache: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "--stack-file", str(_stack(tmp_path, revision=OLD)), "--out", str(tmp_path / "o")]) == 2
    line = _one_error_line(capsys)
    assert line.startswith("error: triarch:models[0].model: ")
    assert f"`triarch model fetch {MISTRAL} --revision {OLD}`" in line and "modelConfig: path/to/config.json" in line


def test_the_token_is_never_written(loopback: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str], hub_cache: Path) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    printed, _, _ = _plan(tmp_path, _stack(tmp_path), capsys)
    assert TOKEN not in printed
    written = [p for root in (tmp_path / "out", hub_cache) for p in root.rglob("*") if p.is_file()]
    assert any(p.name == "config.json" for p in written) and any(p.suffix == ".json" for p in written)
    assert not [p for p in written if TOKEN.encode() in p.read_bytes()]


def test_a_pinned_branch_reaches_ray_serve_llm_as_the_commit_read(loopback: Hub,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from triarch.catalog import catalog
    from triarch.config import from_pulumi_config
    from triarch.planners.models import plan_models
    from triarch.planners.ray import llm_config

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    document = stack_document("dev")
    document["triarch:models"] = [{"name": "chat", "model": MISTRAL, "engine": "ray-serve", "nodeGroup": "l4",
                                   "maxModelLen": 8192, "revision": "main"}]
    config = {k: v if isinstance(v, str) else json.dumps(v) for k, v in document.items()}
    (plan,) = plan_models(from_pulumi_config(config), catalog())
    assert llm_config(plan)["engine_kwargs"]["revision"] == OLD
    # An engine arg of the vLLM inside ray[llm] 2.60.0, which LLMConfig hands its engine_kwargs to.
    assert "revision" in names_in("vllm-0.29.0", "engine-args.txt")
    assert llm_config(plan)["model_loading_config"]["model_source"] == MISTRAL


def test_a_catalog_model_is_read_from_the_hub_only_at_a_pinned_revision(hub_cache: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from triarch.tuner import find_arch

    llama = "meta-llama/Meta-Llama-3-8B"  # in templates/models: 32 layers
    config = {**json.loads(MISTRAL_CONFIG), "num_hidden_layers": 2}
    repos = {llama: Repo(refs={"v1": NEW}, commits={NEW: {"config.json": json.dumps(config).encode()}})}
    with serve(Hub(repos)) as served:
        monkeypatch.setenv("HF_ENDPOINT", served.url)
        arch, read = find_arch(llama)
        assert (arch.num_hidden_layers, read, served.requests) == (32, None, [])
        arch, read = find_arch(llama, revision="v1")
    assert arch.num_hidden_layers == 2 and read is not None and read.commit == NEW


def _mistral_shapes(layers: range) -> dict[str, list[int]]:
    """The published tensor shapes of Mistral-7B-Instruct-v0.3 (tests/fixtures/hub/README.md) of these layers."""
    shapes = {}
    for i in layers:
        for part, shape in (("self_attn.q_proj", [4096, 4096]), ("self_attn.k_proj", [1024, 4096]),
                            ("self_attn.v_proj", [1024, 4096]), ("self_attn.o_proj", [4096, 4096]),
                            ("mlp.gate_proj", [14336, 4096]), ("mlp.up_proj", [14336, 4096]),
                            ("mlp.down_proj", [4096, 14336]), ("input_layernorm", [4096]),
                            ("post_attention_layernorm", [4096])):
            shapes[f"model.layers.{i}.{part}.weight"] = shape
    return shapes


def _safetensors_header(shapes: dict[str, list[int]]) -> bytes:
    """The start of a safetensors file of these BF16 tensors: its header's length, then the header (no data)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        size = math.prod(shape) * 2
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw


def test_a_hub_that_does_not_count_parameters_has_its_safetensors_headers_read(
        hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mirror without the Hub's count: the client reads each shard's header by a range request."""
    shards = {"model-00001-of-00003.safetensors": {"model.embed_tokens.weight": [32768, 4096],
                                                   **_mistral_shapes(range(0, 11))},
              "model-00002-of-00003.safetensors": _mistral_shapes(range(11, 22)),
              "model-00003-of-00003.safetensors": {**_mistral_shapes(range(22, 32)), "model.norm.weight": [4096],
                                                   "lm_head.weight": [32768, 4096]}}
    index = {"metadata": {}, "weight_map": {tensor: shard for shard, tensors in shards.items() for tensor in tensors}}
    files = {"config.json": MISTRAL_CONFIG, "model.safetensors.index.json": json.dumps(index).encode(),
             **{shard: _safetensors_header(tensors) for shard, tensors in shards.items()}}
    with serve(Hub({"acme/mistral-mirror": Repo(refs={"main": NEW}, commits={NEW: files})})) as served:
        monkeypatch.setenv("HF_ENDPOINT", served.url)
        read = hub.fetch("acme/mistral-mirror")
    assert dict(read.parameters) == {"BF16": MISTRAL_PARAMETERS}
    assert [p for m, p, _ in served.requests if m == "GET" and p.endswith(".safetensors")] == [
        f"/acme/mistral-mirror/resolve/{NEW}/model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
