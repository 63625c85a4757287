"""Starting and stopping a local Kubernetes control plane on the real engines: etcd, the API server (RBAC, a
client certificate in system:masters, a service-account issuer), the controller manager, the scheduler and kwok, all
on loopback inside a network namespace of its own with only `lo`, so nothing the API server calls (webhooks,
services) leaves the machine.

`up` starts it and installs what a stack expects of the cluster (the CRDs of the components it says are already
there, kwok nodes as its pools would have them, a storage class kwok provisions); `down` ends every process in the
namespace and removes it. How the namespace is made and entered (as root, in a user namespace, or through sudo)
is triarch.local.netns's choice, recorded in the plane's state."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from triarch.datafiles import read_yaml_documents
from triarch.local import netns
from triarch.local.engines import binary, installed, load_engines
from triarch.local.netns import Namespace
from triarch.local.operators import OPERATORS
from triarch.local.pki import FRONT_PROXY_CLIENT, Pki, issue, write_pki
from triarch.local.plane import (
    API_PORT,
    ETCD_PORT,
    LOCAL_ADDRESSES,
    MIRROR_ADDRESS,
    MIRROR_PATH,
    POD_RANGE,
    SERVICE_RANGE,
    STORAGE_CLASS,
    Plane,
    PlaneError,
    PlaneSpec,
    is_plane_kubeconfig,
    kubeconfig,
    owner,
    plane,
)

START_TIMEOUT = 90.0
"""Seconds for the whole plane to answer (a warm start takes 10-20 s)."""
STOP_TIMEOUT = 5.0


def _netns_exists(p: Plane) -> bool:
    """Whether a named namespace of the plane's is left (root or sudo mode, from a plane not brought down)."""
    return Namespace("root", p.netns).exists()


def component_args(p: Plane, pki: Pki, kwok_config: Path) -> dict[str, list[str]]:
    """Each process's command line, in start order (flags as envtest and kwokctl run them)."""
    kube = str(p.kubeconfig)
    return {
        "etcd": [str(binary("etcd")), "--name", "plane", "--data-dir", str(p.directory / "etcd"),
                 "--listen-client-urls", f"http://127.0.0.1:{ETCD_PORT}",
                 "--advertise-client-urls", f"http://127.0.0.1:{ETCD_PORT}",
                 "--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls",
                 "http://127.0.0.1:2380", "--initial-cluster", "plane=http://127.0.0.1:2380",
                 "--unsafe-no-fsync", "--quota-backend-bytes", str(2 << 30)],
        "kube-apiserver": [
            str(binary("kube-apiserver")), f"--etcd-servers=http://127.0.0.1:{ETCD_PORT}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={API_PORT}",
            f"--tls-cert-file={pki.serving.cert}", f"--tls-private-key-file={pki.serving.key}",
            f"--client-ca-file={pki.ca}", "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            f"--service-cluster-ip-range={SERVICE_RANGE}",
            # Privileged containers are allowed cluster-wide, as on EKS: Pod Security admission is what refuses
            # them per namespace, and the tests prove that it does.
            "--allow-privileged=true", "--profiling=false", "--enable-priority-and-fairness=false",
            # Aggregated APIs (an operator's metrics API): the API server proves itself with the front-proxy client
            # certificate and routes to the API's endpoints rather than its Service's cluster IP (no kube-proxy).
            f"--requestheader-client-ca-file={pki.front_proxy_ca}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}", "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group", "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki.front_proxy_client.cert}",
            f"--proxy-client-key-file={pki.front_proxy_client.key}", "--enable-aggregator-routing=true"],
        "kube-controller-manager": [
            str(binary("kube-controller-manager")), f"--kubeconfig={kube}", f"--authentication-kubeconfig={kube}",
            f"--authorization-kubeconfig={kube}", "--leader-elect=false", "--bind-address=127.0.0.1",
            f"--service-account-private-key-file={pki.service_account_key}", f"--root-ca-file={pki.ca}",
            f"--service-cluster-ip-range={SERVICE_RANGE}", "--controllers=*,-nodeipam", "--profiling=false"],
        "kube-scheduler": [
            str(binary("kube-scheduler")), f"--kubeconfig={kube}", f"--authentication-kubeconfig={kube}",
            f"--authorization-kubeconfig={kube}", "--leader-elect=false", "--bind-address=127.0.0.1",
            "--profiling=false"],
        "kwok": [
            str(binary("kwok")), f"--kubeconfig={kube}", f"--config={kwok_config}",
            "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            # The node address kwok reports is a value only, unreachable (the namespace has no route), so a call to a
            # kubelet fails at once instead of leaving the machine; pods get addresses of the plane's own.
            "--node-ip=10.0.0.1", f"--cidr={POD_RANGE}", "--node-lease-duration-seconds=40",
            "--server-address=127.0.0.1:10247"],
    }


def kwok_stages(storage_classes: Sequence[str]) -> str:
    """kwok's own stages (nodes Ready with a lease heartbeat; pods created, Ready, completed, deleted; claims of
    the plane's storage classes given a volume and bound), read from the kwok module beside the binary."""
    stages_dir = binary("kwok").parent / "kwok-stages"
    classes = ", ".join(f"'{c}'" for c in storage_classes)
    texts = []
    for path in sorted(stages_dir.glob("*.yaml")):
        text = path.read_text()
        if path.name.startswith(("pvc-", "pv-")):
            text = text.replace(f"self.spec.storageClassName == '{STORAGE_CLASS}'",
                                f"self.spec.storageClassName in [{classes}]")
        texts.append(text.strip())
    if not texts:
        raise PlaneError(f"no kwok stages in {stages_dir}; rebuild the kwok engine (`triarch local build kwok`)")
    return "\n---\n".join(texts) + "\n"


def storage_class(name: str) -> dict[str, Any]:
    annotations = {"storageclass.kubernetes.io/is-default-class": "true"} if name == STORAGE_CLASS else {}
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": name, "annotations": annotations},
            "provisioner": "kwok.x-k8s.io/volume", "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"}


def _start(p: Plane, component: str, argv: list[str], env: dict[str, str] | None = None) -> int:
    log = p.log(component).open("ab")
    process = subprocess.Popen(p.command(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               env={**p.env(), **(env or {})}, start_new_session=True)
    log.close()
    return process.pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's (sudo's, in sudo mode): alive unless a zombie
        pass
    # A zombie (exited, not yet reaped by us) is not alive.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


FAILURE_LINE = re.compile(r'^(Error|error|E\d{4}|F\d{4})\b|^flag provided but not defined|^panic:'
                          r'|"level":"(error|fatal|dpanic|panic|ERROR|FATAL|DPANIC|PANIC)"|\blevel=(error|fatal)\b')
"""How the engines mark a fatal line: cobra's `Error:`, Go's flag package, a panic, klog's E/F prefix, the JSON
levels of etcd, kwok and the operators (zap, upper or lower case)."""


def failure_cause(path: Path) -> str:
    """The line of a log that says why a process stopped: its last error line, else its last line."""
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    failing = [line for line in lines if FAILURE_LINE.search(line)]
    return (failing or lines or [""])[-1][:300]


def _wait(what: str, ready: Callable[[], bool], pids: dict[str, int], p: Plane, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for component, pid in pids.items():
            if not _alive(pid):
                raise PlaneError(f"{component} exited while the plane started: {failure_cause(p.log(component))} "
                                 f"(log: {p.log(component)})")
        if ready():
            return
        time.sleep(0.5)
    raise PlaneError(f"the plane did not become ready within {timeout:.0f}s waiting for {what} "
                     f"(logs: {p.directory / 'logs'})")


def up(spec: PlaneSpec, log: Callable[[str], None] = print) -> Plane:
    """Start a plane and install what the spec holds; on any failure nothing is left running."""
    choice = netns.choose()
    load_engines()  # a broken pins file fails here, before anything starts
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubectl"):
        binary(name)
    p = plane(spec.name)
    if _netns_exists(p) or p.state_file.exists():
        raise PlaneError(f"local plane {spec.name!r} is already up (or was not brought down); "
                         f"`triarch local down --name {spec.name}` first")
    copy = spec.kubeconfig_copy
    if copy is not None and copy.exists() and not is_plane_kubeconfig(copy):
        raise PlaneError(f"{spec.kubeconfig_copy} exists and is not a local plane's kubeconfig; point the stack's "
                         "triarch:cluster.kubeconfig at a file of its own")
    if p.directory.exists():
        shutil.rmtree(p.directory)
    (p.directory / "logs").mkdir(parents=True)
    p.pulumi_backend.mkdir()
    start = time.monotonic()
    namespace = netns.create(choice, p.netns, LOCAL_ADDRESSES)
    pids: dict[str, int] = {}
    try:
        def record() -> None:
            p.state_file.write_text(json.dumps(
                {"name": spec.name, "owner": owner(), "netns": namespace.state(), "context": spec.context,
                 "pids": pids,
                 "kubeconfigCopy": str(spec.kubeconfig_copy) if spec.kubeconfig_copy else None}, indent=1))

        record()  # from here on, `down` (or anyone's `exec`) finds the namespace
        pki = write_pki(p.directory / "pki")
        config = yaml.safe_dump(kubeconfig(spec.context, pki), sort_keys=False)
        p.kubeconfig.write_text(config)
        kwok_config = p.directory / "kwok.yaml"
        kwok_config.write_text(kwok_stages(spec.storage_classes))
        args = component_args(p, pki, kwok_config)
        for component in ("etcd", "kube-apiserver"):
            pids[component] = _start(p, component, args[component])
        _wait("the API server", lambda: p.kubectl("get", "--raw=/readyz", check=False).returncode == 0, pids, p,
              START_TIMEOUT)
        for component in ("kube-controller-manager", "kube-scheduler", "kwok"):
            pids[component] = _start(p, component, args[component])
        record()
        _wait("the default service account", lambda: p.kubectl(
            "get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0, pids, p, START_TIMEOUT)
        if spec.charts:
            pids["oci-registry"] = _start_mirror(p, pki, spec.charts, spec.files, pids)
            record()
        _install(p, spec)
        _wait(f"{len(spec.nodes)} node(s) Ready", lambda: _nodes_ready(p) >= len(spec.nodes), pids, p,
              START_TIMEOUT)
        for operator in spec.operators:
            start_operator(p, operator, spec)
        _apply(p, spec.objects)
        _install_pulumi_plugins(p, log)
        if spec.kubeconfig_copy is not None:
            spec.kubeconfig_copy.parent.mkdir(parents=True, exist_ok=True)
            spec.kubeconfig_copy.write_text(config)
    except BaseException:
        if not p.state_file.exists():
            _end(namespace)
        down(spec.name, quiet=True)
        raise
    log(f"local plane {spec.name} up in {time.monotonic() - start:.0f}s: context {spec.context}, "
        f"kubeconfig {spec.kubeconfig_copy or p.kubeconfig}, {len(spec.nodes)} kwok node(s), "
        f"{len(spec.crds)} CRD file(s); {choice.line}")
    return p


def _start_mirror(p: Plane, pki: Pki, charts: Sequence[Path], files: dict[str, bytes], pids: dict[str, int]
                  ) -> int:
    """The plane's chart mirror: the registry on its loopback with a certificate from the plane's CA, which the
    plane's trust bundle adds to the system's; each archive pushed as `helm push` would."""
    missing = [str(path) for path in charts if not path.is_file()]
    if missing:
        raise PlaneError(f"chart archive {missing[0]} does not exist")
    pair = issue(pki, "oci-registry", ips=("127.0.0.1",), dns=("localhost",))
    system = ssl.get_default_verify_paths().cafile
    bundle = Path(system).read_text() if system and Path(system).is_file() else ""
    p.trust_bundle.write_text(bundle + pki.ca.read_text())
    blobs, served = p.directory / "oci-registry", p.directory / "mirror-files"
    blobs.mkdir(exist_ok=True)
    for relative, data in files.items():
        (served / relative).parent.mkdir(parents=True, exist_ok=True)
        (served / relative).write_bytes(data)
    pid = _start(p, "oci-registry", [str(binary("oci-registry")), f"--listen={MIRROR_ADDRESS}",
                                     f"--cert={pair.cert}", f"--key={pair.key}", f"--disk={blobs}",
                                     f"--files={served}"])
    url = f"https://{MIRROR_ADDRESS}"
    _wait("the chart mirror", partial(_answers, p, f"{url}/v2/"), {**pids, "oci-registry": pid}, p, START_TIMEOUT)
    p.run([sys.executable, "-m", "triarch.local.mirror", url, MIRROR_PATH, str(pki.ca), *map(str, charts)])
    return pid


def start_operator(p: Plane, name: str, spec: PlaneSpec | None = None) -> None:
    """Run one operator on a plane that is up (its processes join the plane's, and end with it)."""
    if name not in OPERATORS:
        raise PlaneError(f"unknown operator {name}; allowed: {', '.join(sorted(OPERATORS))}")
    operator = OPERATORS[name](p, Pki(p.directory / "pki"), spec or PlaneSpec(p.name, "", []))
    install_crds(p, operator.crds)
    _apply(p, operator.objects)
    state = p.state()
    started = {component: _start(p, component, argv, operator.env) for component, argv in operator.processes.items()}
    state["pids"] = {**state["pids"], **started}
    p.state_file.write_text(json.dumps(state, indent=1))
    if operator.ready:
        _wait(f"{name} ({operator.ready})", partial(_answers, p, operator.ready), started, p, START_TIMEOUT)
    for apiservice in [o["metadata"]["name"] for o in operator.objects if o["kind"] == "APIService"]:
        _wait(f"{name}'s APIService {apiservice}", partial(_available, p, apiservice), started, p, START_TIMEOUT)


def stop_operator(p: Plane, name: str) -> None:
    """End one operator on a plane that is up and remove the objects it brought (an APIService left behind with
    no process would fail every client's discovery); its CRDs stay with whoever installed them."""
    if name not in OPERATORS:
        raise PlaneError(f"unknown operator {name}; allowed: {', '.join(sorted(OPERATORS))}")
    operator = OPERATORS[name](p, Pki(p.directory / "pki"), PlaneSpec(p.name, "", []))
    state = p.state()
    pids = {c: pid for c, pid in state["pids"].items() if c in operator.processes}
    # What was started is the operator itself, or sudo above it (sudo mode): end the operator, below it.
    tree = [each for pid in pids.values() for each in _tree(pid)]
    for pid in tree:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline and any(_alive(pid) for pid in tree):
        time.sleep(0.2)
    for pid in tree:
        _signal(pid, signal.SIGKILL)
    state["pids"] = {c: pid for c, pid in state["pids"].items() if c not in pids}
    p.state_file.write_text(json.dumps(state, indent=1))
    if operator.objects:
        p.kubectl("delete", "--ignore-not-found", "--wait=true", "-f", "-",
                  input=yaml.safe_dump_all(list(reversed(operator.objects)), sort_keys=False))


HTTP_OK = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)"


def _answers(p: Plane, url: str) -> bool:
    """Whether a URL inside the plane's namespace answers 2xx."""
    done = subprocess.run(p.command([sys.executable, "-c", HTTP_OK, url]), env=p.env(), capture_output=True,
                          check=False)
    return done.returncode == 0


def _available(p: Plane, apiservice: str) -> bool:
    done = p.kubectl("get", "apiservice", apiservice, "-o", "json", check=False)
    if done.returncode != 0:
        return False
    conditions = json.loads(done.stdout).get("status", {}).get("conditions", [])
    return any(c.get("type") == "Available" and c.get("status") == "True" for c in conditions)


def _apply(p: Plane, objects: list[dict[str, Any]]) -> None:
    if objects:  # a stream of JSON documents (YAML to kubectl): megabytes of CRDs, written in milliseconds
        p.kubectl("apply", "--server-side", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))


def install_crds(p: Plane, files: Sequence[Path]) -> None:
    """Apply CRD files and wait until the API server serves each. (`kubectl wait` alone fails on a CRD whose status
    has no conditions yet, which a just-created one may not have.)"""
    documents = [doc for path in files for doc in read_yaml_documents(path) if doc]
    if not documents:
        return
    _apply(p, documents)
    names = {doc["metadata"]["name"] for doc in documents}

    def established() -> bool:
        done = p.kubectl("get", "crd", "-o", "json", check=False)
        if done.returncode != 0:
            return False
        ready = {c["metadata"]["name"] for c in json.loads(done.stdout)["items"]
                 if any(k["type"] == "Established" and k["status"] == "True"
                        for k in (c.get("status") or {}).get("conditions") or [])}
        return names <= ready

    deadline = time.monotonic() + START_TIMEOUT
    while not established():
        if time.monotonic() > deadline:
            raise PlaneError(f"CRDs not established within {START_TIMEOUT:.0f}s: {', '.join(sorted(names))}")
        time.sleep(0.5)


def _install(p: Plane, spec: PlaneSpec) -> None:
    install_crds(p, spec.crds)
    _apply(p, [storage_class(name) for name in spec.storage_classes])
    _apply(p, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}} for name in spec.namespaces])
    # Nodes are created with their status (capacity, allocatable): kwok keeps what is given and reports Ready.
    if spec.nodes:
        p.kubectl("create", "-f", "-", input=yaml.safe_dump_all(spec.nodes, sort_keys=False))


def _nodes_ready(p: Plane) -> int:
    done = p.kubectl("get", "nodes", "-o", "json", check=False)
    if done.returncode != 0:
        return 0
    items = json.loads(done.stdout).get("items", [])
    return sum(1 for n in items for c in n.get("status", {}).get("conditions", [])
               if c.get("type") == "Ready" and c.get("status") == "True")


def _install_pulumi_plugins(p: Plane, log: Callable[[str], None]) -> None:
    """The Kubernetes provider, installed from its build into the plane's PULUMI_HOME (nothing is downloaded)."""
    engines = load_engines()
    missing = [e.name for e in (engines["pulumi"], engines["pulumi-resource-kubernetes"]) if installed(e) is None]
    if missing:
        log(f"note: {', '.join(missing)} not built, so Pulumi cannot run on this plane yet "
            f"(`triarch local build {' '.join(missing)}`)")
        return
    provider = binary("pulumi-resource-kubernetes")
    p.run([str(binary("pulumi")), "plugin", "install", "resource", "kubernetes",
           f"v{engines['pulumi-resource-kubernetes'].plain_version}", "--file", str(provider)])


def exec_in(name: str, argv: Sequence[str]) -> int:
    """Run a command on a plane (inside its namespace, with its environment); returns its exit code."""
    p = plane(name)
    p.state()
    if not argv:
        raise PlaneError("nothing to run; usage: triarch local exec -- CMD [ARGS...]")
    return subprocess.run(p.command(list(argv)), env=p.env(), check=False).returncode


def down(name: str, quiet: bool = False, log: Callable[[str], None] = print) -> None:
    """Stop every process of the plane (all that run in its namespace, whoever started them), remove the
    namespace and the plane's state."""
    p = plane(name)
    if not p.directory.exists() and not quiet:
        raise PlaneError(f"local plane {name!r} is not up")
    state = json.loads(p.state_file.read_text()) if p.state_file.is_file() else None
    if state is not None:
        namespace = Namespace.from_state(state.get("netns"), p.netns)
        namespace.ours()
        _end(namespace)
    elif (left := netns.left_behind(p.netns)) is not None:  # a plane whose state was lost
        _end(left)
    copy = state.get("kubeconfigCopy") if state else None
    if copy and Path(copy).is_file() and is_plane_kubeconfig(Path(copy)):
        Path(copy).unlink()
    shutil.rmtree(p.directory, ignore_errors=True)
    if not quiet:
        log(f"local plane {name} down")


def _end(namespace: Namespace) -> None:
    """End every process in the namespace (SIGTERM, then SIGKILL for what is left) and remove it. Its processes
    are looked for even where the namespace seems gone: a user namespace outlives a holder killed by someone else."""
    pids = namespace.pids()
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.2)
    for pid in namespace.pids():
        _signal(pid, signal.SIGKILL)
    # A killed process is in the namespace until it has finished exiting (a Go engine's large heap takes a moment):
    # `down` returns once none is left.
    deadline = time.monotonic() + STOP_TIMEOUT
    while namespace.pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    namespace.remove()


def _tree(pid: int) -> list[int]:
    """A process and its descendants."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(proc.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo.extend(children.get(found[-1], []))
    return found


def _signal(pid: int, sig: signal.Signals) -> None:
    """Signal a process (a root-owned one, sudo's own in sudo mode, is not ours to signal)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)
