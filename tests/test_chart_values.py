"""Every Helm release's values as Helm renders them: our overrides coalesced onto the pinned chart's defaults
(the reference data, tools/reference/sources.yaml), then held to the security defaults. The overrides alone say
nothing: Helm merges maps key by key, so a `drop` beside the chart's `add: [SYS_ADMIN]` keeps the add."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import STACK_NAMES, StackPlan, reference_file
from triarch import refdata
from triarch.helm_values import coalesce, privilege_findings

CHART_DEFAULTS = {
    ("dcgm-exporter", "4.8.2"): "dcgm-exporter-4.8.2/values.yaml",
    ("nvidia-device-plugin", "0.20.0"): "nvidia-device-plugin-v0.20.0/values.yaml",
    ("kuberay-operator", "1.7.0"): "kuberay-v1.7.0/values.yaml",
    ("karpenter", "1.14.1"): "karpenter-v1.14.1/values.yaml",
    ("keda", "2.20.2"): "keda-2.20.2/values.yaml",
    ("lws", "v0.10.0"): "lws-v0.10.0/values.yaml",
    ("aws-efa-k8s-device-plugin", "v0.5.30"): "aws-efa-k8s-device-plugin-v0.5.30/values.yaml",
    ("kube-prometheus-stack", "88.5.3"): "prometheus-operator-v0.93.1/kube-prometheus-stack-88.5.3-values.yaml",
    ("llm-d-router-standalone", "v0.10.0"): "charts/llm-d-router-standalone-v0.10.0.tgz",
}
"""The chart's own values.yaml for each chart (by name, wherever it is pulled from: its repository, an OCI
registry, a stack's mirror) and version Triarch pins (CRD-only charts have no pods)."""
PRIVILEGED_AS_SHIPPED = {
    "nvidia-device-plugin": "GPU feature discovery runs privileged as the chart ships it (its namespace's "
                            "pod-security reason says so)",
    "aws-efa-k8s-device-plugin": "the EFA device plugin runs privileged as the chart ships it since v0.5.16, for "
                                 "topology-aligned allocation (its namespace's pod-security reason says so)",
}
"""Releases whose coalesced values keep a privilege on purpose, with the reason their namespace carries."""


def test_coalescing_follows_helms_rules() -> None:
    chart = {"securityContext": {"runAsUser": 0, "capabilities": {"add": ["SYS_ADMIN"], "drop": ["ALL"]}},
             "args": ["-f", "default.csv"], "service": {"port": 9400, "type": "ClusterIP"}}
    ours = {"securityContext": {"runAsUser": 1000, "capabilities": {"drop": ["ALL"]}}, "args": ["-x"],
            "service": {"type": None}}
    assert coalesce(chart, ours) == {
        "securityContext": {"runAsUser": 1000, "capabilities": {"add": ["SYS_ADMIN"], "drop": ["ALL"]}},  # maps merge
        "args": ["-x"],  # lists replace
        "service": {"port": 9400},  # null deletes
    }
    assert chart["securityContext"]["runAsUser"] == 0  # the defaults are not touched
    assert coalesce(chart, {"securityContext": {"capabilities": {"add": []}}})["securityContext"]["capabilities"] == {
        "add": [], "drop": ["ALL"]}


def test_privileges_are_found_wherever_a_chart_nests_them() -> None:
    values = {"a": {"securityContext": {"privileged": True}},
              "b": [{"containerSecurityContext": {"capabilities": {"add": ["CAP_SYS_ADMIN", "NET_BIND_SERVICE"]}}}],
              "c": {"securityContext": {"allowPrivilegeEscalation": True, "capabilities": {"add": []}}}}
    assert privilege_findings(values, frozenset({"NET_BIND_SERVICE"})) == [
        "a.securityContext.privileged: true", "b[0].containerSecurityContext.capabilities.add: ['SYS_ADMIN']",
        "c.securityContext.allowPrivilegeEscalation: true"]


def _defaults(chart: str, version: str) -> dict[str, Any]:
    relative = CHART_DEFAULTS.get((chart.rsplit("/", 1)[-1], version))
    assert relative is not None, f"no reference values named for chart {chart} {version}: add it to CHART_DEFAULTS"
    if relative.endswith(".tgz"):
        return _archive_defaults(reference_file(relative))
    loaded: dict[str, Any] = yaml.safe_load(reference_file(relative).read_text(encoding="utf-8"))
    return loaded


def _archive_defaults(archive: Path) -> dict[str, Any]:
    """A packaged chart's values as Helm coalesces them: its own values.yaml over each subchart's, under the
    subchart's alias (Chart.yaml's dependencies)."""
    with tarfile.open(archive, "r:gz") as packed:
        def read(member: str) -> dict[str, Any]:
            handle = packed.extractfile(member)
            assert handle is not None, member
            loaded: dict[str, Any] = yaml.safe_load(handle.read()) or {}
            return loaded
        top = archive.name.rsplit("-v", 1)[0]
        values = read(f"{top}/values.yaml")
        for dependency in read(f"{top}/Chart.yaml").get("dependencies") or []:
            alias = dependency.get("alias") or dependency["name"]
            values[alias] = coalesce(read(f"{top}/charts/{dependency['name']}/values.yaml"), values.get(alias) or {})
        return values


def _releases(plan: StackPlan) -> list[tuple[str, dict[str, Any]]]:
    crds_only = ("karpenter-crd", "prometheus-operator-crds")
    return [(r.name, r.inputs) for r in plan.of_type("kubernetes:helm.sh/v3:Release")
            if str(r.inputs.get("chart")).rsplit("/", 1)[-1] not in crds_only]


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_every_release_renders_without_privileges_it_does_not_explain(shipped: dict[str, StackPlan],
                                                                      stack: str) -> None:
    for name, props in _releases(shipped[stack]):
        values = coalesce(_defaults(str(props["chart"]), str(props["version"])), dict(props.get("values") or {}))
        found = privilege_findings(values, frozenset({"NET_BIND_SERVICE"}))
        if name in PRIVILEGED_AS_SHIPPED:
            continue
        assert found == [], f"{stack}: release {name}"


def test_the_dcgm_exporter_renders_as_root_without_capabilities(shipped: dict[str, StackPlan]) -> None:
    """Root (the pod-resources socket is root's: a non-root exporter labels no GPU with its pod), nothing added,
    nothing escalated; the chart's SYS_ADMIN gone after coalescing, not only absent from our values."""
    [props] = [p for n, p in _releases(shipped["prod"]) if n == "dcgm-exporter"]
    defaults = _defaults("dcgm-exporter", "4.8.2")
    assert defaults["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN"]  # what the chart ships
    values = coalesce(defaults, dict(props["values"]))
    context = values["securityContext"]
    assert context["runAsUser"] == 0 and context["runAsNonRoot"] is False
    assert context["capabilities"] == {"add": [], "drop": ["ALL"]}
    assert context["allowPrivilegeEscalation"] is False
    assert values["serviceMonitor"]["honorLabels"] is False  # the exporter's pod label arrives as exported_pod
    assert values["kubernetes"]["enablePodLabels"] is False and values["arguments"] == [
        "-f", "/etc/dcgm-exporter/default-counters.csv"]  # the counters the alerts read


@pytest.mark.parametrize(("stack", "expected"), [("prod", ["nvidia-device-plugin"]),
                                               ("large", ["aws-efa-k8s-device-plugin", "nvidia-device-plugin"])])
def test_the_privileged_releases_say_why_on_their_namespace(shipped: dict[str, StackPlan], stack: str,
                                                            expected: list[str]) -> None:
    namespaces = {o["metadata"]["name"]: o for o in shipped[stack].objects("Namespace")}
    privileged = {}
    for name, props in _releases(shipped[stack]):
        values = coalesce(_defaults(str(props["chart"]), str(props["version"])), dict(props.get("values") or {}))
        if privilege_findings(values, frozenset({"NET_BIND_SERVICE"})):
            privileged[name] = props
    assert sorted(privileged) == expected and set(expected) <= set(PRIVILEGED_AS_SHIPPED)
    for props in privileged.values():
        namespace = namespaces[str(props["namespace"])]
        assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
        assert namespace["metadata"]["annotations"]["triarch.dev/pod-security-reason"]


def test_reference_paths_are_pinned_reference_files() -> None:
    assert [p for p in CHART_DEFAULTS.values() if p not in refdata.load_sources()] == []


CHARTS = yaml.safe_load((Path(__file__).resolve().parents[1] / "templates" / "compat" / "charts.yaml")
                        .read_text(encoding="utf-8"))["charts"]


STAMPED_ON_RELEASE = {"karpenter": "its release script stamps the version and digest into the published chart; the "
                                   "values.yaml of the git tag still names the previous release (charts.yaml)",
                      "lws": "its release script (hack/push-chart.sh) stamps the release tag over the git tag's `main` "
                             "(and Triarch sets the tag in its values: lws_values)"}


def _at(values: dict[str, Any], dotted: str) -> Any:
    for key in dotted.split("."):
        assert isinstance(values, dict) and key in values, dotted
        values = values[key]
    return values


@pytest.mark.parametrize("name", sorted(n for n, c in CHARTS.items() if c.get("images")))
def test_each_chart_image_is_where_its_values_say(name: str) -> None:
    """The values keys that move a chart's image to a mirror exist in the pinned chart's values.yaml, and name the
    image charts.yaml lists (its tag, or "" where the chart runs its appVersion)."""
    chart = CHARTS[name]
    defaults = _defaults(name, chart["version"])
    if chart.get("registryKey"):
        assert _at(defaults, chart["registryKey"]) == ""
    for key, image in chart["images"].items():
        if "subchart" in image:
            continue  # keys of a subchart's own values.yaml (not in the reference data); the source line says where
        if "reference" in image:  # one key takes the whole reference; where the chart keeps its default
            assert _at(defaults, image["default"]) == image["image"], key
            assert isinstance(_at(defaults, image["reference"].rsplit(".", 1)[0]), dict), key  # its map exists
            continue
        upstream, _, tag = image["image"].rpartition(":")
        repository = _at(defaults, image["repository"])
        if "registry" in image:
            repository = f"{_at(defaults, image['registry'])}/{repository}"
        assert repository == upstream, key
        if name not in STAMPED_ON_RELEASE:
            assert _at(defaults, image["tag"]) in (tag, ""), key
        if "digest" in image:
            assert str(_at(defaults, image["digest"])).startswith("sha256:"), key
