"""The client the data-plane tests talk through (triarch.local.inside), against a server in a namespace of its own:
a cancelled request's connection is shut as a departing client shuts it, so the server sees it go (vLLM aborts a
request whose client went: `with_cancellation` on its completion routes); an answered request cannot be cancelled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine_tier import eventually
from triarch.local import netns
from triarch.local.inside import Client

PORT = 8099
SERVER = """
import pathlib, socket, sys
seen = pathlib.Path(sys.argv[1])
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", int(sys.argv[2])))
listener.listen()
(seen / "listening").touch()
while True:
    connection, _ = listener.accept()
    request = b""
    while b"\\r\\n\\r\\n" not in request:
        request += connection.recv(65536)
    if request.split(b" ")[1] == b"/answered":
        connection.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\nConnection: close\\r\\n\\r\\nok")
    else:  # a long generation: no answer, until the client goes
        (seen / "accepted").touch()
        while connection.recv(65536):
            pass
        (seen / "client-went").touch()
    connection.close()
"""
"""A server that answers /answered at once and holds any other request open until its client shuts the connection,
touching a file at each step."""


@dataclass
class Inside:
    client: Client
    seen: Path
    url: str


@pytest.fixture
def inside(engines_required: None, tmp_path: Path) -> Iterator[Inside]:
    namespace = netns.create(netns.choose(), f"in{os.getpid()}")
    server: subprocess.Popen[bytes] | None = None
    client: Client | None = None
    try:
        server = subprocess.Popen(namespace.command([sys.executable, "-c", SERVER, str(tmp_path), str(PORT)]),
                                  start_new_session=True)
        assert eventually(lambda: (tmp_path / "listening").exists(), 30, 0.1)
        client = Client(namespace.command)
        yield Inside(client, tmp_path, f"http://127.0.0.1:{PORT}")
    finally:
        if client is not None:
            client.close()
        if server is not None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
        namespace.remove()


def test_a_cancelled_request_ends_cancelled_and_its_server_sees_the_client_go(inside: Inside) -> None:
    pending = inside.client.submit("POST", inside.url + "/v1/completions", {"max_tokens": 8000}, timeout=120)
    assert eventually(lambda: (inside.seen / "accepted").exists(), 30, 0.1)
    assert not pending.done()
    assert inside.client.cancel(pending)
    answer = pending.result(30)
    assert (answer.cancelled, answer.status) == (True, None), answer
    assert eventually(lambda: (inside.seen / "client-went").exists(), 30, 0.1)


def test_an_answered_request_is_not_cancelled(inside: Inside) -> None:
    answered = inside.client.submit("GET", inside.url + "/answered")
    answer = answered.result(30)
    assert (answer.status, answer.body, answer.cancelled) == (200, "ok", False)
    assert inside.client.cancel(answered) is False
    again = inside.client.get(inside.url + "/answered")  # the client still serves after a cancel that did nothing
    assert (again.status, again.cancelled) == (200, False)
