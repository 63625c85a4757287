"""Every Kubernetes object a stack creates, validated strictly (no unknown fields) against the schemas of the
stack's Kubernetes version; and every device plugin Helm value Triarch sets, checked against the chart's
upstream values.yaml (0.20.0), from the reference data (tools/reference/sources.yaml).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from conftest import reference_file, unknown_paths
from triarch.offline import PlanRun, manifests, read_stack_config, run_program

ROOT = Path(__file__).resolve().parents[1]
STACKS = ("local", "dev", "prod")
CHART_REFERENCE = "nvidia-device-plugin-v0.20.0"
RELEASE = "kubernetes:helm.sh/v3:Release"


def stack_config(name: str) -> dict[str, Any]:
    document = yaml.safe_load((ROOT / "stacks" / f"Pulumi.{name}.yaml").read_text(encoding="utf-8"))
    config: dict[str, Any] = document["config"]
    return config


def kubernetes_version(name: str) -> str:
    version = stack_config(name)["triarch:cluster"]["kubernetesVersion"]
    assert isinstance(version, str)
    return version


def sliced(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of a stack with time-slicing on its first node group: the values then carry config.map."""
    config = copy.deepcopy(config)
    config["triarch:nodeGroups"][0]["timeSlicing"] = {"replicas": 2}
    return config


def _plan(name: str, config: dict[str, Any], tmp: Path) -> PlanRun:
    path = tmp / f"Pulumi.{name}.yaml"
    path.write_text(yaml.safe_dump({"config": config}, sort_keys=False), encoding="utf-8")
    values, secrets = read_stack_config(path)
    return run_program(name, values, secrets)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PlanRun]:
    """Each shipped stack, plus time-sliced variants of dev and local, planned once for this module."""
    tmp = tmp_path_factory.mktemp("stacks")
    result = {name: _plan(name, stack_config(name), tmp) for name in STACKS}
    for name in ("dev", "local"):
        result[f"{name}-sliced"] = _plan(name, sliced(stack_config(name)), tmp)
    return result


# --- built-in Kubernetes objects ------------------------------------------------------------------------

def test_kubernetes_validate_has_schemas_for_every_stack_version() -> None:
    for name in STACKS:
        version = kubernetes_version(name)
        assert kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "probe"}}, version, strict=True
        ) == version, f"no exact {version} schemas for stack {name}"


@pytest.mark.parametrize("name", STACKS)
def test_every_manifest_is_valid_for_the_stack_kubernetes_version(runs: dict[str, PlanRun],
                                                                  name: str) -> None:
    version = kubernetes_version(name)
    # Built-in kinds here; custom resources (RayService) are validated against their CRDs in test_ray_crds.
    objects = [o for o in manifests(runs[name]) if "." not in o["apiVersion"].split("/")[0]
               or o["apiVersion"].split("/")[0].endswith(".k8s.io")]
    assert objects, f"stack {name} produced no Kubernetes objects"
    failures = []
    for obj in objects:
        try:
            used = kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            failures.append(f"{obj['kind']}/{obj['metadata'].get('name')}: {error.message} at "
                            f"{'.'.join(str(p) for p in error.absolute_path)}")
        except kubernetes_validate.SchemaNotFoundError as error:
            failures.append(f"{obj['kind']}: {error.message}")
        else:
            assert used == version
    assert failures == []


@pytest.mark.parametrize("name", ("local", "local-sliced"))
def test_node_patches_are_valid_partial_nodes(runs: dict[str, PlanRun], name: str) -> None:
    """Patches are not written as manifests, but what they apply must still be a valid (partial) Node."""
    version = kubernetes_version("local")
    patches = [r for r in runs[name].resources if r.type == "kubernetes:core/v1:NodePatch"]
    assert patches
    for patch in patches:
        body = {"apiVersion": "v1", "kind": "Node", **{k: v for k, v in patch.inputs.items()
                                                        if k not in ("apiVersion", "kind")}}
        kubernetes_validate.validate(body, version, strict=True)


def test_an_unknown_field_fails_strict_validation(runs: dict[str, PlanRun]) -> None:
    version = kubernetes_version("dev")
    original = manifests(runs["dev"])[0]
    kubernetes_validate.validate(original, version, strict=True)

    in_metadata = copy.deepcopy(original)
    in_metadata["metadata"]["labelz"] = {"typo": "yes"}
    with pytest.raises(kubernetes_validate.ValidationError, match="labelz"):
        kubernetes_validate.validate(in_metadata, version, strict=True)

    at_top = copy.deepcopy(original)
    at_top["spek"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="spek"):
        kubernetes_validate.validate(at_top, version, strict=True)

    assert "labelz" not in original["metadata"]  # the copies were corrupted, not the plan


# --- device plugin Helm values --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def upstream_values() -> dict[str, Any]:
    data = yaml.safe_load(reference_file(CHART_REFERENCE, "values.yaml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def release_of(run: PlanRun) -> dict[str, Any]:
    releases = [r for r in run.resources if r.type == RELEASE and r.inputs["chart"] == "nvidia-device-plugin"]
    assert len(releases) == 1
    return releases[0].inputs


def test_reference_is_the_chart_version_triarch_installs(runs: dict[str, PlanRun],
                                                         upstream_values: dict[str, Any]) -> None:
    chart = yaml.safe_load(reference_file(CHART_REFERENCE, "Chart.yaml").read_text(encoding="utf-8"))
    release = release_of(runs["dev"])
    assert (chart["name"], str(chart["version"])) == (release["chart"], release["version"])


@pytest.mark.parametrize("name", [*STACKS, "dev-sliced", "local-sliced"])
def test_every_helm_value_exists_upstream(runs: dict[str, PlanRun], upstream_values: dict[str, Any],
                                          name: str) -> None:
    values = release_of(runs[name])["values"]
    assert values
    assert unknown_paths(values, upstream_values) == []
    if name.endswith("-sliced"):
        assert values["config"]["map"], "the time-sliced variant should exercise config.map"


def test_value_checker_reports_unknown_keys(upstream_values: dict[str, Any]) -> None:
    values = {
        "gfd": {"enabled": True, "enabeld": True},
        "config": {"map": {"anything": "goes"}, "defualt": "x"},
        "resources": {"limits": {"memory": "1Gi"}},
        "tolerations": [{"whatever": 1}],
        "nfd": {"worker": {"tolerations": []}, "wroker": {}},
        "devicePlugin": {"enabled": True},
        "priorityClassName": {"nested": "map"},
    }
    assert sorted(unknown_paths(values, upstream_values)) == [
        "config.defualt", "gfd.enabeld", "nfd.wroker", "priorityClassName"]
