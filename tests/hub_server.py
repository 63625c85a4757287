"""A Hugging Face Hub on loopback, in the Hub's own URL layout, for the real huggingface_hub client to read from
(`HF_ENDPOINT=http://127.0.0.1:<port>`). It answers what huggingface_hub 2.4.0 asks for a model (read in its
source, .venv/.../huggingface_hub):

- `GET /api/models/{org}/{name}/revision/{revision}` (hf_api.py `HfApi.model_info`): the commit (`sha`), the
  files (`siblings[].rfilename`), `gated`, and the Hub's count of the safetensors parameters per dtype
  (`safetensors.parameters`, `.total`; `ModelInfo.__init__`).
- `HEAD` and `GET /{org}/{name}/resolve/{revision}/{file}` (file_download.py `hf_hub_url`, `get_hf_file_metadata`,
  `http_get`): the commit in `X-Repo-Commit`, the blob's id in `ETag` (quoted, as `_normalize_etag` strips), the
  size in `Content-Length`.
- `GET` with `Range: bytes=0-100000` on a safetensors file (hf_api.py `HfApi.parse_safetensors_file_metadata`):
  its first bytes, the header's length (8 bytes, little-endian) then the JSON header, as 206 Partial Content.
- Errors as `hf_raise_for_status` (utils/_http.py) reads them: `X-Error-Code` RepoNotFound, RevisionNotFound,
  EntryNotFound or GatedRepo. A gated repository answers 401 to a request without a token, on its model info as on
  its files (the Hub did so for mistralai/Mistral-7B-Instruct-v0.2: ml-explore/mlx-examples issue 759, "Cannot access
  gated repo for url .../api/models/mistralai/Mistral-7B-Instruct-v0.2/revision/main"), and 403 to a token whose
  account has not been granted access.

Bound to 127.0.0.1 only, on a port the system picks; every request is recorded (method, path, whether it carried
a token) for the tests to assert on.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote


@dataclass
class Repo:
    """One model repository: its branches and tags (name -> commit) and each commit's files."""

    refs: dict[str, str]
    commits: dict[str, dict[str, bytes]]
    gated: bool = False
    parameters: dict[str, int] = field(default_factory=dict)
    """The Hub's safetensors count per dtype (the same for every commit here)."""


@dataclass
class Hub:
    repos: dict[str, Repo]
    token: str | None = None
    """The token an account granted access to the gated repositories holds."""
    down: bool = False
    """Answer every request 503, as a Hub that is down does."""
    requests: list[tuple[str, str, bool]] = field(default_factory=list)
    url: str = ""


def _blob_id(content: bytes) -> str:
    """What the Hub puts in a small (non-LFS) file's ETag: its git blob id."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    hub: Hub

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _error(self, status: int, code: str, message: str, commit: str | None = None) -> None:
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _answer(self, body: bool) -> None:
        hub = self.hub
        auth = self.headers.get("Authorization") or ""
        path = self.path.split("?", 1)[0]
        hub.requests.append((self.command, path, bool(auth)))
        if hub.down:
            self._error(503, "ServiceUnavailable", "Service Unavailable")
            return
        parts = [unquote(p) for p in path.strip("/").split("/")]
        api = parts[:2] == ["api", "models"]
        if api and len(parts) >= 4:
            repo_id, rest = "/".join(parts[2:4]), parts[4:]
            revision = rest[1] if rest[:1] == ["revision"] and len(rest) == 2 else "main"
        elif len(parts) >= 5 and parts[2] == "resolve":
            repo_id, revision, rest = "/".join(parts[:2]), parts[3], parts[4:]
        else:
            self._error(404, "RepoNotFound", "Repository not found")
            return
        repo = hub.repos.get(repo_id)
        if repo is None:
            self._error(401 if not auth else 404, "RepoNotFound", "Repository not found")
            return
        if repo.gated and auth != f"Bearer {hub.token}":
            if not auth:
                self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to "
                                              "it and be authenticated to access it. Please log in.")
            else:
                self._error(403, "GatedRepo", f"Access to model {repo_id} is restricted and you are not in the "
                                              "authorized list.")
            return
        commit = revision if revision in repo.commits else repo.refs.get(revision)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return
        files = repo.commits[commit]
        if api:
            payload = {"id": repo_id, "sha": commit, "gated": "manual" if repo.gated else False, "private": False,
                       "siblings": [{"rfilename": name} for name in sorted(files)]}
            if repo.parameters:
                payload["safetensors"] = {"parameters": repo.parameters, "total": sum(repo.parameters.values())}
            self._send(json.dumps(payload).encode(), "application/json", commit, body)
            return
        name = "/".join(rest)
        if name not in files:
            self._error(404, "EntryNotFound", f"{name} does not exist on \"{revision}\"", commit)
            return
        content, partial = files[name], None
        wanted = self.headers.get("Range") or ""
        if body and wanted.startswith("bytes="):  # a range read: the first bytes of a safetensors file
            first, _, last = wanted[len("bytes="):].partition("-")
            start, end = int(first), min(int(last) if last else len(content) - 1, len(content) - 1)
            content, partial = content[start:end + 1], f"bytes {start}-{end}/{len(files[name])}"
        self._send(content, "application/octet-stream", commit, body, etag=_blob_id(files[name]), partial=partial)

    def _send(self, content: bytes, kind: str, commit: str, body: bool, etag: str | None = None,
              partial: str | None = None) -> None:
        self.send_response(206 if partial else 200)
        if partial:
            self.send_header("Content-Range", partial)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(content)))
        self.send_header("X-Repo-Commit", commit)
        if etag:
            self.send_header("ETag", f'"{etag}"')
        self.end_headers()
        if body:
            self.wfile.write(content)


@contextmanager
def serve(hub: Hub) -> Iterator[Hub]:
    """Serve `hub` on 127.0.0.1 until the block ends; `hub.url` is its HF_ENDPOINT."""
    handler = type("Handler", (_Handler,), {"hub": hub})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
