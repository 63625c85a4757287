"""The plane's processes, supervised: each started in the plane's namespace with its log, waited for until ready
(or until one exits, with the line of its log that says why), and ended, a namespace's whole content at once."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from triarch.local.netns import Namespace
from triarch.local.plane import Plane, PlaneError

STOP_TIMEOUT = 5.0
"""Seconds a process has between SIGTERM and SIGKILL."""


def start_process(p: Plane, component: str, argv: list[str], env: dict[str, str] | None = None) -> int:
    log = p.log(component).open("ab")
    process = subprocess.Popen(p.command(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               env={**p.env(), **(env or {})}, start_new_session=True)
    log.close()
    return process.pid


def alive(pid: int) -> bool:
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


def wait_ready(what: str, ready: Callable[[], bool], pids: dict[str, int], p: Plane, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for component, pid in pids.items():
            if not alive(pid):
                raise PlaneError(f"{component} exited while the plane started: {failure_cause(p.log(component))} "
                                 f"(log: {p.log(component)})")
        if ready():
            return
        time.sleep(0.5)
    raise PlaneError(f"the plane did not become ready within {timeout:.0f}s waiting for {what} "
                     f"(logs: {p.directory / 'logs'})")


def end_namespace(namespace: Namespace) -> None:
    """End every process in the namespace (SIGTERM, then SIGKILL for what is left) and remove it. Its processes
    are looked for even where the namespace seems gone: a user namespace outlives a holder killed by someone else."""
    pids = namespace.pids()
    for pid in pids:
        signal_quietly(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.2)
    for pid in namespace.pids():
        signal_quietly(pid, signal.SIGKILL)
    # A killed process is in the namespace until it has finished exiting (a Go engine's large heap takes a moment):
    # `down` returns once none is left.
    deadline = time.monotonic() + STOP_TIMEOUT
    while namespace.pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    namespace.remove()


def tree(pid: int) -> list[int]:
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


def signal_quietly(pid: int, sig: signal.Signals) -> None:
    """Signal a process (a root-owned one, sudo's own in sudo mode, is not ours to signal)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)
