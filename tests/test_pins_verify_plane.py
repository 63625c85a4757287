"""Pins (issue 53) on what a user relies on in two places: `triarch verify`'s readiness verdicts (triarch.verify), on
cluster objects written here in the shapes `kubectl get -o json` returns, as tests/test_verify.py does; and the local
plane's kubeconfig and context (triarch.local.plane, triarch.local.stack) with the stand-in kubelet's `mount-secret`
and `restart-always` (triarch.local.kubelet), run as the plane runs them, with a kubectl stand-in. Every expected
value is written out from the documented behaviour (docs/day2.md, docs/real-engines.md, Kubernetes' own), never
computed by the code under test."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT
from test_verify import local_stack
from triarch.local.pki import Pki
from triarch.local.plane import Plane, is_plane_kubeconfig, kubeconfig, plane
from triarch.verify.base import Finding, check_ready, report
from triarch.verify.how import check_ray_service
from triarch.verify.where import check_nodes, prometheus_service

# --- `triarch verify`: readiness -------------------------------------------------------------------------------


def deployment(name: str, namespace: str, release: str, wanted: int | None, **status: int) -> dict[str, Any]:
    """A Deployment as `kubectl get deployments -o json` lists it (spec.replicas left out where None: the API
    server's default is 1)."""
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": name}}}
    if wanted is not None:
        spec["replicas"] = wanted
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/instance": release}},
            "spec": spec, "status": dict(status)}


def daemonset(name: str, namespace: str, **status: int) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/instance": name}},
            "spec": {}, "status": dict(status)}


def test_a_deployment_with_pods_running_but_not_ready_is_not_ready() -> None:
    """Kubernetes counts a Deployment's Ready pods in status.readyReplicas; status.replicas counts every pod it
    created, ready or not. Two wanted, two created, one Ready: Karpenter is not ready (docs/day2.md: verify checks
    "that ... Karpenter ... [is] ready")."""
    karpenter = deployment("karpenter", "kube-system", "karpenter", 2, replicas=2, updatedReplicas=2,
                           readyReplicas=1, availableReplicas=1, unavailableReplicas=1)
    finding = check_ready([karpenter], "karpenter", "where", "Karpenter")
    assert finding == Finding("where", "Karpenter", False, "Deployment karpenter: 1 of 2 ready",
                              "kubectl -n kube-system describe deployment karpenter")


def test_a_deployment_that_names_no_replicas_wants_one() -> None:
    """spec.replicas defaults to 1 (the Deployment API's default): a Deployment written without it and no Ready pod
    is not ready; with its one pod Ready it is."""
    waiting = deployment("kuberay-operator", "kuberay", "kuberay-operator", None, replicas=1)
    finding = check_ready([waiting], "kuberay-operator", "how", "KubeRay operator")
    assert (finding.ok, finding.message) == (False, "Deployment kuberay-operator: 0 of 1 ready")
    ready = deployment("kuberay-operator", "kuberay", "kuberay-operator", None, replicas=1, readyReplicas=1)
    assert check_ready([ready], "kuberay-operator", "how", "KubeRay operator") == Finding(
        "how", "KubeRay operator", True, "1 workload(s) ready")


def test_a_daemonset_scheduled_everywhere_but_not_ready_everywhere_is_not_ready() -> None:
    """A DaemonSet's Ready pods are status.numberReady; currentNumberScheduled counts the nodes running one, ready or
    not. Three GPU nodes, three scheduled, two Ready: the device plugin is not ready."""
    plugin = daemonset("nvidia-device-plugin", "nvidia-device-plugin", desiredNumberScheduled=3,
                       currentNumberScheduled=3, numberReady=2, numberAvailable=2, numberUnavailable=1)
    finding = check_ready([plugin], "nvidia-device-plugin", "where", "NVIDIA device plugin")
    assert (finding.ok, finding.message, finding.fix) == (
        False, "DaemonSet nvidia-device-plugin: 2 of 3 ready",
        "kubectl -n nvidia-device-plugin describe daemonset nvidia-device-plugin")


def test_only_the_releases_own_workloads_count() -> None:
    """A release's workloads are those labelled app.kubernetes.io/instance=<release> (Helm's label): another
    release's unready Deployment in the same namespace says nothing of this one."""
    ours = deployment("karpenter", "kube-system", "karpenter", 1, replicas=1, readyReplicas=1)
    theirs = deployment("coredns", "kube-system", "coredns", 2, replicas=2, readyReplicas=0)
    assert check_ready([theirs, ours], "karpenter", "where", "Karpenter") == Finding(
        "where", "Karpenter", True, "1 workload(s) ready")
    assert not check_ready([theirs], "karpenter", "where", "Karpenter").ok


def test_a_ray_serve_application_still_deploying_is_not_ready() -> None:
    """docs/day2.md: "every Ray Serve application is RUNNING". DEPLOYING (Ray Serve's ApplicationStatus while its
    replicas start) is not yet."""
    service = {"status": {"activeServiceStatus": {"applicationStatuses": {
        "chat": {"status": "RUNNING"}, "qwen": {"status": "DEPLOYING"}}}}}
    findings = {f.subject: f for f in check_ray_service(service, ["chat", "qwen"])}
    assert findings["Ray Serve application chat"] == Finding("how", "Ray Serve application chat", True,
                                                             "status RUNNING")
    deploying = findings["Ray Serve application qwen"]
    assert (deploying.ok, deploying.message) == (False, "status DEPLOYING")
    assert deploying.fix.startswith("kubectl describe rayservice ")


def test_a_pool_scaled_to_zero_is_not_a_failure() -> None:
    """GPU pools scale from zero (README): a pool with no node up is reported, and passes."""
    _, _, pools = local_stack()  # stacks/Pulumi.local.yaml: one node group, laptop
    assert list(check_nodes([], pools)) == [Finding("where", "pool laptop", True,
                                                    "no nodes up (the pool may be scaled to zero)")]


def test_the_report_counts_what_passed_and_what_failed_layer_by_layer() -> None:
    """`triarch verify` "prints each finding with its fix" (docs/day2.md), where first, then how, then when, and
    a last line counting both."""
    findings = [Finding("when", "vLLM server chat", False, "/health answered 503", "kubectl logs"),
                Finding("where", "pool l4", True, "no nodes up"),
                Finding("how", "Ray Serve application qwen", True, "status RUNNING")]
    assert report(findings).splitlines() == [
        "Where (Kubernetes)", "  ok   pool l4: no nodes up",
        "How (Ray)", "  ok   Ray Serve application qwen: status RUNNING",
        "When (vLLM)", "  FAIL vLLM server chat: /health answered 503 -> kubectl logs",
        "2 ok, 1 failing"]


def test_an_https_prometheus_url_without_a_port_is_forwarded_to_443() -> None:
    """A URL without a port means the scheme's default (RFC 9110: 80 for http, 443 for https): the service port to
    forward for https://prometheus.obs.svc is 443."""
    assert prometheus_service("https://prometheus.obs.svc") == ("obs", "prometheus", 443)


# --- the local plane: its kubeconfig and context ---------------------------------------------------------------

KUBECTL = shutil.which("kubectl")


def test_the_planes_kubeconfig_selects_its_context_on_its_api_server(tmp_path: Path) -> None:
    """docs/real-engines.md: `local up` writes "a kubeconfig at the path and with the context the stack names";
    the API server listens on loopback port 16443 (plane.API_PORT), over TLS, with the plane's CA and an admin
    client certificate. kubectl (where installed) reads the file so."""
    pki = Pki(tmp_path / "pki")
    config = kubeconfig("triarch-lab", pki)
    assert config["current-context"] == "triarch-lab"
    [context] = config["contexts"]
    [cluster] = config["clusters"]
    [user] = config["users"]
    assert context["name"] == "triarch-lab"
    assert context["context"] == {"cluster": cluster["name"], "user": user["name"]}
    assert cluster["cluster"] == {"server": "https://127.0.0.1:16443",
                                  "certificate-authority": str(tmp_path / "pki" / "ca.crt")}
    assert user["user"] == {"client-certificate": str(tmp_path / "pki" / "admin.crt"),
                            "client-key": str(tmp_path / "pki" / "admin.key")}
    written = tmp_path / "kubeconfig"
    written.write_text(yaml.safe_dump(config, sort_keys=False))
    # What `local up` wrote, it may replace on the next `up` and remove on `down`.
    assert is_plane_kubeconfig(written)
    if KUBECTL is None:
        return
    minified = subprocess.run([KUBECTL, "--kubeconfig", str(written), "config", "view", "--minify", "-o", "json"],
                              capture_output=True, text=True, timeout=30, check=True)
    seen = json.loads(minified.stdout)
    assert seen["current-context"] == "triarch-lab"
    assert [c["cluster"]["server"] for c in seen["clusters"]] == ["https://127.0.0.1:16443"]


def test_a_kubeconfig_not_all_the_planes_is_never_taken_for_one(tmp_path: Path) -> None:
    """`local up` refuses to overwrite a kubeconfig "not a local plane's" (lifecycle.up) and `down` removes only
    a plane's: a user's file naming their own cluster beside a plane's, or naming no cluster, is not a plane's."""
    plane_cluster = {"name": "triarch-local-triarch-lab", "cluster": {"server": "https://127.0.0.1:16443"}}
    theirs = {"name": "arn:aws:eks:us-east-1:123456789012:cluster/prod", "cluster": {"server": "https://eks.example"}}
    mixed = tmp_path / "mixed"
    mixed.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "clusters": [plane_cluster, theirs]}))
    assert not is_plane_kubeconfig(mixed)
    empty = tmp_path / "empty"
    empty.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "clusters": [], "contexts": []}))
    assert not is_plane_kubeconfig(empty)
    assert not is_plane_kubeconfig(tmp_path / "absent")


def test_a_plane_lives_under_the_cache_and_its_commands_use_its_kubeconfig(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """stacks/Pulumi.lab.yaml: the lab's kubeconfig is ~/.cache/triarch/local/lab/kubeconfig, "written by `triarch
    local up --stack lab`". docs/real-engines.md: `local exec` runs a command with that KUBECONFIG (never the
    user's own), and the passphrase triarch-local unless PULUMI_CONFIG_PASSPHRASE is set."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for variable in ("TRIARCH_LOCAL_HOME", "XDG_CACHE_HOME", "PULUMI_CONFIG_PASSPHRASE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "home" / ".kube" / "config"))
    lab = plane("lab")
    assert lab.kubeconfig == tmp_path / "home" / ".cache" / "triarch" / "local" / "lab" / "kubeconfig"
    env = lab.env()
    assert env["KUBECONFIG"] == str(tmp_path / "home" / ".cache" / "triarch" / "local" / "lab" / "kubeconfig")
    assert env["PULUMI_CONFIG_PASSPHRASE"] == "triarch-local"
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "mine")
    assert Plane("lab", lab.directory).env()["PULUMI_CONFIG_PASSPHRASE"] == "mine"


def test_a_planes_context_is_the_one_the_stack_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An adopted stack's plane has the context and kubeconfig its triarch:cluster names (lab: triarch-lab, at
    ~/.cache/triarch/local/lab/kubeconfig); a created stack's gets one of its own, triarch-<plane> (stack.py
    spec_for_stack). The CRDs are left out: they come from the reference cache, not needed for the names."""
    from triarch.local import stack as local_stack_module
    from triarch.report.validation import validate_stack_file

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(local_stack_module, "crd_files", lambda sets, references: [])
    lab = validate_stack_file("lab", ROOT / "stacks" / "Pulumi.lab.yaml").stack
    spec = local_stack_module.spec_for_stack("lab-ana-gpubox", lab, [])
    assert spec.context == "triarch-lab"
    assert spec.kubeconfig_copy == tmp_path / "home" / ".cache" / "triarch" / "local" / "lab" / "kubeconfig"
    prod = validate_stack_file("prod", ROOT / "stacks" / "Pulumi.prod.yaml").stack
    spec = local_stack_module.spec_for_stack("prod-ana-gpubox", prod, [])
    assert (spec.context, spec.kubeconfig_copy) == ("triarch-prod-ana-gpubox", None)


# --- the stand-in kubelet: mount-secret and restart-always -----------------------------------------------------

WATCH = """#!{python}
import json, pathlib, sys
pathlib.Path({calls!r}).open("a").write(" ".join(sys.argv[1:]) + "\\n")
wanted = ["get", "secrets", "-n", "keda", "--field-selector", "metadata.name=kedaorg-certs", "--watch", "-o", "json"]
if sys.argv[1:] != wanted:
    sys.exit(1)
for data in {documents!r}:
    print(json.dumps({{"kind": "Secret", "metadata": {{"name": "kedaorg-certs", "namespace": "keda"}},
                      "data": data}}, indent=4), flush=True)
"""


def b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def wait_for(done: Callable[[], bool], seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.1)
    return done()


def test_mount_secret_keeps_the_secrets_keys_as_files_as_a_secret_volume_does(tmp_path: Path) -> None:
    """A Secret volume holds each key of the Secret as a file of its decoded value (Kubernetes: data is base64 in the
    API, plain in the file), and follows a change of the Secret (a rotated certificate) into the files. The watch is
    `kubectl get secrets -n NS --field-selector metadata.name=NAME --watch -o json` (kubelet.mount_secret); the
    stand-in kubectl answers that alone. SIGTERM ends it with exit 0."""
    calls = tmp_path / "calls"
    documents = [{"tls.crt": b64(b"first certificate\n")},
                 {"tls.crt": b64(b"rotated certificate\n"), "tls.key": b64(b"\x00private key\xff")}]
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(WATCH.format(python=sys.executable, calls=str(calls), documents=documents))
    kubectl.chmod(0o755)
    mounted = tmp_path / "certs"
    kubelet = subprocess.Popen([sys.executable, "-m", "triarch.local.kubelet", "mount-secret", "kedaorg-certs", "-n",
                                "keda", str(mounted)], env={**os.environ, "TRIARCH_KUBECTL": str(kubectl)},
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        def both() -> bool:
            return (mounted / "tls.key").is_file() and (mounted / "tls.crt").read_bytes() == b"rotated certificate\n"
        assert wait_for(both), sorted(p.name for p in mounted.iterdir()) if mounted.is_dir() else "no directory"
        assert (mounted / "tls.key").read_bytes() == b"\x00private key\xff"
        assert sorted(p.name for p in mounted.iterdir()) == ["tls.crt", "tls.key"]
    finally:
        kubelet.send_signal(signal.SIGTERM)
        out, _ = kubelet.communicate(timeout=10)
    assert kubelet.returncode == 0
    assert out.splitlines()[:3] == ["secret keda/kedaorg-certs: wrote tls.crt"] * 2 + [
        "secret keda/kedaorg-certs: wrote tls.key"]


def _gone(pid: int) -> bool:
    """Whether a process has ended (a zombie not yet reaped has too)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_stopping_restart_always_stops_the_command_it_runs(tmp_path: Path) -> None:
    """`restart-always` runs its command "until this process is asked to stop (then the command is too)"
    (kubelet.restart_always), as stopping a pod stops its container: a long-running command does not outlive its
    stand-in kubelet's SIGTERM. And a command that exits is started again, said in a line naming its exit code."""
    pid_file = tmp_path / "pid"
    script = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    kubelet = subprocess.Popen([sys.executable, "-m", "triarch.local.kubelet", "restart-always", "--",
                                sys.executable, "-c", script], stdout=subprocess.DEVNULL)
    pid = 0
    try:
        assert wait_for(lambda: pid_file.is_file() and pid_file.read_text().isdigit())
        pid = int(pid_file.read_text())
        kubelet.send_signal(signal.SIGTERM)
        assert kubelet.wait(timeout=10) == 0
        assert wait_for(lambda: _gone(pid), 5), "the command outlived its kubelet"
    finally:
        if kubelet.poll() is None:
            kubelet.kill()
        if pid and not _gone(pid):
            os.kill(pid, signal.SIGKILL)
    said = tmp_path / "said"
    with said.open("w") as out:
        looping = subprocess.Popen([sys.executable, "-m", "triarch.local.kubelet", "restart-always", "--", "sh", "-c",
                                    "exit 3"], stdout=out)
        try:
            assert wait_for(lambda: "exited 3" in said.read_text(), 10)
        finally:
            looping.send_signal(signal.SIGTERM)
            looping.wait(timeout=10)
    assert said.read_text().splitlines()[0] == "sh exited 3: starting it again"
