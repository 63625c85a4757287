"""A team's own registry for everything Triarch pulls: charts from an OCI mirror, images from a mirror prefix (or one
per upstream registry), chart images pinned by digest, and the list of what to mirror, written beside plan.json
(mirror.json) so a mirroring job can run from it. Pure: the stack and the pinned charts in, charts and values out."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triarch.catalog import Chart, ChartImage, catalog, charts
from triarch.config import StackConfig
from triarch.errors import ConfigError
from triarch.images import mirror, parse, parse_prefix
from triarch.matrix import deployed_images, images_by_engine
from triarch.planners.efa import EFA_CHART, efa_repository
from triarch.planners.pods import PULL_SECRET

MIRROR_FILE = "mirror.json"
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
SERVING_KEYS = {"vllm": "vllm", "ray-serve": "rayLlm"}
UNLISTED = {"kube-prometheus-stack": "images its values leave off (Grafana's init-chown busybox with persistence, "
                                     "its dashboard download curl, Thanos, the Windows exporter): `helm template` "
                                     "lists them if a stack turns one on"}


def _put(values: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        values = values.setdefault(key, {})
    values[leaf] = value


def chart_source(chart: Chart, stack: StackConfig) -> Chart:
    """The chart from the stack's OCI mirror: one prefix (`<prefix>/<chart>`) or the chart's own reference."""
    given = stack.registry.charts
    if not given:
        return chart
    reference = given.get(chart.name) if isinstance(given, Mapping) else f"{given.rstrip('/')}/{chart.name}"
    if reference is None:
        return chart
    repository, _, name = reference.rpartition("/")
    return dataclasses.replace(chart, repository=repository, name=name)


def image_values(chart: Chart, stack: StackConfig, with_pull_secret: bool = False) -> dict[str, Any]:
    """Values that move the chart's images to the mirror or to the stack's pins, and give its pods the registry's
    pull Secret (empty when none applies, so a stack without them plans as before)."""
    prefixes = stack.registry.images
    values: dict[str, Any] = {}
    if with_pull_secret and chart.pull_secrets_key:
        _put(values, chart.pull_secrets_key, [{"name": PULL_SECRET}])
    whole_chart = chart.registry_key is not None and isinstance(prefixes, str)
    if whole_chart and chart.registry_key:
        _put(values, chart.registry_key, prefixes)
    for image in chart.images:
        pin = stack.images.charts.get(image.key)
        if pin is None and (whole_chart or mirror(image.image, prefixes) == image.image):
            continue
        _put_image(values, image, mirror(pin.image if pin else image.image, prefixes))
    return values


def _put_image(values: dict[str, Any], image: ChartImage, target: str) -> None:
    """One image into the chart's layout: registry and repository apart or together; the digest in its own key,
    or after the tag (`v1.7.0@sha256:...`, which the charts concatenate into a valid reference)."""
    reference = parse(target)
    tag = reference.tag or image.image.rsplit(":", 1)[1]
    keys = image.values
    if "reference" in keys:
        _put(values, keys["reference"], target)
        return
    if "registry" in keys:
        _put(values, keys["registry"], reference.host)
        _put(values, keys["repository"], reference.repository)
    else:
        _put(values, keys["repository"], f"{reference.registry}/{reference.repository}" if reference.registry
             else reference.repository)
    if "digest" in keys:
        _put(values, keys["tag"], tag)
        if reference.digest:
            _put(values, keys["digest"], reference.digest)
    else:
        _put(values, keys["tag"], tag + (f"@{reference.digest}" if reference.digest else ""))


ECR_HOST = re.compile(r"^(?P<account>[0-9]{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com$")
PULL_THROUGH_ACTIONS = ("ecr:BatchImportUpstreamImage", "ecr:CreateRepository")
"""What a pull through an ECR pull-through cache needs beyond a pull (which AmazonEC2ContainerRegistryPullOnly,
on every node role, grants): import the upstream image, and create its repository on the first pull (AWS ECR User
Guide, "IAM permissions required to sync an upstream registry with an Amazon ECR private registry")."""


def ecr_repositories(stack: StackConfig) -> list[str]:
    """The ECR repositories the stack's nodes pull through: every path below an ECR mirror prefix, and each image
    pinned in an ECR repository, as repository ARNs."""
    found: set[str] = set()
    prefixes = stack.registry.images
    for prefix in (prefixes.values() if isinstance(prefixes, Mapping) else [prefixes] if prefixes else []):
        host, path = parse_prefix(prefix)
        if match := ECR_HOST.match(host):
            found.add(f"arn:aws:ecr:{match['region']}:{match['account']}:repository/{path + '/' if path else ''}*")
    pins = [stack.images.vllm, stack.images.ray_llm, *stack.images.charts.values()]
    for pin in pins:
        reference = parse(pin.image)
        if reference.registry and (match := ECR_HOST.match(reference.registry)):
            found.add(f"arn:aws:ecr:{match['region']}:{match['account']}:repository/{reference.repository}")
    return sorted(found)


def pull_through_policy(stack: StackConfig) -> str | None:
    """The node roles' policy for pulls through an ECR pull-through cache, scoped to the stack's ECR mirror
    repositories (None: no ECR mirror)."""
    repositories = ecr_repositories(stack)
    if not repositories:
        return None
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Sid": "PullThroughCache", "Effect": "Allow", "Action": list(PULL_THROUGH_ACTIONS),
         "Resource": repositories}]}, sort_keys=True)


def stack_charts(stack: StackConfig, with_pull_secret: bool = False) -> dict[str, Chart]:
    """The pinned charts as this stack installs them: from its mirror, with its image values."""
    return {name: dataclasses.replace(chart_source(chart, stack),
                                      image_values=image_values(chart, stack, with_pull_secret))
            for name, chart in charts().items()}


@dataclass(frozen=True)
class CrdSource:
    file: str
    url: str
    """Where `pulumi up` reads it: the release's published file, or the stack's mirror of it (a URL or a path)."""
    upstream: str
    sha256: str


def crd_sources(name: str, stack: StackConfig) -> list[CrdSource]:
    """The CRD files Triarch manages apart from the chart `name` (its key in charts.yaml), from the stack's mirror
    (`<crds>/<chart>/<version>/<file>`) or the release's published URL."""
    chart = charts()[name]
    if chart.crds_url is None:
        return []
    mirror_at = stack.registry.crds
    return [CrdSource(file, f"{mirror_at.rstrip('/')}/{name}/{chart.version}/{file}" if mirror_at
                      else f"{chart.crds_url}/{file}", f"{chart.crds_url}/{file}", digest)
            for file, digest in chart.crds]


def verify_crds(sources: list[CrdSource], read: Callable[[str], bytes] | None = None) -> None:
    """Each CRD file is the one the release published (its sha256), before `pulumi up` applies it; raises
    ConfigError naming the file, the mirror's URL and both digests."""
    for source in sources:
        try:
            data = (read or _read_source)(source.url)
        except OSError as error:
            raise ConfigError("triarch:registry.crds", source.url, f"cannot be read ({error.__class__.__name__}: "
                              f"{error})", f"a reachable copy of {source.upstream}") from None
        found = hashlib.sha256(data).hexdigest()
        if found != source.sha256:
            raise ConfigError("triarch:registry.crds", source.url, f"has sha256 {found}, not the release's "
                              f"{source.sha256}", f"an unmodified copy of {source.upstream}")


def _read_source(url: str) -> bytes:
    if url.startswith(("https://", "http://")):
        with urllib.request.urlopen(url, timeout=60) as response:
            data: bytes = response.read()
            return data
    return Path(url.removeprefix("file://")).read_bytes()


def docker_config(host: str, username: str, password: str) -> str:
    """The .dockerconfigjson of an image pull Secret: one registry's credentials, as `kubectl create secret
    docker-registry` writes them."""
    auth = base64.b64encode(f"{username}:{password}".encode()).decode()
    return json.dumps({"auths": {host: {"username": username, "password": password, "auth": auth}}}, sort_keys=True)


def mirror_list(document: Mapping[str, Any], stack: StackConfig) -> dict[str, Any]:
    """mirror.json: every chart the plan installs (version, where Helm pulls it, where it comes from upstream) and
    every image it runs (the upstream reference, its tag and pinned digest, what the nodes pull)."""
    pinned = charts()
    installed = stack_charts(stack)
    releases = sorted({(str(r["inputs"].get("chart")), str(r["inputs"].get("version")))
                       for r in document["resources"] if r["type"] == HELM_RELEASE})
    found_charts, found_images, found_crds, unlisted = [], [], [], []
    by_reference = {c.reference: name for name, c in installed.items()}
    for reference, version in releases:
        name = by_reference.get(reference, reference.rsplit("/", 1)[-1])
        upstream, chart = pinned[name], installed[name]
        found_charts.append({"name": name, "version": version,
                             "upstream": f"{upstream.repository.rstrip('/')}/{upstream.name}",
                             "pulledFrom": f"{chart.repository.rstrip('/')}/{chart.name}"})
        for image in upstream.images:
            pin = stack.images.charts.get(image.key)
            runs = _in_region(image.image, stack) if name == EFA_CHART else image.image
            pulled = mirror(pin.image if pin else runs, stack.registry.images)
            found_images.append(_image_row(image.key, runs, pulled, name))
        if name in UNLISTED:
            unlisted.append(f"{name} {version}: {UNLISTED[name]}")
        found_crds += [{"chart": name, "file": c.file, "upstream": c.upstream, "sha256": c.sha256,
                        "pulledFrom": c.url} for c in crd_sources(name, stack)]
    releases_run = images_by_engine(stack, catalog())
    pulled_by = deployed_images(stack)
    for engine in sorted({m.engine for m in stack.models}):
        found_images.append(_image_row(SERVING_KEYS[engine], releases_run[engine], pulled_by[engine], None))
    return {"stack": document.get("stack"), "charts": sorted(found_charts, key=lambda c: c["name"]),
            "images": sorted(found_images, key=lambda i: (i["chart"] or "", i["key"])), "crds": found_crds,
            "notListed": unlisted}


def _in_region(image: str, stack: StackConfig) -> str:
    """The EFA device plugin's image as Triarch's values set it: the copy in the stack's region, not the chart's
    default (us-west-2)."""
    return f"{efa_repository(stack)}:{parse(image).tag}"


def _image_row(key: str, upstream: str, pulled: str, chart: str | None) -> dict[str, Any]:
    reference = parse(pulled)
    name = upstream.split("@", 1)[0]
    return {"key": key, "chart": chart, "upstream": name, "tag": parse(upstream).tag, "digest": reference.digest,
            "pulled": pulled}


__all__ = ["MIRROR_FILE", "chart_source", "image_values", "mirror_list", "parse_prefix", "stack_charts"]
