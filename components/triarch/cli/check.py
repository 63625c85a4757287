"""`triarch check`: the triarch-guardrails policies evaluated on a stack's plan (planned here, or given), or on any
Kubernetes YAML."""

from __future__ import annotations

import argparse
from pathlib import Path

from triarch.cli.common import Commands, add_stack_source, progress, stack_source


def cmd_check(args: argparse.Namespace) -> int:
    import tempfile

    from triarch.diff import load_plan
    from triarch.guardrails.check import (
        evaluate,
        load_policy_config,
        report_json,
        report_markdown,
        report_text,
        resources_of_plan,
    )
    from triarch.guardrails.placement import headroom, prove
    from triarch.report.planning import plan_stack
    from triarch.report.validation import validate_stack_file

    policy_config = load_policy_config(Path(args.policy_config) if args.policy_config else None)
    if args.manifests:
        from triarch.guardrails.manifests import read_manifests

        resources = read_manifests(args.manifests)
        findings = evaluate(resources, policy_config)
        name = "manifests"
        if args.format == "json":
            print(report_json(findings, name))
        elif args.format == "markdown":
            print(report_markdown(findings, name))
        else:
            print(report_text(findings))
        return 1 if any(f.enforcement == "mandatory" for f in findings) else 0
    if args.plan:
        document = load_plan(Path(args.plan), option="--plan")
        name = str(document.get("stack") or Path(args.plan).name)
    else:
        name, path = stack_source(args)
        validated = validate_stack_file(name, path)
        with progress(f"checking stack {name} against triarch-guardrails"), \
                tempfile.TemporaryDirectory() as scratch:
            out = Path(args.out) if args.out else Path(scratch)
            plan_stack(validated, out)
            document = load_plan(out)
    resources = resources_of_plan(document)
    findings = evaluate(resources, policy_config)
    placement = headroom(prove(resources))
    if args.format == "json":
        print(report_json(findings, name, placement))
    elif args.format == "markdown":
        print(report_markdown(findings, name, placement))
    else:
        print(report_text(findings, placement))
    return 1 if any(f.enforcement == "mandatory" for f in findings) else 0


def add_parser(commands: Commands) -> None:
    check = commands.add_parser("check", help="plan a stack offline and evaluate the triarch-guardrails policies, "
                                              "or evaluate them on any Kubernetes YAML (--manifests)")
    add_stack_source(check, plan=True, manifests=True)
    check.add_argument("--policy-config", help="policy pack config JSON (as for pulumi --policy-pack-config)")
    check.add_argument("--format", choices=["text", "json", "markdown"], default="text",
                       help="text for a terminal (default), json for tools, markdown for a comment")
    check.add_argument("--out", help="also write the plan here (default: a temporary directory)")
    check.set_defaults(handler=cmd_check)
