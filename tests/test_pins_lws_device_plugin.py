"""Pins of the LeaderWorkerSet and NVIDIA device plugin settings a user relies on (issue 53), each checked against
upstream's behaviour at the pinned versions (LWS v0.10.0, nvidia-device-plugin 0.20.0, templates/compat/charts.yaml)
and against the stack's own facts (the pools' taints and labels as planned), never against the planner's constants."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import StackPlan, compat_data, plan_config, stack_document

RELEASE = "kubernetes:helm.sh/v3:Release"


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    """Kubernetes' rule: a toleration matches a taint of its key (or any key, with no key and Exists) and effect (or
    any, with none), and its value unless the operator is Exists."""
    for t in tolerations:
        key_ok = t.get("key") == taint["key"] or (t.get("key") in (None, "") and t.get("operator") == "Exists")
        effect_ok = t.get("effect") in (None, "", taint["effect"])
        value_ok = t.get("operator") == "Exists" or t.get("value", "") == taint.get("value", "")
        if key_ok and effect_ok and value_ok:
            return True
    return False


def release_values(plan: StackPlan, name: str) -> dict[str, Any]:
    [release] = [r for r in plan.of_type(RELEASE) if r.inputs.get("name") == name]
    values: dict[str, Any] = release.inputs["values"]
    return values


def gpu_taints(plan: StackPlan) -> list[dict[str, Any]]:
    """The taints of the stack's GPU pools, as their Karpenter NodePools carry them."""
    taints = [t for pool in plan.objects("NodePool") for t in pool["spec"]["template"]["spec"].get("taints", [])]
    assert taints
    return taints


# --- LeaderWorkerSet -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gangs(tmp_path_factory: pytest.TempPathFactory) -> StackPlan:
    """The shipped large stack with DeepSeek-V3 alone, at two replicas: each replica spans two p5.48xlarge."""
    config = stack_document("large")
    config["triarch:models"] = config["triarch:models"][:1]
    config["triarch:models"][0]["replicas"] = 2
    return plan_config("gangs", config, tmp_path_factory.mktemp("gangs"))


def lws_spec(plan: StackPlan) -> dict[str, Any]:
    [lws] = plan.objects("LeaderWorkerSet")
    spec: dict[str, Any] = lws["spec"]
    return spec


def test_a_leaderworkerset_runs_a_group_per_replica_the_stack_asks_for(gangs: StackPlan) -> None:
    """LWS's spec.replicas counts groups (one per model replica, the stack's `replicas: 2`), and a group's size its
    pods (DeepSeek-V3's 627 GiB over 2 nodes of 8 H100s: the stack file's comment)."""
    spec = lws_spec(gangs)
    assert spec["replicas"] == 2 and spec["leaderWorkerTemplate"]["size"] == 2


def test_workers_start_with_their_leader_not_after_it_is_ready(gangs: StackPlan) -> None:
    """LWS startupPolicy LeaderReady creates the workers only once the leader pod is Ready, and vLLM's leader is not
    Ready before its headless workers joined (--nnodes): the group would never start. LeaderCreated (LWS API v1)
    creates them together."""
    assert lws_spec(gangs)["startupPolicy"] == "LeaderCreated"


def test_each_group_gets_a_headless_service_of_its_own(gangs: StackPlan) -> None:
    """LWS's default subdomainPolicy (Shared) makes one headless Service named after the set, which is the name of
    the model's own ClusterIP Service: UniquePerReplica names one per group after its leader instead."""
    assert lws_spec(gangs)["networkConfig"] == {"subdomainPolicy": "UniquePerReplica"}
    [service] = [s for s in gangs.objects("Service") if s["metadata"]["name"] == "deepseek"]
    assert service["spec"]["type"] == "ClusterIP"


def test_workers_land_on_the_models_gpu_pool_past_its_taint(gangs: StackPlan) -> None:
    """A worker pod takes a whole GPU node of the model's pool: it selects the pool (stack: nodeGroup h100) and
    tolerates the taint that pool's nodes carry (else it stays Pending and the group never starts)."""
    worker = lws_spec(gangs)["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    assert worker["nodeSelector"]["triarch.dev/pool"] == "h100"
    assert all(tolerates(worker["tolerations"], taint) for taint in gpu_taints(gangs))
    [container] = worker["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"  # p5.48xlarge: 8 GPUs (instances.yaml)


def test_the_lws_controller_meets_the_restricted_pod_security_level(gangs: StackPlan) -> None:
    """lws-system enforces `restricted`, which (Kubernetes Pod Security Standards) requires runAsNonRoot and a
    RuntimeDefault or Localhost seccomp profile: the chart's values.yaml sets neither seccomp nor, at v0.10.0, its
    image tag (`main`), so the release's values must."""
    [namespace] = [n for n in gangs.objects("Namespace") if n["metadata"]["name"] == "lws-system"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    values = release_values(gangs, "lws")
    assert values["podSecurityContext"]["runAsNonRoot"] is True
    assert values["podSecurityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert values["image"]["manager"]["tag"] == compat_data("charts")["charts"]["lws"]["version"]


def test_leaderworkersets_wait_for_the_webhooks_certificate(gangs: StackPlan) -> None:
    """The chart's webhooks fail closed and get their caBundle only once the manager rotates its certificate: each
    webhook configuration (the chart's names under release lws) is awaited until its caBundle is set, and the
    model's LeaderWorkerSet is created after both."""
    patches = {r.inputs["metadata"]["name"]: r for r in gangs.resources if r.type.endswith("WebhookConfigurationPatch")}
    assert set(patches) == {"lws-mutating-webhook-configuration", "lws-validating-webhook-configuration"}
    for patch in patches.values():
        annotations = patch.inputs["metadata"]["annotations"]
        assert annotations["pulumi.com/waitFor"] == "jsonpath={.webhooks[0].clientConfig.caBundle}"
        assert int(annotations["pulumi.com/timeoutSeconds"]) >= 300  # Helm's own default wait
    [lws] = [r for r in gangs.resources if r.type.endswith(":LeaderWorkerSet")]
    waits = set(lws.dependencies) | set(gangs.dependencies.get(lws.parent or "", []))
    assert {p.urn for p in patches.values()} <= waits


# --- NVIDIA device plugin --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sliced(tmp_path_factory: pytest.TempPathFactory) -> StackPlan:
    """The shipped dev stack with its L4 pool time-sliced four ways."""
    config = stack_document("dev")
    config["triarch:nodeGroups"][0]["timeSlicing"] = {"replicas": 4}
    return plan_config("sliced", config, tmp_path_factory.mktemp("sliced"))


def test_the_device_plugin_is_not_evicted_before_the_workloads_it_serves(sliced: StackPlan) -> None:
    """Without the device plugin a node advertises no GPUs: it runs at system-node-critical priority (Kubernetes'
    "Guaranteed Scheduling For Critical Add-On Pods"), as NVIDIA's static manifest does."""
    assert release_values(sliced, "nvidia-device-plugin")["priorityClassName"] == "system-node-critical"


def test_the_device_plugin_and_its_labellers_run_on_the_tainted_gpu_nodes(sliced: StackPlan) -> None:
    """The plugin's DaemonSet and node-feature-discovery's worker (which GPU feature discovery's labels go through)
    must tolerate the pools' GPU taint; the chart's own NFD worker toleration is replaced by the values' list, so an
    empty list there would leave the GPU nodes unlabelled. The plugin selects nodes labelled nvidia.com/gpu.present,
    which the GPU pools' nodes carry from boot."""
    values = release_values(sliced, "nvidia-device-plugin")
    for taint in gpu_taints(sliced):
        assert tolerates(values["tolerations"], taint), values["tolerations"]
        assert tolerates(values["nfd"]["worker"]["tolerations"], taint), values["nfd"]
    assert values["gfd"] == {"enabled": True}  # docs/stack-keys.md: gpuFeatureDiscovery defaults to true
    [term] = values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    for pool in sliced.objects("NodePool"):
        labels = pool["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(e["key"]) in e["values"] for e in term["matchExpressions"] if e["operator"] == "In")


def test_a_time_sliced_pool_gets_its_slices_and_other_nodes_whole_gpus(sliced: StackPlan) -> None:
    """The pool's nodes name their config (label nvidia.com/device-plugin.config, read by the plugin's config
    manager) and that config shares each GPU 4 ways (the stack's timeSlicing.replicas), refusing a request for more
    than one slice (failRequestsGreaterThanOne: a pod asking 2 would get 2 slices of one GPU). A node without the
    label gets config.default, which must be an entry of the map and share nothing."""
    config = release_values(sliced, "nvidia-device-plugin")["config"]
    [pool] = sliced.objects("NodePool")
    name = pool["spec"]["template"]["metadata"]["labels"]["nvidia.com/device-plugin.config"]
    sharing = yaml.safe_load(config["map"][name])["sharing"]["timeSlicing"]
    assert sharing["failRequestsGreaterThanOne"] is True
    assert sharing["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]
    default = yaml.safe_load(config["map"][config["default"]])
    assert default == {"version": "v1"}


def test_gpu_feature_discovery_off_leaves_nfd_out(tmp_path: Path) -> None:
    """`triarch:devicePlugin: {gpuFeatureDiscovery: false}` turns the chart's GFD off, and with it the NFD worker
    the values would otherwise configure."""
    config = stack_document("dev")
    config["triarch:devicePlugin"] = {"gpuFeatureDiscovery": False}
    values = release_values(plan_config("nogfd", config, tmp_path), "nvidia-device-plugin")
    assert values["gfd"] == {"enabled": False} and "nfd" not in values
