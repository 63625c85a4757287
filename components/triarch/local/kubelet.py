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
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_SECONDS = 0.5
RESTART_SECONDS = 1.0
"""The pause before a restart (a kubelet's back-off starts at 10 s; a plane has no reason to wait that long)."""


def _kubectl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([os.environ.get("TRIARCH_KUBECTL", "kubectl"), *args], capture_output=True, text=True,
                          check=False)


def start_when(wanted: list[str], command: list[str]) -> int:
    name = os.path.basename(command[0])
    print(f"waiting for {' '.join(wanted)} before starting {name}", flush=True)
    while _kubectl("get", *wanted, "-o", "name").returncode != 0:
        time.sleep(POLL_SECONDS)
    print(f"{' '.join(wanted)} exists: starting {name}", flush=True)
    os.execvp(command[0], command)


def mount_secret(name: str, namespace: str, directory: Path) -> int:
    """Write each key of the Secret as a file whenever it changes (never returns)."""
    directory.mkdir(parents=True, exist_ok=True)
    seen: dict[str, str] = {}
    while True:
        done = _kubectl("get", "secret", name, "-n", namespace, "-o", "json")
        if done.returncode == 0:
            data = json.loads(done.stdout).get("data") or {}
            for key, value in data.items():
                if seen.get(key) != value:
                    staged = directory / f".{key}.new"
                    staged.write_bytes(base64.b64decode(value))
                    staged.replace(directory / key)
                    seen[key] = value
                    print(f"secret {namespace}/{name}: wrote {key}", flush=True)
        time.sleep(POLL_SECONDS)


def restart_always(command: list[str]) -> int:
    """Run the command, and again each time it exits, until this process is asked to stop (then the command is
    too)."""
    name = os.path.basename(command[0])
    running: list[subprocess.Popen[bytes]] = []

    def stop(signum: int, _frame: object) -> None:
        for child in running:
            child.send_signal(signum)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
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
