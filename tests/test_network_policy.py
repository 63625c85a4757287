"""Who may talk to the serving pods, and what they may reach, decided by evaluating the planned NetworkPolicies
(the Kubernetes semantics, written here from the API reference) on concrete connections: a policy's exact
shape is free to change, what it lets through is not."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from ipaddress import ip_address, ip_network
from typing import Any

import pytest

from conftest import StackPlan
from triarch.config import from_pulumi_config
from triarch.planners import pods
from triarch.planners.serving import network_policies, serving_settings

# --- NetworkPolicy semantics (networking.k8s.io/v1), independent of the planner --------------------------------


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str] = field(default_factory=dict)
    ip: str = "10.0.200.1"


@dataclass(frozen=True)
class Address:
    """A destination outside any pod: a Service's cluster IP before translation, a node, the internet."""

    ip: str


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        value = labels.get(expression["key"])
        operator = expression["operator"]
        if operator == "In" and value not in expression["values"]:
            return False
        if operator == "NotIn" and value in expression["values"]:
            return False
        if operator == "Exists" and value is None:
            return False
        if operator == "DoesNotExist" and value is not None:
            return False
    return True


def peer_matches(peer: dict[str, Any], policy_namespace: str, other: Pod | Address) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        ip = ip_address(other.ip)
        return ip in ip_network(block["cidr"]) and not any(ip in ip_network(e) for e in block.get("except", []))
    if isinstance(other, Address):
        return False
    if "namespaceSelector" in peer:
        namespace_labels = {"kubernetes.io/metadata.name": other.namespace}
        if not selects(peer["namespaceSelector"], namespace_labels):
            return False
    elif other.namespace != policy_namespace:
        return False
    return selects(peer.get("podSelector", {}), other.labels)


def port_matches(ports: list[dict[str, Any]] | None, port: int, protocol: str) -> bool:
    return ports is None or any(p.get("protocol", "TCP") == protocol and p.get("port") == port for p in ports)


def admitted(policies: list[dict[str, Any]], pod: Pod, direction: str, other: Pod | Address, port: int,
             protocol: str) -> bool:
    """Whether the policies selecting `pod` let this connection through in `direction` (Ingress or Egress): a
    pod no policy of that direction selects is open; a selected pod admits what any rule of any of them allows."""
    key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    selecting = [p for p in policies if p["metadata"]["namespace"] == pod.namespace
                 and direction in p["spec"].get("policyTypes", ["Ingress"])
                 and selects(p["spec"]["podSelector"], pod.labels)]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get(key, []):
            peers = rule.get(peers_key)
            if (peers is None or any(peer_matches(peer, pod.namespace, other) for peer in peers)) and \
                    port_matches(rule.get("ports"), port, protocol):
                return True
    return False


def connects(policies: list[dict[str, Any]], source: Pod, target: Pod | Address, port: int,
             protocol: str = "TCP") -> bool:
    out = admitted(policies, source, "Egress", target, port, protocol)
    return out and (isinstance(target, Address) or admitted(policies, target, "Ingress", source, port, protocol))


def test_the_evaluator_itself() -> None:
    """The evaluator is test code: pin it on policies written by hand."""
    deny = {"metadata": {"namespace": "a"}, "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": []}}
    web = {"metadata": {"namespace": "a"}, "spec": {
        "podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"],
        "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}],
                    "ports": [{"port": 443}]}]}}
    web_pod, other_pod = Pod("a", {"app": "web"}), Pod("a", {"app": "db"})
    assert connects([], web_pod, Address("10.1.1.1"), 22)
    assert not connects([deny], web_pod, Address("1.1.1.1"), 443)
    assert connects([deny, web], web_pod, Address("1.1.1.1"), 443)
    assert not connects([deny, web], web_pod, Address("10.1.1.1"), 443)
    assert not connects([deny, web], web_pod, Address("1.1.1.1"), 80)
    assert not connects([deny, web], web_pod, Address("1.1.1.1"), 443, "UDP")
    assert not connects([deny, web], other_pod, Address("1.1.1.1"), 443)
    ingress = {"metadata": {"namespace": "b"}, "spec": {"podSelector": {}, "ingress": [{"from": [
        {"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                                     "values": ["a"]}]}}]}]}}
    assert connects([ingress], Pod("a"), Pod("b"), 1)
    assert not connects([ingress], Pod("c"), Pod("b"), 1)
    same_namespace = {"metadata": {"namespace": "b"}, "spec": {"podSelector": {}, "ingress": [
        {"from": [{"podSelector": {}}]}]}}
    assert connects([same_namespace], Pod("b"), Pod("b"), 1)
    assert not connects([same_namespace], Pod("a"), Pod("b"), 1)


# --- the shipped stacks -------------------------------------------------------------------------------------------

HEAD_LABELS = {"ray.io/is-ray-node": "yes", "ray.io/node-type": "head", "ray.io/cluster": "llm"}
WORKER_LABELS = {"ray.io/is-ray-node": "yes", "ray.io/node-type": "worker", "ray.io/cluster": "llm"}
"""The labels KubeRay puts on the pods it creates (ray-operator/controllers/ray/common/pod.go)."""
API_SERVICE = Address("172.20.0.1")
"""The `kubernetes` Service's cluster IP as EKS assigns it to a cluster whose VPC is in 10.0.0.0/8."""
API_ENDPOINT = Address("10.0.13.7")
"""An address of the API server's private endpoint (an ENI in the VPC's private subnets)."""
KUBELET = Address("10.0.3.4")
IMDS = Address("169.254.169.254")
HUB = Address("18.239.50.8")
"""A public address, as the Hugging Face hub and its CDN resolve to."""
COREDNS = Pod("kube-system", {"k8s-app": "kube-dns", "eks.amazonaws.com/component": "coredns"}, "10.0.1.10")
KUBERAY = Pod("kuberay-system", {"app.kubernetes.io/name": "kuberay-operator"})


def policies_of(plan: StackPlan) -> list[dict[str, Any]]:
    return plan.objects("NetworkPolicy")


def vllm_pod(plan: StackPlan, model: str) -> Pod:
    [deployment] = [d for d in plan.objects("Deployment") if d["metadata"]["name"] == model]
    return Pod(deployment["metadata"]["namespace"], dict(deployment["spec"]["template"]["metadata"]["labels"]))


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_serving_pods_reach_dns_the_hub_and_each_other_only(shipped: dict[str, StackPlan], stack: str) -> None:
    plan = shipped[stack]
    policies = policies_of(plan)
    server = vllm_pod(plan, "embed")
    neighbour = Pod(server.namespace, {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": "other"})
    assert connects(policies, server, COREDNS, 53, "UDP")
    assert connects(policies, server, COREDNS, 53, "TCP")
    assert connects(policies, server, HUB, 443)
    assert connects(policies, server, neighbour, 8000)
    # Not the API server (by its Service or its endpoint), not the nodes, not instance metadata, not plain HTTP,
    # not DNS anywhere but the cluster's, not other namespaces.
    for address, port in ((API_SERVICE, 443), (API_ENDPOINT, 443), (KUBELET, 10250), (KUBELET, 443), (IMDS, 80),
                          (HUB, 80), (Address("8.8.8.8"), 53)):
        assert not connects(policies, server, address, port), (address, port)
    assert not connects(policies, server, Pod("monitoring", {"app": "prometheus"}), 9090)
    assert not connects(policies, server, Pod("kube-system", {"k8s-app": "kube-dns"}), 443)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_openai_port_admits_the_named_client_namespaces_only(shipped: dict[str, StackPlan], stack: str) -> None:
    plan = shipped[stack]
    policies = policies_of(plan)
    server = vllm_pod(plan, "embed")
    clients = plan.config.get("triarch:serving", {}).get("clientNamespaces", [])
    assert clients == (["gateway"] if stack == "prod" else [])
    assert connects(policies, Pod(server.namespace, {"app": "smoke-test"}), server, 8000)
    assert connects(policies, Pod("gateway", {"app": "envoy"}), server, 8000) == (stack == "prod")
    for namespace in ("default", "kube-system", "kuberay-system", "gateway-system"):
        assert not connects(policies, Pod(namespace), server, 8000), namespace
    assert not connects(policies, Pod("gateway"), server, 8265)
    assert not connects(policies, Pod("gateway"), server, 22)


def test_ray_pods_talk_to_each_other_and_only_the_head_reaches_the_api_server(shipped: dict[str, StackPlan]) -> None:
    plan = shipped["prod"]
    policies = policies_of(plan)
    namespace = vllm_pod(plan, "embed").namespace
    head, worker = Pod(namespace, HEAD_LABELS, "10.0.20.1"), Pod(namespace, WORKER_LABELS, "10.0.20.2")
    for port in (6379, 8265, 10001, 52365):  # GCS, dashboard, client, agent: Ray's own traffic
        assert connects(policies, worker, head, port)
        assert connects(policies, head, worker, port)
    assert connects(policies, head, API_SERVICE, 443)
    assert connects(policies, head, API_ENDPOINT, 443)
    assert not connects(policies, worker, API_SERVICE, 443)
    assert not connects(policies, vllm_pod(plan, "embed"), API_SERVICE, 443)
    assert not connects(policies, head, KUBELET, 10250)
    # The operator submits the Serve config through the dashboard, and nothing else of Ray's is open to it.
    assert connects(policies, KUBERAY, head, 8265)
    for port in (6379, 10001, 8000):
        assert not connects(policies, KUBERAY, head, port)
    assert not connects(policies, Pod("gateway"), head, 8265)
    assert not connects(policies, Pod("default"), head, 6379)


# --- settings the stack may change (pure planner, no engine) ------------------------------------------------------

def policies_for(stack_config: dict[str, Any], with_ray: bool = True) -> list[dict[str, Any]]:
    settings = serving_settings(from_pulumi_config(stack_config), with_token=False)
    return network_policies(settings, with_ray)


def config_with(base: dict[str, Any], **serving: Any) -> dict[str, str]:
    """A stack's YAML config with its `triarch:serving` replaced, as the engine hands it to the program."""
    values = {k: v if isinstance(v, str) else json.dumps(v) for k, v in base.items()}
    values["triarch:serving"] = json.dumps(serving)
    return values


@pytest.fixture
def dev_values(shipped: dict[str, StackPlan]) -> dict[str, Any]:
    return copy.deepcopy(shipped["dev"].config)


def test_a_hub_proxy_inside_the_vpc_is_the_only_way_out(dev_values: dict[str, Any]) -> None:
    policies = policies_for(config_with(dev_values, namespace="llm", hubCidrs=["10.0.40.12/32"]))
    server = Pod("llm", {"app.kubernetes.io/name": "vllm"})
    assert connects(policies, server, Address("10.0.40.12"), 443)
    assert not connects(policies, server, HUB, 443)
    assert not connects(policies, server, API_SERVICE, 443)
    assert not connects(policies, server, Address("10.0.40.13"), 443)


def test_a_vpc_outside_the_private_ranges_is_kept_out_too(dev_values: dict[str, Any]) -> None:
    dev_values["triarch:cluster"]["vpcCidr"] = "100.64.0.0/16"
    policies = policies_for(config_with(dev_values, namespace="llm"))
    server = Pod("llm", {"app.kubernetes.io/name": "vllm"})
    assert not connects(policies, server, Address("100.64.3.4"), 443)
    assert not connects(policies, server, API_SERVICE, 443)
    assert connects(policies, server, Address("100.65.3.4"), 443)
    head = Pod("llm", HEAD_LABELS)
    assert connects(policies, head, Address("100.64.3.4"), 443)


def test_an_adopted_clusters_api_server_port_is_open_to_the_head_only() -> None:
    settings = pods.ServingSettings("llm", None, "ReadWriteOnce", with_token=False)
    policies = network_policies(settings, with_ray=True)
    head, server = Pod("llm", HEAD_LABELS), Pod("llm", {"app.kubernetes.io/name": "vllm"})
    kubeadm_api = Address("192.168.49.2")
    assert connects(policies, head, kubeadm_api, 6443)
    assert connects(policies, head, Address("10.96.0.1"), 443)
    assert not connects(policies, server, kubeadm_api, 6443)
    assert not connects(policies, server, Address("10.96.0.1"), 443)
    assert not connects(policies, head, HUB, 6443)


def test_without_ray_no_ray_rule_exists() -> None:
    settings = pods.ServingSettings("llm", None, "ReadWriteOnce", with_token=False)
    names = {p["metadata"]["name"] for p in network_policies(settings, with_ray=False)}
    assert names == {"default-deny-ingress", "default-deny-egress", "allow-openai-http", "allow-dns",
                     "allow-in-namespace", "allow-model-hub"}
