"""What a change does to running traffic, as users' edits of prod meet it (triarch.effects): the controllers'
reactions the resource tables do not show. KubeRay's, Karpenter's and Pulumi's own behaviours are cited in the
module; the real-engine tier shows KubeRay's new cluster on an image change (tests/test_real_ray.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import StackPlan, plan_config, stack_document, write_stack_file
from triarch import cli
from triarch.diff import diff_plans
from triarch.effects import _transient_gpus, _transient_serve_gpus, traffic_effects
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
    # embed's pods ask for the larger node's CPU and memory: a new pod template, so they roll too
    assert found[0].startswith("Deployment deployment-llm-embed: every pod is replaced with the new pod template")
    assert "(caused by spec.template.spec.containers[0].resources.limits.cpu" in found[0]
    assert found[1] == ("NodePool nodepool-l4: Karpenter replaces every node of the pool (drift), as its disruption "
                        "budget allows; their pods move")
    assert found[2].startswith("RayService rayservice-llm-llm: KubeRay starts a new Ray cluster")
    assert "workerGroupSpecs[1].template.spec.containers[0].resources" in found[2] and len(found) == 3


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


def test_a_renamed_ray_serve_model_tells_its_clients_and_waits_for_the_old_replicas(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """qwen -> qwen3 on prod: the route and model id change for clients, and Ray Serve starts qwen3 as it stops qwen
    within l4-1gpu's maxReplicas (3, qwen's own most): at qwen's most, qwen3 waits for it. Adding qwen3 first and
    removing qwen in a second step runs both at once."""
    assert cli.main(["plan", "--stack", "prod", "--out", str(tmp_path / "base")]) == 0
    config = stack_document("prod")
    next(m for m in config["triarch:models"] if m["name"] == "qwen")["name"] = "qwen3"
    (tmp_path / "head").mkdir()
    head = write_stack_file(tmp_path / "head" / "Pulumi.prod.yaml", config)
    capsys.readouterr()
    assert cli.main(["diff", "--base", str(tmp_path / "base"), "--stack-file", str(head), "--format", "json"]) == 0
    effects = json.loads(capsys.readouterr().out)["effects"]
    assert effects[1:] == [
        "clients: Ray Serve application(s) qwen (/qwen) of RayService llm go, qwen3 (/qwen3) come: clients calling "
        "the old route (and served model name) fail until they change",
        "pool l4: Ray Serve stops qwen as it starts qwen3 (one serveConfigV2); at their most that is 4 GPU(s) at "
        "once, and its Ray worker groups hold 3 (maxReplicas): qwen3 wait(s) for qwen to stop "
        "(graceful_shutdown_timeout_s); to run both at once, add qwen3 in one `pulumi up` and remove qwen in the next"]
    # the two steps: qwen3 beside qwen (the plan asks l4 to hold both, and a RayService upgrade), then qwen goes
    both = stack_document("prod")
    both["triarch:models"].append({**next(m for m in both["triarch:models"] if m["name"] == "qwen"), "name": "qwen3"})
    pool(both, "l4")["max"] = 10
    (tmp_path / "both").mkdir()
    write_stack_file(tmp_path / "both" / "Pulumi.prod.yaml", both)
    assert cli.main(["plan", "--stack-file", str(tmp_path / "both" / "Pulumi.prod.yaml"),
                     "--out", str(tmp_path / "both-plan")]) == 0
    capsys.readouterr()
    second_head = stack_document("prod")
    next(m for m in second_head["triarch:models"] if m["name"] == "qwen")["name"] = "qwen3"
    pool(second_head, "l4")["max"] = 10
    (tmp_path / "second").mkdir()
    head = write_stack_file(tmp_path / "second" / "Pulumi.prod.yaml", second_head)
    assert cli.main(["diff", "--base", str(tmp_path / "both-plan"), "--stack-file", str(head), "--format", "json"]) == 0
    second = json.loads(capsys.readouterr().out)["effects"]
    assert not [e for e in second if "wait" in e]
    assert "clients: Ray Serve application(s) qwen (/qwen) of RayService llm go: clients calling the old route" in \
        " ".join(second)


def test_a_removed_ray_serve_models_gpus_count_while_it_stops() -> None:
    """The pool, not the worker groups, binds when other models fill it: 2 fixed vLLM GPUs on a 4-GPU pool."""
    base = {"models": [{"name": "qwen", "engine": "ray-serve", "pool": "l4", "replicasMin": 1, "replicasMax": 2,
                        "gpusPerReplica": 1}]}
    head = {"models": [{"name": "qwen3", "engine": "ray-serve", "pool": "l4", "replicasMin": 1, "replicasMax": 2,
                        "gpusPerReplica": 1},
                       {"name": "embed", "engine": "vllm", "pool": "l4", "replicasMin": 2, "replicasMax": 2,
                        "gpusPerReplica": 1}],
            "pools": [{"name": "l4", "gpusAtMax": 4}]}
    assert _transient_serve_gpus(base, head) == [
        "pool l4: Ray Serve stops qwen as it starts qwen3 (one serveConfigV2); at their most that is 3 GPU(s) at once, "
        "and its Ray worker groups hold 2 (maxReplicas): qwen3 wait(s) for qwen to stop (graceful_shutdown_timeout_s); "
        "to run both at once, add qwen3 in one `pulumi up` and remove qwen in the next"]
    at_min = {"models": [{**base["models"][0], "replicasMax": 1}]}
    roomy = {**head, "models": [{**head["models"][0], "replicasMax": 3}, head["models"][1]]}
    assert _transient_serve_gpus(at_min, roomy) == [], "1 + 1 GPUs beside embed's 2 fit the pool's 4"
    full = {**head, "pools": [{"name": "l4", "gpusAtMax": 3}], "models": [{**head["models"][0], "replicasMax": 3},
                                                                          head["models"][1]]}
    assert _transient_serve_gpus(at_min, full) == [
        "pool l4: Ray Serve stops qwen as it starts qwen3 (one serveConfigV2); at their most that is 2 GPU(s) at once, "
        "and the pool holds 3, 2 of them for other models: qwen3 wait(s) for qwen to stop "
        "(graceful_shutdown_timeout_s); to run both at once, add qwen3 in one `pulumi up` and remove qwen in the next"]


def test_a_kubernetes_upgrade_drifts_every_karpenter_pool(prod: dict[str, Any], tmp_path: Path) -> None:
    """1.35 -> 1.36: the system node group rolls onto its new release, and each EC2NodeClass's AMI alias resolves
    for the new version, so Karpenter replaces the GPU nodes although no class changes."""
    found = effects_of(prod, lambda c: c["triarch:cluster"].update(kubernetesVersion="1.36"), tmp_path)
    assert found == [
        "node group llm-prod-system: EKS rolls its nodes one by one; their pods move",
        *(f"EC2NodeClass ec2nodeclass-{pool}: its AMI alias resolves for the new Kubernetes version, so Karpenter "
          "replaces every node launched with it (drift) once the control plane is upgraded; their pods move"
          for pool in ("a100", "l4"))]


def test_a_renamed_cluster_moves_everything_and_drifts_nothing(prod: dict[str, Any], tmp_path: Path) -> None:
    """llm-prod -> llm-prod2: a new EKS cluster, so its Kubernetes provider targets another cluster and every object
    is created there: said once, without the drift or Ray upgrade its changed node classes would otherwise read as."""
    found = effects_of(prod, lambda c: c["triarch:cluster"].update(name="llm-prod2"), tmp_path)
    assert found == ["cluster: 45 Kubernetes resource(s) move to another cluster (llm-prod-k8s -> llm-prod2-k8s): "
                     "every model starts there from no node, and clients move to its endpoint; the old cluster serves "
                     "until Pulumi deletes it, last"]


def test_a_ray_models_larger_max_waits_for_the_next_ray_cluster(prod: dict[str, Any], tmp_path: Path) -> None:
    """chat's max 4 -> 5: Serve may run a fifth replica at once (serveConfigV2, redeployed in place), but its worker
    group's maxReplicas is outside KubeRay's cluster hash, so the running cluster keeps the old bound and the Ray
    autoscaler starts no fifth worker until a change that starts a new cluster."""
    found = effects_of(prod, lambda c: next(m for m in c["triarch:models"] if m["name"] == "chat").update(
        autoscaling={"min": 1, "max": 5}), tmp_path)
    assert found == [
        "RayService rayservice-llm-llm: the Serve applications are redeployed on the running Ray cluster "
        "(serveConfigV2); the changed models' replicas restart, the others keep serving",
        "RayService rayservice-llm-llm: KubeRay does not apply spec.rayClusterConfig.workerGroupSpecs[0].maxReplicas "
        "to the running Ray cluster (worker counts, tolerations and scheduling gates alone start no new cluster and "
        "update none): the Ray autoscaler keeps the old bounds until a change that starts a new cluster"]


# --- a pod template that changes rolls every pod (issue 36) ------------------------------------------------------

VLLM_DIGEST = "vllm/vllm-openai:v0.33.0@sha256:" + "a" * 64


def test_an_image_change_rolls_every_pod_of_the_deployment(prod: dict[str, Any], tmp_path: Path) -> None:
    """The vLLM image pinned by digest: embed's Deployment replaces its pods (the one Triarch object whose pods run
    that image on prod; the Ray models run ray-llm). On one-GPU L4 nodes with no GPU to spare its rolling update
    stops an old replica before the new one starts (maxSurge 0, maxUnavailable 1)."""
    found = effects_of(prod, lambda c: c.update({"triarch:images": {"vllm": VLLM_DIGEST}}), tmp_path)
    assert found == ["Deployment deployment-llm-embed: every pod is replaced onto the new image, one rolling update "
                     "(maxSurge 0, maxUnavailable 1: each old replica stops before its replacement starts, so fewer "
                     "serve until each new one is Ready); each new replica starts cold before it serves (caused by "
                     "spec.template.spec.containers[0].image)"]


def test_any_pod_template_change_rolls_the_pods_and_metadata_alone_does_not() -> None:
    """A changed engine arg rolls the pods as an image does; a label on the Deployment itself rolls nothing."""
    from triarch.diff import Diff, Difference
    deployment = "kubernetes:apps/v1:Deployment"
    head = {"resources": [{"urn": "u", "type": deployment, "name": "d", "inputs": {"spec": {"strategy": {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}}}}]}
    args = Difference("changed", deployment, "d", "u", ["spec.template.spec.containers[0].args[3]"], False, "")
    assert traffic_effects(Diff([args]), head, head, None, None) == [
        "Deployment d: every pod is replaced with the new pod template, one rolling update (maxSurge 1, "
        "maxUnavailable 0: new replicas start before old ones stop); each new replica starts cold before it serves "
        "(caused by spec.template.spec.containers[0].args[3])"]
    label = Difference("changed", deployment, "d", "u", ["metadata.labels.team", "spec.replicas"], False, "")
    assert traffic_effects(Diff([label]), head, head, None, None) == []


def test_an_image_change_rolls_every_group_of_a_leaderworkerset(shipped: dict[str, StackPlan], tmp_path: Path) -> None:
    """large's DeepSeek-V3 spans two nodes as one LeaderWorkerSet group: the group is what rolls, one more group
    first (maxSurge 1, maxUnavailable 0)."""
    base = document(shipped["large"])
    config = stack_document("large")
    config["triarch:images"] = {"vllm": VLLM_DIGEST}
    head = document(plan_config("large", config, tmp_path))
    found = [e for e in traffic_effects(diff_plans(base, head), base, head, None, None) if "LeaderWorkerSet" in e]
    assert found == ["LeaderWorkerSet leaderworkerset-llm-deepseek: every pod group is replaced onto the new image, "
                     "one rolling update (maxSurge 1, maxUnavailable 0: new groups start before old ones stop); each "
                     "new group starts cold before it serves (caused by spec.leaderWorkerTemplate.leaderTemplate.spec"
                     ".containers[0].image, spec.leaderWorkerTemplate.workerTemplate.spec.containers[0].image)"]


ROUTING_RESTART = ("a new LLMConfig, so Ray Serve rebuilds the application and restarts its replicas, a fifth at a "
                   "time (at least one), each stopped before its replacement starts: fewer replicas serve until it "
                   "ends (a one-replica model none), and each new replica's prefix cache starts empty")


def test_turning_prefix_routing_off_redeploys_the_application(prod: dict[str, Any], tmp_path: Path) -> None:
    found = effects_of(prod, lambda c: next(m for m in c["triarch:models"] if m["name"] == "chat").update(
        prefixRouting={"enabled": False}), tmp_path)
    assert found == ["RayService rayservice-llm-llm: the Serve applications are redeployed on the running Ray "
                     "cluster (serveConfigV2); the changed models' replicas restart, the others keep serving",
                     f"RayService rayservice-llm-llm: prefix-aware routing turns off for chat: {ROUTING_RESTART}"]


def test_prefix_caching_off_turns_routing_off_and_says_so(prod: dict[str, Any], tmp_path: Path) -> None:
    def edit(config: dict[str, Any]) -> None:
        for model in config["triarch:models"]:
            if model["engine"] == "ray-serve":
                model["prefixCaching"] = False
    found = effects_of(prod, edit, tmp_path)
    assert found[1] == ("RayService rayservice-llm-llm: prefix-aware routing turns off for chat, qwen: "
                        f"{ROUTING_RESTART}")
    assert len(found) == 2


def test_tuning_the_router_is_no_routing_change(prod: dict[str, Any], tmp_path: Path) -> None:
    found = effects_of(prod, lambda c: next(m for m in c["triarch:models"] if m["name"] == "qwen").update(
        prefixRouting={"imbalancedThreshold": 2}), tmp_path)
    assert found == ["RayService rayservice-llm-llm: the Serve applications are redeployed on the running Ray "
                     "cluster (serveConfigV2); the changed models' replicas restart, the others keep serving"]


def test_routing_turned_on_with_a_new_ray_cluster_starts_there(prod: dict[str, Any], tmp_path: Path) -> None:
    """From a base where chat kept Serve's default router: a100's max raised in the same change starts a
    new Ray cluster, where chat starts routing by prefix."""
    base_config = stack_document("prod")
    next(m for m in base_config["triarch:models"] if m["name"] == "chat")["prefixRouting"] = {"enabled": False}
    base = document(plan_config("prod", base_config, tmp_path / "base"))

    def edit(config: dict[str, Any]) -> None:
        pool(config, "a100").update(max=3)
    head_config = stack_document("prod")
    edit(head_config)
    head = document(plan_config("prod", head_config, tmp_path / "head"))
    found = traffic_effects(diff_plans(base, head), base, head, None, None)
    assert found[0].startswith("RayService rayservice-llm-llm: KubeRay starts a new Ray cluster")
    assert found[1:] == ["RayService rayservice-llm-llm: prefix-aware routing turns on for chat on the new Ray "
                         "cluster, where every model starts anyway"]
