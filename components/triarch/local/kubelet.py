"""What a kubelet does for a chart's controller pod, done for the real operator a local plane runs in its place
(`python -m triarch.local.kubelet ...`, inside the plane's network namespace):

- `start-when KIND/NAME [-n NS] [--as-pod deployment/NAME ...] -- ARGV`: start the operator once an object of its
  chart exists (the Secret its webhook certificate goes in, its CRDs): the chart's objects exist only once Helm
  installed it, and an operator started before them exits; `--as-pod` starts it as the stand-in of that
  Deployment's pod (AsPod): at the pod's address, with its ServiceAccount's token, and with the container's
  arguments and environment as the chart rendered them;
- `mount-secret NAME -n NS DIR`: keep a Secret's keys as files in DIR, as a Secret volume does: an operator that
  manages its own webhook certificate writes it to the Secret and waits for it to show up on disk;
- `restart-always -- ARGV`: run ARGV again whenever it exits, as a kubelet restarts a container: an operator that
  generates its own certificate exits once it wrote it, to start again with it."""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

POLL_SECONDS = 0.5
WAIT_SECONDS = 3600
"""How long one `kubectl wait` waits before it is asked again (a plane lives longer than any single wait)."""
RESTART_SECONDS = 1.0
"""The pause before a restart (a kubelet's back-off starts at 10 s; a plane has no reason to wait that long)."""


def _kubectl_binary() -> str:
    return os.environ.get("TRIARCH_KUBECTL", "kubectl")


def _kubectl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_kubectl_binary(), *args], capture_output=True, text=True, check=False)


POD_IP = "{pod_ip}"
"""In a command started `--as-pod`: the address of the pod the command stands in for."""
CONTAINER_ARGS = "{container_args}"
"""In a command started `--as-pod` with `--container`: where that container's arguments go."""
TOKEN_SECONDS = 48 * 3600
"""How long a pod's ServiceAccount token lasts (a kubelet refreshes its projected token; a plane lives hours)."""


@dataclass(frozen=True)
class AsPod:
    """The pod a command stands in for: a pod of `deployment` (`deployment/NAME`, in the waited-for namespace).

    Its address replaces POD_IP in the command, so a listener binds the pod's address alone and a Service reaches
    it only where its selector picks that pod (kwok's pod addresses are the plane's own). With `kubeconfig`, one is
    written there (and named by KUBECONFIG) holding a token the API server issues for the pod's ServiceAccount, so
    the command has that account's rights and no more. With `container`, that container's arguments replace
    CONTAINER_ARGS in the command and its environment is the command's, as the chart rendered them, translated to
    the plane: a volume's mount path to its directory here (`mounts`, by volume name; a ConfigMap volume is written
    under `volumes`, with `edits` made to a YAML file of it: volume, dotted key, value), and a listener on every
    address of the pod (`--flag=:PORT`) to the pod's address. All is read once: a rollout of the Deployment would
    leave the command on the old pod's."""

    deployment: str
    kubeconfig: Path | None = None
    container: str | None = None
    mounts: tuple[tuple[str, Path], ...] = ()
    volumes: Path | None = None
    edits: tuple[tuple[str, str, str], ...] = ()
    known_gates: tuple[str, ...] | None = None
    """The feature gates the binary knows, where it is older than the chart (a stand-in release): the chart's
    `--feature-gates` keeps those, the others dropped and said (the binary would refuse to start on them)."""


def start_when(wanted: list[str], command: list[str], as_pod: AsPod | None = None) -> int:
    """Start the command once the object exists (as `as_pod`'s stand-in, where given)."""
    name = os.path.basename(command[0])
    print(f"waiting for {' '.join(wanted)} before starting {name}", flush=True)
    # `kubectl wait --for=create` asks from one process (every half second, kubectl's own poll), not one kubectl a
    # poll: a plane's waiting kubelets would otherwise start thousands of kubectl processes in a run.
    while _kubectl("wait", "--for=create", *wanted, f"--timeout={WAIT_SECONDS}s").returncode != 0:
        time.sleep(POLL_SECONDS)
    if as_pod is not None:
        namespace = wanted[wanted.index("-n") + 1] if "-n" in wanted else "default"
        command = placed(as_pod, namespace, command)
    print(f"{' '.join(wanted)} exists: starting {name}", flush=True)
    os.execvp(command[0], command)


def placed(pod: AsPod, namespace: str, command: list[str]) -> list[str]:
    """The command as the stand-in of `pod` (AsPod), once the pod has an address; sets the container's
    environment in this process's, which the command inherits."""
    running, template = running_pod(pod.deployment, namespace)
    address = str(running["status"]["podIP"])
    print(f"{pod.deployment}'s pod {running['metadata']['name']} has address {address}", flush=True)
    if pod.container is not None:
        [container] = [c for c in template["spec"]["containers"] if c["name"] == pod.container]
        mounts = mount_paths(container, template["spec"].get("volumes", []), pod, namespace, address)
        args = [translated(arg, address, mounts) for arg in container.get("args", [])]
        if pod.known_gates is not None:
            args = [known_gates_only(arg, pod.known_gates) for arg in args]
        at = command.index(CONTAINER_ARGS)
        command = [*command[:at], *args, *command[at + 1:]]
        os.environ.update(container_environment(container, running, mounts))
    command = [part.replace(POD_IP, address) for part in command]
    if pod.kubeconfig is not None:
        account = template["spec"].get("serviceAccountName") or "default"
        write_token_kubeconfig(pod.kubeconfig, account, namespace)
        os.environ["KUBECONFIG"] = str(pod.kubeconfig)
        print(f"running as system:serviceaccount:{namespace}:{account}", flush=True)
    return command


def mount_paths(container: dict[str, Any], volumes: list[dict[str, Any]], pod: AsPod, namespace: str,
                address: str) -> list[tuple[str, Path]]:
    """Each of the container's mount paths and where it is here: a volume `pod.mounts` names, at its directory; a
    ConfigMap volume written under `pod.volumes` (a subPath mount as the one file), with `pod.edits` made."""
    given = dict(pod.mounts)
    kinds = {v["name"]: v for v in volumes}
    found: list[tuple[str, Path]] = []
    for mount in container.get("volumeMounts", []):
        volume = mount["name"]
        if volume in given:
            found.append((mount["mountPath"], given[volume]))
        elif "configMap" in kinds.get(volume, {}) and pod.volumes is not None:
            directory = pod.volumes / volume
            directory.mkdir(parents=True, exist_ok=True)
            data = json.loads(_kubectl("get", "configmap", kinds[volume]["configMap"]["name"], "-n", namespace,
                                       "-o", "json").stdout).get("data", {})
            for key, text in data.items():
                edits = [(k, v.replace(POD_IP, address)) for name, k, v in pod.edits if name == volume]
                (directory / key).write_text(edited(text, edits) if edits else text)
            found.append((mount["mountPath"], directory / mount["subPath"] if mount.get("subPath") else directory))
    return found


def edited(text: str, edits: list[tuple[str, str]]) -> str:
    """A YAML document with each dotted key set to its value."""
    document = yaml.safe_load(text) or {}
    for dotted, value in edits:
        *parents, last = dotted.split(".")
        node = document
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return yaml.safe_dump(document, sort_keys=False)


def translated(value: str, address: str, mounts: list[tuple[str, Path]]) -> str:
    """An argument of the pod's container as it reads on the plane: a listener on every address of the pod
    (`:PORT`) on the pod's address, a path under a volume's mount path under that volume's place here."""
    flag, equals, given = value.partition("=")
    if equals and re.fullmatch(r":\d+", given):
        return f"{flag}={address}{given}"
    for mount, directory in mounts:
        value = re.sub(rf"(?<![\w/.]){re.escape(mount.rstrip('/'))}(?=/|$|,)", str(directory), value)
    return value


def known_gates_only(arg: str, known: tuple[str, ...]) -> str:
    """A `--feature-gates=A=true,B=false` argument with only the gates in `known`; the others are said."""
    flag, equals, given = arg.partition("=")
    if flag != "--feature-gates" or not equals:
        return arg
    gates = [gate for gate in given.split(",") if gate]
    dropped = [gate for gate in gates if gate.split("=", 1)[0] not in known]
    if dropped:
        print(f"dropped feature gates this release does not have: {','.join(dropped)}", flush=True)
    return f"{flag}={','.join(gate for gate in gates if gate not in dropped)}"


def container_environment(container: dict[str, Any], pod: dict[str, Any],
                          mounts: list[tuple[str, Path]]) -> dict[str, str]:
    """The container's environment: its values, and the pod's fields it reads (the Downward API's fieldRef)."""
    address = str(pod["status"]["podIP"])
    fields = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"]["namespace"],
              "status.podIP": address, "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
              "spec.nodeName": pod["spec"].get("nodeName", "")}
    found: dict[str, str] = {}
    for variable in container.get("env", []):
        if "valueFrom" not in variable:  # an empty value is stored without its key, and set empty
            found[variable["name"]] = translated(str(variable.get("value", "")), address, mounts)
        elif (path := variable.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")) in fields:
            found[variable["name"]] = fields[str(path)]
        elif "valueFrom" in variable:
            print(f"left out {variable['name']}: {json.dumps(variable['valueFrom'])} is not read here", flush=True)
    return found


def running_pod(workload: str, namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A pod the Deployment selects (by its own selector) once one has an address, and the Deployment's pod
    template."""
    while True:
        found = _kubectl("get", workload, "-n", namespace, "-o", "json")
        if found.returncode == 0:
            spec = json.loads(found.stdout)["spec"]
            labels = spec["selector"].get("matchLabels", {})
            selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
            pods = _kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json")
            for pod in json.loads(pods.stdout)["items"] if pods.returncode == 0 else []:
                if pod["status"].get("podIP") and not pod["metadata"].get("deletionTimestamp"):
                    return pod, spec["template"]
        time.sleep(POLL_SECONDS)


def write_token_kubeconfig(path: Path, account: str, namespace: str) -> None:
    """A kubeconfig for the cluster this kubelet talks to, authenticating with a token the API server issues for
    the ServiceAccount (TokenRequest, as a projected token volume gets one)."""
    while (token := _kubectl("create", "token", account, "-n", namespace,
                             f"--duration={TOKEN_SECONDS}s")).returncode != 0:
        print(f"no token for {namespace}/{account} yet: {token.stderr.strip()}", flush=True)
        time.sleep(POLL_SECONDS)
    own = json.loads(_kubectl("config", "view", "--raw", "--minify", "-o", "json").stdout)
    [cluster] = own["clusters"]
    user = f"system:serviceaccount:{namespace}:{account}"
    config = {"apiVersion": "v1", "kind": "Config", "clusters": [cluster],
              "users": [{"name": user, "user": {"token": token.stdout.strip()}}],
              "contexts": [{"name": user, "context": {"cluster": cluster["name"], "user": user,
                                                      "namespace": namespace}}],
              "current-context": user}
    staged = path.with_name(f".{path.name}.new")
    staged.write_text(json.dumps(config, indent=1))
    staged.chmod(0o600)
    staged.replace(path)


def mount_secret(name: str, namespace: str, directory: Path) -> int:
    """Write each key of the Secret as a file whenever it changes (never returns). One watch (`kubectl get --watch`,
    a JSON document per change), opened again whenever the API server ends it."""
    directory.mkdir(parents=True, exist_ok=True)
    seen: dict[str, str] = {}
    running = _stopped_with_children()
    while True:
        watch = subprocess.Popen([_kubectl_binary(), "get", "secrets", "-n", namespace, "--field-selector",
                                  f"metadata.name={name}", "--watch", "-o", "json"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        running[:] = [watch]
        for secret in watched(watch):
            for key, value in (secret.get("data") or {}).items():
                if seen.get(key) != value:
                    staged = directory / f".{key}.new"
                    staged.write_bytes(base64.b64decode(value))
                    staged.replace(directory / key)
                    seen[key] = value
                    print(f"secret {namespace}/{name}: wrote {key}", flush=True)
        watch.wait()
        time.sleep(POLL_SECONDS)


def watched(watch: subprocess.Popen[bytes]) -> Iterator[dict[str, Any]]:
    """What a `kubectl get --watch -o json` process prints, one object per change as soon as it is whole; ends
    when the watch does."""
    assert watch.stdout is not None
    return json_documents(iter(functools.partial(os.read, watch.stdout.fileno(), 65536), b""))


def json_documents(chunks: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The JSON documents of a stream written one after another (kubectl's `--watch -o json`), each as soon as its
    last chunk arrives."""
    decoder = json.JSONDecoder()
    buffered = ""
    for chunk in chunks:
        buffered += chunk.decode()
        while buffered.strip():
            try:
                document, end = decoder.raw_decode(buffered.lstrip())
            except json.JSONDecodeError:
                break  # the document is not whole yet
            buffered = buffered.lstrip()[end:]
            yield document


def _stopped_with_children() -> list[subprocess.Popen[bytes]]:
    """The list of this process's children that a SIGTERM to it ends too (then it exits 0)."""
    running: list[subprocess.Popen[bytes]] = []

    def stop(signum: int, _frame: object) -> None:
        for child in running:
            child.send_signal(signum)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    return running


def restart_always(command: list[str]) -> int:
    """Run the command, and again each time it exits, until this process is asked to stop (then the command is
    too)."""
    name = os.path.basename(command[0])
    running = _stopped_with_children()
    while True:
        running[:] = [subprocess.Popen(command)]
        code = running[0].wait()
        print(f"{name} exited {code}: starting it again", flush=True)
        time.sleep(RESTART_SECONDS)


USAGE = ("usage: python -m triarch.local.kubelet start-when KIND/NAME [-n NAMESPACE] [--as-pod deployment/NAME "
         "[--service-account-kubeconfig FILE] [--container NAME [--mount VOLUME=DIR]... [--volumes DIR] "
         "[--edit VOLUME:KEY=VALUE]... [--known-gates A,B]]] -- COMMAND [ARGS...]\n"
         "       python -m triarch.local.kubelet mount-secret NAME -n NAMESPACE DIR\n"
         "       python -m triarch.local.kubelet restart-always -- COMMAND [ARGS...]")


def _options(argv: list[str], names: tuple[str, ...]) -> tuple[list[str], dict[str, list[str]]]:
    """argv without the named options (each `--name VALUE`, repeatable), and their values."""
    rest: list[str] = []
    found: dict[str, list[str]] = {}
    parts = iter(argv)
    for part in parts:
        if part in names:
            found.setdefault(part, []).append(next(parts, ""))
        else:
            rest.append(part)
    return rest, found


def main(argv: list[str]) -> int:
    if argv[:1] == ["start-when"] and "--" in argv[2:]:
        split = argv.index("--")
        wanted, options = _options(argv[1:split], ("--as-pod", "--service-account-kubeconfig", "--container",
                                                   "--mount", "--volumes", "--edit", "--known-gates"))
        pod = None
        if "--as-pod" in options:
            one = {k: v[-1] for k, v in options.items()}
            pairs = [m.split("=", 1) for m in options.get("--mount", [])]
            edits = [(e.split(":", 1)[0], *e.split(":", 1)[1].split("=", 1)) for e in options.get("--edit", [])]
            pod = AsPod(one["--as-pod"], Path(one["--service-account-kubeconfig"])
                        if "--service-account-kubeconfig" in one else None, one.get("--container"),
                        tuple((name, Path(directory)) for name, directory in pairs),
                        Path(one["--volumes"]) if "--volumes" in one else None,
                        tuple((volume, key, value) for volume, key, value in edits),
                        tuple(one["--known-gates"].split(",")) if "--known-gates" in one else None)
        return start_when(wanted, argv[split + 1:], pod)
    if argv[:1] == ["mount-secret"] and len(argv) == 5 and argv[2] == "-n":
        return mount_secret(argv[1], argv[3], Path(argv[4]))
    if argv[:2] == ["restart-always", "--"] and len(argv) > 2:
        return restart_always(argv[2:])
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
