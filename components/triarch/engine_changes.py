"""What a change tells the serving engines: each model's vLLM engine args in two plans (a vLLM server's flags, a Ray
Serve LLMConfig's engine_kwargs) compared, and what the vLLM releases a change moves to no longer have
(templates/compat/vllm-changes.yaml). `triarch diff` reports both beside the resources it compares."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import yaml

from triarch.catalog import catalog
from triarch.datafiles import read_yaml
from triarch.images import IMAGE_RELEASE
from triarch.known import KNOWN_AFTER_APPLY
from triarch.paths import COMPAT_DIR


@dataclass(frozen=True)
class EngineChange:
    model: str
    changes: dict[str, tuple[Any, Any]]
    """Engine arg -> (before, after); None where absent."""


def engine_args(plan: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Model -> its vLLM engine args: from a vLLM Deployment's `vllm serve` flags, or an LLMConfig's
    engine_kwargs in the RayService's Serve config."""
    found: dict[str, dict[str, Any]] = {}
    for resource in plan["resources"]:
        inputs = resource["inputs"]
        if resource["type"] == "kubernetes:apps/v1:Deployment":
            for container in ((inputs.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers", []):
                if container.get("command", [])[:2] == ["vllm", "serve"]:
                    found[inputs["metadata"]["name"]] = _flags(container.get("args") or [])
        elif resource["type"] == "kubernetes:ray.io/v1:RayService":
            for app in serve_applications(resource) or []:
                args = app.get("args") or {}
                for config in args.get("llm_configs") or []:
                    model = (config.get("model_loading_config") or {}).get("model_id", app.get("name"))
                    found[str(model)] = dict(config.get("engine_kwargs") or {})
                for role in ("prefill", "decode"):  # a split model's roles (build_pd_openai_app)
                    config = args.get(f"{role}_config")
                    if isinstance(config, Mapping):
                        model = (config.get("model_loading_config") or {}).get("model_id", app.get("name"))
                        found[f"{model} ({role})"] = dict(config.get("engine_kwargs") or {})
    return found


def serve_applications(resource: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """A RayService's Serve applications, from its serveConfigV2 (None where the config is known only after apply)."""
    text = (resource["inputs"].get("spec") or {}).get("serveConfigV2")
    if not isinstance(text, str) or text == KNOWN_AFTER_APPLY:
        return None
    return list((yaml.safe_load(text) or {}).get("applications") or [])


def _flags(args: list[str]) -> dict[str, Any]:
    flags: dict[str, Any] = {}
    key: str | None = None
    for word in args[1:]:  # the first argument is the model
        if word.startswith("--"):
            key = word[2:].replace("-", "_")
            flags[key] = True
        elif key is not None:
            flags[key] = word
            key = None
    return flags


def engine_changes(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[EngineChange]:
    before, after = engine_args(base), engine_args(head)
    changes = []
    for model in sorted(set(before) & set(after)):
        differing = {k: (before[model].get(k), after[model].get(k))
                     for k in sorted(set(before[model]) | set(after[model]), key=str)
                     if str(before[model].get(k)) != str(after[model].get(k))}
        if differing:
            changes.append(EngineChange(model, differing))
    return changes


ENGINE_OF_TYPE = {"kubernetes:apps/v1:Deployment": "vllm", "kubernetes:ray.io/v1:RayService": "ray-serve"}
"""Which serving engine a workload's containers run: a vLLM server's Deployment, Ray Serve LLM's RayService."""


def _vllm_versions(plan: Mapping[str, Any]) -> dict[str, set[str]]:
    """The vLLM releases each serving engine runs (one image per engine: the vLLM server's, Ray LLM's)."""
    facts = catalog()
    found: dict[str, set[str]] = {}
    for resource in plan["resources"]:
        engine = ENGINE_OF_TYPE.get(resource["type"])
        if engine is None:
            continue
        declared = ((resource["inputs"].get("metadata") or {}).get("annotations") or {}).get(IMAGE_RELEASE)
        for container in _containers(resource["inputs"]):
            image = facts.images.get(str(declared or container.get("image")))
            if image is not None and image.vllm is not None:
                found.setdefault(engine, set()).add(image.vllm)
    return found


def _containers(value: Any) -> list[Mapping[str, Any]]:
    if isinstance(value, Mapping):
        found = [c for c in value.get("containers") or [] if isinstance(c, Mapping)]
        return found + [c for k, v in value.items() if k != "containers" for c in _containers(v)]
    if isinstance(value, list):
        return [c for v in value for c in _containers(v)]
    return []


@cache
def vllm_changes() -> list[dict[str, Any]]:
    data = read_yaml(COMPAT_DIR / "vllm-changes.yaml")
    return list(data["changes"])


def vllm_release_changes(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[str]:
    """What the vLLM releases the head moves to no longer have, engine by engine: a release one engine leaves is
    noted even where the other engine still runs it (Ray LLM's vLLM and the vLLM server's differ)."""
    notes: list[str] = []
    before, after = _vllm_versions(base), _vllm_versions(head)
    moves = sorted({(gone, arrived) for engine in sorted(set(before) & set(after))
                    for gone in before[engine] - after[engine] for arrived in after[engine] - before[engine]})
    for gone, arrived in moves:
        entry = next((c for c in vllm_changes() if c["from"] == gone and c["to"] == arrived), None)
        if entry is None:
            notes.append(f"vLLM {gone} -> {arrived}: no record of what this release removed "
                         "(templates/compat/vllm-changes.yaml)")
            continue
        for what, key in (("engine args", "removedEngineArgs"), ("server flags", "removedFrontendArgs"),
                          ("metrics", "removedMetrics")):
            names = entry.get(key) or []
            if names:
                notes.append(f"vLLM {gone} -> {arrived}: {what} removed: {', '.join(names)}")
    return notes
