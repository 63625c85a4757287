"""A handle on a local control plane (see triarch.local.lifecycle for starting and stopping one): where its
state lives (certificates, etcd, logs, kubeconfig, Pulumi's file backend and plugins), how a command runs on it
(inside its network namespace, with its environment), and which planes are up."""

from __future__ import annotations

import getpass
import json
import os
import re
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from triarch.local.engines import EngineError, binary, path_with_engines, user_cache
from triarch.local.netns import Namespace
from triarch.local.pki import Pki

SERVICE_RANGE = "10.96.0.0/16"
POD_RANGE = "198.18.128.0/17"
LOCAL_ADDRESSES = ("198.18.0.1/32", "198.18.128.1/17")
"""Addresses of the plane's own, on its `lo`: one for aggregated APIs (operators.AGGREGATED_IP), and the range kwok
gives pods, so a connection to a pod's address (the API server's proxy to a Service or a pod) reaches whatever
listens on that port inside the namespace. RFC 2544's benchmarking range: neither private nor public, and never
routed out of the namespace, which has no route anywhere else."""
API_PORT = 16443
"""The API server's port, on loopback: not 6443, which a chart's pod serves on (KEDA's metrics adapter, at its pod's
address: operators.keda_chart)."""
ETCD_PORT = 2379
STORAGE_CLASS = "kwok-volume"
"""The default storage class: kwok's volume stages give each claim of it a PersistentVolume and bind it."""
MIRROR_ADDRESS = "127.0.0.1:5000"
MIRROR_PATH = "charts"
"""Where a plane's chart mirror serves (HTTPS, on its loopback) and the path its charts sit under: a stack on the
plane pulls them with triarch:registry.charts `oci://127.0.0.1:5000/charts`."""
PASSPHRASE = "triarch-local"
"""The Pulumi passphrase of stacks on a local plane when none is set: their state lives and dies with the plane."""


class PlaneError(EngineError):
    """The plane could not start, or is not up: one line naming what and how to fix it."""


def state_root() -> Path:
    """Where planes keep their state: $TRIARCH_LOCAL_HOME, else ~/.cache/triarch/local."""
    return user_cache("TRIARCH_LOCAL_HOME", "local")


@dataclass(frozen=True)
class PlaneSpec:
    """What to start: the plane's name, the kubeconfig context a stack names, the objects the cluster holds."""

    name: str
    context: str
    nodes: list[dict[str, Any]]
    crds: list[Path] = field(default_factory=list)
    storage_classes: tuple[str, ...] = (STORAGE_CLASS,)
    namespaces: tuple[str, ...] = ()
    """Namespaces the cluster's own components live in (a Prometheus Operator's, say)."""
    operators: tuple[str, ...] = ()
    """Operators the plane runs as processes (triarch.local.operators), started once the nodes are Ready."""
    instance_types: list[dict[str, Any]] = field(default_factory=list)
    """What Karpenter's kwok provider may launch: kwok's instance-types file format."""
    objects: list[dict[str, Any]] = field(default_factory=list)
    """Objects the cluster holds once its operators run (the stack's NodePools on kwok, say)."""
    kubeconfig_copy: Path | None = None
    """Where the stack expects the kubeconfig (its triarch:cluster.kubeconfig), besides the plane's own."""
    charts: tuple[Path, ...] = ()
    """Chart archives the plane's mirror (an OCI registry on its loopback) serves; none: no mirror runs."""
    files: dict[str, bytes] = field(default_factory=dict)
    """Files the mirror serves beside the charts, by their path under its /files/."""


@dataclass(frozen=True)
class Plane:
    name: str
    directory: Path

    @property
    def netns(self) -> str:
        """The namespace's `ip netns` name (root and sudo modes)."""
        return f"triarch-{self.name}"

    def namespace(self) -> Namespace:
        """The network namespace the plane's state records (mode, name, holder): every process that runs a
        command on the plane enters the same one, however it was made."""
        return Namespace.from_state(self.state().get("netns"), self.netns)

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    @property
    def trust_bundle(self) -> Path:
        """The CAs a command on the plane trusts (the system's and the plane's, whose certificate the chart mirror
        presents): SSL_CERT_FILE for Go's and OpenSSL's clients, as a company installs its mirror's CA."""
        return self.directory / "trust.pem"

    @property
    def state_file(self) -> Path:
        return self.directory / "plane.json"

    @property
    def pulumi_home(self) -> Path:
        return self.directory / "pulumi-home"

    @property
    def pulumi_backend(self) -> Path:
        return self.directory / "pulumi-state"

    def log(self, component: str) -> Path:
        return self.directory / "logs" / f"{component}.log"

    def state(self) -> dict[str, Any]:
        if not self.state_file.is_file():
            raise PlaneError(f"local plane {self.name!r} is not up; start it with `triarch local up`")
        loaded: dict[str, Any] = json.loads(self.state_file.read_text())
        return loaded

    def env(self) -> dict[str, str]:
        """The environment of a command run on the plane: its kubeconfig, the built kubectl and pulumi first on the
        PATH, Pulumi's file backend and plugins in the plane's directory, no plugin downloads, no update checks, and a
        TMPDIR of the plane's own: the Kubernetes provider leaves a kubeconfig file in it at each Helm release
        (about 36 a suite), which /tmp would keep after the plane is gone."""
        temporary = self.directory / "tmp"
        temporary.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update({
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": path_with_engines(),
            "PULUMI_HOME": str(self.pulumi_home),
            "PULUMI_BACKEND_URL": f"file://{self.pulumi_backend}",
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            "UV_OFFLINE": "1",
            "TMPDIR": str(temporary),
        })
        env.setdefault("PULUMI_CONFIG_PASSPHRASE", PASSPHRASE)
        if self.trust_bundle.is_file():
            env["SSL_CERT_FILE"] = str(self.trust_bundle)
        return env

    def command(self, argv: Sequence[str]) -> list[str]:
        """argv run inside the plane's network namespace (given the plane's environment, `env`)."""
        return self.namespace().command(argv, self.env())

    def run(self, argv: Sequence[str], *, check: bool = True, input: str | None = None,
            timeout: float | None = 120) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(self.command(argv), env=self.env(), capture_output=True, text=True, input=input,
                              timeout=timeout, check=False)
        if check and done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            raise PlaneError(f"`{Path(argv[0]).name} {' '.join(argv[1:4])}` failed on plane "
                             f"{self.name} (exit {done.returncode}): {said[-1] if said else 'no output'}")
        return done

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.run([str(binary("kubectl")), "--kubeconfig", str(self.kubeconfig), *args], check=check,
                        input=input)


def plane(name: str) -> Plane:
    return Plane(name, state_root() / name)


def kubeconfig(context: str, pki: Pki) -> dict[str, Any]:
    cluster = f"triarch-local-{context}"
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": context, "preferences": {},
        "clusters": [{"name": cluster, "cluster": {"server": f"https://127.0.0.1:{API_PORT}",
                                                   "certificate-authority": str(pki.ca)}}],
        "users": [{"name": "triarch-admin", "user": {"client-certificate": str(pki.admin.cert),
                                                     "client-key": str(pki.admin.key)}}],
        "contexts": [{"name": context, "context": {"cluster": cluster, "user": "triarch-admin"}}],
    }


def is_plane_kubeconfig(path: Path) -> bool:
    """Whether a kubeconfig file is one a local plane wrote (so it may be replaced)."""
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return False
    clusters = loaded.get("clusters") or []
    return bool(clusters) and all(str(c.get("name", "")).startswith("triarch-local-") for c in clusters)


def owner() -> dict[str, str]:
    """Whose a plane is: the user (the one sudo runs for, where it does) on this host. Recorded in its state, so a
    command that names no plane takes only its user's own."""
    return {"user": os.environ.get("SUDO_USER") or getpass.getuser(), "host": socket.gethostname().split(".")[0]}


def default_name(stack: str) -> str:
    """A plane's name where none is given: the stack's, the user's and the host's, so two people's planes of one
    stack on a host (their network namespaces are the host's) or one person's on two hosts sharing a home (its
    state root) never collide. Lowercase letters, digits and '-' only: it names a namespace and a context too."""
    who = owner()
    return re.sub(r"[^a-z0-9]+", "-", f"{stack}-{who['user']}-{who['host']}".lower()).strip("-")


def planes_up() -> list[str]:
    root = state_root()
    return sorted(d.name for d in root.iterdir() if (d / "plane.json").is_file()) if root.is_dir() else []


def _is_own(name: str) -> bool:
    """Whether a plane that is up is this user's on this host (one recorded before owners were: taken as it)."""
    try:
        recorded = plane(name).state().get("owner")
    except (PlaneError, ValueError):
        return False
    return recorded is None or recorded == owner()


def only_plane() -> str:
    """The plane a command means when it names none: the only one of the user's own up (on this host), whatever
    other users' or hosts' planes share the state root."""
    up = planes_up()
    mine = [name for name in up if _is_own(name)]
    if len(mine) == 1:
        return mine[0]
    if not up:
        raise PlaneError("no local plane is up; start one with `triarch local up --stack lab`")
    who = "{user}@{host}".format(**owner())
    if not mine:
        raise PlaneError(f"no local plane of {who} is up (others' are: {', '.join(up)}); start one with "
                         "`triarch local up --stack lab`, or name one with --name")
    raise PlaneError(f"{len(mine)} local planes of {who} are up ({', '.join(mine)}); name one with --name")
