"""The Pulumi program: config -> validated model -> matrix check -> platform. `__main__.py` only calls `main`."""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi.runtime.config import CONFIG, get_config_env, is_config_secret
from pulumi.runtime.mocks import MockMonitor

from triarch.catalog import catalog
from triarch.components.cluster import EksCluster
from triarch.components.platform import Platform
from triarch.config import NAMESPACE, SECRET_KEYS, StackConfig, from_pulumi_config
from triarch.config.checks import endpoint_warnings
from triarch.errors import ConfigError, TriarchError
from triarch.existing import check_cluster
from triarch.matrix import require_compatible
from triarch.offline import PLAIN_TEXT_REFUSED, SECRET
from triarch.planners import picker
from triarch.planners.efa import efa_image_warnings
from triarch.planners.model_plan import ModelPlan
from triarch.planners.models import gated_model_warnings, plan_models
from triarch.planners.objects import KubernetesPlan, plan_kubernetes
from triarch.planners.registry import crd_sources, verify_crds


class StackError(pulumi.RunError):
    """A TriarchError raised through the engine: the CLI prints only its sentence; `triarch plan` exits 2."""


def pulumi_config_values() -> dict[str, Any]:
    """Every config value of the running stack ("ns:key" -> value), as the Pulumi engine passed them."""
    return {**get_config_env(), **CONFIG.get()}


def load_stack() -> tuple[StackConfig, list[ModelPlan], KubernetesPlan]:
    """Validate config, the driver/CUDA matrix, every model's sizing and every Kubernetes object before any
    resource exists; a mistake is one sentence."""
    values = pulumi_config_values()
    for key in PLAIN_TEXT_REFUSED:
        if key in values and not is_config_secret(key):
            raise ConfigError(key, None, "is set in plain text, where anyone who reads the stack file (or a CI "
                              "log) sees it: delete the line, rotate the value, then set the new one as a secret",
                              f"pulumi config set --secret {key} <value>", show_value=False)
    stack = from_pulumi_config(values)
    for verdict in require_compatible(stack, catalog()):
        if verdict.level == "warning":
            pulumi.log.warn(verdict.message)
    # Under the Pulumi CLI the stack's token arrives decrypted; `triarch plan` sees only that one is set.
    token = values.get(f"{NAMESPACE}:hfToken")
    models = plan_models(stack, catalog(), token if token and token != SECRET else None)
    given = [key for key in SECRET_KEYS if f"{NAMESPACE}:{key}" in values]
    for warning in [*endpoint_warnings(stack), *efa_image_warnings(stack, models),
                    *gated_model_warnings(stack, given, models)]:
        pulumi.log.warn(warning)
    return stack, models, plan_kubernetes(stack, models, catalog(), given)


def under_mocks() -> bool:
    """Whether the program runs under Pulumi's mock engine (`triarch plan`, tests) rather than the CLI."""
    return isinstance(pulumi.runtime.settings.get_monitor(), MockMonitor)


def main() -> Platform:
    try:
        stack, models, objects = load_stack()
        if not under_mocks():
            check_cluster(stack, objects)
            if objects.kuberay:  # Triarch installs KubeRay: its CRD files are the release's before they apply
                verify_crds(crd_sources("kuberay-operator", stack))
            if objects.lws:  # and the LeaderWorkerSet controller's
                verify_crds(crd_sources("lws", stack))
            if any(picker.routed(m) for m in models):  # and the InferencePool's, for the endpoint pickers
                verify_crds(crd_sources(picker.PICKER_CHART, stack))
    except TriarchError as error:
        # RunError prints the sentence without a traceback under the Pulumi CLI.
        raise StackError(str(error)) from None
    config = pulumi.Config(NAMESPACE)
    secrets = {key: value for key in sorted(SECRET_KEYS) if (value := config.get_secret(key)) is not None}
    platform = Platform("triarch", stack, catalog(), models, objects, secrets)
    pulumi.export("pools", [p.name for p in platform.pools])
    if isinstance(platform.cluster, EksCluster):
        # What `kubectl` needs to reach the created cluster (docs/deploy.md): the endpoint and its CA, credentials
        # from `aws eks get-token` at use time. A secret, since it names the cluster's endpoint.
        pulumi.export("kubeconfig", pulumi.Output.secret(platform.cluster.kubeconfig))
    if platform.prometheus_stack is not None:
        pulumi.export("grafanaAdminPassword", platform.prometheus_stack.admin_password)
    pulumi.export("models", {p.name: {"engine": p.config.engine, "tensorParallelSize": p.sizing.tensor_parallel_size,
                                      "kvCacheTokens": p.sizing.kv_cache_tokens,
                                      "sizedForVllm": p.sizing.vllm_version} for p in models})
    return platform
