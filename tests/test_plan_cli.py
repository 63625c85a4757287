"""`triarch plan` end to end: exit code, plan.json, manifests/ and the printed summary, for every stack."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from triarch import cli
from triarch.catalog import Catalog, load_catalog

ROOT = Path(__file__).resolve().parents[1]
STACKS = ("local", "dev", "prod")
KIND_LABELS = ("AWS", "Kubernetes: where (scheduling)", "Kubernetes: how (Ray)", "Kubernetes: when (vLLM)",
               "Pulumi providers", "other")
NOT_OBJECTS = ("kubernetes:helm.sh/", "kubernetes:yaml")


@dataclass
class Planned:
    code: int
    stdout: str
    out: Path

    @property
    def document(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.out / "plan.json").read_text(encoding="utf-8"))
        return data


def run_cli(stack: str, out: Path) -> Planned:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(["plan", "--stack", stack, "--out", str(out)])
    return Planned(code, stdout.getvalue(), out)


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Planned]:
    """Every stack planned once through the CLI entry point, in this process."""
    return {stack: run_cli(stack, tmp_path_factory.mktemp(f"plan-{stack}")) for stack in STACKS}


@pytest.fixture(scope="module")
def facts() -> Catalog:
    return load_catalog(ROOT / "templates" / "compat")


def stack_config(name: str) -> dict[str, Any]:
    document = yaml.safe_load((ROOT / "stacks" / f"Pulumi.{name}.yaml").read_text(encoding="utf-8"))
    config: dict[str, Any] = document["config"]
    return config


def is_component(type_: str) -> bool:
    return type_.startswith("triarch:")


@pytest.mark.parametrize("stack", STACKS)
def test_plan_exits_zero(plans: dict[str, Planned], stack: str) -> None:
    assert plans[stack].code == 0


@pytest.mark.parametrize("stack", STACKS)
def test_plan_json_shape(plans: dict[str, Planned], stack: str) -> None:
    document = plans[stack].document
    assert set(document) == {"stack", "resources"}
    assert document["stack"] == stack
    resources = document["resources"]
    assert isinstance(resources, list) and resources
    urns = [r["urn"] for r in resources]
    assert urns == sorted(urns), "resources are written in URN order, so plans of one stack are byte-identical"
    assert len(set(urns)) == len(urns)
    for resource in resources:
        # ignoreChanges only where the program sets it (a few resources), so most plans read as before; provider
        # where the resource has an explicit one (a provider of the plan, by URN).
        assert set(resource) - {"ignoreChanges", "provider"} == {"type", "name", "urn", "parent", "dependencies",
                                                                 "propertyDependencies", "inputs"}, resource
        assert resource.get("ignoreChanges", ["x"]), resource["name"]
        assert resource.get("provider", urns[0]) in urns, resource["name"]
        if resource["type"].startswith("kubernetes:"):  # every Kubernetes object goes to the stack's own cluster
            assert "pulumi:providers:kubernetes::" in resource["provider"], resource["name"]
        assert isinstance(resource["type"], str) and resource["type"].count(":") >= 2
        assert isinstance(resource["name"], str) and resource["name"]
        assert resource["urn"].endswith(f"{resource['type']}::{resource['name']}")
        assert isinstance(resource["inputs"], dict)
        parent = resource["parent"]
        assert parent is None or (isinstance(parent, str)
                                  and parent.startswith(f"urn:pulumi:{stack}::triarch::"))
        assert set(resource["dependencies"]) <= set(urns), resource["name"]
        for key, sources in resource["propertyDependencies"].items():
            assert key in resource["inputs"] and set(sources) <= set(resource["dependencies"]), (resource["name"], key)
    types = {r["type"] for r in resources}
    assert "triarch:platform:Platform" in types
    assert "kubernetes:helm.sh/v3:Release" in types
    if stack_config(stack)["triarch:cluster"]["create"]:
        assert "aws:eks/cluster:Cluster" in types
    else:
        assert not [t for t in types if t.startswith("aws:")]


@pytest.mark.parametrize("stack", STACKS)
def test_one_manifest_per_kubernetes_object(plans: dict[str, Planned], stack: str) -> None:
    planned = plans[stack]
    files = sorted((planned.out / "manifests").glob("*.yaml"))
    objects = [r for r in planned.document["resources"]
               if r["type"].startswith("kubernetes:") and not r["type"].startswith(NOT_OBJECTS)
               and not r["type"].endswith("Patch")]
    assert objects, "the stack should create at least one Kubernetes object (the device plugin namespace)"
    assert len(files) == len(objects), [f.name for f in files]
    kinds = []
    for path in files:
        documents = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
        assert len(documents) == 1, path.name
        [obj] = documents
        assert isinstance(obj["apiVersion"], str) and obj["apiVersion"]
        name = obj["metadata"]["name"]
        assert isinstance(name, str) and name, path.name
        assert name in path.name
        kinds.append(obj["kind"])
    assert sorted(kinds) == sorted(r["type"].rsplit(":", 1)[1] for r in objects)


@pytest.mark.parametrize("stack", STACKS)
def test_summary_names_each_node_group_and_its_gpu(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                   facts: Catalog, stack: str) -> None:
    assert cli.main(["plan", "--stack", stack, "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    section = printed.split("\nGPU pools\n", 1)[1].split("\n\n", 1)[0]
    lines = section.splitlines()
    for group in stack_config(stack)["triarch:nodeGroups"]:
        gpu = facts.instances[group["instanceType"]].gpu if "instanceType" in group else group["gpu"]
        assert gpu is not None
        product = facts.gpus[gpu].product
        rows = [line for line in lines if line.split()[:1] == [group["name"]]]
        assert len(rows) == 1, f"no single summary row for node group {group['name']!r}:\n{printed}"
        assert product in rows[0], rows[0]


def test_summary_prices_each_pool_idle_at_min_and_max(plans: dict[str, Planned]) -> None:
    """prod on 2026-12-01 list prices: L4 pool 0-6 g6.2xlarge at $0.9776/h, A100 pool 0-2 p4de.24xlarge at
    $27.44705/h, 730 h a month; both start at zero nodes. Idle, with no traffic: embed's 2 fixed replicas and qwen's
    minimum 1 hold 3 L4 GPUs (3 nodes of one GPU: $2,141), chat's minimum 1 Ray worker of 2 GPUs holds one p4de
    ($20,036); with the fixed costs, $22,919 a month before a single request: 3 system m7i.xlarge at $0.2016/h
    ($442), the control plane ($73), 3 NAT gateways at $0.045/h ($99) and their 3 addresses at $0.005/h ($11), root
    volumes at $0.08 per GiB-month (idle 3 x 50 + 3 x 200 + 1 x 500 = 1,250 GiB, $100; at max 6 x 50 + 6 x 200 +
    2 x 500 = 2,500 GiB, $200), Prometheus' 50 GiB ($4), the weights on EFS at $0.30 ($14)."""
    section = plans["prod"].stdout.split("\nCapacity and cost per month", 1)[1].split("\n\n", 1)[0]
    rows = {line.split()[0]: line.split() for line in section.splitlines()[2:]}
    assert rows["l4"][1:] == ["g6.2xlarge", "0-6", "0-6", "3", "node(s)", "$2,141", "$0", "$4,282"]
    assert rows["a100"][1:] == ["p4de.24xlarge", "0-2", "0-16", "1", "node(s)", "$20,036", "$0", "$40,073"]
    assert rows["total"][1:] == ["$22,919", "$654", "$45,638"]
    [disks] = [line.split() for line in section.splitlines() if line.strip().startswith("EBS root volumes")]
    assert disks[-3:] == ["$100", "$12", "$200"] and disks[5:8] == ["1250", "GiB,", "150-2500"]
    assert "on-demand list prices in us-east-1, 2026-12-01" in section
    assert "GPUs held (per replica x replicas): embed 1 x 2 on l4, chat 2 x 1-4 on a100, qwen 1 x 1-3 on l4" in section


def test_a_spot_pool_says_its_price_is_the_on_demand_one(tmp_path: Path) -> None:
    """Spot prices move and are not recorded: a SPOT pool is priced at on-demand, an upper bound, and its row says
    so; an on-demand pool's row says nothing of it."""
    document = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text(encoding="utf-8"))
    document["config"]["triarch:nodeGroups"][0]["capacityType"] = "SPOT"
    path = tmp_path / "Pulumi.spot.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(["plan", "--stack-file", str(path), "--out", str(tmp_path / "out")]) == 0
    section = out.getvalue().split("\nCapacity and cost per month", 1)[1].split("\n\n", 1)[0]
    [row] = [line for line in section.splitlines() if line.strip().startswith("l4")]
    assert row.split()[:8] == ["l4", "(spot,", "priced", "on-demand:", "an", "upper", "bound)", "g6.xlarge"], row
    [system] = [line for line in section.splitlines() if line.strip().startswith("system nodes")]
    assert "spot" not in system


@pytest.mark.parametrize("stack", STACKS)
def test_summary_counts_resources_per_layer(plans: dict[str, Planned], stack: str) -> None:
    lines = plans[stack].stdout.splitlines()
    totals = [line for line in lines if line.startswith("Resources")]
    assert len(totals) == 1, plans[stack].stdout
    total = int(totals[0].split(":")[1].split()[0])
    start = lines.index(totals[0])
    counts = {}
    for label in KIND_LABELS:
        rows = [line for line in lines[start + 1:] if line.strip().startswith(label + " ")]
        assert len(rows) <= 1, f"two Resources lines for {label}"
        counts[label] = int(rows[0].split()[-1]) if rows else 0
    assert sum(counts.values()) == total
    resources = plans[stack].document["resources"]
    custom = [r for r in resources if not is_component(r["type"])]
    assert total == len(custom)
    assert counts["AWS"] == sum(r["type"].startswith("aws:") for r in resources), counts
    kubernetes = sum(r["type"].startswith("kubernetes:") for r in resources)
    assert sum(counts[label] for label in KIND_LABELS if label.startswith("Kubernetes")) == kubernetes, counts
    releases = sorted(f"{r['name']} " for r in resources if r["type"] == "kubernetes:helm.sh/v3:Release")
    helm = [line for line in lines[start:] if "of which Helm releases" in line]
    if releases:
        [line] = helm
        for r in resources:
            if r["type"] == "kubernetes:helm.sh/v3:Release":
                assert f"{r['name']}" in line and r["inputs"]["version"] in line, (r["name"], line)
    else:
        assert helm == []


def test_summary_names_the_helm_charts_and_capacity_file(plans: dict[str, Planned]) -> None:
    out = plans["prod"].stdout
    assert "kuberay-operator 1.7.0" in out and "nvidia-device-plugin 0.20.0" in out and "karpenter 1.14.1" in out
    assert "capacity.json (pools, GPUs and cost)" in out


def test_stack_file_option_names_the_stack_from_the_file(tmp_path: Path) -> None:
    planned_dir = tmp_path / "out"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = cli.main(["plan", "--stack-file", str(ROOT / "stacks" / "Pulumi.dev.yaml"),
                         "--out", str(planned_dir)])
    assert code == 0
    assert json.loads((planned_dir / "plan.json").read_text(encoding="utf-8"))["stack"] == "dev"


def test_console_script_runs_outside_the_test_process(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("triarch")
    assert script.is_file(), f"the console script {script} is not installed"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULUMI_")}
    done = subprocess.run([str(script), "plan", "--stack", "dev", "--out", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    document = json.loads((tmp_path / "plan.json").read_text(encoding="utf-8"))
    assert document["stack"] == "dev"
    assert any(r["type"] == "aws:eks/nodeGroup:NodeGroup" for r in document["resources"])
    assert "Resources" in done.stdout


@pytest.mark.parametrize("command", [["plan", "--stack", "dev"], ["refdata", "status"]], ids=["plan", "one-line"])
def test_a_reader_that_goes_away_stops_the_command_quietly(tmp_path: Path, command: list[str]) -> None:
    """`triarch plan --stack dev | head`: once the reader is gone, the command stops as a shell tool does on SIGPIPE
    (exit 141), with no traceback and no "Exception ignored" from Python's flush at exit, whether the output is
    large (the plan's summary fails as it is printed) or one line (it fails only when flushed). Here the reader is
    gone before anything is printed (`| true`), so every write meets a closed pipe."""
    script = Path(sys.executable).with_name("triarch")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULUMI_")}
    out = ["--out", str(tmp_path)] if command[0] == "plan" else []
    process = subprocess.Popen([str(script), *command, *out], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    err = process.stderr.read()
    assert process.wait(timeout=300) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err
    if out:
        assert json.loads((tmp_path / "plan.json").read_text(encoding="utf-8"))["stack"] == "dev"  # planned still


def _resources(planned: Planned) -> list[tuple[str, str, str]]:
    return sorted((r["type"], r["name"], json.dumps(r["inputs"], sort_keys=True))
                  for r in planned.document["resources"])


def test_consecutive_plans_do_not_leak_into_each_other(plans: dict[str, Planned], tmp_path: Path) -> None:
    # plans already holds local, dev and prod planned in that order in this process; plan them again in
    # another order and compare: each stack's resources depend on its own stack file only.
    again = {stack: run_cli(stack, tmp_path / stack) for stack in ("prod", "local", "dev")}
    for stack in STACKS:
        assert again[stack].code == 0
        assert _resources(again[stack]) == _resources(plans[stack]), stack
    local = again["local"].document
    assert not [r for r in local["resources"] if r["type"].startswith("aws:")]
    assert "llm-prod" not in json.dumps(local)
    dev = json.dumps(again["dev"].document)
    assert "llm-prod" not in dev and "a100" not in dev
    for stack, planned in again.items():
        parents = {r["parent"] for r in planned.document["resources"] if r["parent"]}
        assert all(p.startswith(f"urn:pulumi:{stack}::") for p in parents), stack


def test_two_plans_of_a_stack_are_byte_identical(tmp_path: Path) -> None:
    for run in ("first", "second"):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert cli.main(["plan", "--stack", "prod", "--out", str(tmp_path / run)]) == 0
    first, second = (tmp_path / "first"), (tmp_path / "second")
    assert (first / "plan.json").read_bytes() == (second / "plan.json").read_bytes()
    names = sorted(p.name for p in (first / "manifests").iterdir())
    assert names == sorted(p.name for p in (second / "manifests").iterdir())
    for name in names:
        assert (first / "manifests" / name).read_bytes() == (second / "manifests" / name).read_bytes(), name


def test_a_plan_run_from_a_subfolder_writes_under_the_projects_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Without --out, out/<stack> of the project's root (which git ignores), wherever the command runs; the line that
    says where names it from there."""
    root = tmp_path / "project"
    (root / "stacks").mkdir(parents=True)
    monkeypatch.setattr("triarch.cli.plan.PROJECT_ROOT", root)
    monkeypatch.chdir(root / "stacks")
    assert cli.main(["plan", "--stack", "lab"]) == 0
    assert (root / "out" / "lab" / "plan.json").is_file()
    assert list((root / "stacks").iterdir()) == []
    assert f"wrote {root / 'out' / 'lab' / 'plan.json'} " in capsys.readouterr().out


@pytest.mark.parametrize("stack", STACKS)
def test_the_summary_names_parallelism_by_its_stack_keys(plans: dict[str, Planned], stack: str) -> None:
    """A plan speaks the stack file's keys (tensorParallelSize), not the tuner's arguments, in every note."""
    for tuner_word in ("tensor_parallel_size", "pipeline_parallel_size", "gpus_available", "kv_cache_dtype"):
        assert tuner_word not in plans[stack].stdout, stack
    if stack == "local":  # the laptop's embedding model, cut for concurrency
        assert "at tensorParallelSize 1); maxModelLen: 32768 keeps the longest" in plans[stack].stdout
