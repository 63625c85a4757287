"""Cold start: the prediction's arithmetic part by part (expected values worked by hand from the published figures in
templates/compat/cold-start.yaml), the startup budget it gives, the settings that make a start faster and the
objects they render, the refusals, and how plan, capacity.json and review show it."""

from __future__ import annotations

import base64
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import MutatedConfig, crd_schema, plan_config, stack_document, unknown_fields
from triarch import cli
from triarch.catalog import catalog
from triarch.config import from_pulumi_config
from triarch.cost import capacity_change, capacity_report
from triarch.errors import ConfigError
from triarch.planners.model_plan import ColdStart, ModelPlan
from triarch.planners.models import plan_models
from triarch.planners.objects import plan_kubernetes
from triarch.report.changes import cold_start_table
from triarch.tuner import GIB

MIB = 1024 * 1024
KARPENTER_NODE = (30 + 90, 80 + 90)
"""Karpenter's launch to Ready (30-80 s) and the device plugin's 90 s."""
VLLM_PULL_PARALLEL = 12.64 * 1000 / 180
"""12.64 GB at the 180 MB/s measured with SOCI parallel pull."""
VLLM_PULL_SEQUENTIAL = 12.64 * 1000 / 96
ENGINE_WARM = (34, 59)


def models_of(config: dict[str, str]) -> list[ModelPlan]:
    return plan_models(from_pulumi_config(config), catalog())


def cold(config: dict[str, str], name: str) -> ColdStart:
    [plan] = [p for p in models_of(config) if p.name == name]
    assert plan.cold_start is not None
    return plan.cold_start


def seconds(prediction: ColdStart, key: str) -> tuple[float, float]:
    part = prediction.part(key)
    assert part is not None and part.seconds is not None, key
    return part.seconds.low, part.seconds.high


def objects(config: dict[str, str]) -> list[dict[str, Any]]:
    stack = from_pulumi_config(config)
    return [obj for _, obj in plan_kubernetes(stack, plan_models(stack, catalog()), catalog()).owners]


def of_kind(found: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    [obj] = [o for o in found if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return obj


def pool(**settings: Any) -> Any:
    def mutate(config: dict[str, Any]) -> None:
        config["triarch:nodeGroups"][0].update(settings)
    return mutate


def model(**settings: Any) -> Any:
    def mutate(config: dict[str, Any]) -> None:
        config["triarch:models"][0].update(settings)
    return mutate


def both(*mutations: Any) -> Any:
    def mutate(config: dict[str, Any]) -> None:
        for mutation in mutations:
            mutation(config)
    return mutate


def refusal(mutated_config: MutatedConfig, name: str, mutation: Any) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        models_of(mutated_config(name, mutation))
    return caught.value


# --- the prediction, part by part ------------------------------------------------------------------------------

def test_dev_from_no_node_adds_up_the_published_parts(mutated_config: MutatedConfig) -> None:
    prediction = cold(mutated_config("dev", model()), "embed")
    assert seconds(prediction, "node") == KARPENTER_NODE
    # g6.xlarge: SOCI parallel pull onto its 250 GB instance store (the network and unpacking bound it).
    assert seconds(prediction, "image") == pytest.approx((VLLM_PULL_PARALLEL, VLLM_PULL_PARALLEL))
    weights = next(p for p in models_of(mutated_config("dev", model())) if p.name == "embed").sizing.weights_bytes
    assert seconds(prediction, "weights") == pytest.approx((weights / (1500 * MIB), weights / 313e6))
    assert seconds(prediction, "engine") == ENGINE_WARM
    total = prediction.total()
    assert (total.low, total.high) == pytest.approx((
        120 + VLLM_PULL_PARALLEL + weights / (1500 * MIB) + 34,
        170 + VLLM_PULL_PARALLEL + weights / 313e6 + 59))
    assert prediction.unknown() == []


def test_without_parallel_pull_the_root_volume_bounds_the_image(mutated_config: MutatedConfig) -> None:
    """28.6 GB unpacked onto gp3 at its included 125 MiB/s takes longer than 12.64 GB at 96 MB/s."""
    prediction = cold(mutated_config("dev", pool(fastImagePull=False, instanceStore=False)), "embed")
    unpack = 28.6e9 / (125 * MIB)
    assert unpack > VLLM_PULL_SEQUENTIAL
    assert seconds(prediction, "image") == pytest.approx((unpack, unpack))


def test_one_layer_at_a_time_onto_the_instance_store_takes_the_sequential_rate(mutated_config: MutatedConfig) -> None:
    prediction = cold(mutated_config("dev", pool(fastImagePull=False)), "embed")
    assert seconds(prediction, "image") == pytest.approx((VLLM_PULL_SEQUENTIAL, VLLM_PULL_SEQUENTIAL))


def test_parallel_pull_on_the_root_volume_gets_600_mib_s(mutated_config: MutatedConfig) -> None:
    prediction = cold(mutated_config("dev", pool(instanceStore=False)), "embed")
    assert 28.6e9 / (600 * MIB) < VLLM_PULL_PARALLEL  # at 600 MiB/s the pull, not the disk, is the bound
    assert seconds(prediction, "image") == pytest.approx((VLLM_PULL_PARALLEL, VLLM_PULL_PARALLEL))
    slow = cold(mutated_config("dev", pool(instanceStore=False, diskThroughputMiBps=200)), "embed")
    assert seconds(slow, "image") == pytest.approx((28.6e9 / (200 * MIB),) * 2)


def test_a_fixed_pool_has_its_nodes_and_an_adopted_cluster_leaves_parts_unknown(
        mutated_config: MutatedConfig) -> None:
    fixed = cold(mutated_config("dev", pool(provisioner="managedNodeGroup", min=2, max=2)), "embed")
    assert seconds(fixed, "node") == (0, 0)
    adopted = cold(mutated_config("local", model()), next(iter(
        m["name"] for m in stack_document("local")["triarch:models"])))
    assert adopted.part("image") is not None and adopted.part("image").seconds is None  # type: ignore[union-attr]
    assert adopted.part("weights").seconds is None  # type: ignore[union-attr]
    assert "weights" in adopted.unknown()


def test_ray_serve_keeps_its_unknowns_and_never_counts_them_as_zero(mutated_config: MutatedConfig) -> None:
    prediction = cold(mutated_config("prod", model()), "chat")
    assert prediction.unknown() == ["image", "ray"]  # no published ray-llm size; no figure for Serve's placement
    low = prediction.total().low
    assert low == pytest.approx(120 + seconds(prediction, "weights")[0] + 34)


def test_without_a_shared_compile_cache_every_start_compiles_cold(mutated_config: MutatedConfig) -> None:
    one_gpu = cold(mutated_config("dev", lambda c: c.setdefault("triarch:serving", {}).update(compileCache=False)),
                   "embed")
    assert seconds(one_gpu, "engine") == (39, 94)
    across = cold(mutated_config("large", lambda c: c.setdefault("triarch:serving", {}).update(compileCache=False)),
                  "llama")
    assert seconds(across, "engine") == (39, 205)  # TP 8 x PP 2: the cold start checks the links between GPUs too
    moe = cold(mutated_config("prod", lambda c: c.setdefault("triarch:serving", {}).update(compileCache=False)),
               "chat")
    assert seconds(moe, "engine") == (39, 264)  # DeepSeek-V2-Lite: its expert kernels warm up as well
    warm_moe = cold(mutated_config("prod", model()), "chat")
    assert seconds(warm_moe, "engine") == (34, 143)


def test_eager_mode_skips_compile_and_graphs(mutated_config: MutatedConfig) -> None:
    plan = next(p for p in models_of(mutated_config("dev", model())) if p.name == "embed")
    eager = plan.sizing.engine_args | {"enforce_eager": True}
    from dataclasses import replace

    from triarch.planners.coldstart import predict
    stack = from_pulumi_config(mutated_config("dev", model()))
    prediction = predict(stack, replace(plan, sizing=replace(plan.sizing, engine_args=eager)), catalog())
    assert seconds(prediction, "engine") == (14, 59)


# --- the startup budget -----------------------------------------------------------------------------------------

def test_weights_from_the_hub_keep_thirty_minutes_for_the_first_download(mutated_config: MutatedConfig) -> None:
    prediction = cold(mutated_config("dev", model()), "embed")
    assert prediction.budget_seconds == 30 * 60
    assert "first download" in prediction.budget_reason


def test_weights_from_s3_take_the_prediction_with_its_margin(mutated_config: MutatedConfig) -> None:
    config = mutated_config("dev", model(weightsUri="s3://models/qwen/"))
    plan = next(p for p in models_of(config) if p.name == "embed")
    assert plan.cold_start is not None
    # The streamer's slower measured rate, and the slow end of a cold engine start: the first replica compiles.
    slow = plan.sizing.weights_bytes / 1776e6 + 94
    assert plan.cold_start.budget_seconds == math.ceil(slow * 1.5 / 60) * 60
    probe = of_kind(objects(config), "Deployment", "embed")["spec"]["template"]["spec"]["containers"][0][
        "startupProbe"]
    assert probe["failureThreshold"] * probe["periodSeconds"] == plan.cold_start.budget_seconds


def test_the_large_stack_budgets_deepseek_from_its_s3_prediction() -> None:
    config = {k: json.dumps(v) if not isinstance(v, str) else v for k, v in stack_document("large").items()}
    plan = next(p for p in plan_models(from_pulumi_config(config), catalog()) if p.name == "deepseek")
    assert plan.cold_start is not None
    slow = plan.sizing.weights_bytes / 1776e6 + 264  # an MoE model's cold start, its expert kernels warmed up
    assert plan.cold_start.budget_seconds == math.ceil(slow * 1.5 / 60) * 60
    assert plan.cold_start.budget_seconds < 30 * 60


def test_a_budget_shorter_than_the_prediction_is_refused(mutated_config: MutatedConfig) -> None:
    error = refusal(mutated_config, "large", lambda c: c["triarch:models"][0].update(startupMinutes=5))
    assert error.path == "triarch:models[0].startupMinutes"
    assert "shorter than the predicted start of 'deepseek'" in str(error)
    assert ">= " in str(error)
    # At the prediction's slow end it is accepted.
    config = {k: json.dumps(v) if not isinstance(v, str) else v for k, v in stack_document("large").items()}
    plan = next(p for p in plan_models(from_pulumi_config(config), catalog()) if p.name == "deepseek")
    assert plan.cold_start is not None and plan.cold_start.first_container is not None
    enough = math.ceil(plan.cold_start.first_container.high / 60)
    models_of(mutated_config("large", lambda c: c["triarch:models"][0].update(startupMinutes=enough)))


def test_a_short_budget_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = stack_document("large")
    document["triarch:models"][0]["startupMinutes"] = 2
    path = tmp_path / "Pulumi.large.yaml"
    path.write_text(yaml.safe_dump({"config": document}), encoding="utf-8")
    code = cli.main(["plan", "--stack-file", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "triarch:models[0].startupMinutes" in err and "2" in err


# --- what makes a start faster: the rendered objects ------------------------------------------------------------

def test_a_karpenter_pool_pulls_in_parallel_onto_its_instance_store(mutated_config: MutatedConfig) -> None:
    node_class = of_kind(objects(mutated_config("dev", model())), "EC2NodeClass")["spec"]
    assert node_class["instanceStorePolicy"] == "RAID0"
    data = node_class["userData"]
    assert "Content-Type: application/node.eks.aws" in data
    body = data.split("application/node.eks.aws\n\n", 1)[1].split("\n--//--", 1)[0]
    assert json.loads(body) == {"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig",
                                "spec": {"featureGates": {"FastImagePull": True}}}
    root = node_class["blockDeviceMappings"][0]["ebs"]
    assert "throughput" not in root  # images go to the NVMe: the root volume stays at gp3's baseline


def test_without_an_instance_store_the_root_volume_gets_the_throughput(mutated_config: MutatedConfig) -> None:
    node_class = of_kind(objects(mutated_config("dev", pool(instanceStore=False))), "EC2NodeClass")["spec"]
    assert "instanceStorePolicy" not in node_class
    assert node_class["blockDeviceMappings"][0]["ebs"]["throughput"] == 600
    assert node_class["blockDeviceMappings"][0]["ebs"]["iops"] == 3000


def test_turned_off_the_node_class_is_the_amis_default(mutated_config: MutatedConfig) -> None:
    config = mutated_config("dev", pool(instanceStore=False, fastImagePull=False))
    node_class = of_kind(objects(config), "EC2NodeClass")["spec"]
    assert "userData" not in node_class and "instanceStorePolicy" not in node_class
    assert "throughput" not in node_class["blockDeviceMappings"][0]["ebs"]


def test_a_managed_node_group_gets_both_through_its_launch_template(tmp_path: Path) -> None:
    document = stack_document("dev")
    document["triarch:nodeGroups"][0].update(provisioner="managedNodeGroup", min=1, max=1)
    plan = plan_config("dev", document, tmp_path)
    templates = [r for r in plan.of_type("aws:ec2/launchTemplate:LaunchTemplate")
                 if "l4" in r.name]
    [template] = templates
    data = base64.b64decode(template.inputs["userData"]).decode()
    body = json.loads(data.split("application/node.eks.aws\n\n", 1)[1].split("\n--//--", 1)[0])
    assert body["spec"] == {"featureGates": {"FastImagePull": True},
                            "instance": {"localStorage": {"strategy": "RAID0"}}}


def test_the_compile_cache_is_per_gpu_type_on_the_shared_volume(mutated_config: MutatedConfig) -> None:
    container = of_kind(objects(mutated_config("dev", model())), "Deployment", "embed")["spec"]["template"]["spec"][
        "containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["VLLM_CACHE_ROOT"] == "/models/vllm/l4"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/models" in mounts


def test_ray_workers_share_the_compile_cache_too(mutated_config: MutatedConfig) -> None:
    service = of_kind(objects(mutated_config("prod", model())), "RayService")
    groups = service["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    roots = {e["value"] for g in groups for e in g["template"]["spec"]["containers"][0]["env"]
             if e["name"] == "VLLM_CACHE_ROOT"}
    assert roots == {"/models/vllm/a100-80gb", "/models/vllm/l4"}


def test_an_adopted_cluster_has_no_shared_compile_cache_by_default(mutated_config: MutatedConfig) -> None:
    found = objects(mutated_config("local", model()))
    envs = [e["name"] for o in found if o["kind"] == "Deployment"
            for e in o["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert envs and "VLLM_CACHE_ROOT" not in envs


def test_s3_weights_stream_through_a_service_account(mutated_config: MutatedConfig) -> None:
    found = objects(mutated_config("dev", model(weightsUri="s3://models/qwen/Qwen3-Embedding-0.6B/")))
    pod = of_kind(found, "Deployment", "embed")["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[0] == "s3://models/qwen/Qwen3-Embedding-0.6B/"
    assert args[args.index("--load-format") + 1] == "runai_streamer"
    assert json.loads(args[args.index("--model-loader-extra-config") + 1]) == {"concurrency": 32}
    assert args[args.index("--served-model-name") + 1] == "embed"
    assert pod["serviceAccountName"] == "embed-weights"
    account = of_kind(found, "ServiceAccount", "embed-weights")
    assert account["automountServiceAccountToken"] is False
    assert "annotations" not in account["metadata"]  # Pod Identity: the association names the account


def test_a_created_cluster_gives_the_s3_model_a_role_scoped_to_its_prefix(tmp_path: Path) -> None:
    document = stack_document("dev")
    document["triarch:models"][0]["weightsUri"] = "s3://models/qwen/"
    plan = plan_config("dev", document, tmp_path)
    [role] = [r for r in plan.of_type("aws:iam/role:Role") if r.name == "embed-weights-role"]
    trust = json.loads(role.inputs["assumeRolePolicy"])
    conditions = trust["Statement"][0]["Condition"]["StringEquals"]
    assert conditions["aws:RequestTag/kubernetes-service-account"] == "embed-weights"
    assert conditions["aws:RequestTag/kubernetes-namespace"] == "llm"
    [policy] = [r for r in plan.of_type("aws:iam/rolePolicy:RolePolicy") if r.name == "embed-weights-read"]
    statements = json.loads(policy.inputs["policy"])["Statement"]
    assert {s["Action"]: s["Resource"] for s in statements} == {
        "s3:GetObject": ["arn:aws:s3:::models/qwen/*"], "s3:ListBucket": "arn:aws:s3:::models"}
    assert statements[1]["Condition"] == {"StringLike": {"s3:prefix": ["qwen/*"]}}
    [association] = [r for r in plan.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
                     if r.name == "embed-weights-identity"]
    assert association.inputs["serviceAccount"] == "embed-weights"
    # The server waits for its role: a pod started before the association gets no credentials.
    [server] = [r for r in plan.resources if r.type == "triarch:vllm:VllmServer"]
    assert any(u.endswith("PodIdentityAssociation::embed-weights-identity") for u in plan.dependencies[server.urn])


def test_an_adopted_cluster_annotates_the_account_with_its_role(mutated_config: MutatedConfig) -> None:
    role = "arn:aws:iam::123456789012:role/model-readers"

    def mutate(config: dict[str, Any]) -> None:
        config["triarch:models"][0]["weightsUri"] = "s3://models/x/"
        config.setdefault("triarch:serving", {})["weightsRoleArn"] = role
    found = objects(mutated_config("local", mutate))
    [account] = [o for o in found if o["kind"] == "ServiceAccount" and o["metadata"]["name"].endswith("-weights")]
    assert account["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": role}


# --- refusals -------------------------------------------------------------------------------------------------

def test_an_adopted_cluster_needs_a_role_for_s3_weights(mutated_config: MutatedConfig) -> None:
    error = refusal(mutated_config, "local", model(weightsUri="s3://models/x/"))
    assert error.path == "triarch:models[0].weightsUri"
    assert "no role can read them" in str(error) and "weightsRoleArn" in str(error)


def test_s3_weights_on_ray_serve_stream_through_the_worker_groups_account(tmp_path: Path) -> None:
    document = stack_document("prod")
    chat = next(m for m in document["triarch:models"] if m["name"] == "chat")
    chat["weightsUri"] = "s3://models/deepseek/"
    plan = plan_config("prod", document, tmp_path)
    [service] = plan.objects("RayService")
    configs = {a["name"]: a["args"]["llm_configs"][0] for a in yaml.safe_load(service["spec"]["serveConfigV2"])[
        "applications"]}
    assert configs["chat"]["model_loading_config"] == {"model_id": "chat", "model_source": "s3://models/deepseek/"}
    assert configs["chat"]["engine_kwargs"]["load_format"] == "runai_streamer"
    assert configs["chat"]["engine_kwargs"]["model_loader_extra_config"] == {"concurrency": 32}
    assert configs["qwen"]["model_loading_config"]["model_source"] == "Qwen/Qwen3-8B"  # the other model as before
    groups = {g["groupName"]: g["template"]["spec"] for g in service["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    assert groups["a100-2gpu"]["serviceAccountName"] == "llm-a100-2gpu-weights"
    assert "serviceAccountName" not in groups["l4-1gpu"]
    [account] = [o for o in plan.objects("ServiceAccount") if o["metadata"]["name"] == "llm-a100-2gpu-weights"]
    assert account["automountServiceAccountToken"] is False
    [policy] = [r for r in plan.of_type("aws:iam/rolePolicy:RolePolicy") if r.name == "llm-a100-2gpu-weights-read"]
    statements = json.loads(policy.inputs["policy"])["Statement"]
    assert statements[0]["Resource"] == ["arn:aws:s3:::models/deepseek/*"]
    [ray] = [r for r in plan.resources if r.type == "triarch:ray:RayServing"]
    assert any(u.endswith("::llm-a100-2gpu-weights-identity") for u in plan.dependencies[ray.urn])


def test_one_group_role_reads_each_of_its_models_prefixes() -> None:
    from triarch.planners.iam import weights_read_policy
    policy = weights_read_policy(["s3://b/two/", "s3://a/one/", "s3://b/three/"], "us-east-1")
    read, *lists = policy["Statement"]
    assert read["Resource"] == ["arn:aws:s3:::a/one/*", "arn:aws:s3:::b/three/*", "arn:aws:s3:::b/two/*"]
    assert [(s["Resource"], s["Condition"]["StringLike"]["s3:prefix"]) for s in lists] == [
        ("arn:aws:s3:::a", ["one/*"]), ("arn:aws:s3:::b", ["three/*", "two/*"])]


def test_a_role_for_s3_weights_on_a_created_cluster_is_refused(mutated_config: MutatedConfig) -> None:
    error = refusal(mutated_config, "dev", lambda c: c.setdefault("triarch:serving", {}).update(
        weightsRoleArn="arn:aws:iam::123456789012:role/x"))
    assert error.path == "triarch:serving.weightsRoleArn"


def test_a_compile_cache_on_a_volume_one_node_mounts_is_refused(mutated_config: MutatedConfig) -> None:
    def mutate(config: dict[str, Any]) -> None:
        config.setdefault("triarch:serving", {}).update(compileCache=True, accessMode="ReadWriteOnce")
        config["triarch:models"][0]["replicas"] = 2
    error = refusal(mutated_config, "dev", mutate)
    assert error.path == "triarch:serving.compileCache"
    assert "ReadWriteOnce" in str(error) and "2 replicas" in str(error)


def test_parallel_pull_on_an_ami_release_without_it_is_refused(mutated_config: MutatedConfig) -> None:
    def mutate(config: dict[str, Any]) -> None:
        config["triarch:cluster"]["kubernetesVersion"] = "1.33"  # v20250807 has no 1.34 AMI
        config["triarch:cluster"]["systemNodeGroup"]["amiRelease"] = "v20250807"
        config["triarch:nodeGroups"][0].update(fastImagePull=True, amiRelease="v20250807")
    error = refusal(mutated_config, "dev", mutate)
    assert error.path == "triarch:nodeGroups[0].fastImagePull"
    assert "v20250821" in str(error)


def test_an_instance_store_the_type_lacks_is_refused(mutated_config: MutatedConfig,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from triarch.config import reading as config_module
    facts = catalog()
    without = replace(facts, instances={**facts.instances,
                                        "g6.xlarge": replace(facts.instances["g6.xlarge"], nvme_gb=0)})
    monkeypatch.setattr(config_module, "catalog", lambda: without)
    with pytest.raises(ConfigError) as caught:
        from_pulumi_config(mutated_config("dev", pool(instanceStore=True)))
    assert caught.value.path == "triarch:nodeGroups[0].instanceStore"


@pytest.mark.parametrize("key", ["fastImagePull", "instanceStore", "diskThroughputMiBps"])
def test_node_disk_settings_only_apply_to_created_clusters(mutated_config: MutatedConfig, key: str) -> None:
    value = 600 if key == "diskThroughputMiBps" else True
    error = refusal(mutated_config, "local", pool(**{key: value}))
    assert error.path == f"triarch:nodeGroups[0].{key}"


# --- where it is shown -------------------------------------------------------------------------------------------

def test_capacity_json_carries_each_models_prediction(mutated_config: MutatedConfig) -> None:
    config = mutated_config("dev", model())
    stack = from_pulumi_config(config)
    report = capacity_report("dev", stack, plan_models(stack, catalog()), catalog())
    [embed] = report["models"]
    document = embed["coldStart"]
    assert document["parts"]["node"] == [120, 170]
    assert document["startupBudgetSeconds"] == 1800
    assert document["unknown"] == []


def test_review_shows_how_a_change_moves_the_prediction(mutated_config: MutatedConfig) -> None:
    def report(config: dict[str, str]) -> dict[str, Any]:
        stack = from_pulumi_config(config)
        return capacity_report("dev", stack, plan_models(stack, catalog()), catalog())
    base = report(mutated_config("dev", model()))
    head = report(mutated_config("dev", pool(fastImagePull=False, instanceStore=False)))
    table = "\n".join(cold_start_table(capacity_change(base, head), head))
    assert "| `embed` :arrow_right: |" in table
    slower = 120 + 28.6e9 / (125 * MIB) + 34  # node, the image bound by gp3's 125 MiB/s, the engine (fast ends)
    assert table.split("|")[-2].strip().startswith(f"{math.floor(slower / 60)}m")
    unchanged = "\n".join(cold_start_table(capacity_change(base, base), base))
    assert ":arrow_right:" not in unchanged and "| `embed` |" in unchanged


def test_plan_summary_lists_the_parts_and_the_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "--stack", "large", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    models = out.split("\nModels (", 1)[1].split("\n\n", 1)[0]
    deepseek = next(line for line in models.splitlines() if line.strip().startswith("deepseek"))
    low, high = re.search(r"([\d,]+)-([\d,]+) tokens", deepseek).groups()  # type: ignore[union-attr]
    assert int(low.replace(",", "")) < int(high.replace(",", ""))  # the pessimistic end, then the nominal one
    section = out.split("Cold start per model", 1)[1].split("\n\n", 1)[0]
    assert "deepseek:" in section and "streamed from S3 into each node" in section
    assert "startup probe: 17m" in section  # 1.5 x (6m19s of S3 streaming + 4m24s of a cold MoE start)
    assert "llama:" in section and "image, ray (unknown)" in section
    capacity = json.loads((tmp_path / "capacity.json").read_text(encoding="utf-8"))
    assert {m["name"]: m["coldStart"]["startupBudgetSeconds"] for m in capacity["models"]}["deepseek"] == 17 * 60


def test_weights_use_every_byte_of_the_checkpoint() -> None:
    """The weights part reads the whole checkpoint per node: 626.8 GiB for DeepSeek-V3's FP8 checkpoint."""
    config = {k: json.dumps(v) if not isinstance(v, str) else v for k, v in stack_document("large").items()}
    plan = next(p for p in plan_models(from_pulumi_config(config), catalog()) if p.name == "deepseek")
    assert plan.cold_start is not None
    low, high = seconds(plan.cold_start, "weights")
    assert (low, high) == pytest.approx((plan.sizing.weights_bytes / 3073e6, plan.sizing.weights_bytes / 1776e6))
    assert plan.sizing.weights_bytes / GIB == pytest.approx(626.8, abs=0.1)


# --- warm capacity ----------------------------------------------------------------------------------------------

def adopted_with_karpenter(**settings: Any) -> Any:
    """The local stack as an adopted cluster whose own Karpenter scales the pool (two nodes may come)."""
    def mutate(config: dict[str, Any]) -> None:
        config["triarch:cluster"]["nodeProvisioner"] = "karpenter"
        config["triarch:nodeGroups"][0].update(max=2, nodes=["workstation", "workstation-2"])
        config["triarch:models"][0].update(settings)
    return mutate


def test_a_karpenter_pool_keeps_warm_capacity_with_a_capacity_buffer(mutated_config: MutatedConfig) -> None:
    found = objects(mutated_config("dev", model(warmReplicas=1)))
    template = of_kind(found, "PodTemplate", "embed-warm")
    buffer = of_kind(found, "CapacityBuffer", "embed-warm")
    assert buffer["apiVersion"] == "autoscaling.x-k8s.io/v1beta1"
    assert buffer["spec"] == {"podTemplateRef": {"name": "embed-warm"}, "replicas": 1}
    pod = template["template"]["spec"]
    server = of_kind(found, "Deployment", "embed")["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == server["containers"][0]["resources"]  # shaped like a replica
    assert pod["nodeSelector"] == server["nodeSelector"] and pod["tolerations"] == server["tolerations"]
    assert "volumes" not in pod  # Karpenter drops a buffer template's claims anyway
    assert not [o for o in found if o["kind"] == "PriorityClass"]


def test_a_buffer_is_what_karpenter_1_14s_crd_accepts() -> None:
    from triarch.planners.serving import serving_settings
    from triarch.planners.warm import warm_manifests
    schema = crd_schema("karpenter-v1.14.1", "crds", "autoscaling.x-k8s.io_capacitybuffers.yaml", version="v1beta1")
    config = {k: json.dumps(v) if not isinstance(v, str) else v for k, v in stack_document("dev").items()}
    config["triarch:models"] = json.dumps([{**stack_document("dev")["triarch:models"][0], "warmReplicas": 2}])
    stack = from_pulumi_config(config)
    [plan] = plan_models(stack, catalog())
    found = warm_manifests(stack, plan, serving_settings(stack, with_token=False))
    buffer = next(o for o in found if o["kind"] == "CapacityBuffer")
    assert unknown_fields(buffer["spec"], schema["properties"]["spec"]) == []
    assert buffer["spec"]["replicas"] == 2


def test_karpenters_buffer_gate_is_on_only_with_a_buffer(tmp_path: Path) -> None:
    def gate(document: dict[str, Any], where: Path) -> Any:
        plan = plan_config("dev", document, where)
        [release] = [r for r in plan.of_type("kubernetes:helm.sh/v3:Release") if r.name == "karpenter"]
        return release.inputs["values"]["settings"].get("featureGates")
    warm = stack_document("dev")
    warm["triarch:models"][0]["warmReplicas"] = 1
    # dev repairs its nodes by default (cluster.nodeRepair, tests/test_node_repair.py): that gate is on in both
    assert gate(warm, tmp_path / "warm") == {"capacityBuffer": True, "nodeRepair": True}
    assert gate(stack_document("dev"), tmp_path / "cold") == {"nodeRepair": True}


def test_elsewhere_placeholders_of_a_negative_priority_pull_the_image(mutated_config: MutatedConfig) -> None:
    found = objects(mutated_config("local", adopted_with_karpenter(warmReplicas=1)))
    priority = of_kind(found, "PriorityClass", "triarch-warm-capacity")
    assert priority["value"] < 0 and priority["preemptionPolicy"] == "Never" and priority["globalDefault"] is False
    placeholder = of_kind(found, "Deployment", "embed-warm")
    assert placeholder["spec"]["replicas"] == 1
    assert placeholder["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    pod = placeholder["spec"]["template"]["spec"]
    server = of_kind(found, "Deployment", "embed")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "triarch-warm-capacity" and pod["terminationGracePeriodSeconds"] == 0
    [container] = pod["containers"]
    assert container["image"] == server["containers"][0]["image"]  # the node pulls the model's image
    assert container["command"] == ["sleep", "infinity"] and "ports" not in container
    assert container["resources"] == server["containers"][0]["resources"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_placeholders_are_not_servers_to_the_guardrails(mutated_config: MutatedConfig, tmp_path: Path) -> None:
    from triarch.guardrails.check import evaluate, resources_of_plan
    document = stack_document("local")
    adopted_with_karpenter(warmReplicas=1)(document)
    path = tmp_path / "Pulumi.local.yaml"
    path.write_text(yaml.safe_dump({"config": document}), encoding="utf-8")
    assert cli.main(["plan", "--stack-file", str(path), "--out", str(tmp_path / "out")]) == 0
    plan = json.loads((tmp_path / "out" / "plan.json").read_text(encoding="utf-8"))
    resources = resources_of_plan(plan)
    assert any(r.name.endswith("embed-warm") for r in resources)
    findings = evaluate(resources)
    assert [f for f in findings if "embed-warm" in str(f)] == []
    # The same pod, serving (a port and a vLLM command), is a server again: the exemption is what it does.
    [placeholder] = [r for r in resources if r.name.endswith("embed-warm")]
    container = placeholder.props["spec"]["template"]["spec"]["containers"][0]
    container["command"] = ["vllm", "serve"]
    assert any("embed-warm" in str(f) for f in evaluate([placeholder]))


def test_warm_capacity_needs_a_pool_that_scales(mutated_config: MutatedConfig) -> None:
    error = refusal(mutated_config, "dev", both(pool(provisioner="managedNodeGroup", min=2, max=2),
                                               model(warmReplicas=1)))
    assert error.path == "triarch:models[0].warmReplicas" and "nothing scales it" in str(error)
    error = refusal(mutated_config, "local", model(warmReplicas=1))
    assert error.path == "triarch:models[0].warmReplicas"


def test_warm_capacity_beside_the_fewest_replicas_must_fit_the_pool(mutated_config: MutatedConfig) -> None:
    def mutate(config: dict[str, Any]) -> None:
        config["triarch:models"][0].update(warmReplicas=2)  # 1 replica + 2 warm GPUs on a pool of 2
    with pytest.raises(ConfigError) as caught:
        objects(mutated_config("dev", mutate))
    assert caught.value.path == "triarch:nodeGroups[0].max"
    assert "too few to keep 2 warm" in str(caught.value) and ">= 3 nodes" in str(caught.value)


def test_warm_capacity_is_priced_as_the_nodes_it_keeps(mutated_config: MutatedConfig) -> None:
    def report(config: dict[str, str]) -> dict[str, Any]:
        stack = from_pulumi_config(config)
        return capacity_report("dev", stack, plan_models(stack, catalog()), catalog())
    cold_pool = report(mutated_config("dev", model()))["pools"][0]
    warm = report(mutated_config("dev", model(warmReplicas=1)))
    [warm_pool], [embed] = warm["pools"], warm["models"]
    assert warm_pool["nodesIdle"] == cold_pool["nodesIdle"] + 1 and warm_pool["gpusWarm"] == 1
    hourly = warm_pool["hourlyUsdPerNode"]
    assert embed["warm"] == {"replicas": 1, "gpus": 1, "nodes": 1, "monthlyUsd": round(hourly * 730, 2)}
    assert warm_pool["monthlyUsdIdle"] - cold_pool["monthlyUsdIdle"] == pytest.approx(hourly * 730, abs=0.01)


def test_onto_warm_capacity_a_start_skips_the_launch_and_with_placeholders_the_pull(
        mutated_config: MutatedConfig) -> None:
    buffered = cold(mutated_config("dev", model(warmReplicas=1)), "embed")
    assert buffered.warm_skips == ("node",)
    assert buffered.total(skip=buffered.warm_skips).high == pytest.approx(buffered.total().high - 170)
    held = cold(mutated_config("local", adopted_with_karpenter(warmReplicas=1)), "embed")
    assert held.warm_skips == ("node", "image")


def test_the_root_volumes_extra_throughput_is_priced(mutated_config: MutatedConfig) -> None:
    stack = from_pulumi_config(mutated_config("dev", pool(instanceStore=False)))
    report = capacity_report("dev", stack, plan_models(stack, catalog()), catalog())
    [line] = [f for f in report["fixed"] if f["key"] == "ebsRootThroughput"]
    assert line["monthlyUsdAtMax"] == pytest.approx((600 - 125) * 2 * 0.04)  # two nodes at most, $0.04/MiB/s
    plain = from_pulumi_config(mutated_config("dev", model()))
    assert not [f for f in capacity_report("dev", plain, plan_models(plain, catalog()), catalog())["fixed"]
                if f["key"] == "ebsRootThroughput"]


def test_a_warm_replica_across_nodes_keeps_a_node_per_pod(mutated_config: MutatedConfig) -> None:
    def mutate(config: dict[str, Any]) -> None:
        config["triarch:models"][0]["warmReplicas"] = 1
    found = objects(mutated_config("large", mutate))
    buffer = of_kind(found, "CapacityBuffer", "deepseek-warm")
    assert buffer["spec"]["replicas"] == 2  # DeepSeek-V3's replica spans two p5 nodes
