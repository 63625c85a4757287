"""Node repair of the GPU pools (cluster.nodeRepair): Karpenter's NodeRepair gate in its chart values, the EKS node
monitoring agent add-on with its DCGM host engine tolerating the GPU taint, nothing of either where the key is off
or the cluster adopted, bad input refused in one line, and the Xid alert, the runbook and `triarch verify` agreeing
on what is repaired and when.

The expected facts are written here literally, as read from the pinned sources (templates/compat/node-repair.yaml
cites them: aws/karpenter-provider-aws v1.14.1 RepairPolicies, aws/eks-node-monitoring-agent v1.7.0
WellKnownXidCodes), never computed by the planners under test."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, StackPlan, compat_data, plan_config, plan_refusal, stack_document
from triarch.diff import diff_plans
from triarch.effects import traffic_effects
from triarch.offline import plan_document
from triarch.verify.repair import check_repair_controller, check_repair_nodes

REPAIR_XIDS = [46, 48, 54, 62, 63, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 142, 143, 151, 155, 156, 158]
"""eks-node-monitoring-agent v1.7.0, monitors/nvidia/dcgm/dcgm_policies.go WellKnownXidCodes."""
XIDS_TEXT = "46, 48, 54, 62, 63, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 142, 143, 151, 155, 156, 158"
MINUTES = 10
"""Karpenter v1.14.1 RepairPolicies: AcceleratedHardwareReady False, tolerated 10 minutes."""
PERCENT = 20
"""sigs.k8s.io/karpenter v1.14.1 node health controller: allowedUnhealthyPercent."""
AGENT = "eks-node-monitoring-agent"
AGENT_VERSION_135 = "v1.7.0-eksbuild.1"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
ADDON = "aws:eks/addon:Addon"
RELEASE = "kubernetes:helm.sh/v3:Release"
XID = re.compile(r"DCGM_FI_DEV_XID_ERRORS == (\d+)")


def addons(plan: StackPlan) -> dict[str, dict[str, Any]]:
    return {str(r.inputs["addonName"]): r.inputs for r in plan.of_type(ADDON)}


def karpenter_settings(plan: StackPlan) -> dict[str, Any]:
    [release] = [r for r in plan.of_type(RELEASE) if str(r.inputs.get("chart", "")).endswith("/karpenter")]
    settings: dict[str, Any] = release.inputs["values"]["settings"]
    return settings


def rules(plan: StackPlan) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for o in plan.objects("PrometheusRule") for g in o["spec"]["groups"] for r in g["rules"]}


def tolerates(toleration: dict[str, str], taint: dict[str, str]) -> bool:
    """Kubernetes' matching (core/v1 Toleration.ToleratesTaint), written out here."""
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("operator") == "Exists":
        return toleration.get("key") in (None, "", taint["key"])
    return toleration.get("key") == taint["key"] and toleration.get("value", "") == taint.get("value", "")


@pytest.fixture(scope="module")
def repair_off(tmp_path_factory: pytest.TempPathFactory) -> StackPlan:
    config = stack_document("prod")
    config["triarch:cluster"]["nodeRepair"] = False
    return plan_config("prod", config, tmp_path_factory.mktemp("off"))


# --- planned: the gate and the agent ------------------------------------------------------------------------------

def test_a_created_cluster_with_karpenter_repairs_by_default(shipped: dict[str, StackPlan]) -> None:
    prod = shipped["prod"]
    assert "nodeRepair" not in prod.config["triarch:cluster"]  # the default, not the stack, turns it on
    assert karpenter_settings(prod)["featureGates"] == {"nodeRepair": True}
    agent = addons(prod)[AGENT]
    assert agent["addonVersion"] == AGENT_VERSION_135  # eks-addons.yaml, 1.35
    assert json.loads(agent["configurationValues"]) == {"dcgmAgent": {"tolerations": [GPU_TOLERATION]}}


def test_the_agents_dcgm_tolerates_every_gpu_pools_taint(shipped: dict[str, StackPlan]) -> None:
    [toleration] = json.loads(addons(shipped["prod"])[AGENT]["configurationValues"])["dcgmAgent"]["tolerations"]
    pools = shipped["prod"].objects("NodePool")
    assert pools
    for pool in pools:
        for taint in pool["spec"]["template"]["spec"]["taints"]:
            assert tolerates(toleration, taint), (pool["metadata"]["name"], taint)
    # the add-on's configuration schema (aws/eks-node-monitoring-agent v1.7.0 charts/configuration.schema.json)
    # takes tolerations under dcgmAgent, as node-repair.yaml records
    assert compat_data("node-repair")["agent"]["dcgmTolerationsKey"] == "dcgmAgent.tolerations"


def test_the_agent_counts_in_each_nodes_overhead() -> None:
    entry = compat_data("node-overhead")["addonDaemonSets"][AGENT]
    assert (entry["cpu"], entry["memory"]) == ("10m", "30Mi")  # chart v1.7.0 nodeAgent.resources.requests


def test_the_key_off_plans_neither_the_gate_nor_the_agent_nor_the_alert(repair_off: StackPlan) -> None:
    assert AGENT not in addons(repair_off)
    assert "nodeRepair" not in (karpenter_settings(repair_off).get("featureGates") or {})
    assert "GpuXidNodeRepair" not in rules(repair_off)
    assert "GpuXidNodeError" in rules(repair_off)  # the class alerts stay


def test_an_adopted_cluster_installs_neither(shipped: dict[str, StackPlan]) -> None:
    fresh = shipped["fresh"]  # adopted, with a Prometheus Triarch installs
    assert not fresh.of_type(ADDON)
    assert not [r for r in fresh.of_type(RELEASE) if str(r.inputs.get("chart", "")).endswith("/karpenter")]
    assert rules(fresh) and "GpuXidNodeRepair" not in rules(fresh)


def test_the_plan_says_what_is_repaired_and_what_is_not(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from triarch import cli

    assert cli.main(["plan", "--stack", "prod", "--out", str(tmp_path / "prod")]) == 0
    out = capsys.readouterr().out
    assert (f"AcceleratedHardwareReady=False on Xid {XIDS_TEXT} (or a double-bit ECC, NVLink or DCGM failure), and "
            f"Karpenter terminates it {MINUTES} minutes later, without a drain, unless more than {PERCENT}% of its "
            "pool's nodes are unhealthy") in out
    assert cli.main(["plan", "--stack", "lab", "--out", str(tmp_path / "lab")]) == 0
    assert "not installed on an adopted cluster" in capsys.readouterr().out


# --- bad input: one line, exit 2 ----------------------------------------------------------------------------------

def test_repair_on_an_adopted_cluster_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = stack_document("local")
    config["triarch:cluster"]["nodeRepair"] = True
    line = plan_refusal(tmp_path, capsys, config)
    assert line.startswith("error: triarch:cluster.nodeRepair: True only applies to a cluster Triarch creates")


def test_repair_without_a_karpenter_pool_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = stack_document("prod")
    config["triarch:cluster"]["nodeRepair"] = True
    for group in config["triarch:nodeGroups"]:
        group.update(provisioner="managedNodeGroup", min=1, max=1)
    line = plan_refusal(tmp_path, capsys, config)
    assert line.startswith("error: triarch:cluster.nodeRepair: True needs a GPU pool Karpenter launches")


def test_a_value_that_is_not_a_boolean_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = stack_document("prod")
    config["triarch:cluster"]["nodeRepair"] = "sometimes"
    line = plan_refusal(tmp_path, capsys, config)
    assert "triarch:cluster.nodeRepair" in line


# --- the alert, the runbook and verify agree ---------------------------------------------------------------------

def test_the_data_file_holds_the_pinned_facts() -> None:
    data = compat_data("node-repair")
    assert data["agent"]["repairXids"] == REPAIR_XIDS
    assert data["karpenter"]["tolerationMinutes"] == MINUTES
    assert data["karpenter"]["maxUnhealthyPercent"] == PERCENT
    assert (data["karpenter"]["condition"], data["karpenter"]["status"]) == ("AcceleratedHardwareReady", "False")
    assert data["karpenter"]["featureGate"] == "nodeRepair"


def test_the_repair_alert_fires_on_exactly_the_agents_xids(shipped: dict[str, StackPlan]) -> None:
    rule = rules(shipped["prod"])["GpuXidNodeRepair"]
    assert sorted(int(x) for x in XID.findall(rule["expr"])) == REPAIR_XIDS
    assert "changes(DCGM_FI_DEV_XID_ERRORS[15m]) > 0" in rule["expr"]  # a new Xid, as the class alerts
    summary = rule["annotations"]["summary"]
    assert f"({XIDS_TEXT})" in summary and f"{MINUTES} minutes later" in summary and f"{PERCENT}%" in summary
    assert rule["labels"] == {"severity": "warning", "layer": "where"}


def test_the_runbook_names_the_same_xids_and_times() -> None:
    text = (ROOT / "docs" / "runbook.md").read_text(encoding="utf-8")
    [row] = [line for line in text.splitlines() if line.startswith("| a GPU node is replaced (node repair)")]
    listed = re.search(r"agent's list: ([\d, ]+);", row)
    assert listed is not None
    assert [int(x) for x in listed.group(1).split(", ")] == REPAIR_XIDS
    assert f"{MINUTES} minutes after the condition turned False" in row and f"above {PERCENT}%" in row
    assert "`GpuXidNodeRepair`" in row


def node(name: str, pool: str, condition: dict[str, str] | None) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True"}] + ([condition] if condition else [])
    return {"metadata": {"name": name, "labels": {"triarch.dev/pool": pool}}, "status": {"conditions": conditions}}


class Pool:
    def __init__(self, name: str) -> None:
        self.name = name


def test_verify_says_when_a_failed_node_goes() -> None:
    failed = {"type": "AcceleratedHardwareReady", "status": "False", "reason": "NvidiaXID79Error",
              "lastTransitionTime": "2026-12-07T10:00:00Z"}
    [finding] = check_repair_nodes([node("ip-1", "l4", failed)], [Pool("l4")], ["l4"])  # type: ignore[list-item]
    assert not finding.ok
    assert finding.message == (
        "AcceleratedHardwareReady=False since 2026-12-07T10:00:00Z (NvidiaXID79Error): Karpenter terminates it at "
        "2026-12-07T10:10:00+00:00 (10 minutes after) without a drain, unless more than 20% of pool l4 is unhealthy "
        f"(the agent's Xids: {XIDS_TEXT})")
    [unrepaired] = check_repair_nodes([node("ip-1", "l4", failed)], [Pool("l4")], [])  # type: ignore[list-item]
    assert not unrepaired.ok and "nothing repairs it here" in unrepaired.message


def test_verify_wants_the_condition_where_repair_is_planned() -> None:
    healthy = {"type": "AcceleratedHardwareReady", "status": "True", "lastTransitionTime": "2026-12-07T09:00:00Z"}
    nodes = [node("ip-1", "l4", healthy), node("ip-2", "l4", None)]
    watched, blind = check_repair_nodes(nodes, [Pool("l4")], ["l4"])  # type: ignore[list-item]
    assert watched.ok and watched.message == "AcceleratedHardwareReady True: repaired 10 minutes after it turns False"
    assert not blind.ok and "dcgmAgent.tolerations" in blind.fix
    # an adopted cluster (nothing planned): no condition is said, not failed
    _, adopted = check_repair_nodes(nodes, [Pool("l4")], [])  # type: ignore[list-item]
    assert adopted.ok and "a failed GPU is not repaired" in adopted.message


def daemon_set(name: str, ready: int, want: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "kube-system"},
            "status": {"desiredNumberScheduled": want, "numberReady": ready}}


def karpenter_deployment(gates: str) -> dict[str, Any]:
    """As the chart (1.14.1, templates/deployment.yaml) renders its FEATURE_GATES."""
    return {"metadata": {"name": "karpenter", "labels": {"app.kubernetes.io/instance": "karpenter"}},
            "spec": {"template": {"spec": {"containers": [{"name": "controller", "env": [
                {"name": "FEATURE_GATES", "value": gates}]}]}}}}


def test_verify_checks_the_gate_and_the_agents_daemon_sets() -> None:
    on = ("ReservedCapacity=true,SpotToSpotConsolidation=false,NodeRepair=true,NodeOverlay=false,"
          "StaticCapacity=false,CapacityBuffer=false")
    ready = [daemon_set("eks-node-monitoring-agent", 5, 5), daemon_set("dcgm-server", 2, 2)]
    assert all(f.ok for f in check_repair_controller([karpenter_deployment(on)], ready))
    off = check_repair_controller([karpenter_deployment(on.replace("NodeRepair=true", "NodeRepair=false"))], ready)
    assert [f.ok for f in off] == [False, True, True] and off[0].message == "NodeRepair=false"
    short = check_repair_controller([karpenter_deployment(on)], [daemon_set("eks-node-monitoring-agent", 5, 5),
                                                                  daemon_set("dcgm-server", 0, 2)])
    assert [f.ok for f in short] == [True, True, False] and short[2].message == "0 of 2 ready"
    missing = check_repair_controller([karpenter_deployment(on)], ready[:1])
    assert not missing[2].ok and missing[2].message == "no DaemonSet dcgm-server in kube-system"


# --- triarch diff ----------------------------------------------------------------------------------------------

def test_toggling_repair_replaces_nothing_and_says_what_changes(shipped: dict[str, StackPlan],
                                                                repair_off: StackPlan) -> None:
    on = json.loads(json.dumps(plan_document(shipped["prod"].run)))
    off = json.loads(json.dumps(plan_document(repair_off.run)))
    result = diff_plans(on, off)
    assert result.of("replaced") == []
    assert [d.name for d in result.of("removed")
            if d.type == ADDON] == ["llm-prod-eks-node-monitoring-agent"]
    effects = traffic_effects(result, on, off, None, None)
    assert any(e.startswith("Helm release karpenter: node repair turns off") for e in effects), effects
    assert f"EKS add-on {AGENT} goes: nothing marks a failed GPU node any more, so no node is repaired" in effects
    back = traffic_effects(diff_plans(off, on), off, on, None, None)
    assert any(e.startswith("Helm release karpenter: node repair turns on") and f"{MINUTES} minutes later" in e
               for e in back), back
    assert any(e.startswith(f"EKS add-on {AGENT} comes") for e in back), back


def test_the_key_reference_says_the_same_minutes_and_limit() -> None:
    text = (ROOT / "docs" / "stack-keys.md").read_text(encoding="utf-8")
    section = text.split("### `triarch:cluster.nodeRepair`", 1)[1].split("\n## ", 1)[0]
    assert f"terminated {MINUTES} minutes later, without a drain" in section and f"more than {PERCENT}%" in section
