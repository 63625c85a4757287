"""LoRA adapters (issue 52, D1, the offline plan): `models[].adapters` planned as vLLM's LoRA flags (slots and rank
from the adapters given, the Hub adapters fetched at their commits and loaded at start) or Ray Serve LLM's
lora_config (S3 adapters under one root, read through the worker group's weights role); the slots' memory taken out
by the tuner before the KV cache, as vLLM 0.29.0 allocates it; refused in one line where it cannot work; listed at
$0 in the cost report; `triarch diff` says the replicas restart. Every expected number is worked out by hand here
from the model's config.json (templates/models) and vLLM's buffer shapes (the arithmetic in each comment), never by
the code under test."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from conftest import plan_refusal, reference_file, stack_document, write_stack_file
from test_engine_args import flag_value, llm_configs, planned, vllm_container
from test_prefill_decode import LLM_CONFIG_SOURCE, applications, class_fields, split_qwen
from triarch import cli
from triarch.catalog import catalog
from triarch.config import from_pulumi_config
from triarch.offline import read_stack_config
from triarch.planners.adapters import adapter_effects
from triarch.planners.iam import weights_read_policy
from triarch.planners.models import plan_models
from triarch.planners.picker import picker_values
from triarch.tuner import load_arch
from triarch.tuner.lora import LoraSlots, lora_slot_bytes, slot_rank
from triarch.tuner.memory import memory_budget
from triarch.tuner.model_files import MODELS_DIR
from triarch.tuner.releases import release_for

REV = "0123456789abcdef0123456789abcdef01234567"
QWEN3_8B = MODELS_DIR / "Qwen--Qwen3-8B.json"


def hub(name: str, rank: int, repo: str | None = None) -> dict[str, Any]:
    return {"name": name, "rank": rank, "hub": {"id": repo or f"my-org/{name}-lora", "revision": REV}}


def s3(name: str, rank: int, root: str = "s3://my-bucket/adapters") -> dict[str, Any]:
    return {"name": name, "rank": rank, "s3": f"{root}/{name}"}


def with_adapters(config: dict[str, Any], model: str, adapters: list[dict[str, Any]],
                  **settings: Any) -> dict[str, Any]:
    next(m for m in config["triarch:models"] if m["name"] == model).update(adapters=adapters, **settings)
    return config


def objects_of(config: dict[str, Any], tmp_path: Path) -> list[dict[str, Any]]:
    return planned(read_stack_config(write_stack_file(tmp_path / "Pulumi.adapters.yaml", config))[0])


def pod_spec(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    [found] = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == name]
    return cast(dict[str, Any], found["spec"]["template"]["spec"])


@pytest.fixture(scope="module")
def lab_objects(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """lab's chat (Qwen3-8B, engine vllm, one L4) with two Hub adapters of ranks 16 and 48."""
    config = with_adapters(stack_document("lab"), "chat", [hub("support", 16), hub("legal", 48)])
    return objects_of(config, tmp_path_factory.mktemp("lab"))


@pytest.fixture(scope="module")
def prod_objects(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """prod's qwen (Qwen3-8B, engine ray-serve, the L4 pool) with two S3 adapters under one root, at 8192 tokens
    (the slots leave too little for prod's 16384: test_the_slots_can_push_a_model_off_its_gpu)."""
    config = with_adapters(stack_document("prod"), "qwen", [s3("support", 8), s3("sql", 32)], maxModelLen=8192)
    return objects_of(config, tmp_path_factory.mktemp("prod"))


# --- the slots' memory, as vLLM allocates it ------------------------------------------------------------------------

@pytest.mark.parametrize(("largest", "slot"), [(1, 1), (2, 8), (8, 8), (9, 16), (16, 16), (48, 64), (300, 320),
                                               (321, 512), (512, 512)])
def test_the_slot_rank_is_the_smallest_max_lora_rank_vllm_takes(largest: int, slot: int) -> None:
    # vllm/config/lora.py (0.29.0): MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]; an adapter's rank
    # only needs to be at most max_lora_rank (vllm/lora/peft_helper.py: "LoRA rank r is greater than max_lora_rank").
    assert slot_rank(largest) == slot


def test_the_slots_of_a_dense_model_are_vllms_buffers() -> None:
    """Qwen3-8B (hidden 4096, 36 layers, 32 heads, 8 KV heads, head_dim 128, intermediate 12288, vocab 151936, bf16),
    two slots of rank 64 on one GPU. Per layer and slot, (input + output) per slice times the rank:
      qkv_proj (three slices, each A over the whole input): 3 x 4096 + 32 x 128 + 2 x 8 x 128 = 18432
      o_proj (A over the input, B over the output): 4096 + 4096 = 8192
      gate_up_proj (two slices): 2 x 4096 + 2 x 12288 = 32768
      down_proj: 12288 + 4096 = 16384          -> 75776 per layer, x 36 = 2727936
      embed_tokens and lm_head: 2 x (151936 + 4096) = 312064   -> 3040000
    x rank 64 x 2 slots x 2 bytes = 778240000 bytes."""
    arch = load_arch(QWEN3_8B)
    assert lora_slot_bytes(arch, LoraSlots(max_loras=2, max_lora_rank=64)) == 778_240_000
    # TP=2: q 2048, kv 512 per rank, intermediate 6144: qkv 12288 + 2048 + 1024 = 15360, o 2048 + 4096 = 6144,
    # gate_up 8192 + 12288 = 20480, down 6144 + 4096 = 10240 -> 52224 x 36 = 1880064, + 312064 = 2192128;
    # x 16 x 1 x 2 bytes = 70148096
    assert lora_slot_bytes(arch, LoraSlots(1, 16), tensor_parallel_size=2) == 70_148_096
    assert lora_slot_bytes(arch, None) == 0


def test_the_tuner_takes_the_slots_out_before_the_kv_cache() -> None:
    """vLLM allocates the slots inside load_model's memory profiler (gpu_model_runner.py), so they come out of
    total x gpu_memory_utilization with the weights, before determine_available_memory sizes the KV cache: the KV
    budget is smaller by exactly the slots' bytes, and nothing else moves."""
    arch = load_arch(QWEN3_8B)
    release, _ = release_for("0.29.0")
    common: dict[str, Any] = {"release": release, "max_num_batched_tokens": 2048, "max_num_seqs": 8}
    without = memory_budget(arch, 23_661_969_408, **common)
    with_slots = memory_budget(arch, 23_661_969_408, lora=LoraSlots(2, 64), **common)
    assert without.available_kv - with_slots.available_kv == 778_240_000
    assert with_slots.lora_slots == 778_240_000
    assert (with_slots.weights, with_slots.activation_peak) == (without.weights, without.activation_peak)


def test_the_slots_can_push_a_model_off_its_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """prod's qwen holds one 16384-token request on an L4 without adapters; two slots of rank 32 take
    3040000 x 32 x 2 x 2 = 389120000 bytes, 2638 tokens of Qwen3-8B's KV cache (36 layers x 2 x 8 x 128 x 2 = 147456
    bytes a token), and the request no longer fits at the pessimistic end."""
    plain = stack_document("prod")
    assert cli.main(["plan", "--stack-file", str(write_stack_file(tmp_path / "Pulumi.plain.yaml", plain)),
                     "--out", str(tmp_path / "plain")]) == 0
    capsys.readouterr()
    line = plan_refusal(tmp_path, capsys, prod_with(s3("support", 8), s3("sql", 32)))
    assert "triarch:models[2]: 'Qwen/Qwen3-8B' may not start on node group 'l4'" in line
    assert "one request of max_model_len 16384 does not fit" in line


def test_a_plan_with_adapters_holds_fewer_kv_tokens(lab_objects: list[dict[str, Any]], tmp_path: Path) -> None:
    plain = vllm_container(objects_of(stack_document("lab"), tmp_path), "chat")["args"]
    assert "--enable-lora" not in plain
    # the same length fits either way at lab's 8192; the batch the cache holds may only shrink
    assert int(flag_value(vllm_container(lab_objects, "chat")["args"], "--max-num-seqs")) <= int(
        flag_value(plain, "--max-num-seqs"))


# --- engine vllm: the flags, the fetch ------------------------------------------------------------------------------

def test_vllm_gets_a_slot_per_adapter_of_the_largest_rank(lab_objects: list[dict[str, Any]]) -> None:
    args = vllm_container(lab_objects, "chat")["args"]
    assert "--enable-lora" in args
    assert flag_value(args, "--max-loras") == "2"
    assert flag_value(args, "--max-lora-rank") == "64"  # 48 rounded up to what vLLM takes
    start = args.index("--lora-modules")
    assert args[start + 1:start + 3] == ["support=/models/adapters/support", "legal=/models/adapters/legal"]


@pytest.mark.parametrize("release", ["0.29.0", "0.33.0"])
def test_every_lora_flag_is_in_the_pinned_vllm(lab_objects: list[dict[str, Any]], release: str) -> None:
    names = set()
    for part in ("engine-args.txt", "frontend-args.txt"):
        names |= set(reference_file(f"vllm-{release}", part).read_text(encoding="utf-8").split())
    args = vllm_container(lab_objects, "chat")["args"]
    flags = {a[2:].replace("-", "_") for a in args if a.startswith("--")}
    assert {"enable_lora", "max_loras", "max_lora_rank", "lora_modules"} <= flags
    assert flags <= names, flags - names


def test_hub_adapters_are_fetched_at_their_commit_before_vllm_starts(lab_objects: list[dict[str, Any]]) -> None:
    spec = pod_spec(lab_objects, "chat")
    [fetch] = spec["initContainers"]
    script = fetch["command"][-1]
    assert script == ("hf download my-org/support-lora --revision " + REV + " --local-dir /models/adapters/support"
                      " && hf download my-org/legal-lora --revision " + REV + " --local-dir /models/adapters/legal")
    assert fetch["image"] == spec["containers"][0]["image"]
    assert {"name": "model-cache", "mountPath": "/models"} in fetch["volumeMounts"]
    assert fetch["securityContext"]["readOnlyRootFilesystem"] is True
    assert fetch["resources"]["requests"] == fetch["resources"]["limits"]
    names = {e["name"] for e in fetch["env"]}
    assert "HF_HOME" in names and "VLLM_API_KEY" not in names


def test_no_adapters_no_lora(tmp_path: Path) -> None:
    objects = objects_of(stack_document("lab"), tmp_path)
    assert "initContainers" not in pod_spec(objects, "chat")
    assert not any("lora" in a for a in vllm_container(objects, "chat")["args"])


def test_runtime_adapter_loading_is_never_planned(lab_objects: list[dict[str, Any]],
                                                   prod_objects: list[dict[str, Any]]) -> None:
    """Adapters are loaded at start (or from Ray's S3 root): no pod Triarch plans lets a client load one at run time
    (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING, which opens /v1/load_lora_adapter on the serving port)."""
    text = json.dumps(lab_objects) + json.dumps(prod_objects)
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in text


# --- engine ray-serve: lora_config and the role ---------------------------------------------------------------------

def test_ray_serve_gets_lora_config_ray_accepts(prod_objects: list[dict[str, Any]]) -> None:
    config = llm_configs(prod_objects)["qwen"]
    assert config["lora_config"] == {"dynamic_lora_loading_path": "s3://my-bucket/adapters",
                                     "max_num_adapters_per_replica": 2}
    assert {k: config["engine_kwargs"][k] for k in ("enable_lora", "max_loras", "max_lora_rank")} == {
        "enable_lora": True, "max_loras": 2, "max_lora_rank": 32}
    applications(prod_objects)  # Ray's ServeDeploySchema takes the document
    # Ray 2.60's LoraConfig and LLMConfig (read, not imported: LLMConfig imports vLLM)
    assert set(config["lora_config"]) <= class_fields(LLM_CONFIG_SOURCE, "LoraConfig")
    assert "lora_config" in class_fields(LLM_CONFIG_SOURCE, "LLMConfig")


def test_the_worker_groups_role_reads_the_adapters_root(prod_objects: list[dict[str, Any]]) -> None:
    [service] = [o for o in prod_objects if o["kind"] == "RayService"]
    groups = {g["groupName"]: g["template"]["spec"] for g in service["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    assert groups["l4-1gpu"]["serviceAccountName"] == "llm-l4-1gpu-weights"
    accounts = [o["metadata"]["name"] for o in prod_objects if o["kind"] == "ServiceAccount"]
    assert "llm-l4-1gpu-weights" in accounts
    # the one policy S3 weights get: read-only, scoped to the root
    policy = weights_read_policy(["s3://my-bucket/adapters"], "us-east-1")
    actions = {s["Action"] for s in policy["Statement"]}
    assert actions == {"s3:GetObject", "s3:ListBucket"}
    assert policy["Statement"][0]["Resource"] == ["arn:aws:s3:::my-bucket/adapters*"]


def test_the_plan_registers_the_role_for_the_adapters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = with_adapters(stack_document("prod"), "qwen", [s3("support", 8)], maxModelLen=8192)
    path = write_stack_file(tmp_path / "Pulumi.adapters.yaml", config)
    assert cli.main(["plan", "--stack-file", str(path), "--out", str(tmp_path / "out")]) == 0
    summary = capsys.readouterr().out
    plan = json.loads((tmp_path / "out" / "plan.json").read_text(encoding="utf-8"))
    policies = [r for r in plan["resources"] if r["type"] == "aws:iam/rolePolicy:RolePolicy"
                and "adapters" in json.dumps(r["inputs"])]
    assert len(policies) == 1, "one role policy reads the adapters' root"
    policy = policies[0]["inputs"]["policy"]
    document = json.loads(policy) if isinstance(policy, str) else policy
    assert document["Statement"][0]["Resource"] == ["arn:aws:s3:::my-bucket/adapters*"]
    assert "qwen: 1 LoRA adapter(s) (support), loaded from s3://my-bucket/adapters on first use; 1 slot(s) of rank 8" \
        in summary
    capacity = json.loads((tmp_path / "out" / "capacity.json").read_text(encoding="utf-8"))
    [qwen] = [m for m in capacity["models"] if m["name"] == "qwen"]
    assert qwen["adapters"]["monthlyUsd"] == 0.0
    assert qwen["adapters"]["adapters"] == [{"name": "support", "rank": 8, "source": "s3://my-bucket/adapters/support"}]


# --- the picker, where a vllm model with adapters is routed ---------------------------------------------------------

def chart_file(member: str) -> str:
    archive = reference_file("charts", "llm-d-router-standalone-v0.10.0.tgz")
    with tarfile.open(archive, "r:gz") as packed:
        handle = packed.extractfile(f"llm-d-router-standalone/{member}")
        assert handle is not None, member
        return handle.read().decode("utf-8")


def picker_release_values(config: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    stack = from_pulumi_config(read_stack_config(write_stack_file(tmp_path / "Pulumi.routed.yaml", config))[0])
    [plan] = [p for p in plan_models(stack, catalog()) if p.name == "chat"]
    return picker_values(stack, plan)


def test_a_routed_model_with_adapters_gets_the_lora_aware_scorer(tmp_path: Path) -> None:
    """fresh's chat (engine vllm, prefixRouting on): with adapters, the picker reads a config of its own, the
    chart's default profile as the chart writes it plus llm-d-router's lora-affinity-scorer."""
    epp = picker_release_values(with_adapters(stack_document("fresh"), "chat", [hub("support", 16)]),
                                tmp_path)["router"]["epp"]
    assert epp["pluginsConfigFile"] == "lora-plugins.yaml"
    config = yaml.safe_load(epp["pluginsCustomConfig"]["lora-plugins.yaml"])
    [profile] = config["schedulingProfiles"]
    weights = {p["pluginRef"]: p["weight"] for p in profile["plugins"]}
    # the chart's default-plugins.yaml (charts/router/templates/_config.yaml): queue 2, kv-cache 2, prefix 3
    assert weights == {"queue-scorer": 2, "kv-cache-utilization-scorer": 2, "prefix-cache-scorer": 3,
                       "lora-affinity-scorer": 1}
    template = chart_file("charts/router/templates/_config.yaml")
    default = template.split("default-plugins.yaml: |", 1)[1].split("payload-agnostic.yaml", 1)[0]
    for name in ("queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer", "metrics-data-source",
                 "core-metrics-extractor"):
        assert f"- type: {name}" in default and name in {p["type"] for p in config["plugins"]}
    assert "lora-affinity-scorer" not in default  # why Triarch writes its own
    assert config["apiVersion"] in default
    # both keys are the chart's (epp in the router subchart's values.yaml, which the standalone chart nests under
    # router), and the profile's parsers stay empty (the subchart's epp.parsers: [], vLLM over HTTP)
    values = yaml.safe_load(chart_file("charts/router/values.yaml"))
    assert {"pluginsConfigFile", "pluginsCustomConfig"} <= set(values["epp"])
    assert values["epp"]["parsers"] == [] and "parsers" not in epp and "requestHandler" not in config


def test_a_routed_model_without_adapters_keeps_the_charts_config(tmp_path: Path) -> None:
    epp = picker_release_values(stack_document("fresh"), tmp_path)["router"]["epp"]
    assert "pluginsConfigFile" not in epp and "pluginsCustomConfig" not in epp


# --- diff -----------------------------------------------------------------------------------------------------------

def test_triarch_diff_says_adding_an_adapter_restarts_the_replicas(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    def prod(*adapters: dict[str, Any]) -> dict[str, Any]:
        return with_adapters(stack_document("prod"), "qwen", list(adapters), maxModelLen=8192)

    base = write_stack_file(tmp_path / "Pulumi.prod.yaml", prod())
    assert cli.main(["plan", "--stack-file", str(base), "--out", str(tmp_path / "base")]) == 0
    (tmp_path / "head").mkdir()
    head = write_stack_file(tmp_path / "head" / "Pulumi.prod.yaml", prod(s3("support", 8)))
    capsys.readouterr()
    cli.main(["diff", "--base", str(tmp_path / "base"), "--stack-file", str(head)])
    said = " ".join(capsys.readouterr().out.split())
    assert ("model qwen: adapters change (support): every replica restarts with the new LoRA slots and adapters "
            "(start arguments), and its KV cache is sized again") in said
    assert "Engine args qwen: enable_lora None -> True" in said


def test_diff_says_an_adapter_change_restarts_every_replica() -> None:
    base = {"models": [{"name": "chat", "adapters": {"adapters": [{"name": "a", "rank": 8, "source": "x"}]}},
                       {"name": "embed"}]}
    head = {"models": [{"name": "chat", "adapters": {"adapters": [{"name": "a", "rank": 8, "source": "x"},
                                                                  {"name": "b", "rank": 8, "source": "y"}]}},
                       {"name": "embed"}]}
    [line] = adapter_effects(base, head)
    assert line.startswith("model chat: adapters change (b): every replica restarts")
    assert adapter_effects(base, base) == []
    moved = {"models": [{"name": "chat", "adapters": {"adapters": [{"name": "a", "rank": 16, "source": "x"}]}}]}
    assert "sources or ranks change" in adapter_effects(base, moved)[0]
    assert "adapters change (a)" in adapter_effects(base, {"models": [{"name": "chat"}]})[0]


# --- bad input: one line each ---------------------------------------------------------------------------------------

def lab_with(*adapters: dict[str, Any]) -> dict[str, Any]:
    return with_adapters(stack_document("lab"), "chat", list(adapters))


def prod_with(*adapters: dict[str, Any]) -> dict[str, Any]:
    return with_adapters(stack_document("prod"), "qwen", list(adapters))


@pytest.mark.parametrize(("config", "expected"), [
    (lab_with(hub("a", 8), hub("a", 16)),
     "triarch:models[0].adapters[1].name: 'a' names two adapters of this model"),
    (lab_with(hub("chat", 8)), "triarch:models[0].adapters[0].name: 'chat' is the model's own served name"),
    (lab_with({"name": "a", "rank": 8, "hub": {"id": "my-org/a"}}), "adapters[0].hub.revision"),
    (lab_with({"name": "a", "rank": 8, "hub": {"id": "my-org/a", "revision": "main"}}), "adapters[0].hub.revision"),
    (lab_with({"name": "a", "rank": 8}), "give either hub: {id, revision} or s3: s3://bucket/prefix"),
    (lab_with(hub("a", 1024)), "adapters[0].rank"),
    (lab_with({"name": "a", "rank": 8, "s3": "s3://my-bucket/x/a"}),
     "triarch:models[0].adapters[0].s3: 's3://my-bucket/x/a' cannot be loaded by engine vllm"),
    (prod_with(hub("a", 8)), "adapters[0].hub: 'my-org/a-lora' cannot be loaded by engine ray-serve"),
    (prod_with({"name": "a", "rank": 8, "s3": "s3://my-bucket/adapters/b"}), "must end in the adapter's name ('a')"),
    (prod_with(s3("a", 8), s3("b", 8, root="s3://my-bucket/other")), "are more than one S3 root"),
])
def test_bad_adapters_are_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              config: dict[str, Any], expected: str) -> None:
    assert expected in plan_refusal(tmp_path, capsys, config)


def test_adapters_are_refused_where_triarch_does_not_size_them(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    embed = with_adapters(stack_document("lab"), "embed", [s3("a", 8)])
    assert "adapters: ['a'] are planned for generate models only" in plan_refusal(tmp_path, capsys, embed)
    moe = with_adapters(stack_document("prod"), "chat", [s3("a", 8)])  # DeepSeek-V2-Lite: MoE and MLA
    assert "a mixture of experts or MLA model" in plan_refusal(tmp_path, capsys, moe)
    split = prod_with(s3("a", 8))
    split_qwen(split)
    assert "not planned for a model split into prefill and decode" in plan_refusal(tmp_path, capsys, split)


def test_s3_adapters_on_an_adopted_cluster_need_the_weights_role(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    config = stack_document("lab")
    embed = next(m for m in config["triarch:models"] if m["name"] == "embed")
    embed.update(model="Qwen/Qwen3-8B", task="generate", adapters=[s3("a", 8)])
    assert "no role can read them" in plan_refusal(tmp_path, capsys, config)


# --- the key reference ---------------------------------------------------------------------------------------------

def test_the_key_reference_documents_adapters() -> None:
    root = Path(__file__).resolve().parents[1]
    keys = (root / "docs" / "stack-keys.md").read_text(encoding="utf-8")
    assert "adapters" in keys and "rank" in keys
    schema = json.loads((root / "docs" / "stack.schema.json").read_text(encoding="utf-8"))
    assert "adapters" in json.dumps(schema)
