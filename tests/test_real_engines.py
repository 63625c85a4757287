"""Triarch on the real engines: the lab stack goes up with the real Pulumi CLI and Kubernetes provider onto a real
API server, scheduler and controller manager (kwok in place of kubelets), and a second `up` changes nothing.

The assertions read the cluster (kubectl) and Pulumi's own state, never Triarch's manifests alone."""

from __future__ import annotations

import base64
import getpass
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import triarch.local.lifecycle as plane_module
import triarch.local.operators as operators_module
from conftest import reference_file
from engine_tier import (
    Lab,
    names,
    namespace_gone,
    recording_namespaces,
    require_engines,
    resources_by_type,
    scratch_project,
)
from triarch.local import engines, netns
from triarch.local.lifecycle import down, up
from triarch.local.plane import PlaneError, PlaneSpec, only_plane
from triarch.scheduling import POOL_LABEL

SERVING = "llm"


def _state(lab: Lab) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(lab.pulumi("stack", "export").stdout)
    return loaded


def test_every_object_triarch_owns_exists_as_planned(deployed: Lab, tmp_path_factory: pytest.TempPathFactory
                                                     ) -> None:
    from triarch.report.planning import plan_stack
    from triarch.report.validation import validate_stack_file

    out = tmp_path_factory.mktemp("plan")
    plan_stack(validate_stack_file("lab", deployed.stack_file), out)
    planned = [yaml.safe_load(p.read_text()) for p in sorted((out / "manifests").glob("*.yaml"))]
    assert planned, "the lab plan has manifests"
    for manifest in planned:
        kind, meta = manifest["kind"], manifest["metadata"]
        args = [kind.lower() + "." + manifest["apiVersion"].split("/")[0] if "/" in manifest["apiVersion"]
                else kind.lower(), meta["name"]]
        if "namespace" in meta:
            args += ["-n", meta["namespace"]]
        live = deployed.kubectl_json("get", *args)
        assert _contains(live, manifest), (kind, meta["name"])
    # Pulumi's state records the same objects, each with the lab's explicit provider.
    state = _state(deployed)
    kinds = resources_by_type(state)
    assert {r["outputs"]["metadata"]["name"] for r in kinds["kubernetes:apps/v1:Deployment"]} == {"chat"}
    assert {r["outputs"]["metadata"]["name"] for r in kinds["kubernetes:ray.io/v1:RayService"]} == {"llm"}
    assert all("providers:kubernetes::" in r["provider"] for rs in kinds.values() for r in rs)


def _contains(live: Any, planned: Any) -> bool:
    """Every planned value is in the live object (the server adds defaults and drops empty lists and maps, which
    mean the same as none; lists compare item by item)."""
    if planned in ([], {}) and live is None:
        return True
    if isinstance(planned, dict):
        return isinstance(live, dict) and all(_contains(live.get(k), v) for k, v in planned.items())
    if isinstance(planned, list):
        return isinstance(live, list) and len(live) == len(planned) and all(
            _contains(lv, pv) for lv, pv in zip(live, planned, strict=True))
    if isinstance(planned, int | float) and isinstance(live, int | float):
        return float(live) == float(planned)
    return live == planned or str(live) == str(planned)


def test_vllm_replicas_run_on_their_pools_gpu_nodes_in_distinct_zones(deployed: Lab) -> None:
    pods = deployed.kubectl_json("get", "pods", "-n", SERVING, "-l", "app.kubernetes.io/instance=chat")["items"]
    nodes = {n["metadata"]["name"]: n for n in deployed.kubectl_json("get", "nodes")["items"]}
    assert len(pods) == 2
    zones = set()
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        node = nodes[pod["spec"]["nodeName"]]
        assert node["metadata"]["labels"][POOL_LABEL] == "l4"
        assert any(t["key"] == "nvidia.com/gpu" for t in node["spec"]["taints"])
        zones.add(node["metadata"]["labels"]["topology.kubernetes.io/zone"])
    assert len(zones) == 2


def test_verify_reads_each_replicas_start_from_the_api_servers_pods(deployed: Lab) -> None:
    """The start times `triarch verify` reports, read from pods as the real API server and kubelet (kwok's) wrote
    them: created, scheduled, the container running and Ready follow one another and add up."""
    from triarch.verify.when import start_times
    pods = deployed.kubectl_json("get", "pods", "-n", SERVING, "-l", "app.kubernetes.io/instance=chat")["items"]
    assert pods
    for pod in pods:
        times = start_times(pod, "")
        parts = (times.to_scheduled, times.to_started, times.to_ready)
        assert times.total is not None and all(p is not None and p >= 0 for p in parts), (pod["status"], times)
        assert abs(sum(p for p in parts if p is not None) - times.total) <= 1


AWS_GET_TOKEN = """#!/bin/sh
# Stands in for `aws eks get-token` (the one step that is AWS's): records how kubectl called it, answers with a
# token the plane's API server issued, in the ExecCredential form the AWS CLI prints.
printf '%s\\n' "$*" >> "$(dirname "$0")/calls"
printf '{"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential", "status": {"token": "%s"}}' \\
  "$(cat "$(dirname "$0")/token")"
"""


def test_the_kubeconfig_output_reaches_the_cluster_as_the_readme_says(deployed: Lab, tmp_path: Path) -> None:
    """The README's steps after `pulumi up`, on the plane: the kubeconfig a created cluster exports (built by the same
    function, with the plane's address and CA in place of EKS's), kubectl's exec plugin calling `aws eks get-token`
    (a stand-in printing a token of a ServiceAccount bound to cluster-admin), then `kubectl get nodes` and
    `triarch verify --context <the cluster's name>` through it."""
    from triarch.components.cluster import kubeconfig

    plane = deployed.plane
    plane.kubectl("create", "serviceaccount", "readme-admin", "-n", "default")
    plane.kubectl("create", "clusterrolebinding", "readme-admin", "--clusterrole", "cluster-admin",
                  "--serviceaccount", "default:readme-admin")
    token = plane.kubectl("create", "token", "readme-admin", "-n", "default").stdout.strip()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "token").write_text(token)
    aws = bin_dir / "aws"
    aws.write_text(AWS_GET_TOKEN)
    aws.chmod(0o755)
    own = yaml.safe_load(plane.kubeconfig.read_text())
    server = own["clusters"][0]["cluster"]["server"]
    ca = base64.b64encode(Path(own["clusters"][0]["cluster"]["certificate-authority"]).read_bytes()).decode()
    exported = tmp_path / "llm-dev.json"
    exported.write_text(kubeconfig("llm-dev", server, ca, "us-east-1"))
    env = {**plane.env(), "KUBECONFIG": str(exported), "PATH": f"{bin_dir}:{plane.env()['PATH']}"}

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(plane.command(list(argv)), env=env, capture_output=True, text=True, timeout=300,
                              check=False)

    nodes = names(deployed.kubectl_json("get", "nodes")["items"])
    listed = run(str(engines.binary("kubectl")), "get", "nodes", "-o", "name")
    assert listed.returncode == 0, listed.stderr
    assert sorted(listed.stdout.split()) == ["node/" + n for n in nodes]
    verified = run(sys.executable, "-m", "triarch.cli", "verify", "--stack-file", str(deployed.stack_file),
                   "--context", "llm-dev")
    assert verified.stdout.startswith("verify lab against its plan\n"), verified.stderr
    gpu_nodes = names([n for n in deployed.kubectl_json("get", "nodes")["items"]
                       if POOL_LABEL in n["metadata"].get("labels", {})])
    assert gpu_nodes
    for node in gpu_nodes:  # the GPU nodes read through the exported kubeconfig, each as planned
        assert f"  ok   node {node} (pool " in verified.stdout, verified.stdout
    # What fails is what the lab does not run (no Prometheus, Ray Serve or vLLM behind kwok's pods), so exit 1.
    failing = [line for line in verified.stdout.splitlines() if line.startswith("  FAIL")]
    assert failing and all(line.startswith(("  FAIL Prometheus:", "  FAIL Ray Serve application ",
                                            "  FAIL vLLM server chat:")) for line in failing), failing
    assert verified.returncode == 1
    calls = (bin_dir / "calls").read_text().splitlines()
    assert len(calls) >= 2 and set(calls) == {"eks get-token --cluster-name llm-dev --region us-east-1"}


def test_the_deployment_became_available_through_pulumis_await(deployed: Lab) -> None:
    deployment = deployed.kubectl_json("get", "deployment", "chat", "-n", SERVING)
    assert deployment["status"]["availableReplicas"] == 2
    state = _state(deployed)
    [resource] = resources_by_type(state)["kubernetes:apps/v1:Deployment"]
    annotations = resource["inputs"]["metadata"].get("annotations") or {}
    assert "pulumi.com/skipAwait" not in annotations
    assert resource["outputs"]["status"]["availableReplicas"] == 2  # read back when Pulumi's await finished


def test_the_serving_namespace_refuses_a_privileged_pod(deployed: Lab) -> None:
    namespace = deployed.kubectl_json("get", "namespace", SERVING)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "privileged-probe", "namespace": SERVING},
           "spec": {"containers": [{"name": "c", "image": "busybox:1.37.0",
                                    "securityContext": {"privileged": True}}]}}
    refused = deployed.plane.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    assert refused.returncode != 0
    assert 'violates PodSecurity "restricted:latest": privileged' in refused.stderr
    # The same pod is admitted where no level is enforced: the refusal is the namespace's.
    pod["metadata"]["namespace"] = "default"
    assert deployed.plane.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(pod)).returncode == 0


def test_a_bound_claim_neither_grows_on_a_class_without_expansion_nor_shrinks(deployed: Lab) -> None:
    """What templates/compat/service-rules.yaml (claimSize) says, asked of the API server: the lab's cache claim is
    bound on the plane's default class, which has no allowVolumeExpansion. A larger size is refused by the resize
    admission plugin, a smaller one by validation, so `pulumi up` of such an edit fails; hence Triarch never sends
    a size to a claim on its EFS class, and `triarch diff` refuses a shrink and notes a growth."""
    claim = deployed.kubectl_json("get", "pvc", "chat-hf-cache", "-n", SERVING)
    assert claim["status"]["phase"] == "Bound"
    storage_class = deployed.kubectl_json("get", "storageclass", claim["spec"]["storageClassName"])
    assert not storage_class.get("allowVolumeExpansion")
    size = claim["spec"]["resources"]["requests"]["storage"]
    assert size.endswith("Gi")
    gib = int(size[:-2])
    for wanted, said in ((gib * 2, "storageclass that provisions the pvc must support resize"),
                         (gib // 2, "can not be less than")):
        patch = {"spec": {"resources": {"requests": {"storage": f"{wanted}Gi"}}}}
        done = deployed.plane.kubectl("patch", "pvc", "chat-hf-cache", "-n", SERVING, "--type", "merge",
                                      "--dry-run=server", "-p", json.dumps(patch), check=False)
        assert done.returncode != 0 and said in done.stderr, (wanted, done.stderr)


ADOPT_PROGRAM = """
import pulumi
import pulumi_kubernetes as k8s
from triarch.components.manifests import crd_files

provider = k8s.Provider("plane", kubeconfig=open({kubeconfig!r}).read())
opts = pulumi.ResourceOptions(provider=provider)
if {forced!r}:
    crd_files("kuberay-operator-crd", [("ray.io_rayservices.yaml", {path!r})], opts)
else:
    k8s.yaml.v2.ConfigFile("plain", file={path!r}, opts=opts)
"""


def _scratch_up(lab: Lab, directory: Path, stack: str, program: str,
                then: str | None = None) -> subprocess.CompletedProcess[str]:
    """`pulumi up` of a scratch program on the plane, then `then` (e.g. "destroy") if it went up; the stack is removed
    from the state afterwards whatever happened. Returns the last command's result."""
    project = scratch_project(directory, program)
    (project / f"Pulumi.{stack}.yaml").write_text("config:\n  scratch:note: adoption\n")
    env = {**os.environ, **lab.plane.env()}
    pulumi = str(engines.binary("pulumi"))
    steps = [[pulumi, "stack", "init", stack, "--secrets-provider", "passphrase", "--non-interactive"],
             [pulumi, "up", "--yes", "--skip-preview", "--stack", stack, "--non-interactive"]]
    if then:
        steps.append([pulumi, then, "--yes", "--skip-preview", "--stack", stack, "--non-interactive"])
    for argv in steps:
        done = subprocess.run(lab.plane.command(argv), env=env, cwd=project, capture_output=True, text=True,
                              timeout=300, check=False)
        if done.returncode != 0:
            break
    subprocess.run(lab.plane.command([pulumi, "stack", "rm", stack, "--force", "--yes", "--non-interactive"]),
                   env=env, cwd=project, capture_output=True, text=True, timeout=120, check=False)
    return done


def _crd(lab: Lab) -> dict[str, Any]:
    shown = lab.plane.kubectl("get", "crd", "rayservices.ray.io", "--show-managed-fields", "-o", "json")
    loaded: dict[str, Any] = json.loads(shown.stdout)
    return loaded


def test_a_crd_another_tool_installed_is_adopted_in_place(lab: Lab, tmp_path: Path) -> None:
    """Existing stacks have KubeRay's CRDs from the chart's crds/ (Helm's field manager). Another manager holds a
    field with another value (kubectl, as Helm would): a plain apply of the release's file conflicts; Triarch's
    (crd_files: forced server-side apply) takes the field over, and the CRD is the same object, not a new one. When
    the CRD goes from the stack (here the whole stack is destroyed), it stays in the cluster with its objects, as
    Helm left its crds/: deleting it would delete every RayService in the cluster."""
    path = reference_file("kuberay-v1.7.0", "ray.io_rayservices.yaml")
    key = "controller-gen.kubebuilder.io/version"
    shipped = yaml.safe_load(path.read_text())["metadata"]["annotations"][key]
    before = _crd(lab)
    lab.plane.kubectl("annotate", "crd", "rayservices.ray.io", f"{key}=v0.0.1", "--overwrite")
    program = ADOPT_PROGRAM.format(kubeconfig=str(lab.plane.kubeconfig), path=str(path), forced=False)
    plain = _scratch_up(lab, tmp_path / "plain", "plain", program)
    assert plain.returncode != 0 and "conflict" in plain.stdout.lower(), plain.stdout[-2000:]
    program = ADOPT_PROGRAM.format(kubeconfig=str(lab.plane.kubeconfig), path=str(path), forced=True)
    adopted = _scratch_up(lab, tmp_path / "adopted", "adopted", program, then="destroy")
    assert adopted.returncode == 0, adopted.stdout[-3000:]
    after = _crd(lab)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["metadata"]["annotations"][key] == shipped
    assert any(m["manager"].startswith("pulumi-kubernetes") for m in after["metadata"]["managedFields"])


def test_the_second_up_changes_nothing(deployed: Lab) -> None:
    """As the workflows run it (.github/actions/pulumi: `refresh: true`): the live state read first, so a field the
    cluster defaults or a controller writes would show as drift here."""
    done = deployed.pulumi("preview", "--refresh", "--expect-no-changes", "--diff", check=False)
    assert done.returncode == 0, done.stdout[-3000:]


def test_the_nodes_carry_the_pools_labels_after_triarch_patched_them(deployed: Lab) -> None:
    declared = {g["name"]: g["nodes"] for g in deployed.config["triarch:nodeGroups"]}
    for pool, members in declared.items():
        nodes = deployed.kubectl_json("get", "nodes", "-l", f"{POOL_LABEL}={pool}")["items"]
        assert names(nodes) == sorted(members)
    state = _state(deployed)
    patched = {r["inputs"]["metadata"]["name"] for r in resources_by_type(state)["kubernetes:core/v1:NodePatch"]}
    assert patched == {n for members in declared.values() for n in members}


# --- the harness itself -----------------------------------------------------------------------------------------


def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    require_engines()
    monkeypatch.setenv("TRIARCH_LOCAL_HOME", str(tmp_path))
    return f"h{os.getpid()}"


@pytest.mark.usefixtures("engines_required")
def test_an_engine_that_does_not_come_up_is_one_line_and_leaves_nothing(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    name = _isolated(tmp_path, monkeypatch)
    planned = plane_module.component_args

    def broken(*args: Any) -> dict[str, list[str]]:
        argv = planned(*args)
        argv["kube-apiserver"].append("--no-such-flag")
        return argv

    monkeypatch.setattr(plane_module, "component_args", broken)
    made = recording_namespaces(monkeypatch)
    with pytest.raises(PlaneError) as error:
        up(PlaneSpec(name, "ctx", []), log=lambda _: None)
    message = str(error.value)
    assert message.startswith("kube-apiserver exited while the plane started: Error: unknown flag: --no-such-flag")
    assert "\n" not in message
    assert made and all(namespace_gone(namespace) for namespace in made)
    assert not (tmp_path / name).exists()
    assert _running(tmp_path) == []


def _running(under: Path) -> list[int]:
    """Processes whose command line mentions a path under `under` (this test's plane)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if str(under) in (proc / "cmdline").read_text(errors="replace").replace("\0", " "):
                    state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state != "Z":
                        found.append(int(proc.name))
            except OSError:
                continue
    return found


@pytest.mark.usefixtures("engines_required")
def test_down_ends_every_process_of_the_plane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = _isolated(tmp_path, monkeypatch)
    made = recording_namespaces(monkeypatch)
    plane = up(PlaneSpec(name, "ctx", []), log=lambda _: None)
    try:
        # whose it is: `down` and `exec` naming no plane take the user's own (issue 36)
        assert plane.state()["owner"] == {"user": getpass.getuser(), "host": socket.gethostname().split(".")[0]}
        assert only_plane() == name
        with pytest.raises(PlaneError, match=rf"local plane '{name}' is already up"):
            up(PlaneSpec(name, "ctx", []), log=lambda _: None)
        # A process anyone started in the namespace (a port-forward left behind, say) ends too, even one that
        # ignores SIGTERM.
        stray = subprocess.Popen(plane.command(["sh", "-c", "trap '' TERM; while :; do sleep 1; done"]),
                                 start_new_session=True)
        assert len(_running(tmp_path)) >= 5  # etcd, the API server, controller manager, scheduler, kwok
    finally:
        down(name, quiet=True)
    stray.wait(timeout=10)
    assert _running(tmp_path) == []
    assert made and all(namespace_gone(namespace) for namespace in made)
    assert not (tmp_path / name).exists()



@pytest.mark.usefixtures("engines_required")
def test_down_ends_a_user_namespace_whose_holder_was_killed_first(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder only keeps the namespace: once it is gone (killed by anyone), the plane's processes still hold
    the namespace, and `down` still finds them (by the namespace's inode) and ends them."""
    name = _isolated(tmp_path, monkeypatch)
    monkeypatch.setenv("TRIARCH_NETNS", "user")
    try:
        netns.choose()
    except netns.NetnsError as error:
        pytest.skip(str(error))
    plane = up(PlaneSpec(name, "ctx", []), log=lambda _: None)
    namespace = plane.namespace()
    try:
        assert namespace.holder is not None
        os.kill(namespace.holder, signal.SIGKILL)
        os.waitpid(namespace.holder, 0)
        assert not namespace.exists() and len(namespace.pids()) >= 5
    finally:
        down(name, quiet=True)
    assert namespace.pids() == [] and _running(tmp_path) == []


@pytest.mark.usefixtures("engines_required")
def test_an_operator_that_does_not_come_up_is_its_own_last_words_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = _isolated(tmp_path, monkeypatch)
    planned = operators_module.OPERATORS["kuberay"]

    def broken(*args: Any) -> operators_module.Operator:
        operator = planned(*args)
        operator.processes["kuberay-operator"].append("--no-such-flag")
        return operator

    monkeypatch.setitem(operators_module.OPERATORS, "kuberay", broken)
    made = recording_namespaces(monkeypatch)
    with pytest.raises(PlaneError) as error:
        up(PlaneSpec(name, "ctx", [], operators=("kuberay",)), log=lambda _: None)
    message = str(error.value)
    assert message.startswith("kuberay-operator exited while the plane started: ")
    assert "no-such-flag" in message and "\n" not in message
    assert made and all(namespace_gone(namespace) for namespace in made)
    assert _running(tmp_path) == []
