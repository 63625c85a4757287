"""The local plane's pure parts: engine pins and their recipes, the nodes and CRDs a stack asks of the plane, and
the components a stack says the cluster already runs (`existing`). The plane itself runs in test_real_engines."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT, MutatedConfig, compat_data, reference_dir, stack_document
from triarch import refdata
from triarch.catalog import catalog
from triarch.config import from_pulumi_config
from triarch.errors import ConfigError
from triarch.existing import check_cluster, required_crds, trusted_note
from triarch.local import engines
from triarch.local.components import kwok_stages, storage_class
from triarch.local.crds import crd_files, existing_crd_sets, load_crd_sets
from triarch.local.stack import GFD_DRIVER, GFD_PRODUCT, KWOK_ANNOTATION, ZONE_LABEL, plane_nodes
from triarch.planners.models import plan_models
from triarch.planners.objects import plan_kubernetes

PINS = yaml.safe_load((ROOT / "tools" / "engines" / "engines.yaml").read_text())


def _lab(mutated_config: MutatedConfig, mutate: Any = lambda c: None):  # type: ignore[no-untyped-def]
    stack = from_pulumi_config(mutated_config("lab", mutate))
    models = plan_models(stack, catalog())
    return stack, plan_kubernetes(stack, models, catalog())


# --- pins ----------------------------------------------------------------------------------------------------


def test_the_kubernetes_provider_is_built_at_exactly_the_python_sdks_version() -> None:
    """The Python SDK asks the CLI for its own version of the provider plugin; another version would be
    downloaded (and nothing may be)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pinned = next(d for d in pyproject["project"]["dependencies"] if d.startswith("pulumi-kubernetes=="))
    assert PINS["engines"]["pulumi-resource-kubernetes"]["release"] == "v" + pinned.split("==")[1]
    lock = (ROOT / "uv.lock").read_text()
    assert re.search(r'name = "pulumi-kubernetes"\nversion = "' + re.escape(pinned.split("==")[1]) + '"', lock)


def test_the_pulumi_cli_is_at_least_the_python_sdk_and_its_language_host_matches_it() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    sdk = next(d for d in pyproject["project"]["dependencies"] if d.startswith("pulumi=="))
    sdk_version = tuple(int(x) for x in sdk.split("==")[1].split("."))
    cli = PINS["engines"]["pulumi"]["version"]
    assert tuple(int(x) for x in cli.removeprefix("v").split(".")) >= sdk_version
    assert PINS["engines"]["pulumi"]["require"]["github.com/pulumi/pulumi/sdk/v3"] == cli
    # The language host is built beside the CLI (where it looks for the plugins it bundles), on the same SDK.
    assert PINS["engines"]["pulumi"]["packages"]["pulumi-language-python"] == "."
    assert PINS["engines"]["pulumi"]["files"]["pulumi-language-python-exec"].startswith(
        "github.com/pulumi/pulumi/sdk/v3:")


def test_kubernetes_is_at_the_minor_the_stacks_run_and_etcd_is_new_enough_for_it() -> None:
    minors = {yaml.safe_load((ROOT / "stacks" / f"Pulumi.{s}.yaml").read_text())["config"]["triarch:cluster"]
              ["kubernetesVersion"] for s in ("prod", "lab")}
    assert minors == {"1.35"}
    assert PINS["engines"]["kubernetes"]["version"].startswith("v1.35.")
    etcd = tuple(int(x) for x in PINS["engines"]["etcd"]["version"].removeprefix("v").split("."))
    assert etcd >= (3, 5, 13)  # Kubernetes >= 1.35 refuses older etcd


def test_crd_sets_are_the_versions_the_charts_pin() -> None:
    charts = compat_data("charts")["charts"]
    versions = {"kuberay": "v" + charts["kuberay-operator"]["version"],
                "prometheus": "v0.93.1",  # prometheus-operator-crds 31.0.1's appVersion (charts.yaml source)
                "keda": "v" + charts["keda"]["version"], "karpenter": "v" + charts["karpenter-crd"]["version"],
                "lws": charts["lws"]["version"]}  # the chart's own version carries its v
    assert "appVersion v0.93.1" in charts["prometheus-operator-crds"]["source"]
    for name, crds in load_crd_sets().items():
        assert crds.module.endswith("@" + versions[name]), name
        assert crds.reference_dir.split("/")[0].endswith(versions[name].removeprefix("v")), name


def test_kubernetes_staging_modules_are_replaced_by_their_published_versions() -> None:
    go_mod = """module k8s.io/kubernetes

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/kube-aggregator => ./staging/src/k8s.io/kube-aggregator
\tgithub.com/example/other => ../other
)
"""
    assert engines.staging_replaces(go_mod, "v1.35.4") == {
        "k8s.io/api": "k8s.io/api v0.35.4", "k8s.io/kube-aggregator": "k8s.io/kube-aggregator v0.35.4"}


def test_a_modules_own_versioned_replaces_are_carried_local_ones_are_not() -> None:
    go_mod = """module github.com/kedacore/keda/v2

replace (
	// pin k8s.io to v0.35.5
	k8s.io/api => k8s.io/api v0.35.5
	github.com/prometheus/common => github.com/prometheus/common v0.66.1 // a comment
	example.com/local => ../local
)

replace github.com/atotto/clipboard => github.com/tgummerer/clipboard v0.0.0-20241001131231-d02d263e614e
"""
    assert engines.versioned_replaces(go_mod) == {
        "k8s.io/api": "k8s.io/api v0.35.5",
        "github.com/prometheus/common": "github.com/prometheus/common v0.66.1",
        "github.com/atotto/clipboard": "github.com/tgummerer/clipboard v0.0.0-20241001131231-d02d263e614e"}


def test_versions_are_stamped_so_clients_do_not_read_v0() -> None:
    flags = engines.ldflags(engines.load_engines()["kubernetes"])
    assert "-X k8s.io/component-base/version.gitVersion=v1.35.4" in flags
    assert "-X k8s.io/component-base/version.gitMinor=35" in flags
    assert "-X k8s.io/component-base/version.gitMajor=1 " in flags
    provider = engines.ldflags(engines.load_engines()["pulumi-resource-kubernetes"])
    assert provider.endswith("-X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version=4.25.0")


def test_a_pin_change_rebuilds_that_tool_only(tmp_path: Path) -> None:
    pins = tmp_path / "engines.yaml"
    pins.write_text(yaml.safe_dump(PINS))
    before = {name: e.directory(tmp_path) for name, e in engines.load_engines(pins).items()}
    changed = json.loads(json.dumps(PINS))
    changed["engines"]["kwok"]["version"] = "v0.7.0"
    pins.write_text(yaml.safe_dump(changed))
    after = {name: e.directory(tmp_path) for name, e in engines.load_engines(pins).items()}
    assert [name for name in before if before[name] != after[name]] == ["kwok"]
    assert after["kwok"].parent == tmp_path / "kwok" and after["kwok"].name.startswith("0.7.0-")


def test_a_missing_engine_names_the_build_command(tmp_path: Path) -> None:
    with pytest.raises(engines.EngineError, match=r"triarch local build"):
        engines.binary("kube-apiserver", cache=tmp_path)


def test_a_build_writes_the_wrapper_module_and_stamps_versions(tmp_path: Path) -> None:
    """The recipe as the go command receives it (the command itself is the real-engine tier's)."""
    calls: list[list[str]] = []
    module = tmp_path / "module"
    (module / "cmd" / "pulumi-resource-kubernetes").mkdir(parents=True)
    (module / "cmd" / "pulumi-resource-kubernetes" / "schema.json").write_text('{"name": "kubernetes"}')

    def fake_go(args: list[str], cwd: Path, env: dict[str, str]) -> str:
        calls.append(args)
        if args[:3] == ["go", "mod", "download"]:
            return json.dumps({"Dir": str(module)})
        if args[:2] == ["go", "build"]:
            Path(args[args.index("-o") + 1]).write_text("binary")
        return ""

    engine = engines.load_engines()["pulumi-resource-kubernetes"]
    bin_dir = engines.build(engine, tmp_path, run=fake_go, log=lambda _: None)
    edit = next(c for c in calls if c[:3] == ["go", "mod", "edit"])
    assert f"-require={engine.module}@{engine.version}" in edit
    assert ("-replace=github.com/pulumi/pulumi-kubernetes/sdk/v4=github.com/pulumi/pulumi-kubernetes/sdk/v4@v4.25.0"
            in edit)
    build = next(c for c in calls if c[:2] == ["go", "build"])
    assert build[-1] == "."  # our main package, with the module's schema beside it
    wrapper = bin_dir.parent / "wrapper"
    assert json.loads((wrapper / "schema.json").read_text()) == {"name": "kubernetes", "version": "4.25.0"}
    assert (wrapper / "main.go").is_file()
    assert engines.installed(engine, tmp_path) == bin_dir


def test_the_go_version_file_is_the_one_setup_go_reads() -> None:
    """One file says which Go builds the engines: this build checks it, CI's actions/setup-go installs it
    (go-version-file; tests/test_workflows.py holds the workflow to it)."""
    assert engines.GO_VERSION_FILE == ROOT / "tools" / "engines" / ".go-version"
    assert re.fullmatch(r"\d+\.\d+\.\d+", engines.pinned_go())


@pytest.mark.parametrize("output", ["go version go1.26.8 linux/amd64", "go version go1.26.0 darwin/arm64",
                                    "go version go1.26 linux/amd64", "go version go1.26.12 linux/amd64"])
def test_a_go_of_the_pinned_minor_builds(output: str) -> None:
    engines.check_go_version(output, "1.26.8")


@pytest.mark.parametrize(("output", "said"), [
    ("go version go1.25.7 linux/amd64", "go 1.25.7 is on the PATH but tools/engines/.go-version pins 1.26.8; "
                                        "install Go 1.26.x (the engines are built and cached with that one)"),
    ("go version go1.27rc1 linux/amd64", "go 1.27rc1 is on the PATH but tools/engines/.go-version pins 1.26.8; "),
    ("go version go2.26.8 linux/amd64", "go 2.26.8 is on the PATH"),
    ("go version go1.2.6 linux/amd64", "go 1.2.6 is on the PATH"),
    ("bash: go: command not found", "cannot read a Go version from `go version`: 'bash: go: command not found'"),
])
def test_a_go_of_another_minor_is_refused_in_one_line(output: str, said: str) -> None:
    with pytest.raises(engines.EngineError) as error:
        engines.check_go_version(output, "1.26.8")
    assert str(error.value).startswith(said) and "\n" not in str(error.value)


def test_an_engines_cache_key_changes_with_what_builds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another Go pinned to build it, another build recipe, another pin: another cache directory, so an engine built
    otherwise is never taken for this one (issue 48)."""
    etcd = engines.load_engines()["etcd"]
    first = etcd.digest()
    monkeypatch.setattr(engines, "pinned_go", lambda path=engines.GO_VERSION_FILE: "1.27.0")
    assert etcd.digest() != first
    monkeypatch.undo()
    monkeypatch.setattr(engines, "recipe_digest", lambda: "another recipe")
    assert etcd.digest() != first
    monkeypatch.undo()
    assert etcd.digest() == first
    bumped = dataclasses.replace(etcd, entry=etcd.entry.replace(etcd.version, etcd.version + "-1"))
    assert bumped.digest() != first


def test_the_recipe_in_the_key_is_every_function_the_build_calls() -> None:
    """BUILD_RECIPE holds each function of the engines module that `build` calls (directly or through one it calls):
    a step added to the build without joining the key would reuse engines built without it."""
    import ast
    import inspect

    module = {name for name, value in vars(engines).items() if inspect.isfunction(value)
              and value.__module__ == engines.__name__}
    seen: set[str] = set()
    todo = ["build"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        tree = ast.parse(inspect.getsource(getattr(engines, name)).lstrip())
        todo += [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                 and n.func.id in module and n.func.id not in {"cache_root", "pinned_go", "recipe_digest"}]
    assert seen == {f.__name__ for f in engines.BUILD_RECIPE}


def test_the_build_checks_go_before_building_and_a_cached_engine_needs_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/go")
    asked: list[str] = []

    def old_go() -> str:
        asked.append("go version")
        return "go version go1.24.2 linux/amd64"

    with pytest.raises(engines.EngineError, match=r"^go 1\.24\.2 is on the PATH but tools/engines/\.go-version"):
        engines.build_all(["etcd"], cache=tmp_path, log=lambda _: None, go_version=old_go)
    assert not any(tmp_path.iterdir())  # refused before anything was written
    etcd = engines.load_engines()["etcd"]
    etcd.directory(tmp_path).joinpath("bin").mkdir(parents=True)
    etcd.directory(tmp_path).joinpath(engines.DONE).write_text("{}")
    asked.clear()
    assert engines.build_all(["etcd"], cache=tmp_path, log=lambda _: None, go_version=old_go) == {
        "etcd": etcd.directory(tmp_path) / "bin"}
    assert asked == []


# --- the plane a stack asks for -------------------------------------------------------------------------------


def test_the_lab_stacks_nodes_are_labelled_tainted_and_spread_as_real_ones(mutated_config: MutatedConfig) -> None:
    stack, _ = _lab(mutated_config)
    nodes = {n["metadata"]["name"]: n for n in plane_nodes(stack, catalog())}
    declared = stack_document("lab")["triarch:nodeGroups"]
    for group in declared:
        zones = set()
        for name in group["nodes"]:
            node = nodes[name]
            labels = node["metadata"]["labels"]
            assert labels["triarch.dev/pool"] == group["name"]
            assert labels["triarch.dev/gpu"] == group["gpu"]
            assert labels["nvidia.com/gpu.present"] == "true"
            assert labels[GFD_DRIVER] == group["driverVersion"]
            assert node["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
            assert node["status"]["allocatable"]["nvidia.com/gpu"] == str(group["gpusPerNode"])
            assert node["metadata"]["annotations"][KWOK_ANNOTATION] == "fake"
            zones.add(labels[ZONE_LABEL])
        assert zones == set(group["zones"])  # the zones the pool says its nodes are in, every one used
    assert nodes["lab-l4-0"]["metadata"]["labels"][GFD_PRODUCT] == "NVIDIA-L4"
    assert nodes["lab-a10g-0"]["metadata"]["labels"][GFD_PRODUCT] == "NVIDIA-A10G"
    cpu_only = [n for n in nodes.values() if "nvidia.com/gpu" not in n["status"]["allocatable"]]
    assert len(cpu_only) >= 1 and all("taints" not in n["spec"] for n in cpu_only)


def test_an_adopted_pool_with_known_zones_spreads_its_replicas_hard(mutated_config: MutatedConfig) -> None:
    _, objects = _lab(mutated_config)
    [deployment] = [o for o in objects.vllm["chat"] if o["kind"] == "Deployment"]
    [zone_spread] = [c for c in deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
                     if c["topologyKey"] == ZONE_LABEL]
    assert zone_spread["whenUnsatisfiable"] == "DoNotSchedule"
    assert zone_spread["minDomains"] == 2  # two replicas, three zones, four nodes
    _, unknown = _lab(mutated_config, lambda c: c["triarch:nodeGroups"][0].pop("zones"))
    [deployment] = [o for o in unknown.vllm["chat"] if o["kind"] == "Deployment"]
    [zone_spread] = [c for c in deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
                     if c["topologyKey"] == ZONE_LABEL]
    assert zone_spread["whenUnsatisfiable"] == "ScheduleAnyway"


def test_an_adopted_pool_lists_each_zone_once(mutated_config: MutatedConfig) -> None:
    with pytest.raises(ConfigError, match=r"^triarch:nodeGroups\[0\]\.zones: \['lab-a', 'lab-a'\] lists a zone "
                                          r"twice"):
        _lab(mutated_config, lambda c: c["triarch:nodeGroups"][0].update(zones=["lab-a", "lab-a"]))


def test_a_time_sliced_pool_advertises_its_slices(mutated_config: MutatedConfig) -> None:
    stack, _ = _lab(mutated_config, lambda c: c["triarch:nodeGroups"][1].update(timeSlicing={"replicas": 4}))
    nodes = {n["metadata"]["name"]: n for n in plane_nodes(stack, catalog())}
    assert nodes["lab-a10g-0"]["status"]["allocatable"]["nvidia.com/gpu"] == "4"


def test_a_created_stacks_pools_come_at_their_max_in_their_zones(mutated_config: MutatedConfig) -> None:
    stack = from_pulumi_config(mutated_config("prod", lambda c: None))
    nodes = plane_nodes(stack, catalog())
    for group in stack_document("prod")["triarch:nodeGroups"]:
        members = [n for n in nodes if n["metadata"]["labels"].get("triarch.dev/pool") == group["name"]]
        assert len(members) == group["max"]
        zones = group.get("zones") or stack_document("prod")["triarch:cluster"]["zones"]
        assert {n["metadata"]["labels"][ZONE_LABEL] for n in members} <= set(zones)


def test_from_zero_the_karpenter_pools_start_empty_and_karpenter_runs(mutated_config: MutatedConfig) -> None:
    from triarch.local.stack import instance_types, spec_for_stack

    stack = from_pulumi_config(mutated_config("prod", lambda c: None))
    every = plane_nodes(stack, catalog())
    empty = plane_nodes(stack, catalog(), from_zero=True)
    assert {n["metadata"]["labels"].get("triarch.dev/pool") for n in every} == {"system", "l4", "a100"}
    assert {n["metadata"]["labels"].get("triarch.dev/pool") for n in empty} == {"system"}
    offered = {t["name"]: t for t in instance_types(stack, catalog())}
    g6 = offered["g6.2xlarge"]
    assert g6["resources"]["nvidia.com/gpu"] == "1" and g6["resources"]["cpu"] == "8"
    zones = {r["values"][0] for o in g6["offerings"] for r in o["Requirements"]
             if r["key"] == "topology.kubernetes.io/zone"}
    assert zones == set(stack_document("prod")["triarch:cluster"]["zones"])
    assert all(o["Price"] == 0.9776 for o in g6["offerings"])  # prices.yaml, us-east-1 (not this code's number)
    with pytest.raises(engines.EngineError, match=r"^--from-zero needs a stack whose cluster Triarch creates"):
        spec_for_stack("x", from_pulumi_config(mutated_config("lab", lambda c: None)), [], from_zero=True)
    reference_dir("karpenter-v1.14.1", "crds")  # the CRDs come from the reference cache
    spec = spec_for_stack("x", stack, [], from_zero=True)
    assert spec.operators == ("karpenter",) and spec.instance_types
    assert "triarch-efs" in spec.storage_classes  # the stack's claims bind on the plane's kwok volumes
    pools = {o["metadata"]["name"]: o for o in spec.objects if o["kind"] == "NodePool"}
    classes = {o["metadata"]["name"] for o in spec.objects if o["kind"] == "KWOKNodeClass"}
    assert set(pools) == classes == {g["name"] for g in stack_document("prod")["triarch:nodeGroups"]}
    for name, pool in pools.items():
        assert pool["spec"]["template"]["spec"]["nodeClassRef"] == {
            "group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": name}
        assert pool["spec"]["template"]["metadata"]["labels"]["triarch.dev/pool"] == name  # the plan's pool


def test_only_the_crds_of_existing_components_are_installed(mutated_config: MutatedConfig) -> None:
    stack, _ = _lab(mutated_config)
    assert existing_crd_sets(stack) == ["kuberay", "prometheus"]
    stack, _ = _lab(mutated_config, lambda c: c.update({"triarch:kuberay": {"mode": "install"},
                                                        "triarch:observability": {"prometheus": "none"}}))
    assert existing_crd_sets(stack) == []
    stack, _ = _lab(mutated_config, lambda c: c["triarch:observability"].update(keda="existing"))
    assert existing_crd_sets(stack) == ["kuberay", "prometheus", "keda"]


def test_a_stack_that_says_kuberay_or_keda_runs_gets_a_plane_that_runs_it(mutated_config: MutatedConfig) -> None:
    from triarch.local.stack import spec_for_stack

    for folder in ("kuberay-v1.7.0", "prometheus-operator-v0.93.1/crds", "keda-2.20.2/crds"):
        reference_dir(folder)  # the CRDs come from the reference cache
    stack, _ = _lab(mutated_config)
    assert spec_for_stack("x", stack, []).operators == ("kuberay",)  # KubeRay existing, a ray-serve model
    stack, _ = _lab(mutated_config, lambda c: c["triarch:models"].pop())
    assert spec_for_stack("x", stack, []).operators == ()  # no ray-serve model: no KubeRay to run
    stack, _ = _lab(mutated_config, lambda c: c["triarch:observability"].update(keda="existing"))
    spec = spec_for_stack("x", stack, [])
    assert spec.operators == ("kuberay", "keda")
    assert "crd-scaledobjects.yaml" in {p.name for p in spec.crds}


def test_crds_come_from_the_reference_cache_unless_a_directory_is_given(tmp_path: Path) -> None:
    kuberay, karpenter = reference_dir("kuberay-v1.7.0"), reference_dir("karpenter-v1.14.1", "crds")
    files = crd_files(["kuberay", "karpenter"], [])
    assert [f.name for f in files] == ["ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml", "ray.io_rayservices.yaml",
                                       "ray.io_raycronjobs.yaml", "karpenter.sh_nodepools.yaml",
                                       "karpenter.sh_nodeclaims.yaml", "karpenter.k8s.aws_ec2nodeclasses.yaml",
                                       "autoscaling.x-k8s.io_capacitybuffers.yaml"]
    assert all(f.is_relative_to(refdata.cache_root()) for f in files)
    given = tmp_path / "mirror" / "kuberay-v1.7.0"  # --crds DIR, laid out like the reference data, comes first
    given.mkdir(parents=True)
    for crd in kuberay.glob("ray.io_*.yaml"):
        (given / crd.name).write_bytes(crd.read_bytes())
    files = crd_files(["kuberay", "karpenter"], [tmp_path / "mirror"])
    assert all(f.is_relative_to(given) for f in files[:4]) and all(f.is_relative_to(karpenter) for f in files[4:])


def test_a_crds_directory_that_does_not_exist_is_named(tmp_path: Path) -> None:
    with pytest.raises(engines.EngineError) as info:
        crd_files(["kuberay"], [tmp_path / "nowhere"])
    assert str(info.value) == f"--crds {tmp_path / 'nowhere'}: no such directory"


def test_local_up_names_a_crds_directory_that_does_not_exist(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from triarch.cli import main

    assert main(["local", "up", "--stack", "lab", "--crds", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err == f"error: --crds {tmp_path / 'nowhere'}: no such directory\n"


def test_local_up_names_a_charts_directory_that_does_not_exist(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from triarch.cli import main

    assert main(["local", "up", "--stack", "fresh", "--charts", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err == f"error: --charts {tmp_path / 'nowhere'}: no such directory\n"


def test_the_fresh_stacks_mirror_serves_every_archive_and_the_crd_files_it_takes_apart(
        mutated_config: MutatedConfig) -> None:
    """The plane's mirror for a stack pulling from it: the archives given, and under /files/ each CRD file of
    KubeRay's and LWS's charts at <chart>/<version>/<file>, as the charts package them in crds/, and the
    InferencePool's, which the endpoint picker's chart does not package (from the reference data, its sha256 pinned);
    another stack's plane serves nothing."""
    from conftest import reference_dir
    from triarch.config import from_pulumi_config
    from triarch.local.stack import chart_mirror

    charts = reference_dir("charts")
    archives, files = chart_mirror(from_pulumi_config(mutated_config("fresh", lambda c: None)), [charts])
    assert {a.name for a in archives} >= {"lws-v0.10.0.tgz", "kuberay-operator-1.7.0.tgz", "keda-2.20.2.tgz"}
    assert sorted(files) == sorted(
        [f"crds/kuberay-operator/1.7.0/ray.io_{kind}.yaml" for kind in
         ("rayclusters", "raycronjobs", "rayjobs", "rayservices")]
        + [f"crds/lws/v0.10.0/{name}.yaml" for name in
           ("disaggregatedset.x-k8s.io_disaggregatedsetrolescalers", "disaggregatedset.x-k8s.io_disaggregatedsets",
            "leaderworkerset.x-k8s.io_leaderworkersets")]
        + ["crds/llm-d-router-standalone/v0.10.0/inference.networking.k8s.io_inferencepools.yaml"])
    pool_crd = files["crds/llm-d-router-standalone/v0.10.0/inference.networking.k8s.io_inferencepools.yaml"]
    assert hashlib.sha256(pool_crd).hexdigest() == \
        "55e0dbf39c50c4bbdd60106493a4573df4bb44479f9ce46762f1af718883e5cd"
    lws_crd = files["crds/lws/v0.10.0/leaderworkerset.x-k8s.io_leaderworkersets.yaml"]
    assert b"kind: CustomResourceDefinition" in lws_crd
    assert chart_mirror(from_pulumi_config(mutated_config("lab", lambda c: None)), [charts]) == ((), {})


def test_a_crd_set_found_nowhere_says_how_to_supply_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("triarch.local.crds._from_module", lambda crds: None)
    monkeypatch.setenv("TRIARCH_REFERENCE_CACHE", str(tmp_path / "empty"))
    with pytest.raises(engines.EngineError) as info:
        crd_files(["kuberay"], [tmp_path])
    message = str(info.value)
    assert message.startswith("the kuberay CRDs (chart kuberay-operator) are needed by this stack")
    assert "\n" not in message
    assert message.endswith(f"({tmp_path / 'empty'}) has no verified kuberay-v1.7.0/; bring it with "
                            "`uv run triarch refdata fill` (from upstream; or "
                            "`uv run triarch refdata fill --from ../shared/reference` where it is beside the clone)")


def test_kwok_provisions_claims_of_the_stacks_storage_classes(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    stages = tmp_path / "bin" / "kwok-stages"
    stages.mkdir(parents=True)
    (stages / "pvc-provision.yaml").write_text("expression: self.spec.storageClassName == 'kwok-volume'\n")
    (stages / "pod-ready.yaml").write_text("kind: Stage\n")
    monkeypatch.setattr("triarch.local.components.binary", lambda name: tmp_path / "bin" / name)
    text = kwok_stages(["kwok-volume", "efs"])
    assert "self.spec.storageClassName in ['kwok-volume', 'efs']" in text
    assert text.count("---") == 1
    assert storage_class("kwok-volume")["metadata"]["annotations"] == {
        "storageclass.kubernetes.io/is-default-class": "true"}
    assert storage_class("efs")["metadata"]["annotations"] == {}


# --- components the cluster already runs ----------------------------------------------------------------------


def test_existing_kuberay_installs_no_operator_but_keeps_the_rayservice(mutated_config: MutatedConfig) -> None:
    _, objects = _lab(mutated_config)
    assert objects.kuberay == []
    assert [o["kind"] for o in objects.ray].count("RayService") == 1
    _, installed = _lab(mutated_config, lambda c: c.update({"triarch:kuberay": {"mode": "install"}}))
    assert [o["metadata"]["name"] for o in installed.kuberay] == ["kuberay-system"]


def test_existing_device_plugin_installs_nothing(mutated_config: MutatedConfig) -> None:
    _, objects = _lab(mutated_config)
    assert objects.device_plugin == []
    _, installed = _lab(mutated_config, lambda c: c.update({"triarch:devicePlugin": {"mode": "install"}}))
    assert [o["metadata"]["name"] for o in installed.device_plugin] == ["nvidia-device-plugin"]


@pytest.mark.parametrize("key", ["triarch:devicePlugin", "triarch:kuberay"])
def test_a_created_cluster_runs_nothing_already(mutated_config: MutatedConfig, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{key}\.mode: 'existing' says the cluster already runs the component, "
                                          r"but Triarch creates this cluster"):
        from_pulumi_config(mutated_config("prod", lambda c: c.update({key: {"mode": "existing"}})))


def test_the_old_enabled_key_names_the_new_one(mutated_config: MutatedConfig) -> None:
    with pytest.raises(ConfigError, match=r"^triarch:devicePlugin\.enabled: is not read by Triarch: the key is "
                                          r"'mode'"):
        _lab(mutated_config, lambda c: c.update({"triarch:devicePlugin": {"enabled": False}}))


def test_the_crds_existing_components_must_bring(mutated_config: MutatedConfig) -> None:
    stack, objects = _lab(mutated_config)
    assert required_crds(stack, objects) == {
        "podmonitors.monitoring.coreos.com": "triarch:observability.prometheus: existing",
        "prometheusrules.monitoring.coreos.com": "triarch:observability.prometheus: existing",
        "rayservices.ray.io": "triarch:kuberay.mode: existing"}
    note = trusted_note(stack, objects)
    assert note is not None and "rayservices.ray.io (triarch:kuberay.mode: existing)" in note
    assert "pulumi preview" in note
    stack, objects = _lab(mutated_config, lambda c: c.update({"triarch:kuberay": {"mode": "install"},
                                                              "triarch:observability": {"prometheus": "none"}}))
    assert required_crds(stack, objects) == {} and trusted_note(stack, objects) is None


def _crds(*names: str) -> subprocess.CompletedProcess[str]:
    items = [{"metadata": {"name": n}} for n in names]
    return subprocess.CompletedProcess([], 0, json.dumps({"items": items}), "")


def test_preview_stops_on_a_missing_crd_of_an_existing_component(mutated_config: MutatedConfig) -> None:
    stack, objects = _lab(mutated_config)
    asked: list[list[str]] = []

    def kubectl(args: list[str]) -> subprocess.CompletedProcess[str]:
        asked.append(args)
        return _crds("rayclusters.ray.io", "podmonitors.monitoring.coreos.com",
                     "prometheusrules.monitoring.coreos.com")

    with pytest.raises(ConfigError) as error:
        check_cluster(stack, objects, kubectl)
    assert str(error.value).startswith("triarch:kuberay.mode: 'existing' says the cluster runs the component, but "
                                       "context 'triarch-lab' has no CRD rayservices.ray.io")
    assert "\n" not in str(error.value)
    assert asked[0][asked[0].index("--context") + 1] == "triarch-lab"
    check_cluster(stack, objects, lambda args: _crds(  # all present: nothing raised
        "rayservices.ray.io", "podmonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com"))


def test_an_unreachable_cluster_is_one_line_too(mutated_config: MutatedConfig) -> None:
    stack, objects = _lab(mutated_config)
    failed = subprocess.CompletedProcess([], 1, "", "E1201 x\nUnable to connect to the server: refused\n")
    with pytest.raises(ConfigError, match=r"^triarch:cluster\.context: 'triarch-lab' could not be asked for its "
                                          r"CRDs \(Unable to connect to the server: refused\)"):
        check_cluster(stack, objects, lambda args: failed)


# --- the harness's bad input: one line, nothing left running --------------------------------------------------


def test_commands_on_a_plane_that_is_not_up_say_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from triarch.cli import main

    monkeypatch.setenv("TRIARCH_LOCAL_HOME", str(tmp_path))
    assert main(["local", "exec", "--name", "nope", "--", "kubectl", "get", "nodes"]) == 1
    assert capsys.readouterr().err == ("error: local plane 'nope' is not up; start it with `triarch local up`\n")
    assert main(["local", "exec", "--", "true"]) == 1
    assert "no local plane is up; start one with `triarch local up --stack lab`" in capsys.readouterr().err


def test_an_unknown_engine_is_named(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from triarch.cli import main

    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/go")
    assert main(["local", "build", "etcd", "kubelet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown engine kubelet; allowed: etcd, kubernetes, kwok, pulumi, ")
    assert err.rstrip().endswith(", vllm-0.32, ray-2.60")  # the data plane's environments are named too
    assert err.count("\n") == 1


def test_go_only_builds_the_go_engines_and_no_environment(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """CI's engine cache holds the Go engines only: `--go-only` builds them all and syncs no data plane environment;
    with names too it is refused as bad input."""
    from triarch.cli import main

    built: dict[str, object] = {}
    monkeypatch.setattr("triarch.local.engines.build_all", lambda names, force: built.setdefault("go", names))
    monkeypatch.setattr("triarch.local.dataplane.build_all", lambda names, force: built.setdefault("python", names))
    assert main(["local", "build", "--go-only"]) == 0
    assert built == {"go": None}
    assert main(["local", "build", "--go-only", "etcd"]) == 2
    assert capsys.readouterr().err == ("error: --go-only builds every Go engine; name engines or give --go-only, "
                                       "not both\n")
    built.clear()
    assert main(["local", "build"]) == 0
    assert built == {"go": None, "python": None}


def test_a_missing_toolchain_says_how_to_get_it(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from triarch.cli import main

    monkeypatch.setattr("shutil.which", lambda name: None)
    assert main(["local", "build"]) == 1
    assert capsys.readouterr().err == ("error: go is not on the PATH; install Go >= 1.26 (the engines build from the "
                                       "Go module proxy)\n")


def test_a_plane_without_its_engines_names_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from triarch.cli import main

    monkeypatch.setenv("TRIARCH_ENGINES_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("TRIARCH_LOCAL_HOME", str(tmp_path / "planes"))
    monkeypatch.setattr("os.geteuid", lambda: 0)
    monkeypatch.setattr("triarch.local.lifecycle.shutil.which", lambda name: "/usr/sbin/ip")
    for folder in ("kuberay-v1.7.0", "prometheus-operator-v0.93.1/crds"):
        reference_dir(folder)  # the lab stack's existing components' CRDs, from the reference cache
    code = main(["local", "up", "--stack", "lab"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("error: engine etcd 3.6.16 is not built (needed for etcd); build it with "
                          "`uv run triarch local build`")
    assert not (tmp_path / "planes").exists()  # nothing was started or written


def test_a_failed_build_names_the_command_and_what_go_said(tmp_path: Path) -> None:
    def failing(args: list[str], cwd: Path, env: dict[str, str]) -> str:
        if args[:2] == ["go", "build"]:
            raise engines.EngineError(f"`go build -trimpath ...` failed in {cwd}: cannot find module providing x")
        return json.dumps({"Dir": str(tmp_path)})

    with pytest.raises(engines.EngineError, match=r"^`go build -trimpath \.\.\.` failed in .*: cannot find module"):
        engines.build(engines.load_engines()["etcd"], tmp_path, run=failing, log=lambda _: None)
    assert engines.installed(engines.load_engines()["etcd"], tmp_path) is None  # no half build is taken as built



@pytest.mark.parametrize(("log", "cause"), [
    ("I1201 starting\nError: unknown flag: --x\nUsage:\n  kube-apiserver [flags]\n", "Error: unknown flag: --x"),
    ("flag provided but not defined: -x\nUsage of kuberay:\n  -metrics-addr string\n",
     "flag provided but not defined: -x"),
    ('{"level":"INFO","msg":"a"}\n{"level":"ERROR","msg":"no nodepool"}\n{"level":"INFO","msg":"b"}\n',
     '{"level":"ERROR","msg":"no nodepool"}'),
    ("Development Mode defaults(stacktraceLevel=Error)\nlast words\n", "last words"),
])
def test_a_failed_engine_is_told_by_its_own_error_line(tmp_path: Path, log: str, cause: str) -> None:
    from triarch.local.processes import failure_cause

    path = tmp_path / "component.log"
    path.write_text(log)
    assert failure_cause(path) == cause


def test_a_stack_that_installs_the_charts_runs_the_real_operators_in_place_of_their_pods() -> None:
    """The fresh stack installs KubeRay, KEDA and LeaderWorkerSet from the plane's mirror: each chart's controller
    pod has the real operator in its place, and nothing runs as `existing`."""
    from triarch.local.stack import spec_for_stack
    from triarch.report.validation import validate_stack_file

    reference_dir("charts")  # the mirror's archives come from the reference cache
    stack = validate_stack_file("fresh", ROOT / "stacks" / "Pulumi.fresh.yaml").stack
    assert spec_for_stack("x", stack, []).operators == ("kuberay-chart", "keda-chart", "lws-chart")


def test_a_container_that_exits_is_started_again_until_its_kubelet_is_stopped(tmp_path: Path) -> None:
    """`restart-always`: an operator that exits once it wrote its own certificate runs again, as its pod's
    container would; stopping the stand-in kubelet stops the container too."""
    import signal
    import sys
    import time

    runs = tmp_path / "runs"
    script = f"echo run >> {runs}; exec sleep 0.2"
    kubelet = subprocess.Popen([sys.executable, "-m", "triarch.local.kubelet", "restart-always", "--",
                                "sh", "-c", script], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not runs.exists() or len(runs.read_text().split()) < 3):
        time.sleep(0.1)
    assert len(runs.read_text().split()) >= 3
    kubelet.send_signal(signal.SIGTERM)
    assert kubelet.wait(timeout=10) == 0
    seen = runs.read_text()
    time.sleep(1.5)  # longer than the restart pause: no run after the stop
    assert runs.read_text() == seen


def test_an_operator_started_as_a_pod_runs_as_the_chart_rendered_the_pod(tmp_path: Path) -> None:
    """`start-when --as-pod deployment/NAME`: the command starts once the object exists and a pod the Deployment's
    selector picks has an address (a pod being deleted, one without an address, and a pod the selector does not
    pick are passed over), which replaces `{pod_ip}` in the command. With `--container`, the container's arguments
    and environment are the command's: a listener on every address at the pod's, a mount path at its volume's
    directory here (a ConfigMap's written out, with the edits asked for), the pod's namespace where a variable
    reads it; a variable the kubelet cannot fill is left out, said; a feature gate the binary does not know (a
    stand-in release older than the chart) dropped, said. With `--service-account-kubeconfig`, a
    kubeconfig for the same cluster holding a token issued for the pod's ServiceAccount, readable by its owner
    alone, and named by KUBECONFIG."""
    import sys

    kubectl = tmp_path / "kubectl"
    container = {
        "name": "adapter",
        "args": ["--secure-port=6443", "--metrics-bind-address=:8080", "--cert-dir=/certs",
                 "--tls-cert-file=/certs/tls.crt", "--config=/controller_config.yaml", "--name=/certsandmore",
                 "--feature-gates=Known=true,Newer=false"],
        "env": [{"name": "WATCH_NAMESPACE"},  # `value: ""` as the API server stores it
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        "volumeMounts": [{"name": "certificates", "mountPath": "/certs"},
                         {"name": "config", "mountPath": "/controller_config.yaml", "subPath": "config.yaml"}]}
    volumes = [{"name": "certificates", "secret": {"secretName": "certs"}},
               {"name": "config", "configMap": {"name": "adapter-config"}}]
    deployment = {"spec": {"selector": {"matchLabels": {"app": "adapter", "tier": "api"}},
                           "template": {"spec": {"serviceAccountName": "keda-metrics-server",
                                                 "containers": [{"name": "other"}, container], "volumes": volumes}}}}
    config_map = {"data": {"config.yaml": "webhook:\n  port: 9443\nhealth: {}\n"}}
    cluster = {"name": "plane", "cluster": {"server": "https://127.0.0.1:16443", "certificate-authority-data": "Q0E="}}
    pods = {"items": [
        {"metadata": {"deletionTimestamp": "2026-12-07T00:00:00Z"}, "status": {"podIP": "198.18.128.7"}},
        {"metadata": {}, "status": {}},
        {"metadata": {"name": "adapter-7d9f-x2", "namespace": "keda"}, "spec": {"nodeName": "cpu-0"},
         "status": {"podIP": "198.18.128.9"}}]}
    calls = tmp_path / "calls"
    kubectl.write_text(f"""#!/bin/sh
echo "$@" >> {calls}
case "$1 $2" in
  "wait --for=create") exit 0 ;;
  "get deployment/adapter") printf '%s\\n' '{json.dumps(deployment)}' ;;
  "get pods") case "$*" in
    *"-l app=adapter,tier=api"*) printf '%s\\n' '{json.dumps(pods)}' ;;
    *) echo '{{"items": []}}' ;;
  esac ;;
  "get configmap") [ "$3 $4 $5" = "adapter-config -n keda" ] && printf '%s\\n' '{json.dumps(config_map)}' ;;
  "create token") [ "$3 $4 $5" = "keda-metrics-server -n keda" ] && echo issued-token ;;
  "config view") printf '%s\\n' '{json.dumps({"clusters": [cluster]})}' ;;
esac
""")
    kubectl.chmod(0o755)
    certs, config_maps = tmp_path / "certs", tmp_path / "volumes"
    written = tmp_path / "adapter.kubeconfig"
    show = ('for a in "$@"; do echo "arg $a"; done; '
            'echo "env KUBECONFIG=$KUBECONFIG NS=$POD_NAMESPACE POD=$POD_NAME W=[${WATCH_NAMESPACE-unset}]"')
    out = subprocess.run(
        [sys.executable, "-m", "triarch.local.kubelet", "start-when", "secret/certs", "-n", "keda", "--as-pod",
         "deployment/adapter", "--service-account-kubeconfig", str(written), "--container", "adapter",
         "--mount", f"certificates={certs}", "--volumes", str(config_maps), "--edit", "config:webhook.host={pod_ip}",
         "--known-gates", "Known,Other",
         "--", "sh", "-c", show, "sh", "{container_args}", "--bind-address={pod_ip}"],
        capture_output=True, text=True, env={**os.environ, "TRIARCH_KUBECTL": str(kubectl), "TOKEN": "unset"},
        timeout=60, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert [line.removeprefix("arg ") for line in lines if line.startswith("arg ")] == [
        "--secure-port=6443", "--metrics-bind-address=198.18.128.9:8080", f"--cert-dir={certs}",
        f"--tls-cert-file={certs}/tls.crt", f"--config={config_maps}/config/config.yaml", "--name=/certsandmore",
        "--feature-gates=Known=true", "--bind-address=198.18.128.9"]
    assert "dropped feature gates this release does not have: Newer=false" in lines
    assert f"env KUBECONFIG={written} NS=keda POD=adapter-7d9f-x2 W=[]" in lines
    assert any(line.startswith("left out TOKEN") for line in lines), lines
    assert yaml.safe_load((config_maps / "config" / "config.yaml").read_text()) == {
        "webhook": {"port": 9443, "host": "198.18.128.9"}, "health": {}}
    account = json.loads(written.read_text())
    assert account["clusters"] == [cluster]
    assert account["users"] == [{"name": "system:serviceaccount:keda:keda-metrics-server",
                                 "user": {"token": "issued-token"}}]
    [context] = account["contexts"]
    assert account["current-context"] == context["name"] and context["context"]["user"] == account["users"][0]["name"]
    assert written.stat().st_mode & 0o077 == 0
    asked = calls.read_text().splitlines()
    assert asked[0].startswith("wait --for=create secret/certs -n keda")


def test_a_watchs_documents_come_whole_whatever_the_chunks() -> None:
    """`mount-secret` reads kubectl's `--watch -o json`: indented documents one after another, cut anywhere by the
    pipe. Each comes out once, whole, as soon as its last chunk is in."""
    from triarch.local.kubelet import json_documents

    first = b'{\n    "data": {"tls.crt": "YQ=="},\n    "kind": "Secret"\n}\n'
    second = b'{\n    "data": {"tls.crt": "Yg==", "tls.key": "Yw=="},\n    "kind": "Secret"\n}\n'
    chunks = [first[:7], first[7:30], first[30:] + second[:3], second[3:]]
    seen: list[tuple[int, dict[str, object]]] = []
    arrived = 0

    def arriving() -> Iterator[bytes]:
        nonlocal arrived
        for chunk in chunks:
            arrived += 1
            yield chunk

    for document in json_documents(arriving()):
        seen.append((arrived, document))
    assert seen == [(3, {"data": {"tls.crt": "YQ=="}, "kind": "Secret"}),
                    (4, {"data": {"tls.crt": "Yg==", "tls.key": "Yw=="}, "kind": "Secret"})]
    assert list(json_documents([b"  \n"])) == []


# --- planes per user and host (issue 36) ------------------------------------------------------------------------

def as_user(monkeypatch: pytest.MonkeyPatch, user: str, host: str) -> None:
    monkeypatch.delenv("SUDO_USER", raising=False)
    monkeypatch.setattr("getpass.getuser", lambda: user)
    monkeypatch.setattr("socket.gethostname", lambda: host)


def plane_state(root: Path, name: str, owner: dict[str, str] | None) -> None:
    """A plane's state as `triarch local up` records it (the part the commands that name no plane read)."""
    (root / name).mkdir(parents=True)
    (root / name / "plane.json").write_text(json.dumps(
        {"name": name, **({"owner": owner} if owner else {}), "netns": {"mode": "root", "name": f"triarch-{name}"}}))


def test_a_planes_default_name_is_the_stacks_the_users_and_the_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    from triarch.local.plane import default_name

    as_user(monkeypatch, "Ana", "GPU_Box.example.org")
    assert default_name("lab") == "lab-ana-gpu-box"
    monkeypatch.setenv("SUDO_USER", "bo")  # `sudo triarch local up`: the plane is the user's who ran sudo
    assert default_name("fresh") == "fresh-bo-gpu-box"


def test_up_names_the_plane_per_user_and_host_unless_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from triarch.cli import main
    from triarch.local.plane import Plane, PlaneSpec

    for folder in ("kuberay-v1.7.0", "prometheus-operator-v0.93.1/crds"):
        reference_dir(folder)  # the lab stack's existing components' CRDs, from the reference cache
    as_user(monkeypatch, "ana", "gpubox")
    started: list[PlaneSpec] = []

    def up(spec: PlaneSpec) -> Plane:
        started.append(spec)
        return Plane(spec.name, tmp_path / spec.name)

    monkeypatch.setattr("triarch.local.lifecycle.up", up)
    assert main(["local", "up", "--stack", "lab"]) == 0
    assert main(["local", "up", "--stack", "lab", "--name", "mine"]) == 0
    assert [s.name for s in started] == ["lab-ana-gpubox", "mine"]
    assert started[0].context == "triarch-lab"  # the context the stack names, whatever the plane's name
    assert "triarch local down --name lab-ana-gpubox" in capsys.readouterr().out


def test_down_and_exec_without_a_name_take_the_users_one_plane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Another user's plane (a shared state root) and another host's (a home shared between hosts) are not the
    user's: `down` and `exec` as docs/real-engines.md writes them take the user's own; a plane recorded before owners
    were is taken as the user's."""
    from triarch.cli import main

    monkeypatch.setenv("TRIARCH_LOCAL_HOME", str(tmp_path))
    as_user(monkeypatch, "ana", "gpubox")
    plane_state(tmp_path, "lab-bo-gpubox", {"user": "bo", "host": "gpubox"})
    plane_state(tmp_path, "lab-ana-other", {"user": "ana", "host": "other"})
    assert main(["local", "down"]) == 1
    assert capsys.readouterr().err == ("error: no local plane of ana@gpubox is up (others' are: lab-ana-other, "
                                       "lab-bo-gpubox); start one with `triarch local up --stack lab`, or name one "
                                       "with --name\n")
    plane_state(tmp_path, "lab-ana-gpubox", {"user": "ana", "host": "gpubox"})
    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr("triarch.local.lifecycle.down", lambda name: calls.append(("down", name)))
    monkeypatch.setattr("triarch.local.lifecycle.exec_in", lambda name, argv: calls.append(("exec", name)) or 0)
    assert main(["local", "exec", "--", "kubectl", "get", "nodes"]) == 0
    assert main(["local", "down"]) == 0
    assert calls == [("exec", "lab-ana-gpubox"), ("down", "lab-ana-gpubox")]
    plane_state(tmp_path, "lab", None)  # up before planes recorded an owner: the user's too
    assert main(["local", "down"]) == 1
    assert capsys.readouterr().err == ("error: 2 local planes of ana@gpubox are up (lab, lab-ana-gpubox); name one "
                                       "with --name\n")


def test_commands_on_a_plane_keep_their_temporary_files_in_the_planes_directory(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The Kubernetes provider writes a kubeconfig file into TMPDIR at each Helm release and leaves it: in the plane's
    directory, it goes with the plane instead of piling up in /tmp."""
    from triarch.local.plane import Plane

    monkeypatch.setenv("TMPDIR", "/tmp")
    env = Plane("p", tmp_path / "p").env()
    assert Path(env["TMPDIR"]) == tmp_path / "p" / "tmp" and Path(env["TMPDIR"]).is_dir()
