"""A live cluster as verify reads it: kubectl through testinfra's local host, and a port-forward per server; the
two ways a cluster fails to answer (skip, or fail)."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from triarch.planners.vllm import PORT


class Unreachable(Exception):
    """No cluster answers (no kubectl, no context, or the API server does not): verify fails, or is skipped
    where asked to (`--if-reachable`)."""


class KubectlFailed(Exception):
    """The cluster answered, but a kubectl call failed (RBAC, a missing namespace): verify fails."""


class Cluster:
    """kubectl through testinfra's local host."""

    def __init__(self, context: str | None = None, kubeconfig: str | None = None) -> None:
        import testinfra  # type: ignore[import-untyped]

        self.host = testinfra.get_host("local://")
        self.context = [*(["--kubeconfig", kubeconfig] if kubeconfig else []), *(["--context", context] if context
                                                                                 else [])]

    def kubectl(self, *args: str) -> str:
        result = self.host.run(" ".join(shlex.quote(a) for a in ["kubectl", *self.context, *args]))
        if result.rc != 0:
            raise KubectlFailed(f"kubectl {' '.join(args)}: " + (result.stderr.strip().splitlines()[-1]
                                                                  if result.stderr.strip() else f"exit {result.rc}"))
        return str(result.stdout)

    def reachable(self) -> None:
        if not self.host.exists("kubectl"):
            raise Unreachable("kubectl is not on the PATH")
        try:
            self.kubectl("get", "--raw", "/readyz")
        except KubectlFailed as why:
            raise Unreachable(str(why)) from None

    def items(self, *args: str) -> list[dict[str, Any]]:
        return list(json.loads(self.kubectl("get", *args, "-o", "json")).get("items", []))

    def get(self, *args: str) -> dict[str, Any] | None:
        try:
            return dict(json.loads(self.kubectl("get", *args, "-o", "json")))
        except KubectlFailed:
            return None

    @contextmanager
    def forward(self, namespace: str, service: str, port: int = PORT, scheme: str = "http") -> Iterator[str]:
        """A local address for a service's port (the OpenAI port unless told), through kubectl port-forward."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            local = probe.getsockname()[1]
        process = subprocess.Popen(["kubectl", *self.context, "-n", namespace, "port-forward", f"svc/{service}",
                                    f"{local}:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(50):
                with socket.socket() as attempt:
                    if attempt.connect_ex(("127.0.0.1", local)) == 0:
                        break
                time.sleep(0.1)
            yield f"{scheme}://127.0.0.1:{local}"
        finally:
            process.terminate()
            process.wait(timeout=10)
