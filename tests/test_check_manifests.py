"""`triarch check --manifests`: the guardrails over Kubernetes YAML that Triarch did not write, with the same rules,
formats and exit codes as a stack check."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import StackPlan
from triarch.cli import main
from triarch.guardrails.manifests import read_manifests, resource_type

PRIVILEGED_GPU = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: llama, namespace: serving}
spec:
  replicas: 1
  selector: {matchLabels: {app: llama}}
  template:
    metadata: {labels: {app: llama}}
    spec:
      containers:
        - name: vllm
          image: vllm/vllm-openai:v0.33.0
          args: ["--model", "meta-llama/Llama-3.1-8B-Instruct"]
          securityContext: {privileged: true}
          resources: {limits: {nvidia.com/gpu: 1}}
"""


def test_types_are_what_the_policy_pack_sees() -> None:
    assert resource_type("v1", "Pod") == "kubernetes:core/v1:Pod"
    assert resource_type("apps/v1", "Deployment") == "kubernetes:apps/v1:Deployment"
    assert resource_type("ray.io/v1", "RayService") == "kubernetes:ray.io/v1:RayService"


def test_triarchs_own_manifests_pass_as_plain_yaml(shipped: dict[str, StackPlan], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    for name, plan in shipped.items():
        directory = tmp_path / name
        directory.mkdir()
        for i, obj in enumerate(plan.objects()):
            (directory / f"{i:03}.yaml").write_text(yaml.safe_dump(obj), encoding="utf-8")
        assert main(["check", "--manifests", str(directory)]) == 0, capsys.readouterr().out
        out = capsys.readouterr().out
        if name in SHIPPED_ADVISORIES:
            assert f"0 mandatory, {len(SHIPPED_ADVISORIES[name])} advisory" in out, out
            assert all(f"[advisory] {rule}:" in out for rule in SHIPPED_ADVISORIES[name]), out
        else:
            assert "no violations" in out, out


SHIPPED_ADVISORIES = {"fresh": ["kv-transfer-over-tcp"]}
"""The advisories a shipped stack draws on purpose: fresh's `split` hands its KV cache over TCP (the local plane has
no EFA), which the data plane runs over NIXL's UCX backend (tests/test_dataplane_ray.py)."""


def test_stdin_multi_document_streams_and_lists(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": [yaml.safe_load(PRIVILEGED_GPU)]}
    stream = PRIVILEGED_GPU + "---\n" + yaml.safe_dump(listed) + "---\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(stream))
    assert main(["check", "--manifests", "-", "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    privileged = [v for v in report["violations"] if v["policy"] == "no-privileged-pods"]
    assert len(privileged) == 2 and {v["enforcementLevel"] for v in privileged} == {"mandatory"}
    assert {v["resource"]["type"] for v in privileged} == {"kubernetes:apps/v1:Deployment"}


@pytest.mark.parametrize(("content", "words"), [
    ("kind: Deployment\nmetadata: {name: x\n", "line"),
    ("metadata: {name: x}\n", "has no apiVersion and kind"),
])
def test_what_is_not_kubernetes_yaml_is_refused_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            content: str, words: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    assert main(["check", "--manifests", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and str(path) in err[0]


def test_a_missing_path_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--manifests", "no/such/dir"]) == 2
    assert "'no/such/dir' does not exist" in capsys.readouterr().err


def test_resources_name_their_file_and_document(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(PRIVILEGED_GPU + "---\n" + PRIVILEGED_GPU.replace("name: llama,", "name: other,"))
    resources: list[Any] = read_manifests([str(path)])
    assert [r.urn for r in resources] == [f"{path}#1:Deployment/llama", f"{path}#2:Deployment/other"]


def test_a_bare_equals_sign_is_a_string_as_kubernetes_reads_it(tmp_path: Path) -> None:
    """The Prometheus Operator's CRDs list `=` among a field's enum values (prometheus-operator-crds 31.0.1, as
    `helm template` writes it); PyYAML's safe loader takes a bare `=` for YAML 1.1's value tag and refuses it."""
    crd = ("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n"
           "  name: probes.monitoring.coreos.com\nspec:\n  versions:\n  - name: v1\n    schema:\n"
           "      openAPIV3Schema:\n        properties:\n          action:\n            enum:\n            - =\n"
           "            - '!='\n")
    path = tmp_path / "crds.yaml"
    path.write_text(crd)
    [resource] = read_manifests([str(path)])
    schema = resource.props["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["properties"]["action"]["enum"] == ["=", "!="]
    assert main(["check", "--manifests", str(path)]) == 0
