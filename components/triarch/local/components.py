"""What each process of a plane runs with: the control plane's command lines (as envtest and kwokctl run them),
kwok's stages and the storage classes kwok provisions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from triarch.local.engines import binary
from triarch.local.pki import FRONT_PROXY_CLIENT, Pki
from triarch.local.plane import API_PORT, ETCD_PORT, POD_RANGE, SERVICE_RANGE, STORAGE_CLASS, Plane, PlaneError


def component_args(p: Plane, pki: Pki, kwok_config: Path) -> dict[str, list[str]]:
    """Each process's command line, in start order (flags as envtest and kwokctl run them)."""
    kube = str(p.kubeconfig)
    return {
        "etcd": [str(binary("etcd")), "--name", "plane", "--data-dir", str(p.directory / "etcd"),
                 "--listen-client-urls", f"http://127.0.0.1:{ETCD_PORT}",
                 "--advertise-client-urls", f"http://127.0.0.1:{ETCD_PORT}",
                 "--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls",
                 "http://127.0.0.1:2380", "--initial-cluster", "plane=http://127.0.0.1:2380",
                 "--unsafe-no-fsync", "--quota-backend-bytes", str(2 << 30)],
        "kube-apiserver": [
            str(binary("kube-apiserver")), f"--etcd-servers=http://127.0.0.1:{ETCD_PORT}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={API_PORT}",
            f"--tls-cert-file={pki.serving.cert}", f"--tls-private-key-file={pki.serving.key}",
            f"--client-ca-file={pki.ca}", "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            f"--service-cluster-ip-range={SERVICE_RANGE}",
            # Privileged containers are allowed cluster-wide, as on EKS: Pod Security admission is what refuses
            # them per namespace, and the tests prove that it does.
            "--allow-privileged=true", "--profiling=false", "--enable-priority-and-fairness=false",
            # Aggregated APIs (an operator's metrics API): the API server proves itself with the front-proxy client
            # certificate and routes to the API's endpoints rather than its Service's cluster IP (no kube-proxy).
            f"--requestheader-client-ca-file={pki.front_proxy_ca}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}", "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group", "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki.front_proxy_client.cert}",
            f"--proxy-client-key-file={pki.front_proxy_client.key}", "--enable-aggregator-routing=true"],
        "kube-controller-manager": [
            str(binary("kube-controller-manager")), f"--kubeconfig={kube}", f"--authentication-kubeconfig={kube}",
            f"--authorization-kubeconfig={kube}", "--leader-elect=false", "--bind-address=127.0.0.1",
            f"--service-account-private-key-file={pki.service_account_key}", f"--root-ca-file={pki.ca}",
            f"--service-cluster-ip-range={SERVICE_RANGE}", "--controllers=*,-nodeipam", "--profiling=false"],
        "kube-scheduler": [
            str(binary("kube-scheduler")), f"--kubeconfig={kube}", f"--authentication-kubeconfig={kube}",
            f"--authorization-kubeconfig={kube}", "--leader-elect=false", "--bind-address=127.0.0.1",
            "--profiling=false"],
        "kwok": [
            str(binary("kwok")), f"--kubeconfig={kube}", f"--config={kwok_config}",
            "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            # The node address kwok reports is a value only, unreachable (the namespace has no route), so a call to a
            # kubelet fails at once instead of leaving the machine; pods get addresses of the plane's own.
            "--node-ip=10.0.0.1", f"--cidr={POD_RANGE}", "--node-lease-duration-seconds=40",
            "--server-address=127.0.0.1:10247"],
    }


def kwok_stages(storage_classes: Sequence[str]) -> str:
    """kwok's own stages (nodes Ready with a lease heartbeat; pods created, Ready, completed, deleted; claims of
    the plane's storage classes given a volume and bound), read from the kwok module beside the binary."""
    stages_dir = binary("kwok").parent / "kwok-stages"
    classes = ", ".join(f"'{c}'" for c in storage_classes)
    texts = []
    for path in sorted(stages_dir.glob("*.yaml")):
        text = path.read_text()
        if path.name.startswith(("pvc-", "pv-")):
            text = text.replace(f"self.spec.storageClassName == '{STORAGE_CLASS}'",
                                f"self.spec.storageClassName in [{classes}]")
        texts.append(text.strip())
    if not texts:
        raise PlaneError(f"no kwok stages in {stages_dir}; rebuild the kwok engine (`triarch local build kwok`)")
    return "\n---\n".join(texts) + "\n"


def storage_class(name: str) -> dict[str, Any]:
    annotations = {"storageclass.kubernetes.io/is-default-class": "true"} if name == STORAGE_CLASS else {}
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": name, "annotations": annotations},
            "provisioner": "kwok.x-k8s.io/volume", "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"}
