"""The NVIDIA device plugin (and GPU feature discovery), a pinned Helm release on GPU nodes only."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from triarch.catalog import Chart
from triarch.components.manifests import helm_release, register
from triarch.planners.device_plugin import NAMESPACE, RELEASE


class DevicePlugin(pulumi.ComponentResource):
    def __init__(self, name: str, chart: Chart, values: dict[str, Any], namespace: dict[str, Any],
                 provider: k8s.Provider, opts: pulumi.ResourceOptions | None = None,
                 docker_config: pulumi.Input[str] | None = None) -> None:
        super().__init__("triarch:deviceplugin:DevicePlugin", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        self.namespace = register(namespace, child)
        self.release = helm_release(RELEASE, chart, NAMESPACE, values,
                                    pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[self.namespace]),
                                    docker_config=docker_config)
        self.register_outputs({"status": self.release.status})
