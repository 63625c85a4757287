"""What the stack gives the cluster's Prometheus Operator and KEDA: the add-on charts it installs for them (the DCGM
exporter, KEDA) and the monitors, alerts and ScaledObjects planned in triarch.planners.observability."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from triarch.catalog import Chart
from triarch.components.manifests import crd_files, helm_release, register
from triarch.planners.monitoring import GRAFANA_ADMIN_SECRET, GRAFANA_ADMIN_USER, GRAFANA_SECRET_KEYS


class ChartAddOn(pulumi.ComponentResource):
    """A namespace of its own and one pinned chart in it."""

    def __init__(self, name: str, chart: Chart, namespace: dict[str, Any], values: dict[str, Any],
                 provider: k8s.Provider, opts: pulumi.ResourceOptions | None = None,
                 after: list[pulumi.Resource] | None = None, docker_config: pulumi.Input[str] | None = None,
                 crds: list[tuple[str, str]] | None = None) -> None:
        super().__init__("triarch:observability:ChartAddOn", name, None, opts)
        self.namespace = register(namespace, pulumi.ResourceOptions(parent=self, provider=provider))
        # CRDs kept apart from the chart (file, URL) apply first, and the chart's crds/ is skipped.
        self.crds = crd_files(f"{name}-crd", crds or [], pulumi.ResourceOptions(parent=self, provider=provider))
        self.release = helm_release(name, chart, namespace["metadata"]["name"], values,
                                    pulumi.ResourceOptions(parent=self, provider=provider,
                                                           depends_on=[self.namespace, *self.crds, *(after or [])]),
                                    skip_crds=bool(self.crds), docker_config=docker_config)
        self.register_outputs({"status": self.release.status})


class PrometheusStack(pulumi.ComponentResource):
    """kube-prometheus-stack in its namespace, after the Prometheus Operator's CRDs in a release of their own (so a
    chart bump upgrades them; anything that ships a ServiceMonitor waits for `crds`), with Grafana's admin password
    a Pulumi secret (given, or generated once) and Prometheus' volume on `after`'s storage."""

    def __init__(self, name: str, charts: tuple[Chart, Chart], namespace: dict[str, Any], values: dict[str, Any],
                 releases: tuple[str, str], provider: k8s.Provider, admin_password: pulumi.Output[str] | None = None,
                 after: list[pulumi.Resource] | None = None, opts: pulumi.ResourceOptions | None = None,
                 docker_config: pulumi.Input[str] | None = None) -> None:
        super().__init__("triarch:observability:PrometheusStack", name, None, opts)
        crd_chart, chart = charts
        crd_release, release = releases
        self.namespace = register(namespace, pulumi.ResourceOptions(parent=self, provider=provider))
        ns = namespace["metadata"]["name"]
        in_namespace = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[self.namespace])
        if admin_password is None:
            # Generated once and kept in the state (a Pulumi secret); `pulumi stack output grafanaAdminPassword
            # --show-secrets` reads it.
            generated = random.RandomPassword(f"{name}-grafana-admin", length=32, special=False,
                                              opts=pulumi.ResourceOptions(parent=self))
            admin_password = generated.result
        given: pulumi.Output[str] = admin_password
        self.admin_password: pulumi.Output[str] = pulumi.Output.secret(given)
        self.admin_secret = k8s.core.v1.Secret(
            f"{name}-grafana-admin", metadata={"name": GRAFANA_ADMIN_SECRET, "namespace": ns}, type="Opaque",
            string_data={GRAFANA_SECRET_KEYS["user"]: GRAFANA_ADMIN_USER,
                         GRAFANA_SECRET_KEYS["password"]: self.admin_password},
            opts=in_namespace)
        self.crds = helm_release(crd_release, crd_chart, ns, {}, in_namespace)
        self.release = helm_release(release, chart, ns, values,
                                    pulumi.ResourceOptions(parent=self, provider=provider,
                                                           depends_on=[self.crds, self.admin_secret, *(after or [])]),
                                    skip_crds=True, docker_config=docker_config)
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
