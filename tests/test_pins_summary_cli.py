"""Pins (issue 53): what `triarch plan` prints, and the CLI's exit codes (0 ok; 1 where findings fail, as documented;
2 for bad input, in one `error:` line naming the key path or option, the bad value and what is allowed; never a
traceback). Expected values are written by hand from the stack files, the docs (README, docs/pools.md,
docs/stack-keys.md, docs/plan.md) and templates/compat/*.yaml's raw rows, never computed by the code under test."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from conftest import STACK_NAMES, compat_data, plan_refusal, stack_document, write_stack_file
from triarch import cli


def run(argv: list[str]) -> tuple[int, str, str]:
    """`triarch <argv>` through the entry point: its exit code, standard output and standard error."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()


def planned(config: dict[str, Any], directory: Path, name: str) -> tuple[str, Path]:
    """`triarch plan --stack-file` of `config`, exit 0: what it printed, and its output directory."""
    directory.mkdir(parents=True, exist_ok=True)
    path = write_stack_file(directory / f"Pulumi.{name}.yaml", config)
    code, out, err = run(["plan", "--stack-file", str(path), "--out", str(directory / "out")])
    assert code == 0, err
    return out, directory / "out"


def section(printed: str, heading: str) -> list[str]:
    """A section of the summary: its heading line and the lines up to the next blank line."""
    return (heading + printed.split("\n" + heading, 1)[1]).split("\n\n")[0].splitlines()


def one_error_line(err: str, out: str) -> str:
    """Bad input: exactly one line on standard error, starting `error: `, and no traceback anywhere."""
    assert "Traceback" not in err + out
    [line] = err.splitlines()
    assert line.startswith("error: "), line
    return line


@pytest.fixture(scope="module")
def prod(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    return planned(stack_document("prod"), tmp_path_factory.mktemp("prod"), "prod")


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> str:
    return planned(stack_document("local"), tmp_path_factory.mktemp("local"), "local")[0]


@pytest.fixture(scope="module")
def zoned(tmp_path_factory: pytest.TempPathFactory) -> str:
    """dev with its L4 pool in one zone of the cluster's two and GPU feature discovery turned off."""
    config = stack_document("dev")
    config["triarch:nodeGroups"][0]["zones"] = ["us-east-1b"]
    config["triarch:devicePlugin"] = {"gpuFeatureDiscovery": False}
    return planned(config, tmp_path_factory.mktemp("zoned"), "dev")[0]


# --- the plan summary ----------------------------------------------------------------------------------------------

def test_the_heading_names_the_cluster_its_zones_and_kubernetes(prod: tuple[str, Path], local: str) -> None:
    """The first line: a created cluster by name and zones, an adopted one by its kubeconfig context, and the
    Kubernetes minor, all as stacks/Pulumi.prod.yaml and Pulumi.local.yaml say them."""
    assert prod[0].splitlines()[0] == \
        "stack prod: EKS cluster llm-prod in us-east-1a, us-east-1b, us-east-1c, Kubernetes 1.35"
    assert local.splitlines()[0] == "stack local: existing cluster, kubeconfig context triarch-local, Kubernetes 1.34"


def test_an_adopted_pool_row_gives_its_own_nodes_driver_and_no_taint(local: str) -> None:
    """Pulumi.local.yaml's laptop pool: existing node(s), min 1 and max 1, the driver nvidia-smi prints
    (driverVersion 580.95.05), no AMI release, taint: false; no capacity type on a cluster Triarch did not make."""
    [row] = [line.split() for line in section(local, "GPU pools") if line.strip().startswith("laptop")]
    assert row[0:2] == ["laptop", "existing"]
    assert row[-7:] == ["1", "1-1", "-", "existing", "580.95.05", "-", "none"]


def test_an_adopted_cluster_has_no_price_and_no_total(local: str) -> None:
    """docs/plan.md: costs are null where a price is unknown (an existing cluster's nodes), never guessed; with no
    region priced there is no total row."""
    lines = section(local, "Capacity and cost per month")
    assert lines[0] == "Capacity and cost per month (existing nodes: no price; 730 h)"
    [pool] = [line.split() for line in lines if line.strip().startswith("laptop")]
    assert pool[1:] == ["existing", "1-1", "1-1", "1", "node(s)", "unknown", "unknown", "unknown"]
    assert not [line for line in lines if line.strip().startswith("total")]


def test_a_pool_in_its_own_zones_is_said_to_launch_there(zoned: str) -> None:
    """docs/stack-keys.md nodeGroups[].zones: the zones the pool's nodes come up in (default: the cluster's). The
    NodePool's limits are max x the instance's GPUs, vCPUs and memory (instances.yaml's g6.xlarge), and empty nodes
    go ten minutes after they empty (docs/pools.md)."""
    g6 = compat_data("instances")["instances"]["g6.xlarge"]
    limits = f"{2 * g6['gpus']} nvidia.com/gpu, {2 * g6['vcpus']} cpu, {2 * g6['memoryGiB']}Gi memory"
    assert (f"  l4: Karpenter NodePool l4: from 0 to 2 g6.xlarge on-demand nodes in us-east-1b, launched for "
            f"pending pods (limits: {limits}); an empty node is removed after 10m") in zoned.splitlines()


def test_the_device_plugin_line_says_whether_gpu_feature_discovery_runs(prod: tuple[str, Path], zoned: str) -> None:
    """docs/stack-keys.md devicePlugin.gpuFeatureDiscovery (default true); the chart pinned in charts.yaml."""
    chart = compat_data("charts")["charts"]["nvidia-device-plugin"]
    head = f"Device plugin: chart nvidia-device-plugin {chart['version']} ({chart['repository']}), "
    tail = ", GPU nodes only, tolerating the GPU taint"
    assert head + "with GPU feature discovery" + tail in prod[0].splitlines()
    assert head + "without GFD" + tail in zoned.splitlines()


def test_a_matrix_warning_is_said_once_per_pool(prod: tuple[str, Path]) -> None:
    """prod's Ray Serve models run rayproject/ray-llm:2.60.0-py312-cu130 on two pools (chat on a100, qwen on l4):
    the driver/CUDA matrix warns once for each, and the program's warnings do not repeat them."""
    said = [line for line in prod[0].splitlines() if "rayproject/ray-llm:2.60.0-py312-cu130 needs CUDA" in line]
    assert len(said) == 2, said
    assert {pool for line in said for pool in ("a100", "l4") if f"node group '{pool}'" in line} == {"a100", "l4"}


def test_the_models_table_gives_gpus_replicas_parallelism_and_length(prod: tuple[str, Path]) -> None:
    """Pulumi.prod.yaml: embed 2 fixed replicas of 1 GPU; chat tensorParallelSize 2, autoscaling 1-4, maxModelLen
    32768; qwen 1 GPU, autoscaling 1-3, maxModelLen 16384."""
    rows = {line.split()[0]: line.split() for line in section(prod[0], "Models (engine args")[2:]
            if not line.startswith("    ")}
    assert rows["embed"][:8] == ["embed", "vllm", "Qwen/Qwen3-Embedding-0.6B", "l4", "1", "x", "2", "1"]
    assert rows["chat"][:8] == ["chat", "ray-serve", "deepseek-ai/DeepSeek-V2-Lite-Chat", "a100", "2", "x", "1-4", "2"]
    assert rows["qwen"][:8] == ["qwen", "ray-serve", "Qwen/Qwen3-8B", "l4", "1", "x", "1-3", "1"]
    assert rows["chat"][-2] == "32768" and rows["qwen"][-2] == "16384"


def test_the_last_line_says_where_the_plan_was_written_and_how_many_manifests(prod: tuple[str, Path]) -> None:
    """docs/plan.md: plan.json, capacity.json and one YAML file per Kubernetes object in manifests/; the count
    printed is the files written there."""
    out = prod[1]
    count = len(list((out / "manifests").iterdir()))
    assert prod[0].rstrip("\n").splitlines()[-1] == (
        f"wrote {out / 'plan.json'} (every resource and its inputs), {out / 'capacity.json'} (pools, GPUs and cost) "
        f"and {count} manifest(s) in {out / 'manifests'}")


# --- exit codes ----------------------------------------------------------------------------------------------------

def test_a_stack_file_that_does_not_exist_exits_2_naming_the_option(tmp_path: Path) -> None:
    missing = tmp_path / "Pulumi.gone.yaml"
    code, out, err = run(["plan", "--stack-file", str(missing), "--out", str(tmp_path / "out")])
    assert code == 2
    assert one_error_line(err, out) == \
        f"error: --stack-file: '{missing}' does not exist; allowed: a Pulumi stack file path"
    assert not (tmp_path / "out").exists()


def test_an_unknown_stack_exits_2_listing_the_projects_stacks(tmp_path: Path) -> None:
    """--stack names a file of stacks/: the line lists the stacks there (conftest.STACK_NAMES, read from stacks/)."""
    code, out, err = run(["check", "--stack", "prdo"])
    assert code == 2
    assert one_error_line(err, out) == \
        f"error: --stack: 'prdo' is not a stack of this project; allowed: {', '.join(STACK_NAMES)}"


def test_a_bad_stack_value_exits_2_with_key_value_and_allowed(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """docs/stack-keys.md triarch:cluster.natGateways: one of 'single', 'perZone'."""
    config = stack_document("dev")
    config["triarch:cluster"]["natGateways"] = "both"
    line = plan_refusal(tmp_path, capsys, config)
    assert line == ("error: triarch:cluster.natGateways: 'both' is not an allowed value; allowed: one of 'single', "
                    "'perZone'")


def test_comment_on_a_directory_without_a_review_exits_2(tmp_path: Path) -> None:
    """`triarch comment DIR` reads the directory the review workflow writes (head/<stack>, ...); any other
    directory is bad input."""
    code, out, err = run(["comment", str(tmp_path)])
    assert code == 2
    line = one_error_line(err, out)
    assert line.startswith(f"error: comment: '{tmp_path}' has no head/ directory; allowed: ")


@pytest.fixture(scope="module")
def fresh_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped fresh stack's plan: its split model draws the kv-transfer-over-tcp advisory on purpose."""
    return planned(stack_document("fresh"), tmp_path_factory.mktemp("fresh"), "fresh")[1]


def test_check_with_advisories_only_exits_0(fresh_plan: Path) -> None:
    """README: `triarch check` exits 1 on a mandatory violation; an advisory is said and does not fail it."""
    code, out, err = run(["check", "--plan", str(fresh_plan)])
    assert code == 0, err
    assert "[advisory] kv-transfer-over-tcp:" in out
    assert out.rstrip("\n").splitlines()[-1] == "0 mandatory, 1 advisory"


def test_check_of_a_plan_with_a_privileged_pod_exits_1(prod: tuple[str, Path], tmp_path: Path) -> None:
    """README: exit 1 on a mandatory violation: a plan whose serving pod is privileged (no-privileged-pods,
    mandatory in the policy pack), checked from its plan directory."""
    edited = tmp_path / "plan"
    shutil.copytree(prod[1], edited)
    document = json.loads((edited / "plan.json").read_text(encoding="utf-8"))
    [embed] = [r for r in document["resources"] if r["name"] == "deployment-llm-embed"]
    embed["inputs"]["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] = True
    (edited / "plan.json").write_text(json.dumps(document), encoding="utf-8")
    code, out, err = run(["check", "--plan", str(edited)])
    assert code == 1, out + err
    assert "[mandatory] no-privileged-pods:" in out
