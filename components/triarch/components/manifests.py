"""Register a planner's plain Kubernetes dicts as Pulumi resources, one class per kind, explicit provider."""

from __future__ import annotations

import re
from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s

from triarch.catalog import Chart
from triarch.helm_values import coalesce
from triarch.planners.pods import PULL_SECRET, kept_at_creation

KINDS: dict[tuple[str, str], Any] = {
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "Secret"): k8s.core.v1.Secret,
    ("v1", "ConfigMap"): k8s.core.v1.ConfigMap,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("v1", "Service"): k8s.core.v1.Service,
    ("v1", "PersistentVolumeClaim"): k8s.core.v1.PersistentVolumeClaim,
    ("apps/v1", "Deployment"): k8s.apps.v1.Deployment,
    ("policy/v1", "PodDisruptionBudget"): k8s.policy.v1.PodDisruptionBudget,
    ("storage.k8s.io/v1", "StorageClass"): k8s.storage.v1.StorageClass,
    ("networking.k8s.io/v1", "NetworkPolicy"): k8s.networking.v1.NetworkPolicy,
    ("v1", "PodTemplate"): k8s.core.v1.PodTemplate,
    ("scheduling.k8s.io/v1", "PriorityClass"): k8s.scheduling.v1.PriorityClass,
}


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower()


def resource_name(obj: dict[str, Any]) -> str:
    metadata = obj["metadata"]
    return "-".join([obj["kind"].lower(), *([metadata["namespace"]] if "namespace" in metadata else []),
                     metadata["name"]])


def register(obj: dict[str, Any], opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """One object as Pulumi registers it: built-in kinds through their typed class, others as CustomResource."""
    kept = kept_at_creation(obj)
    if kept:
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(ignore_changes=kept))
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
    cls = KINDS.get((obj["apiVersion"], obj["kind"]))
    if cls is None:
        custom: pulumi.CustomResource = k8s.apiextensions.CustomResource(
            resource_name(obj), api_version=obj["apiVersion"], kind=obj["kind"], **body, opts=opts)
        return custom
    # Typed classes take top-level fields in snake_case (reclaimPolicy -> reclaim_policy); nested dicts stay as is.
    resource: pulumi.CustomResource = cls(resource_name(obj), **{_snake(k): v for k, v in body.items()}, opts=opts)
    return resource


CRD_TYPE = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"


def adopt_crd(args: pulumi.ResourceTransformArgs) -> pulumi.ResourceTransformResult | None:
    """A CRD a chart's crds/ installed (Helm's field manager) is taken over by Pulumi's server-side apply: forced,
    so the fields Helm set move to Pulumi instead of conflicting; and retained on delete, because deleting a CRD
    deletes every object of its kind, any tool's, where Helm never deleted its crds/ (both shown on the real engine
    in test_real_engines)."""
    if args.type_ != CRD_TYPE:
        return None
    props = dict(args.props)
    metadata = dict(cast(dict[str, Any], props.get("metadata") or {}))
    metadata["annotations"] = {**(metadata.get("annotations") or {}), "pulumi.com/patchForce": "true"}
    props["metadata"] = metadata
    return pulumi.ResourceTransformResult(props, pulumi.ResourceOptions.merge(
        args.opts, pulumi.ResourceOptions(retain_on_delete=True)))


def crd_files(name: str, urls: list[tuple[str, str]], opts: pulumi.ResourceOptions) -> list[pulumi.Resource]:
    """Each CRD file as its own resource (the provider reads the file; Helm's crds/ would never be upgraded)."""
    return [k8s.yaml.v2.ConfigFile(f"{name}-{file.removesuffix('.yaml')}", file=url,
                                   opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
                                       transforms=[adopt_crd])))
            for file, url in urls]


def pull_secret(resource_name: str, namespace: str, docker_config: pulumi.Input[str],
                opts: pulumi.ResourceOptions) -> k8s.core.v1.Secret:
    """The registry's credentials where pods of `namespace` pull (a Pulumi secret: the value never shows)."""
    return k8s.core.v1.Secret(resource_name, metadata={"name": PULL_SECRET, "namespace": namespace},
                              type="kubernetes.io/dockerconfigjson", string_data={".dockerconfigjson": docker_config},
                              opts=opts)


def helm_release(name: str, chart: Chart, namespace: str, values: dict[str, Any], opts: pulumi.ResourceOptions,
                 skip_crds: bool = False, docker_config: pulumi.Input[str] | None = None,
                 postrender: str | None = None) -> k8s.helm.v3.Release:
    """A pinned chart, rolled back if it fails to become ready, named `name` in the cluster (a Helm release name
    shapes the names of what the chart creates, so it is never auto-named). Where the stack mirrors or pins the
    chart's images, those values win over the release's own. Null values allowed: without it the provider drops
    every empty list and null on their way to Helm (provider v4.25.0 excludeNulls), so `capabilities.add: []` left
    the chart's SYS_ADMIN in place (seen in the DCGM exporter's release record after a real `pulumi up`); with it,
    Helm coalesces them as it documents (an empty list replaces, a null removes the chart's key)."""
    if chart.image_values:
        values = coalesce(values, chart.image_values)
    if docker_config is not None:
        secret = pull_secret(f"{name}-registry", namespace, docker_config, opts)
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[secret]))
    return k8s.helm.v3.Release(
        name, name=name, chart=chart.reference, version=chart.version,
        repository_opts=None if chart.is_oci else {"repo": chart.repository},
        namespace=namespace, create_namespace=False, atomic=True, cleanup_on_fail=True, skip_crds=skip_crds or None,
        allow_null_values=True, values=values, postrender=postrender, opts=opts)


WEBHOOK_PATCHES = {"MutatingWebhookConfiguration": k8s.admissionregistration.v1.MutatingWebhookConfigurationPatch,
                   "ValidatingWebhookConfiguration": k8s.admissionregistration.v1.ValidatingWebhookConfigurationPatch}


def webhook_gate(patch: dict[str, Any], opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """A chart's webhook configuration, patched (server-side apply) with only the annotations that make the
    provider wait for it; named `<kind>-<name>-ready`."""
    cls = WEBHOOK_PATCHES[patch["kind"]]
    name = f"{patch['kind'].lower()}-{patch['metadata']['name']}-ready"
    resource: pulumi.CustomResource = cls(name, metadata=patch["metadata"], opts=opts)
    return resource
