"""Ray objects against the KubeRay 1.7.0 CRDs the API server enforces, and the operator's Helm values against
its chart. The API server prunes unknown fields of a structural schema silently, so a misspelt field would
vanish without an error: the walk below rejects unknown fields as kubernetes-validate's strict mode does."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import crd_schema, reference_file, schema_validate, unknown_fields, unknown_paths
from triarch.offline import manifests, read_stack_config, run_program

ROOT = Path(__file__).resolve().parents[1]
KUBERAY = "kuberay-v1.7.0"
STACKS = ("local", "dev", "prod")


def kuberay_schema(file: str) -> dict[str, Any]:
    return crd_schema("kuberay-v1.7.0", file)


@pytest.fixture(scope="module")
def ray_objects() -> dict[str, list[dict[str, Any]]]:
    objects = {}
    for name in STACKS:
        config, secrets = read_stack_config(ROOT / "stacks" / f"Pulumi.{name}.yaml")
        run = run_program(name, config, secrets)
        objects[name] = [o for o in manifests(run) if o["apiVersion"].startswith("ray.io/")]
    return objects


def test_prod_serves_through_a_ray_service(ray_objects: dict[str, list[dict[str, Any]]]) -> None:
    assert [o["kind"] for o in ray_objects["prod"]] == ["RayService"]


def test_each_ray_service_takes_its_spec_back_from_kuberay(ray_objects: dict[str, list[dict[str, Any]]]) -> None:
    """KubeRay 1.7.0 writes the whole RayService back when it adds its finalizer, which makes it the owner of the
    worker groups (an atomic list): without a forced apply the next worker-group change is a field conflict."""
    services = [o for objects in ray_objects.values() for o in objects]
    assert services
    for service in services:
        assert service["metadata"]["annotations"]["pulumi.com/patchForce"] == "true"


@pytest.mark.parametrize("name", STACKS)
def test_ray_services_validate_against_the_crd(ray_objects: dict[str, list[dict[str, Any]]], name: str) -> None:
    schema = kuberay_schema("ray.io_rayservices.yaml")
    for obj in ray_objects[name]:
        assert obj["kind"] == "RayService"
        schema_validate(obj, schema)
        assert unknown_fields({k: v for k, v in obj.items() if k != "metadata"}, schema) == []


def test_ray_cluster_config_validates_as_a_ray_cluster_spec(ray_objects: dict[str, list[dict[str, Any]]]) -> None:
    schema = kuberay_schema("ray.io_rayclusters.yaml")
    [service] = ray_objects["prod"]
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "spec": service["spec"]["rayClusterConfig"]}
    schema_validate(cluster, schema)
    assert unknown_fields(cluster, schema) == []


def test_the_walk_finds_misspelt_and_misplaced_fields(ray_objects: dict[str, list[dict[str, Any]]]) -> None:
    schema = kuberay_schema("ray.io_rayservices.yaml")
    [service] = ray_objects["prod"]
    broken = copy.deepcopy({k: v for k, v in service.items() if k != "metadata"})
    broken["spec"]["serveConfigv2"] = broken["spec"].pop("serveConfigV2")
    broken["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["minReplica"] = 1
    broken["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["imag"] = "x"
    assert sorted(unknown_fields(broken, schema)) == [
        "spec.rayClusterConfig.headGroupSpec.template.spec.containers[0].imag",
        "spec.rayClusterConfig.workerGroupSpecs[0].minReplica",
        "spec.serveConfigv2",
    ]


def test_kuberay_operator_values_exist_in_the_chart() -> None:
    upstream = yaml.safe_load(reference_file(KUBERAY, "values.yaml").read_text(encoding="utf-8"))
    config, secrets = read_stack_config(ROOT / "stacks" / "Pulumi.prod.yaml")
    run = run_program("prod", config, secrets)
    [release] = [r for r in run.resources if r.type == "kubernetes:helm.sh/v3:Release"
                 and r.inputs["chart"] == "kuberay-operator"]
    chart = yaml.safe_load(reference_file(KUBERAY, "Chart.yaml").read_text(encoding="utf-8"))
    assert release.inputs["version"] == str(chart["version"])
    assert release.inputs["values"]
    assert unknown_paths(release.inputs["values"], upstream) == []


def test_each_ray_service_depends_on_the_kuberay_release_that_clears_its_finalizer(shipped: dict[str, Any]) -> None:
    """KubeRay puts a finalizer on each RayService (ray-project/kuberay#4807: in 1.7.0, and in 1.6.2 as a cherry
    pick, #4909) and removes it once the service's RayClusters are gone. A RayService that did not depend on the
    operator's release could outlive it on `pulumi destroy` (dependents go first) and hang there, its finalizer
    with no controller left to clear it."""
    checked = 0
    for plan in shipped.values():
        releases = [r for r in plan.of_type("kubernetes:helm.sh/v3:Release") if r.inputs.get("name") ==
                    "kuberay-operator"]
        for service in plan.of_type("kubernetes:ray.io/v1:RayService"):
            for release in releases:
                assert release.urn in plan.dependencies[service.urn], (plan.name, service.name)
                checked += 1
    assert checked >= 2  # prod and fresh install KubeRay beside a RayService
