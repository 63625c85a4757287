"""Warm capacity's placeholders on the real scheduler: the plan's PriorityClass and placeholder Deployment (the form
warmReplicas takes where Triarch's own Karpenter does not bring the nodes) fill a pool's free GPUs; a serving pod of
the default priority then takes one of them by preemption, and the evicted placeholder waits instead of preempting
anything in turn. Runs on the lab's plane after every other module that uses its A10G pool, and leaves nothing."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from engine_tier import Lab, eventually
from triarch.catalog import catalog
from triarch.config import from_pulumi_config
from triarch.planners.models import plan_models
from triarch.planners.serving import serving_settings
from triarch.planners.warm import WARM_LABEL, priority_class, warm_manifests
from triarch.scheduling import POOL_LABEL, gpu_toleration

NAMESPACE = "warm-lab"
POOL = "a10g"
TIMEOUT = 150


def leaving(lab: Lab) -> int:
    """Pods on the pool's nodes that are terminating (an earlier module's namespace going in the background): their
    GPUs free up at a moment of their own, so the scenario waits for them."""
    nodes = {n["metadata"]["name"] for n in lab.kubectl_json("get", "nodes", "-l", f"{POOL_LABEL}={POOL}")["items"]}
    return sum(1 for p in lab.kubectl_json("get", "pods", "-A")["items"]
               if p["spec"].get("nodeName") in nodes and p["metadata"].get("deletionTimestamp"))


def wait(what: str, check: Callable[[], bool], lab: Lab) -> None:
    if eventually(check, TIMEOUT):
        return
    pods = lab.plane.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide", check=False).stdout
    raise AssertionError(f"{what} did not happen within {TIMEOUT}s\n{pods}")


def placeholders(lab: Lab) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = lab.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", WARM_LABEL)["items"]
    return items


@pytest.fixture
def warm_pool(lab: Lab) -> Iterator[int]:
    """The pool's free GPUs filled with the plan's placeholders; the namespace gone afterwards."""
    wait("no pod leaving the pool", lambda: leaving(lab) == 0, lab)
    free = sum(lab.free_gpus(POOL).values())
    assert free >= 1, "the A10G pool has no free GPU for the scenario"
    config = copy.deepcopy(lab.config)
    config["triarch:cluster"]["nodeProvisioner"] = "cluster-autoscaler"  # something scales it: warm has meaning
    config["triarch:serving"] = {**config["triarch:serving"], "namespace": NAMESPACE}
    config["triarch:models"] = [{"name": "warmed", "model": "Qwen/Qwen3-Embedding-0.6B", "engine": "vllm",
                                 "nodeGroup": POOL, "replicas": 1, "warmReplicas": free}]
    stack = from_pulumi_config({k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()})
    [plan] = plan_models(stack, catalog())
    settings = serving_settings(stack, with_token=False)
    assert settings.namespace == NAMESPACE
    objects = [priority_class(), *warm_manifests(stack, plan, settings)]
    assert [o["kind"] for o in objects] == ["PriorityClass", "Deployment"]
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    lab.plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all([namespace, *objects]))
    try:
        wait(f"{free} placeholders Running", lambda: sum(
            p["status"].get("phase") == "Running" for p in placeholders(lab)) == free, lab)
        yield free
    finally:
        lab.plane.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
        lab.plane.kubectl("delete", "priorityclass", priority_class()["metadata"]["name"], check=False)


def test_a_serving_pod_preempts_a_placeholder_which_then_waits(lab: Lab, warm_pool: int) -> None:
    assert sum(lab.free_gpus(POOL).values()) == 0  # the placeholders hold every free GPU of the pool
    server = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "server", "namespace": NAMESPACE},
        "spec": {"nodeSelector": {POOL_LABEL: POOL}, "tolerations": [gpu_toleration()],
                 "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.33.0",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }
    lab.plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(server))
    wait("the serving pod Running", lambda: lab.kubectl_json("get", "pod", "server", "-n", NAMESPACE)[
        "status"].get("phase") == "Running", lab)
    # The Deployment replaced the evicted placeholder; it stays Pending: nothing of lower priority is left to preempt,
    # and its class never preempts.
    wait("one placeholder Pending", lambda: sum(
        p["status"].get("phase") == "Pending" for p in placeholders(lab)) == 1, lab)
    running = sum(p["status"].get("phase") == "Running" for p in placeholders(lab))
    assert running == warm_pool - 1
    pending = next(p for p in placeholders(lab) if p["status"].get("phase") == "Pending")
    assert pending["spec"]["priorityClassName"] == "triarch-warm-capacity" and pending["spec"]["priority"] == -10
    assert not pending["status"].get("nominatedNodeName")
