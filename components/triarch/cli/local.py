"""`triarch local`: the real engines built from Go modules, and a local control plane for a stack started on them,
entered and stopped (triarch.local)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from triarch.cli.common import Commands, stack_source
from triarch.errors import TriarchError


def cmd_local_build(args: argparse.Namespace) -> int:
    """The Go engines and the data plane's CPU environments: all of them, or those named."""
    import json

    from triarch.local import dataplane
    from triarch.local.engines import build_all, describe, load_engines

    if args.list:
        print(json.dumps({**describe(), **dataplane.describe()}, indent=2))
        return 0
    engines, environments = load_engines(), dataplane.load_environments()
    unknown = sorted(set(args.engines) - set(engines) - set(environments))
    if unknown:
        raise TriarchError(f"unknown engine {', '.join(unknown)}; allowed: {', '.join([*engines, *environments])}")
    if args.go_only and args.engines:
        raise TriarchError("--go-only builds every Go engine; name engines or give --go-only, not both")
    go = [n for n in args.engines if n in engines]
    python = [n for n in args.engines if n in environments]
    if go or not args.engines:
        build_all(go or None, force=args.force)
    if python or not (args.engines or args.go_only):
        dataplane.build_all(python or None, force=args.force)
    return 0


def cmd_local_up(args: argparse.Namespace) -> int:
    from triarch.local.lifecycle import up
    from triarch.local.plane import default_name
    from triarch.local.stack import spec_for_stack
    from triarch.report.validation import validate_stack_file

    for option, given in (("--crds", args.crds), ("--charts", args.charts)):
        missing = [d for d in given or [] if not Path(d).is_dir()]
        if missing:
            raise TriarchError(f"{option} {missing[0]}: no such directory")
    name, path = stack_source(args)
    validated = validate_stack_file(name, path)
    spec = spec_for_stack(args.name or default_name(name), validated.stack, [Path(d) for d in args.crds or []],
                          args.all_crds, args.from_zero, [Path(d) for d in args.charts or []])
    plane = up(spec)
    print(f"run commands on it: triarch local exec --name {spec.name} -- kubectl get nodes")
    print(f"bring it down:      triarch local down --name {spec.name}")
    print(f"(kubeconfig {plane.kubeconfig}; Pulumi state and plugins in {plane.directory})")
    return 0


def cmd_local_exec(args: argparse.Namespace) -> int:
    from triarch.local.lifecycle import exec_in
    from triarch.local.plane import only_plane

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    return exec_in(args.name or only_plane(), command)


def cmd_local_netns(args: argparse.Namespace) -> int:
    """Which network namespace a plane would get here, and why; exit 1 where none works (CI runs it before the
    40-minute build, so a runner that cannot make one fails in a minute)."""
    from triarch.local import netns

    try:
        print(netns.choose().line)
    except netns.NetnsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def cmd_local_down(args: argparse.Namespace) -> int:
    from triarch.local.lifecycle import down
    from triarch.local.plane import only_plane

    down(args.name or only_plane())
    return 0


def add_parser(commands: Commands) -> None:
    local = commands.add_parser("local", help="run a local Kubernetes control plane on the real engines (etcd, the API "
                                              "server, scheduler, controller manager, kwok) and the real Pulumi CLI")
    steps = Commands(local.add_subparsers(dest="step", required=True, metavar="STEP"))
    build = steps.add_parser("build", help="build the engines from the Go module proxy (tools/engines/engines.yaml) "
                                           "and sync the data plane's CPU environments from their lock "
                                           "(tools/dataplane) into caches outside the work tree; cached builds "
                                           "are kept")
    build.add_argument("engines", nargs="*", help="only these engines or environments (default: all)")
    build.add_argument("--force", action="store_true", help="rebuild even if cached")
    build.add_argument("--go-only", action="store_true",
                       help="only the Go engines, not the data plane's environments (what CI's engine cache holds)")
    build.add_argument("--list", action="store_true", help="print what is pinned and built, build nothing")
    build.set_defaults(handler=cmd_local_build)
    start = steps.add_parser("up", help="start a plane for a stack: its nodes as kwok nodes, the CRDs of the "
                                        "components it says the cluster runs, its kubeconfig context")
    source = start.add_mutually_exclusive_group()
    source.add_argument("--stack", default="lab", help="a stack of this project (default: lab)")
    source.add_argument("--stack-file", help="any Pulumi stack file")
    start.add_argument("--name", help="the plane's name (default: the stack's, yours and the host's, e.g. "
                                      "lab-ana-gpubox)")
    start.add_argument("--crds", action="append", metavar="DIR",
                       help="a directory laid out like the reference data, whose charts' CRDs are used before the "
                            "reference cache (`triarch refdata fill`) and the Go modules")
    start.add_argument("--all-crds", action="store_true",
                       help="install every CRD set Triarch's objects use (KubeRay, Prometheus Operator, KEDA, "
                            "Karpenter), not only those of the stack's existing components")
    start.add_argument("--from-zero", action="store_true",
                       help="a created stack's Karpenter pools start with no node: real Karpenter (its kwok "
                            "provider) launches them for pending pods, from the instance types Triarch knows")
    start.add_argument("--charts", action="append", metavar="DIR",
                       help="for a stack that pulls its charts from the plane's mirror (triarch:registry.charts "
                            "oci://127.0.0.1:5000/charts): the chart archives (*.tgz) it serves, from your own "
                            "mirror's export (default: the reference cache's charts/)")
    start.set_defaults(handler=cmd_local_up)
    run = steps.add_parser("exec", help="run a command inside the plane's network namespace, with KUBECONFIG and "
                                        "the built kubectl and pulumi on the PATH")
    run.add_argument("--name", help="the plane (default: the only one of yours up on this host)")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    run.set_defaults(handler=cmd_local_exec)
    ns = steps.add_parser("netns", help="say how a plane gets its network namespace here (root: ip netns; else "
                                        "an unprivileged user namespace; else passwordless sudo for ip netns) and "
                                        "why; exit 1 where none works (TRIARCH_NETNS forces one)")
    ns.set_defaults(handler=cmd_local_netns)
    stop = steps.add_parser("down", help="stop every process of the plane and remove its namespace and state")
    stop.add_argument("--name", help="the plane (default: the only one of yours up on this host)")
    stop.set_defaults(handler=cmd_local_down)
