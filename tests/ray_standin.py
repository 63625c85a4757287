"""A stand-in for what KubeRay asks of a Ray cluster, on a local plane whose pod addresses are the plane's own: the
dashboard's Serve API on 8265 (PUT a Serve config, GET each application's status: RUNNING for what was PUT to that
head, with one HEALTHY deployment) and the Serve proxy's health check on 8000. One process answers for every pod: the
address a connection arrived at is the pod's. Every request is appended to a log for the test.

Usage (inside the plane's namespace): python ray_standin.py REQUESTS.log"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

SERVE_API = "/api/serve/applications/"


class Handler(BaseHTTPRequestHandler):
    log_path: Path
    configs: ClassVar[dict[str, dict[str, object]]] = {}
    """Serve config per head address, as PUT by KubeRay."""
    lock = threading.Lock()

    def _pod(self) -> str:
        return str(self.connection.getsockname()[0])

    def _answer(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> None:
        with self.lock, self.log_path.open("a") as log:
            log.write(f"{self.command} {self._pod()}:{self.server.server_address[1]} {self.path}\n")

    def do_PUT(self) -> None:  # http.server's name
        self._record()
        if not self.path.startswith(SERVE_API):
            self._answer(404, {})
            return
        length = int(self.headers.get("Content-Length", "0"))
        config = json.loads(self.rfile.read(length) or b"{}")
        with self.lock:
            self.configs[self._pod()] = config
        self._answer(200, {})

    def do_GET(self) -> None:  # http.server's name
        self._record()
        if self.path.startswith("/-/healthz"):
            self._answer(200, "success")
            return
        if not self.path.startswith(SERVE_API):
            self._answer(404, {})
            return
        with self.lock:
            config = self.configs.get(self._pod(), {})
        applications = {}
        for app in config.get("applications", []) or []:  # type: ignore[attr-defined]
            name = app["name"]
            applications[name] = {"name": name, "status": "RUNNING", "route_prefix": app.get("route_prefix"),
                                  "deployments": {"LLMServer": {"name": "LLMServer", "status": "HEALTHY"}}}
        self._answer(200, {"applications": applications, "deploy_mode": "MULTI_APP"})

    def log_message(self, format: str, *args: object) -> None:  # http.server's signature
        return


def main() -> None:
    Handler.log_path = Path(sys.argv[1])
    servers = [ThreadingHTTPServer(("0.0.0.0", port), Handler) for port in (8265, 8000)]
    for server in servers[1:]:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    servers[0].serve_forever()


if __name__ == "__main__":
    main()
