"""`triarch verify`: a live cluster checked against the stack's plan, layer by layer (triarch.verify)."""

from __future__ import annotations

import argparse
import sys

from triarch.cli.common import Commands, stack_source
from triarch.errors import TriarchError


def cmd_verify(args: argparse.Namespace) -> int:
    from triarch.catalog import catalog
    from triarch.planners.nodegroups import plan_pool
    from triarch.report.validation import validate_stack_file
    from triarch.verify.base import report
    from triarch.verify.cluster import Cluster, KubectlFailed, Unreachable
    from triarch.verify.run import verify

    name, path = stack_source(args)
    validated = validate_stack_file(name, path)
    endpoints: dict[str, str] = {}
    for given in args.endpoint or []:
        model, sep, url = given.partition("=")
        if not sep or not url.startswith(("http://", "https://")):
            raise TriarchError(f"--endpoint: {given!r} is not NAME=URL; allowed: e.g. chat=http://127.0.0.1:8000")
        endpoints[model] = url
    stack = validated.stack
    pools = [plan_pool(stack, group, catalog()) for group in stack.node_groups]
    cluster_config = stack.cluster
    own = None if cluster_config.create else cluster_config.context  # an adopted cluster's, in its kubeconfig
    context = args.context or own
    kubeconfig = cluster_config.kubeconfig_path if own is not None and context == own else None
    cluster = Cluster(context, kubeconfig)
    try:
        cluster.reachable()
        findings = verify(cluster, stack, validated.models, pools, catalog(), endpoints)
    except Unreachable as why:
        if args.if_reachable:
            print(f"verify {name}: skipped, no cluster reachable ({why})", file=sys.stderr)
            return 0
        named = (f"context {context!r} (--context)" if args.context else
                 f"context {context!r} (triarch:cluster.context)" if context else "kubectl's current context")
        print(f"error: verify {name}: cannot reach the cluster of {named}: {why}; name a context that reaches it "
              "(--context), or pass --if-reachable to skip a cluster that cannot be reached", file=sys.stderr)
        return 1
    except KubectlFailed as why:
        print(f"verify {name}: the cluster answered but {why}", file=sys.stderr)
        return 1
    print(f"verify {name} against its plan")
    print(report(findings))
    return 1 if any(not f.ok for f in findings) else 0


def add_parser(commands: Commands) -> None:
    verify = commands.add_parser("verify", help="check a live cluster against the stack's plan, layer by layer (GPU "
                                                 "nodes, drivers, add-ons, Ray Serve, each vLLM server)")
    source = verify.add_mutually_exclusive_group(required=True)
    source.add_argument("--stack", help="a stack of this project (stacks/Pulumi.<stack>.yaml)")
    source.add_argument("--stack-file", help="any Pulumi stack file")
    verify.add_argument("--context", help="the kubeconfig context (default: an adopted cluster's "
                                          "triarch:cluster.context, else kubectl's current one)")
    verify.add_argument("--if-reachable", action="store_true",
                        help="skip (exit 0) when no cluster answers, instead of failing")
    verify.add_argument("--endpoint", action="append", metavar="NAME=URL",
                        help="reach model NAME at URL instead of through kubectl port-forward; repeatable")
    verify.set_defaults(handler=cmd_verify)
