"""What a change does to running traffic, as users' edits of prod meet it (triarch.effects): the controllers'
reactions the resource tables do not show. KubeRay's, Karpenter's and Pulumi's own behaviours are cited in the
module; the real-engine tier shows KubeRay's new cluster on an image change (tests/test_real_ray.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import StackPlan, plan_config, stack_document, write_stack_file
from triarch import cli
from triarch.diff import diff_plans
from triarch.effects import _transient_gpus, traffic_effects
from triarch.offline import plan_document


def document(plan: StackPlan) -> dict[str, Any]:
    return plan_document(plan.run)


def effects_of(prod: dict[str, Any], edit: Any, tmp_path: Path) -> list[str]:
    config = stack_document("prod")
    edit(config)
    head = document(plan_config("prod", config, tmp_path))
    return traffic_effects(diff_plans(prod, head), prod, head, None, None)


def pool(config: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(g for g in config["triarch:nodeGroups"] if g["name"] == name)
    return found


@pytest.fixture(scope="module")
def prod(shipped: dict[str, StackPlan]) -> dict[str, Any]:
    return document(shipped["prod"])


def test_a_pool_max_restarts_every_ray_serve_model_and_drifts_no_node(prod: dict[str, Any], tmp_path: Path) -> None:
    """a100's max 2 -> 3: the worker group's zone spread (minDomains) is part of the Ray cluster's spec, so KubeRay
    starts a new cluster; the NodePool's limits change, not its template, so no node is replaced."""
    found = effects_of(prod, lambda c: pool(c, "a100").update(max=3), tmp_path)
    assert found == ["RayService rayservice-llm-llm: KubeRay starts a new Ray cluster beside the running one and "
                     "moves traffic once it serves; every Ray Serve model restarts there (caused by "
                     "spec.rayClusterConfig.workerGroupSpecs[0].template.spec.topologySpreadConstraints[0].minDomains)"]


def test_an_instance_type_change_drifts_the_pool_and_restarts_ray(prod: dict[str, Any], tmp_path: Path) -> None:
    found = effects_of(prod, lambda c: pool(c, "l4").update(instanceType="g6.4xlarge"), tmp_path)
    assert found[0] == ("NodePool nodepool-l4: Karpenter replaces every node of the pool (drift), as its disruption "
                        "budget allows; their pods move")
    assert found[1].startswith("RayService rayservice-llm-llm: KubeRay starts a new Ray cluster")
    assert "workerGroupSpecs[1].template.spec.containers[0].resources" in found[1] and len(found) == 2


def test_a_renamed_model_tells_its_clients(prod: dict[str, Any], tmp_path: Path) -> None:
    found = effects_of(prod, lambda c: next(m for m in c["triarch:models"] if m["name"] == "embed").update(
        name="embedder"), tmp_path)
    assert found == ["clients: Service(s) embed go, embedder come: clients calling the old name (and served model "
                     "name) fail until they change"]


def test_a_serve_config_change_redeploys_in_place(prod: dict[str, Any], tmp_path: Path) -> None:
    found = effects_of(prod, lambda c: next(m for m in c["triarch:models"] if m["name"] == "chat").update(
        maxModelLen=2048), tmp_path)
    assert found == ["RayService rayservice-llm-llm: the Serve applications are redeployed on the running Ray "
                     "cluster (serveConfigV2); the changed models' replicas restart, the others keep serving"]


def test_a_removed_models_gpus_count_until_pulumi_deletes_them_last() -> None:
    base = {"models": [{"name": "embed", "engine": "vllm", "pool": "l4", "replicasMax": 2, "gpusPerReplica": 1}]}
    head = {"models": [{"name": "embedder", "engine": "vllm", "pool": "l4", "replicasMax": 2, "gpusPerReplica": 1}],
            "pools": [{"name": "l4", "gpusAtMax": 3}]}
    assert _transient_gpus(base, head) == [
        "pool l4: the removed models' 2 GPU(s) stay in use until Pulumi deletes them, last, while the head needs 2: "
        "4 at once, and the pool holds 3; the new replicas wait Pending until then (or raise the pool's max first)"]
    assert _transient_gpus(base, {**head, "pools": [{"name": "l4", "gpusAtMax": 4}]}) == []


def test_the_diff_shows_the_effects_above_the_tables(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli.main(["plan", "--stack", "prod", "--out", str(tmp_path / "base")]) == 0
    config = stack_document("prod")
    pool(config, "a100").update(max=3)
    (tmp_path / "head").mkdir()
    head = write_stack_file(tmp_path / "head" / "Pulumi.prod.yaml", config)
    capsys.readouterr()
    for form, heading in (("text", "Effects on running traffic"), ("markdown", "**Effects on running traffic**")):
        assert cli.main(["diff", "--base", str(tmp_path / "base"), "--stack-file", str(head), "--format", form]) == 0
        out = capsys.readouterr().out
        assert heading in out and out.index(heading) < out.index("nodepool-a100")
        assert "KubeRay starts a new Ray cluster" in out
