"""The triarch-guardrails policy pack, driven over gRPC exactly as the Pulumi CLI drives it.

The pack is launched as the CLI launches a Python pack (`python -u -m pulumi.policy <engine> <pack-dir>` from the
virtualenv PulumiPolicy.yaml names, in the pack's directory, with the PULUMI_* environment); the test reads the
port it prints and talks to the Analyzer service: GetAnalyzerInfo, Configure, Analyze and AnalyzeStack.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import grpc
import pytest
import yaml
from google.protobuf import empty_pb2, json_format, struct_pb2
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc

from triarch.guardrails.base import Rule
from triarch.guardrails.registry import RULES
from triarch.guardrails.workloads import POD_TEMPLATE_KINDS, RAY_KINDS, kind_of
from triarch.offline import KNOWN_AFTER_APPLY, read_stack_config, run_program

ROOT = Path(__file__).resolve().parents[1]
POLICIES_DIR = ROOT / "policies"
FIXTURES_DIR = Path(__file__).resolve().parent / "policy_fixtures"
STACK_NAMES = sorted(p.name.split(".")[1] for p in (ROOT / "stacks").glob("Pulumi.*.yaml"))
SHIPPED_STACKS = ("local", "dev", "prod")

PACK_NAME = "triarch-guardrails"
PORT_TIMEOUT = 60.0
RPC_TIMEOUT = 30.0
RULES_BY_NAME = {r.name: r for r in RULES}
LEVELS = {"mandatory": analyzer_pb2.MANDATORY, "advisory": analyzer_pb2.ADVISORY,
          "disabled": analyzer_pb2.DISABLED}
LEVEL_NAMES = {v: k for k, v in LEVELS.items()}


# --- the pack, launched as the CLI launches it ---------------------------------------------------------------


@dataclass
class Pack:
    stub: analyzer_pb2_grpc.AnalyzerStub
    process: subprocess.Popen[bytes]
    engine: socket.socket
    """A listener on the engine address the pack was given; nothing should ever dial it."""
    stderr: list[str] = field(default_factory=list)


def _drain(stream: IO[bytes], sink: list[str] | queue.Queue[str]) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        if isinstance(sink, list):
            sink.append(line)
        else:
            sink.put(line)


def _virtualenv_of_pack() -> Path:
    manifest = yaml.safe_load((POLICIES_DIR / "PulumiPolicy.yaml").read_text(encoding="utf-8"))
    assert manifest["runtime"]["name"] == "python", manifest["runtime"]
    virtualenv = Path(manifest["runtime"]["options"]["virtualenv"])
    return virtualenv if virtualenv.is_absolute() else (POLICIES_DIR / virtualenv).resolve()


@pytest.fixture(scope="module")
def pack() -> Iterator[Pack]:
    # The CLI runs the pack with the python of the virtualenv PulumiPolicy.yaml names; under `uv run` that is
    # the project's .venv, the one running these tests.
    venv = _virtualenv_of_pack()
    assert venv == Path(sys.prefix).resolve(), (
        f"PulumiPolicy.yaml's virtualenv resolves to {venv}, but the tests run in {sys.prefix}")
    assert Path(sys.executable).parent.parent.resolve() == venv, sys.executable

    engine = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    engine.bind(("127.0.0.1", 0))
    engine.listen(8)
    engine_address = f"127.0.0.1:{engine.getsockname()[1]}"

    env = {**os.environ, "PULUMI_PROJECT": "triarch", "PULUMI_STACK": "test", "PULUMI_DRY_RUN": "true",
           "PULUMI_CONFIG": "{}"}
    process = subprocess.Popen(
        [sys.executable, "-u", "-m", "pulumi.policy", engine_address, str(POLICIES_DIR)],
        cwd=POLICIES_DIR, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    stdout: queue.Queue[str] = queue.Queue()
    stderr: list[str] = []
    threading.Thread(target=_drain, args=(process.stdout, stdout), daemon=True).start()
    threading.Thread(target=_drain, args=(process.stderr, stderr), daemon=True).start()
    channel = None
    try:
        try:
            first = stdout.get(timeout=PORT_TIMEOUT)
        except queue.Empty:
            pytest.fail(f"the pack printed no port within {PORT_TIMEOUT:.0f}s (exit code {process.poll()}); "
                        f"stderr:\n{''.join(stderr)}")
        if not first.strip().isdigit():
            pytest.fail(f"the pack's first stdout line is not a port: {first!r}; stderr:\n{''.join(stderr)}")
        channel = grpc.insecure_channel(f"127.0.0.1:{int(first)}")
        grpc.channel_ready_future(channel).result(timeout=RPC_TIMEOUT)
        yield Pack(analyzer_pb2_grpc.AnalyzerStub(channel), process, engine, stderr)
    finally:
        if channel is not None:
            channel.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        engine.close()


# --- helpers ---------------------------------------------------------------------------------------------------


def struct(props: Mapping[str, Any]) -> struct_pb2.Struct:
    return json_format.ParseDict(json.loads(json.dumps(props)), struct_pb2.Struct())


def urn_of(type_: str, name: str) -> str:
    return f"urn:pulumi:test::triarch::{type_}::{name}"


def analyze(pack: Pack, type_: str, name: str, props: Mapping[str, Any], urn: str | None = None
            ) -> list[analyzer_pb2.AnalyzeDiagnostic]:
    request = analyzer_pb2.AnalyzeRequest(type=type_, properties=struct(props), urn=urn or urn_of(type_, name),
                                          name=name)
    return list(pack.stub.Analyze(request, timeout=RPC_TIMEOUT).diagnostics)


def analyze_stack(pack: Pack, resources: Sequence[analyzer_pb2.AnalyzerResource]
                  ) -> list[analyzer_pb2.AnalyzeDiagnostic]:
    request = analyzer_pb2.AnalyzeStackRequest(resources=list(resources))
    return list(pack.stub.AnalyzeStack(request, timeout=RPC_TIMEOUT).diagnostics)


def configure(pack: Pack, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """Configure every policy as the CLI does (each with its enforcement level), with `overrides` applied:
    `{"policy": {"enforcementLevel": "advisory", "threshold": value}}`."""
    policy_config = {}
    for rule in RULES:
        given = dict((overrides or {}).get(rule.name) or {})
        level = LEVELS[given.pop("enforcementLevel", rule.enforcement)]
        policy_config[rule.name] = analyzer_pb2.PolicyConfig(enforcementLevel=level, properties=struct(given))
    pack.stub.Configure(analyzer_pb2.ConfigureAnalyzerRequest(policyConfig=policy_config), timeout=RPC_TIMEOUT)


def show(diagnostics: Sequence[analyzer_pb2.AnalyzeDiagnostic]) -> str:
    return "\n".join(f"  [{LEVEL_NAMES.get(d.enforcementLevel, d.enforcementLevel)}] {d.policyName} {d.urn}: "
                     f"{d.message}" for d in diagnostics) or "  (none)"


# --- GetAnalyzerInfo ---------------------------------------------------------------------------------------------


def test_analyzer_info_lists_every_rule(pack: Pack) -> None:
    info = pack.stub.GetAnalyzerInfo(empty_pb2.Empty(), timeout=RPC_TIMEOUT)
    assert info.name == PACK_NAME
    assert info.supportsConfig
    assert len(info.policies) >= 12
    assert len(RULES) >= 12
    policies = {p.name: p for p in info.policies}
    assert len(policies) == len(info.policies), "duplicate policy names"
    assert sorted(policies) == sorted(RULES_BY_NAME)
    for name, policy in policies.items():
        rule = RULES_BY_NAME[name]
        assert policy.description.strip(), name
        assert policy.description == rule.description, name
        assert policy.enforcementLevel == LEVELS[rule.enforcement], name
        expected_type = (analyzer_pb2.POLICY_TYPE_STACK if rule.check_stack is not None
                         else analyzer_pb2.POLICY_TYPE_RESOURCE)
        assert policy.policy_type == expected_type, name
        schema = json_format.MessageToDict(policy.configSchema.properties)
        assert sorted(schema) == sorted(rule.config), f"{name}: config schema {schema} vs rule config {rule.config}"
        for key, expected in rule.config.items():
            assert schema[key].get("type") == expected["type"], (name, key)
            assert schema[key].get("default") == pytest.approx(expected["default"]), (name, key)
    with_thresholds = [r.name for r in RULES if r.config]
    assert with_thresholds, "no rule carries a threshold"
    assert all(len(policies[n].configSchema.properties) > 0 for n in with_thresholds)


# --- Configure -----------------------------------------------------------------------------------------------


def _vllm_deployment(utilization: float) -> dict[str, Any]:
    """Two GPU replicas of a vLLM server with no zone spread: breaks vllm-memory-utilization (above the 0.95
    default) and gpu-zone-spread."""
    return {
        "metadata": {"name": "chat", "namespace": "inference"},
        "spec": {
            "replicas": 2,
            "template": {"spec": {
                "containers": [{
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.8.5",
                    "args": ["--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu-memory-utilization", str(utilization)],
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                }],
            }},
        },
    }


Diagnostics = list[analyzer_pb2.AnalyzeDiagnostic]


def _by_policy(diagnostics: Sequence[analyzer_pb2.AnalyzeDiagnostic]) -> dict[str, Diagnostics]:
    found: dict[str, Diagnostics] = {}
    for d in diagnostics:
        found.setdefault(d.policyName, []).append(d)
    return found


def test_configure_changes_thresholds_and_levels(pack: Pack) -> None:
    deployment = ("kubernetes:apps/v1:Deployment", "chat", _vllm_deployment(0.97))
    try:
        configure(pack)
        first = analyze(pack, *deployment)
        default = _by_policy(first)
        assert "vllm-memory-utilization" in default, show(first)
        assert "gpu-zone-spread" in default, show(first)
        assert all(d.enforcementLevel == analyzer_pb2.MANDATORY for d in default["vllm-memory-utilization"])
        assert any("0.97" in d.message and "0.95" in d.message for d in default["vllm-memory-utilization"])

        # A raised threshold and a disabled policy: both go quiet, the rest still report.
        configure(pack, {"vllm-memory-utilization": {"max": 0.99}, "gpu-zone-spread": {"enforcementLevel": "disabled"}})
        relaxed = _by_policy(analyze(pack, *deployment))
        assert "vllm-memory-utilization" not in relaxed, show(relaxed["vllm-memory-utilization"])
        assert "gpu-zone-spread" not in relaxed, show(relaxed["gpu-zone-spread"])
        assert set(default) - {"vllm-memory-utilization", "gpu-zone-spread"} == set(relaxed)
        # ... and the new threshold is the one compared against, not merely "config present".
        assert "vllm-memory-utilization" in _by_policy(analyze(pack, "kubernetes:apps/v1:Deployment", "chat",
                                                               _vllm_deployment(0.995)))

        # A lower threshold at advisory level: reported, as advisory, naming the configured limit.
        configure(pack, {"vllm-memory-utilization": {"enforcementLevel": "advisory", "max": 0.96}})
        advisory = _by_policy(analyze(pack, *deployment))["vllm-memory-utilization"]
        assert all(d.enforcementLevel == analyzer_pb2.ADVISORY for d in advisory), show(advisory)
        assert any("> 0.96" in d.message for d in advisory), show(advisory)

        # Back to the defaults: what the first analysis found, found again.
        configure(pack)
        again = analyze(pack, *deployment)
        assert sorted(_by_policy(again)) == sorted(default)
        assert [d.message for d in again] == [d.message for d in first]
    finally:
        configure(pack)


def test_gpu_zone_spread_threshold_is_configurable(pack: Pack) -> None:
    props = _vllm_deployment(0.9)
    props["spec"]["template"]["spec"]["topologySpreadConstraints"] = [
        {"topologyKey": "topology.kubernetes.io/zone", "maxSkew": 2, "whenUnsatisfiable": "DoNotSchedule"}]
    try:
        configure(pack)
        assert "gpu-zone-spread" in _by_policy(analyze(pack, "kubernetes:apps/v1:Deployment", "chat", props))
        configure(pack, {"gpu-zone-spread": {"maxSkew": 2}})
        assert "gpu-zone-spread" not in _by_policy(analyze(pack, "kubernetes:apps/v1:Deployment", "chat", props))
    finally:
        configure(pack)


# --- the fixtures: compliant and violating cases of every rule --------------------------------------------------


@dataclass(frozen=True)
class Case:
    policy: str
    kind: str  # "compliant", "violating" or "unjudged" (a value it reads is known only after apply)
    name: str
    resources: tuple[Mapping[str, Any], ...]
    expect: str | None = None


def _load_cases() -> tuple[list[Case], list[str]]:
    """Every case in tests/policy_fixtures/*.yaml, and the problems found reading them."""
    cases: list[Case] = []
    problems: list[str] = []
    for path in sorted(FIXTURES_DIR.glob("*.yaml")) if FIXTURES_DIR.is_dir() else []:
        try:
            document = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as error:
            problems.append(f"{path.name}: unreadable ({error})")
            continue
        if not isinstance(document, dict):
            problems.append(f"{path.name}: not a mapping")
            continue
        policy = str(document.get("policy"))
        for kind in ("compliant", "violating", "unjudged"):
            for index, entry in enumerate(document.get(kind) or []):
                if not isinstance(entry, dict) or not isinstance(entry.get("resources"), list):
                    problems.append(f"{path.name}: {kind}[{index}] has no resources list")
                    continue
                expect = entry.get("expect")
                cases.append(Case(policy, kind, str(entry.get("case", index)), tuple(entry["resources"]),
                                  None if expect is None else str(expect)))
    return cases, problems


CASES, FIXTURE_PROBLEMS = _load_cases()


def test_fixtures_cover_every_rule() -> None:
    """One fixture file per rule, named after it, each with compliant and violating cases."""
    assert not FIXTURE_PROBLEMS, "\n".join(FIXTURE_PROBLEMS)
    files = sorted(p.stem for p in FIXTURES_DIR.glob("*.yaml")) if FIXTURES_DIR.is_dir() else []
    missing = sorted(set(RULES_BY_NAME) - set(files))
    assert not missing, f"no fixture in {FIXTURES_DIR} for {missing}"
    for path in sorted(FIXTURES_DIR.glob("*.yaml")):
        policy = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("policy")
        assert policy == path.stem, f"{path.name} declares policy {policy!r}"
        assert policy in RULES_BY_NAME, f"{path.name}: {policy!r} is not a rule"
    for rule in RULES:
        kinds = {c.kind for c in CASES if c.policy == rule.name}
        assert kinds >= {"compliant", "violating"}, f"{rule.name}: cases of kind {sorted(kinds)} only"
    for case in CASES:
        assert case.resources, f"{case.policy}/{case.kind}/{case.name}: no resources"
        if case.kind != "compliant":
            assert case.expect, f"{case.policy}/{case.name}: a {case.kind} case without `expect`"


def _case_params() -> list[Any]:
    if not CASES:
        # An empty parameter set would be skipped; a missing fixture set must fail instead.
        return [pytest.param(None, id="no-fixtures")]
    return [pytest.param(c, id=f"{c.policy}/{c.kind}/{c.name}") for c in CASES]


def _case_diagnostics(pack: Pack, rule: Rule, case: Case) -> list[analyzer_pb2.AnalyzeDiagnostic]:
    found: list[analyzer_pb2.AnalyzeDiagnostic] = []
    if rule.check_stack is not None:
        resources = [analyzer_pb2.AnalyzerResource(type=r["type"], name=r["name"], urn=urn_of(r["type"], r["name"]),
                                                   properties=struct(r.get("props") or {}))
                     for r in case.resources]
        found = analyze_stack(pack, resources)
        urns = {r.urn for r in resources}
        mine = [d for d in found if d.policyName == rule.name]
        # Pulumi's can't-run-during-preview note of a stack policy names no resource (the CLI puts it on the stack).
        assert all(d.urn in urns or (d.urn == "" and d.message.startswith("can't run policy")) for d in mine), (
            f"stack diagnostics name URNs outside the case:\n{show(mine)}")
    else:
        for r in case.resources:
            found += analyze(pack, r["type"], r["name"], r.get("props") or {})
    return found


@pytest.mark.parametrize("case", _case_params())
def test_fixture_case(pack: Pack, case: Case | None) -> None:
    assert case is not None, f"no fixture cases in {FIXTURES_DIR}"
    assert case.policy in RULES_BY_NAME, f"fixture policy {case.policy!r} is not a rule"
    rule = RULES_BY_NAME[case.policy]
    configure(pack)
    diagnostics = _case_diagnostics(pack, rule, case)
    mine = [d for d in diagnostics if d.policyName == rule.name]
    if case.kind == "unjudged":  # Pulumi's own advisory for a policy that met an unknown, carrying our note
        assert [LEVEL_NAMES[d.enforcementLevel] for d in mine] == ["advisory"], show(diagnostics)
        assert mine[0].message.startswith(f"can't run policy '{rule.name}' from policy pack '{PACK_NAME}@v")
        assert case.expect is not None and case.expect in mine[0].message, show(mine)
        return
    for d in mine:
        assert d.policyPackName == PACK_NAME
        assert d.enforcementLevel == LEVELS[rule.enforcement], show([d])
    if case.kind == "compliant":
        assert not mine, f"compliant case reported by {rule.name}:\n{show(mine)}"
    else:
        assert mine, f"violating case not reported by {rule.name}; all diagnostics:\n{show(diagnostics)}"
        assert case.expect is not None
        assert any(case.expect in d.message for d in mine), (
            f"no {rule.name} diagnostic contains {case.expect!r}:\n{show(mine)}")


# --- the shipped stacks pass the pack -----------------------------------------------------------------------


def test_shipped_stacks_are_the_expected_ones() -> None:
    assert set(SHIPPED_STACKS) <= set(STACK_NAMES), STACK_NAMES


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_shipped_stack_has_no_mandatory_violation(pack: Pack, stack: str) -> None:
    config, secrets = read_stack_config(ROOT / "stacks" / f"Pulumi.{stack}.yaml")
    run = run_program(stack, config, secrets)
    resources = [r for r in run.resources if r.custom and not r.type.startswith("pulumi:providers:")]
    assert resources, f"stack {stack} plans no custom resources"
    assert any(r.type.startswith("kubernetes:") for r in resources), f"stack {stack} plans no Kubernetes objects"

    configure(pack)
    diagnostics: list[analyzer_pb2.AnalyzeDiagnostic] = []
    for r in resources:
        diagnostics += analyze(pack, r.type, r.name, r.inputs, urn=r.urn)
    diagnostics += analyze_stack(pack, [
        analyzer_pb2.AnalyzerResource(type=r.type, name=r.name, urn=r.urn, parent=r.parent or "",
                                      properties=struct(r.inputs))
        for r in resources])
    if diagnostics:
        print(f"stack {stack}: {len(diagnostics)} diagnostic(s)\n{show(diagnostics)}")
    mandatory = [d for d in diagnostics if d.enforcementLevel == analyzer_pb2.MANDATORY]
    assert not mandatory, f"stack {stack}: {len(mandatory)} mandatory violation(s)\n{show(mandatory)}"
    # Unknowns reach the pack as the plan's marker string, never as Pulumi unknowns it cannot evaluate.
    skipped = [d for d in diagnostics if "during preview" in d.message]
    assert not skipped, show(skipped)

    # The same harness does see a violation in this plan: one workload moved to a :latest image.
    workload = next(r for r in resources if kind_of(r.type) in (*POD_TEMPLATE_KINDS, *RAY_KINDS))
    latest = analyze(pack, workload.type, workload.name, _with_latest_images(workload.inputs), urn=workload.urn)
    assert any(d.policyName == "pinned-images" and d.enforcementLevel == analyzer_pb2.MANDATORY for d in latest), (
        f"{workload.urn} on :latest passed:\n{show(latest)}")


def _with_latest_images(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "busybox:latest" if k == "image" and isinstance(v, str) and v != KNOWN_AFTER_APPLY
                else _with_latest_images(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_with_latest_images(v) for v in value]
    return value


# --- the pack kept to itself -------------------------------------------------------------------------------------


def test_pack_never_dialled_the_engine(pack: Pack) -> None:
    """The pack needs no engine: nothing connected to the engine address it was given."""
    # Exercise every RPC once more before looking.
    configure(pack)
    pack.stub.GetAnalyzerInfo(empty_pb2.Empty(), timeout=RPC_TIMEOUT)
    analyze(pack, "kubernetes:apps/v1:Deployment", "chat", _vllm_deployment(0.97))
    pack.engine.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        connection, peer = pack.engine.accept()
        connection.close()
        pytest.fail(f"the pack connected to the engine address (from {peer})")
    assert pack.process.poll() is None, f"the pack exited; stderr:\n{''.join(pack.stderr)}"
