"""What must hold between the pools and the workloads on them over time, not just at the first `pulumi up`:
the Ray head fits a system node, a RayService upgrade's second cluster fits the pools, and every GPU pod drains
within a spot node's notice.
"""

from __future__ import annotations

from triarch.catalog import Catalog
from triarch.config import StackConfig
from triarch.errors import ConfigError
from triarch.planners.model_plan import ModelPlan
from triarch.planners.models import largest_gpu_use, peak_gpus, replica_bounds
from triarch.planners.ray import HEAD_CPUS, HEAD_MEMORY_GIB, worker_grace_seconds
from triarch.planners.vllm import grace_period_seconds

SPOT_NOTICE_SECONDS = 120
"""EC2 warns two minutes before it reclaims a spot instance (EC2 User Guide, "Spot Instance interruption
notices")."""
INTERRUPTION_HANDLING_SECONDS = 15
"""Our margin for the notice to reach Karpenter (EventBridge -> SQS, long-polled) and for it to cordon the node
and start evicting: the pods' grace periods must end this much before the instance goes."""


def check_capacity(stack: StackConfig, models: list[ModelPlan], facts: Catalog) -> None:
    check_gangs(stack, models)
    check_ray_head(stack, models, facts)
    check_pool_capacity(stack, models)
    check_warm_capacity(stack, models)
    check_spot_drain(stack, models)


def check_gangs(stack: StackConfig, models: list[ModelPlan]) -> None:
    """What a replica across nodes needs beyond GPUs: one model cache its pods on several nodes all mount
    (ReadWriteMany), and, for engine vllm, a fixed group count (KEDA scales Deployments here; a LeaderWorkerSet
    scaled by an HPA would need its own trigger wiring, which Triarch does not write)."""
    for index, plan in enumerate(models):
        if not plan.multi_node:
            continue
        access = stack.cache_access_mode
        if access != "ReadWriteMany":
            raise ConfigError("triarch:serving.accessMode", access,
                              f"gives model '{plan.name}' a cache only one node can mount, but each replica spans "
                              f"{plan.nodes_per_replica} nodes that all load the weights from it",
                              "ReadWriteMany (with a storage class that shares: EFS, CephFS, Filestore)")
        if plan.config.engine == "vllm" and plan.config.autoscaling is not None:
            raise ConfigError(f"triarch:models[{index}].autoscaling", plan.config.autoscaling.model_dump(),
                              f"cannot scale model '{plan.name}', whose replica spans {plan.nodes_per_replica} "
                              "nodes (a LeaderWorkerSet group): Triarch scales vllm Deployments only",
                              "replicas: N, or engine: ray-serve (Ray Serve scales multi-node replicas)")


def check_ray_head(stack: StackConfig, models: list[ModelPlan], facts: Catalog) -> None:
    """The Ray head runs on the system nodes: a system instance no larger than the head's requests can never
    hold it (the kubelet and system daemons always reserve some), and the RayService would never start."""
    if not stack.cluster.create or not any(m.config.engine == "ray-serve" for m in models):
        return
    system = stack.cluster.system_node_group
    instance = facts.instances[system.instance_type]
    if instance.vcpus <= HEAD_CPUS or instance.memory_gib <= HEAD_MEMORY_GIB:
        larger = sorted((i.vcpus, i.memory_gib, name) for name, i in facts.instances.items()
                        if not i.gpu and i.vcpus > HEAD_CPUS and i.memory_gib > HEAD_MEMORY_GIB)
        raise ConfigError("triarch:cluster.systemNodeGroup.instanceType", system.instance_type,
                          f"({instance.vcpus} vCPU, {instance.memory_gib:g} GiB) cannot hold the Ray head, which "
                          f"requests {HEAD_CPUS} CPU and {HEAD_MEMORY_GIB} GiB beside what the node reserves",
                          ", ".join(name for *_, name in larger))


def _replicas_key(stack: StackConfig, plan: ModelPlan) -> str:
    """The key that sets a model's (or a split model's role's) replicas at the largest: where it scales, its
    autoscaling.max, else its replicas."""
    index = next(i for i, model in enumerate(stack.models) if model.name == plan.config.name)
    role = f".disaggregation.{plan.role}" if plan.role is not None else ""
    count = "autoscaling.max" if plan.config.autoscaling is not None else "replicas"
    return f"triarch:models[{index}]{role}.{count}"


def _largest_gpus(plan: ModelPlan) -> int:
    """GPUs a model holds at its largest: replicas (or autoscaling.max) x GPUs per replica."""
    if plan.config.engine == "ray-serve":
        return replica_bounds(plan)[1] * plan.gpus_per_replica
    return largest_gpu_use(plan) * plan.gpus_per_replica


def check_pool_capacity(stack: StackConfig, models: list[ModelPlan]) -> None:
    """Every pool holds its models at their largest; where it hosts ray-serve models, also during a RayService
    upgrade: KubeRay's NewCluster upgrade starts a whole new Ray cluster and switches traffic once it serves, so
    both run at once, or the upgrade waits for GPUs that never come. (The incremental upgrade that avoids this
    needs the Gateway API and a gateway controller, which Triarch does not install.)"""
    pools = {plan.pool.name: plan.pool for plan in models}
    for pool_name, (vllm, ray, upgrade) in peak_gpus(models).items():
        pool = pools[pool_name]
        capacity = pool.max_nodes * pool.schedulable_gpus_per_node
        need = vllm + ray + upgrade
        if need <= capacity:
            continue
        per_node = pool.schedulable_gpus_per_node
        nodes = -(-need // per_node)
        own = vllm + ray
        mine = [plan for plan in models if plan.pool.name == pool_name]
        if own > capacity:
            # The root cause first: the models themselves do not fit, upgrade or not.
            each = ", ".join(f"'{plan.name}' {_largest_gpus(plan)}" for plan in mine)
            what = f"its models need {own} at their largest on pool '{pool_name}' (replicas x GPUs per replica: {each})"
            held = -(-own // per_node)
            counted = (f" ({held} for the models at their largest, the rest for a RayService upgrade)"
                       if nodes > held else "")
            keys = ", ".join(_replicas_key(stack, plan) for plan in mine)
            fix = f">= {nodes} nodes{counted}, or fewer replicas at the largest ({keys})"
        else:
            served = ", ".join(f"'{plan.name}'" for plan in mine if plan.config.engine == "ray-serve")
            what = (f"a RayService upgrade on pool '{pool_name}' needs {need}: the models fit ({own}), but an "
                    f"upgrade of {served} starts a new Ray cluster ({upgrade}) beside the running one at its largest "
                    f"({ray})" + (f", plus {vllm} for the vLLM models there" if vllm else ""))
            keys = ", ".join(_replicas_key(stack, plan) for plan in mine if plan.config.engine == "ray-serve")
            fix = f">= {nodes} nodes, or fewer replicas at the largest ({keys})"
        raise ConfigError(f"{stack.node_group_key(pool_name)}.max", pool.max_nodes,
                          f"holds {capacity} GPU(s), but {what}", fix)


def check_warm_capacity(stack: StackConfig, models: list[ModelPlan]) -> None:
    """Warm capacity sits beside the replicas a pool holds at its quietest (its models' fewest replicas); when a
    replica needs the room, it takes it (a CapacityBuffer's room or a placeholder gives way), so the pool's peak
    does not count it. A pool too small to hold it beside those replicas would keep none of it warm."""
    for pool_name in sorted({p.pool.name for p in models if p.config.warm_replicas}):
        on_pool = [p for p in models if p.pool.name == pool_name]
        pool = on_pool[0].pool
        capacity = pool.max_nodes * pool.schedulable_gpus_per_node
        fewest = sum(replica_bounds(p)[0] * p.gpus_per_replica for p in on_pool)
        warm = sum(p.config.warm_replicas * p.gpus_per_replica for p in on_pool)
        if fewest + warm > capacity:
            warmed = ", ".join(f"'{p.name}' {p.config.warm_replicas} x {p.gpus_per_replica}" for p in on_pool
                               if p.config.warm_replicas)
            raise ConfigError(f"{stack.node_group_key(pool_name)}.max", pool.max_nodes,
                              f"holds {capacity} GPU(s), too few to keep {warm} warm ({warmed}) beside the {fewest} "
                              "its models hold at their fewest replicas",
                              f">= {-(-(fewest + warm) // pool.schedulable_gpus_per_node)} nodes, or fewer "
                              "warmReplicas")


def spot_drain_problem(grace_seconds: int) -> str | None:
    """Why a pod with this grace period cannot drain on a spot node, or None."""
    budget = SPOT_NOTICE_SECONDS - INTERRUPTION_HANDLING_SECONDS
    if grace_seconds > budget:
        return (f"gives its pods {grace_seconds}s to drain, but a spot node is gone {SPOT_NOTICE_SECONDS}s after "
                f"its notice, {INTERRUPTION_HANDLING_SECONDS}s of which reach Karpenter and cordon the node "
                f"(at most {budget}s)")
    return None


def check_spot_drain(stack: StackConfig, models: list[ModelPlan]) -> None:
    """Every GPU pod on a spot pool finishes its drain (preStop, the server's own drain, the margin) before the
    instance is reclaimed; otherwise in-flight requests are cut at every interruption."""
    for plan in models:
        if stack.node_group(plan.pool.name).capacity_type != "SPOT":
            continue
        grace = grace_period_seconds() if plan.config.engine == "vllm" else worker_grace_seconds()
        problem = spot_drain_problem(grace)
        if problem:
            raise ConfigError(f"{stack.node_group_key(plan.pool.name)}.capacityType", "SPOT",
                              f"cannot hold model '{plan.name}', which {problem}", "ON_DEMAND")
