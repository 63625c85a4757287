"""The policy pack under the real Pulumi CLI, and the real API server's verdict on every stack's objects.

`pulumi preview --policy-pack policies` (the CLI starts the pack through the Python language host, hands it the
stack's configuration, and sends it every resource) must report what `triarch check` reports on the same stack and
policy config: nothing on the lab stack as shipped, the same findings with the same enforcement on seeded
violations. Then the rendered objects of dev, prod, local and lab go through a server-side dry run."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT, STACK_NAMES, reference_dir, stack_path, write_stack_file
from engine_tier import Lab, pod_templates, refused_as_pod
from triarch.cli import main as triarch
from triarch.local.plane import Plane

Finding = tuple[str, str, str, str, str]
"""(policy, enforcement, resource type, resource name, message)."""

POLICIES = ROOT / "policies"


def _drop_pool_zones(config: dict[str, Any]) -> None:
    config["triarch:nodeGroups"][0].pop("zones")


SEEDED: dict[str, tuple[Callable[[dict[str, Any]], object] | None, dict[str, Any]]] = {
    # Stack edit: the zones of the l4 nodes unknown, so the chat replicas spread softly (mandatory in Triarch's own
    # policy config).
    "soft-zone-spread": (_drop_pool_zones, {}),
    # Policy config: a stricter ceiling than the lab's gpuMemoryUtilization (vLLM's default 0.92).
    "memory-utilization": (None, {"vllm-memory-utilization": {"enforcementLevel": "mandatory", "max": 0.9}}),
    # Policy config: a drain longer than any the lab plans, for the vLLM server and the Ray workers alike.
    "drain-too-short": (None, {"prestop-drain": {"enforcementLevel": "mandatory", "minDrainSeconds": 3600}}),
    # The same, where a platform's policy config makes the rule advisory: reported, and the preview passes.
    "soft-zone-spread-advisory": (_drop_pool_zones, {"gpu-zone-spread": {"enforcementLevel": "advisory",
                                                                          "maxSkew": 1}}),
}


def _policy_config(tmp: Path, overrides: dict[str, Any]) -> Path:
    config = json.loads((POLICIES / "config.json").read_text())
    config.update(overrides)
    path = tmp / "policy-config.json"
    path.write_text(json.dumps(config))
    return path


def check_findings(stack_file: Path, policy_config: Path, capsys: pytest.CaptureFixture[str]) -> set[Finding]:
    triarch(["check", "--stack-file", str(stack_file), "--policy-config", str(policy_config), "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    return {(v["policy"], v["enforcementLevel"], v["resource"]["type"], v["resource"]["name"], v["message"])
            for v in report["violations"]}


def preview_findings(lab: Lab, policy_config: Path) -> tuple[set[Finding], int]:
    """The policy events of a real preview (the CLI streams its engine events as JSON lines)."""
    done = lab.pulumi("preview", "--json", "--policy-pack", str(POLICIES), "--policy-pack-config", str(policy_config),
                      check=False, env={"PULUMI_ENABLE_STREAMING_JSON_PREVIEW": "true"})
    events = engine_events(done.stdout, done.stderr)
    found: set[Finding] = set()
    for line in events:
        event = line.get("policyEvent")
        if not event:
            continue
        urn = event.get("resourceUrn") or ""
        resource_type = urn.split("::")[2].rsplit("$", 1)[-1] if urn else ""
        found.add((event["policyName"], event["enforcementLevel"], resource_type, urn.split("::")[-1] if urn else "",
                   event["message"].strip()))
    return found, done.returncode


def engine_events(out: str, err: str) -> list[dict[str, Any]]:
    """The engine events a `--json` preview streams, one JSON object a line; the preview must have finished."""
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert any("summaryEvent" in e for e in events), f"the preview did not finish:\n{out[-3000:]}\n{err[-3000:]}"
    return events


def edited_preview_findings(lab: Lab, config: dict[str, Any], policy_config: Path) -> tuple[set[Finding], int]:
    """preview_findings with the lab stack's config edited, put back afterwards."""
    lab.write_config(config)
    try:
        return preview_findings(lab, policy_config)
    finally:
        lab.write_config(lab.config)


def _messages(findings: set[Finding]) -> set[Finding]:
    """The pack prints each violation's description before its message; compare from the message on."""
    return {(p, e, t, n, m.rsplit("\n", 1)[-1].strip()) for p, e, t, n, m in findings}


def test_the_lab_stack_as_shipped_is_clean_under_the_real_cli(deployed: Lab, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    policy_config = _policy_config(tmp_path, {})
    ours = check_findings(deployed.stack_file, policy_config, capsys)
    real, code = preview_findings(deployed, policy_config)
    assert ours == set() and real == set() and code == 0


@pytest.mark.parametrize("name", sorted(SEEDED))
def test_seeded_violations_are_the_same_under_the_real_cli(deployed: Lab, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str], name: str) -> None:
    edit, overrides = SEEDED[name]
    config = copy.deepcopy(deployed.config)
    if edit is not None:
        edit(config)
    policy_config = _policy_config(tmp_path, overrides)
    ours = check_findings(write_stack_file(tmp_path / "Pulumi.lab.yaml", config), policy_config, capsys)
    real, code = edited_preview_findings(deployed, config, policy_config)
    assert ours, "the seed violates something"
    assert _messages(real) == _messages(ours)
    mandatory = any(f[1] == "mandatory" for f in ours)
    assert (code != 0) == mandatory  # a mandatory violation fails the preview, an advisory one does not


def test_a_rule_the_packs_config_disables_is_silent_under_the_real_cli(deployed: Lab, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`"enforcementLevel": "disabled"` in the pack's config: the edit that is a mandatory gpu-zone-spread violation
    (soft-zone-spread above) draws no finding from the CLI, which passes the preview, nor from `triarch check`."""
    config = copy.deepcopy(deployed.config)
    _drop_pool_zones(config)
    policy_config = _policy_config(tmp_path, {"gpu-zone-spread": {"enforcementLevel": "disabled", "maxSkew": 1}})
    ours = check_findings(write_stack_file(tmp_path / "Pulumi.lab.yaml", config), policy_config, capsys)
    real, code = edited_preview_findings(deployed, config, policy_config)
    assert (real, code) == (set(), 0)
    assert ours == set()


# --- every stack's objects, server-side -----------------------------------------------------------------------


@pytest.fixture(scope="session")
def bare_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    """A plane of its own with the CRDs of every component a stack installs and nothing deployed, so each stack's
    objects are judged as the creations they are (on the lab's plane they would be updates of its objects)."""
    from engine_tier import require_engines
    from triarch.local.crds import CRD_SETS, crd_files
    from triarch.local.lifecycle import down, up
    from triarch.local.plane import PlaneSpec

    require_engines()
    name = f"d{os.getpid()}"
    patch = pytest.MonkeyPatch()
    patch.setenv("TRIARCH_LOCAL_HOME", str(tmp_path_factory.mktemp("bare")))
    try:
        yield up(PlaneSpec(name, "triarch-dry-run", [], crd_files(list(CRD_SETS), [])), log=lambda _: None)
    finally:
        down(name, quiet=True)
        patch.undo()


EXPECTED_WORKLOADS = {"dev": {"Deployment"}, "local": {"Deployment"}, "lab": {"Deployment", "RayService"},
                      "prod": {"Deployment", "RayService"}, "large": {"LeaderWorkerSet", "RayService"},
                      "fresh": {"Deployment", "LeaderWorkerSet", "RayService"}}
"""The kinds of workload whose pod templates each stack holds (its models' engines and stages)."""


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_every_stacks_objects_are_accepted_by_the_api_server(bare_plane: Plane, tmp_path: Path, stack: str) -> None:
    """CEL rules, defaulting, immutable fields and admission in a server-side dry run: each stack's namespaces for
    real first (the objects in them are judged by their namespace's admission), then everything else; then each pod
    template as the Pod it becomes, which is what Pod Security's `enforce` level judges (of a workload, it only
    warns), with no Pod Security warning anywhere."""
    from triarch.report.planning import plan_stack
    from triarch.report.validation import validate_stack_file

    plan_stack(validate_stack_file(stack, stack_path(stack)), tmp_path)
    manifests = [yaml.safe_load(p.read_text()) for p in sorted((tmp_path / "manifests").glob("*.yaml"))]
    # For real first: the namespaces (their admission judges what is in them), and what a Pod's admission looks up
    # by name (its service account, its priority class).
    first = [m for m in manifests if m["kind"] in ("Namespace", "ServiceAccount", "PriorityClass")]
    rest = [m for m in manifests if m["kind"] != "Namespace"]
    assert rest
    for kind in ("Namespace", "ServiceAccount", "PriorityClass"):
        if documents := [m for m in first if m["kind"] == kind]:
            bare_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                               input=yaml.safe_dump_all(documents))
    done = bare_plane.kubectl("apply", "--server-side", "--dry-run=server", "--field-manager", f"triarch-{stack}",
                              "-f", "-", input=yaml.safe_dump_all(rest), check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("(server dry run)") == len(rest)
    assert "PodSecurity" not in done.stderr, done.stderr  # a workload's template only draws a warning
    # So each pod template goes in as the Pod it becomes, which its namespace's `enforce` level admits or refuses.
    templates = [m for m in rest if pod_templates(m)]
    assert {m["kind"] for m in templates} >= EXPECTED_WORKLOADS[stack], stack
    refused = [r for m in templates for r in refused_as_pod(bare_plane, m, m["metadata"].get("namespace", "default"))]
    assert refused == []


def test_a_missing_crd_of_an_existing_component_stops_the_preview(deployed: Lab) -> None:
    """KEDA marked existing where the cluster has no KEDA: one line from Triarch, nothing registered."""
    config = copy.deepcopy(deployed.config)
    config["triarch:observability"]["keda"] = "existing"
    next(m for m in config["triarch:models"] if m["name"] == "chat")["autoscaling"] = {"min": 1, "max": 2}
    next(m for m in config["triarch:models"] if m["name"] == "chat").pop("replicas")
    deployed.write_config(config)
    try:
        done = deployed.pulumi("preview", check=False)
    finally:
        deployed.write_config(deployed.config)
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert ("triarch:observability.keda: 'existing' says the cluster runs the component, but context 'triarch-lab' "
            "has no CRD scaledobjects.keda.sh; allowed: the component installed there first (its chart brings the "
            "CRD), or observability.keda: install") in said
    assert "Traceback" not in said


# --- every rule under the real CLI, judged against written expectations ----------------------------------------
# tests/policy_cases/program.py previews Triarch's prod objects (stack `compliant`) and the same world with one
# hand-written case per rule (stack `violating`) on the bare plane, through the real Kubernetes provider and a
# preview-only stand-in of the AWS one (tests/aws_standin.py). What each case must draw is written below, not
# taken from `triarch check`; `triarch check` agreeing on the same inputs is a second assertion.

CASES_PROJECT = "policy-cases"
UNKNOWN_SENTINEL = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
"""How the engine's JSON events spell a value unknown at preview (pulumi's resource.UnknownStringValue)."""
SECRET_SIG = ("4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270")
"""How they mark a secret, whose value they never show (`ciphertext: [secret]`, even with --show-secrets)."""
D = "kubernetes:apps/v1:Deployment"
ECR_IMAGE_UNKNOWN = ("during preview: from-ecr: spec.template.spec.containers[0].image is known only after apply "
                     "(another resource's output)")


def case(type_: str, name: str) -> str:
    """The URN of a case's object: a child of the component named after its rule."""
    return f"urn:pulumi:violating::{CASES_PROJECT}::cases:policy:Violation${type_}::{name}"


def top(type_: str, name: str) -> str:
    return f"urn:pulumi:violating::{CASES_PROJECT}::{type_}::{name}"


# What the expectations below compute from the cases' inputs: the baseline the cases copy (most are prod's embed
# Deployment with one edit) and the node overhead data the placement proof reads.
BASELINE: list[dict[str, Any]] = yaml.safe_load((ROOT / "tests" / "policy_cases" / "baseline.yaml").read_text())


def _baseline(name: str) -> dict[str, Any]:
    props: dict[str, Any] = next(i["props"] for i in BASELINE if i["name"] == name)
    return props


_EMBED = _baseline("deployment-llm-embed")
_POD = _EMBED["spec"]["template"]["spec"]
_VLLM = _POD["containers"][0]
REPLICAS = _EMBED["spec"]["replicas"]
"""Each case that copies the embed Deployment runs its replicas."""
MIN_ZONES = next(c["minDomains"] for c in _POD["topologySpreadConstraints"]
                 if c["topologyKey"] == "topology.kubernetes.io/zone")
PRESTOP_S = int(_VLLM["lifecycle"]["preStop"]["exec"]["command"][-1].removeprefix("sleep "))
DRAIN_S = int(_VLLM["args"][_VLLM["args"].index("--shutdown-timeout") + 1])
_GROUP = _baseline("leaderworkerset-llm-deepseek")["spec"]["leaderWorkerTemplate"]
GROUP_GPUS = _GROUP["size"] * int(_GROUP["leaderTemplate"]["spec"]["containers"][0]["resources"]["limits"]
                                  ["nvidia.com/gpu"])
"""The GPUs one LeaderWorkerSet group holds: its pods (a leader and its workers) times each pod's GPUs."""
L4_INSTANCE = next(r["values"][0] for r in _baseline("nodepool-l4")["spec"]["template"]["spec"]["requirements"]
                   if r["key"] == "node.kubernetes.io/instance-type")
# The created-stack mode's add-ons: the DaemonSets of those prod installs that templates/compat/node-overhead.yaml
# names, on every node (a node group's or Karpenter's), beside the NVIDIA chart's three (device plugin, GPU feature
# discovery, node-feature-discovery worker).
_OVERHEAD = yaml.safe_load((ROOT / "templates" / "compat" / "node-overhead.yaml").read_text())["addonDaemonSets"]
ADDON_DAEMONSETS = [i["props"]["addonName"] for i in BASELINE
                    if i["type"] == "aws:eks/addon:Addon" and _OVERHEAD.get(i["props"]["addonName"])]
ADDON_CPU_M = sum(int(_OVERHEAD[a]["cpu"].removesuffix("m")) for a in ADDON_DAEMONSETS if "cpu" in _OVERHEAD[a])
L4_FREE_CPU_M = 8000 - 90 - (50 + 50 + 5) - ADDON_CPU_M
"""A g6.2xlarge's 8 vCPUs less the kubelet's reserve (90m, test_placement.py's table) and the NVIDIA chart's
DaemonSets (its values' 50m for the device plugin and for GPU feature discovery, NFD's 5m), less the add-ons'."""

# A reviewed snapshot: each message is the pack's wording, read once against its case and written down (a rule's
# new wording fails here, to be read again); the numbers a message names come from the cases' inputs above where
# they are the inputs' (replicas, zones, drains, GPUs, the add-ons' share), and are written out where they are the
# case's own edit.
EXPECTED_VIOLATIONS: list[tuple[str, str, str, str]] = [
    # (policy, enforcement, resource URN, a fragment of the message; a trailing $ means the message ends with it)
    ("gpu-zone-spread", "mandatory", case(D, "spread-soft"),
     f"Deployment spread-soft: {REPLICAS} GPU replicas spread over zones only with ScheduleAnyway"),
    ("gpu-limits", "mandatory", case(D, "zero-gpus"),
     "Deployment zero-gpus container vllm: a vLLM server without GPUs"),
    ("vllm-parallelism-matches-gpus", "mandatory", case(D, "zero-gpus"),
     "tensor_parallel_size 1 x pipeline_parallel_size 1 = 1 but the replica holds 0 GPU(s)"),
    # Mandatory in Triarch's policy config (policies/config.json), advisory in the pack's defaults.
    ("gpu-scheduling", "mandatory", case(D, "no-toleration"),
     "Deployment no-toleration: requests NVIDIA GPUs but does not tolerate the nvidia.com/gpu:NoSchedule taint"),
    ("pod-placement", "mandatory", case(D, "no-toleration"),
     "Deployment no-toleration: no pool's nodes take it (triarch.dev/pool=l4)"),
    ("gpu-node-selection", "advisory", case(D, "no-selector"),
     "Deployment no-selector: requests accelerators without selecting their nodes"),
    ("no-privileged-pods", "mandatory", case(D, "privileged"),
     "Deployment privileged container vllm: privileged; remove it"),
    ("no-device-reset", "mandatory", case(D, "device-reset"),
     "Deployment device-reset container vllm: resets the GPU device"),
    ("pinned-images", "mandatory", case(D, "latest-image"),
     "Deployment latest-image container vllm: image vllm/vllm-openai:latest uses :latest, which moves"),
    ("pinned-images", "mandatory", case("kubernetes:helm.sh/v3:Release", "device-plugin-latest"),
     "Helm release device-plugin-latest: values image.tag is latest, which moves; pin a version tag$"),
    ("driver-cuda-compatible", "mandatory", case(D, "latest-image"),
     "Deployment latest-image: image vllm/vllm-openai:latest is not in templates/compat/images.yaml"),
    ("gpu-nodegroup-labels-taint", "mandatory", case("kubernetes:karpenter.sh/v1:NodePool", "nodepool-l4-untainted"),
     "NodePool l4-untainted: no nvidia.com/gpu NoSchedule taint in its template"),
    ("imdsv2-required", "mandatory", case("aws:ec2/launchTemplate:LaunchTemplate", "legacy-gpu-lt"),
     "launch template legacy-gpu-lt: metadataOptions.httpTokens is not 'required'; set it$"),
    # The pack's threshold from its config (a JSON number, a float on the wire) printed as the integer it is.
    ("imdsv2-required", "mandatory", case("aws:ec2/launchTemplate:LaunchTemplate", "legacy-gpu-lt"),
     "launch template legacy-gpu-lt: hop limit 2 lets pods reach IMDS; set httpPutResponseHopLimit <= 1$"),
    ("model-cache-not-emptydir", "mandatory", case(D, "cache-emptydir"),
     "Deployment cache-emptydir container vllm: model cache /models is an emptyDir"),
    ("ray-ports-internal", "mandatory", case("kubernetes:core/v1:Service", "ray-dashboard"),
     "Service ray-dashboard: exposes the Ray dashboard port 8265 through LoadBalancer"),
    ("serving-network-isolated", "mandatory", case("kubernetes:networking.k8s.io/v1:NetworkPolicy", "open-openai-http"),
     "NetworkPolicy llm/open-openai-http: admits ingress from every namespace or address"),
    ("no-cpu-hpa-on-gpu", "mandatory", case("kubernetes:autoscaling/v2:HorizontalPodAutoscaler", "embed-on-cpu"),
     "HorizontalPodAutoscaler embed-on-cpu: scales the GPU server Deployment embed on CPU/memory"),
    ("no-cpu-hpa-on-gpu", "mandatory", case("kubernetes:keda.sh/v1alpha1:ScaledObject", "scaledobject-embed-on-cpu"),
     "ScaledObject embed-on-cpu: scales the GPU server Deployment embed on cpu"),
    ("prestop-drain", "mandatory", case(D, "short-grace"),
     f"Deployment short-grace container vllm: terminationGracePeriodSeconds 30 < preStop {PRESTOP_S}s + drain "
     f"{DRAIN_S}s; set it to >= {PRESTOP_S + DRAIN_S}$"),
    ("inference-probes", "mandatory", case(D, "no-startup-probe"),
     "Deployment no-startup-probe container vllm: missing startupProbe"),
    ("vllm-memory-utilization", "mandatory", case(D, "memory-high"),
     "Deployment memory-high container vllm: gpu_memory_utilization 0.98 > 0.95"),
    # A LeaderWorkerSet group (leader and worker, 8 GPUs each) asked for tensor 8 x pipeline 4.
    ("vllm-parallelism-matches-gpus", "mandatory",
     case("kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet", "leaderworkerset-deepseek-pp4"),
     "LeaderWorkerSet deepseek-pp4 leader container vllm: tensor_parallel_size 8 x pipeline_parallel_size 4 = 32 but "
     f"the replica holds {GROUP_GPUS} GPU(s)"),
    ("vllm-parallelism-matches-gpus", "mandatory", case(D, "tp-two"),
     "Deployment tp-two container vllm: tensor_parallel_size 2 x pipeline_parallel_size 1 = 2 but the replica holds 1 "
     "GPU(s)"),
    ("model-cache-persistent", "advisory", case(D, "no-cache-volume"),
     "Deployment no-cache-volume container vllm: no volume at the model cache"),
    ("rwo-cache-surge", "advisory", case(D, "surge"),
     "Deployment surge: mounts the ReadWriteOnce claim surge-cache and rolls out with a surge"),
    ("gpu-server-resources", "advisory", case(D, "gpu-only"),
     "Deployment gpu-only container vllm: no cpu or memory request"),
    ("pinned-gpu-driver", "mandatory", case(D, "floating-driver"),
     "Deployment floating-driver: nodeSelector cloud.google.com/gke-gpu-driver-version: latest floats with the "
     "platform"),
    # Selector keys and pools in name order, whatever order the engine hands them in.
    ("pod-placement", "mandatory", case(D, "floating-driver"), "Deployment floating-driver: no pool's nodes take it "
     "(cloud.google.com/gke-gpu-driver-version=latest, triarch.dev/pool=l4); pools: a100 (nvidia.com/gpu.present=true, "
     "triarch.dev/gpu=a100-80gb, triarch.dev/pool=a100; nvidia.com/gpu=present:NoSchedule); a10g ("),
    # A Pulumi secret is still plain text in the Deployment's spec.
    ("runtime-lora-never-public", "mandatory", case(D, "runtime-lora"),
     "Deployment runtime-lora sets VLLM_ALLOW_RUNTIME_LORA_UPDATING, and Service runtime-lora (LoadBalancer) takes "
     "traffic from outside the cluster"),
    ("no-plaintext-secrets", "mandatory", case(D, "secret-token"),
     "Deployment secret-token container vllm: env HF_TOKEN is written in the manifest"),
    ("driver-cuda-compatible", "mandatory", case(D, "old-driver"),
     "Deployment old-driver: vllm/vllm-openai:v0.33.0 needs CUDA 13.0 -> NVIDIA driver >= 580.65.06; node group "
     "'l4-old-driver' pins AMI release v20250807 with driver 570.172.08"),
    ("pod-placement", "mandatory", case(D, "missing-pool"),
     "Deployment missing-pool: no pool's nodes take it (triarch.dev/pool=h200)"),
    # The one-GPU pool holds one one-GPU node.
    ("pool-capacity", "mandatory", case(D, "crowded"), "pool l4-one-gpu (NodePool l4-one-gpu) holds at most 1 "
     f"{L4_INSTANCE} node(s), but its workloads at their largest need {REPLICAS}: Deployment crowded {REPLICAS} "
     "pod(s), 1 per node"),
    ("pool-capacity", "mandatory", case(D, "crowded"),
     f"Deployment crowded spreads over at least {MIN_ZONES} zones (minDomains), but pool l4-one-gpu reaches 1"),
    # Only prod's created-stack mode (its EKS Cluster and add-ons in the stack) draws these two: on an adopted cluster
    # a pod that asks no GPU may run on the cluster's own nodes, and a node's free room leaves the add-ons out.
    ("pod-placement", "mandatory", case(D, "cpu-proxy"),
     "Deployment cpu-proxy: no pool's nodes take it (triarch.dev/pool=cpu); pools: a100 ("),
    ("pod-placement", "mandatory", case(D, "addon-share"),
     f"Deployment addon-share asks 7700m CPU, 25600 MiB, 1 GPU per pod, but a {L4_INSTANCE} node of pool l4 has "
     f"{L4_FREE_CPU_M}m CPU, 31553 MiB, 1 GPU after the kubelet's reserve and {3 + len(ADDON_DAEMONSETS)} "
     "DaemonSet(s)"),
    ("pool-scale-from-zero", "mandatory", case(D, "on-a10g"),
     "pool a10g (node group llm-prod-a10g) may have no node (minimum 0) and nothing in the stack adds one"),
    ("serve-graceful-shutdown", "advisory", top("kubernetes:ray.io/v1:RayService", "rayservice-llm-llm"),
     "RayService llm application chat: graceful_shutdown_timeout_s 5 cuts long generations"),
    ("kv-transfer-over-tcp", "advisory", top("kubernetes:ray.io/v1:RayService", "rayservice-llm-llm"),
     "RayService llm application qwen: prefill hands the KV cache to decode over NixlConnector with backends UCX, "
     "TCP between nodes; NVIDIA Dynamo's EFA guide measured about 98 s time to first token over TCP"),
    # An image from another resource's output: each rule that reads it says it could not judge it at preview
    # (Pulumi's own advisory for a policy meeting an unknown); the stack rule's is on the stack.
    *((policy, "advisory", case(D, "from-ecr"), f"can't run policy '{policy}' from policy pack 'triarch-guardrails@v")
      for policy in ("model-cache-not-emptydir", "model-cache-persistent", "no-privileged-pods", "pinned-images",
                     "prestop-drain", "vllm-memory-utilization", "vllm-parallelism-matches-gpus")),
    ("driver-cuda-compatible", "advisory", top("pulumi:pulumi:Stack", f"{CASES_PROJECT}-violating"),
     "can't run policy 'driver-cuda-compatible' from policy pack 'triarch-guardrails@v"),
]

PolicyEvent = tuple[str, str, str, str]
"""(policy, enforcement, resource URN, message without the policy's description)."""


@dataclass
class CasesPreview:
    events: list[PolicyEvent]
    code: int
    resources: list[Any]  # triarch.guardrails.base.Resource: the inputs the engine registered
    masked: list[str]
    """URNs whose inputs hold a secret: the events hide its value (and the object around it), the pack sees it."""


class _Masked(Exception):
    pass


def _cases_project(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "Pulumi.yaml").write_text(yaml.safe_dump({
        "name": CASES_PROJECT, "main": str(ROOT / "tests" / "policy_cases" / "program.py"),
        "runtime": {"name": "python", "options": {"toolchain": "pip", "virtualenv": sys.prefix}}}))
    return directory


def _install_aws_standin(plane: Plane, directory: Path) -> None:
    """tests/aws_standin.py as the `aws` plugin of the version the program's SDK asks for."""
    from importlib.metadata import version

    from triarch.local.engines import binary

    script = directory / "pulumi-resource-aws"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{ROOT / "tests" / "aws_standin.py"}" "$@"\n')
    script.chmod(0o755)
    plane.run([str(binary("pulumi")), "plugin", "install", "resource", "aws", f"v{version('pulumi_aws')}",
               "--file", str(script)])


def _inputs(value: Any) -> Any:
    from triarch.known import KNOWN_AFTER_APPLY as UNKNOWN

    if isinstance(value, dict):
        if value.get(SECRET_SIG[0]) == SECRET_SIG[1]:
            raise _Masked
        return {k: _inputs(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_inputs(v) for v in value]
    return UNKNOWN if value == UNKNOWN_SENTINEL else value


def _preview(plane: Plane, project: Path, stack: str) -> subprocess.Popen[str]:
    from triarch.local.engines import binary

    argv = [str(binary("pulumi")), "preview", "--json", "--stack", stack, "--non-interactive", "--policy-pack",
            str(POLICIES), "--policy-pack-config", str(POLICIES / "config.json")]
    return subprocess.Popen(plane.command(argv), env={**plane.env(), "PULUMI_ENABLE_STREAMING_JSON_PREVIEW": "true"},
                            cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _read_preview(process: subprocess.Popen[str]) -> CasesPreview:
    from triarch.guardrails.base import Resource

    out, err = process.communicate(timeout=600)
    lines = engine_events(out, err)
    failed = [d["message"] for line in lines if (d := line.get("diagnosticEvent")) and d.get("severity") == "error"
              and "Preview failed" in d["message"]]
    assert failed == [], failed  # every object, violating or not, is one the API server accepts
    events = [(e["policyName"], e["enforcementLevel"], e.get("resourceUrn") or "", e["message"].strip().split("\n")[-1])
              for line in lines if (e := line.get("policyEvent"))]
    resources, masked = [], []
    for line in lines:
        new = ((line.get("resourcePreEvent") or {}).get("metadata") or {}).get("new") or {}
        if not new.get("type", "").startswith(("kubernetes:", "aws:")):  # not components, providers, the stack
            continue
        try:
            resources.append(Resource(new["type"], new["urn"].split("::")[-1], _inputs(new.get("inputs") or {}),
                                      new["urn"]))
        except _Masked:
            masked.append(new["urn"])
    return CasesPreview(events, process.returncode, resources, masked)


@pytest.fixture(scope="session")
def policy_previews(bare_plane: Plane, tmp_path_factory: pytest.TempPathFactory) -> dict[str, CasesPreview]:
    """Both stacks of the cases program previewed with the pack and its shipped config, side by side."""
    from triarch.local.engines import binary

    project = _cases_project(tmp_path_factory.mktemp("policy-cases"))
    _install_aws_standin(bare_plane, project)
    # The namespaces for real, so the Kubernetes provider's preview is the API server's dry run of every object
    # (where the namespace is missing the provider skips it), whichever test of this plane ran first.
    namespaces = [i["props"] for i in BASELINE if i["type"] == "kubernetes:core/v1:Namespace"]
    bare_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(namespaces))
    pulumi_bin = str(binary("pulumi"))
    for stack in ("compliant", "violating"):
        bare_plane.run([pulumi_bin, "stack", "init", stack, "--cwd", str(project), "--non-interactive"])
        for key, value in (("aws:region", "us-east-1"), ("cases:set", stack),
                           ("cases:charts", str(reference_dir("charts")))):
            bare_plane.run([pulumi_bin, "config", "set", "--stack", stack, "--cwd", str(project), key, value])
    running = {stack: _preview(bare_plane, project, stack) for stack in ("compliant", "violating")}
    return {stack: _read_preview(process) for stack, process in running.items()}


def _matches(event: PolicyEvent, expected: tuple[str, str, str, str]) -> bool:
    policy, level, urn, fragment = expected
    text = event[3]
    found = text.endswith(fragment[:-1]) if fragment.endswith("$") else fragment in text
    return event[:3] == (policy, level, urn) and found


@pytest.mark.usefixtures("engines_required")
def test_every_rule_has_a_violating_case_under_the_real_cli() -> None:
    """A rule added to the pack without a case here fails this."""
    from triarch.guardrails.registry import RULES

    assert {r.name for r in RULES} == {p for p, level, _, f in EXPECTED_VIOLATIONS if "can't run" not in f}


def test_each_case_draws_what_is_written_and_nothing_else(policy_previews: dict[str, CasesPreview]) -> None:
    preview = policy_previews["violating"]
    unmatched = [e for e in EXPECTED_VIOLATIONS if not any(_matches(got, e) for got in preview.events)]
    unexpected = [got for got in preview.events if not any(_matches(got, e) for e in EXPECTED_VIOLATIONS)]
    assert (unmatched, unexpected) == ([], []), "\n".join(["missing:", *map(str, unmatched), "unexpected:",
                                                           *map(str, unexpected)])
    assert len(preview.events) == len(EXPECTED_VIOLATIONS)
    assert preview.code != 0  # mandatory violations fail the preview


def test_the_compliant_twins_are_silent_under_the_real_cli(policy_previews: dict[str, CasesPreview]) -> None:
    """Triarch's prod objects (the twin of every case: the object each case copies before its one edit)."""
    preview = policy_previews["compliant"]
    assert (preview.events, preview.code) == ([], 0)
    assert sorted(r.name for r in preview.resources) == sorted(i["name"] for i in BASELINE)


def test_the_placement_proof_runs_prods_created_stack_mode_under_the_real_cli(
        policy_previews: dict[str, CasesPreview]) -> None:
    """Prod creates its cluster: with its EKS Cluster and add-ons among the inputs the engine hands the pack, every
    pod must land on a pool of the stack and each node's room leaves the add-ons' DaemonSets out. The created-stack
    cases draw their findings under the real CLI (above); `triarch check` on the same inputs, the Cluster and the
    add-ons taken away (an adopted cluster's stack), draws neither."""
    from triarch.guardrails.check import evaluate, load_policy_config

    preview = policy_previews["violating"]
    assert {r.type for r in preview.resources} >= {"aws:eks/cluster:Cluster", "aws:eks/addon:Addon"}
    created_stack = {case(D, "cpu-proxy"), case(D, "addon-share")}
    assert {urn for p, _, urn, _ in preview.events if p == "pod-placement"} >= created_stack
    adopted = [r for r in preview.resources if r.type not in ("aws:eks/cluster:Cluster", "aws:eks/addon:Addon")]
    drawn = {f.resource.urn for f in evaluate(adopted, load_policy_config(POLICIES / "config.json"))}
    assert drawn & created_stack == set()


@pytest.mark.parametrize("stack", ["compliant", "violating"])
def test_triarch_check_agrees_with_the_cli_on_the_same_inputs(policy_previews: dict[str, CasesPreview],
                                                              stack: str) -> None:
    """`triarch check`'s evaluation of the inputs the engine registered (from the preview's events), with the same
    policy config: the same policies, levels and messages (Pulumi words the can't-judge note its own way)."""
    from triarch.guardrails.check import evaluate, load_policy_config

    preview = policy_previews[stack]
    # The secret-token case's Deployment (its whole container list, secret by the token in it) is left to the
    # written expectation above.
    assert preview.masked == ([case(D, "secret-token")] if stack == "violating" else [])
    ours = {(f.rule.name, f.enforcement, f.message) for f in
            evaluate(preview.resources, load_policy_config(POLICIES / "config.json"))}
    theirs = {(p, level, message.split(" during preview: ", 1)[-1]) for p, level, urn, message in preview.events
              if urn not in preview.masked}
    assert ours == theirs
    assert len(ours) > (30 if stack == "violating" else -1)
