"""Node repair of the GPU pools: which GPU failures replace a node, and after how long.

Two parts, planned together on a created cluster whose GPU pools Karpenter launches: the EKS node monitoring agent
(an EKS add-on) marks a node `AcceleratedHardwareReady=False` when its GPU fails (an Xid of its list, a double-bit
error, a lost DCGM host engine), and Karpenter's NodeRepair feature gate terminates a node whose condition stays so
for its policy's toleration. The agent's DCGM host engine does not tolerate the GPU taint by default, so its
configuration here does; without it every tainted GPU node would read as failed. The facts are
templates/compat/node-repair.yaml's, which the plan, the Xid alert, the runbook and `triarch verify` share.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache

from triarch.config import StackConfig
from triarch.config.pools import pool_provisioner
from triarch.datafiles import read_yaml
from triarch.paths import TEMPLATES_DIR
from triarch.scheduling import gpu_toleration

REPAIR_FILE = TEMPLATES_DIR / "compat" / "node-repair.yaml"
ARM_AMI = "AL2023_ARM_64_NVIDIA"
"""The arm64 GPU AMI family: the agent does not watch NVIDIA GPUs there (gpuArchitectures)."""


@dataclass(frozen=True)
class RepairFacts:
    feature_gate: str
    """The Karpenter chart's settings.featureGates key."""
    gate_in_deployment: str
    """The gate's name in the controller's FEATURE_GATES environment variable."""
    condition: str
    status: str
    toleration_minutes: int
    """How long the condition holds before Karpenter terminates the node."""
    max_unhealthy_percent: int
    """Above this share of a pool's nodes unhealthy, Karpenter repairs none of them."""
    addon: str
    namespace: str
    daemon_sets: tuple[str, ...]
    dcgm_tolerations_key: str
    gpu_architectures: tuple[str, ...]
    repair_xids: tuple[int, ...]
    """The Xids the agent turns into the condition (the others are only events)."""
    other_fatal_reasons: tuple[str, ...]


@cache
def facts() -> RepairFacts:
    loaded = read_yaml(REPAIR_FILE)
    karpenter, agent = loaded["karpenter"], loaded["agent"]
    return RepairFacts(
        feature_gate=str(karpenter["featureGate"]), gate_in_deployment=str(karpenter["gateInDeployment"]),
        condition=str(karpenter["condition"]), status=str(karpenter["status"]),
        toleration_minutes=int(karpenter["tolerationMinutes"]),
        max_unhealthy_percent=int(karpenter["maxUnhealthyPercent"]),
        addon=str(agent["addon"]), namespace=str(agent["namespace"]),
        daemon_sets=tuple(str(d) for d in agent["daemonSets"]),
        dcgm_tolerations_key=str(agent["dcgmTolerationsKey"]),
        gpu_architectures=tuple(str(a) for a in agent["gpuArchitectures"]),
        repair_xids=tuple(sorted(int(x) for x in agent["repairXids"])),
        other_fatal_reasons=tuple(str(r) for r in agent["otherFatalReasons"]))


def karpenter_pools(stack: StackConfig) -> list[str]:
    """The GPU pools Karpenter launches (the only nodes its repair replaces)."""
    return [g.name for g in stack.node_groups if pool_provisioner(stack.cluster, g) == "karpenter"]


def repairs(stack: StackConfig) -> bool:
    """cluster.nodeRepair with its default resolved: on where Triarch creates the cluster and Karpenter launches a GPU
    pool; off on an adopted cluster and where every pool is a managed node group."""
    given = stack.cluster.node_repair
    if given is not None:
        return given
    return stack.cluster.create and bool(karpenter_pools(stack))


def repaired_pools(stack: StackConfig) -> list[str]:
    """The GPU pools whose nodes node repair replaces: Karpenter's, where the agent watches NVIDIA GPUs (amd64),
    when the stack repairs at all."""
    if not repairs(stack):
        return []
    karpenter = karpenter_pools(stack)
    return [g.name for g in stack.node_groups if g.name in karpenter and g.ami_type != ARM_AMI]


def addon_values() -> dict[str, object]:
    """The node monitoring agent add-on's configuration: its DCGM host engine (dcgmAgent) tolerates the GPU taint,
    so it runs on the tainted GPU nodes it exists for. The agent's own DaemonSet tolerates every taint already."""
    return {"dcgmAgent": {"tolerations": [gpu_toleration()]}}


def addon_configuration() -> str:
    return json.dumps(addon_values())


def xids_text() -> str:
    return ", ".join(str(x) for x in facts().repair_xids)


def what_is_repaired() -> str:
    """One sentence: which failures replace a node, after how long, and the limit (the alert, the plan and verify
    say the same)."""
    f = facts()
    return (f"the EKS node monitoring agent marks a GPU node {f.condition}={f.status} on Xid {xids_text()} (or a "
            f"double-bit ECC, NVLink or DCGM failure), and Karpenter terminates it {f.toleration_minutes} minutes "
            f"later, without a drain, unless more than {f.max_unhealthy_percent}% of its pool's nodes are unhealthy")


def plan_lines(stack: StackConfig) -> list[str]:
    """What the plan says about node repair (under its own heading): what is planned, or what is not and why."""
    f = facts()
    if not stack.cluster.create:
        return [f"not installed on an adopted cluster (neither Karpenter's {f.feature_gate} gate nor "
                f"the {f.addon} add-on); `triarch verify` reports whether an agent sets {f.condition} on the GPU "
                "nodes"]
    if not repairs(stack):
        return ["off (cluster.nodeRepair): a failed GPU node stays until it is drained and replaced by "
                "hand (the GpuXid alerts say when)"]
    karpenter = karpenter_pools(stack)
    others = [g.name for g in stack.node_groups if g.name not in karpenter]
    lines = [what_is_repaired()]
    if others:
        lines.append(f"pool(s) {', '.join(others)} are managed node groups, which Karpenter does not "
                     "repair")
    arm = [name for name in karpenter if name not in repaired_pools(stack)]
    if arm:
        lines.append(f"pool(s) {', '.join(arm)} are arm64, where the agent does not watch NVIDIA GPUs: "
                     "their GPU failures are not repaired")
    return lines
