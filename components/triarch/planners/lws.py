"""The LeaderWorkerSet controller, which runs a vllm model's replica across nodes as one group of pods (a leader
serving the API and headless workers), created, restarted and rolled as a whole."""

from __future__ import annotations

from typing import Any

from triarch.catalog import charts
from triarch.config import StackConfig
from triarch.images import parse
from triarch.planners import pods
from triarch.planners.model_plan import ModelPlan
from triarch.scheduling import POOL_LABEL, SYSTEM_POOL

LWS_CHART = "lws"
LWS_RELEASE = "lws"
LWS_NAMESPACE = "lws-system"
"""Where the controller runs: the LeaderWorkerSet CRD's conversion webhook names lws-webhook-service in lws-system
(the chart's fullname under the release name lws)."""


def needs_lws(models: list[ModelPlan]) -> bool:
    """Whether any vllm model's replica spans nodes (only those become LeaderWorkerSets)."""
    return any(m.config.engine == "vllm" and m.multi_node for m in models)


def lws_namespace() -> dict[str, Any]:
    return pods.namespace(LWS_NAMESPACE, "restricted",
                          "the LeaderWorkerSet controller runs non-root, read-only, with no capabilities")


def lws_values(stack: StackConfig) -> dict[str, Any]:
    """The manager at the pinned tag (the chart's source says `main`, which only its release packaging replaces),
    pulled once; the restricted Pod Security level (RuntimeDefault seccomp beside the chart's non-root context);
    on the system nodes of a created cluster. Every key exists in the chart's values.yaml (v0.10.0)."""
    [manager] = charts()[LWS_CHART].images
    values: dict[str, Any] = {
        "image": {"manager": {"tag": parse(manager.image).tag, "pullPolicy": "IfNotPresent"}},
        "podSecurityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    }
    if stack.cluster.create:
        values["nodeSelector"] = {POOL_LABEL: SYSTEM_POOL}
    return values


WEBHOOK_CONFIGURATIONS = (("MutatingWebhookConfiguration", "lws-mutating-webhook-configuration"),
                          ("ValidatingWebhookConfiguration", "lws-validating-webhook-configuration"))
"""The chart's webhook configurations under the release name lws (templates/webhook/webhook.yaml, v0.10.0): every
webhook `failurePolicy: Fail`, with no caBundle until the manager's certificate rotation injects its CA."""
WEBHOOK_WAIT_SECONDS = 300
"""How long `pulumi up` waits for it: Helm's own default wait for a release's resources."""


def webhook_gates() -> list[dict[str, Any]]:
    """Patches that make `pulumi up` wait until the manager has injected its CA into each webhook configuration
    (the provider's pulumi.com/waitFor), before any LeaderWorkerSet is created. The chart's readiness probe is a
    ping, so Helm calls the release ready while its webhooks refuse every LeaderWorkerSet (no server, or no CA yet):
    a real cluster's race for a few seconds, a local plane's for as long as its manager takes to start."""
    return [{"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
             "metadata": {"name": name, "annotations": {
                 "pulumi.com/waitFor": "jsonpath={.webhooks[0].clientConfig.caBundle}",
                 "pulumi.com/timeoutSeconds": str(WEBHOOK_WAIT_SECONDS)}}}
            for kind, name in WEBHOOK_CONFIGURATIONS]
