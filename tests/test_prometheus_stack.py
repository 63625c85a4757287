"""What Triarch's own Prometheus keeps and who may log in to its Grafana: data on a claim that outlives the pod (EBS
gp3 on a created cluster: Prometheus' docs refuse NFS, EFS included), and an admin password that is a Pulumi secret,
given or generated, never the chart's default."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import MutatedConfig, StackPlan, plan_config, reference_file, stack_document
from test_security import refusal
from triarch.config import from_pulumi_config
from triarch.helm_values import coalesce

PASSWORD = "correct-horse-battery-staple-9f2c"


def release(plan: StackPlan, name: str) -> Any:
    [found] = [r for r in plan.of_type("kubernetes:helm.sh/v3:Release") if r.name == name]
    return found


def test_prometheus_keeps_its_data_on_an_encrypted_gp3_claim(shipped: dict[str, StackPlan]) -> None:
    plan = shipped["prod"]
    spec = release(plan, "kube-prometheus-stack").inputs["values"]["prometheus"]["prometheusSpec"]
    claim = spec["storageSpec"]["volumeClaimTemplate"]["spec"]
    assert claim == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "50Gi"}},
                     "storageClassName": "triarch-gp3"}
    assert spec["retention"] == "15d" and spec["retentionSize"] == "42GB"  # 85% of 50 GiB, in Prometheus' GB
    [gp3] = [c for c in plan.objects("StorageClass") if c["metadata"]["name"] == "triarch-gp3"]
    assert gp3["provisioner"] == "ebs.csi.aws.com" and gp3["parameters"] == {"type": "gp3", "encrypted": "true"}
    assert gp3["volumeBindingMode"] == "WaitForFirstConsumer" and gp3["allowVolumeExpansion"] is True
    [addon] = [r for r in plan.of_type("aws:eks/addon:Addon") if r.inputs["addonName"] == "aws-ebs-csi-driver"]
    assert addon.inputs["addonVersion"] == "v1.63.1-eksbuild.1"  # the pin for 1.35 (eks-addons.yaml)
    assert [a["serviceAccount"] for a in addon.inputs["podIdentityAssociations"]] == ["ebs-csi-controller-sa"]
    [attached] = [r for r in plan.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                  if r.name.endswith("-ebs-csi")]
    assert attached.inputs["policyArn"] == "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"
    # the release waits for the class and its driver (its claim would wait for a class that does not exist yet)
    waits = plan.dependencies[release(plan, "kube-prometheus-stack").urn]
    names = {urn.rsplit("::", 1)[1] for urn in waits}
    assert names >= {"storageclass-triarch-gp3", "llm-prod-block-ebs-csi-driver"}, waits


def test_size_and_retention_are_the_stacks_and_a_bad_one_is_refused(mutated_config: MutatedConfig, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from triarch.planners.monitoring import prometheus_values

    def bigger(config: dict[str, Any]) -> None:
        config.setdefault("triarch:observability", {}).update({"storageGib": 200, "retention": "30d"})

    stack = from_pulumi_config(mutated_config("prod", bigger))
    spec = prometheus_values(stack)["prometheus"]["prometheusSpec"]
    assert spec["storageSpec"]["volumeClaimTemplate"]["spec"]["resources"]["requests"]["storage"] == "200Gi"
    assert (spec["retention"], spec["retentionSize"]) == ("30d", "170GB")
    config = stack_document("prod")
    config.setdefault("triarch:observability", {})["retention"] = "15 days"
    line = refusal(tmp_path, config, capsys)
    assert line.startswith("triarch:observability.retention: '15 days'"), line


def test_an_adopted_cluster_keeps_prometheus_on_its_default_class(mutated_config: MutatedConfig) -> None:
    from triarch.planners.monitoring import prometheus_values

    stack = from_pulumi_config(mutated_config("local", lambda c: c.update(
        {"triarch:observability": {"prometheus": "install"}})))
    claim = prometheus_values(stack)["prometheus"]["prometheusSpec"]["storageSpec"]["volumeClaimTemplate"]["spec"]
    assert "storageClassName" not in claim and claim["resources"]["requests"]["storage"] == "50Gi"


def test_grafanas_admin_password_is_generated_once_and_kept_secret(shipped: dict[str, StackPlan]) -> None:
    plan = shipped["prod"]
    values = release(plan, "kube-prometheus-stack").inputs["values"]
    assert values["grafana"]["admin"] == {"existingSecret": "grafana-admin", "userKey": "admin-user",
                                          "passwordKey": "admin-password"}
    [secret] = [r for r in plan.of_type("kubernetes:core/v1:Secret") if r.inputs["metadata"]["name"] == "grafana-admin"]
    assert secret.inputs["metadata"]["namespace"] == "monitoring"
    assert secret.inputs["stringData"] == {"admin-user": "[secret]", "admin-password": "[secret]"}
    [generated] = plan.of_type("random:index/randomPassword:RandomPassword")
    assert generated.inputs["length"] >= 32 and generated.inputs["special"] is False
    assert generated.urn in plan.dependencies[secret.urn]
    # As Helm renders it: the chart's own default user/password path gives way to the secret.
    path = reference_file("prometheus-operator-v0.93.1", "kube-prometheus-stack-88.5.3-values.yaml")
    merged = coalesce(yaml.safe_load(path.read_text(encoding="utf-8")), values)
    assert merged["grafana"]["admin"]["existingSecret"] == "grafana-admin"
    assert merged["grafana"].get("adminPassword") is None


def test_a_given_password_is_used_and_never_shown(tmp_path: Path) -> None:
    config = stack_document("prod")
    config["triarch:grafanaAdminPassword"] = {"secure": "AAABA" + PASSWORD}
    plan = plan_config("prod", config, tmp_path)
    assert plan.of_type("random:index/randomPassword:RandomPassword") == []
    [secret] = [r for r in plan.of_type("kubernetes:core/v1:Secret") if r.inputs["metadata"]["name"] == "grafana-admin"]
    assert secret.inputs["stringData"] == {"admin-user": "[secret]", "admin-password": "[secret]"}
    assert PASSWORD not in json.dumps([r.inputs for r in plan.resources])
    assert plan.objects("Secret") and not [s for s in plan.objects("Secret") if s["metadata"]["namespace"] == "llm"]


def test_a_password_in_plain_text_or_without_a_grafana_is_refused(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    config = stack_document("prod")
    config["triarch:grafanaAdminPassword"] = PASSWORD
    line = refusal(tmp_path, config, capsys)
    assert "pulumi config set --secret triarch:grafanaAdminPassword" in line and PASSWORD not in line
    config = stack_document("prod")
    config["triarch:observability"] = {**config.get("triarch:observability", {}), "prometheus": "existing"}
    config["triarch:grafanaAdminPassword"] = {"secure": "AAABA" + PASSWORD}
    (tmp_path / "second").mkdir()
    line = refusal(tmp_path / "second", config, capsys)
    assert line.startswith("triarch:grafanaAdminPassword: is set, but Triarch installs no Grafana here "
                           "(observability.prometheus is 'existing')"), line
    assert PASSWORD not in line
