"""The whole stack: cluster, GPU pools, device plugin. Reads the validated config and the planners' output."""

from __future__ import annotations

import pulumi

from triarch.catalog import Catalog, charts
from triarch.components.cluster import AdoptedCluster, EksCluster
from triarch.components.device_plugin import DevicePlugin
from triarch.components.nodegroups import ExistingGpuPool, ManagedNodeGroup, gpu_node_group
from triarch.config import StackConfig
from triarch.planners.device_plugin import device_plugin_values
from triarch.planners.nodegroups import PoolPlan, plan_eks_node_group, plan_pool


def system_release_version(stack: StackConfig, facts: Catalog) -> str:
    """The system nodes follow the AMI release of the first GPU group: one release date per cluster."""
    group = stack.node_groups[0]
    assert group.ami_release is not None
    return facts.amis[group.ami_type][group.ami_release].release_versions[stack.cluster.kubernetes_version]


class Platform(pulumi.ComponentResource):
    def __init__(self, name: str, stack: StackConfig, facts: Catalog,
                 opts: pulumi.ResourceOptions | None = None) -> None:
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
        self.register_outputs({"pools": [p.name for p in self.pools]})
