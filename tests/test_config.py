"""Stack config validation: each kind of mistake fails in one line naming the key path, value and options."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from conftest import (
    STACK_NAMES,
    MutatedConfig,
    StackConfigReader,
    StackWriter,
    compat_data,
    plan_refusal,
    stack_document,
)
from triarch.cli import main
from triarch.config import ImagesConfig, SystemNodeGroup, from_pulumi_config
from triarch.errors import ConfigError

GPUS = compat_data("gpus")["gpus"]
INSTANCES = compat_data("instances")
AMIS = compat_data("amis")["amiTypes"]["AL2023_x86_64_NVIDIA"]
IMAGES = compat_data("images")["images"]


def config_error(config: Mapping[str, str], path: str, bad: str, allowed_has: list[str]) -> str:
    """Assert from_pulumi_config fails on `path` with `bad` shown and each of `allowed_has` offered."""
    with pytest.raises(ConfigError) as info:
        from_pulumi_config(config)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: "), message
    head, separator, allowed = message.partition("; allowed: ")
    assert separator, f"no 'allowed:' in {message!r}"
    assert bad in head.removeprefix(f"{path}: "), message
    for item in allowed_has:
        assert item in allowed, f"{item!r} not offered in {message!r}"
    return message


def _set(*keys: str | int, value: Any) -> Any:
    """A mutation setting config[keys[0]][keys[1]]... = value."""

    def mutate(config: dict[str, Any]) -> None:
        target: Any = config
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    return mutate


# --- one test per kind of mistake ------------------------------------------------------------------------

def test_unknown_top_level_key(mutated_config: MutatedConfig) -> None:
    config = mutated_config("prod", lambda c: c.update({"triarch:nodegroups": c.pop("triarch:nodeGroups")}))
    message = config_error(config, "triarch:nodegroups", "did you mean 'triarch:nodeGroups'?",
                           ["triarch:nodeGroups", "triarch:cluster"])
    assert "triarch:nodegroups," not in message.partition("allowed:")[2]
    assert "l4" not in message, "the value of a key Triarch does not know is never repeated"


def test_unknown_nested_key_names_the_closest_known_key(mutated_config: MutatedConfig) -> None:
    def typo(config: dict[str, Any]) -> None:
        group = config["triarch:nodeGroups"][1]
        group["diskGib"] = group.pop("diskGiB")

    message = config_error(mutated_config("prod", typo), "triarch:nodeGroups[1].diskGib",
                           "is not a known key (did you mean 'diskGiB'?)", ["diskGiB", "instanceType", "amiRelease"])
    assert "diskGib" not in message.partition("; allowed: ")[2].split(", "), "the rejected key is not allowed"
    assert "500" not in message


def test_a_misspelt_required_key_is_named_before_the_missing_one(mutated_config: MutatedConfig) -> None:
    """`kubernetesVerison` is both an unknown key and a missing `kubernetesVersion`: the typo is the mistake."""
    def typo(config: dict[str, Any]) -> None:
        cluster = config["triarch:cluster"]
        cluster["kubernetesVerison"] = cluster.pop("kubernetesVersion")

    message = config_error(mutated_config("prod", typo), "triarch:cluster.kubernetesVerison",
                           "did you mean 'kubernetesVersion'?", ["kubernetesVersion"])
    assert "is required" not in message


@pytest.mark.parametrize(("wrong", "right"), [("instance_type", "instanceType"), ("ami_release", "amiRelease"),
                                              ("disk_gib", "diskGiB")])
def test_a_snake_case_key_gets_the_camel_case_spelling(mutated_config: MutatedConfig, wrong: str, right: str) -> None:
    def snake(config: dict[str, Any]) -> None:
        group = config["triarch:nodeGroups"][1]
        group[wrong] = group.pop(right, "v20260714")

    message = config_error(mutated_config("prod", snake), f"triarch:nodeGroups[1].{wrong}",
                           f"is not read by Triarch: the key is '{right}'" if right != "diskGiB" else "did you mean",
                           [right])
    assert message.count(":") >= 2


def test_a_missing_section_is_described_in_words(mutated_config: MutatedConfig) -> None:
    config = mutated_config("prod", lambda c: c.pop("triarch:cluster"))
    message = config_error(config, "triarch:cluster", "is required", ["a mapping with the keys create, name"])
    assert "ClusterConfig" not in message


def test_renamed_key_names_the_new_key(mutated_config: MutatedConfig) -> None:
    def rename(config: dict[str, Any]) -> None:
        group = config["triarch:nodeGroups"][1]
        del group["amiRelease"]
        group["releaseVersion"] = "1.35.6-20260714"

    message = config_error(mutated_config("prod", rename), "triarch:nodeGroups[1].releaseVersion",
                           "is not read by Triarch: the key is 'amiRelease'", ["amiRelease"])
    assert "1.35.6-20260714" not in message


@pytest.mark.parametrize(("key", "old", "real_keys"), [
    ("triarch:devicePlugin", "version", ["gpuFeatureDiscovery", "mode"]),
    ("triarch:cluster", "releaseVersion", ["kubernetesVersion", "zones"]),
])
def test_rename_hint_only_where_the_new_key_exists(mutated_config: MutatedConfig, key: str, old: str,
                                                   real_keys: list[str]) -> None:
    """`version` under devicePlugin (say, a chart version) is not a misspelt kubernetesVersion: that key does
    not exist there, so the message must list the section's real keys, not point at a key it would reject."""
    config = mutated_config("prod", lambda c: c.setdefault(key, {}).update({old: "0.20.0"}))
    message = config_error(config, f"{key}.{old}", "is not a known key", real_keys)
    renamed_to = {"version": "kubernetesVersion", "releaseVersion": "amiRelease"}[old]
    assert renamed_to not in message.partition("; allowed:")[2].split(", ")
    assert "is not read by Triarch" not in message


def test_replicas_beside_autoscaling_is_refused(mutated_config: MutatedConfig) -> None:
    config = mutated_config("prod", _set("triarch:models", 1, "replicas", value=2))
    config_error(config, "triarch:models[1].replicas", "would be ignored beside autoscaling",
                 ["remove replicas, or remove autoscaling"])


def test_wrong_type(mutated_config: MutatedConfig) -> None:
    config = mutated_config("prod", _set("triarch:nodeGroups", 1, "min", value="two"))
    message = config_error(config, "triarch:nodeGroups[1].min", "'two' is not a whole number",
                           ["a whole number at least 0"])
    assert "int" not in message.split("; allowed:")[1], "the validation library's words leaked"


def test_out_of_range_value_of_an_aliased_key(mutated_config: MutatedConfig) -> None:
    """diskGiB is spelt by an explicit alias, not by the camel-case generator: its bounds must be offered."""
    config = mutated_config("prod", _set("triarch:nodeGroups", 1, "diskGiB", value=10))
    config_error(config, "triarch:nodeGroups[1].diskGiB", "10", ["50"])


def test_unknown_instance_type(mutated_config: MutatedConfig) -> None:
    config = mutated_config("prod", _set("triarch:nodeGroups", 1, "instanceType", value="p9.huge"))
    gpu_types = sorted(INSTANCES["instances"])
    message = config_error(config, "triarch:nodeGroups[1].instanceType", "'p9.huge'", gpu_types)
    allowed = message.partition("; allowed: ")[2].split(", ")
    assert set(allowed) == set(gpu_types), "only GPU instance types belong in a GPU node group"
    assert not set(allowed) & set(INSTANCES["cpuInstances"])


def test_unknown_gpu_for_existing_nodes(mutated_config: MutatedConfig) -> None:
    config = mutated_config("local", _set("triarch:nodeGroups", 0, "gpu", value="rtx-9090"))
    config_error(config, "triarch:nodeGroups[0].gpu", "'rtx-9090'", sorted(GPUS))


def test_min_greater_than_max(mutated_config: MutatedConfig) -> None:
    config = mutated_config("prod", lambda c: c["triarch:nodeGroups"][1].update(min=3, max=2))
    message = config_error(config, "triarch:nodeGroups[1].min", "3", ["2"])
    assert "max" in message


def test_model_pinned_to_missing_node_group(mutated_config: MutatedConfig) -> None:
    config = mutated_config("prod", _set("triarch:models", 1, "nodeGroup", value="h100"))
    names = [g["name"] for g in stack_document("prod")["triarch:nodeGroups"]]
    config_error(config, "triarch:models[1].nodeGroup", "'h100'", names)


def test_duplicate_node_group_names(mutated_config: MutatedConfig) -> None:
    first = stack_document("prod")["triarch:nodeGroups"][0]["name"]
    config = mutated_config("prod", _set("triarch:nodeGroups", 1, "name", value=first))
    message = config_error(config, "triarch:nodeGroups[1].name", repr(first), ["distinct"])
    assert "twice" in message


def test_unknown_ami_release(mutated_config: MutatedConfig) -> None:
    config = mutated_config("prod", _set("triarch:nodeGroups", 1, "amiRelease", value="v20990101"))
    config_error(config, "triarch:nodeGroups[1].amiRelease", "'v20990101'", sorted(AMIS))


def test_ami_release_without_ami_for_the_kubernetes_version(mutated_config: MutatedConfig) -> None:
    kubernetes = stack_document("prod")["triarch:cluster"]["kubernetesVersion"]
    having = sorted(r for r, a in AMIS.items() if kubernetes in (a.get("releaseVersions") or {}))
    lacking = sorted(r for r, a in AMIS.items() if a.get("releaseVersions") and r not in having)
    assert lacking and having
    config = mutated_config("prod", _set("triarch:nodeGroups", 1, "amiRelease", value=lacking[-1]))
    message = config_error(config, "triarch:nodeGroups[1].amiRelease", repr(lacking[-1]), having)
    assert kubernetes in message.partition("; allowed:")[0]
    assert lacking[-1] not in message.partition("; allowed:")[2]


def test_unsupported_kubernetes_version(mutated_config: MutatedConfig) -> None:
    config = mutated_config("prod", _set("triarch:cluster", "kubernetesVersion", value="1.24"))
    message = config_error(config, "triarch:cluster.kubernetesVersion", "'1.24'", ["1.34", "1.35"])
    assert "1.24" not in message.partition("; allowed:")[2]


def test_zone_not_in_region(mutated_config: MutatedConfig) -> None:
    config = mutated_config("prod", _set("triarch:cluster", "zones", 2, value="us-west-2c"))
    config_error(config, "triarch:cluster.zones[2]", "'us-west-2c'", ["us-east-1"])


def test_fewer_than_two_zones_when_creating(mutated_config: MutatedConfig) -> None:
    config = mutated_config("dev", _set("triarch:cluster", "zones", value=["us-east-1a"]))
    config_error(config, "triarch:cluster.zones", "us-east-1a", ["us-east-1"])


def test_adopt_without_context(mutated_config: MutatedConfig) -> None:
    config = mutated_config("local", lambda c: c["triarch:cluster"].pop("context"))
    message = config_error(config, "triarch:cluster.context", "is required when the cluster is adopted", ["context"])
    assert "None" not in message


def test_tensor_parallel_size_above_gpus_per_node(mutated_config: MutatedConfig) -> None:
    prod = stack_document("prod")
    model = prod["triarch:models"][1]
    group = next(g for g in prod["triarch:nodeGroups"] if g["name"] == model["nodeGroup"])
    per_node = INSTANCES["instances"][group["instanceType"]]["gpus"]
    too_many = per_node * 2
    config = mutated_config("prod", _set("triarch:models", 1, "tensorParallelSize", value=too_many))
    message = config_error(config, "triarch:models[1].tensorParallelSize", str(too_many), [f"1..{per_node}"])
    assert f"{per_node} GPU" in message


def test_autoscaling_on_engine_vllm(mutated_config: MutatedConfig) -> None:
    prod = stack_document("prod")
    assert prod["triarch:models"][1].get("autoscaling")
    config = mutated_config("prod", _set("triarch:models", 1, "engine", value="vllm"))
    config_error(config, "triarch:models[1].autoscaling", "'max': 4", ["ray-serve"])


def test_unpinned_latest_image(mutated_config: MutatedConfig) -> None:
    config = mutated_config("prod", _set("triarch:images", value={"vllm": "vllm/vllm-openai:latest"}))
    config_error(config, "triarch:images.vllm", "'vllm/vllm-openai:latest'", ["tag"])


def test_image_not_in_catalog(mutated_config: MutatedConfig) -> None:
    config = mutated_config("prod", _set("triarch:images", value={"vllm": "vllm/vllm-openai:v0.99.0"}))
    known = sorted(IMAGES["vllm/vllm-openai"], key=lambda tag: [int(n) for n in re.findall(r"\d+", tag)])
    message = config_error(config, "triarch:images.vllm", "'vllm/vllm-openai:v0.99.0'", known)
    allowed = message.partition("; allowed:")[2]
    assert "rayproject" not in allowed
    assert allowed.strip() == ", ".join(known)  # as versions: v0.9.0 before v0.33.0
    assert known.index("v0.9.0") < known.index("v0.33.0")


def test_invalid_literal(mutated_config: MutatedConfig) -> None:
    config = mutated_config("prod", _set("triarch:models", 0, "engine", value="triton"))
    config_error(config, "triarch:models[0].engine", "'triton'", ["'vllm'", "'ray-serve'"])


# --- what valid stacks give -----------------------------------------------------------------------------

def test_the_project_ships_its_six_stacks() -> None:
    assert STACK_NAMES == ["dev", "fresh", "lab", "large", "local", "prod"]


@pytest.mark.parametrize("name", STACK_NAMES)
def test_each_shipped_stack_validates(stack_config: StackConfigReader, name: str) -> None:
    document = stack_document(name)
    stack = from_pulumi_config(stack_config(name))
    assert stack.cluster.name == document["triarch:cluster"]["name"]
    assert [g.name for g in stack.node_groups] == [g["name"] for g in document["triarch:nodeGroups"]]
    assert [m.name for m in stack.models] == [m["name"] for m in document.get("triarch:models", [])]
    assert stack.aws_region == document.get("aws:region")


def test_default_images_are_in_the_catalog(stack_config: StackConfigReader) -> None:
    config = stack_config("dev")
    assert "triarch:images" not in config
    stack = from_pulumi_config(config)
    assert stack.images == ImagesConfig()
    for pin in (stack.images.vllm, stack.images.ray_llm):
        ref = pin.image
        repository, _, tag = ref.rpartition(":")
        assert tag in IMAGES[repository], ref
        assert tag != "latest"


def test_system_node_group_defaults(stack_config: StackConfigReader) -> None:
    config = stack_config("dev")
    assert set(stack_document("dev")["triarch:cluster"]["systemNodeGroup"]) == {"amiRelease"}
    system = from_pulumi_config(config).cluster.system_node_group
    assert system == SystemNodeGroup(amiRelease="v20260714")
    assert system.instance_type in INSTANCES["cpuInstances"], "the default must be a known CPU instance type"
    assert 1 <= system.min <= system.max


def test_node_group_defaults(stack_config: StackConfigReader) -> None:
    group = from_pulumi_config(stack_config("dev")).node_groups[0]
    assert group.ami_type in compat_data("amis")["amiTypes"]
    assert group.taint is True
    assert group.disk_gib >= 50
    assert group.capacity_type == "ON_DEMAND"


def test_other_namespaces_are_ignored(stack_config: StackConfigReader) -> None:
    config = stack_config("prod")
    noisy = {
        **config,
        "aws:profile": "llm-prod",
        "kubernetes:context": "somewhere",
        "pulumi:tags": '{"team": "ml"}',
        "other:nodeGroups": "{not json",
        "other:cluster": "[1, 2",
    }
    assert from_pulumi_config(noisy) == from_pulumi_config(config)


@pytest.mark.parametrize(("key", "line"), [
    ("Triarch:models", "error: Triarch:models: is not read by Triarch: the namespace is 'triarch', in lower case "
                       "(did you mean 'triarch:models'?); allowed: triarch:<key>"),
    ("triarc:models", "error: triarc:models: is not read by Triarch: the namespace is 'triarch' (did you mean "
                      "'triarch:models'?); allowed: triarch:<key>"),
])
def test_a_misspelt_namespace_is_refused_not_planned_without_its_models(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, line: str) -> None:
    """Pulumi passes any namespace on; read as another tool's, the models would be left out and the stack plan with
    none, exit 0."""
    config = stack_document("dev")
    config[key] = config.pop("triarch:models")
    assert plan_refusal(tmp_path, capsys, config) == line


def test_a_misspelt_aws_key_is_named_with_the_key_it_is_closest_to(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    config = stack_document("prod")
    config["aws:regoin"] = config.pop("aws:region")
    line = plan_refusal(tmp_path, capsys, config)
    assert line.startswith("error: aws:regoin: is not a config key of the aws provider (did you mean 'aws:region'?); "
                           "allowed: aws:accessKey, "), line
    assert "aws:region, " in line and "aws:skipCredentialsValidation, " in line  # the pinned provider's own keys


def test_the_aws_providers_own_keys_are_accepted(stack_config: StackConfigReader) -> None:
    config = stack_config("prod")
    keys = {"aws:profile": "llm-prod", "aws:skipCredentialsValidation": "true", "aws:maxRetries": "5",
            "aws:defaultTags": '{"tags": {"team": "ml"}}'}
    assert from_pulumi_config({**config, **keys}) == from_pulumi_config(config)


def test_a_stack_without_models_says_what_it_plans(write_stack: StackWriter, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    config = stack_document("dev")
    del config["triarch:models"]
    assert main(["plan", "--stack-file", str(write_stack(config)), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert ("Models: none (triarch:models is empty or not set): this plans the cluster, its GPU pools and the "
            "operators, and serves nothing; add a model under triarch:models to serve one") in out


# --- what brings a pool's nodes up -----------------------------------------------------------------------

def test_adopted_pool_at_zero_with_nothing_to_scale_it(mutated_config: MutatedConfig) -> None:
    config = mutated_config("local", _set("triarch:nodeGroups", 0, "min", value=0))
    message = config_error(config, "triarch:nodeGroups[0].min", "0", ["min >= 1", "karpenter", "cluster-autoscaler"])
    assert "nothing would add a node" in message


@pytest.mark.parametrize("provisioner", ["karpenter", "cluster-autoscaler"])
def test_adopted_pool_at_zero_with_a_declared_provisioner(mutated_config: MutatedConfig, provisioner: str) -> None:
    def mutate(config: dict[str, Any]) -> None:
        config["triarch:nodeGroups"][0]["min"] = 0
        config["triarch:cluster"]["nodeProvisioner"] = provisioner

    stack = from_pulumi_config(mutated_config("local", mutate))
    assert stack.cluster.provisioner == provisioner


def test_adopted_cluster_defaults_to_no_provisioner(stack_config: StackConfigReader) -> None:
    assert from_pulumi_config(stack_config("local")).cluster.provisioner == "none"


def test_created_cluster_installs_no_cluster_autoscaler(mutated_config: MutatedConfig) -> None:
    config = mutated_config("prod", _set("triarch:cluster", "nodeProvisioner", value="cluster-autoscaler"))
    config_error(config, "triarch:cluster.nodeProvisioner", "'cluster-autoscaler'", ["karpenter", "none"])


def test_karpenter_pool_keeps_no_idle_nodes(mutated_config: MutatedConfig) -> None:
    config = mutated_config("prod", _set("triarch:nodeGroups", 0, "min", value=1))
    config_error(config, "triarch:nodeGroups[0].min", "1", ["0", "managedNodeGroup"])


def test_managed_node_group_must_be_fixed_size(mutated_config: MutatedConfig) -> None:
    config = mutated_config("prod", _set("triarch:nodeGroups", 1, "provisioner", value="managedNodeGroup"))
    message = config_error(config, "triarch:nodeGroups[1].min", "0", ["min == max == 2", "karpenter"])
    assert "nothing scales a managed node group" in message


def test_without_karpenter_every_pool_is_a_fixed_node_group(mutated_config: MutatedConfig) -> None:
    config = mutated_config("prod", _set("triarch:cluster", "nodeProvisioner", value="none"))
    config_error(config, "triarch:nodeGroups[0].min", "0", ["min == max == 6"])

    def fixed(config: dict[str, Any]) -> None:
        config["triarch:cluster"]["nodeProvisioner"] = "none"
        config["triarch:nodeGroups"][0].update(min=2, max=2)
        config["triarch:nodeGroups"][1].update(min=1, max=1, provisioner="karpenter")

    config_error(mutated_config("prod", fixed), "triarch:nodeGroups[1].provisioner", "'karpenter'",
                 ["managedNodeGroup", "nodeProvisioner: karpenter"])


def test_pool_provisioner_only_on_created_clusters(mutated_config: MutatedConfig) -> None:
    config = mutated_config("local", _set("triarch:nodeGroups", 0, "provisioner", value="karpenter"))
    config_error(config, "triarch:nodeGroups[0].provisioner", "'karpenter'", ["nodeProvisioner"])


@pytest.mark.parametrize(("pool", "fits"), [("a" * 23, True), ("a" * 24, False)])
def test_managed_node_group_name_fits_eks(mutated_config: MutatedConfig, pool: str, fits: bool) -> None:
    """EKS takes 63 characters: 32 (cluster) + 1 + 23 (pool) + 1 + 6 (the hash that follows replacements)."""

    def long_names(config: dict[str, Any]) -> None:
        config["triarch:cluster"]["name"] = "c" * 32
        group = config["triarch:nodeGroups"][1]
        group.update(name=pool, provisioner="managedNodeGroup", min=2, max=2)
        config["triarch:models"][1]["nodeGroup"] = group["name"]

    config = mutated_config("prod", long_names)
    if fits:
        assert from_pulumi_config(config).node_groups[1].name == pool
    else:
        config_error(config, "triarch:nodeGroups[1].name", repr(pool), ["at most 23 characters"])


def test_system_node_group_pins_its_own_release(mutated_config: MutatedConfig) -> None:
    config = mutated_config("prod", lambda c: c["triarch:cluster"]["systemNodeGroup"].pop("amiRelease"))
    message = config_error(config, "triarch:cluster.systemNodeGroup.amiRelease", "is required when the cluster is "
                           "created", sorted(AMIS)[-2:])
    assert "None" not in message
    config = mutated_config("prod", _set("triarch:cluster", "systemNodeGroup", "amiRelease", value="v20250519"))
    config_error(config, "triarch:cluster.systemNodeGroup.amiRelease", "'v20250519'", ["v20260714"])


# --- the CLI on a bad stack -----------------------------------------------------------------------------

def _bad_stack(write_stack: StackWriter) -> Path:
    config = stack_document("prod")
    config["triarch:nodeGroups"][1]["instanceType"] = "p9.huge"
    return write_stack(config)


def test_cli_config_error_is_one_line_and_writes_nothing(write_stack: StackWriter, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = _bad_stack(write_stack)
    out = tmp_path / "out"
    code = main(["plan", "--stack-file", str(path), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("error: triarch:nodeGroups[1].instanceType: 'p9.huge'")
    assert "Traceback" not in captured.err + captured.out
    assert not (out / "plan.json").exists()
    assert not (out / "manifests").exists()


def test_cli_process_stderr_is_only_the_error_line(write_stack: StackWriter, tmp_path: Path) -> None:
    """The same, through a real process: what a user (or CI log) sees on stderr is the error line alone."""
    path = _bad_stack(write_stack)
    out = tmp_path / "out"
    entry = "import sys; from triarch.cli import main; sys.exit(main())"
    argv = [sys.executable, "-c", entry, "plan", "--stack-file", str(path), "--out", str(out)]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: triarch:nodeGroups[1].instanceType: ")
    assert not (out / "plan.json").exists()


def test_cli_unknown_stack_lists_the_stacks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--stack", "nosuch"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("error: --stack: 'nosuch'")
    allowed = lines[0].partition("allowed: ")[2].split(", ")
    assert sorted(allowed) == ["dev", "fresh", "lab", "large", "local", "prod"]
