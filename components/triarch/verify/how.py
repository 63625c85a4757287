"""How: Ray's layer, which splits the work. Every Ray Serve application of the RayService is RUNNING (the KubeRay
operator's readiness is base.check_ready's)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from triarch.planners.ray import RAY_SERVICE
from triarch.verify.base import Finding


def check_ray_service(service: dict[str, Any] | None, served: list[str]) -> Iterator[Finding]:
    """How: each Ray Serve application of the RayService RUNNING."""
    if service is None:
        yield Finding("how", f"RayService {RAY_SERVICE}", False, "not found", "pulumi up")
        return
    apps = ((service.get("status") or {}).get("activeServiceStatus") or {}).get("applicationStatuses") or {}
    for name in served:
        status = (apps.get(name) or {}).get("status", "absent")
        yield Finding("how", f"Ray Serve application {name}", status == "RUNNING", f"status {status}",
                      "" if status == "RUNNING" else
                      f"kubectl describe rayservice {RAY_SERVICE}; the head's logs (serve status)")
