"""A model's KV offload to host memory (models[].kvOffload) as its pods carry it: the size, sized by the tuner from
the node's memory where the stack gives none (tuner/offload.py), refused in one line where the node cannot hold it
beside the engine or the replica spans nodes; then what the pod needs for it: a memory-backed /dev/shm of that size
beside the one NCCL uses, and its memory request and limit raised by as much."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from triarch.catalog import InstanceType
from triarch.config import ModelConfig, StackConfig
from triarch.errors import ConfigError
from triarch.kv_offload import offload_facts
from triarch.planners.model_plan import ModelPlan
from triarch.planners.nodegroups import PoolPlan
from triarch.tuner import Sizing
from triarch.tuner.offload import HostMemory, engine_memory_gib, host_memory

SHM_GIB_PER_GPU = 2
"""The /dev/shm a serving pod gets per GPU without offload, for NCCL and vLLM's own shared-memory queues."""


def _where(pool: PoolPlan) -> str:
    return f"node group '{pool.name}'"


def plan_offload(stack: StackConfig, index: int, model: ModelConfig, pool: PoolPlan, instance: InstanceType | None,
                 sizing: Sizing) -> tuple[int, HostMemory | None]:
    """GiB one replica of `model` offloads to (0: none), and the node's room it was judged against (None where the
    node's type is not known). `model` may be a split model's role (its nodeGroup the role's pool)."""
    offload = model.kv_offload
    if offload is None or not offload.enabled:
        return 0, None
    key = f"triarch:models[{index}].kvOffload"
    given = offload.model_dump(by_alias=True, exclude_unset=True)
    if sizing.nodes > 1:
        raise ConfigError(key, given, f"offloads a replica that spans {sizing.nodes} nodes of {_where(pool)}: "
                          f"{offload_facts().across_nodes}",
                          "a replica within one node (a pool with more GPUs per node), or remove kvOffload")
    group = stack.node_group(pool.name)
    if instance is None or not instance.gpus or group.instance_type is None:
        if offload.size_gib is None:
            raise ConfigError(key, given, f"sizes the offload from the node's memory, but {_where(pool)} is "
                              "existing nodes whose memory Triarch does not know",
                              "kvOffload.sizeGiB: the GiB one replica's node can spare (its memory request and "
                              "limit grow by as much)")
        return offload.size_gib, None
    share = sizing.tensor_parallel_size * sizing.pipeline_parallel_size / pool.schedulable_gpus_per_node
    room = host_memory(group.instance_type, instance, share)
    if offload.size_gib is None:
        if room.offload_gib < 1:
            raise ConfigError(key, given, f"leaves no host memory to offload to on {_where(pool)} "
                              f"({room.rule()})", "a pool of an instance type with more memory per GPU, or remove "
                              "kvOffload")
        return room.offload_gib, room
    if offload.size_gib > room.offload_gib:
        allowed = (f"1..{room.offload_gib}, or a pool of an instance type with more memory per GPU"
                   if room.offload_gib else "a pool of an instance type with more memory per GPU, or remove kvOffload")
        raise ConfigError(f"{key}.sizeGiB", offload.size_gib, f"GiB does not fit beside the engine on "
                          f"{_where(pool)} ({room.rule()}: {room.offload_gib} GiB left)", allowed)
    return offload.size_gib, room


def shm_gib(gpus: int, offload_gib: int) -> int:
    """The pod's /dev/shm: NCCL's per GPU, and the offload's whole buffer, which vLLM creates there at start."""
    return SHM_GIB_PER_GPU * gpus + offload_gib


def with_offload_memory(resources: dict[str, dict[str, str]], offload_gib: int) -> dict[str, dict[str, str]]:
    """A container's requests and limits with the memory raised by the offload (a memory-backed /dev/shm is charged
    to the pod's memory cgroup, so the limit must hold it beside the engine)."""
    if not offload_gib:
        return resources
    raised: dict[str, dict[str, str]] = {}
    for kind, amounts in resources.items():
        amounts = dict(amounts)
        memory = amounts["memory"]
        assert memory.endswith("Gi"), memory
        amounts["memory"] = f"{int(memory[:-2]) + offload_gib}Gi"
        raised[kind] = amounts
    return raised


def offload_line(name: str, gib: int, room: HostMemory | None) -> str:
    """What a plan says of a model's offload."""
    if room is None:
        return (f"{name}: KV offload {gib} GiB of host memory per replica (--kv-offloading-size), as kvOffload.sizeGiB "
                "gives it; the nodes' memory is not known, so it is not checked")
    return f"{name}: KV offload {gib} GiB of host memory per replica (--kv-offloading-size); {room.rule()}"


def engine_offload_args(gib: int) -> dict[str, Any]:
    """The engine arg of an offload (EngineArgs' name, vLLM 0.29.0 and 0.33.0): none without one."""
    return {offload_facts().flag: gib} if gib else {}


def offload_cost(plan: ModelPlan) -> dict[str, Any]:
    """A model's offload as capacity.json counts it: host memory is part of the node's price (EC2 bills an instance
    whole), so the offload adds nothing to the pool's cost; it costs only where it needs a larger instance type,
    which the stack chooses and the pool's row prices."""
    room = plan.host_memory
    return {"gibPerReplica": plan.kv_offload_gib, "podMemoryGiB": engine_memory_gib(plan.instance, share_of(plan))
            + plan.kv_offload_gib, "instanceType": room.instance_type if room else None,
            "nodeMemoryGiB": room.node_gib if room else None, "monthlyUsd": 0.0,
            "why": "host memory is in the node's price: nothing beyond the pool's nodes"}


def share_of(plan: ModelPlan) -> float:
    """The pod's GPUs over its node's schedulable GPUs."""
    return plan.gpus_per_pod / plan.pool.schedulable_gpus_per_node


def offload_cost_line(capacity_models: list[dict[str, Any]]) -> str | None:
    """The summary's line of every offload, from capacity.json: what each holds, and that it costs nothing more."""
    parts = [f"{m['name']} {m['kvOffload']['gibPerReplica']} GiB per replica (pod memory "
             f"{m['kvOffload']['podMemoryGiB']} GiB" + (f" of a {m['kvOffload']['nodeMemoryGiB']:g} GiB "
                                                         f"{m['kvOffload']['instanceType']}" if
                                                         m["kvOffload"]["instanceType"] else "") + ")"
             for m in capacity_models if m.get("kvOffload")]
    if not parts:
        return None
    return ("KV offload to host memory (in the nodes' price, $0 more; a larger instance type costs as its pool's "
            f"row says): {'; '.join(parts)}")


def offload_effects(base_capacity: Mapping[str, Any], head_capacity: Mapping[str, Any]) -> list[str]:
    """kvOffload turned on, off or resized for a model in both plans (capacity.json's models[].kvOffload): its pods
    change (the engine arg, /dev/shm and the memory limit), so each replica restarts, as the workload's own line says
    (a rolling update for vllm, a new Ray cluster for ray-serve), and the host-memory cache it held is gone."""
    before = {m["name"]: (m.get("kvOffload") or {}).get("gibPerReplica", 0) for m in base_capacity.get("models", [])}
    found = []
    for model in head_capacity.get("models", []):
        name, after = model["name"], (model.get("kvOffload") or {}).get("gibPerReplica", 0)
        if name not in before or before[name] == after:
            continue
        what = (f"turns on ({after} GiB per replica)" if not before[name] else "turns off" if not after else
                f"goes from {before[name]} to {after} GiB per replica")
        found.append(f"model {name}: KV offload to host memory {what}: every replica restarts with the new engine arg, "
                     "/dev/shm and memory limit, and the KV blocks offloaded so far are lost (they live in the old "
                     "pods' memory)" + (f"; each new replica commits {after} GiB of its node at start" if after
                                        else ""))
    return found
