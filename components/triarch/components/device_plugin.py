"""The NVIDIA device plugin (and GPU feature discovery), a pinned Helm release on GPU nodes only."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from triarch.catalog import Chart
from triarch.planners.device_plugin import NAMESPACE, RELEASE


def namespace_manifest(name: str, pod_security: str, why: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {"pod-security.kubernetes.io/enforce": pod_security,
                       "pod-security.kubernetes.io/enforce-version": "latest",
                       "app.kubernetes.io/managed-by": "triarch"},
            "annotations": {"triarch.dev/pod-security-reason": why},
        }
    }


class DevicePlugin(pulumi.ComponentResource):
    def __init__(self, name: str, chart: Chart, values: dict[str, Any], provider: k8s.Provider,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:deviceplugin:DevicePlugin", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        self.namespace = k8s.core.v1.Namespace(
            f"{name}-ns", **namespace_manifest(
                NAMESPACE, "privileged",
                "the device plugin mounts the kubelet's device-plugin socket directory (hostPath), and GPU feature "
                "discovery runs privileged as the chart ships it; nothing else runs here"),
            opts=child)
        self.release = k8s.helm.v3.Release(
            name,
            name=RELEASE,
            chart=chart.name,
            version=chart.version,
            repository_opts={"repo": chart.repository},
            namespace=NAMESPACE,
            create_namespace=False,
            atomic=True,
            cleanup_on_fail=True,
            values=values,
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[self.namespace]))
        self.register_outputs({"status": self.release.status})
