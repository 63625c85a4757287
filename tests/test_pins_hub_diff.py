"""Pins (issue 53) on what a user relies on in two places: what is read from the Hugging Face Hub and remembered
(triarch.hub, `triarch model fetch`), against the loopback Hub of tests/hub_server.py as test_hub uses it; and how
`triarch diff` reads workloads (triarch.engine_changes, triarch.diff, `triarch diff --plan`), on plan documents
written here by hand. Every expected value is written out from the documented behaviour, never computed by the code
under test."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hub_server import Hub, Repo, serve
from test_hub import MISTRAL, MISTRAL_CONFIG, NEW, OLD, TOKEN
from triarch import cli, hub
from triarch.diff import diff_plans
from triarch.engine_changes import EngineChange, engine_changes, vllm_release_changes

# --- the Hub: what is read, and what is remembered -----------------------------------------------------------


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty Triarch Hub cache, no token, nothing this process read before (as test_hub's fixture)."""
    root = tmp_path / "hub-cache"
    monkeypatch.setenv("TRIARCH_HUB_CACHE", str(root))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub.forget()
    yield root
    hub.forget()


@pytest.fixture
def gated_hub(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    """Mistral-7B-Instruct-v0.3 gated as on the Hub: main at OLD, tag v1 at NEW; HF_ENDPOINT pointing at it."""
    repos = {MISTRAL: Repo(refs={"main": OLD, "v1": NEW},
                           commits={OLD: {"config.json": MISTRAL_CONFIG}, NEW: {"config.json": MISTRAL_CONFIG}},
                           gated=True, parameters={"BF16": 7_248_023_552})}
    with serve(Hub(repos, token=TOKEN)) as served:
        monkeypatch.setenv("HF_ENDPOINT", served.url)
        yield served


def test_a_commit_read_before_is_served_from_the_cache_offline(gated_hub: Hub,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A stack pinned to a commit plans offline once that commit was fetched (hub.py docstring: "a revision read
    before is served from the cache"); a pinned read has not moved, so no note; the Hub is not asked at all
    (HF_HUB_OFFLINE)."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub.fetch(MISTRAL, OLD, TOKEN)
    hub.forget()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    gated_hub.requests.clear()
    read = hub.resolve(MISTRAL, OLD)
    assert (read.commit, read.revision, read.pinned, read.notes) == (OLD, OLD, True, ())
    assert read.describe() == f"{MISTRAL} at {OLD}"
    assert gated_hub.requests == []


def test_a_gated_model_read_before_is_still_gated_offline(gated_hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Hub's `gated: "manual"` is remembered with the commit (HubModel.gated: "the pods need a token too"), so a
    plan from the cache still warns that the pods need a token."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert hub.fetch(MISTRAL, None, TOKEN).gated is True
    hub.forget()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    read = hub.resolve(MISTRAL)
    assert (read.commit, read.gated) == (OLD, True)


def test_two_revisions_of_one_model_are_two_reads_in_one_process(gated_hub: Hub,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Two models of one stack on the same repository at different revisions are sized each at its own commit
    (main at OLD, tag v1 at NEW on this Hub), though one process asks the Hub once per model and revision."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert hub.resolve(MISTRAL, "main").commit == OLD
    assert hub.resolve(MISTRAL, "v1").commit == NEW
    assert hub.resolve(MISTRAL, "main").commit == OLD


def test_model_fetch_at_a_commit_prints_it_pinned(gated_hub: Hub, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`triarch model fetch M --revision <commit>`: named `M at <commit>` (HubModel.describe: no branch in brackets
    for a commit) and no advice to pin what is pinned already."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert cli.main(["model", "fetch", MISTRAL, "--revision", OLD]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(f"{MISTRAL} at {OLD}: MistralForCausalLM (model_type mistral)")
    assert "pin it in the stack" not in out


def test_model_fetch_counts_the_parameters_of_every_dtype(hub_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The Hub counts a checkpoint's parameters per safetensors dtype; the model has all of them: 7.0B in BF16 and
    0.25B in F32 are 7.25B parameters, and the checkpoint's dtype is the one holding most (bfloat16)."""
    repos = {"acme/mixed": Repo(refs={"main": NEW}, commits={NEW: {"config.json": MISTRAL_CONFIG}},
                                parameters={"BF16": 7_000_000_000, "F32": 250_000_000})}
    with serve(Hub(repos)) as served:
        monkeypatch.setenv("HF_ENDPOINT", served.url)
        assert cli.main(["model", "fetch", "acme/mixed"]) == 0
        out = capsys.readouterr().out
        read = hub.resolve("acme/mixed")
    assert "7.25B parameters in BF16, F32 (the Hub's count of its safetensors)" in out
    assert f"pin it in the stack: revision: {NEW}" in out
    assert read.parameter_count == 7_250_000_000
    assert read.checkpoint_dtype == "bfloat16"


def test_the_checkpoint_dtype_is_the_float_dtype_holding_most_parameters(tmp_path: Path) -> None:
    """FLOAT_DTYPES' docstring: the packed integers of a quantized checkpoint (I32) say nothing of its dtype; of the
    floats, the one holding most parameters names it, as config.json does (torch_dtype)."""
    quantized = hub.HubModel("acme/awq", "main", OLD, tmp_path, ("config.json",),
                             {"I32": 900_000_000, "F16": 300_000_000, "F32": 1_000_000})
    assert quantized.checkpoint_dtype == "float16"
    assert quantized.completed({"model_type": "mistral"}) == {"model_type": "mistral", "_name_or_path": "acme/awq",
                                                              "torch_dtype": "float16"}
    # a config.json that names its dtype keeps it
    assert quantized.completed({"torch_dtype": "bfloat16"})["torch_dtype"] == "bfloat16"


def test_a_repository_id_of_more_than_org_and_name_is_refused_before_asking(
        gated_hub: Hub, capsys: pytest.CaptureFixture[str]) -> None:
    """`org/name` only (the stack schema's `model` key; hub.REPO): a path with a third part is one line, exit 2,
    and the Hub is not asked."""
    assert cli.main(["model", "fetch", "mistralai/Mistral-7B-Instruct-v0.3/extra"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a Hugging Face repository id; allowed: org/name" in err[0]
    assert gated_hub.requests == []


def test_a_repository_the_hub_lacks_says_a_private_one_needs_a_token(gated_hub: Hub,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The Hub answers a repository it does not show the caller as not found (401 without a token): without
    HF_TOKEN the line says a private repository needs one; with a token given, it does not."""
    assert cli.main(["model", "fetch", "acme/private-model"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.endswith(f"model 'acme/private-model' is not on the Hub ({gated_hub.url}) (a private repository "
                         "needs HF_TOKEN)")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert cli.main(["model", "fetch", "acme/private-model"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.endswith(f"model 'acme/private-model' is not on the Hub ({gated_hub.url})")


# --- `triarch diff`: reading the workloads of two plans --------------------------------------------------------

STACK = "dev"
MODEL = "Qwen/Qwen3-8B"
DIGEST = "registry.example.com/mirror/vllm-openai@sha256:" + "ab" * 32
"""A mirrored image pinned by digest: only its triarch.dev/image-release annotation says which vLLM it is."""


def urn(type_: str, name: str) -> str:
    return f"urn:pulumi:{STACK}::triarch::{type_}::{name}"


def vllm_deployment(name: str, flags: list[str], image: str = "vllm/vllm-openai:v0.33.0",
                    release: str | None = None) -> dict[str, Any]:
    """A vLLM server's Deployment as plan.json records it: `vllm serve MODEL --flag value ...`."""
    annotations = {"triarch.dev/image-release": release} if release else {}
    container = {"name": "vllm", "image": image, "command": ["vllm", "serve"], "args": [MODEL, *flags]}
    return {"type": "kubernetes:apps/v1:Deployment", "name": name, "urn": urn("kubernetes:apps/v1:Deployment", name),
            "inputs": {"metadata": {"name": name, "namespace": "llm", "annotations": annotations},
                       "spec": {"template": {"spec": {"containers": [container]}}}}}


def ray_service(applications: list[dict[str, Any]]) -> dict[str, Any]:
    """A RayService whose serveConfigV2 (a YAML string, as KubeRay takes it) holds these Serve applications."""
    config = yaml.safe_dump({"applications": applications})
    return {"type": "kubernetes:ray.io/v1:RayService", "name": "llm",
            "urn": urn("kubernetes:ray.io/v1:RayService", "llm"),
            "inputs": {"metadata": {"name": "llm"}, "spec": {"serveConfigV2": config}}}


def plan(*resources: dict[str, Any]) -> dict[str, Any]:
    return {"stack": STACK, "resources": list(resources)}


def test_a_boolean_engine_flag_turned_on_is_reported_as_an_engine_arg() -> None:
    """docs/review.md: diff "lists engine args that change per model". `--enforce-eager` (a flag without value)
    added and `--max-model-len` changed are both engine args of the Deployment's model, named as vLLM's engine args
    are (underscores), before and after."""
    base = plan(vllm_deployment("chat", ["--max-model-len", "8192", "--port", "8000"]))
    head = plan(vllm_deployment("chat", ["--max-model-len", "4096", "--port", "8000", "--enforce-eager"]))
    assert engine_changes(base, head) == [EngineChange("chat", {"enforce_eager": (None, True),
                                                                "max_model_len": ("8192", "4096")})]
    assert engine_changes(head, head) == []


def test_each_role_of_a_split_ray_serve_model_is_read_on_its_own() -> None:
    """A prefill/decode model (docs/prefill-decode.md) is one Serve application with a prefill_config and a
    decode_config: a change to the decode role's engine kwargs is reported for `chat (decode)` alone."""
    def app(decode_seqs: int) -> dict[str, Any]:
        role = {"model_loading_config": {"model_id": "chat", "model_source": MODEL}}
        return {"name": "chat", "args": {
            "prefill_config": {**role, "engine_kwargs": {"max_num_seqs": 8, "max_model_len": 8192}},
            "decode_config": {**role, "engine_kwargs": {"max_num_seqs": decode_seqs, "max_model_len": 8192}}}}

    changes = engine_changes(plan(ray_service([app(64)])), plan(ray_service([app(128)])))
    assert changes == [EngineChange("chat (decode)", {"max_num_seqs": (64, 128)})]


def test_an_llm_config_model_is_read_from_the_ray_service() -> None:
    """A Ray Serve LLM model's engine args are its LLMConfig's engine_kwargs, keyed by its model_id."""
    def app(length: int) -> dict[str, Any]:
        return {"name": "llm", "args": {"llm_configs": [
            {"model_loading_config": {"model_id": "qwen", "model_source": MODEL},
             "engine_kwargs": {"max_model_len": length, "tensor_parallel_size": 1}}]}}

    changes = engine_changes(plan(ray_service([app(16384)])), plan(ray_service([app(8192)])))
    assert changes == [EngineChange("qwen", {"max_model_len": (16384, 8192)})]


def test_a_mirrored_images_vllm_release_is_read_from_its_annotation() -> None:
    """images.IMAGE_RELEASE: on a workload whose image comes from a mirror or by digest, the annotation names the
    upstream release "so ... the diff ... know[s] its ... vLLM from the manifests alone". 0.29.0 -> 0.33.0 removed
    what templates/compat/vllm-changes.yaml records for that pair."""
    base = plan(vllm_deployment("chat", ["--port", "8000"], DIGEST, "vllm/vllm-openai:v0.29.0"))
    head = plan(vllm_deployment("chat", ["--port", "8000"], DIGEST, "vllm/vllm-openai:v0.33.0"))
    assert vllm_release_changes(base, head) == [
        "vLLM 0.29.0 -> 0.33.0: engine args removed: enable_bf16x3_router_gemm",
        "vLLM 0.29.0 -> 0.33.0: server flags removed: log_config_file"]
    assert vllm_release_changes(head, head) == []


VPC = {"type": "aws:ec2/vpc:Vpc", "name": "dev-vpc", "urn": urn("aws:ec2/vpc:Vpc", "dev-vpc")}


def test_a_replacement_marked_intended_by_its_urn_does_not_block() -> None:
    """`--intended NAME`: "a resource (name or URN) whose replacement is intended" (cli/diff.py): a VPC whose
    cidrBlock changes is replaced and stateful (replacement.yaml), blocking unless marked, by name or by URN."""
    base = plan({**VPC, "inputs": {"cidrBlock": "10.0.0.0/16"}})
    head = plan({**VPC, "inputs": {"cidrBlock": "10.7.0.0/16"}})
    [replaced] = diff_plans(base, head).blocking
    assert (replaced.kind, replaced.name, replaced.inputs) == ("replaced", "dev-vpc", ["cidrBlock"])
    assert diff_plans(base, head, intended=[VPC["urn"]]).blocking == []
    assert diff_plans(base, head, intended=["dev-vpc"]).blocking == []


def test_a_component_is_a_grouping_and_never_a_difference() -> None:
    """triarch.diff._resources: "components are only groupings: their children say what changes"; a Triarch
    component whose recorded inputs differ adds no row, its changed child does."""
    component = {"type": "triarch:serving:Model", "name": "chat", "urn": urn("triarch:serving:Model", "chat")}
    base = plan({**component, "inputs": {"replicas": 1}}, vllm_deployment("chat", ["--port", "8000"]))
    head = plan({**component, "inputs": {"replicas": 2}}, vllm_deployment("chat", ["--port", "8001"]))
    result = diff_plans(base, head)
    assert [(d.kind, d.type, d.name) for d in result.differences] == [
        ("changed", "kubernetes:apps/v1:Deployment", "chat")]


def test_diff_of_two_plan_directories_reports_in_json_and_exits_by_the_gate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`triarch diff --base DIR --plan DIR --format json` (docs/review.md): no planning; exit 1 on an unintended
    stateful replacement, 0 once it is marked intended; the engine args of the workloads in `engineArgs`."""
    for name, cidr, length in (("base", "10.0.0.0/16", "8192"), ("head", "10.7.0.0/16", "4096")):
        (tmp_path / name).mkdir()
        document = plan({**VPC, "inputs": {"cidrBlock": cidr}}, vllm_deployment("chat", ["--max-model-len", length]))
        (tmp_path / name / "plan.json").write_text(json.dumps(document), encoding="utf-8")
    argv = ["diff", "--base", str(tmp_path / "base"), "--plan", str(tmp_path / "head"), "--format", "json"]
    assert cli.main(argv) == 1
    report = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["inputs"], r["stateful"]) for r in report["replaced"]] == [("dev-vpc", ["cidrBlock"], True)]
    assert report["engineArgs"] == [{"model": "chat", "changes": {"max_model_len": {"before": "8192",
                                                                                    "after": "4096"}}}]
    assert report["compared"] == {"base": f"the plan in {tmp_path / 'base'}",
                                  "head": f"the plan in {tmp_path / 'head'}"}
    assert cli.main([*argv, "--intended", "dev-vpc"]) == 0
    assert json.loads(capsys.readouterr().out)["replaced"][0]["intended"] is True
