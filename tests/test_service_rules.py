"""What AWS refuses on an update of a live stack, as a user's edit of prod meets it: `triarch diff` refuses the
change in one line with what works instead (templates/compat/service-rules.yaml, each rule with its source)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import StackPlan, plan_config, stack_document, write_stack_file
from test_security import refusal
from triarch import cli
from triarch.diff import diff_plans
from triarch.offline import plan_document
from triarch.service_rules import claim_growth_notes, refusals


def document(plan: StackPlan) -> dict[str, Any]:
    return plan_document(plan.run)


def edited(edit: Any, tmp_path: Path) -> dict[str, Any]:
    config = stack_document("prod")
    edit(config)
    return document(plan_config("prod", config, tmp_path))


@pytest.fixture(scope="module")
def prod(shipped: dict[str, StackPlan]) -> dict[str, Any]:
    return document(shipped["prod"])


@pytest.mark.parametrize(("version", "said"), [
    ("1.34", "triarch:cluster.kubernetesVersion: 1.35 -> 1.34 goes down, which EKS refuses; allowed: 1.35 or newer "
             "(an older version needs a new cluster, a new cluster.name)"),
    ("1.36", None),
])
def test_kubernetes_goes_up_one_minor_at_a_time(prod: dict[str, Any], tmp_path: Path, version: str,
                                                said: str | None) -> None:
    head = edited(lambda c: c["triarch:cluster"].update(kubernetesVersion=version), tmp_path)
    assert refusals(prod, head) == ([said] if said else [])


def test_a_skipped_minor_is_refused_with_the_step_between(prod: dict[str, Any]) -> None:
    """1.35 -> 1.37: no AMI release Triarch knows runs 1.37, so the plan is edited at the document level."""
    head = {**prod, "resources": [
        {**r, "inputs": {**r["inputs"], "version": "1.37"}} if r["type"] == "aws:eks/cluster:Cluster" else r
        for r in prod["resources"]]}
    assert refusals(prod, head) == [
        "triarch:cluster.kubernetesVersion: 1.35 -> 1.37 skips a minor, which EKS refuses (one minor per update); "
        "allowed: 1.36 first (a `pulumi up`), then 1.37"]


def test_a_zone_the_cluster_was_not_created_in_is_refused(prod: dict[str, Any], tmp_path: Path) -> None:
    head = edited(lambda c: c["triarch:cluster"]["zones"].insert(0, "us-east-1d"), tmp_path)
    assert refusals(prod, head) == [
        "triarch:cluster.zones: us-east-1d is not a zone the cluster was created in (us-east-1a, us-east-1b, "
        "us-east-1c), and EKS takes new subnets only there; allowed: the zones it has, or a new cluster (a new "
        "cluster.name)"]
    # fewer zones, a renamed (so new) cluster: nothing refused
    assert refusals(prod, edited(lambda c: c["triarch:cluster"]["zones"].pop(), tmp_path / "fewer")) == []
    renamed = edited(lambda c: c["triarch:cluster"].update(name="llm-prod-b", zones=["us-east-1d", "us-east-1a"]),
                     tmp_path / "renamed")
    assert refusals(prod, renamed) == []


def test_diff_refuses_in_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli.main(["plan", "--stack", "prod", "--out", str(tmp_path / "base")]) == 0
    capsys.readouterr()
    config = stack_document("prod")
    config["triarch:cluster"]["kubernetesVersion"] = "1.34"
    (tmp_path / "head").mkdir()
    head = write_stack_file(tmp_path / "head" / "Pulumi.prod.yaml", config)
    code = cli.main(["diff", "--base", str(tmp_path / "base"), "--stack-file", str(head)])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.strip().splitlines()[-1] == (
        "error: triarch:cluster.kubernetesVersion: 1.35 -> 1.34 goes down, which EKS refuses; allowed: 1.35 or newer "
        "(an older version needs a new cluster, a new cluster.name)")


def test_a_version_no_known_ami_runs_names_the_versions_that_do(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    config = stack_document("prod")
    config["triarch:cluster"]["kubernetesVersion"] = "1.37"
    line = refusal(tmp_path, config, capsys)
    # the version is the mistake, not a pool's amiRelease: no release Triarch knows has it
    assert line.startswith("triarch:cluster.kubernetesVersion: '1.37' has no AL2023 release in "
                           "templates/compat/amis.yaml (the AMI that pins the nodes' NVIDIA driver); allowed: "), line
    assert ", 1.36, or add a release for it with its source" in line and "amiRelease" not in line


def test_an_unquoted_version_is_told_to_be_quoted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kubernetesVersion: 1.30` unquoted is the number 1.3 to YAML."""
    config = stack_document("prod")
    config["triarch:cluster"]["kubernetesVersion"] = 1.30
    assert refusal(tmp_path, config, capsys) == (
        "triarch:cluster.kubernetesVersion: 1.3 is a number where a string is read: quote it (YAML reads an "
        "unquoted 1.30 as the number 1.3); allowed: a string")


# --- managed node groups ------------------------------------------------------------------------------------------

def test_a_managed_node_group_goes_forward_only(prod: dict[str, Any], tmp_path: Path) -> None:
    """EKS refuses an earlier AMI for a node group it updates (UpdateNodegroupVersion); a newer one rolls the nodes."""
    older = edited(lambda c: c["triarch:cluster"]["systemNodeGroup"].update(amiRelease="v20260610"), tmp_path)
    assert refusals(prod, older) == [
        "triarch:cluster.systemNodeGroup.amiRelease: v20260714 -> v20260610 rolls node group llm-prod-system back to "
        "an "
        "earlier AMI (1.35.6-20260714 -> 1.35.5-20260610), which EKS refuses; allowed: v20260714 or a newer release "
        "(EKS moves a managed node group forward only)"]
    assert refusals(older, prod) == [], "forward is an update EKS makes"


def test_an_earlier_ami_is_refused_for_a_fixed_pool_unless_its_group_is_new(tmp_path: Path) -> None:
    """A fixed GPU pool is a managed node group; a Karpenter pool's AMI may go back (its nodes drift)."""
    def fixed(config: dict[str, Any]) -> None:
        next(g for g in config["triarch:nodeGroups"] if g["name"] == "a100").update(
            provisioner="managedNodeGroup", min=2, max=2)

    def older(config: dict[str, Any]) -> None:
        fixed(config)
        next(g for g in config["triarch:nodeGroups"] if g["name"] == "a100")["amiRelease"] = "v20260610"

    before = edited(fixed, tmp_path / "before")
    assert refusals(before, edited(older, tmp_path / "older")) == [
        "triarch:nodeGroups[].amiRelease of pool a100: v20260714 -> v20260610 rolls node group gpu-a100 back to an "
        "earlier AMI (1.35.6-20260714 -> 1.35.5-20260610), which EKS refuses; allowed: v20260714 or a newer release "
        "(EKS moves a managed node group forward only)"]

    def renamed(config: dict[str, Any]) -> None:
        older(config)
        next(g for g in config["triarch:nodeGroups"] if g["name"] == "a100")["instanceType"] = "p4d.24xlarge"

    assert refusals(before, edited(renamed, tmp_path / "renamed")) == [], "a new group takes any release"
    karpenter = edited(lambda c: next(g for g in c["triarch:nodeGroups"] if g["name"] == "a100").update(
        amiRelease="v20260610"), tmp_path / "karpenter")
    assert refusals(edited(lambda c: None, tmp_path / "prod"), karpenter) == []


# --- volume claims -------------------------------------------------------------------------------------------------

CLAIM = "kubernetes:core/v1:PersistentVolumeClaim"


def _claims(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["inputs"]["metadata"]["name"]: r for r in plan["resources"] if r["type"] == CLAIM}


def test_a_new_ray_model_leaves_the_shared_efs_claim_as_created(prod: dict[str, Any], tmp_path: Path) -> None:
    """prod's Ray Serve models share one cache claim sized by their caches; one more model would grow it, which the
    API server refuses on the EFS class (no allowVolumeExpansion). EFS ignores the size, so Pulumi never sends it:
    the diff shows the claim untouched and refuses nothing."""
    def add_model(config: dict[str, Any]) -> None:
        next(g for g in config["triarch:nodeGroups"] if g["name"] == "l4")["max"] = 8
        config["triarch:models"].append({"name": "gemma", "model": "google/gemma-2-2b-it", "engine": "ray-serve",
                                         "nodeGroup": "l4", "maxModelLen": 4096})
    head = edited(add_model, tmp_path)
    before, after = _claims(prod)["llm-hf-cache"], _claims(head)["llm-hf-cache"]
    assert before["inputs"]["spec"]["resources"] != after["inputs"]["spec"]["resources"]  # the planned size grew
    assert after["ignoreChanges"] == ["spec.resources.requests.storage"]
    assert after["inputs"]["spec"]["storageClassName"] == "triarch-efs"
    assert "llm-hf-cache" not in " ".join(d.name for d in diff_plans(prod, head).differences)
    assert refusals(prod, head) == []


@pytest.mark.parametrize(("cache", "refused", "noted"), [
    (10, "claim llm/embed-hf-cache: 20Gi -> 10Gi shrinks a volume claim, which Kubernetes refuses; allowed: 20Gi or "
         "more (the models' cacheGiB keep it), or a new claim (its models renamed)", None),
    (40, None, "claim llm/embed-hf-cache: grows 20Gi -> 40Gi; Kubernetes accepts it only if the cluster's default "
               "class has allowVolumeExpansion (`kubectl get storageclass`), else `pulumi up` fails on it (the "
               "models' cacheGiB keep its size)"),
])
def test_a_claim_on_a_class_triarch_did_not_create_shrinks_never_and_grows_maybe(
        shipped: dict[str, StackPlan], tmp_path: Path, cache: int, refused: str | None, noted: str | None) -> None:
    """The local stack adopts a cluster and its default class: a smaller cache is refused (Kubernetes never shrinks
    a claim); a larger one is said to depend on the class, which the plan cannot see."""
    base = document(shipped["local"])
    config = stack_document("local")
    config["triarch:models"][0]["cacheGiB"] = cache
    head = document(plan_config("local", config, tmp_path))
    assert _claims(base)["embed-hf-cache"]["inputs"]["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert "ignoreChanges" not in _claims(head)["embed-hf-cache"]
    assert refusals(base, head) == ([refused] if refused else [])
    assert claim_growth_notes(base, head) == ([noted] if noted else [])


def _classes_edited(prod: dict[str, Any], **inputs: Any) -> dict[str, Any]:
    """prod's plan as a Triarch release that sets other StorageClass inputs would plan it (no stack key reaches them:
    the edit is a code change, so the plan document is edited)."""
    return {**prod, "resources": [
        {**r, "inputs": {**r["inputs"], **inputs}} if r["name"] == "storageclass-triarch-gp3" else r
        for r in prod["resources"]]}


def test_an_immutable_field_updated_in_place_is_refused(prod: dict[str, Any]) -> None:
    """A StorageClass's reclaimPolicy and volumeBindingMode: pulumi-kubernetes replaces a class only for parameters
    or provisioner, and the API server refuses the in-place change (real kube-apiserver 1.35.4: "updates to
    reclaimPolicy are forbidden", volumeBindingMode "field is immutable"), so `pulumi up` would fail."""
    assert refusals(prod, _classes_edited(prod, reclaimPolicy="Retain")) == [
        "StorageClass storageclass-triarch-gp3: reclaimPolicy Delete -> Retain, which the Kubernetes API refuses (the "
        "field is immutable) while Pulumi would update the object in place, so `pulumi up` would fail; allowed: "
        "Delete, or the object under a new name (created new, the old one deleted)"]
    [said] = refusals(prod, _classes_edited(prod, volumeBindingMode="Immediate"))
    assert said.startswith("StorageClass storageclass-triarch-gp3: volumeBindingMode WaitForFirstConsumer -> "
                           "Immediate, which the Kubernetes API refuses")
    # replaced anyway (its parameters change too): a new class takes any value; a mutable field changes in place
    assert refusals(prod, _classes_edited(prod, reclaimPolicy="Retain", parameters={"type": "gp3",
                                                                                    "encrypted": "false"})) == []
    assert refusals(prod, _classes_edited(prod, allowVolumeExpansion=False)) == []
    result = diff_plans(prod, _classes_edited(prod, reclaimPolicy="Retain", parameters={"type": "io2"}))
    assert [d.name for d in result.of("replaced")] == ["storageclass-triarch-gp3"]
