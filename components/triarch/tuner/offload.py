"""The KV offload's size: how much of a node's host memory one replica's vLLM may keep offloaded KV blocks in
(templates/compat/kv-offload.yaml; docs/tuning.md, "KV offload to host memory").

vLLM's `--kv-offloading-size` is GiB for the whole instance, committed at start in the pod's /dev/shm. The pod may
take what its share of the node leaves after the node's system reserve (the kubelet's kube-reserved and eviction
threshold, templates/compat/node-overhead.yaml) and an allowance for the DaemonSets on a GPU node; the engine keeps
the memory Triarch gives it without offload (ENGINE_SHARE of its share of the node); the offload may take the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from triarch.catalog import InstanceType
from triarch.guardrails.placement_pools import reserved
from triarch.kv_offload import offload_facts

ENGINE_SHARE = 0.8
"""The part of its share of the node's memory a serving pod requests without offload: a fifth is left for the
kubelet, the DaemonSets and the page cache (planners/models.py pod_resources)."""
ENGINE_FLOOR_GIB = 4
"""The least a serving pod on a known node requests."""
UNKNOWN_NODE_GIB = 8
"""What a serving pod on existing nodes of unknown size requests: a modest floor."""


def engine_memory_gib(instance: InstanceType | None, share: float) -> int:
    """What a serving pod requests for its engine (no offload): ENGINE_SHARE of its share of the node's memory, at
    least ENGINE_FLOOR_GIB; UNKNOWN_NODE_GIB where the node is not known."""
    if instance is None or not instance.gpus:
        return UNKNOWN_NODE_GIB
    return max(ENGINE_FLOOR_GIB, int(instance.memory_gib * share * ENGINE_SHARE))


@dataclass(frozen=True)
class HostMemory:
    """One pod's host memory on a node of a known type, in GiB."""

    instance_type: str
    node_gib: float
    reserve_mib: int
    """The kubelet's kube-reserved memory and hard eviction threshold (node-overhead.yaml)."""
    daemons_mib: int
    """The allowance for the DaemonSets on the node (kv-offload.yaml sizing)."""
    share: float
    """The pod's GPUs over the node's schedulable GPUs."""
    pod_room_gib: int
    """What the pod may take: its share of the node after the reserve and the DaemonSets, whole GiB down."""
    engine_gib: int
    """What the engine keeps without offload (engine_memory_gib)."""

    @property
    def offload_gib(self) -> int:
        """The offload a pod gets when the stack gives no size: the room the engine leaves (0: none)."""
        return max(0, self.pod_room_gib - self.engine_gib)

    def rule(self) -> str:
        """The arithmetic, for a plan's line and a refusal."""
        return (f"{self.instance_type}: {self.node_gib:g} GiB less {self.reserve_mib} MiB system reserve and "
                f"{self.daemons_mib} MiB for DaemonSets, x {self.share:g} of the node = {self.pod_room_gib} GiB the "
                f"pod may take, of which the engine keeps {self.engine_gib} GiB")


def host_memory(instance_type: str, instance: InstanceType, share: float) -> HostMemory:
    """The host memory a pod of `share` of a node of `instance_type` may take, and the engine's part of it."""
    reserve = reserved(instance_type, instance).memory_mib
    daemons = offload_facts().daemon_allowance_mib
    room = math.floor((instance.memory_gib * 1024 - reserve - daemons) * share / 1024)
    return HostMemory(instance_type, instance.memory_gib, reserve, daemons, share, room,
                      engine_memory_gib(instance, share))
