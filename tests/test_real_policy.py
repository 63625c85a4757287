"""The policy pack under the real Pulumi CLI, and the real API server's verdict on every stack's objects.

`pulumi preview --policy-pack policies` (the CLI starts the pack through the Python language host, hands it the
stack's configuration, and sends it every resource) must report what `triarch check` reports on the same stack and
policy config: nothing on the lab stack as shipped, the same findings with the same enforcement on seeded
violations. Then the rendered objects of dev, prod, local and lab go through a server-side dry run."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT, STACK_NAMES, stack_path, write_stack_file
from engine_tier import Lab, pod_templates, refused_as_pod
from triarch.cli import main as triarch
from triarch.local.plane import Plane

Finding = tuple[str, str, str, str, str]
"""(policy, enforcement, resource type, resource name, message)."""

POLICIES = ROOT / "policies"


def _drop_pool_zones(config: dict[str, Any]) -> None:
    config["triarch:nodeGroups"][0].pop("zones")


SEEDED: dict[str, tuple[Callable[[dict[str, Any]], object] | None, dict[str, Any]]] = {
    # Stack edit: the zones of the l4 nodes unknown, so the chat replicas spread softly (mandatory in Triarch's own
    # policy config).
    "soft-zone-spread": (_drop_pool_zones, {}),
    # Policy config: a stricter ceiling than the lab's gpuMemoryUtilization (vLLM's default 0.92).
    "memory-utilization": (None, {"vllm-memory-utilization": {"enforcementLevel": "mandatory", "max": 0.9}}),
    # Policy config: a drain longer than any the lab plans, for the vLLM server and the Ray workers alike.
    "drain-too-short": (None, {"prestop-drain": {"enforcementLevel": "mandatory", "minDrainSeconds": 3600}}),
    # The same, where a platform's policy config makes the rule advisory: reported, and the preview passes.
    "soft-zone-spread-advisory": (_drop_pool_zones, {"gpu-zone-spread": {"enforcementLevel": "advisory",
                                                                          "maxSkew": 1}}),
}


def _policy_config(tmp: Path, overrides: dict[str, Any]) -> Path:
    config = json.loads((POLICIES / "config.json").read_text())
    config.update(overrides)
    path = tmp / "policy-config.json"
    path.write_text(json.dumps(config))
    return path


def check_findings(stack_file: Path, policy_config: Path, capsys: pytest.CaptureFixture[str]) -> set[Finding]:
    triarch(["check", "--stack-file", str(stack_file), "--policy-config", str(policy_config), "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    return {(v["policy"], v["enforcementLevel"], v["resource"]["type"], v["resource"]["name"], v["message"])
            for v in report["violations"]}


def preview_findings(lab: Lab, policy_config: Path) -> tuple[set[Finding], int]:
    """The policy events of a real preview (the CLI streams its engine events as JSON lines)."""
    done = lab.pulumi("preview", "--json", "--policy-pack", str(POLICIES), "--policy-pack-config", str(policy_config),
                      check=False, env={"PULUMI_ENABLE_STREAMING_JSON_PREVIEW": "true"})
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    found: set[Finding] = set()
    for line in events:
        event = line.get("policyEvent")
        if not event:
            continue
        urn = event.get("resourceUrn") or ""
        resource_type = urn.split("::")[2].rsplit("$", 1)[-1] if urn else ""
        found.add((event["policyName"], event["enforcementLevel"], resource_type, urn.split("::")[-1] if urn else "",
                   event["message"].strip()))
    assert any("summaryEvent" in e for e in events), (
        f"the preview did not finish:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
    return found, done.returncode


def edited_preview_findings(lab: Lab, config: dict[str, Any], policy_config: Path) -> tuple[set[Finding], int]:
    """preview_findings with the lab stack's config edited, put back afterwards."""
    lab.write_config(config)
    try:
        return preview_findings(lab, policy_config)
    finally:
        lab.write_config(lab.config)


def _messages(findings: set[Finding]) -> set[Finding]:
    """The pack prints each violation's description before its message; compare from the message on."""
    return {(p, e, t, n, m.rsplit("\n", 1)[-1].strip()) for p, e, t, n, m in findings}


def test_the_lab_stack_as_shipped_is_clean_under_the_real_cli(deployed: Lab, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    policy_config = _policy_config(tmp_path, {})
    ours = check_findings(deployed.stack_file, policy_config, capsys)
    real, code = preview_findings(deployed, policy_config)
    assert ours == set() and real == set() and code == 0


@pytest.mark.parametrize("name", sorted(SEEDED))
def test_seeded_violations_are_the_same_under_the_real_cli(deployed: Lab, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str], name: str) -> None:
    edit, overrides = SEEDED[name]
    config = copy.deepcopy(deployed.config)
    if edit is not None:
        edit(config)
    policy_config = _policy_config(tmp_path, overrides)
    ours = check_findings(write_stack_file(tmp_path / "Pulumi.lab.yaml", config), policy_config, capsys)
    real, code = edited_preview_findings(deployed, config, policy_config)
    assert ours, "the seed violates something"
    assert _messages(real) == _messages(ours)
    mandatory = any(f[1] == "mandatory" for f in ours)
    assert (code != 0) == mandatory  # a mandatory violation fails the preview, an advisory one does not


def test_a_rule_the_packs_config_disables_is_silent_under_the_real_cli(deployed: Lab, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`"enforcementLevel": "disabled"` in the pack's config: the edit that is a mandatory gpu-zone-spread violation
    (soft-zone-spread above) draws no finding from the CLI, which passes the preview, nor from `triarch check`."""
    config = copy.deepcopy(deployed.config)
    _drop_pool_zones(config)
    policy_config = _policy_config(tmp_path, {"gpu-zone-spread": {"enforcementLevel": "disabled", "maxSkew": 1}})
    ours = check_findings(write_stack_file(tmp_path / "Pulumi.lab.yaml", config), policy_config, capsys)
    real, code = edited_preview_findings(deployed, config, policy_config)
    assert (real, code) == (set(), 0)
    assert ours == set()


# --- every stack's objects, server-side -----------------------------------------------------------------------


@pytest.fixture(scope="session")
def bare_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    """A plane of its own with the CRDs of every component a stack installs and nothing deployed, so each stack's
    objects are judged as the creations they are (on the lab's plane they would be updates of its objects)."""
    from engine_tier import require_engines
    from triarch.local.crds import CRD_SETS, crd_files
    from triarch.local.lifecycle import down, up
    from triarch.local.plane import PlaneSpec

    require_engines()
    name = f"d{os.getpid()}"
    patch = pytest.MonkeyPatch()
    patch.setenv("TRIARCH_LOCAL_HOME", str(tmp_path_factory.mktemp("bare")))
    try:
        yield up(PlaneSpec(name, "triarch-dry-run", [], crd_files(list(CRD_SETS), [])), log=lambda _: None)
    finally:
        down(name, quiet=True)
        patch.undo()


EXPECTED_WORKLOADS = {"dev": {"Deployment"}, "local": {"Deployment"}, "lab": {"Deployment", "RayService"},
                      "prod": {"Deployment", "RayService"}, "large": {"LeaderWorkerSet", "RayService"},
                      "fresh": {"Deployment", "LeaderWorkerSet", "RayService"}}
"""The kinds of workload whose pod templates each stack holds (its models' engines and stages)."""


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_every_stacks_objects_are_accepted_by_the_api_server(bare_plane: Plane, tmp_path: Path, stack: str) -> None:
    """CEL rules, defaulting, immutable fields and admission in a server-side dry run: each stack's namespaces for
    real first (the objects in them are judged by their namespace's admission), then everything else; then each pod
    template as the Pod it becomes, which is what Pod Security's `enforce` level judges (of a workload, it only
    warns), with no Pod Security warning anywhere."""
    from triarch.report.planning import plan_stack
    from triarch.report.validation import validate_stack_file

    plan_stack(validate_stack_file(stack, stack_path(stack)), tmp_path)
    manifests = [yaml.safe_load(p.read_text()) for p in sorted((tmp_path / "manifests").glob("*.yaml"))]
    # For real first: the namespaces (their admission judges what is in them), and what a Pod's admission looks up
    # by name (its service account, its priority class).
    first = [m for m in manifests if m["kind"] in ("Namespace", "ServiceAccount", "PriorityClass")]
    rest = [m for m in manifests if m["kind"] != "Namespace"]
    assert rest
    for kind in ("Namespace", "ServiceAccount", "PriorityClass"):
        if documents := [m for m in first if m["kind"] == kind]:
            bare_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                               input=yaml.safe_dump_all(documents))
    done = bare_plane.kubectl("apply", "--server-side", "--dry-run=server", "--field-manager", f"triarch-{stack}",
                              "-f", "-", input=yaml.safe_dump_all(rest), check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("(server dry run)") == len(rest)
    assert "PodSecurity" not in done.stderr, done.stderr  # a workload's template only draws a warning
    # So each pod template goes in as the Pod it becomes, which its namespace's `enforce` level admits or refuses.
    templates = [m for m in rest if pod_templates(m)]
    assert {m["kind"] for m in templates} >= EXPECTED_WORKLOADS[stack], stack
    refused = [r for m in templates for r in refused_as_pod(bare_plane, m, m["metadata"].get("namespace", "default"))]
    assert refused == []


def test_a_missing_crd_of_an_existing_component_stops_the_preview(deployed: Lab) -> None:
    """KEDA marked existing where the cluster has no KEDA: one line from Triarch, nothing registered."""
    config = copy.deepcopy(deployed.config)
    config["triarch:observability"]["keda"] = "existing"
    next(m for m in config["triarch:models"] if m["name"] == "chat")["autoscaling"] = {"min": 1, "max": 2}
    next(m for m in config["triarch:models"] if m["name"] == "chat").pop("replicas")
    deployed.write_config(config)
    try:
        done = deployed.pulumi("preview", check=False)
    finally:
        deployed.write_config(deployed.config)
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert ("triarch:observability.keda: 'existing' says the cluster runs the component, but context 'triarch-lab' "
            "has no CRD scaledobjects.keda.sh; allowed: the component installed there first (its chart brings the "
            "CRD), or observability.keda: install") in said
    assert "Traceback" not in said
