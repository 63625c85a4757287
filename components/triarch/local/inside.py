"""HTTP from inside a network namespace: the engines there listen on its loopback only, and a test process outside
cannot reach them. `Client` starts one process inside (`python -m triarch.local.inside`, through the namespace's
`command`) that takes requests as JSON lines on its stdin, runs each on a thread of its own (so a test can keep many
in flight) and answers each as one JSON line: status, body, and for a streamed completion when its first and last
chunks came and how it ended. Times are wall-clock seconds (time.time), comparable across processes. A request can be
cancelled: its connection is shut, as a client that goes away shuts it (vLLM aborts a request whose client went)."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import IO, Any


@dataclass(frozen=True)
class Answer:
    """What one request got: an HTTP status (None where no response came: `error` says why) and its body; for a
    streamed (server-sent events) completion, the text of its chunks, when the first came, how many, and whether the
    stream ended with `[DONE]`."""

    status: int | None
    body: str = ""
    error: str | None = None
    started: float = 0.0
    first: float | None = None
    ended: float = 0.0
    chunks: int = 0
    tokens: int | None = None
    """A stream's completion tokens, where it asked for its usage (stream_options.include_usage)."""
    done: bool = False
    finish_reason: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    cancelled: bool = False
    """The request's connection was shut by `Client.cancel` before it was answered in full."""

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def seconds(self) -> float:
        return self.ended - self.started


# --- inside the namespace ----------------------------------------------------------------------------------------

def _stream(response: http.client.HTTPResponse, answer: dict[str, Any]) -> None:
    """Read an OpenAI stream: `data: {json}` events, then `data: [DONE]`."""
    text: list[str] = []
    for raw in response:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data:"):
            continue
        data = line.removeprefix("data:").strip()
        if answer["first"] is None:
            answer["first"] = time.time()
        if data == "[DONE]":
            answer["done"] = True
            break
        answer["chunks"] += 1
        with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
            event = json.loads(data)
            if event.get("usage"):
                answer["tokens"] = event["usage"]["completion_tokens"]
            choice = event["choices"][0]
            text.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
            answer["finish_reason"] = choice.get("finish_reason") or answer["finish_reason"]
    answer["body"] = "".join(text)


class _Open:
    """The connections of the requests in flight, by id, so a cancel can shut one (from the reading thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connections: dict[int, http.client.HTTPConnection] = {}
        self._cancelled: set[int] = set()

    def add(self, key: int, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            self._connections[key] = connection
            if key in self._cancelled:
                self._shut(connection)

    def remove(self, key: int) -> bool:
        """Forget a finished request; whether it was cancelled."""
        with self._lock:
            self._connections.pop(key, None)
            cancelled = key in self._cancelled
            self._cancelled.discard(key)
            return cancelled

    def cancel(self, key: int) -> None:
        with self._lock:
            self._cancelled.add(key)
            if key in self._connections:
                self._shut(self._connections[key])

    @staticmethod
    def _shut(connection: http.client.HTTPConnection) -> None:
        connection.auto_open = 0  # a shut connection is not opened again
        if connection.sock is not None:
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_RDWR)


def _perform(request: dict[str, Any], open_requests: _Open) -> dict[str, Any]:
    url = urllib.parse.urlsplit(request["url"])
    answer: dict[str, Any] = {"id": request["id"], "status": None, "body": "", "error": None, "started": time.time(),
                              "first": None, "ended": 0.0, "chunks": 0, "tokens": None, "done": False,
                              "finish_reason": None, "headers": {}, "cancelled": False}
    body = request.get("body")
    try:
        connection = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80,
                                                timeout=request.get("timeout", 60))
        connection.connect()
        open_requests.add(request["id"], connection)
        path = url.path + (f"?{url.query}" if url.query else "")
        headers = {"Content-Type": "application/json"} if body is not None else {}
        connection.request(request.get("method", "GET"), path or "/",
                           body=None if body is None else json.dumps(body), headers=headers)
        response = connection.getresponse()
        answer["status"] = response.status
        answer["headers"] = {k.lower(): v for k, v in response.getheaders()}
        if request.get("stream") and response.status == 200:
            _stream(response, answer)
        else:
            answer["body"] = response.read().decode(errors="replace")
        connection.close()
    except (OSError, http.client.HTTPException) as error:
        answer["error"] = f"{type(error).__name__}: {error}"
    answer["ended"] = time.time()
    answered = answer["error"] is None and (answer["done"] or not request.get("stream"))
    if open_requests.remove(request["id"]) and not answered:
        answer["cancelled"] = True
    return answer


def serve(requests: IO[str], answers: IO[str]) -> None:
    lock = threading.Lock()
    open_requests = _Open()

    def run(request: dict[str, Any]) -> None:
        answer = _perform(request, open_requests)
        with lock:
            answers.write(json.dumps(answer) + "\n")
            answers.flush()

    for line in requests:
        if not line.strip():
            continue
        request = json.loads(line)
        if "cancel" in request:
            open_requests.cancel(request["cancel"])
        else:
            threading.Thread(target=run, args=(request,), daemon=True).start()


# --- outside --------------------------------------------------------------------------------------------------------

class Client:
    """Requests made from inside a namespace. `inside` turns an argv into the command that runs it there."""

    def __init__(self, inside: Callable[[Sequence[str]], list[str]]) -> None:
        self._process = subprocess.Popen(inside([sys.executable, "-m", "triarch.local.inside"]),
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                                         start_new_session=True)
        self._pending: dict[int, Future[Answer]] = {}
        self._ids: dict[int, int] = {}
        """id(future) -> the request's id, while it is pending."""
        self._lock = threading.Lock()
        self._next = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            raw = json.loads(line)
            with self._lock:
                future = self._pending.pop(raw.pop("id"))
                self._ids.pop(id(future), None)
            future.set_result(Answer(**raw))
        with self._lock:  # the process ended: nothing more will come
            for future in self._pending.values():
                future.set_result(Answer(None, error="the client inside the namespace ended"))
            self._pending.clear()

    @property
    def pid(self) -> int:
        return self._process.pid

    def submit(self, method: str, url: str, body: Any = None, timeout: float = 60, stream: bool = False
               ) -> Future[Answer]:
        future: Future[Answer] = Future()
        with self._lock:
            self._next += 1
            self._pending[self._next] = future
            self._ids[id(future)] = self._next
            line = json.dumps({"id": self._next, "method": method, "url": url, "body": body, "timeout": timeout,
                               "stream": stream})
        self._send(line)
        return future

    def cancel(self, future: Future[Answer]) -> bool:
        """Shut a pending request's connection, as a client that goes away does; its answer then comes with
        `cancelled` (unless it was answered in full first). False where it was already answered."""
        with self._lock:
            key = self._ids.get(id(future))
            if key is None:
                return False
            line = json.dumps({"cancel": key})
        self._send(line)
        return True

    def _send(self, line: str) -> None:
        assert self._process.stdin is not None
        with self._lock:
            self._process.stdin.write(line + "\n")
            self._process.stdin.flush()

    def get(self, url: str, timeout: float = 30) -> Answer:
        return self.submit("GET", url, timeout=timeout).result(timeout + 30)

    def post(self, url: str, body: Any, timeout: float = 120) -> Answer:
        return self.submit("POST", url, body, timeout=timeout).result(timeout + 30)

    def close(self) -> None:
        if self._process.poll() is None:
            assert self._process.stdin is not None
            with contextlib.suppress(OSError):
                self._process.stdin.close()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)


@contextlib.contextmanager
def client(inside: Callable[[Sequence[str]], list[str]]) -> Iterator[Client]:
    made = Client(inside)
    try:
        yield made
    finally:
        made.close()


if __name__ == "__main__":
    serve(sys.stdin, sys.stdout)
