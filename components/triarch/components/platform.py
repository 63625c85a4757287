"""The whole stack: cluster, GPU pools, device plugin (where), KubeRay and Ray Serve (how), vLLM (when)."""

from __future__ import annotations

import pulumi

from triarch.catalog import Catalog, charts
from triarch.components.cluster import AdoptedCluster, EksCluster
from triarch.components.device_plugin import DevicePlugin
from triarch.components.nodegroups import ExistingGpuPool, ManagedNodeGroup, gpu_node_group
from triarch.components.serving import KubeRayOperator, RayServing, ServingNamespace, VllmServer
from triarch.components.storage import SharedModelStore
from triarch.config import StackConfig
from triarch.planners.device_plugin import device_plugin_values
from triarch.planners.models import ModelPlan
from triarch.planners.nodegroups import PoolPlan, plan_eks_node_group, plan_pool
from triarch.planners.serving import serving_settings
from triarch.scheduling import SYSTEM_POOL


def system_release_version(stack: StackConfig, facts: Catalog) -> str:
    """The system nodes follow the AMI release of the first GPU group: one release date per cluster."""
    group = stack.node_groups[0]
    assert group.ami_release is not None
    return facts.amis[group.ami_type][group.ami_release].release_versions[stack.cluster.kubernetes_version]


class Platform(pulumi.ComponentResource):
    def __init__(self, name: str, stack: StackConfig, facts: Catalog, models: list[ModelPlan],
                 hf_token: pulumi.Output[str] | None, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("triarch:platform:Platform", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.pools: list[PoolPlan] = []
        self.gpu_node_groups: list[ManagedNodeGroup] = []
        self.existing_pools: list[ExistingGpuPool] = []
        if stack.cluster.create:
            self.cluster: EksCluster | AdoptedCluster = EksCluster(
                stack.cluster.name, stack, facts, system_release_version(stack, facts), opts=child)
            eks = self.cluster
            for group in stack.node_groups:
                plan = plan_eks_node_group(stack, group, facts)
                self.pools.append(plan.pool)
                self.gpu_node_groups.append(gpu_node_group(
                    plan, cluster_name=eks.cluster.name, cluster_for_tags=stack.cluster.name,
                    disk_gib=group.disk_gib,
                    subnet_ids=[eks.network.private_subnet_by_zone[z].id for z in plan.zones],
                    node_role=eks.node_role,
                    opts=pulumi.ResourceOptions(parent=self, depends_on=eks.node_prerequisites)))
        else:
            self.cluster = AdoptedCluster(stack.cluster.name, stack.cluster, opts=child)
            for group in stack.node_groups:
                pool = plan_pool(group, facts)
                self.pools.append(pool)
                self.existing_pools.append(ExistingGpuPool(f"pool-{group.name}", pool, group.nodes,
                                                           self.cluster.provider, opts=child))
        self.provider = self.cluster.provider
        self.device_plugin: DevicePlugin | None = None
        if stack.device_plugin.enabled:
            chart = charts()["nvidia-device-plugin"]
            tag = (chart.image or ":v" + chart.version).rsplit(":", 1)[1]
            values = device_plugin_values(self.pools, tag, stack.device_plugin.gpu_feature_discovery)
            self.device_plugin = DevicePlugin("nvidia-device-plugin", chart, values, self.provider,
                                              opts=pulumi.ResourceOptions(parent=self,
                                                                          depends_on=self.gpu_node_groups))
        self._serve(stack, facts, models, hf_token)
        self.register_outputs({"pools": [p.name for p in self.pools]})

    def _serve(self, stack: StackConfig, facts: Catalog, models: list[ModelPlan],
               hf_token: pulumi.Output[str] | None) -> None:
        """The Ray and vLLM layers, on the pools above (they wait for the device plugin and the model store)."""
        self.store: SharedModelStore | None = None
        self.serving_namespace: ServingNamespace | None = None
        self.kuberay: KubeRayOperator | None = None
        self.ray: RayServing | None = None
        self.vllm_servers: list[VllmServer] = []
        if not models:
            return
        settings = serving_settings(stack, with_token=hf_token is not None)
        ready: list[pulumi.Resource] = [self.device_plugin] if self.device_plugin else []
        if isinstance(self.cluster, EksCluster) and stack.serving.storage_class is None:
            self.store = SharedModelStore(f"{stack.cluster.name}-models", self.cluster, str(stack.cluster.vpc_cidr),
                                          stack.cluster.kubernetes_version, self.provider,
                                          opts=pulumi.ResourceOptions(parent=self))
            ready.append(self.store)
        with_ray = any(plan.config.engine == "ray-serve" for plan in models)
        self.serving_namespace = ServingNamespace("serving", settings, hf_token, with_ray, self.provider,
                                                  opts=pulumi.ResourceOptions(parent=self))
        ready.append(self.serving_namespace)
        after = pulumi.ResourceOptions(parent=self, depends_on=ready)
        for plan in models:
            if plan.config.engine == "vllm":
                self.vllm_servers.append(VllmServer(plan.name, plan, settings, self.provider, opts=after))
        if with_ray:
            system_pool = SYSTEM_POOL if stack.cluster.create else None
            self.kuberay = KubeRayOperator("kuberay-operator", charts()["kuberay-operator"], system_pool,
                                           self.provider, opts=pulumi.ResourceOptions(parent=self))
            self.ray = RayServing("ray-serve", models, stack.images.ray_llm, settings, self.kuberay, self.provider,
                                  opts=after)
