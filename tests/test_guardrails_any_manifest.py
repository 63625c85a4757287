"""The guardrails on workloads Triarch did not write: every kind that carries a GPU pod (bare Pods, Jobs,
LeaderWorkerSets, RayJobs and v1alpha1 Ray kinds, KServe), every accelerator, vLLM flags behind `$(VAR)`, and the
security rule's host namespaces, seccomp, capabilities and its exemptions for node agents."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
import yaml

from triarch.guardrails.base import Resource
from triarch.guardrails.check import evaluate
from triarch.guardrails.manifests import read_manifests
from triarch.guardrails.registry import RULES
from triarch.guardrails.workloads import command_line, pod_templates


def resources(text: str, tmp_path: Any) -> list[Resource]:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return read_manifests([str(path)])


def found(resources_: list[Resource], policy: str, config: dict[str, Any] | None = None) -> list[str]:
    return [f.message for f in evaluate(resources_, config) if f.rule.name == policy]


VLLM = {"name": "vllm", "image": "vllm/vllm-openai:v0.33.0", "resources": {"limits": {"nvidia.com/gpu": 1}}}
HEAD = {"name": "head", "image": "rayproject/ray:2.60.0"}


@pytest.mark.parametrize(("obj", "where"), [
    ({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [VLLM]}}, ["Pod p"]),
    ({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": {"name": "lws"},
      "spec": {"replicas": 2, "leaderWorkerTemplate": {
          "size": 2, "leaderTemplate": {"spec": {"containers": [VLLM]}},
          "workerTemplate": {"spec": {"containers": [VLLM]}}}}},
     ["LeaderWorkerSet lws leader", "LeaderWorkerSet lws workers"]),
    ({"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "job"},
      "spec": {"rayClusterSpec": {"headGroupSpec": {"template": {"spec": {"containers": [HEAD]}}},
                                  "workerGroupSpecs": [{"groupName": "g", "template": {"spec": {
                                      "containers": [VLLM]}}}]}}},
     ["RayJob job head", "RayJob job worker group g"]),
    ({"apiVersion": "ray.io/v1alpha1", "kind": "RayService", "metadata": {"name": "old"},
      "spec": {"rayClusterConfig": {"headGroupSpec": {"template": {"spec": {"containers": [HEAD]}}},
                                    "workerGroupSpecs": [{"groupName": "g", "template": {"spec": {
                                        "containers": [VLLM]}}}]}}},
     ["RayService old head", "RayService old worker group g"]),
    ({"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": "isvc"},
      "spec": {"predictor": {"minReplicas": 2, "model": {"modelFormat": {"name": "huggingface"},
                                                         "args": ["--model_name=llama"],
                                                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}}}},
     ["InferenceService isvc predictor"]),
    ({"apiVersion": "serving.kserve.io/v1alpha1", "kind": "LLMInferenceService", "metadata": {"name": "llm"},
      "spec": {"replicas": 2, "template": {"containers": [VLLM]}, "worker": {"containers": [VLLM]}}},
     ["LLMInferenceService llm template", "LLMInferenceService llm worker"]),
])
def test_every_kind_that_carries_a_gpu_pod_is_read(obj: dict[str, Any], where: list[str], tmp_path: Any) -> None:
    [resource] = resources(yaml.safe_dump(obj), tmp_path)
    templates = list(pod_templates(resource.type, resource.props, resource.name))
    assert [t.where for t in templates] == where
    # the rules see them: each GPU template (the heads hold none here) lacks CPU and memory requests
    assert len(found([resource], "gpu-server-resources")) == len([w for w in where if not w.endswith(" head")])


@pytest.mark.parametrize("accelerator", ["nvidia.com/gpu", "amd.com/gpu", "aws.amazon.com/neuron",
                                         "aws.amazon.com/neuroncore", "google.com/tpu"])
def test_a_ray_stop_prestop_is_refused_on_every_accelerator(accelerator: str, tmp_path: Any) -> None:
    worker = {"name": "worker", "image": "rayproject/ray-llm:2.60.0-py312-cu130",
              "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", "ray stop"]}}},
              "resources": {"limits": {accelerator: 1}}}
    obj = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "inf"},
           "spec": {"headGroupSpec": {"template": {"spec": {"containers": [{"name": "head",
                                                                              "image": "rayproject/ray:2.60.0"}]}}},
                    "workerGroupSpecs": [{"groupName": "acc", "replicas": 1,
                                          "template": {"spec": {"containers": [worker]}}}]}}
    messages = found(resources(yaml.safe_dump(obj), tmp_path), "prestop-drain")
    assert any("worker group acc" in m for m in messages), messages


def test_vllm_flags_behind_variables_are_read(tmp_path: Any) -> None:
    container = {**VLLM, "command": ["vllm", "serve"], "args": ["$(MODEL)", "--gpu-memory-utilization", "$(UTIL)"],
                 "env": [{"name": "MODEL", "value": "m"}, {"name": "UTIL", "value": "0.99"}]}
    assert command_line(container)[2:] == ["m", "--gpu-memory-utilization", "0.99"]
    obj = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
           "spec": {"template": {"spec": {"containers": [container]}}}}
    assert any("gpu_memory_utilization 0.99 > 0.95" in m
               for m in found(resources(yaml.safe_dump(obj), tmp_path), "vllm-memory-utilization"))


def agent(**pod: Any) -> dict[str, Any]:
    container = {"name": "agent", "image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless",
                 "securityContext": pod.pop("container_security", {})}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "dcgm-exporter", "namespace": "gpu"},
            "spec": {"template": {"spec": {**pod, "containers": [container]}}}}


@pytest.mark.parametrize(("obj", "words"), [
    (agent(hostNetwork=True), "hostNetwork is true"),
    (agent(hostIPC=True), "hostIPC is true"),
    (agent(securityContext={"seccompProfile": {"type": "Unconfined"}}), "seccompProfile Unconfined"),
    (agent(container_security={"seccompProfile": {"type": "Unconfined"}}), "seccompProfile Unconfined"),
    (agent(container_security={"capabilities": {"add": ["SYS_PTRACE"]}}), "adds ['SYS_PTRACE']"),
])
def test_host_namespaces_seccomp_and_capabilities_are_found(obj: dict[str, Any], words: str, tmp_path: Any) -> None:
    assert any(words in m for m in found(resources(yaml.safe_dump(obj), tmp_path), "no-privileged-pods"))


def test_a_node_agent_is_exempted_by_name_with_its_reason(tmp_path: Any) -> None:
    privileged = resources(yaml.safe_dump(agent(container_security={"capabilities": {"add": ["SYS_ADMIN"]}})),
                           tmp_path)
    exemption = {"namespace": "gpu", "name": "dcgm-exporter", "reason": "DCP profiling metrics need SYS_ADMIN"}
    assert found(privileged, "no-privileged-pods")
    assert found(privileged, "no-privileged-pods", {"no-privileged-pods": {"exempt": [exemption]}}) == []
    elsewhere = {**exemption, "namespace": "other"}
    assert found(privileged, "no-privileged-pods", {"no-privileged-pods": {"exempt": [elsewhere]}})
    assert found(privileged, "no-privileged-pods", {"no-privileged-pods": {"allowedCapabilities": ["SYS_ADMIN"]}}) == []
    [rule] = [r for r in RULES if r.name == "no-privileged-pods"]
    with pytest.raises(jsonschema.ValidationError):  # an exemption without a reason is refused by the pack's schema
        jsonschema.validate([{"name": "dcgm-exporter"}], rule.config["exempt"])


def test_the_gpu_toleration_is_expected_where_the_platform_does_not_add_it(tmp_path: Any) -> None:
    def deployment(selector: dict[str, str]) -> list[Resource]:
        obj = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
               "spec": {"template": {"spec": {"nodeSelector": selector, "containers": [VLLM]}}}}
        return resources(yaml.safe_dump(obj), tmp_path)

    eks = deployment({"karpenter.sh/nodepool": "gpu"})
    assert found(eks, "gpu-scheduling")
    assert {f.enforcement for f in evaluate(eks) if f.rule.name == "gpu-scheduling"} == {"advisory"}
    assert found(eks, "gpu-scheduling", {"gpu-scheduling": {"requireToleration": False}}) == []
    gke = deployment({"cloud.google.com/gke-accelerator": "nvidia-l4"})
    assert found(gke, "gpu-scheduling") == []  # GKE adds the toleration itself
    assert found(gke, "gpu-node-selection") == []


def node_exporter(**pod: Any) -> dict[str, Any]:
    obj = agent(**pod)
    obj["metadata"]["name"] = "node-exporter"
    [container] = obj["spec"]["template"]["spec"]["containers"]
    container["image"] = "mirror.example.com/quay/prometheus/node-exporter:v1.9.1"
    return obj


@pytest.mark.parametrize(("obj", "said", "not_said"), [
    # NVIDIA documents SYS_ADMIN for the DCGM exporter's profiling fields: the finding says so and what dropping
    # it costs, instead of "drop them"
    (agent(container_security={"capabilities": {"add": ["SYS_ADMIN"]}}),
     ["SYS_ADMIN is what NVIDIA's DCGM exporter needs for the profiling (DCP) fields, DCGM_FI_PROF_*",
      "https://docs.nvidia.com/datacenter/cloud-native/gpu-telemetry/latest/dcgm-exporter.html",
      "without it the exporter serves every other field", "listing this agent in `exempt`"], ["drop them"]),
    # a capability it does not document a need for, beside the one it does: refused as before
    (agent(container_security={"capabilities": {"add": ["SYS_ADMIN", "NET_RAW"]}}),
     ["SYS_ADMIN is what NVIDIA's DCGM exporter needs", "adds ['NET_RAW']; drop them"], ["adds ['NET_RAW', "]),
    # the node exporter's documented host namespaces, from a mirror's copy of its image (under a path of its own)
    (node_exporter(hostPID=True, hostNetwork=True),
     ["hostPID is what the Prometheus node exporter needs for the node's own processes",
      "hostNetwork is what the Prometheus node exporter needs for the node's own network interfaces"],
     ["remove it (or exempt"]),
    # one it does not document (hostIPC): refused as before
    (node_exporter(hostIPC=True), ["hostIPC is true; remove it"], ["is what"]),
    # the same privilege on an image that documents no need: refused as before
    (node_exporter(container_security={"capabilities": {"add": ["SYS_ADMIN"]}}), ["adds ['SYS_ADMIN']; drop them"],
     ["is what"]),
])
def test_a_privilege_a_node_agent_documents_is_named_with_its_need_and_cost(
        obj: dict[str, Any], said: list[str], not_said: list[str], tmp_path: Any) -> None:
    messages = found(resources(yaml.safe_dump(obj), tmp_path), "no-privileged-pods")
    text = "\n".join(messages)
    assert all(words in text for words in said), messages
    assert not any(words in text for words in not_said), messages
