"""KV offload to host memory: vLLM's facts (templates/compat/kv-offload.yaml) and the decisions read from them
alone: which releases take --kv-offloading-size, and the kv_transfer_config of a split's role that offloads beside
NIXL (a MultiConnector, since the flag would replace the role's connector). The stack checks, the tuner and the
planners read them, so they sit below all three."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from triarch.datafiles import read_yaml
from triarch.paths import COMPAT_DIR

MULTI_CONNECTOR = "MultiConnector"
"""vLLM's connector that runs several (vllm/distributed/kv_transfer/kv_connector/v1/multi_connector.py, 0.29.0)."""
OFFLOAD_ROLE = "kv_both"
"""The kv_role vLLM gives its own offloading connector (config/vllm.py _post_init_kv_transfer_config, 0.29.0)."""


@dataclass(frozen=True)
class OffloadFacts:
    releases: tuple[str, ...]
    """vLLM releases whose EngineArgs carry kv_offloading_size."""
    flag: str
    offloading_connector: str
    daemon_allowance_mib: int
    platforms: str
    replaces_connector: str
    across_nodes: str
    gains: tuple[dict[str, str], ...]


@cache
def offload_facts() -> OffloadFacts:
    data: dict[str, Any] = read_yaml(COMPAT_DIR / "kv-offload.yaml")
    return OffloadFacts(
        releases=tuple(str(r) for r in data["releases"]), flag=str(data["flag"]),
        offloading_connector=str(data["offloadingConnector"]),
        daemon_allowance_mib=int(data["sizing"]["daemonSetAllowanceMiB"]),
        platforms=" ".join(str(data["platforms"]).split()),
        replaces_connector=" ".join(str(data["replacesConnector"]).split()),
        across_nodes=" ".join(str(data["acrossNodes"]).split()),
        gains=tuple({k: " ".join(str(v).split()) for k, v in g.items()} for g in data["gains"]))


def offload_bytes(gib: int) -> int:
    """cpu_bytes_to_use for `gib` GiB, as vLLM derives it from --kv-offloading-size (size x 2^30)."""
    return gib << 30


def with_offload(role_config: dict[str, Any], gib: int) -> dict[str, Any]:
    """A split role's kv_transfer_config that offloads too: a MultiConnector of the role's own connector, first (Ray
    2.60's MultiConnector backend takes the P/D protocol from the first), then vLLM's offloading connector with the
    role's buffer. The outer kv_role is the role's, which vLLM's scheduler reads (is_kv_consumer)."""
    return {"kv_connector": MULTI_CONNECTOR, "kv_role": role_config["kv_role"],
            "kv_connector_extra_config": {"connectors": [
                role_config,
                {"kv_connector": offload_facts().offloading_connector, "kv_role": OFFLOAD_ROLE,
                 "kv_connector_extra_config": {"cpu_bytes_to_use": offload_bytes(gib)}}]}}
