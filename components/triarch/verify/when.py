"""When: vLLM's layer, which serves the work. Each server answers /health, lists its model and exports what the
alerts read; a replica across EFA nodes talks over EFA; a replica's measured start stays within its prediction."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from triarch.planners.coldstart import duration, span
from triarch.planners.model_plan import ModelPlan
from triarch.verify.base import Finding

ALERT_METRICS = ("num_requests_waiting", "num_requests_running", "kv_cache_usage_perc", "num_preemptions",
                 "time_to_first_token_seconds")
"""The vLLM metrics the alerts and the autoscaler read (base names; counters and histograms carry suffixes)."""


def exposition_names(exposition: str) -> set[str]:
    """Metric names of a Prometheus text exposition (comments and blank lines skipped)."""
    names = set()
    for line in exposition.splitlines():
        match = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)", line)
        if match and not line.startswith("#"):
            names.add(match.group(1))
    return names


def check_vllm(plan: ModelPlan, base_url: str, timeout: float = 5.0) -> Iterator[Finding]:
    """When: /health answers, /v1/models lists the served model, /metrics has what the alerts read."""
    subject = f"vLLM server {plan.name}"

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(base_url.rstrip("/") + path, timeout=timeout) as response:
                return response.status, response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as error:
            return error.code, ""
        except OSError as error:
            return 0, str(error)

    status, _ = get("/health")
    yield Finding("when", subject, status == 200, f"/health answered {status or 'nothing'}",
                  "" if status == 200 else f"kubectl -n <namespace> logs deploy/{plan.name} (weights, OOM, CUDA)")
    status, body = get("/v1/models")
    try:
        ids = [m.get("id") for m in json.loads(body).get("data", [])] if status == 200 else []
    except (json.JSONDecodeError, AttributeError):
        ids = []
    yield Finding("when", subject, plan.name in ids, f"/v1/models lists {ids or 'nothing'}",
                  "" if plan.name in ids else "--served-model-name must be the stack's model name (pulumi up)")
    status, body = get("/metrics")
    exported = exposition_names(body) if status == 200 else set()
    missing = [m for m in ALERT_METRICS
               if not any(n == f"vllm:{m}" or n.startswith(f"vllm:{m}_") for n in exported)]
    yield Finding("when", subject, not missing, "exports every metric the alerts read" if not missing else
                  f"does not export {', '.join('vllm:' + m for m in missing)}",
                  "" if not missing else "the image's vLLM must be the pinned one (templates/compat/images.yaml)")


NCCL_OVER_EFA = ("Using network Libfabric", "Using network AWS Libfabric", "NET/OFI Selected provider is efa")
"""What NCCL (with aws-ofi-nccl) logs at INFO when it talks over EFA: NVIDIA/nccl src/init.cc "Using network %s"
with the plugin's name (Libfabric since aws-ofi-nccl 1.12, "AWS Libfabric" before), and the plugin's own line
(aws/aws-ofi-nccl src/nccl_ofi_net.cpp)."""


NCCL_OVER_TCP = ("Using network Socket", "NET/Socket : Using")
"""What it logs when it found no network plugin and uses TCP sockets (src/init.cc, src/transport/net_socket.cc)."""


def nccl_transport(log: str) -> str | None:
    """"efa", "tcp", or None when the log says neither (NCCL not started, or NCCL_DEBUG not INFO)."""
    if any(marker in log for marker in NCCL_OVER_EFA):
        return "efa"
    if any(marker in log for marker in NCCL_OVER_TCP):
        return "tcp"
    return None


def check_nccl(plan: ModelPlan, pod: str, log: str) -> Finding:
    """A replica across nodes on an EFA pool talks over EFA, not over the TCP NCCL falls back to unannounced."""
    subject = f"{plan.name} NCCL ({pod})"
    transport = nccl_transport(log)
    if transport == "efa":
        return Finding("when", subject, True, "the stages talk over EFA (Libfabric)")
    if transport == "tcp":
        return Finding("when", subject, False, "NCCL fell back to TCP sockets between the nodes",
                       "an image with libfabric and aws-ofi-nccl (templates/compat/efa-images.yaml), and the pod's "
                       "vpc.amazonaws.com/efa request granted")
    return Finding("when", subject, False, "no NCCL network line in the log (not started yet, or NCCL_DEBUG unset)",
                   "wait for the replica to load, then run verify again")


VLLM_START_LINES = {
    "load": re.compile(r"Model loading took [\d.]+ ?GiB(?: memory)? and ([\d.]+) seconds"),
    "compile": re.compile(r"torch\.compile (?:takes|took) ([\d.]+) s in total"),
    "graphs": re.compile(r"Graph capturing finished in ([\d.]+) secs"),
    "init": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) (?:seconds|s)"),
}
"""What vLLM logs of its own start (0.33.0's format strings: model_loader gpu_model_runner.py "Model loading took",
compilation/monitor.py "torch.compile took", gpu_model_runner.py "Graph capturing finished", v1/engine/core.py "init
engine ... took"; earlier releases' "takes" and "seconds" too). The last match wins: a restarted engine logs again."""


def _seconds_at(stamp: str | None) -> float | None:
    if not stamp:
        return None
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class StartTimes:
    """One pod's start, as its own status and vLLM's log tell it (seconds; None where they do not say)."""

    pod: str
    to_scheduled: float | None
    """Created to bound to a node: the node's launch, where none had room."""
    to_started: float | None
    """Bound to the server container running: the image pull (and volume mounts)."""
    to_ready: float | None
    """Container running to Ready: the weights and vLLM's start."""
    total: float | None
    vllm: dict[str, float]
    """load, compile, graphs, init: vLLM's own figures."""


def start_times(pod: Mapping[str, Any], log: str, container: str = "vllm") -> StartTimes:
    """A Ready pod's start from its creation, its conditions' transition times and its container's start."""
    status = pod.get("status") or {}
    created = _seconds_at((pod.get("metadata") or {}).get("creationTimestamp"))
    when = {c.get("type"): _seconds_at(c.get("lastTransitionTime")) for c in status.get("conditions") or []
            if c.get("status") == "True"}
    running = next((c.get("state", {}).get("running", {}).get("startedAt") for c in
                    status.get("containerStatuses") or [] if c.get("name") == container), None)
    started = _seconds_at(running)
    scheduled, ready = when.get("PodScheduled"), when.get("Ready")

    def between(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else max(0.0, b - a)

    found = {name: float(matches[-1]) for name, pattern in VLLM_START_LINES.items()
             if (matches := pattern.findall(log))}
    return StartTimes(str(pod["metadata"]["name"]), between(created, scheduled), between(scheduled, started),
                      between(started, ready), between(created, ready), found)


def check_start(plan: ModelPlan, times: StartTimes) -> Finding:
    """A replica's measured start beside its prediction; slower than the prediction's slow end with its margin is a
    finding (the budget the startup probe and `pulumi up` were given came from it)."""
    subject = f"{plan.name} start ({times.pod})"
    measured = ", ".join(f"{label} {duration(value)}" for label, value in (
        ("to a node", times.to_scheduled), ("image", times.to_started), ("weights + engine", times.to_ready))
        if value is not None)
    own = ", ".join(f"{k} {v:g}s" for k, v in times.vllm.items())
    cold = plan.cold_start
    predicted = "" if cold is None else f"; predicted {span(cold.total())}" + (
        f" + {', '.join(cold.unknown())} unknown" if cold.unknown() else "")
    text = (f"Ready {duration(times.total)} after creation" if times.total is not None else "not Ready yet") + (
        f" ({measured})" if measured else "") + (f"; vLLM: {own}" if own else "") + predicted
    if cold is not None and times.total is not None and not cold.unknown() \
            and times.total > cold.total().high * cold.margin:
        return Finding("when", subject, False, text + ": slower than the prediction's slow end with its margin",
                       "compare the parts with `triarch plan`'s; a slow part is worth a look (image size, the cache's "
                       "throughput, a cold compile cache)")
    return Finding("when", subject, True, text)
