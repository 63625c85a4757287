"""How the local plane gets its network namespace (triarch.local.netns): the choice between root, user namespaces
and sudo from what the machine allows (the probes' answers given here, not the machine's), the one line that says
which and why, and how each mode wraps a command. The namespaces themselves run in the real tier
(test_real_engines), in whichever mode the machine allows."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from triarch.local import netns
from triarch.local.netns import Choice, Namespace, NetnsError, choose
from triarch.local.plane import Plane

WORKS = None
NO_USERNS = "`unshare --user --map-root-user --net ip link set lo up` failed: Operation not permitted"
NO_SUDO = "`sudo -n -E ip netns list` failed: sudo: a password is required"


def _never() -> str | None:
    raise AssertionError("this probe must not run")


def _choose(forced: str = "", euid: int = 1000, user: netns.Probe = lambda: WORKS,
            sudo: netns.Probe = lambda: WORKS) -> Choice:
    return choose(forced, euid, lambda: None, user, sudo)


def test_root_uses_ip_netns_without_probing_anything_else() -> None:
    choice = _choose(euid=0, user=_never, sudo=_never)
    assert choice == Choice("root", "running as root: ip netns")
    assert choice.line == "network namespace: root (running as root: ip netns)"


def test_a_user_gets_a_user_namespace_where_the_kernel_allows_one_and_sudo_is_not_tried() -> None:
    choice = _choose(sudo=_never)
    assert choice.mode == "user"
    assert choice.line == ("network namespace: user (euid 1000, and unprivileged user namespaces work: "
                           "unshare --user --net)")


def test_sudo_is_the_last_resort_and_says_why_user_namespaces_were_not_used() -> None:
    choice = _choose(user=lambda: NO_USERNS)
    assert choice.mode == "sudo"
    assert choice.line == (f"network namespace: sudo (euid 1000, user namespaces do not work ({NO_USERNS}), "
                           "passwordless sudo does)")


def test_no_way_at_all_is_one_line_naming_each_attempt_and_each_fix() -> None:
    with pytest.raises(NetnsError) as error:
        _choose(user=lambda: NO_USERNS, sudo=lambda: NO_SUDO)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"no network namespace for the local plane: not root (euid 1000); user namespaces: "
                              f"{NO_USERNS}; sudo: {NO_SUDO}; run as root, or ")
    assert "kernel.apparmor_restrict_unprivileged_userns=0" in message and "passwordless sudo" in message


def test_iproute2_is_needed_in_every_mode() -> None:
    with pytest.raises(NetnsError, match=r"^`ip` \(iproute2\) is not on the PATH; install iproute2"):
        choose("user", 0, lambda: "`ip` (iproute2) is not on the PATH; install iproute2", _never, _never)


def _fake_tools(directory: Path, monkeypatch: pytest.MonkeyPatch, **scripts: str) -> None:
    """A PATH of stand-ins for util-linux and sudo (the probes' answers without the machine's own)."""
    directory.mkdir()
    for name, body in scripts.items():
        (directory / name).write_text(f"#!/bin/sh\n{body}\n")
        (directory / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{directory}:{os.environ['PATH']}")


def test_the_user_namespace_probe_says_what_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where AppArmor restricts user namespaces, unshare may start and only configuring the namespace fails: the
    probe configures it, as the plane does."""
    _fake_tools(tmp_path / "bin", monkeypatch, nsenter="exit 0",
                unshare='echo "RTNETLINK answers: Operation not permitted" >&2; exit 2')
    assert netns.probe_userns() == ("`unshare --user --map-root-user --net ip link set lo up` failed: "
                                    "RTNETLINK answers: Operation not permitted")


def test_the_sudo_probe_never_prompts_and_says_what_sudo_said(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_tools(tmp_path / "bin", monkeypatch, setpriv="exit 0",
                sudo='[ "$1" = -n ] || exit 9; echo "sudo: a password is required" >&2; exit 1')
    assert netns.probe_sudo() == NO_SUDO


@pytest.mark.parametrize(("forced", "euid", "mode"), [("root", 0, "root"), ("user", 1000, "user"),
                                                      ("user", 0, "user"), ("sudo", 1000, "sudo"),
                                                      ("sudo", 0, "sudo")])
def test_a_forced_mode_is_taken_where_it_works(forced: str, euid: int, mode: str) -> None:
    choice = _choose(forced, euid)
    assert choice.mode == mode
    assert choice.line == f"network namespace: {mode} (TRIARCH_NETNS={forced})"


@pytest.mark.parametrize(("forced", "euid", "start"), [
    ("root", 1000, "TRIARCH_NETNS=root, but this process is not root (euid 1000); run it as root, or unset"),
    ("user", 1000, f"TRIARCH_NETNS=user, but unprivileged user namespaces do not work here: {NO_USERNS}; allow "),
    ("sudo", 1000, f"TRIARCH_NETNS=sudo, but passwordless sudo does not work here: {NO_SUDO}; give passwordless"),
    ("netns", 0, "TRIARCH_NETNS=netns: unknown mode; allowed: root, user, sudo"),
])
def test_a_forced_mode_that_does_not_work_is_refused_in_one_line(forced: str, euid: int, start: str) -> None:
    with pytest.raises(NetnsError) as error:
        _choose(forced, euid, user=lambda: NO_USERNS, sudo=lambda: NO_SUDO)
    assert str(error.value).startswith(start)
    assert "\n" not in str(error.value)


def test_the_mode_is_forced_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIARCH_NETNS", "sudo")
    assert choose(None, 0, lambda: None, _never, lambda: None).mode == "sudo"
    monkeypatch.setenv("TRIARCH_NETNS", "")
    assert choose(None, 0, lambda: None, _never, _never).mode == "root"


ENV = {"PATH": "/engines:/usr/bin", "HOME": "/home/tri", "KUBECONFIG": "/p/kubeconfig", "PYTHONPATH": "/bench",
       "TMPDIR": "/home/tri/tmp"}


def test_root_mode_runs_commands_under_ip_netns_exec() -> None:
    assert Namespace("root", "triarch-lab").command(["kubectl", "get", "nodes"], ENV) == [
        "ip", "netns", "exec", "triarch-lab", "kubectl", "get", "nodes"]


def test_user_mode_enters_the_holders_namespaces_keeping_the_users_credentials() -> None:
    """Without --preserve-credentials nsenter fails on setgroups; with it the command is root of the user namespace
    and what it writes belongs to the user."""
    assert Namespace("user", "triarch-lab", holder=4242, inode=7).command(["kubectl", "get", "nodes"], ENV) == [
        "nsenter", "--target=4242", "--user", "--net", "--preserve-credentials", "--", "kubectl", "get", "nodes"]


def test_sudo_mode_enters_through_sudo_and_runs_as_the_user_with_what_sudo_drops_put_back() -> None:
    command = Namespace("sudo", "triarch-lab", uid=1001, gid=1002).command(["kubectl", "get", "nodes"], ENV)
    assert command == [
        "sudo", "-n", "--preserve-env", "ip", "netns", "exec", "triarch-lab",
        "setpriv", "--reuid=1001", "--regid=1002", "--init-groups", "--",
        "env", "--", "PATH=/engines:/usr/bin", "HOME=/home/tri", "PYTHONPATH=/bench", "TMPDIR=/home/tri/tmp",
        "kubectl", "get", "nodes"]
    assert "KUBECONFIG=/p/kubeconfig" not in command  # kept by --preserve-env, not spelled out
    # TMPDIR: the C library drops it for any setuid program (sudo); the engines' compile cache would go to /tmp


def test_the_state_file_records_the_namespace_so_another_process_enters_the_same_one(tmp_path: Path) -> None:
    recorded = Namespace("user", "triarch-lab", holder=4242, inode=7, uid=1001, gid=1001)
    assert Namespace.from_state(recorded.state(), "ignored") == recorded
    plane = Plane("lab", tmp_path)
    plane.state_file.write_text('{"name": "lab", "netns": ' + __import__("json").dumps(recorded.state()) + "}")
    assert plane.command(["true"])[:3] == ["nsenter", "--target=4242", "--user"]
    # A plane recorded before the modes existed named its namespace only: ip netns, as root.
    assert Namespace.from_state("triarch-lab", "triarch-lab") == Namespace("root", "triarch-lab")
    with pytest.raises(NetnsError, match=r"^unknown network namespace mode 'vm'"):
        Namespace.from_state({"mode": "vm"}, "x")


def test_a_user_namespace_whose_holder_is_gone_is_not_there_and_holds_no_process() -> None:
    """A holder pid the kernel gave to another process is not the namespace (its inode differs)."""
    mine = os.stat(f"/proc/{os.getpid()}/ns/net").st_ino
    assert not Namespace("user", "x", holder=os.getpid(), inode=mine + 1).exists()
    assert Namespace("user", "x", holder=os.getpid(), inode=mine).exists()
    assert Namespace("user", "x", holder=os.getpid(), inode=mine + 1).pids() == []
    assert os.getpid() in Namespace("user", "x", holder=os.getpid(), inode=mine).pids()


def test_a_namespace_made_as_root_is_not_brought_down_by_a_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setattr(Namespace, "exists", lambda self: True)
    with pytest.raises(NetnsError, match=r"^network namespace triarch-lab was made as root \(ip netns\); bring its "
                                         r"plane down as root$"):
        Namespace("root", "triarch-lab").ours()
    Namespace("user", "triarch-lab", holder=1, inode=1).ours()  # the user's own: fine


def test_local_netns_says_the_mode_in_one_line_or_fails_with_why(capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """What CI runs before the engine build: the mode chosen here, exit 0; none, exit 1 with the one line."""
    from triarch.cli import main

    monkeypatch.setattr(netns, "choose", lambda: Choice("sudo", "forced"))
    assert main(["local", "netns"]) == 0
    assert capsys.readouterr().out == "network namespace: sudo (forced)\n"

    def nowhere() -> Choice:
        raise NetnsError("no network namespace for the local plane: not root")

    monkeypatch.setattr(netns, "choose", nowhere)
    assert main(["local", "netns"]) == 1
    said = capsys.readouterr()
    assert said.out == "" and said.err == "error: no network namespace for the local plane: not root\n"
