"""The local plane's network namespace, and how this machine lets us have one without asking the user to be root.

The plane's traffic must stay on a loopback of its own, so every process runs inside a network namespace with only
`lo`. Three ways to get one, chosen at run time (`choose`), or forced with TRIARCH_NETNS=root|user|sudo:

- `root`: running as root, a named namespace (`ip netns add`, entered with `ip netns exec`).
- `user`: not root, and the kernel lets an unprivileged user create a user namespace with a network namespace in it
  (not so where AppArmor restricts them, as on Ubuntu 24.04): a holder process (`unshare --user --map-root-user
  --net`) keeps the namespace; commands enter it with `nsenter --target HOLDER --user --net --preserve-credentials`
  and run as root of that user namespace (files they write belong to the user outside).
- `sudo`: not root, no user namespaces, passwordless sudo: only the namespace goes through sudo (`sudo -n ip netns
  add/exec/pids/del`); each command drops back to the user with `setpriv` inside it.

`Namespace` is what a plane records in its state file, so another process (`triarch local exec/down`) enters the
same namespace and finds every process in it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from triarch.local.engines import EngineError

Mode = Literal["root", "user", "sudo"]
MODES: tuple[Mode, ...] = ("root", "user", "sudo")
FORCE = "TRIARCH_NETNS"
"""The environment variable that forces a mode (refused in one line where that mode does not work here)."""
PROBE_TIMEOUT = 10.0
SUDO = ("sudo", "-n", "--preserve-env")
"""Never a password prompt; the caller's environment (KUBECONFIG, PULUMI_*) reaches the command."""
SUDO_DROPS = ("PATH", "HOME", "USER", "LOGNAME", "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH", "TMPDIR")
"""What sudo resets or removes even with --preserve-env (secure_path, its own HOME/USER, its list of unsafe
variables, and TMPDIR, which the C library drops for any setuid program); in sudo mode a command gets them back on
its command line, after dropping to the user. (TMPDIR was found missing by the real tier run as a non-root user,
2026-12-07: the engines' compile cache went to another user's directory in /tmp.)"""
USER_FIX = ("allow unprivileged user namespaces (Ubuntu >= 23.10: sysctl "
            "kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile granting unshare `userns`)")
SUDO_FIX = "give passwordless sudo for ip netns (sudo -n must not prompt, and may keep the environment: -E)"


class NetnsError(EngineError):
    """No network namespace for the plane here, or not the one asked for: one line saying what to change."""


@dataclass(frozen=True)
class Choice:
    """The mode the plane will use, and why in words (the `up` line and the real tier's header say it)."""

    mode: Mode
    why: str

    @property
    def line(self) -> str:
        return f"network namespace: {self.mode} ({self.why})"


Probe = Callable[[], str | None]
"""A check of the machine: None where the mode works, else the one reason it does not."""


def choose(forced: str | None = None, euid: int | None = None, ip: Probe | None = None, user: Probe | None = None,
           sudo: Probe | None = None) -> Choice:
    """The mode for this process: forced by TRIARCH_NETNS, else root, else user namespaces, else sudo. Each probe
    runs only when the choice gets to it (a failed `sudo -n` is logged by sudo, so it is the last resort). The
    arguments are the machine's own unless given (the unit tests give them)."""
    if forced is None:
        forced = os.environ.get(FORCE, "")
    forced = forced.strip() or None
    euid = os.geteuid() if euid is None else euid
    missing_ip = (ip or probe_ip)()
    if missing_ip:
        raise NetnsError(missing_ip)
    probe_user, probe_sudo_ = user or probe_userns, sudo or probe_sudo
    if forced is not None:
        if forced not in MODES:
            raise NetnsError(f"{FORCE}={forced}: unknown mode; allowed: {', '.join(MODES)}")
        if forced == "root":
            if euid != 0:
                raise NetnsError(f"{FORCE}=root, but this process is not root (euid {euid}); run it as root, or "
                                 f"unset {FORCE} to use user namespaces or sudo")
            return Choice("root", f"{FORCE}=root")
        if forced == "user":
            why = probe_user()
            if why:
                raise NetnsError(f"{FORCE}=user, but unprivileged user namespaces do not work here: {why}; "
                                 f"{USER_FIX}, or unset {FORCE}")
            return Choice("user", f"{FORCE}=user")
        why = probe_sudo_()
        if why:
            raise NetnsError(f"{FORCE}=sudo, but passwordless sudo does not work here: {why}; {SUDO_FIX}, "
                             f"or unset {FORCE}")
        return Choice("sudo", f"{FORCE}=sudo")
    if euid == 0:
        return Choice("root", "running as root: ip netns")
    user_why = probe_user()
    if not user_why:
        return Choice("user", f"euid {euid}, and unprivileged user namespaces work: unshare --user --net")
    sudo_why = probe_sudo_()
    if not sudo_why:
        return Choice("sudo", f"euid {euid}, user namespaces do not work ({user_why}), passwordless sudo does")
    raise NetnsError(f"no network namespace for the local plane: not root (euid {euid}); user namespaces: {user_why}; "
                     f"sudo: {sudo_why}; run as root, or {USER_FIX}, or {SUDO_FIX}")


def probe_ip() -> str | None:
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not on the PATH; install iproute2 for the plane's network namespace"
    return None


def _last_line(done: subprocess.CompletedProcess[str]) -> str:
    said = (done.stderr or done.stdout).strip().splitlines()
    return said[-1].strip() if said else f"exit {done.returncode}"


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=PROBE_TIMEOUT, check=False,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        return subprocess.CompletedProcess(list(argv), 1, "", str(error))


def probe_userns() -> str | None:
    """Whether a user namespace's root may configure a network namespace: bringing `lo` up inside one, which is
    what the plane does. (Where AppArmor restricts user namespaces, unshare itself may succeed and only this fails.)"""
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"`{tool}` (util-linux) is not on the PATH"
    done = _run(["unshare", "--user", "--map-root-user", "--net", "ip", "link", "set", "lo", "up"])
    if done.returncode == 0:
        return None
    why = f"`unshare --user --map-root-user --net ip link set lo up` failed: {_last_line(done)}"
    restrict = Path("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
    with contextlib.suppress(OSError):
        if restrict.read_text().strip() == "1":
            why += " (kernel.apparmor_restrict_unprivileged_userns=1)"
    return why


def probe_sudo() -> str | None:
    """Whether sudo runs `ip netns` without a password, keeping the environment."""
    for tool in ("sudo", "setpriv"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not on the PATH"
    done = _run([*SUDO, "ip", "netns", "list"])
    return None if done.returncode == 0 else f"`sudo -n -E ip netns list` failed: {_last_line(done)}"


@dataclass(frozen=True)
class Namespace:
    """One plane's network namespace: how to enter it, find its processes and remove it, in the mode it was made."""

    mode: Mode
    name: str
    """The `ip netns` name (root, sudo); in user mode a label only."""
    holder: int | None = None
    """user: the process that keeps the namespace."""
    inode: int | None = None
    """user: the namespace's inode, so a holder pid the kernel gave to another process is never entered."""
    uid: int = 0
    gid: int = 0
    """sudo: who the commands run as inside."""

    def state(self) -> dict[str, Any]:
        return {"mode": self.mode, "name": self.name, "holder": self.holder, "inode": self.inode, "uid": self.uid,
                "gid": self.gid}

    @staticmethod
    def from_state(state: Any, name: str) -> Namespace:
        """The namespace a state file records; a plane recorded before modes existed used `ip netns` as root."""
        if not isinstance(state, Mapping):  # a name only: recorded before modes existed
            return Namespace("root", name)
        mode = state["mode"]
        if mode not in MODES:
            raise NetnsError(f"unknown network namespace mode {mode!r} in the plane's state; allowed: "
                             f"{', '.join(MODES)}")
        return Namespace(cast(Mode, mode), state.get("name") or name, state.get("holder"), state.get("inode"),
                         int(state.get("uid") or 0), int(state.get("gid") or 0))

    def command(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        """argv run inside the namespace, as the user. `env` is the environment the command is given; sudo mode
        puts back on the command line what sudo would drop of it (SUDO_DROPS)."""
        if self.mode == "root":
            return ["ip", "netns", "exec", self.name, *argv]
        if self.mode == "user":
            return ["nsenter", f"--target={self.holder}", "--user", "--net", "--preserve-credentials", "--", *argv]
        restored = [f"{key}={env[key]}" for key in SUDO_DROPS if env is not None and key in env]
        return [*SUDO, "ip", "netns", "exec", self.name, "setpriv", f"--reuid={self.uid}", f"--regid={self.gid}",
                "--init-groups", "--", "env", "--", *restored, *argv]

    def _admin(self, argv: Sequence[str]) -> list[str]:
        """An `ip` command that configures the namespace: as root, through sudo, or as the user namespace's root."""
        if self.mode == "root":
            return ["ip", "netns", "exec", self.name, *argv]
        if self.mode == "sudo":
            return [*SUDO, "ip", "netns", "exec", self.name, *argv]
        return self.command(argv)

    def _ip_netns(self, *args: str) -> list[str]:
        return [*(SUDO if self.mode == "sudo" else ()), "ip", "netns", *args]

    def ours(self) -> None:
        """Refuse, in one line, to bring down a namespace this process may not touch (made as root)."""
        if self.mode == "root" and os.geteuid() != 0 and self.exists():
            raise NetnsError(f"network namespace {self.name} was made as root (ip netns); bring its plane down as root")

    def exists(self) -> bool:
        if self.mode == "user":
            return self.holder is not None and _net_inode(self.holder) == self.inode
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
        return any(line.split()[0] == self.name for line in listed.splitlines() if line.strip())

    def pids(self) -> list[int]:
        """Every process in the namespace, whoever started it (the holder too)."""
        if self.mode == "user":
            return [] if self.inode is None else _pids_in(self.inode)
        listed = subprocess.run(self._ip_netns("pids", self.name), capture_output=True, text=True,
                                check=False).stdout
        return [int(pid) for pid in listed.split()]

    def remove(self) -> None:
        """Remove the namespace (its processes should have ended first: `pids`)."""
        if self.mode == "user":
            if self.exists() and self.holder is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(self.holder, signal.SIGKILL)
            holder = _HOLDERS.pop(self.holder or -1, None)
            if holder is not None:
                holder.wait(timeout=10)
            return
        subprocess.run(self._ip_netns("del", self.name), check=False, capture_output=True)


def left_behind(name: str) -> Namespace | None:
    """A named namespace of a plane whose state is gone (root or sudo mode): as root it is removed directly, else
    through sudo. (A user namespace without its recorded holder pid cannot be found; it ends with its processes.)"""
    found = Namespace("root" if os.geteuid() == 0 else "sudo", name, uid=os.getuid(), gid=os.getgid())
    return found if found.exists() else None


_HOLDERS: dict[int, subprocess.Popen[bytes]] = {}
"""Holders this process started, reaped when it removes them."""


def create(choice: Choice, name: str, addresses: Sequence[str] = ()) -> Namespace:
    """A new namespace in the chosen mode with `lo` up and the given addresses on it; nothing is left on failure."""
    if choice.mode == "user":
        ns = _start_holder(name)
    else:
        ns = Namespace(choice.mode, name, uid=os.getuid(), gid=os.getgid())
        done = subprocess.run(ns._ip_netns("add", name), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise NetnsError(f"`{' '.join(ns._ip_netns('add', name))}` failed: {_last_line(done)}")
    try:
        for argv in (["ip", "link", "set", "lo", "up"],
                     *(["ip", "addr", "add", address, "dev", "lo"] for address in addresses)):
            done = subprocess.run(ns._admin(argv), capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise NetnsError(f"`{' '.join(argv)}` in the plane's network namespace ({choice.mode}) failed: "
                                 f"{_last_line(done)}")
    except BaseException:
        for pid in ns.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        ns.remove()
        raise
    return ns


def _start_holder(name: str) -> Namespace:
    """A process in a new user and network namespace that keeps them until it is killed; it says `ready` once
    unshare has made them (before that, its namespaces are still ours)."""
    holder = subprocess.Popen(["unshare", "--user", "--map-root-user", "--net", "sh", "-c",
                               "echo ready; exec sleep infinity"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True)
    assert holder.stdout is not None and holder.stderr is not None
    said = holder.stdout.readline().decode(errors="replace").strip()
    holder.stdout.close()
    if said != "ready":
        holder.kill()
        holder.wait(timeout=10)
        why = holder.stderr.read().decode(errors="replace").strip().splitlines()
        holder.stderr.close()
        raise NetnsError(f"the network namespace's holder (unshare --user --net) did not start: "
                         f"{why[-1] if why else f'exit {holder.returncode}'}")
    holder.stderr.close()
    inode = _net_inode(holder.pid)
    if inode is None or inode == _net_inode(os.getpid()):
        holder.kill()
        holder.wait(timeout=10)
        raise NetnsError("the network namespace's holder (unshare --user --net) is not in a namespace of its own")
    _HOLDERS[holder.pid] = holder
    return Namespace("user", name, holder.pid, inode, os.getuid(), os.getgid())


def _net_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _pids_in(inode: int) -> list[int]:
    """Processes whose network namespace is this one (those of other users we may not see are not ours to end)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and _net_inode(int(proc.name)) == inode:
            found.append(int(proc.name))
    return sorted(found)
