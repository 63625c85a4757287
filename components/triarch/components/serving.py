"""The serving layers as Pulumi components: the namespace and token (where), the KubeRay operator and the
RayService (how), one vLLM server per model (when). Each registers the objects planned for it
(triarch.planners.objects)."""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from triarch.catalog import Chart
from triarch.components.manifests import crd_files, helm_release, pull_secret, register
from triarch.planners import pods
from triarch.planners.iam import pod_identity_trust, weights_read_policy
from triarch.scheduling import POOL_LABEL


def kuberay_values(system_pool: str | None, monitor_labels: dict[str, str] | None = None) -> dict[str, Any]:
    """Operator on CPU nodes with its resources fixed, and a ServiceMonitor for its kuberay_* metrics where a
    Prometheus runs; every key exists in the chart's values.yaml (1.7.0).

    Only limits: the chart's values declare no `requests`, and Kubernetes sets requests equal to limits.
    """
    values: dict[str, Any] = {"resources": {"limits": {"cpu": "500m", "memory": "512Mi"}}}
    if system_pool is not None:
        values["nodeSelector"] = {POOL_LABEL: system_pool}
    if monitor_labels is not None:
        values["metrics"] = {"enabled": True,
                             "serviceMonitor": {"enabled": True, "additionalLabels": dict(monitor_labels)}}
    return values


SECRET_OBJECTS = {"hfToken": ("hf-token", pods.HF_TOKEN_SECRET, pods.HF_TOKEN_KEY),
                  "vllmApiKey": ("vllm-api-key", pods.API_KEY_SECRET, pods.API_KEY_KEY)}
"""Stack secret -> (resource name suffix, Secret name, key in it)."""


class ServingNamespace(pulumi.ComponentResource):
    """The serving namespace (first of `objects`) and its network policies, and the stack's secrets (the Hugging
    Face token, the vLLM API key) as Kubernetes Secrets the pods read."""

    def __init__(self, name: str, objects: list[dict[str, Any]], secrets: dict[str, pulumi.Output[str]],
                 provider: k8s.Provider, opts: pulumi.ResourceOptions | None = None,
                 docker_config: pulumi.Input[str] | None = None) -> None:
        super().__init__("triarch:serving:ServingNamespace", name, None, opts)
        namespace, *policies = objects
        self.namespace = register(namespace, pulumi.ResourceOptions(parent=self, provider=provider))
        in_namespace = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[self.namespace])
        self.network_policies = [register(p, in_namespace) for p in policies]
        self.secrets: dict[str, k8s.core.v1.Secret] = {}
        for key, value in sorted(secrets.items()):
            if key not in SECRET_OBJECTS:
                continue  # not the serving pods' (the Grafana admin's, say)
            suffix, secret, field = SECRET_OBJECTS[key]
            self.secrets[key] = k8s.core.v1.Secret(
                f"{name}-{suffix}", metadata={"name": secret, "namespace": namespace["metadata"]["name"]},
                type="Opaque", string_data={field: value}, opts=in_namespace)
        self.pull_secret = None if docker_config is None else pull_secret(f"{name}-registry",
                                                                         namespace["metadata"]["name"],
                                                                         docker_config, in_namespace)
        self.token = self.secrets.get("hfToken")
        self.register_outputs({"namespace": namespace["metadata"]["name"]})


class KubeRayOperator(pulumi.ComponentResource):
    def __init__(self, name: str, chart: Chart, system_pool: str | None, namespace: dict[str, Any],
                 provider: k8s.Provider, opts: pulumi.ResourceOptions | None = None,
                 monitor_labels: dict[str, str] | None = None, after: list[pulumi.Resource] | None = None,
                 docker_config: pulumi.Input[str] | None = None, crds: list[tuple[str, str]] | None = None) -> None:
        super().__init__("triarch:ray:KubeRayOperator", name, None, opts)
        self.namespace = register(namespace, pulumi.ResourceOptions(parent=self, provider=provider))
        # The CRDs at the pinned release, applied before the operator that reads them; the chart's crds/ skipped.
        self.crds = crd_files(f"{name}-crd", crds or [], pulumi.ResourceOptions(parent=self, provider=provider))
        # The chart installs the RayService/RayCluster CRDs; Ray resources depend on this release.
        self.release = helm_release(name, chart, namespace["metadata"]["name"],
                                    kuberay_values(system_pool, monitor_labels),
                                    pulumi.ResourceOptions(parent=self, provider=provider,
                                                           depends_on=[self.namespace, *self.crds, *(after or [])]),
                                    skip_crds=bool(self.crds), docker_config=docker_config)
        self.register_outputs({"status": self.release.status})


class WeightsReader(pulumi.ComponentResource):
    """What lets pods read S3 weights on a created cluster (a vllm model's, or a Ray worker group's models'): a role
    only their service account can assume (EKS Pod Identity), allowed to read those prefixes, and the association
    that hands it to the pods."""

    def __init__(self, name: str, *, cluster_name: pulumi.Input[str], cluster: str, namespace: str,
                 service_account: str, uris: list[str], region: str, depends_on: list[pulumi.Resource],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:vllm:WeightsReader", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.role = aws.iam.Role(f"{name}-role", assume_role_policy=pod_identity_trust(cluster, namespace,
                                                                                      service_account), opts=child)
        self.policy = aws.iam.RolePolicy(f"{name}-read", role=self.role.id,
                                         policy=json.dumps(weights_read_policy(uris, region)), opts=child)
        self.association = aws.eks.PodIdentityAssociation(
            f"{name}-identity", cluster_name=cluster_name, namespace=namespace, service_account=service_account,
            role_arn=self.role.arn, opts=pulumi.ResourceOptions(parent=self, depends_on=[self.policy, *depends_on]))
        self.register_outputs({"roleArn": self.role.arn})


class WarmCapacity(pulumi.ComponentResource):
    """The models' warm capacity (triarch.planners.warm): CapacityBuffers with their PodTemplates, or placeholder
    Deployments after their PriorityClass."""

    def __init__(self, name: str, objects: list[dict[str, Any]], provider: k8s.Provider,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:serving:WarmCapacity", name, None, opts)
        first = [register(o, pulumi.ResourceOptions(parent=self, provider=provider))
                 for o in objects if o["kind"] in ("PriorityClass", "PodTemplate")]
        then = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=first)
        self.objects = first + [register(o, then) for o in objects if o["kind"] not in ("PriorityClass", "PodTemplate")]
        self.register_outputs({})


class VllmServer(pulumi.ComponentResource):
    def __init__(self, name: str, objects: list[dict[str, Any]], model: str, provider: k8s.Provider,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:vllm:VllmServer", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        self.objects = [register(obj, child) for obj in objects]
        self.register_outputs({"model": model})


class RayServing(pulumi.ComponentResource):
    def __init__(self, name: str, objects: list[dict[str, Any]], models: list[str], operator: KubeRayOperator | None,
                 provider: k8s.Provider, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:ray:RayServing", name, None, opts)
        # The claim and the autoscaler's service account first: KubeRay does not start a head whose service
        # account is missing.
        self.objects = [register(obj, pulumi.ResourceOptions(parent=self, provider=provider))
                        for obj in objects if obj["kind"] != "RayService"]
        self.objects += [register(obj, pulumi.ResourceOptions(parent=self, provider=provider,
                                                              depends_on=[*([operator.release] if operator else []),
                                                                          *self.objects]))
                         for obj in objects if obj["kind"] == "RayService"]
        self.register_outputs({"models": models})

