"""Operators a local plane runs out of cluster, as processes in its network namespace: the real controllers a stack
says the cluster runs (`existing`), built from their Go modules like the engines. Each runs against the plane's
kubeconfig with leader election off and its metrics, health and service ports moved off their defaults, on
loopback or on the plane's own aggregated-API address."""

from __future__ import annotations

import base64
import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triarch.local.engines import binary
from triarch.local.kubelet import CONTAINER_ARGS, POD_IP, AsPod
from triarch.local.pki import Pki, issue
from triarch.local.plane import Plane, PlaneSpec
from triarch.planners.serving import KUBERAY_NAMESPACE

AGGREGATED_IP = "198.18.0.1"
"""The plane's address for aggregated APIs (an operator's metrics API), on its `lo` (triarch.local.plane
LOCAL_ADDRESSES): the API server routes to an APIService's endpoints, and Kubernetes refuses loopback addresses
there."""
KEDA_NAMESPACE = "keda"
KEDA_GRPC = "127.0.0.1:9666"
KEDA_ADAPTER_PORT = 6444


@dataclass(frozen=True)
class Operator:
    """What running one operator takes: its processes (name -> argv, in start order), their environment, and the
    objects the cluster holds for it (its namespace, the Service and endpoints of an aggregated API, ...)."""

    name: str
    processes: dict[str, list[str]]
    env: dict[str, str] = field(default_factory=dict)
    objects: list[dict[str, Any]] = field(default_factory=list)
    crds: list[Path] = field(default_factory=list)
    """CRDs of its own, installed before it starts (the chart's CRD sets come with the plane's spec)."""
    ready: str | None = None
    """A health endpoint (inside the plane's namespace) that answers once it runs."""


def _namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def aggregated_api(group: str, version: str, service: str, namespace: str, port: int, ca: bytes
                   ) -> list[dict[str, Any]]:
    """An APIService with a selector-less Service whose one endpoint is the operator's process."""
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": service, "namespace": namespace},
         "spec": {"ports": [{"port": 443, "targetPort": port, "protocol": "TCP"}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": f"{service}-local", "namespace": namespace,
                      "labels": {"kubernetes.io/service-name": service}},
         "addressType": "IPv4", "endpoints": [{"addresses": [AGGREGATED_IP], "conditions": {"ready": True}}],
         "ports": [{"port": port, "protocol": "TCP"}]},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": f"{version}.{group}"},
         "spec": {"group": group, "version": version, "groupPriorityMinimum": 100, "versionPriority": 100,
                  "service": {"name": service, "namespace": namespace, "port": 443},
                  "caBundle": base64.b64encode(ca).decode()}},
    ]


def keda(plane: Plane, pki: Pki, spec: PlaneSpec) -> Operator:
    """KEDA's operator (ScaledObjects to HPAs; the gRPC metrics service) and its metrics adapter (the
    external.metrics.k8s.io API the HPA controller reads), sharing one certificate as the chart's secret does."""
    certs = plane.directory / "keda-certs"
    certs.mkdir(exist_ok=True)
    pair = issue(pki, "keda", common="keda-operator", client=True, ips=("127.0.0.1", AGGREGATED_IP),
                 dns=("keda-operator", f"keda-operator.{KEDA_NAMESPACE}.svc",
                      f"keda-metrics-apiserver.{KEDA_NAMESPACE}.svc"))
    for source, name in ((pki.ca, "ca.crt"), (pair.cert, "tls.crt"), (pair.key, "tls.key")):
        shutil.copy2(source, certs / name)
    kube = str(plane.kubeconfig)
    operator = [str(binary("keda-operator")), f"--kubeconfig={kube}", "--leader-elect=false",
                "--metrics-bind-address=127.0.0.1:18080", "--health-probe-bind-address=127.0.0.1:18081",
                f"--metrics-service-bind-address={KEDA_GRPC}", f"--cert-dir={certs}", "--enable-cert-rotation=false",
                "--enable-webhook-patching=false", "--enable-apiservice-patching=false", "--zap-log-level=info"]
    adapter = [str(binary("keda-adapter")), f"--lister-kubeconfig={kube}", f"--authentication-kubeconfig={kube}",
               f"--authorization-kubeconfig={kube}", f"--bind-address={AGGREGATED_IP}",
               f"--secure-port={KEDA_ADAPTER_PORT}", f"--cert-dir={certs}", f"--tls-cert-file={certs / 'tls.crt'}",
               f"--tls-private-key-file={certs / 'tls.key'}", f"--metrics-service-address={KEDA_GRPC}",
               "--port=18082", "--v=1"]
    return Operator(
        "keda", {"keda-operator": operator, "keda-adapter": adapter},
        env={"WATCH_NAMESPACE": "", "KEDA_CLUSTER_OBJECT_NAMESPACE": KEDA_NAMESPACE, "POD_NAMESPACE": KEDA_NAMESPACE},
        ready="http://127.0.0.1:18081/healthz",
        objects=[_namespace(KEDA_NAMESPACE),
                 *aggregated_api("external.metrics.k8s.io", "v1beta1", "keda-metrics-apiserver", KEDA_NAMESPACE,
                                 KEDA_ADAPTER_PORT, pki.ca.read_bytes())])


def karpenter(plane: Plane, pki: Pki, spec: PlaneSpec) -> Operator:
    """Karpenter's kwok provider: the core's provisioning, scheduling simulation, disruption and consolidation, with
    kwok nodes (annotated for the plane's kwok) in place of instances, of the types `spec.instance_types` offers."""
    types = plane.directory / "instance-types.json"
    types.write_text(json.dumps(spec.instance_types, indent=1))
    crds = binary("karpenter-kwok").parent / "karpenter-kwok-crds"
    return Operator(
        "karpenter", {"karpenter": [str(binary("karpenter-kwok"))]},
        # CapacityBuffer on, as the chart's settings.featureGates.capacityBuffer sets it for a stack with warm
        # capacity (its CRD comes with the karpenter CRD set); without a buffer the gate changes nothing.
        env={"DISABLE_LEADER_ELECTION": "true", "METRICS_PORT": "18090", "HEALTH_PROBE_PORT": "18091",
             "INSTANCE_TYPES_FILE_PATH": str(types), "LOG_LEVEL": "info", "FEATURE_GATES": "CapacityBuffer=true"},
        crds=sorted(crds.glob("*.yaml")), ready="http://127.0.0.1:18091/healthz")


def kuberay(plane: Plane, pki: Pki, spec: PlaneSpec) -> Operator:
    """The KubeRay operator: RayServices to RayClusters to head and worker pods. The pods are kwok's: nothing
    answers on a Ray head's dashboard unless a test puts a stand-in on the pods' addresses, so without one no
    RayService reports Ready; what the operator creates is real either way."""
    return Operator("kuberay", {"kuberay-operator": [
        str(binary("kuberay-operator")), f"--kubeconfig={plane.kubeconfig}", "--enable-leader-election=false",
        "--metrics-addr=127.0.0.1:18070", "--health-probe-bind-address=127.0.0.1:18071",
        # The dashboard and serve proxies through the API server (to the pods' addresses, which are the plane's
        # own), not through cluster DNS, which the plane does not run.
        "--use-kubernetes-proxy"]}, ready="http://127.0.0.1:18071/healthz")


PROMETHEUS_OPERATOR_HEALTH = "http://127.0.0.1:18060/healthz"


def prometheus_operator(plane: Plane, pki: Pki, spec: PlaneSpec) -> Operator:
    """The Prometheus Operator a cluster runs (`existing`): a Prometheus resource's PodMonitors and PrometheusRules
    turned into its scrape configuration (a Secret) and rule files (ConfigMaps), which a Prometheus reads. Its own
    CRD here is the Prometheus kind; the monitor kinds come with the plane's `existing` CRD set. The StatefulSet it
    makes runs on kwok: the Prometheus that scrapes is a process a test starts from that Secret."""
    crds = binary("prometheus-operator").parent / "prometheus-operator-crds"
    return Operator(
        "prometheus-operator", {"prometheus-operator": [
            str(binary("prometheus-operator")), "--web.listen-address=127.0.0.1:18060", "--log-level=info"]},
        env={"KUBECONFIG": str(plane.kubeconfig)}, crds=sorted(crds.glob("*.yaml")), ready=PROMETHEUS_OPERATOR_HEALTH)


LWS_WEBHOOK_PORT = 9443
LWS_CHART_MANAGER = "lws-controller-manager"
"""The lws chart's manager Deployment (release `lws`), whose pod the manager stands in for."""
LWS_WEBHOOKS = {
    "mutate": [("mleaderworkerset.kb.io", "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset", "leaderworkersets"),
               ("mpod.kb.io", "/mutate--v1-pod", "pods")],
    "validate": [("vleaderworkerset.kb.io", "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
                  "leaderworkersets"), ("vpod.kb.io", "/validate--v1-pod", "pods")],
}
"""The LeaderWorkerSet webhooks (the manager's kubebuilder markers, the chart's webhook.yaml): the set's defaults
and checks, and the pod webhook that gives a group's pods their labels and LWS_* environment."""


def _lws_webhooks(kind: str, ca: bytes) -> dict[str, Any]:
    """The chart's webhook configuration, calling the manager at the plane's address instead of its Service."""
    hooks = []
    for name, path, resource in LWS_WEBHOOKS[kind]:
        pods = resource == "pods"
        hook: dict[str, Any] = {
            "name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
            "clientConfig": {"url": f"https://{AGGREGATED_IP}:{LWS_WEBHOOK_PORT}{path}",
                             "caBundle": base64.b64encode(ca).decode()},
            "rules": [{"apiGroups": ["" if pods else "leaderworkerset.x-k8s.io"], "apiVersions": ["v1"],
                       "operations": ["CREATE"] if pods and kind == "mutate" else ["CREATE", "UPDATE"],
                       "resources": [resource]}]}
        if pods:
            hook["objectSelector"] = {"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name",
                                                            "operator": "Exists"}]}
        hooks.append(hook)
    kind_name = "MutatingWebhookConfiguration" if kind == "mutate" else "ValidatingWebhookConfiguration"
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind_name,
            "metadata": {"name": f"lws-{kind}-webhook-configuration"}, "webhooks": hooks}


def lws(plane: Plane, pki: Pki, spec: PlaneSpec) -> Operator:
    """The LeaderWorkerSet controller: a set's groups as a leader StatefulSet and one worker StatefulSet per group,
    its headless Service, and the webhooks (served here, with a certificate from the plane's CA in place of the
    manager's own rotation, which wants an in-cluster Service)."""
    certs = plane.directory / "lws-certs"
    certs.mkdir(exist_ok=True)
    pair = issue(pki, "lws-webhook", ips=(AGGREGATED_IP,), dns=("lws-webhook-service.lws-system.svc",))
    for source, name in ((pair.cert, "tls.crt"), (pair.key, "tls.key")):
        shutil.copy2(source, certs / name)
    config = plane.directory / "lws-config.yaml"
    config.write_text(json.dumps({
        "apiVersion": "config.lws.x-k8s.io/v1alpha1", "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "health": {"healthProbeBindAddress": "127.0.0.1:18101"}, "metrics": {"bindAddress": "127.0.0.1:18100"},
        "webhook": {"port": LWS_WEBHOOK_PORT, "host": AGGREGATED_IP, "certDir": str(certs)},
        "internalCertManagement": {"enable": False}}, indent=1))
    crds = binary("lws-manager").parent / "lws-crds"
    return Operator(
        "lws", {"lws-manager": [str(binary("lws-manager")), f"--kubeconfig={plane.kubeconfig}",
                                f"--config={config}", "--zap-log-level=info"]},
        objects=[_lws_webhooks("mutate", pki.ca.read_bytes()), _lws_webhooks("validate", pki.ca.read_bytes())],
        crds=sorted(crds.glob("*.yaml")), ready="http://127.0.0.1:18101/healthz")


def _when(kind_name: str, namespace: str | None, argv: list[str], pod: AsPod | None = None) -> list[str]:
    """argv, started once the object exists (triarch.local.kubelet), as a kubelet starts a chart's pod once Helm
    installed it; with `pod`, as the stand-in of a pod of the chart's Deployment (AsPod), once it has an address."""
    placing: list[str] = []
    if pod is not None:
        placing = ["--as-pod", pod.deployment,
                   *(["--service-account-kubeconfig", str(pod.kubeconfig)] if pod.kubeconfig else []),
                   *(["--container", pod.container] if pod.container else []),
                   *(part for volume, directory in pod.mounts for part in ("--mount", f"{volume}={directory}")),
                   *(["--volumes", str(pod.volumes)] if pod.volumes else []),
                   *(part for volume, key, value in pod.edits for part in ("--edit", f"{volume}:{key}={value}")),
                   *(["--known-gates", ",".join(pod.known_gates)] if pod.known_gates is not None else [])]
    return [sys.executable, "-m", "triarch.local.kubelet", "start-when", kind_name,
            *(["-n", namespace] if namespace else []), *placing, "--", *argv]


def _account_kubeconfig(plane: Plane, deployment: str) -> Path:
    """Where the kubeconfig of a chart Deployment's ServiceAccount is written for the process in its pod's place."""
    return plane.directory / f"serviceaccount-{deployment}.kubeconfig"


def _secret_volume(name: str, namespace: str, directory: Path) -> list[str]:
    """A Secret's keys kept as files in `directory` (triarch.local.kubelet), as the pod's Secret volume is."""
    return [sys.executable, "-m", "triarch.local.kubelet", "mount-secret", name, "-n", namespace, str(directory)]


def lws_chart(plane: Plane, pki: Pki, spec: PlaneSpec) -> Operator:
    """The LeaderWorkerSet manager in place of the pod Triarch's lws release runs, as that pod runs: with its
    ServiceAccount's rights, the container's arguments and the chart's ConfigMap as its configuration (internal
    certificate management: it fills the chart's Secret and injects its CA into the chart's webhook configurations
    and the CRD's conversion webhook). What the plane changes, each because the process is not in a pod: its
    listeners at the pod's address (the chart leaves them at every address: the webhooks in the configuration,
    health and metrics by their defaults), and its certificate directory at the Secret volume's directory here
    (a pod mounts it at the configuration's default path). Starts once the chart's Secret exists and its pod has an
    address."""
    certs = plane.directory / "lws-chart-certs"
    certs.mkdir(exist_ok=True)
    account = _account_kubeconfig(plane, LWS_CHART_MANAGER)
    manager = [str(binary("lws-manager")), CONTAINER_ARGS, f"--kubeconfig={account}",
               f"--health-probe-bind-address={POD_IP}:8081", f"--metrics-bind-address={POD_IP}:8443"]
    pod = AsPod(f"deployment/{LWS_CHART_MANAGER}", account, "manager", (("cert", certs),),
                plane.directory / "lws-chart-volumes",
                (("manager-config", "webhook.host", POD_IP), ("manager-config", "webhook.certDir", str(certs))))
    return Operator("lws-chart", {
        "lws-cert-volume": _secret_volume("lws-webhook-server-cert", "lws-system", certs),
        "lws-manager": _when("secret/lws-webhook-server-cert", "lws-system", manager, pod)},
        env={"TRIARCH_KUBECTL": str(binary("kubectl"))})


def _restarting(argv: list[str]) -> list[str]:
    """argv, started again whenever it exits (triarch.local.kubelet), as a kubelet restarts a pod's container."""
    return [sys.executable, "-m", "triarch.local.kubelet", "restart-always", "--", *argv]


KEDA_CHART_SECRET = "kedaorg-certs"
KEDA_CHART_OPERATOR = "keda-operator"
KEDA_CHART_ADAPTER = "keda-operator-metrics-apiserver"
"""The chart's operator and metrics adapter Deployments, whose pods the two processes stand in for."""
KEDA_CHART_ADAPTER_PORT = 6443
"""The chart's `service.portHttpsTarget`: where its APIService's Service sends the API server."""


def keda_chart(plane: Plane, pki: Pki, spec: PlaneSpec) -> Operator:
    """KEDA's operator and metrics adapter in place of the pods of Triarch's keda release, as those pods run: with
    their ServiceAccounts' rights and their containers' arguments and environment as the chart rendered them. The
    operator makes the chart's certificate Secret, generates its CA and certificate into it, injects the CA into the
    chart's APIService and validating webhook, and exits once to start again with it (as its pod would); the
    adapter serves external.metrics.k8s.io on the chart's target port at its pod's address alone, so the
    APIService's Service reaches it only if its selector picks that pod. What the plane changes, each because the
    processes are not in pods: the namespace a pod reads from its token volume (KEDA_CLUSTER_OBJECT_NAMESPACE), the
    listeners the chart leaves at their defaults (every address) at the pod's address, the adapter's metrics port
    (`--port`, every address whatever is given) off the pods' ports, and the operator's gRPC metrics service on
    loopback, where the adapter reaches it (no cluster DNS here; the TLS name stays the Service's); the adapter's
    delegated authentication and listers read its account's kubeconfig (a pod's in-cluster configuration). Both
    start once the chart's Deployment exists and their pods have addresses. The chart's admission webhook server is
    not run: its webhook fails open (`failurePolicy: Ignore`)."""
    certs = plane.directory / "keda-chart-certs"
    certs.mkdir(exist_ok=True)
    kube, adapter_kube = (_account_kubeconfig(plane, d) for d in (KEDA_CHART_OPERATOR, KEDA_CHART_ADAPTER))
    operator = [str(binary("keda-operator")), CONTAINER_ARGS, f"--kubeconfig={kube}",
                f"--health-probe-bind-address={POD_IP}:8081", f"--metrics-service-bind-address={KEDA_GRPC}"]
    adapter = [str(binary("keda-adapter")), CONTAINER_ARGS, f"--lister-kubeconfig={adapter_kube}",
               f"--authentication-kubeconfig={adapter_kube}", f"--authorization-kubeconfig={adapter_kube}",
               f"--bind-address={POD_IP}", "--port=18082", f"--metrics-service-address={KEDA_GRPC}",
               f"--metrics-service-grpc-authority=keda-operator.{KEDA_NAMESPACE}.svc.cluster.local"]
    return Operator("keda-chart", {
        "keda-cert-volume": _secret_volume(KEDA_CHART_SECRET, KEDA_NAMESPACE, certs),
        "keda-operator": _when(f"deployment/{KEDA_CHART_OPERATOR}", KEDA_NAMESPACE, _restarting(operator),
                               AsPod(f"deployment/{KEDA_CHART_OPERATOR}", kube, KEDA_CHART_OPERATOR,
                                     (("certificates", certs),))),
        "keda-adapter": _when(f"secret/{KEDA_CHART_SECRET}", KEDA_NAMESPACE, _restarting(adapter),
                              AsPod(f"deployment/{KEDA_CHART_ADAPTER}", adapter_kube, KEDA_CHART_ADAPTER,
                                    (("certificates", certs),)))},
        # A pod reads its namespace from its token volume (/var/run/secrets/kubernetes.io/serviceaccount), which a
        # process here has not; KEDA takes it from this variable first.
        env={"TRIARCH_KUBECTL": str(binary("kubectl")), "KEDA_CLUSTER_OBJECT_NAMESPACE": KEDA_NAMESPACE})


KUBERAY_CHART_OPERATOR = "kuberay-operator"
KUBERAY_BUILT_GATES = ("RayClusterStatusConditions", "RayJobDeletionPolicy", "RayMultiHostIndexing",
                       "RayServiceIncrementalUpgrade", "RayCronJob", "AsyncJobInfoQuery")
"""The feature gates of the KubeRay built (1.6.2, ray-operator/pkg/features/features.go): the pinned chart (1.7.0)
also names RayClusterMTLS, RayClusterNetworkPolicy and RayClusterHistoryServer (all off by default), which 1.6.2
refuses to start on; the plane drops what 1.6.2 lacks, and says so."""


def kuberay_chart(plane: Plane, pki: Pki, spec: PlaneSpec) -> Operator:
    """The KubeRay operator in place of the pod Triarch's kuberay-operator release runs, as that pod runs: with its
    ServiceAccount's rights and the container's arguments and environment as the chart rendered them. What the
    plane changes, each because the process is not in a pod: its listeners at the pod's address (the chart leaves
    them at their defaults, every address), the leader election's namespace (a pod reads it from its token volume),
    the dashboards and Serve proxies reached through the API server (to the pods' addresses, which are the plane's
    own), not through cluster DNS, which the plane does not run; and the chart's feature gates the KubeRay built does
    not have (KUBERAY_BUILT_GATES) dropped. Starts once the RayService CRD Triarch applies beside the chart is there
    and the chart's pod has an address."""
    account = _account_kubeconfig(plane, KUBERAY_CHART_OPERATOR)
    argv = [str(binary("kuberay-operator")), CONTAINER_ARGS, f"--kubeconfig={account}",
            f"--metrics-addr={POD_IP}:8080", f"--health-probe-bind-address={POD_IP}:8082",
            f"--leader-election-namespace={KUBERAY_NAMESPACE}", "--use-kubernetes-proxy"]
    as_pod = _when(f"deployment/{KUBERAY_CHART_OPERATOR}", KUBERAY_NAMESPACE, argv,
                   AsPod(f"deployment/{KUBERAY_CHART_OPERATOR}", account, KUBERAY_CHART_OPERATOR,
                         known_gates=KUBERAY_BUILT_GATES))
    return Operator("kuberay-chart", {"kuberay-operator": _when("crd/rayservices.ray.io", None, as_pod)},
                    env={"TRIARCH_KUBECTL": str(binary("kubectl"))})


OPERATORS: dict[str, Callable[[Plane, Pki, PlaneSpec], Operator]] = {
    "keda": keda, "karpenter": karpenter, "kuberay": kuberay, "lws": lws, "lws-chart": lws_chart,
    "kuberay-chart": kuberay_chart, "keda-chart": keda_chart, "prometheus-operator": prometheus_operator}
"""Every operator a plane can run, by the name a PlaneSpec uses."""
