"""The prefill/decode split's facts (templates/compat/prefill-decode.yaml) and the decisions read from them alone:
which KV connectors a vLLM release has, which one Triarch plans, the NIXL backend between two pools, each role's
kv_transfer_config. Both the stack checks and the planners read them, so they sit below both."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

import yaml

from triarch.paths import TEMPLATES_DIR

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, Role] = ("prefill", "decode")
PREFILL_SUFFIX = "-prefill"
"""What a split model's prefill role is named after the model (its plan, capacity.json, the cost report)."""
PD_BUILDER = "ray.serve.llm:build_pd_openai_app"
"""Ray Serve LLM's P/D application builder, by the public path Ray 2.60 exports it at (ray/serve/llm/__init__.py);
its args are PDServingArgs (prefill_config, decode_config, ...)."""
PORT_BASE_KEY = "NIXL_SIDE_CHANNEL_PORT_BASE"
"""The experimental_configs key Ray 2.60's NIXL backend reads its side-channel port base from (kv_transfer/nixl.py)."""


@dataclass(frozen=True)
class Facts:
    connectors: dict[str, tuple[str, ...]]
    planned: dict[str, str]
    not_planned: str
    kv_roles: dict[str, str]
    libfabric_backend: str
    default_backend: str
    ucx_efa_library: str
    """What UCX needs from the image to move the KV cache over EFA."""
    libfabric_library: str
    """What the LIBFABRIC plugin needs from the image to load at all."""
    port_base: dict[str, int]
    tcp_figure: str
    tcp_source: str
    decode_pipeline_parallel: str
    """Why a decode role cannot span pipeline stages (the engine's refusal, where it is raised)."""
    deployment_prefixes: dict[str, str]
    """What Ray 2.60 puts before a role's deployment name (`Prefill:`, `Decode:`): how a role's series are told
    apart, both roles' engines labelling theirs with the model's name."""
    user_first_token: str
    """Why the time to first token a client sees is estimated from both roles' (no series measures it)."""
    prefill_step_tokens: int
    """The prefill role's tokens per step, at least (vLLM's throughput advice; the source in the file)."""
    held_caches: str
    """Why the prefill role's batch need not be small (a held KV cache is not a running request)."""


@cache
def facts() -> Facts:
    data = yaml.safe_load((TEMPLATES_DIR / "compat" / "prefill-decode.yaml").read_text(encoding="utf-8"))
    return Facts(
        connectors={str(version): tuple(names) for version, names in data["kvConnectors"].items()},
        planned=dict(data["planned"]), not_planned=" ".join(str(data["notPlanned"]).split()),
        kv_roles=dict(data["kvRoles"]), libfabric_backend=data["nixlBackends"]["libfabric"],
        default_backend=data["nixlBackends"]["default"], ucx_efa_library=" ".join(data["ucxEfaLibrary"].split()),
        libfabric_library=" ".join(data["libfabricLibrary"].split()), port_base=dict(data["sideChannelPortBase"]),
        tcp_figure=data["transferOverTcp"]["figure"], tcp_source=data["transferOverTcp"]["source"],
        decode_pipeline_parallel=" ".join(str(data["decodePipelineParallel"]).split()),
        deployment_prefixes=dict(data["deploymentPrefixes"]),
        user_first_token=" ".join(str(data["userFirstToken"]).split()),
        prefill_step_tokens=int(data["prefillStep"]["tokens"]), held_caches=" ".join(str(data["heldCaches"]).split()))


def role_deployment(role: Role, model_id: str) -> str:
    """The Serve deployment of a split model's role, as Ray 2.60 names it: the role's prefix, then the model id with
    "/" as "--" and "." as "_" (core/server/builder.py _get_deployment_name)."""
    return facts().deployment_prefixes[role] + model_id.replace("/", "--").replace(".", "_")


def kv_transfer_config(role: Role, connector: str, backend: str) -> dict[str, Any]:
    """The role's engine_kwargs.kv_transfer_config (vLLM 0.29.0 KVTransferConfig's fields)."""
    return {"kv_connector": connector, "kv_role": facts().kv_roles[role],
            "kv_connector_extra_config": {"backends": [backend]}}
