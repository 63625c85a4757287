"""A whole `pulumi up` on a local plane: the fresh stack, in which Triarch installs every chart an adopted cluster can
take from it, each pulled by the provider's own Helm from an OCI mirror on the plane's loopback (the pinned archives
of the reference data), with the real KubeRay, KEDA and LeaderWorkerSet operators in place of the charts'
controller pods, each run as its pod would be: with a token of the pod's ServiceAccount, the container's arguments
and environment as rendered into the Deployment, and listening at the pod's address alone.

What it shows, in order: an up whose LeaderWorkerSet manager never starts waits on the LWS webhooks (a
`failurePolicy: Fail` webhook with no server refuses every LeaderWorkerSet), then fails naming them, every release
installed; the next up, its manager started once the up says it is at the gate, succeeds; every release is deployed
at its pinned chart, everything it renders is in the cluster and its workloads are Ready; a chart bump (an archive
repacked one version on and pushed) and a values edit are in-place release updates and a preview with --refresh
changes nothing else; a chart version whose schema refuses a value, and one the mirror lacks, fail the up naming
what and change nothing; destroy leaves no release behind.
Karpenter's charts are not here: they need an EKS cluster (its endpoint, IAM role and interruption queue come from
the AWS half, which runs under Pulumi's mocks), and test_real_karpenter runs Karpenter's kwok provider instead."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

import triarch.catalog
from conftest import ROOT, compat_data, reference_dir, stack_path
from engine_tier import eventually, pod_templates, refused_as_pod, require_engines, scratch_project
from triarch.cli import main
from triarch.guardrails.check import evaluate, load_policy_config
from triarch.guardrails.manifests import KubernetesYaml, read_manifests
from triarch.local import engines
from triarch.local.kubelet import watched
from triarch.local.lifecycle import down, start_operator, up
from triarch.local.mirror import read_archive
from triarch.local.operators import KUBERAY_BUILT_GATES
from triarch.local.plane import MIRROR_ADDRESS, MIRROR_PATH, Plane
from triarch.local.stack import spec_for_stack
from triarch.paths import COMPAT_DIR
from triarch.report.validation import validate_stack_file

STACK = "fresh"
PASSPHRASE = {"PULUMI_CONFIG_PASSPHRASE": "triarch-local"}
RELEASES = {"nvidia-device-plugin": "nvidia-device-plugin", "kuberay-operator": "kuberay-system",
            "lws": "lws-system", "prometheus-operator-crds": "monitoring", "kube-prometheus-stack": "monitoring",
            "dcgm-exporter": "gpu-monitoring", "keda": "keda", "chat-pool": "llm", "draft-pool": "llm"}
"""Every release the up installs and its namespace: the fresh stack's, with a second routed model (SECOND_ROUTED)."""
CHART_OF = {**{name: name for name in RELEASES}, "chat-pool": "llm-d-router-standalone",
            "draft-pool": "llm-d-router-standalone"}
"""Each release's chart: its own name, but the endpoint picker's, one release per routed model (`<model>-pool`)."""
SECOND_ROUTED = {"name": "draft", "model": "Qwen/Qwen3-8B", "engine": "vllm", "nodeGroup": "l4", "maxModelLen": 8192,
                 "replicas": 2, "prefixRouting": {"enabled": True}}
"""A second model behind an endpoint picker in the same namespace, with two replicas to route between (one is
refused: there is no choice to make), room made on the l4 pool with a fourth node and chat's autoscaling max lowered
to 2: two releases of the picker's chart must install side by side (issue 47)."""
LWS_MUTATING = "lws-mutating-webhook-configuration"
KEDA_API = "v1beta1.external.metrics.k8s.io"
GATE = f"mutatingwebhookconfiguration-{LWS_MUTATING}-ready"
"""The up's gate on the LWS mutating webhook: its CA injected (so its server is up) before any LeaderWorkerSet."""
TIMEOUT = 600.0


GATE_SECONDS = 30
"""How long the first up's webhook gates wait (Triarch's own wait is five minutes): the manager never starts."""


def pulumi_env(plane: Plane) -> dict[str, str]:
    """The environment every `pulumi` here runs in: the plane's, with no PATH directory that holds the endpoint
    picker's post-renderer (`uv run` puts .venv/bin first), as under pulumi/actions in CI: the Release names the
    post-renderer by a path from the project's root, which Helm resolves in the provider's working directory."""
    env = {**plane.env(), **PASSPHRASE}
    env["PATH"] = os.pathsep.join(d for d in env["PATH"].split(os.pathsep)
                                  if not (d and (Path(d) / "triarch-restrict-pods").exists()))
    return env


def pulumi_command(plane: Plane, argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """argv inside the plane's namespace, and the environment it runs with (pulumi_env)."""
    env = pulumi_env(plane)
    return plane.namespace().command(argv, env), env


def use_program(project: Path, what: str = "", patches: str = "") -> None:
    """Point the scratch project at Triarch's program, or at one that first swaps one of its inputs (`patches`):
    a test's stand-in for a Triarch whose pins differ, the program otherwise Triarch's own."""
    if not patches:
        scratch_project(project)
        return
    program = f'"""Triarch\'s program, {what}."""\n\n{patches}\nfrom triarch.program import main\n\nmain()\n'
    scratch_project(project, program)


@dataclass
class Fresh:
    plane: Plane
    project: Path
    gateless_up: subprocess.CompletedProcess[str]
    """The first up, whose LWS webhook server never starts (its gates wait GATE_SECONDS)."""
    after_gateless_up: dict[str, Any]
    """What the cluster held right after it: each release's status, the LeaderWorkerSets."""
    first_up: subprocess.CompletedProcess[str]
    reached_gate: bool
    """Whether the second up said it was at the LWS webhook's gate before any LeaderWorkerSet was made (the manager
    starts only then)."""

    def pulumi(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv, env = pulumi_command(self.plane, [str(engines.binary("pulumi")), *args, "--stack", STACK,
                                                "--non-interactive"])
        done = subprocess.run(argv, env=env, cwd=self.project, capture_output=True, text=True, timeout=TIMEOUT,
                              check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"pulumi {' '.join(args)} exited {done.returncode}:\n{done.stdout[-4000:]}\n"
                                 f"{done.stderr[-3000:]}")
        return done

    def get(self, *args: str) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.plane.kubectl("get", *args, "-o", "json").stdout)
        return loaded

    def releases(self) -> dict[str, dict[str, Any]]:
        """Helm's release records (its Secrets), the newest revision of each release, decoded."""
        newest: dict[str, dict[str, Any]] = {}
        for secret in self.get("secrets", "-A", "-l", "owner=helm")["items"]:
            record = json.loads(gzip.decompress(base64.b64decode(base64.b64decode(secret["data"]["release"]))))
            if record["name"] not in newest or record["version"] > newest[record["name"]]["version"]:
                newest[record["name"]] = record
        return newest


@pytest.fixture(scope="session")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fresh]:
    """The fresh stack's `pulumi up` on a plane of its own: first with the LWS manager never started (the up fails on
    its webhook gates), then again, the manager started once the up waits."""
    require_engines()
    reference_dir("charts")  # the mirror's archives come from the reference cache
    patch = pytest.MonkeyPatch()
    patch.setenv("TRIARCH_LOCAL_HOME", str(tmp_path_factory.mktemp("fresh-plane")))
    name = f"f{os.getpid()}"
    project = scratch_project(tmp_path_factory.mktemp("fresh-project"))
    document = yaml.safe_load(stack_path(STACK).read_text())
    config = {k: v for k, v in document["config"].items() if k != "triarch:grafanaAdminPassword"}
    config["triarch:cluster"]["kubeconfig"] = str(project / "kubeconfig")
    config["triarch:models"][0]["autoscaling"]["max"] = 2
    config["triarch:models"].insert(1, SECOND_ROUTED)
    [l4] = [g for g in config["triarch:nodeGroups"] if g["name"] == "l4"]
    l4.update(nodes=[*l4["nodes"], "fresh-l4-3"], min=4, max=4)
    (project / f"Pulumi.{STACK}.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    validated = validate_stack_file(STACK, project / f"Pulumi.{STACK}.yaml")
    spec = spec_for_stack(name, validated.stack, [])
    assert "lws-chart" in spec.operators and spec.charts
    late = dataclasses.replace(spec, operators=tuple(o for o in spec.operators if o != "lws-chart"))
    try:
        plane = up(late, log=lambda _: None)
        nothing = subprocess.CompletedProcess([], 0)
        fresh = Fresh(plane, project, nothing, {}, nothing, False)
        fresh.pulumi("stack", "init", "--secrets-provider", "passphrase")
        fresh.pulumi("config", "set", "--secret", "triarch:grafanaAdminPassword", "not-a-real-password")
        use_program(project, f"its webhook gates waiting {GATE_SECONDS} s",
                    f"import triarch.planners.lws\n\ntriarch.planners.lws.WEBHOOK_WAIT_SECONDS = {GATE_SECONDS}\n")
        fresh.gateless_up = fresh.pulumi("up", "--yes", "--skip-preview", check=False)
        fresh.after_gateless_up = {
            "releases": {name: r["info"]["status"] for name, r in fresh.releases().items()},
            "leaderworkersets": fresh.get("leaderworkersets", "-A")["items"]}
        use_program(project)
        argv = [str(engines.binary("pulumi")), "up", "--yes", "--skip-preview", "--stack", STACK,
                "--non-interactive"]
        command, env = pulumi_command(plane, argv)
        running = subprocess.Popen(command, env=env, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True)
        assert running.stdout is not None
        printed = []
        for line in running.stdout:  # the manager starts once the up says it is at the LWS webhook's gate
            printed.append(line)
            if not fresh.reached_gate and GATE in line:
                fresh.reached_gate = plane.kubectl("get", "leaderworkersets", "-A", "-o", "name").stdout.strip() == ""
                start_operator(plane, "lws-chart")
        running.wait(timeout=TIMEOUT)
        fresh.first_up = subprocess.CompletedProcess(argv, running.returncode, "".join(printed), "")
        yield fresh
    finally:
        down(name, quiet=True)
        patch.undo()


def test_a_webhook_that_never_comes_up_fails_the_up_naming_it(fresh: Fresh) -> None:
    """The LWS manager never started: the up waits for the webhook configurations' CA, then fails naming each; every
    release is installed and no LeaderWorkerSet was made (the only thing its webhooks would refuse)."""
    assert fresh.gateless_up.returncode != 0
    said = [line.strip() for line in fresh.gateless_up.stdout.splitlines() if "error" in line.lower()]
    for kind, name in (("mutatingwebhookconfiguration", LWS_MUTATING),
                       ("validatingwebhookconfiguration", "lws-validating-webhook-configuration")):
        assert any(f"{kind}-{name}-ready" in line for line in said), said
    assert fresh.after_gateless_up["releases"] == dict.fromkeys(RELEASES, "deployed")
    assert fresh.after_gateless_up["leaderworkersets"] == []


def test_the_up_waits_for_the_webhooks_server_and_succeeds(fresh: Fresh) -> None:
    assert fresh.reached_gate, f"the up never said it was at {GATE} (or made a LeaderWorkerSet first)"
    errors = [line.strip() for line in fresh.first_up.stdout.splitlines() if "error:" in line]
    assert fresh.first_up.returncode == 0, "\n".join(errors[-6:]) or fresh.first_up.stdout[-2000:]


def test_every_release_is_deployed_at_its_pinned_chart_from_the_mirror(fresh: Fresh) -> None:
    pinned = compat_data("charts")["charts"]
    records = fresh.releases()
    assert set(records) == set(RELEASES)
    for name, record in records.items():
        assert record["info"]["status"] == "deployed", name
        assert record["namespace"] == RELEASES[name], name
        assert record["chart"]["metadata"]["version"] == pinned[CHART_OF[name]]["version"], name
    state = json.loads(fresh.pulumi("stack", "export").stdout)
    charts = {r["inputs"]["name"]: r["inputs"]["chart"] for r in state["deployment"]["resources"]
              if r["type"] == "kubernetes:helm.sh/v3:Release"}
    assert charts == {name: f"oci://127.0.0.1:5000/charts/{CHART_OF[name]}" for name in RELEASES}


def test_every_object_each_chart_renders_is_in_the_cluster(fresh: Fresh) -> None:
    for name, record in fresh.releases().items():
        documents = [d for d in yaml.load_all(record["manifest"], Loader=KubernetesYaml) if d]
        assert documents, name
        for document in documents:  # Helm puts what names no namespace in the release's (kubectl ignores it
            document["metadata"].setdefault("namespace", record["namespace"])  # on cluster-wide kinds)
        found = fresh.plane.kubectl("get", "-f", "-", "-o", "name", input=yaml.safe_dump_all(documents))
        assert len(found.stdout.split()) == len(documents), name


def test_every_workload_the_charts_run_is_ready(fresh: Fresh) -> None:
    for deployment in fresh.get("deployments", "-A")["items"]:
        where = f"{deployment['metadata']['namespace']}/{deployment['metadata']['name']}"
        assert deployment["status"].get("availableReplicas") == deployment["spec"]["replicas"], where
    daemonsets = {d["metadata"]["name"]: d for d in fresh.get("daemonsets", "-A")["items"]}
    for name, daemonset in daemonsets.items():
        assert daemonset["status"].get("numberReady", 0) == daemonset["status"]["desiredNumberScheduled"], name
    gpu_nodes = 12  # four l4 (the stack's three and the one SECOND_ROUTED needs), four a10g and four l40s nodes
    assert daemonsets["nvidia-device-plugin"]["status"]["numberReady"] == gpu_nodes
    assert daemonsets["dcgm-exporter"]["status"]["numberReady"] == gpu_nodes


def test_the_charts_webhooks_are_served_by_the_real_operators(fresh: Fresh) -> None:
    """The LWS manager's pod webhook, called through the chart's webhook configuration and Service, gave the
    group's pods their environment; the KubeRay operator made the RayService's cluster."""
    pods = fresh.get("pods", "-n", "llm", "-l", "leaderworkerset.sigs.k8s.io/name=wide")["items"]
    assert len(pods) == 2
    for pod in pods:
        env = {e["name"] for c in pod["spec"]["containers"] for e in c.get("env") or []}
        assert {"LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"} <= env, pod["metadata"]["name"]
    services = {s["metadata"]["name"]: s for s in fresh.get("services", "-n", "llm")["items"]}
    assert services["wide-0"]["spec"]["clusterIP"] == "None"  # the group's own headless Service, from the controller
    assert services["wide"]["spec"]["clusterIP"] != "None"  # the model's Service, Triarch's
    hook = fresh.get("mutatingwebhookconfiguration", LWS_MUTATING)
    assert hook["webhooks"][0]["clientConfig"]["service"]["name"] == "lws-webhook-service"
    assert fresh.get("rayclusters", "-n", "llm")["items"], "KubeRay made no RayCluster"


def test_the_inference_pool_is_accepted_and_selects_the_models_pods_behind_the_picker(fresh: Fresh) -> None:
    """chat routes by prefix: the chart's InferencePool is stored as inference.networking.k8s.io/v1 (the CRD
    Triarch applies from the mirror, whose schema refuses a pool without targetPorts), selects exactly chat's vLLM
    pods on vLLM's port and names the picker; the two pickers (leader election: its Lease's Role) and the two proxies
    of their own Deployment are ready, and chat's Service sends to the proxies' port, not to the vLLM pods, with one
    proxy kept by a PodDisruptionBudget."""
    pool = fresh.get("inferencepools.inference.networking.k8s.io", "chat-pool", "-n", "llm")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "vllm",
                                                       "app.kubernetes.io/instance": "chat"}
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"]["name"] == "chat-pool-epp"
    selector = ",".join(f"{k}={v}" for k, v in pool["spec"]["selector"]["matchLabels"].items())
    selected = fresh.get("pods", "-n", "llm", "-l", selector)["items"]
    owners = {ref["name"].rsplit("-", 1)[0] for p in selected for ref in p["metadata"]["ownerReferences"]}
    assert selected and owners == {"chat"}, owners  # the chat Deployment's ReplicaSet, and nothing else
    picker = fresh.get("deployment", "chat-pool-epp", "-n", "llm")
    assert picker["status"].get("availableReplicas") == 2
    containers = {c["name"] for c in picker["spec"]["template"]["spec"]["containers"]}
    assert containers == {"epp"}
    [epp] = picker["spec"]["template"]["spec"]["containers"]
    assert "--ha-enable-leader-election" in epp["args"]
    assert fresh.get("role", "chat-pool-epp-leader-election", "-n", "llm")["rules"]
    proxies = fresh.get("deployment", "chat-pool-proxy", "-n", "llm")
    assert proxies["status"].get("availableReplicas") == 2
    assert [c["name"] for c in proxies["spec"]["template"]["spec"]["containers"]] == ["envoy-proxy"]
    assert proxies["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True  # the post-renderer's
    # The post-renderer ran (the chart gives the epp container no context of its own), found by the Release's path
    # from the project's root while no PATH directory of the ups held it.
    assert picker["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    [epp] = [c for c in picker["spec"]["template"]["spec"]["containers"] if c["name"] == "epp"]
    assert epp["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "imagePullSecrets" not in picker["spec"]["template"]["spec"]  # the fresh stack's registry takes none
    assert shutil.which("triarch-restrict-pods", path=pulumi_env(fresh.plane)["PATH"]) is None
    state = json.loads(fresh.pulumi("stack", "export").stdout)
    [release] = [r for r in state["deployment"]["resources"]
                 if r["type"] == "kubernetes:helm.sh/v3:Release" and r.get("inputs", {}).get("name") == "chat-pool"]
    assert release["inputs"]["postrender"] == "./.venv/bin/triarch-restrict-pods"
    service = fresh.get("service", "chat", "-n", "llm")
    assert service["spec"]["selector"] == {"llm-d-router-proxy": "chat-pool-proxy"}
    assert [p["targetPort"] for p in service["spec"]["ports"]] == [8081]
    backends = fresh.get("pods", "-n", "llm", "-l", "llm-d-router-proxy=chat-pool-proxy")["items"]
    assert [p["metadata"]["ownerReferences"][0]["name"].rsplit("-", 1)[0] for p in backends] == ["chat-pool-proxy"] * 2
    budget = fresh.get("poddisruptionbudget", "chat-pool-proxy", "-n", "llm")
    assert (budget["spec"]["minAvailable"], budget["status"].get("expectedPods")) == (1, 2)
    broken = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
              "metadata": {"name": "no-ports", "namespace": "llm"},
              "spec": {"selector": {"matchLabels": {"a": "b"}}, "endpointPickerRef": {"name": "x", "port": {
                  "number": 9002}}}}
    refused = fresh.plane.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(broken), check=False)
    assert refused.returncode != 0 and "targetPorts" in refused.stderr, refused.stderr


def test_two_routed_models_install_their_pickers_side_by_side(fresh: Fresh) -> None:
    """Each picker release has its own Envoy ConfigMap, which its proxies mount: the chart's preset names every one
    `envoy`, and a second release in the namespace failed on it."""
    maps = {m["metadata"]["name"]: m for m in fresh.get("configmaps", "-n", "llm")["items"]}
    assert "envoy" not in maps
    for model in ("chat", "draft"):
        assert "envoy.yaml" in maps[f"{model}-pool-envoy"]["data"]
        assert maps[f"{model}-pool-envoy"]["metadata"]["annotations"]["meta.helm.sh/release-name"] == f"{model}-pool"
        proxies = fresh.get("deployment", f"{model}-pool-proxy", "-n", "llm")
        assert proxies["status"].get("availableReplicas") == 2, model
        volumes = {v["name"]: v for v in proxies["spec"]["template"]["spec"]["volumes"]}
        assert volumes["config"]["configMap"]["name"] == f"{model}-pool-envoy", model


def test_kedas_metrics_api_and_webhook_are_the_charts_served_by_the_real_operator(fresh: Fresh) -> None:
    """KEDA's operator made the chart's certificate Secret and injected its CA into the chart's APIService and
    validating webhook; the metrics adapter answers external.metrics.k8s.io through the chart's Service (an
    APIService with no server would fail every client's discovery, and a namespace's deletion); the operator turned
    the model's ScaledObject into its HPA."""
    def available() -> bool:
        service = fresh.get("apiservice", KEDA_API)
        return any(c["type"] == "Available" and c["status"] == "True" for c in service["status"].get("conditions", []))

    assert eventually(available, 120, 1.0), fresh.get("apiservice", KEDA_API)["status"]
    service = fresh.get("apiservice", KEDA_API)
    assert service["spec"]["service"] == {"name": "keda-operator-metrics-apiserver", "namespace": "keda", "port": 443}
    assert service["spec"].get("caBundle")
    served = json.loads(fresh.plane.kubectl("get", "--raw", f"/apis/{KEDA_API.split('.', 1)[1]}/v1beta1").stdout)
    assert served["groupVersion"] == "external.metrics.k8s.io/v1beta1"
    webhook = fresh.get("validatingwebhookconfiguration", "keda-admission")
    assert all(hook["clientConfig"].get("caBundle") for hook in webhook["webhooks"])
    scaled = fresh.get("scaledobjects", "-n", "llm")["items"]
    assert scaled, "the fresh stack has a ScaledObject"
    wanted = {f"keda-hpa-{each['metadata']['name']}" for each in scaled}
    assert eventually(lambda: wanted <= {h["metadata"]["name"] for h in fresh.get("hpa", "-n", "llm")["items"]},
                      60, 1.0), wanted


CHART_PODS = {"kuberay-operator": ("kuberay-system", "kuberay-operator", "kuberay-operator"),
              "keda-operator": ("keda", "keda-operator", "keda-operator"),
              "keda-operator-metrics-apiserver": ("keda", "keda-operator-metrics-apiserver", "keda-adapter"),
              "lws-controller-manager": ("lws-system", "manager", "lws-manager")}
"""Each chart Deployment whose pod a real operator stands in for: its namespace, container, and the binary."""


def running_commands(binary: str) -> list[list[str]]:
    """The command lines of the running processes of a binary (by its file name)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:  # not a process, or it ended
            continue
        if argv and Path(argv[0].decode()).name == binary:
            found.append([a.decode() for a in argv])
    return found


@pytest.mark.parametrize("deployment", sorted(CHART_PODS))
def test_each_operator_runs_as_its_charts_pod_runs_it(fresh: Fresh, deployment: str) -> None:
    """The operator in the place of each chart pod authenticates as that pod's ServiceAccount (a token the API server
    issued for it: `kubectl auth whoami` with its kubeconfig), so the chart's RBAC is what admits or refuses it,
    and runs the container's arguments as the chart rendered them into the Deployment, in order: each the same,
    but for a listener on every address of the pod (at the pod's address here) and a path under a volume's mount
    path (under the volume's directory here), and the chart's feature gates the KubeRay built (1.6.2, standing in for
    1.7.0) does not have; the plane's own additions come after them."""
    namespace, container_name, binary = CHART_PODS[deployment]
    template = fresh.get("deployment", deployment, "-n", namespace)["spec"]["template"]
    account = template["spec"].get("serviceAccountName", "default")
    kubeconfig = fresh.plane.directory / f"serviceaccount-{deployment}.kubeconfig"
    who = json.loads(fresh.plane.kubectl("auth", "whoami", "--kubeconfig", str(kubeconfig), "-o", "json").stdout)
    assert who["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:{account}"
    [container] = [c for c in template["spec"]["containers"] if c["name"] == container_name]
    rendered = container.get("args", [])
    assert rendered, f"{deployment}: the chart renders no arguments"
    commands = [argv for argv in running_commands(binary) if f"--kubeconfig={kubeconfig}" in argv
                or f"--lister-kubeconfig={kubeconfig}" in argv]
    assert len(commands) == 1, (deployment, running_commands(binary))
    given = commands[0][1:1 + len(rendered)]
    mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
    for chart, running in zip(rendered, given, strict=True):
        flag, _, value = chart.partition("=")
        if flag == "--feature-gates" and binary == "kuberay-operator":  # the gates KubeRay 1.6.2 has, of 1.7.0's
            kept = [gate for gate in value.split(",") if gate.split("=")[0] in KUBERAY_BUILT_GATES]
            assert running == f"{flag}={','.join(kept)}" and "RayClusterStatusConditions=true" in kept, running
        elif value.startswith(":"):
            assert running.startswith(f"{flag}=198.18.") and running.endswith(value), (chart, running)
        elif any(mount in value for mount in mounts):
            assert running.startswith(f"{flag}={fresh.plane.directory}"), (chart, running)
        else:
            assert running == chart


def test_kedas_metrics_api_answers_only_through_a_service_that_selects_the_adapters_pod(fresh: Fresh) -> None:
    """The adapter serves at its chart pod's address alone, as in a cluster: the APIService's Service pointed at
    another pod of the release (the operator's, which serves no metrics API) makes the API unavailable, and put back
    it is available again. A chart whose Service selected the wrong pod would fail here, not pass on a listener that
    answers at every address."""
    service = ("service", "keda-operator-metrics-apiserver", "-n", "keda")
    selector = fresh.get(*service)["spec"]["selector"]
    assert selector == {"app": "keda-operator-metrics-apiserver"}, selector

    def available(wanted: str) -> Callable[[], bool]:
        def condition() -> bool:
            conditions = fresh.get("apiservice", KEDA_API)["status"].get("conditions", [])
            return any(c["type"] == "Available" and c["status"] == wanted for c in conditions)
        return condition

    def select(labels: dict[str, str]) -> None:
        patch = json.dumps({"spec": {"selector": labels}})
        fresh.plane.kubectl("patch", *service, "--type=merge", "-p", patch)

    assert eventually(available("True"), 120, 1.0)
    select({"app": "keda-operator"})
    try:
        assert eventually(available("False"), 120, 1.0), fresh.get("apiservice", KEDA_API)["status"]
    finally:
        select(selector)
    assert eventually(available("True"), 120, 1.0), fresh.get("apiservice", KEDA_API)["status"]


def test_the_dcgm_exporter_runs_with_no_capability(fresh: Fresh) -> None:
    """Its chart adds SYS_ADMIN; Triarch's values replace the list with an empty one, which reaches Helm only with
    null values allowed (the provider drops empty lists otherwise)."""
    daemonset = fresh.get("daemonset", "dcgm-exporter", "-n", "gpu-monitoring")
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    capabilities = container["securityContext"]["capabilities"]
    assert not capabilities.get("add") and capabilities["drop"] == ["ALL"]


def test_what_the_charts_render_passes_the_guardrails_with_the_packs_config(fresh: Fresh, tmp_path: Path) -> None:
    """Each release as Helm rendered it, judged by `triarch check --manifests`' rules with the pack's config: no
    mandatory finding; the node agents that need a privilege are the exemptions policies/config.json lists, each
    with its reason."""
    config = load_policy_config(ROOT / "policies" / "config.json")
    exempted = {e["name"] for e in config["no-privileged-pods"]["exempt"]}
    without = {**config, "no-privileged-pods": {**config["no-privileged-pods"], "exempt": []}}
    flagged = set()
    for name, record in fresh.releases().items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(record["manifest"])
        findings = evaluate(read_manifests([str(path)]), config)
        assert [f.message for f in findings if f.enforcement == "mandatory"] == [], name
        flagged |= {f.message.split()[1].rstrip(":") for f in evaluate(read_manifests([str(path)]), without)
                    if f.rule.name == "no-privileged-pods"}
    assert flagged == exempted  # each exemption is needed, and none is missing


def test_every_pod_template_the_charts_render_is_admitted_by_its_namespaces_pod_security(fresh: Fresh) -> None:
    """Each pod template of every release, dry-run as a Pod in the release's namespace: admitted by the level its
    namespace enforces, and no Pod Security warning."""
    checked, refused = 0, []
    for record in fresh.releases().values():
        for document in yaml.load_all(record["manifest"], Loader=KubernetesYaml):
            if document and pod_templates(document):
                refused += refused_as_pod(fresh.plane, document, record["namespace"])
                checked += len(pod_templates(document))
    assert refused == []
    assert checked >= 12


BUMPED = "dcgm-exporter"
"""The chart the bump and the failure paths change: a plain chart (one DaemonSet, its Service and ServiceMonitor)."""


def repack(archive: Path, version: str, into: Path, schema: dict[str, Any] | None = None) -> Path:
    """The chart archive as another version of it: its Chart.yaml's version changed (a values.schema.json added,
    where given), every other file as packaged. What a chart bump brings, short of new templates."""
    name = read_archive(archive).name
    out = io.BytesIO()
    with tarfile.open(archive, "r:gz") as source, tarfile.open(fileobj=out, mode="w:gz") as target:
        for member in source.getmembers():
            data = source.extractfile(member).read() if member.isfile() else None  # type: ignore[union-attr]
            if member.name == f"{name}/Chart.yaml" and data is not None:
                data = yaml.safe_dump({**yaml.safe_load(data), "version": version}, sort_keys=False).encode()
                member.size = len(data)
            target.addfile(member, io.BytesIO(data) if data is not None else None)
        if schema is not None:
            extra = tarfile.TarInfo(f"{name}/values.schema.json")
            body = json.dumps(schema).encode()
            extra.size = len(body)
            target.addfile(extra, io.BytesIO(body))
    path = into / f"{name}-{version}.tgz"
    path.write_bytes(out.getvalue())
    return path


def push(fresh: Fresh, archive: Path) -> None:
    """Into the plane's mirror, as a company loads its own (`helm push`)."""
    fresh.plane.run([sys.executable, "-m", "triarch.local.mirror", f"https://{MIRROR_ADDRESS}", MIRROR_PATH,
                     str(fresh.plane.trust_bundle), str(archive)])


def with_chart_version(fresh: Fresh, compat: Path, version: str) -> None:
    """Triarch's program with the bumped chart pinned at `version` (its compat data copied into `compat`, as a
    release of Triarch that bumps the pin would ship it)."""
    if not compat.is_dir():
        shutil.copytree(COMPAT_DIR, compat)
    charts_file = compat / "charts.yaml"
    document = yaml.safe_load(charts_file.read_text())
    document["charts"][BUMPED]["version"] = version
    charts_file.write_text(yaml.safe_dump(document, sort_keys=False))
    use_program(fresh.project, f"{BUMPED} pinned at {version}",
                f"from pathlib import Path\n\nimport triarch.catalog\n\n"
                f"triarch.catalog.COMPAT_DIR = Path({str(compat)!r})\n")


def pinned_version(name: str) -> str:
    return str(compat_data("charts")["charts"][name]["version"])


def test_a_chart_bump_and_a_values_edit_are_in_place_release_updates(
        fresh: Fresh, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The DCGM exporter's chart one version on (pushed to the mirror) and the retention edited: each release an
    in-place update in `pulumi preview --refresh` (as the workflows preview), and every other resource of the stack
    unchanged there (the second preview changes nothing else), and in `triarch diff`; the up makes a second revision
    of each."""
    stack_file = fresh.project / f"Pulumi.{STACK}.yaml"
    assert main(["plan", "--stack-file", str(stack_file), "--out", str(tmp_path / "base")]) == 0
    bumped = "4.8.3"
    assert pinned_version(BUMPED) == "4.8.2"  # the scenario's archive is the pinned one
    push(fresh, repack(reference_dir("charts") / f"{BUMPED}-4.8.2.tgz", bumped, tmp_path))
    with_chart_version(fresh, tmp_path / "compat", bumped)
    document = yaml.safe_load(stack_file.read_text())
    document["config"]["triarch:observability"]["retention"] = "30d"
    stack_file.write_text(yaml.safe_dump(document, sort_keys=False))
    # As the workflows preview (refresh: true): after a failed up, a resource whose create failed keeps its error
    # in the state until an up or a refresh reads it again, and a plain preview lists it as an update.
    preview = json.loads(fresh.pulumi("preview", "--refresh", "--json").stdout)
    state = json.loads(fresh.pulumi("stack", "export").stdout)["deployment"]["resources"]
    urns = {r["urn"] for r in state if not r["type"].startswith(("pulumi:providers:", "pulumi:pulumi:"))}
    assert len(urns) > 50 and urns <= {step["urn"] for step in preview["steps"]}  # every resource judged, each
    # `same` (or only refreshed) but the two edited:
    steps = [step for step in preview["steps"] if step["op"] not in ("same", "refresh")]
    changed = {step["urn"].rsplit("::", 1)[1]: step["op"] for step in steps}
    assert changed == {"kube-prometheus-stack": "update", BUMPED: "update"}, [
        (step["urn"], step.get("diffReasons"), step.get("detailedDiff")) for step in steps]
    monkeypatch.setattr(triarch.catalog, "COMPAT_DIR", tmp_path / "compat")
    triarch.catalog.charts.cache_clear()
    try:
        capsys.readouterr()
        main(["diff", "--base", str(tmp_path / "base"), "--stack-file", str(stack_file), "--format", "json"])
        diff = json.loads(capsys.readouterr().out)
    finally:
        monkeypatch.undo()
        triarch.catalog.charts.cache_clear()
    causes = sorted((c["name"], c["cause"]) for c in diff["changed"])
    assert causes == [(BUMPED, "updated in place"), ("kube-prometheus-stack", "updated in place")]
    assert diff["replaced"] == [] and diff["removed"] == [] and diff["added"] == []
    fresh.pulumi("up", "--yes", "--skip-preview")
    records = fresh.releases()
    assert records[BUMPED]["version"] == 2 and records[BUMPED]["info"]["status"] == "deployed"
    assert records[BUMPED]["chart"]["metadata"]["version"] == bumped
    assert records["kube-prometheus-stack"]["version"] == 2
    [prometheus] = fresh.get("prometheuses", "-n", "monitoring")["items"]
    assert prometheus["spec"]["retention"] == "30d"


def failed_up(fresh: Fresh) -> str:
    """An up of the edited release expected to fail: the release's own diagnostic, which Pulumi prints whole after
    its summary ("Diagnostics:", under the resource's URN); Helm's message runs over several lines. The up targets
    the release (`--target`, as one retries a single resource), so the engine asks the provider about it alone:
    the other releases are unchanged (the bump's preview shows every other resource `same`), and each would
    otherwise be rendered by Helm again only to say so."""
    state = json.loads(fresh.pulumi("stack", "export").stdout)["deployment"]["resources"]
    [urn] = [r["urn"] for r in state if r["type"] == "kubernetes:helm.sh/v3:Release" and r["inputs"]["name"] == BUMPED]
    done = fresh.pulumi("up", "--yes", "--skip-preview", "--target", urn, check=False)
    assert done.returncode != 0, done.stdout[-3000:]
    return done.stdout + done.stderr


def test_a_chart_whose_schema_refuses_a_value_fails_the_up_and_changes_nothing(
        fresh: Fresh, tmp_path: Path) -> None:
    """A chart version whose values.schema.json wants a string where Triarch gives a boolean: Helm refuses before
    it applies anything (atomic has nothing to roll back), naming the chart, the key and both types; the release
    stays at its last revision, deployed, and no failed revision is recorded."""
    before = fresh.releases()[BUMPED]
    strict = {"type": "object", "properties": {"serviceMonitor": {"type": "object", "properties": {
        "honorLabels": {"type": "string"}}}}}
    push(fresh, repack(reference_dir("charts") / f"{BUMPED}-4.8.2.tgz", "4.8.4", tmp_path, strict))
    with_chart_version(fresh, tmp_path / "compat", "4.8.4")
    said = failed_up(fresh)
    assert "values don't meet the specifications of the schema(s) in the following chart(s):" in said, said
    # Helm 3.18's schema validator (santhosh-tekuri/jsonschema v6): the key as a JSON pointer, both types.
    assert f"{BUMPED}:\n" in said and "at '/serviceMonitor/honorLabels': got boolean, want string" in said, said[-3000:]
    after = fresh.releases()[BUMPED]
    assert (after["version"], after["info"]["status"]) == (before["version"], "deployed")
    assert after["chart"]["metadata"]["version"] == before["chart"]["metadata"]["version"]


def test_a_chart_missing_from_the_mirror_fails_the_up_naming_both(fresh: Fresh, tmp_path: Path) -> None:
    """A pin the mirror does not hold: the up fails naming the chart, its version and the mirror; nothing
    changes."""
    before = fresh.releases()[BUMPED]
    with_chart_version(fresh, tmp_path / "compat", "4.8.9")
    said = failed_up(fresh)
    assert f"{MIRROR_ADDRESS}/{MIRROR_PATH}/{BUMPED}" in said and "4.8.9" in said, said
    after = fresh.releases()[BUMPED]
    assert (after["version"], after["info"]["status"]) == (before["version"], "deployed")
    use_program(fresh.project)


def ended_at_once(fresh: Fresh, watch: subprocess.Popen[bytes]) -> None:
    """Each pod being deleted, ended as soon as the watch shows it: kwok ends one at a random moment within its grace
    period (a vLLM pod's is its drain, minutes), which the namespace's deletion would wait out; these servers hold no
    request, and what the destroy shows is its order, not the drain. Returns when the watch ends."""
    ended: set[str] = set()
    for pod in watched(watch):
        meta = pod["metadata"]
        if meta.get("deletionTimestamp") and meta["uid"] not in ended:
            ended.add(meta["uid"])
            fresh.plane.kubectl("delete", "pod", meta["name"], "-n", meta["namespace"], "--grace-period=0", "--force",
                                "--wait=false", check=False)


def test_destroy_leaves_no_release_and_only_the_crds_kept_by_design(fresh: Fresh) -> None:
    kubectl = [str(engines.binary("kubectl")), "--kubeconfig", str(fresh.plane.kubeconfig)]
    watch = subprocess.Popen(fresh.plane.command([*kubectl, "get", "pods", "-A", "--watch", "-o", "json"]),
                             env=fresh.plane.env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    ender = threading.Thread(target=ended_at_once, args=(fresh, watch), daemon=True)
    ender.start()
    try:
        fresh.pulumi("destroy", "--yes", "--skip-preview")
    finally:
        watch.terminate()
        ender.join()
    assert fresh.get("secrets", "-A", "-l", "owner=helm")["items"] == []
    namespaces = {n["metadata"]["name"] for n in fresh.get("namespaces")["items"]}
    assert not namespaces & {*RELEASES.values(), "llm"}
    kept = {c["metadata"]["name"]: c for c in fresh.get("crds")["items"]}
    retained_by_triarch = {"ray.io", "leaderworkerset.x-k8s.io", "disaggregatedset.x-k8s.io",
                           "inference.networking.k8s.io"}  # the InferencePool's, applied apart from the picker's chart
    helm_crds_dir = {"nfd.k8s-sigs.io"}  # node-feature-discovery's crds/ (a device plugin subchart): Helm keeps those
    for name, crd in kept.items():
        group = crd["spec"]["group"]
        keep = (crd["metadata"].get("annotations") or {}).get("helm.sh/resource-policy") == "keep"
        assert group in retained_by_triarch | helm_crds_dir or keep, f"{name} outlived its release"
    assert {"rayservices.ray.io", "leaderworkersets.leaderworkerset.x-k8s.io",
            "inferencepools.inference.networking.k8s.io"} <= set(kept)
