"""Scan what the shipped stacks create with checkov: the Kubernetes manifests as written, and the AWS resources
recast as a Terraform plan (checkov reads no Pulumi format). Findings not explained in
bench/checkov-exceptions.yaml (AWS) or by a checkov.io/skip annotation (Kubernetes) fail the scan.

Run: `uv tool install checkov==3.3.30 && uv run python bench/scan.py [--stack prod ...]`. Not part of .ci/run
(checkov is a large install and reaches for its online guidelines).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
STACKS = sorted(p.name.split(".")[1] for p in (ROOT / "stacks").glob("Pulumi.*.yaml"))
EXCEPTIONS = ROOT / "bench" / "checkov-exceptions.yaml"


def terraform_type(pulumi_type: str) -> str:
    """aws:eks/cluster:Cluster -> aws_eks_cluster; the EC2 module's types drop it (aws:ec2/vpc:Vpc -> aws_vpc)."""
    match = re.fullmatch(r"aws:(\w+)/\w+:(\w+)", pulumi_type)
    if match is None:
        raise ValueError(f"not an AWS resource type: {pulumi_type}")
    module, resource = match.groups()
    name = _snake(resource)
    return f"aws_{name}" if module == "ec2" else f"aws_{module}_{name}"


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _values(value: Any) -> Any:
    if isinstance(value, dict):
        return {_snake(k): _values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_values(v) for v in value]
    return value


def terraform_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """The AWS resources of a Triarch plan.json as a Terraform plan (planned_values and resource_changes), inputs
    in snake_case; values known only after apply keep their marker, so a check sees that they are set."""
    resources = []
    for resource in plan["resources"]:
        if not resource["type"].startswith("aws:"):
            continue
        kind, name = terraform_type(resource["type"]), re.sub(r"\W", "_", resource["name"])
        resources.append({"address": f"{kind}.{name}", "mode": "managed", "type": kind, "name": name,
                          "provider_name": "registry.terraform.io/hashicorp/aws",
                          "values": _values(resource["inputs"])})
    changes = [{"address": r["address"], "mode": "managed", "type": r["type"], "name": r["name"],
                "change": {"actions": ["create"], "before": None, "after": r["values"], "after_unknown": {}}}
               for r in resources]
    return {"format_version": "1.2", "terraform_version": "1.9.0",
            "planned_values": {"root_module": {"resources": resources}}, "resource_changes": changes}


def checkov(checkov_bin: str, *args: str) -> list[dict[str, Any]]:
    done = subprocess.run([checkov_bin, "--quiet", "--skip-download", "--output", "json", *args],
                          capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):
        raise SystemExit(f"checkov failed ({done.returncode}): {done.stderr[-2000:]}")
    report = json.loads(done.stdout or "[]")
    reports = report if isinstance(report, list) else [report]
    return [c for r in reports for c in (r.get("results") or {}).get("failed_checks", [])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", action="append", choices=STACKS, help="default: every stack")
    parser.add_argument("--checkov", default="checkov", help="the checkov executable")
    args = parser.parse_args(argv)
    if shutil.which(args.checkov) is None:
        raise SystemExit(f"{args.checkov} not found: uv tool install checkov==3.3.30")
    explained = yaml.safe_load(EXCEPTIONS.read_text(encoding="utf-8"))
    unexplained = 0
    with tempfile.TemporaryDirectory(prefix="triarch-scan-") as tmp:
        for stack in args.stack or STACKS:
            out = Path(tmp) / stack
            subprocess.run([sys.executable, "-m", "triarch.cli", "plan", "--stack", stack, "--out", str(out)],
                           check=True, cwd=ROOT, capture_output=True)
            findings = checkov(args.checkov, "-d", str(out / "manifests"), "--framework", "kubernetes")
            tf_plan = out / "aws.tfplan.json"
            tf_plan.write_text(json.dumps(terraform_plan(json.loads((out / "plan.json").read_text()))))
            aws = checkov(args.checkov, "-f", str(tf_plan), "--framework", "terraform_plan")
            findings += [f for f in aws if f["check_id"] not in explained]
            kept = sorted({f["check_id"] for f in aws if f["check_id"] in explained})
            print(f"{stack}: {len(findings)} unexplained finding(s); explained: {', '.join(kept) or 'none'}")
            for finding in findings:
                print(f"  {finding['check_id']} {finding['resource']}: {finding['check_name']}")
            unexplained += len(findings)
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
