"""`triarch preflight`: before `pulumi up`, with the deploying credentials, what the account must have for the
stack (read-only); or, with --policy, the IAM policy Triarch ships for that principal."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from triarch.cli.common import Commands, stack_source


def cmd_preflight(args: argparse.Namespace) -> int:
    from triarch.preflight.permissions import deploy_permissions, policy_text

    if args.policy:
        text = policy_text(deploy_permissions())
        if args.policy == "-":
            sys.stdout.write(text)
        else:
            Path(args.policy).write_text(text, encoding="utf-8")
            print(f"wrote {args.policy}")
        return 0
    import yaml

    from triarch.catalog import catalog
    from triarch.config import from_pulumi_config
    from triarch.datafiles import read_yaml
    from triarch.offline import read_stack_config
    from triarch.paths import PROJECT_ROOT
    from triarch.preflight.aws import boto3_clients, checkip, run_preflight
    from triarch.preflight.plan import backend_url, exit_code, plan_preflight, preflight_facts

    name, path = stack_source(args)
    config, _ = read_stack_config(path)
    stack = from_pulumi_config(config)
    document = yaml.safe_load(path.read_text(encoding="utf-8"))  # read_stack_config parsed it already
    provider = document.get("secretsprovider") if isinstance(document, dict) else None
    project = PROJECT_ROOT / "Pulumi.yaml"
    facts = preflight_facts()
    plan = plan_preflight(name, stack, catalog(), facts, deploy_permissions().deploy_actions(),
                          str(provider) if provider else None,
                          backend_url(dict(os.environ), read_yaml(project) if project.is_file() else None))
    findings = run_preflight(plan, boto3_clients, checkip(facts.egress_url))
    for finding in findings:
        print(finding.line())
    code = exit_code(findings)
    blockers = sum(f.severity == "blocker" for f in findings)
    print(f"\nstack {name}: " + (f"{blockers} blocker(s): fix them before `pulumi up`" if code else
                                  "no blocker found"))
    return code


def add_parser(commands: Commands) -> None:
    preflight = commands.add_parser("preflight", help="check, read-only and with the deploying credentials, what "
                                                      "`pulumi up` of a stack needs of the AWS account: quotas, "
                                                      "instance types per zone, AMI releases, permissions, the "
                                                      "endpoint's ranges, the state backend; exit 1 on a blocker")
    source = preflight.add_mutually_exclusive_group(required=True)
    source.add_argument("--stack", help="a stack of this project (stacks/Pulumi.<stack>.yaml)")
    source.add_argument("--stack-file", help="any Pulumi stack file")
    source.add_argument("--policy", metavar="FILE",
                        help="write the IAM policy of the deploying principal (every action `pulumi up` and "
                             "preflight call, from templates/compat/deploy-permissions.yaml) to FILE, or - for "
                             "standard output, and exit (docs/iam-policy.json is this)")
    preflight.set_defaults(handler=cmd_preflight)
