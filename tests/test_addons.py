"""EKS add-on pins: well-formed data with a source each, and the created clusters install exactly those versions."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from triarch.offline import read_stack_config, run_program

ROOT = Path(__file__).resolve().parents[1]
DATA = yaml.safe_load((ROOT / "templates" / "compat" / "eks-addons.yaml").read_text(encoding="utf-8"))
VERSION = re.compile(r"^v\d+\.\d+\.\d+-eksbuild\.\d+$")


def pins() -> list[tuple[str, str, dict[str, Any]]]:
    return [(minor, addon, entry) for minor, addons in DATA["addons"].items() for addon, entry in addons.items()]


@pytest.mark.parametrize(("minor", "addon", "entry"), pins())
def test_every_pin_is_an_eks_build_with_a_source(minor: str, addon: str, entry: dict[str, Any]) -> None:
    assert VERSION.match(entry["version"]), entry["version"]
    assert entry["source"].strip()
    if addon == "kube-proxy":  # kube-proxy follows the cluster's Kubernetes minor
        assert entry["version"].startswith(f"v{minor}."), entry["version"]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_created_clusters_install_the_pinned_versions(stack: str) -> None:
    config, secrets = read_stack_config(ROOT / "stacks" / f"Pulumi.{stack}.yaml")
    minor = yaml.safe_load(config["triarch:cluster"])["kubernetesVersion"]
    run = run_program(stack, config, secrets)
    installed = {r.inputs["addonName"]: r.inputs.get("addonVersion") for r in run.resources
                 if r.type == "aws:eks/addon:Addon"}
    expected = {addon: entry["version"] for addon, entry in DATA["addons"][minor].items()}
    # An add-on the data file records as having no citable pin for this minor (`unverified`) installs EKS's
    # default, and the plan says so; every other add-on installed is pinned.
    unpinned = sorted(a for a in (DATA.get("unverified") or {}).get(minor, {}) if a in installed and a not in expected)
    assert installed == {**expected, **dict.fromkeys(unpinned)}
    assert [w for w in run.warnings if "add-on" in w] == [
        f"EKS add-on {a} has no pinned version for Kubernetes {minor} in templates/compat/eks-addons.yaml; EKS "
        "installs its default" for a in unpinned]
