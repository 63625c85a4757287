"""Stack-wide serving decisions: the namespace of the workloads and the storage of their model caches."""

from __future__ import annotations

from ipaddress import ip_network
from typing import Any

from triarch.config import StackConfig
from triarch.planners import picker, pods
from triarch.planners.coldstart import compile_cache_on
from triarch.planners.pods import BLOCK_STORAGE_CLASS, EFS_STORAGE_CLASS

__all__ = ["BLOCK_STORAGE_CLASS", "EFS_STORAGE_CLASS", "block_storage_class", "serving_settings"]


def block_storage_class() -> dict[str, Any]:
    """Encrypted gp3 (the driver's `encrypted` defaults to false), bound where the pod is scheduled (an EBS volume
    lives in one zone), growable in place (a bigger Prometheus volume is an edit, not a new claim); parameters of the
    aws-ebs-csi-driver (docs/parameters.md)."""
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": BLOCK_STORAGE_CLASS, "labels": {"app.kubernetes.io/managed-by": "triarch"}},
            "provisioner": "ebs.csi.aws.com", "parameters": {"type": "gp3", "encrypted": "true"},
            "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer", "allowVolumeExpansion": True}


def serving_settings(stack: StackConfig, with_token: bool, with_api_key: bool = False,
                     with_pull_secret: bool = False) -> pods.ServingSettings:
    serving = stack.serving
    created = stack.cluster.create
    storage_class = serving.storage_class or (EFS_STORAGE_CLASS if created else None)
    access_mode = stack.cache_access_mode
    return pods.ServingSettings(serving.namespace, storage_class, access_mode, with_token, with_api_key,
                                tuple(serving.client_namespaces), tuple(str(c) for c in serving.hub_cidrs),
                                str(stack.cluster.vpc_cidr) if created else None, with_pull_secret,
                                compile_cache=compile_cache_on(stack), weights_role_arn=serving.weights_role_arn)


KUBERAY_NAMESPACE = "kuberay-system"
RAY_NODE_LABEL = {"ray.io/is-ray-node": "yes"}
"""KubeRay sets this label on every Ray pod it creates."""


DNS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
       "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
"""CoreDNS as the EKS add-on (and kubeadm) label it."""
HEAD_POD = {"matchLabels": {**RAY_NODE_LABEL, "ray.io/node-type": "head"}}
"""KubeRay labels the head pod ray.io/node-type=head."""
PRIVATE_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
"""RFC 1918's private ranges. A pod reaches the API server at the `kubernetes` Service's cluster IP, which EKS
draws from these (KubernetesNetworkConfigRequest.serviceIpv4Cidr), and NetworkPolicy agents such as the VPC
CNI's match egress before the Service's address is translated: so these, not the endpoints, are what keeps the
API server (and every other cluster-internal address) out of the model hub's rule."""


def cluster_ranges(vpc_cidr: str | None) -> list[str]:
    """Addresses inside the cluster's network: the private ranges, and the VPC's own range if it lies outside
    them (a VPC may use 100.64.0.0/10)."""
    ranges = list(PRIVATE_RANGES)
    if vpc_cidr and not any(ip_network(vpc_cidr).subnet_of(ip_network(r)) for r in PRIVATE_RANGES):  # type: ignore[arg-type]
        ranges.append(vpc_cidr)
    return ranges


LWS_POD = {"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]}
"""Every pod of a LeaderWorkerSet group (its controller labels them with the set's name)."""


def network_policies(settings: pods.ServingSettings, with_ray: bool,
                     with_gangs: bool = False, with_pickers: bool = False) -> list[dict[str, Any]]:
    """The serving namespace's traffic, both ways.

    In: nothing by default; the OpenAI port from this namespace and the client namespaces the stack names; Ray
    pods to each other; the KubeRay operator to the Ray dashboard (it submits the Serve config there). Nothing
    reaches GCS, the dashboard or the Ray client port from elsewhere.
    The pods of a replica across nodes (LeaderWorkerSet groups) to each other, on every port: torch.distributed and
    NCCL pick theirs at run time.
    Out: nothing by default; DNS; this namespace's own pods; HTTPS to the model hub, never inside the cluster's
    network (so not the API server, the nodes, or other namespaces); the Ray head, whose autoscaler asks the API
    server for workers, also HTTPS inside the cluster's network.
    Endpoint pickers (prefixRouting on a vllm model): the proxies' port from the OpenAI clients (the model's Service
    sends there), the picker's ext_proc port from the proxies; the picker watches its InferencePool and the pods and
    holds its Lease through the API server (HTTPS inside the cluster's network); the proxy reaches vLLM's port and the
    picker vLLM's metrics inside the namespace.
    """
    namespace = settings.namespace

    def policy(name: str, selector: dict[str, Any], kind: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": name, "namespace": namespace, "labels": dict(pods.MANAGED_BY)},
                "spec": {"podSelector": selector, "policyTypes": [kind], kind.lower(): rules}}

    http = [{"protocol": "TCP", "port": 8000}]
    https = [{"protocol": "TCP", "port": 443}]
    clients: list[dict[str, Any]] = [{"podSelector": {}}]
    if settings.client_namespaces:
        clients.append({"namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": sorted(settings.client_namespaces)}]}})
    internal = cluster_ranges(settings.vpc_cidr)
    hub = []
    for cidr in settings.hub_cidrs:
        excluded = [r for r in internal if _strictly_contains(cidr, r)]
        hub.append({"ipBlock": {"cidr": cidr, **({"except": excluded} if excluded else {})}})
    policies = [
        policy("default-deny-ingress", {}, "Ingress", []),
        policy("allow-openai-http", {}, "Ingress", [{"from": clients, "ports": http}]),
        policy("default-deny-egress", {}, "Egress", []),
        policy("allow-dns", {}, "Egress", [{"to": [DNS], "ports": [{"protocol": "UDP", "port": 53},
                                                                    {"protocol": "TCP", "port": 53}]}]),
        policy("allow-in-namespace", {}, "Egress", [{"to": [{"podSelector": {}}]}]),
        policy("allow-model-hub", {}, "Egress", [{"to": hub, "ports": https}]),
    ]
    if with_gangs:
        policies.append(policy("allow-group-internal", LWS_POD, "Ingress", [{"from": [{"podSelector": LWS_POD}]}]))
    # Where the policy agent matches after translation, the endpoint's own port counts: 443 on EKS, 6443 on kubeadm
    # and kind clusters (an adopted cluster may be either).
    api_ports = https if settings.vpc_cidr else [*https, {"protocol": "TCP", "port": 6443}]
    api_server = [{"to": [{"ipBlock": {"cidr": r}} for r in internal], "ports": api_ports}]
    if with_pickers:
        pickers = {"matchLabels": dict(picker.MODE_LABEL)}
        policies += [
            policy("allow-picker-proxy", picker.PROXY_POD, "Ingress",
                   [{"from": clients, "ports": [{"protocol": "TCP", "port": picker.PROXY_PORT}]}]),
            policy("allow-picker-ext-proc", pickers, "Ingress",
                   [{"from": [{"podSelector": picker.PROXY_POD}],
                     "ports": [{"protocol": "TCP", "port": picker.EXT_PROC_PORT}]}]),
            policy("allow-picker-api-server", pickers, "Egress", api_server),
        ]
    if with_ray:
        ray_pods = {"matchLabels": dict(RAY_NODE_LABEL)}
        operator = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": KUBERAY_NAMESPACE}}}
        policies += [
            policy("allow-ray-internal", ray_pods, "Ingress", [{"from": [{"podSelector": ray_pods}]}]),
            policy("allow-kuberay-dashboard", ray_pods, "Ingress",
                   [{"from": [operator], "ports": [{"protocol": "TCP", "port": 8265}]}]),
        ]
        # The head's autoscaler asks the API server for worker pods, at the Service's cluster IP (inside the
        # cluster's ranges; 443).
        policies.append(policy("allow-ray-head-api-server", HEAD_POD, "Egress", api_server))
    return policies


def _strictly_contains(outer: str, inner: str) -> bool:
    """Whether `inner` is a proper part of `outer` (a NetworkPolicy's `except` must lie inside its `cidr`)."""
    inner_net, outer_net = ip_network(inner), ip_network(outer)
    return inner_net != outer_net and inner_net.subnet_of(outer_net)  # type: ignore[arg-type]
