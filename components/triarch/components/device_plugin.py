"""The NVIDIA device plugin (and GPU feature discovery), a pinned Helm release on GPU nodes only."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from triarch.catalog import Chart
from triarch.components.manifests import register
from triarch.planners.device_plugin import NAMESPACE, RELEASE
from triarch.planners.pods import namespace


class DevicePlugin(pulumi.ComponentResource):
    def __init__(self, name: str, chart: Chart, values: dict[str, Any], provider: k8s.Provider,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:deviceplugin:DevicePlugin", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        self.namespace = register(namespace(
            NAMESPACE, "privileged",
            "the device plugin mounts the kubelet's device-plugin socket directory (hostPath), and GPU feature "
            "discovery runs privileged as the chart ships it; nothing else runs here"), child)
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
