"""KEDA and `pulumi up` together, on the real engines: the real KEDA operator and metrics adapter (KEDA 2.20.2, built
from its Go module) reconcile the ScaledObject of an autoscaled vLLM model against a loopback stand-in for the
Prometheus HTTP API; the HPA KEDA creates (the controller manager's real HPA controller, reading KEDA's external
metrics API through the API server's aggregation layer) scales the Deployment up; then a `pulumi up` that changes
the model's image succeeds and leaves the scaled replica count alone.

The scenario is a second Pulumi stack (`lab-keda`) on the lab's plane: its own serving and Prometheus namespaces,
the A10G pool the lab's Ray model leaves idle (no KubeRay runs there)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT
from engine_tier import Lab, eventually, scratch_project
from triarch.local import engines
from triarch.local.crds import crd_files
from triarch.local.lifecycle import start_operator, stop_operator

STACK = "lab-keda"
NAMESPACE = "llm-keda"
MONITORING = "monitoring-keda"
PROMETHEUS_PORT = 9090
SCALE_TIMEOUT = 240
"""Seconds for KEDA (polling every 15 s) and the HPA (scale-up stabilised over 60 s, one pod per minute) to add a
replica."""


def keda_config(lab: Lab) -> dict[str, Any]:
    config = copy.deepcopy(lab.config)
    config["triarch:nodeGroups"] = [g for g in config["triarch:nodeGroups"] if g["name"] == "a10g"]
    config["triarch:serving"] = {**config["triarch:serving"], "namespace": NAMESPACE}
    config["triarch:observability"] = {"prometheus": "existing", "keda": "existing", "namespace": MONITORING,
                                       "prometheusUrl": f"http://127.0.0.1:{PROMETHEUS_PORT}",
                                       "dcgmExporter": False}
    config["triarch:models"] = [{"name": "scaled", "model": "Qwen/Qwen3-8B", "engine": "vllm", "nodeGroup": "a10g",
                                 "maxModelLen": 8192, "autoscaling": {"min": 1, "max": 2}}]
    return config


@dataclass
class KedaStack:
    lab: Lab
    project: Path
    config: dict[str, Any]
    values: Path
    queries: Path

    def pulumi(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [str(engines.binary("pulumi")), *args, "--stack", STACK, "--non-interactive"]
        done = subprocess.run(self.lab.plane.command(argv), env=self.lab.plane.env(), cwd=self.project,
                              capture_output=True, text=True, timeout=600, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"pulumi {' '.join(args)} exited {done.returncode}:\n{done.stdout[-4000:]}\n"
                                 f"{done.stderr[-3000:]}")
        return done

    def write_config(self, config: dict[str, Any]) -> None:
        path = self.project / f"Pulumi.{STACK}.yaml"
        current = yaml.safe_load(path.read_text()) or {}
        current["config"] = config
        path.write_text(yaml.safe_dump(current, sort_keys=False))

    def choose(self, **values: float) -> None:
        """What the stand-in Prometheus answers, per metric name."""
        self.values.write_text(json.dumps({name.replace("__", ":"): value for name, value in values.items()}))

    def deployment(self) -> dict[str, Any]:
        loaded: dict[str, Any] = self.lab.kubectl_json("get", "deployment", "scaled", "-n", NAMESPACE,
                                                       "--show-managed-fields")
        return loaded


@pytest.fixture(scope="module")
def keda_stack(deployed: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KedaStack]:
    """KEDA running on the lab's plane (its CRDs, operator, adapter and APIService), the Prometheus stand-in, and
    the lab-keda stack up with the waiting requests at zero. Afterwards the plane is as this module found it: the
    lab's cluster has no KEDA, and other modules rely on that."""
    plane = deployed.plane
    documents = [d for f in crd_files(["keda"], []) for d in yaml.safe_load_all(f.read_text()) if d]
    plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(documents))
    plane.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                  *[f"crd/{d['metadata']['name']}" for d in documents])
    plane.kubectl("create", "namespace", MONITORING)
    start_operator(plane, "keda")
    work = tmp_path_factory.mktemp("keda")
    values, queries = work / "values.json", work / "queries.log"
    values.write_text("{}")
    standin = subprocess.Popen(plane.command([sys.executable, str(ROOT / "tests" / "prometheus_standin.py"),
                                              str(PROMETHEUS_PORT), str(values), str(queries)]),
                               start_new_session=True)
    project = scratch_project(work / "project")
    config = keda_config(deployed)
    (project / f"Pulumi.{STACK}.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    stack = KedaStack(deployed, project, config, values, queries)
    stack.choose(vllm__num_requests_waiting=0, vllm__kv_cache_usage_perc=0)
    try:
        stack.pulumi("stack", "init", "--secrets-provider", "passphrase")
        stack.pulumi("up", "--yes", "--skip-preview")
        yield stack
        # KEDA removes its finalizers while it runs. The stack itself is not destroyed: `pulumi destroy` would wait
        # out each vLLM pod's 90-second grace period, which kwok honours; the namespace goes in the background.
        plane.kubectl("delete", "--ignore-not-found", "--wait=true", "scaledobjects", "--all", "-n", NAMESPACE)
    finally:
        standin.kill()
        stop_operator(plane, "keda")
        plane.kubectl("delete", "--ignore-not-found", "--wait=false", "namespace", MONITORING, NAMESPACE)
        plane.kubectl("delete", "--ignore-not-found", *[f"crd/{d['metadata']['name']}" for d in documents])


def _wait_for(what: str, check: Any, timeout: float, stack: KedaStack) -> None:
    if eventually(check, timeout, 3):
        return
    hpa = stack.lab.plane.kubectl("describe", "hpa", "-n", NAMESPACE, check=False).stdout[-2500:]
    logs = (stack.lab.plane.directory / "logs" / "keda-operator.log").read_text()[-2000:]
    raise AssertionError(f"{what} did not happen within {timeout:.0f}s\n{hpa}\n{logs}")


def test_the_deployment_leaves_its_replica_count_to_the_autoscaler(keda_stack: KedaStack) -> None:
    """Triarch writes no spec.replicas for a model KEDA scales: the HPA alone owns the field."""
    deployment = keda_stack.deployment()
    fields = deployment["metadata"]["managedFields"]
    assert any(m["manager"].startswith("pulumi-kubernetes") for m in fields)  # Pulumi applied the Deployment
    managers = {m["manager"] for m in fields if "f:replicas" in (m.get("fieldsV1", {}).get("f:spec") or {})}
    assert not any(m.startswith("pulumi-kubernetes") for m in managers), managers


def test_keda_scales_the_deployment_on_vllms_waiting_requests(keda_stack: KedaStack) -> None:
    hpa = keda_stack.lab.kubectl_json("get", "hpa", "keda-hpa-scaled", "-n", NAMESPACE)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "scaled"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 2)
    keda_stack.choose(vllm__num_requests_waiting=40, vllm__kv_cache_usage_perc=0.1)
    _wait_for("a second replica", lambda: keda_stack.deployment()["spec"]["replicas"] == 2, SCALE_TIMEOUT,
              keda_stack)
    asked = keda_stack.queries.read_text()
    assert "vllm:num_requests_waiting" in asked and "vllm:kv_cache_usage_perc" in asked
    _wait_for("two available replicas",
              lambda: keda_stack.deployment().get("status", {}).get("availableReplicas") == 2, 60, keda_stack)


def test_an_image_bump_goes_up_and_keeps_the_scaled_replicas(keda_stack: KedaStack) -> None:
    if keda_stack.deployment()["spec"]["replicas"] != 2:
        test_keda_scales_the_deployment_on_vllms_waiting_requests(keda_stack)
    edited = copy.deepcopy(keda_stack.config)
    edited["triarch:images"] = {"vllm": "vllm/vllm-openai:v0.29.0"}
    keda_stack.write_config(edited)
    done = keda_stack.pulumi("up", "--yes", "--skip-preview", check=False)
    assert done.returncode == 0, done.stdout[-3000:]
    deployment = keda_stack.deployment()
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "vllm/vllm-openai:v0.29.0"
