"""Starting and stopping a local Kubernetes control plane on the real engines: etcd, the API server (RBAC, a
client certificate in system:masters, a service-account issuer), the controller manager, the scheduler and kwok, all
on loopback inside a network namespace of its own with only `lo`, so nothing the API server calls (webhooks,
services) leaves the machine.

`up` starts it and installs what a stack expects of the cluster (the CRDs of the components it says are already
there, kwok nodes as its pools would have them, a storage class kwok provisions); `down` ends every process in the
namespace and removes it. How the namespace is made and entered (as root, in a user namespace, or through sudo)
is triarch.local.netns's choice, recorded in the plane's state."""

from __future__ import annotations

import json
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
from triarch.local.components import component_args, kwok_stages, storage_class
from triarch.local.engines import binary, installed, load_engines
from triarch.local.netns import Namespace
from triarch.local.operators import OPERATORS
from triarch.local.pki import Pki, issue, write_pki
from triarch.local.plane import (
    LOCAL_ADDRESSES,
    MIRROR_ADDRESS,
    MIRROR_PATH,
    Plane,
    PlaneError,
    PlaneSpec,
    is_plane_kubeconfig,
    kubeconfig,
    owner,
    plane,
)
from triarch.local.processes import (
    STOP_TIMEOUT,
    alive,
    end_namespace,
    signal_quietly,
    start_process,
    tree,
    wait_ready,
)

START_TIMEOUT = 300.0
"""Seconds for each step of a plane's start to answer: a warm start takes 10-20 s in all, but on a two-core host
whose suite runs three planes and the data plane side by side, an API server took more than 90 s (2026-12-07). A
broken plane does not wait this out: `wait_ready` fails as soon as one of its processes exits."""


def _netns_exists(p: Plane) -> bool:
    """Whether a named namespace of the plane's is left (root or sudo mode, from a plane not brought down)."""
    return Namespace("root", p.netns).exists()


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
            pids[component] = start_process(p, component, args[component])
        wait_ready("the API server", lambda: p.kubectl("get", "--raw=/readyz", check=False).returncode == 0, pids,
                   p, START_TIMEOUT)
        for component in ("kube-controller-manager", "kube-scheduler", "kwok"):
            pids[component] = start_process(p, component, args[component])
        record()
        wait_ready("the default service account", lambda: p.kubectl(
            "get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0, pids, p, START_TIMEOUT)
        if spec.charts:
            pids["oci-registry"] = _start_mirror(p, pki, spec.charts, spec.files, pids)
            record()
        _install(p, spec)
        wait_ready(f"{len(spec.nodes)} node(s) Ready", lambda: _nodes_ready(p) >= len(spec.nodes), pids, p,
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
            end_namespace(namespace)
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
    pid = start_process(p, "oci-registry", [str(binary("oci-registry")), f"--listen={MIRROR_ADDRESS}",
                                     f"--cert={pair.cert}", f"--key={pair.key}", f"--disk={blobs}",
                                     f"--files={served}"])
    url = f"https://{MIRROR_ADDRESS}"
    wait_ready("the chart mirror", partial(_answers, p, f"{url}/v2/"), {**pids, "oci-registry": pid}, p, START_TIMEOUT)
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
    started = {component: start_process(p, component, argv, operator.env)
               for component, argv in operator.processes.items()}
    state["pids"] = {**state["pids"], **started}
    p.state_file.write_text(json.dumps(state, indent=1))
    if operator.ready:
        wait_ready(f"{name} ({operator.ready})", partial(_answers, p, operator.ready), started, p, START_TIMEOUT)
    for apiservice in [o["metadata"]["name"] for o in operator.objects if o["kind"] == "APIService"]:
        wait_ready(f"{name}'s APIService {apiservice}", partial(_available, p, apiservice), started, p, START_TIMEOUT)


def stop_operator(p: Plane, name: str) -> None:
    """End one operator on a plane that is up and remove the objects it brought (an APIService left behind with
    no process would fail every client's discovery); its CRDs stay with whoever installed them."""
    if name not in OPERATORS:
        raise PlaneError(f"unknown operator {name}; allowed: {', '.join(sorted(OPERATORS))}")
    operator = OPERATORS[name](p, Pki(p.directory / "pki"), PlaneSpec(p.name, "", []))
    state = p.state()
    pids = {c: pid for c, pid in state["pids"].items() if c in operator.processes}
    # What was started is the operator itself, or sudo above it (sudo mode): end the operator, below it.
    family = [each for pid in pids.values() for each in tree(pid)]
    for pid in family:
        signal_quietly(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline and any(alive(pid) for pid in family):
        time.sleep(0.2)
    for pid in family:
        signal_quietly(pid, signal.SIGKILL)
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
        end_namespace(namespace)
    elif (left := netns.left_behind(p.netns)) is not None:  # a plane whose state was lost
        end_namespace(left)
    copy = state.get("kubeconfigCopy") if state else None
    if copy and Path(copy).is_file() and is_plane_kubeconfig(Path(copy)):
        Path(copy).unlink()
    shutil.rmtree(p.directory, ignore_errors=True)
    if not quiet:
        log(f"local plane {name} down")
