"""A local plane's chart mirror: Helm chart archives pushed into an OCI registry on the plane's loopback, the way a
company loads its own mirror (`helm push`), so a stack whose triarch:registry.charts points there pulls every chart
through Helm's OCI client, as the pulumi-kubernetes provider does on a real cluster.

A push is the OCI distribution API's: the chart's metadata as the config blob, the archive as the one layer, and a
manifest tagged with the chart's version (`+` becomes `_`, as Helm tags it). Run inside the plane's network namespace
(`python -m triarch.local.mirror`), since the registry listens there."""

from __future__ import annotations

import hashlib
import io
import json
import ssl
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CONFIG_MEDIA_TYPE = "application/vnd.cncf.helm.config.v1+json"
CHART_MEDIA_TYPE = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
"""Helm's OCI media types (helm.sh/helm/v3 pkg/registry/constants.go) and the OCI image manifest's."""


class MirrorError(Exception):
    """A chart could not be read or pushed: one line naming the chart and the registry."""


@dataclass(frozen=True)
class ChartArchive:
    name: str
    version: str
    metadata: dict[str, Any]
    data: bytes

    @property
    def tag(self) -> str:
        return self.version.replace("+", "_")

    def file(self, relative: str) -> bytes | None:
        """One file of the chart (`crds/<file>`), as packaged; None where it has none."""
        with tarfile.open(fileobj=io.BytesIO(self.data), mode="r:gz") as archive:
            try:
                handle = archive.extractfile(f"{self.name}/{relative}")
            except KeyError:
                return None
            return handle.read() if handle is not None else None


def read_archive(path: Path) -> ChartArchive:
    """A chart archive's name, version and metadata (its top directory's Chart.yaml)."""
    data = path.read_bytes()
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            member = next((m for m in archive.getmembers()
                           if m.name.count("/") == 1 and m.name.endswith("/Chart.yaml")), None)
            handle = archive.extractfile(member) if member is not None else None
            if handle is None:
                raise MirrorError(f"{path}: no Chart.yaml at the top of the archive; not a packaged Helm chart")
            metadata = yaml.safe_load(handle.read())
    except (tarfile.TarError, OSError, yaml.YAMLError) as error:
        raise MirrorError(f"{path}: not a readable chart archive ({error})") from error
    if not isinstance(metadata, dict) or not metadata.get("name") or not metadata.get("version"):
        raise MirrorError(f"{path}: its Chart.yaml has no name or version")
    return ChartArchive(str(metadata["name"]), str(metadata["version"]), metadata, data)


def _digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


class Registry:
    """An OCI registry's push API, over HTTPS with a given CA (the plane's)."""

    def __init__(self, url: str, ca: Path | None = None) -> None:
        self.url = url.rstrip("/")
        self.context = ssl.create_default_context(cafile=str(ca) if ca else None)

    def _call(self, method: str, url: str, data: bytes | None = None,
              headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
        request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=60) as response:
                return response.status, dict(response.headers)
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers)
        except (urllib.error.URLError, OSError) as error:
            raise MirrorError(f"registry {self.url} does not answer: {error}") from error

    def put_blob(self, repository: str, data: bytes) -> str:
        digest = _digest(data)
        status, _ = self._call("HEAD", f"{self.url}/v2/{repository}/blobs/{digest}")
        if status == 200:
            return digest
        status, headers = self._call("POST", f"{self.url}/v2/{repository}/blobs/uploads/", b"")
        location = headers.get("Location")
        if status != 202 or not location:
            raise MirrorError(f"registry {self.url} refused an upload to {repository} (HTTP {status})")
        target = urllib.parse.urljoin(self.url + "/", location)
        target += ("&" if "?" in target else "?") + urllib.parse.urlencode({"digest": digest})
        status, _ = self._call("PUT", target, data, {"Content-Type": "application/octet-stream"})
        if status != 201:
            raise MirrorError(f"registry {self.url} refused blob {digest} of {repository} (HTTP {status})")
        return digest

    def push(self, path: str, chart: ChartArchive) -> str:
        """Push one chart as `<path>/<name>:<version>`; returns its oci:// reference."""
        repository = f"{path.strip('/')}/{chart.name}" if path.strip("/") else chart.name
        config = json.dumps(chart.metadata, sort_keys=True, default=str).encode()
        manifest = {
            "schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE,
            "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": self.put_blob(repository, config),
                       "size": len(config)},
            "layers": [{"mediaType": CHART_MEDIA_TYPE, "digest": self.put_blob(repository, chart.data),
                        "size": len(chart.data)}],
            "annotations": {"org.opencontainers.image.title": chart.name,
                            "org.opencontainers.image.version": chart.version},
        }
        status, _ = self._call("PUT", f"{self.url}/v2/{repository}/manifests/{chart.tag}",
                               json.dumps(manifest).encode(), {"Content-Type": MANIFEST_MEDIA_TYPE})
        if status != 201:
            raise MirrorError(f"registry {self.url} refused the manifest of {repository}:{chart.tag} (HTTP {status})")
        host = urllib.parse.urlsplit(self.url).netloc
        return f"oci://{host}/{repository}:{chart.tag}"


def main(argv: list[str]) -> int:
    """`python -m triarch.local.mirror <registry URL> <path> <CA file> <archive>...`: push each archive."""
    if len(argv) < 4:
        print("usage: python -m triarch.local.mirror <registry URL> <path> <CA file> <chart archive>...",
              file=sys.stderr)
        return 2
    url, path, ca, *archives = argv
    try:
        registry = Registry(url, Path(ca))
        for archive in archives:
            print(registry.push(path, read_archive(Path(archive))))
    except MirrorError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
