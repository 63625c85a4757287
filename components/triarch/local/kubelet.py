"""What a kubelet does for a chart's controller pod, done for the real operator a local plane runs in its place
(`python -m triarch.local.kubelet ...`, inside the plane's network namespace):

- `start-when KIND/NAME [-n NS] -- ARGV`: start the operator once an object of its chart exists (the Secret its
  webhook certificate goes in, its CRDs): the chart's objects exist only once Helm installed it, and an operator
  started before them exits;
- `mount-secret NAME -n NS DIR`: keep a Secret's keys as files in DIR, as a Secret volume does: an operator that
  manages its own webhook certificate writes it to the Secret and waits for it to show up on disk;
- `restart-always -- ARGV`: run ARGV again whenever it exits, as a kubelet restarts a container: an operator that
  generates its own certificate exits once it wrote it, to start again with it."""

from __future__ import annotations

import base64
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

POLL_SECONDS = 0.5
WAIT_SECONDS = 3600
"""How long one `kubectl wait` waits before it is asked again (a plane lives longer than any single wait)."""
RESTART_SECONDS = 1.0
"""The pause before a restart (a kubelet's back-off starts at 10 s; a plane has no reason to wait that long)."""


def _kubectl_binary() -> str:
    return os.environ.get("TRIARCH_KUBECTL", "kubectl")


def _kubectl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_kubectl_binary(), *args], capture_output=True, text=True, check=False)


def start_when(wanted: list[str], command: list[str]) -> int:
    name = os.path.basename(command[0])
    print(f"waiting for {' '.join(wanted)} before starting {name}", flush=True)
    # `kubectl wait --for=create` asks from one process (every half second, kubectl's own poll), not one kubectl a
    # poll: a plane's waiting kubelets would otherwise start thousands of kubectl processes in a run.
    while _kubectl("wait", "--for=create", *wanted, f"--timeout={WAIT_SECONDS}s").returncode != 0:
        time.sleep(POLL_SECONDS)
    print(f"{' '.join(wanted)} exists: starting {name}", flush=True)
    os.execvp(command[0], command)


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


USAGE = ("usage: python -m triarch.local.kubelet start-when KIND/NAME [-n NAMESPACE] -- COMMAND [ARGS...]\n"
         "       python -m triarch.local.kubelet mount-secret NAME -n NAMESPACE DIR\n"
         "       python -m triarch.local.kubelet restart-always -- COMMAND [ARGS...]")


def main(argv: list[str]) -> int:
    if argv[:1] == ["start-when"] and "--" in argv[2:]:
        split = argv.index("--")
        return start_when(argv[1:split], argv[split + 1:])
    if argv[:1] == ["mount-secret"] and len(argv) == 5 and argv[2] == "-n":
        return mount_secret(argv[1], argv[3], Path(argv[4]))
    if argv[:2] == ["restart-always", "--"] and len(argv) > 2:
        return restart_always(argv[2:])
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
