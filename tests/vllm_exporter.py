"""vLLM's /metrics as Prometheus scrapes it from each pod of a served model, for the pods kwok runs (no vLLM runs in
them): `GET /metrics/<pod>` answers in the Prometheus text format (0.0.4, which vLLM's prometheus_client serves)
with the two gauges KEDA scales on, labelled as vLLM labels every engine metric: `model_name` (the served model name)
and `engine` (the engine core's index). The values are the test's: a JSON file, re-read on every request,
pod -> {"model_name": ..., "num_requests_waiting": ..., "kv_cache_usage_perc": ...}. A pod not in it is 404 (its
scrape fails, as an unreachable pod's would).

Help texts and label names as vLLM's PrometheusStatLogger registers them (vllm/v1/metrics/loggers.py in
vllm-project/vllm: labelnames ["model_name", "engine"], model_name = the served model name, engine = str(index) of
each engine core: one core, index 0, without data parallelism); the pinned release's list
(../shared/reference/vllm-0.33.0/metrics.txt) holds metric names only, both of these among them, and
templates/compat/metrics.yaml names them as gauges.

Usage (inside the plane's namespace, on its loopback): python vllm_exporter.py PORT VALUES.json"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

GAUGES = {
    "num_requests_waiting": "Number of requests waiting to be processed.",
    "kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
}
ENGINE = "0"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def exposition(pod: dict[str, Any]) -> str:
    """One pod's gauges in the text format, each family with its HELP and TYPE lines."""
    labels = f'model_name="{pod["model_name"]}",engine="{ENGINE}"'
    lines = []
    for name, help_text in GAUGES.items():
        lines += [f"# HELP vllm:{name} {help_text}", f"# TYPE vllm:{name} gauge",
                  f"vllm:{name}{{{labels}}} {float(pod[name])!r}"]
    return "\n".join(lines) + "\n"


class Handler(BaseHTTPRequestHandler):
    values: Path

    def do_GET(self) -> None:
        prefix, _, pod = self.path.partition("/metrics/")
        chosen = json.loads(self.values.read_text())
        if prefix or pod not in chosen:
            self.send_error(404)
            return
        body = exposition(chosen[pod]).encode()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


def main() -> None:
    port, values = int(sys.argv[1]), Path(sys.argv[2])
    Handler.values = values
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
