"""A stand-in for the Prometheus HTTP API, for KEDA's prometheus scaler on a local plane: `GET /api/v1/query`
answers with one sample whose value the test chose for the metric the query names (a JSON file: metric -> value,
read on every request), and records every query it was asked.

Usage (inside the plane's namespace): python prometheus_standin.py PORT VALUES.json QUERIES.log"""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*(?=\{|\)|\s|$)")


class Handler(BaseHTTPRequestHandler):
    values: Path
    queries: Path

    def do_GET(self) -> None:
        url = urllib.parse.urlparse(self.path)
        if url.path != "/api/v1/query":
            self.send_error(404)
            return
        query = urllib.parse.parse_qs(url.query).get("query", [""])[0]
        with self.queries.open("a") as log:
            log.write(query + "\n")
        chosen = json.loads(self.values.read_text())
        names = [m for m in METRIC.findall(query) if m not in ("sum", "avg", "max", "min")]
        result = [{"metric": {}, "value": [time.time(), str(chosen[name])]} for name in names[:1] if name in chosen]
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


def main() -> None:
    port, values, queries = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    Handler.values, Handler.queries = values, queries
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
