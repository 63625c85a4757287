"""The whole stack: cluster, GPU pools, device plugin (where), KubeRay and Ray Serve (how), vLLM (when)."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from triarch.catalog import Catalog
from triarch.components.cluster import AdoptedCluster, EksCluster
from triarch.components.device_plugin import DevicePlugin
from triarch.components.karpenter import Karpenter, KarpenterPool
from triarch.components.manifests import crd_files, helm_release, webhook_gate
from triarch.components.nodegroups import ExistingGpuPool, ManagedNodeGroup, gpu_node_group
from triarch.components.observability import ChartAddOn, Observability, PrometheusStack
from triarch.components.serving import (
    KubeRayOperator,
    RayServing,
    ServingNamespace,
    VllmServer,
    WarmCapacity,
    WeightsReader,
)
from triarch.components.storage import BlockStorage, SharedModelStore
from triarch.config import SYSTEM_RELEASE_TABLE, StackConfig
from triarch.planners import picker, pods
from triarch.planners.device_plugin import device_plugin_values
from triarch.planners.efa import EFA_CHART, EFA_RELEASE, efa_values
from triarch.planners.lws import LWS_CHART, LWS_RELEASE, lws_values, webhook_gates
from triarch.planners.model_plan import ModelPlan
from triarch.planners.monitoring import (
    DCGM_RELEASE,
    KEDA_RELEASE,
    PROMETHEUS_CRDS_RELEASE,
    PROMETHEUS_RELEASE,
    dcgm_namespace,
    dcgm_values,
    keda_namespace,
    keda_values,
    prometheus_namespace,
    prometheus_values,
)
from triarch.planners.nodegroups import PoolPlan, plan_eks_pool, plan_pool
from triarch.planners.objects import KubernetesPlan
from triarch.planners.ray import weights_account, weights_uris, worker_groups
from triarch.planners.registry import crd_sources, docker_config, pull_through_policy, stack_charts
from triarch.planners.repair import repairs
from triarch.planners.warm import uses_buffers
from triarch.scheduling import SYSTEM_POOL


def system_release_version(stack: StackConfig, facts: Catalog) -> str:
    """The system nodes' own pinned release (every AL2023 variant of a release shares its release_version)."""
    release = stack.cluster.system_node_group.ami_release
    assert release is not None
    return facts.amis[SYSTEM_RELEASE_TABLE][release].release_versions[stack.cluster.kubernetes_version]


def monitors(stack: StackConfig) -> dict[str, str] | None:
    """The labels a chart's ServiceMonitor carries, or None where no Prometheus Operator runs."""
    return None if stack.prometheus == "none" else dict(stack.observability.monitor_labels)


class Platform(pulumi.ComponentResource):
    def __init__(self, name: str, stack: StackConfig, facts: Catalog, models: list[ModelPlan],
                 objects: KubernetesPlan, secrets: dict[str, pulumi.Output[str]],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:platform:Platform", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.charts = stack_charts(stack, with_pull_secret="registryPassword" in secrets)
        """The pinned charts as this stack pulls them (its mirror, its image pins, its pull Secret)."""
        self.docker_config = registry_credentials(stack, secrets.get("registryPassword"))
        self.pools: list[PoolPlan] = []
        self.gpu_node_groups: list[ManagedNodeGroup] = []
        self.existing_pools: list[ExistingGpuPool] = []
        self.karpenter: Karpenter | None = None
        self.prometheus_stack: PrometheusStack | None = None
        self.monitor_crds: list[pulumi.Resource] = []
        """What a ServiceMonitor, PodMonitor or PrometheusRule waits for: the CRDs' release when Triarch installs
        them (an existing Prometheus Operator's are there already)."""
        self.karpenter_pools: list[KarpenterPool] = []
        if stack.cluster.create:
            assert stack.aws_region is not None
            self.cluster: EksCluster | AdoptedCluster = EksCluster(
                stack.cluster.name, stack, facts, system_release_version(stack, facts), opts=child)
            eks = self.cluster
            self._prometheus(stack, eks.provider, secrets)
            plans = [plan_eks_pool(stack, group, facts) for group in stack.node_groups]
            self.pools = [plan.pool for plan in plans]
            if any(plan.provisioner == "karpenter" for plan in plans):
                self.karpenter = Karpenter("karpenter", eks, stack.cluster.name, stack.aws_region,
                                           (self.charts["karpenter-crd"], self.charts["karpenter"]), eks.provider,
                                           opts=child, monitor_labels=monitors(stack), after=self.monitor_crds,
                                           pull_through=pull_through_policy(stack),
                                           docker_config=self.docker_config,
                                           efa=any(p.pool.efa_interfaces for p in plans),
                                           placement_groups=sorted(p.placement_group for p in plans
                                                                   if p.placement_group),
                                           capacity_buffers=uses_buffers(stack, models),
                                           capacity_reservations=any(p.reservations for p in plans),
                                           node_repair=repairs(stack))
            for plan in plans:
                if self.karpenter is not None and plan.provisioner == "karpenter":
                    self.karpenter_pools.append(KarpenterPool(f"pool-{plan.pool.name}",
                                                              objects.node_pools[plan.pool.name], self.karpenter,
                                                              eks.provider, opts=child))
                else:
                    self.gpu_node_groups.append(gpu_node_group(
                        plan, cluster_name=eks.cluster.name, cluster_for_tags=stack.cluster.name,
                        subnet_ids=[eks.network.private_subnet_by_zone[z].id for z in plan.zones],
                        node_role=eks.node_role,
                        opts=pulumi.ResourceOptions(parent=self, depends_on=eks.node_prerequisites)))
        else:
            self.cluster = AdoptedCluster(stack.cluster.name, stack.cluster, opts=child)
            self._prometheus(stack, self.cluster.provider, secrets)
            for group in stack.node_groups:
                pool = plan_pool(stack, group, facts)
                self.pools.append(pool)
                self.existing_pools.append(ExistingGpuPool(f"pool-{group.name}", pool, group.nodes,
                                                           self.cluster.provider, opts=child))
        self.provider = self.cluster.provider
        self.device_plugin: DevicePlugin | None = None
        if stack.device_plugin.mode == "install":
            chart = self.charts["nvidia-device-plugin"]
            tag = (chart.image or ":v" + chart.version).rsplit(":", 1)[1]
            values = device_plugin_values(self.pools, tag, stack.device_plugin.gpu_feature_discovery)
            [namespace] = objects.device_plugin
            self.device_plugin = DevicePlugin("nvidia-device-plugin", chart, values, namespace, self.provider,
                                              opts=pulumi.ResourceOptions(parent=self,
                                                                          depends_on=self.gpu_node_groups),
                                              docker_config=self.docker_config)
        self.efa_device_plugin: ChartAddOn | None = None
        if objects.efa:
            [namespace] = objects.efa
            self.efa_device_plugin = ChartAddOn(EFA_RELEASE, self.charts[EFA_CHART], namespace,
                                                efa_values(stack, self.pools), self.provider,
                                                opts=pulumi.ResourceOptions(parent=self),
                                                docker_config=self.docker_config)
        self._serve(stack, models, objects, secrets)
        self.register_outputs({"pools": [p.name for p in self.pools]})

    def _prometheus(self, stack: StackConfig, provider: k8s.Provider, secrets: dict[str, pulumi.Output[str]]
                    ) -> None:
        if stack.prometheus != "install":
            return
        self.block_storage: BlockStorage | None = None
        after: list[pulumi.Resource] = []
        if isinstance(self.cluster, EksCluster):
            self.block_storage = BlockStorage(f"{stack.cluster.name}-block", self.cluster, stack.cluster.name,
                                              stack.cluster.kubernetes_version, provider,
                                              opts=pulumi.ResourceOptions(parent=self))
            after.append(self.block_storage)
        self.prometheus_stack = PrometheusStack(
            PROMETHEUS_RELEASE, (self.charts["prometheus-operator-crds"], self.charts["kube-prometheus-stack"]),
            prometheus_namespace(stack), prometheus_values(stack), (PROMETHEUS_CRDS_RELEASE, PROMETHEUS_RELEASE),
            provider, secrets.get("grafanaAdminPassword"), after, opts=pulumi.ResourceOptions(parent=self),
            docker_config=self.docker_config)
        self.monitor_crds = [self.prometheus_stack.crds]

    def _serve(self, stack: StackConfig, models: list[ModelPlan], objects: KubernetesPlan,
               secrets: dict[str, pulumi.Output[str]]) -> None:
        """The Ray and vLLM layers, on the pools above (they wait for the device plugin and the model store)."""
        self.store: SharedModelStore | None = None
        self.serving_namespace: ServingNamespace | None = None
        self.kuberay: KubeRayOperator | None = None
        self.ray: RayServing | None = None
        self.vllm_servers: list[VllmServer] = []
        if not models:
            return
        ready: list[pulumi.Resource] = [p for p in (self.device_plugin, self.efa_device_plugin) if p is not None]
        if isinstance(self.cluster, EksCluster) and stack.serving.storage_class is None:
            self.store = SharedModelStore(f"{stack.cluster.name}-models", self.cluster, stack.cluster.name,
                                          stack.cluster.kubernetes_version, self.provider,
                                          opts=pulumi.ResourceOptions(parent=self))
            ready.append(self.store)
        self.serving_namespace = ServingNamespace("serving", objects.serving, secrets, self.provider,
                                                  opts=pulumi.ResourceOptions(parent=self),
                                                  docker_config=self.docker_config)
        ready.append(self.serving_namespace)
        after = pulumi.ResourceOptions(parent=self, depends_on=ready)
        self.lws: ChartAddOn | None = None
        if objects.lws:
            [namespace] = objects.lws
            self.lws = ChartAddOn(LWS_RELEASE, self.charts[LWS_CHART], namespace, lws_values(stack), self.provider,
                                  opts=pulumi.ResourceOptions(parent=self), docker_config=self.docker_config,
                                  crds=[(c.file, c.url) for c in crd_sources(LWS_CHART, stack)])
        # A LeaderWorkerSet needs the controller's CRD and webhooks in place first, and its webhooks serving.
        self.lws_webhooks: list[pulumi.Resource] = []
        if self.lws is not None:
            self.lws_webhooks = [webhook_gate(gate, pulumi.ResourceOptions(parent=self.lws, provider=self.provider,
                                                                           depends_on=[self.lws.release]))
                                 for gate in webhook_gates()]
        grouped = pulumi.ResourceOptions(parent=self, depends_on=[*ready, *([self.lws.release] if self.lws else []),
                                                                  *self.lws_webhooks])
        self.weights_readers: list[WeightsReader] = []
        # Endpoint pickers (prefixRouting on a vllm model): the InferencePool CRD once, then one release per model
        # in the serving namespace, before the model's Service, which selects the picker's pod.
        self.inference_pool_crds: list[pulumi.Resource] = []
        self.pickers: dict[str, k8s.helm.v3.Release] = {}
        routed = [plan for plan in models if picker.routed(plan)]
        if routed:
            self.inference_pool_crds = crd_files(
                "inference-pool-crd", [(c.file, c.url) for c in crd_sources(picker.PICKER_CHART, stack)],
                pulumi.ResourceOptions(parent=self, provider=self.provider))
        for plan in routed:
            self.pickers[plan.name] = helm_release(
                picker.release_name(plan.name), self.charts[picker.PICKER_CHART], stack.serving.namespace,
                picker.picker_values(stack, plan),
                pulumi.ResourceOptions(parent=self, provider=self.provider,
                                       depends_on=[*ready, *self.inference_pool_crds]),
                skip_crds=True, postrender=picker.postrender("registryPassword" in secrets))
        for plan in models:
            if plan.config.engine == "vllm":
                opts = grouped if plan.multi_node else after
                if plan.name in self.pickers:
                    opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
                        depends_on=[self.pickers[plan.name]]))
                if plan.config.weights_uri and isinstance(self.cluster, EksCluster):
                    assert stack.aws_region is not None
                    reader = WeightsReader(f"{plan.name}-weights", cluster_name=self.cluster.cluster.name,
                                           cluster=stack.cluster.name, namespace=stack.serving.namespace,
                                           service_account=pods.weights_service_account(plan.name),
                                           uris=[plan.config.weights_uri], region=stack.aws_region,
                                           depends_on=[self.cluster.addons["eks-pod-identity-agent"]],
                                           opts=pulumi.ResourceOptions(parent=self))
                    self.weights_readers.append(reader)
                    opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[reader]))
                self.vllm_servers.append(VllmServer(plan.name, objects.vllm[plan.name], plan.config.model,
                                                    self.provider, opts=opts))
        self.warm: WarmCapacity | None = None
        if objects.warm:
            # A CapacityBuffer needs Karpenter's CRD (its chart) in place; placeholders only the namespace.
            needs = [self.serving_namespace, *([self.karpenter.crds] if self.karpenter else [])]
            self.warm = WarmCapacity("warm-capacity", objects.warm, self.provider,
                                     opts=pulumi.ResourceOptions(parent=self, depends_on=needs))
        if objects.ray and objects.kuberay:
            system_pool = SYSTEM_POOL if stack.cluster.create else None
            [namespace] = objects.kuberay
            self.kuberay = KubeRayOperator("kuberay-operator", self.charts["kuberay-operator"], system_pool, namespace,
                                           self.provider, opts=pulumi.ResourceOptions(parent=self),
                                           monitor_labels=monitors(stack), after=self.monitor_crds,
                                           docker_config=self.docker_config,
                                           crds=[(c.file, c.url) for c in crd_sources("kuberay-operator", stack)])
        if objects.ray:
            served = [plan.name for plan in models if plan.config.engine == "ray-serve"]
            readers: list[pulumi.Resource] = []
            for key, hosted in sorted(worker_groups(models).items(), key=lambda kv: kv[0].name):
                uris = weights_uris(hosted)
                if uris and isinstance(self.cluster, EksCluster):
                    assert stack.aws_region is not None
                    reader = WeightsReader(weights_account(key), cluster_name=self.cluster.cluster.name,
                                           cluster=stack.cluster.name, namespace=stack.serving.namespace,
                                           service_account=weights_account(key), uris=uris, region=stack.aws_region,
                                           depends_on=[self.cluster.addons["eks-pod-identity-agent"]],
                                           opts=pulumi.ResourceOptions(parent=self))
                    self.weights_readers.append(reader)
                    readers.append(reader)
            self.ray = RayServing("ray-serve", objects.ray, served, self.kuberay, self.provider,
                                  opts=pulumi.ResourceOptions.merge(after, pulumi.ResourceOptions(depends_on=readers)))
        self.dcgm_exporter: ChartAddOn | None = None
        self.keda: ChartAddOn | None = None
        observed = stack.observability
        if stack.prometheus != "none" and observed.dcgm_exporter:
            self.dcgm_exporter = ChartAddOn(DCGM_RELEASE, self.charts["dcgm-exporter"], dcgm_namespace(),
                                            dcgm_values(stack), self.provider, opts=pulumi.ResourceOptions(parent=self),
                                            after=self.monitor_crds, docker_config=self.docker_config)
        if observed.keda == "install":
            self.keda = ChartAddOn(KEDA_RELEASE, self.charts["keda"], keda_namespace(), keda_values(stack),
                                   self.provider, opts=pulumi.ResourceOptions(parent=self),
                                   docker_config=self.docker_config)
        self.observability: Observability | None = None
        if objects.observability:
            waits: list[pulumi.Resource] = [self.serving_namespace, *self.vllm_servers, *self.monitor_crds]
            if self.keda is not None:
                waits.append(self.keda.release)  # the ScaledObject CRD comes with the chart
            self.observability = Observability("observability", objects.observability, waits, self.provider,
                                               opts=pulumi.ResourceOptions(parent=self))


def registry_credentials(stack: StackConfig, password: pulumi.Output[str] | None) -> pulumi.Output[str] | None:
    """The registry's .dockerconfigjson, a secret like the password it is made from (None: no credentials)."""
    registry = stack.registry
    host, user = registry.credentials_host, registry.username
    if password is None or host is None or user is None:
        return None
    return pulumi.Output.secret(password.apply(lambda value: docker_config(host, user, value)))
