"""`triarch diff`: what a change does to a live stack, and the stable identities that keep benign edits from
replacing anything. Plans come from the whole program (conftest.plan_config); the replacements expected here
follow from the provider semantics cited in templates/compat/replacement.yaml (read as YAML, independently)."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT, StackPlan, plan_config, stack_document, write_stack_file
from triarch import cli
from triarch.diff import Diff, diff_plans, urn_of
from triarch.offline import plan_document

REPLACEMENT = yaml.safe_load((ROOT / "templates" / "compat" / "replacement.yaml").read_text(encoding="utf-8"))


def document(plan: StackPlan) -> dict[str, Any]:
    return json.loads(json.dumps(plan_document(plan.run)))


def edited(name: str, edit: Any, tmp_path: Path) -> dict[str, Any]:
    config = stack_document(name)
    edit(config)
    return document(plan_config(name, config, tmp_path))


def names(result: Diff, kind: str) -> list[str]:
    return sorted(d.name for d in result.of(kind))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def base(shipped: dict[str, StackPlan]) -> dict[str, dict[str, Any]]:
    return {name: document(plan) for name, plan in shipped.items()}


def test_every_registered_type_has_replacement_rules(base: dict[str, dict[str, Any]]) -> None:
    """No resource type escapes the replacement data: each one Triarch registers has an entry with a source."""
    types = {r["type"] for doc in base.values() for r in doc["resources"]
             if not r["type"].startswith(("triarch:", "pulumi:"))}
    entries = REPLACEMENT["types"]
    kubernetes_custom = {t for t in types if t.startswith("kubernetes:") and "." in t.split(":")[1].split("/")[0]
                         and not t.startswith(("kubernetes:storage.k8s.io", "kubernetes:networking.k8s.io",
                                               "kubernetes:helm.sh"))}
    missing = sorted(t for t in types - kubernetes_custom if t not in entries)
    assert missing == []
    assert all(entry.get("source") for entry in entries.values())


def test_a_plan_against_itself_differs_in_nothing(base: dict[str, dict[str, Any]]) -> None:
    for doc in base.values():
        result = diff_plans(doc, doc)
        assert result.differences == [] and result.engine == [] and result.vllm == []


def test_reordering_zones_models_and_pools_changes_nothing(base: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    def reorder(config: dict[str, Any]) -> None:
        config["triarch:cluster"]["zones"].reverse()
        config["triarch:models"].reverse()
        config["triarch:nodeGroups"].reverse()

    result = diff_plans(base["prod"], edited("prod", reorder, tmp_path))
    assert result.differences == [], [(d.kind, d.name, d.inputs) for d in result.differences]


def test_adding_a_zone_replaces_no_stateful_resource(base: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    def add_zone(config: dict[str, Any]) -> None:
        config["triarch:cluster"]["zones"].insert(0, "us-east-1d")

    result = diff_plans(base["prod"], edit := edited("prod", add_zone, tmp_path))
    assert result.blocking == []
    # The new zone's subnets are added; the existing subnets keep their ranges.
    assert "llm-prod-net-private-us-east-1d" in names(result, "added")
    assert not [d for d in result.differences if d.type == "aws:ec2/subnet:Subnet" and d.kind != "added"]
    # The system node group spans the new subnet: EKS replaces it, under a new name, so the two never collide.
    [system] = [d for d in result.of("replaced") if d.type == "aws:eks/nodeGroup:NodeGroup"]
    old = next(r for r in base["prod"]["resources"] if r["urn"] == system.urn)["inputs"]["nodeGroupName"]
    new = next(r for r in edit["resources"] if r["urn"] == system.urn)["inputs"]["nodeGroupName"]
    assert old != new and old.rsplit("-", 1)[0] == new.rsplit("-", 1)[0]


def test_a_new_vpc_range_replaces_the_network_and_says_so(base: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    result = diff_plans(base["prod"], edited("prod", lambda c: c["triarch:cluster"].update(vpcCidr="10.9.0.0/16"),
                                             tmp_path))
    stateful = {(d.type, d.name) for d in result.blocking}
    assert ("aws:ec2/vpc:Vpc", "llm-prod-net-vpc") in stateful
    subnets = [d for d in result.blocking if d.type == "aws:ec2/subnet:Subnet"]
    assert len(subnets) == 6 and all(d.inputs == ["cidrBlock"] for d in subnets)
    # What only follows them (new subnet ids) is replaced too, and says which resource it follows.
    [mount] = [d for d in result.of("replaced") if d.name == "llm-prod-models-mt-us-east-1a"]
    assert "llm-prod-net-private-us-east-1a" in mount.cause
    # The cluster's subnets change in place (EKS allows it since TF v5.25), so the cluster is not replaced.
    assert not [d for d in result.of("replaced") if d.type == "aws:eks/cluster:Cluster"]
    intended = diff_plans(base["prod"], edited("prod", lambda c: c["triarch:cluster"].update(vpcCidr="10.9.0.0/16"),
                                               tmp_path / "again"),
                          intended=[d.name for d in result.blocking])
    assert intended.blocking == [] and all(d.intended for d in intended.of("replaced") if d.stateful)


def test_a_new_instance_type_for_a_fixed_pool_renames_its_node_group(tmp_path: Path) -> None:
    def fixed(config: dict[str, Any]) -> None:
        next(g for g in config["triarch:nodeGroups"] if g["name"] == "a100").update(
            provisioner="managedNodeGroup", min=2, max=2)

    before = edited("prod", fixed, tmp_path / "before")

    def bigger(config: dict[str, Any]) -> None:
        fixed(config)
        next(g for g in config["triarch:nodeGroups"] if g["name"] == "a100")["instanceType"] = "p5.48xlarge"

    after = edited("prod", bigger, tmp_path / "after")
    result = diff_plans(before, after)
    [group] = [d for d in result.of("replaced") if d.type == "aws:eks/nodeGroup:NodeGroup"]
    assert "instanceTypes" in group.inputs and "nodeGroupName" in group.inputs
    assert not group.stateful and result.blocking == []
    # The launch template (named by prefix, from keys) is not replaced.
    assert not [d for d in result.of("replaced") if d.type == "aws:ec2/launchTemplate:LaunchTemplate"]

    def disk(config: dict[str, Any]) -> None:
        fixed(config)
        next(g for g in config["triarch:nodeGroups"] if g["name"] == "a100")["diskGiB"] = 800

    resized = diff_plans(before, edited("prod", disk, tmp_path / "disk"))
    assert resized.of("replaced") == [], "a larger root volume is a new launch template version, rolled in place"


def test_toggling_time_slicing_replaces_nothing(base: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    result = diff_plans(base["dev"], edited("dev", lambda c: c["triarch:nodeGroups"][0].update(
        timeSlicing={"replicas": 2}), tmp_path))
    assert result.of("replaced") == [] and result.of("removed") == [] and result.of("added") == []
    assert {d.type for d in result.of("changed")} >= {"kubernetes:karpenter.sh/v1:NodePool",
                                                       "kubernetes:helm.sh/v3:Release"}


def test_engine_args_that_change_are_reported_per_model(base: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    def shorter(config: dict[str, Any]) -> None:
        next(m for m in config["triarch:models"] if m["name"] == "qwen")["maxModelLen"] = 8192

    result = diff_plans(base["prod"], edited("prod", shorter, tmp_path))
    [change] = result.engine
    assert change.model == "qwen"
    assert change.changes["max_model_len"] == (16384, 8192)


def test_a_vllm_release_change_lists_what_the_new_release_removed(tmp_path: Path) -> None:
    old = edited("dev", lambda c: c.update({"triarch:images": {"vllm": "vllm/vllm-openai:v0.29.0"}}), tmp_path / "o")
    new = document(plan_config("dev", stack_document("dev"), tmp_path / "n"))
    notes = diff_plans(old, new).vllm
    assert any("0.29.0 -> 0.33.0" in n and "enable_bf16x3_router_gemm" in n for n in notes), notes
    assert any("log_config_file" in n for n in notes)
    backwards = diff_plans(new, old).vllm
    assert backwards == ["vLLM 0.33.0 -> 0.29.0: no record of what this release removed "
                         "(templates/compat/vllm-changes.yaml)"]


def test_a_vllm_release_change_of_one_engine_is_noted_where_the_other_runs_it(tmp_path: Path) -> None:
    """prod runs both engines: its Ray LLM image carries vLLM 0.29.0. Moving the vLLM server from 0.29.0 to 0.33.0
    is a release change of that engine, noted although the stack as a whole still runs 0.29.0."""
    old = edited("prod", lambda c: c.update({"triarch:images": {"vllm": "vllm/vllm-openai:v0.29.0"}}), tmp_path / "o")
    new = document(plan_config("prod", stack_document("prod"), tmp_path / "n"))
    notes = diff_plans(old, new).vllm
    assert any(n.startswith("vLLM 0.29.0 -> 0.33.0: engine args removed:") for n in notes), notes


def test_plans_without_urns_are_read_with_the_urns_they_would_have(base: dict[str, dict[str, Any]]) -> None:
    """A base planned before plan.json carried URNs: each URN is rebuilt from the type, name and parent."""
    for doc in base.values():
        for resource in doc["resources"]:
            assert urn_of(doc["stack"], resource) == resource["urn"]


# --- the command --------------------------------------------------------------------------------------------------

def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["diff", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_diff_json_marks_an_unintended_stateful_replacement(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "--stack", "dev", "--out", str(tmp_path / "base")]) == 0
    capsys.readouterr()
    config = stack_document("dev")
    config["triarch:cluster"]["vpcCidr"] = "10.7.0.0/16"
    head = write_stack_file(tmp_path / "Pulumi.dev.yaml", config)
    code, out, _ = run(capsys, "--base", str(tmp_path / "base"), "--stack-file", str(head), "--format", "json")
    assert code == 1
    report = json.loads(out)
    assert {"replaced", "added", "removed", "changed"} <= set(report)
    [vpc] = [r for r in report["replaced"] if r["type"] == "aws:ec2/vpc:Vpc"]
    assert vpc["stateful"] is True and vpc["inputs"] == ["cidrBlock"] and "cidrBlock" in vpc["cause"]
    assert set(vpc) >= {"type", "name", "inputs", "stateful", "cause"}
    stateful = [r["name"] for r in report["replaced"] if r["stateful"]]
    marks = [arg for name in stateful for arg in ("--intended", name)]
    code, out, _ = run(capsys, "--base", str(tmp_path / "base"), "--stack-file", str(head), "--format", "markdown",
                       *marks)
    assert code == 0
    assert out.startswith("### `triarch diff` of `dev`")
    assert "no unintended replacement or removal" in out.splitlines()[0]


def test_diff_against_a_git_ref_plans_it_in_a_worktree(capsys: pytest.CaptureFixture[str]) -> None:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    code, out, err = run(capsys, "--base", "HEAD", "--stack", "dev")
    assert code in (0, 1), err
    assert out.startswith("triarch diff: stack dev against HEAD")
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "triarch-base-" not in worktrees.stdout, "the temporary worktree is removed"


def test_a_bad_base_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "--base", "no-such-ref-or-dir", "--stack", "dev")
    assert code == 2 and out == ""
    assert err.splitlines() == ["error: --base: 'no-such-ref-or-dir' is neither a plan directory nor a git ref of this "
                                "repository; allowed: a directory written by `triarch plan`, or a commit, branch or "
                                "tag"]
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "--base", str(tmp_path / "empty"), "--stack", "dev")
    assert code == 2 and len(err.splitlines()) == 1 and "plan.json" in err


def test_changed_paths_of_nested_lists_and_sets() -> None:
    from triarch.diff import TypeRule, changed_paths

    rule = TypeRule(("spec.selector",), ("subnetIds",), None)
    assert changed_paths({"subnetIds": ["a", "b"]}, {"subnetIds": ["b", "a"]}, rule) == []
    assert changed_paths({"ids": ["a", "b"]}, {"ids": ["b", "a"]}, rule) == ["ids"]
    assert changed_paths({"x": [{"a": 1}, {"a": 2}]}, {"x": [{"a": 1}, {"a": 3}]}, rule) == ["x[1].a"]
    assert changed_paths({"spec": {"selector": {"m": "1"}}}, {"spec": {"selector": {"m": "2"}}}, rule) == [
        "spec.selector.m"]
    base = copy.deepcopy({"a": {"b": 1}})
    assert changed_paths(base, {"a": {"b": 1, "c": 2}}, rule) == ["a.c"]


def test_an_input_under_ignore_changes_neither_updates_nor_replaces(base: dict[str, dict[str, Any]]) -> None:
    """The cluster keeps its creator's access flag and the model cache its key (both ForceNew) on stacks created
    before those defaults: Pulumi keeps an ignored input's old value, and so does the diff."""
    head = copy.deepcopy(base["prod"])
    by_type = {r["type"]: r for r in head["resources"]}
    assert by_type["aws:eks/cluster:Cluster"]["ignoreChanges"] == [
        "accessConfig.bootstrapClusterCreatorAdminPermissions"]
    assert by_type["aws:efs/fileSystem:FileSystem"]["ignoreChanges"] == ["kmsKeyId"]
    older = copy.deepcopy(head)
    for resource in older["resources"]:
        if resource["type"] == "aws:eks/cluster:Cluster":
            resource["inputs"]["accessConfig"]["bootstrapClusterCreatorAdminPermissions"] = True
        if resource["type"] == "aws:efs/fileSystem:FileSystem":
            del resource["inputs"]["kmsKeyId"]
    assert diff_plans(older, head).differences == []
    # Without the option the same change replaces both, the cache's mount targets following its file system.
    for resource in head["resources"]:
        resource.pop("ignoreChanges", None)
    result = diff_plans(older, head)
    assert {d.name for d in result.of("replaced") if d.stateful} == {"llm-prod", "llm-prod-models-fs",
                                                                     "storageclass-triarch-efs"}


def test_outputs_the_mock_fills_in_are_not_recorded_as_inputs(base: dict[str, dict[str, Any]]) -> None:
    [cluster] = [r for r in base["prod"]["resources"] if r["type"] == "aws:eks/cluster:Cluster"]
    assert "clusterSecurityGroupId" not in cluster["inputs"]["vpcConfig"]
    assert "vpcId" not in cluster["inputs"]["vpcConfig"]


def test_renaming_the_cluster_counts_its_destruction_and_the_provider_change(base: dict[str, dict[str, Any]],
                                                                              tmp_path: Path) -> None:
    """A user's edit: `cluster.name: llm-prod` -> `llm-prod-b`. The EKS cluster, VPC, file system, key and log group
    go (removed under their old names): stateful removals the gate counts. The Kubernetes provider is renamed with
    the cluster and now targets the new one (its kubeconfig comes from the new cluster): the namespaces and claims
    whose inputs did not change are created there, replaced, not unchanged."""
    result = diff_plans(base["prod"], edited("prod", lambda c: c["triarch:cluster"].update(name="llm-prod-b"),
                                             tmp_path))
    removed = {d.type for d in result.blocking if d.kind == "removed"}
    assert {"aws:eks/cluster:Cluster", "aws:ec2/vpc:Vpc", "aws:efs/fileSystem:FileSystem", "aws:kms/key:Key",
            "aws:cloudwatch/logGroup:LogGroup"} <= removed
    [namespace] = [d for d in result.of("replaced")
                   if d.type == "kubernetes:core/v1:Namespace" and d.name.endswith("llm")]
    assert namespace.cause.startswith("its provider changes to another target (llm-prod-k8s -> llm-prod-b-k8s)")
    claims = [d for d in result.of("replaced") if d.type == "kubernetes:core/v1:PersistentVolumeClaim"]
    assert claims and all(d.stateful and "provider changes" in d.cause for d in claims)
    assert not [d for d in result.differences if d.type.startswith("kubernetes:") and d.kind == "changed"
                and d.inputs == []]
    # marked intended, nothing blocks
    again = diff_plans(base["prod"], edited("prod", lambda c: c["triarch:cluster"].update(name="llm-prod-b"),
                                            tmp_path / "again"), intended=[d.urn for d in result.blocking])
    assert again.blocking == []


def test_a_removed_stateful_resource_blocks_the_gate(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Dropping the only Ray Serve models removes the Ray cache claim: `triarch diff` exits 1 and says so."""
    config = stack_document("prod")
    config["triarch:models"] = [m for m in config["triarch:models"] if m.get("engine", "vllm") != "ray-serve"]
    (tmp_path / "head").mkdir()
    head = write_stack_file(tmp_path / "head" / "Pulumi.prod.yaml", config)
    assert cli.main(["plan", "--stack", "prod", "--out", str(tmp_path / "base")]) == 0
    capsys.readouterr()
    code = cli.main(["diff", "--base", str(tmp_path / "base"), "--stack-file", str(head)])
    out = capsys.readouterr().out
    assert code == 1
    assert "stateful replacement(s) or removal(s) not marked intended (--intended NAME marks one)" in out
    assert "persistentvolumeclaim-llm-llm-hf-cache" in out


def test_an_edited_stack_file_is_compared_with_the_bases_own(capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path) -> None:
    """A reviewer's edit in a copy of prod's stack file, diffed against a git ref: the base is the ref's own
    prod stack file, not the edited copy (which would show no difference), and the output says so."""
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, check=False).returncode != 0:
        pytest.skip("not a git checkout")
    config = stack_document("prod")
    next(m for m in config["triarch:models"] if m["name"] == "embed")["maxModelLen"] = 4096
    edited_file = write_stack_file(tmp_path / "Pulumi.prod.yaml", config)
    code, out, err = run(capsys, "--base", "HEAD", "--stack-file", str(edited_file))
    assert code in (0, 1), err
    lines = out.splitlines()
    assert lines[1] == f"compared: base HEAD:stacks/Pulumi.prod.yaml, head {edited_file}"
    assert "no differences" not in out and "deployment-llm-embed" in out


def test_the_base_of_a_stack_file_in_the_repository_is_that_file_at_the_ref() -> None:
    from triarch.baseline import base_source

    assert base_source("main", "prod", ROOT / "stacks" / "Pulumi.prod.yaml") == (
        ["--stack-file", "stacks/Pulumi.prod.yaml"], "main:stacks/Pulumi.prod.yaml")
    assert base_source("main", "prod-b", Path("/elsewhere/Pulumi.prod-b.yaml")) == (
        ["--stack", "prod-b"], "main:stacks/Pulumi.prod-b.yaml")
    assert base_source("main", "prod", None) == (["--stack", "prod"], "main:stacks/Pulumi.prod.yaml")


def test_plans_of_two_stacks_are_not_compared_unless_asked(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path) -> None:
    """prod's stack file copied as prod-b.yaml and compared with prod's plan: every URN differs by the stack name,
    so the diff refuses (one line, exit 2) unless --across-stacks says it is meant."""
    assert cli.main(["plan", "--stack", "prod", "--out", str(tmp_path / "prod")]) == 0
    capsys.readouterr()
    other = write_stack_file(tmp_path / "Pulumi.prod-b.yaml", stack_document("prod"))
    code, out, err = run(capsys, "--base", str(tmp_path / "prod"), "--stack-file", str(other))
    assert code == 2 and out == ""
    assert err.splitlines() == [
        f"error: --base: the plan in {tmp_path / 'prod'} plans stack 'prod' and the head is stack 'prod-b': URNs "
        "carry the stack name, so every resource would differ; allowed: the same stack (--stack prod), or "
        "--across-stacks to compare them anyway"]
    code, out, _ = run(capsys, "--base", str(tmp_path / "prod"), "--stack-file", str(other), "--across-stacks")
    assert code in (0, 1) and "compared: base the plan in" in out


def test_a_provider_renamed_with_the_same_target_moves_nothing(base: dict[str, dict[str, Any]],
                                                               tmp_path: Path) -> None:
    """An adopted cluster renamed (`cluster.name`), same kubeconfig and context: the provider's name changes, its
    target does not, and the real engine diffs each object as before (tests/test_real_diff.py, cluster-renamed):
    nothing is replaced for its provider."""
    result = diff_plans(base["local"], edited("local", lambda c: c["triarch:cluster"].update(name="local-b"), tmp_path))
    assert not [d for d in result.differences if "provider" in d.cause]
    assert not [d for d in result.of("replaced") if d.type == "kubernetes:core/v1:Namespace"]


def test_removing_a_secret_blocks_but_rotating_it_does_not(base: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    """prod moved to a Prometheus it already runs: Triarch's Grafana goes, with the Secret holding its admin
    password. Deleting a Secret loses what reads it, so the gate counts it; a Secret replaced with a new value (a
    rotation: its data cannot change in place) keeps the pods reading one, and does not block."""
    head = edited("prod", lambda c: c.setdefault("triarch:observability", {}).update(prometheus="existing"),
                  tmp_path)
    result = diff_plans(base["prod"], head)
    [secret] = [d for d in result.of("removed") if d.type == "kubernetes:core/v1:Secret"]
    assert secret.name == "kube-prometheus-stack-grafana-admin"
    assert secret in result.blocking and "fail to start or to authenticate" in secret.cause
    assert secret not in diff_plans(base["prod"], head, intended=[secret.name]).blocking
    rotated = copy.deepcopy(base["prod"])
    [resource] = [r for r in rotated["resources"] if r["type"] == "kubernetes:core/v1:Secret"]
    resource["inputs"]["stringData"] = {"admin-password": "rotated"}
    result = diff_plans(base["prod"], rotated)
    assert [d.name for d in result.of("replaced")] == [secret.name] and result.blocking == []


def test_removing_the_crds_keeps_them_in_the_cluster(base: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    """prod serving through vLLM alone: KubeRay goes, and with it the CRD files Triarch manages as their own
    resources; each CRD is retained on delete (deleting it would delete every Ray object in the cluster, any tool's,
    where Helm never deleted its crds/), so the removal loses nothing and says the CRD stays."""
    head = edited("prod", lambda c: c.update({"triarch:models": [m for m in c["triarch:models"]
                                                                 if m["engine"] == "vllm"]}), tmp_path)
    result = diff_plans(base["prod"], head)
    crds = [d for d in result.of("removed") if d.type == "kubernetes:yaml/v2:ConfigFile"]
    assert sorted(d.name for d in crds) == [f"kuberay-operator-crd-ray.io_{kind}" for kind in
                                            ("rayclusters", "raycronjobs", "rayjobs", "rayservices")]
    assert all("stays in the cluster" in d.cause and not d.stateful for d in crds)
    assert not [d for d in result.blocking if d.type == "kubernetes:yaml/v2:ConfigFile"]


def test_the_cost_change_is_explained_line_by_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """prod's A100 nodes get 1,000 GiB root volumes instead of 500 and the L4 pool may grow to 8 nodes: the total
    moves, and each line that moves it says by how much (list prices: g6.2xlarge $0.9776/h, gp3 $0.08 per
    GiB-month, 730 h). L4 at max: 2 more nodes, +$1,427. Root volumes: idle one A100 node holds 500 GiB more (+$40);
    at max 2 x 200 GiB of L4 and 2 x 500 GiB of A100 more, 1,400 GiB (+$112); at min no GPU node runs (no change)."""
    assert cli.main(["plan", "--stack", "prod", "--out", str(tmp_path / "base")]) == 0
    capsys.readouterr()
    config = stack_document("prod")
    pools = {g["name"]: g for g in config["triarch:nodeGroups"]}
    pools["a100"]["diskGiB"] = 1000
    pools["l4"]["max"] = 8
    head = write_stack_file(tmp_path / "Pulumi.prod.yaml", config)
    code, out, _ = run(capsys, "--base", str(tmp_path / "base"), "--stack-file", str(head))
    assert code == 0, out
    explained = out.split("  what moves the total:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert explained == [
        "    EBS root volumes (gp3: idle 1750 GiB, 150-3900 GiB): "
        "idle $100 -> $140 (+$40); at max $200 -> $312 (+$112)",
        "    pool l4: at max $4,282 -> $5,709 (+$1,427)"]
    code, out, _ = run(capsys, "--base", str(tmp_path / "base"), "--stack-file", str(head), "--format", "json")
    change = json.loads(out)["capacity"]
    for column in ("monthlyUsdIdle", "monthlyUsdAtMin", "monthlyUsdAtMax"):
        moved = change["total"]["after"][column] - change["total"]["before"][column]
        assert abs(moved - sum(line["change"][column] for line in change["lines"])) < 0.05, column
    code, out, _ = run(capsys, "--base", str(tmp_path / "base"), "--stack-file", str(head), "--format", "markdown")
    assert "What moves the total, line by line:" in out and "- pool l4: at max $4,282 -> $5,709 (+$1,427)" in out


def test_a_replaced_dependency_is_followed_into_a_list_input(base: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    """A new VPC range replaces the private subnets; the system node group takes their ids in `subnetIds`, a list
    EKS cannot change on a node group, so the group is replaced too (its nodes, where the Ray heads run, move)."""
    result = diff_plans(base["prod"], edited("prod", lambda c: c["triarch:cluster"].update(vpcCidr="10.9.0.0/16"),
                                             tmp_path))
    [group] = [d for d in result.of("replaced") if d.type == "aws:eks/nodeGroup:NodeGroup"]
    assert group.inputs == []  # nothing the plan knows differs: only the ids the subnets will get
    assert group.cause.startswith("subnetIds[0], subnetIds[1], subnetIds[2] take(s) a new value from ")
    assert all(f"llm-prod-net-private-us-east-1{z}" in group.cause for z in "abc")


def _list_inputs_from_dependencies(plan: dict[str, Any]) -> list[tuple[dict[str, Any], str, str]]:
    """(resource, list input, a resource its elements come from) for every replace-on-change input that is a list
    of values only the cloud knows, read from replacement.yaml and the plan (not from triarch.diff)."""
    by_urn = {r["urn"]: r for r in plan["resources"]}
    found = []
    for resource in plan["resources"]:
        rule = REPLACEMENT["types"].get(resource["type"]) or {}
        for path in rule.get("replaceOn") or []:
            value: Any = resource["inputs"]
            for key in path.split("."):
                value = value.get(key) if isinstance(value, dict) else None
            if isinstance(value, list) and "<known after apply>" in value:
                for urn in (resource.get("propertyDependencies") or {}).get(path.split(".")[0], []):
                    if urn in by_urn and (REPLACEMENT["types"].get(by_urn[urn]["type"]) or {}).get("replaceOn"):
                        found.append((resource, path, urn))
    return found


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_list_input_follows_the_replacement_of_what_fills_it(base: dict[str, dict[str, Any]],
                                                                   stack: str) -> None:
    """Each list input that forces replacement and takes ids from other resources: replace one of them (a change of
    its first replace-on-change input) and the resource holding the list is replaced, naming it."""
    pairs = _list_inputs_from_dependencies(base[stack])
    assert pairs, "the stack has list inputs filled by other resources (node groups' subnetIds)"
    for resource, path, urn in pairs:
        head = copy.deepcopy(base[stack])
        [source] = [r for r in head["resources"] if r["urn"] == urn]
        first = REPLACEMENT["types"][source["type"]]["replaceOn"][0]
        target: dict[str, Any] = source["inputs"]
        *parents, leaf = first.split(".")
        for key in parents:
            target = target.setdefault(key, {})
        target[leaf] = f"{target.get(leaf)}-changed"
        result = diff_plans(base[stack], head)
        replaced = {d.urn: d for d in result.of("replaced")}
        assert urn in replaced, (source["name"], first)
        assert resource["urn"] in replaced, (resource["name"], path, source["name"])
        assert f"{path}[" in replaced[resource["urn"]].cause and source["name"] in replaced[resource["urn"]].cause
