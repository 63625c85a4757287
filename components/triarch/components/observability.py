"""What the stack gives the cluster's Prometheus Operator and KEDA: the add-on charts it installs for them (the DCGM
exporter, KEDA) and the monitors, alerts and ScaledObjects planned in triarch.planners.observability."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from triarch.catalog import Chart
from triarch.components.manifests import helm_release, register


class ChartAddOn(pulumi.ComponentResource):
    """A namespace of its own and one pinned chart in it."""

    def __init__(self, name: str, chart: Chart, namespace: dict[str, Any], values: dict[str, Any],
                 provider: k8s.Provider, opts: pulumi.ResourceOptions | None = None,
                 after: list[pulumi.Resource] | None = None) -> None:
        super().__init__("triarch:observability:ChartAddOn", name, None, opts)
        self.namespace = register(namespace, pulumi.ResourceOptions(parent=self, provider=provider))
        self.release = helm_release(name, chart, namespace["metadata"]["name"], values,
                                    pulumi.ResourceOptions(parent=self, provider=provider,
                                                           depends_on=[self.namespace, *(after or [])]))
        self.register_outputs({"status": self.release.status})


class PrometheusStack(pulumi.ComponentResource):
    """kube-prometheus-stack in its namespace, after the Prometheus Operator's CRDs in a release of their own (so a
    chart bump upgrades them; anything that ships a ServiceMonitor waits for `crds`)."""

    def __init__(self, name: str, charts: tuple[Chart, Chart], namespace: dict[str, Any], values: dict[str, Any],
                 releases: tuple[str, str], provider: k8s.Provider, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:observability:PrometheusStack", name, None, opts)
        crd_chart, chart = charts
        crd_release, release = releases
        self.namespace = register(namespace, pulumi.ResourceOptions(parent=self, provider=provider))
        ns = namespace["metadata"]["name"]
        self.crds = helm_release(crd_release, crd_chart, ns, {},
                                 pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[self.namespace]))
        self.release = helm_release(release, chart, ns, values,
                                    pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[self.crds]),
                                    skip_crds=True)
        self.register_outputs({"status": self.release.status})


class Observability(pulumi.ComponentResource):
    """The PodMonitors, the layer alerts and the KEDA ScaledObjects (the Prometheus Operator's and KEDA's CRDs must
    exist: the cluster's own, or KEDA's release, which they wait for)."""

    def __init__(self, name: str, objects: list[dict[str, Any]], after: list[pulumi.Resource],
                 provider: k8s.Provider, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:observability:Observability", name, None, opts)
        # Each object waits itself (a component's depends_on does not hold its children back).
        child = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=after)
        self.objects = [register(obj, child) for obj in objects]
        self.register_outputs({"kinds": sorted({obj["kind"] for obj in objects})})
