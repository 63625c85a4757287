"""The stack keys' reference and JSON Schema, generated from the schema itself (never written by hand): the
Markdown reference people read (docs/stack-keys.md) and the JSON Schema editors validate a stack file with as it is
typed (docs/stack.schema.json, through yaml-language-server's `$schema` comment). `triarch reference` writes both;
a test fails when the committed files drift from the schema."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from triarch.catalog import charts
from triarch.config.base import NAMESPACE, REQUIRED_WHEN, SECRET_KEYS
from triarch.config.schema import StackConfig
from triarch.config.words import Schema, allowed, resolve, shown
from triarch.paths import PROJECT_ROOT, STACKS_DIR

DOCS_DIR = PROJECT_ROOT / "docs"
SCHEMA_FILE = DOCS_DIR / "stack.schema.json"
REFERENCE_FILE = DOCS_DIR / "stack-keys.md"
EXAMPLE_STACKS = ("dev", "prod", "large", "local", "lab")
"""Where a key's example is looked up, in this order: the first shipped stack that sets the key."""
PULUMI_KEYS = {
    "secretsprovider": "Where Pulumi encrypts this stack's secrets (passphrase, awskms://, ...).",
    "encryptedkey": "The stack's data key, encrypted by the secrets provider (written by Pulumi).",
    "encryptionsalt": "The passphrase provider's salt (written by Pulumi).",
    "environment": "Pulumi ESC environments the stack imports.",
}
"""Pulumi's own keys of a stack file beside `config` (Pulumi writes or reads them; Triarch does not)."""
SECURE = {"type": "object", "properties": {"secure": {"type": "string"}}, "required": ["secure"],
          "additionalProperties": False}


def _tidy(node: Any) -> Any:
    """Pydantic's schema as a stack file reads: no titles, and an optional key's `null` left out (leaving a key out
    is how a stack says "the default")."""
    if isinstance(node, list):
        return [_tidy(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: _tidy(v) for k, v in node.items() if k != "title"}
    options = node.get("anyOf")
    if options and {"type": "null"} in options:
        rest = [o for o in options if o != {"type": "null"}]
        node.pop("anyOf")
        if len(rest) == 1:
            node = {**rest[0], **node}
        else:
            node["anyOf"] = rest
    if node.get("default", 0) is None:
        node.pop("default")
    if isinstance(node.get("default"), dict):
        node["default"] = {k: v for k, v in node["default"].items() if v is not None}
    return node


def _one_line(text: str) -> str:
    return " ".join(text.split())


@cache
def _model_schema() -> Schema:
    schema: Schema = _tidy(StackConfig.model_json_schema(by_alias=True))
    defs = schema["$defs"]
    for definition in defs.values():
        if "description" in definition:
            definition["description"] = _one_line(definition["description"])
        for prop in definition.get("properties", {}).values():
            if "description" in prop:
                prop["description"] = _one_line(prop["description"])
    # An image pin is a plain reference or a mapping; chart images sit beside vllm and rayLlm, not under `charts`.
    pin = defs["ImagePin"]
    defs["ImagePin"] = {"description": pin["description"],
                        "anyOf": [{"type": "string", "description": pin["properties"]["image"]["description"]},
                                  {k: v for k, v in pin.items() if k != "description"}]}
    images = defs["ImagesConfig"]
    chart_note = images["properties"].pop("charts")["description"]
    for key in sorted({image.key for chart in charts().values() for image in chart.images}):
        images["properties"][key] = {"$ref": "#/$defs/ImagePin", "description": chart_note}
    return schema


def stack_file_schema() -> Schema:
    """The JSON Schema of a Pulumi.<stack>.yaml of this project."""
    model = copy.deepcopy(_model_schema())
    props: Schema = {}
    if "awsRegion" in model["properties"]:
        region = model["properties"].pop("awsRegion")
        props["aws:region"] = {"type": "string", "description": region.get("description", "")}
    for key, prop in model["properties"].items():
        target = resolve(prop, model["$defs"])
        described = {**prop}
        if "description" not in described and "description" in target:
            described["description"] = target["description"]
        props[f"{NAMESPACE}:{key}"] = described
    for key, text in SECRET_KEYS.items():
        props[f"{NAMESPACE}:{key}"] = {"anyOf": [SECURE], "description": text + " A Pulumi secret: "
                                       f"`pulumi config set --secret {NAMESPACE}:{key} <value>`."}
    triarch_keys = sorted(k for k in props if k.startswith(f"{NAMESPACE}:"))
    config = {
        "type": "object",
        "description": "The stack's config: Triarch's keys (triarch:...), aws:region, and other providers' keys.",
        "properties": props,
        "required": [f"{NAMESPACE}:{k}" for k in model.get("required", [])],
        "propertyNames": {"anyOf": [{"enum": triarch_keys}, {"pattern": f"^(?!{NAMESPACE}:)"}]},
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://github.com/triarch/triarch/docs/stack.schema.json",
        "title": "A Triarch stack file (Pulumi.<stack>.yaml)",
        "description": "Generated by `triarch reference` from the stack's schema (components/triarch/config).",
        "type": "object",
        "properties": {"config": config,
                       **{k: {"description": v} for k, v in PULUMI_KEYS.items()}},
        "required": ["config"],
        "$defs": model["$defs"],
    }


@dataclass(frozen=True)
class Key:
    path: str
    """The key path as messages write it: triarch:nodeGroups[].instanceType."""
    schema: Schema
    """The key's own schema ($ref resolved for its words, kept for its default and description)."""
    required: bool


def keys() -> Iterator[Key]:
    """Every key of a stack file, depth first, in the schema's order."""
    schema = stack_file_schema()
    defs, config = schema["$defs"], schema["properties"]["config"]
    for name, prop in config["properties"].items():
        yield from _walk(name, prop, name in config["required"], defs)


def _walk(path: str, prop: Schema, required: bool, defs: Schema) -> Iterator[Key]:
    """A key, then its keys: a mapping's, or those of each item of a list of mappings (a value that may be a string
    or a mapping, an image pin, is one key)."""
    yield Key(path, prop, required)
    target = resolve(prop, defs)
    if target.get("type") == "array":
        target, path = resolve(target.get("items", {}), defs), path + "[]"
    for name, child in target.get("properties", {}).items():
        yield from _walk(f"{path}.{name}", child, name in target.get("required", []), defs)


def _stack_values() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for stack in EXAMPLE_STACKS:
        path = STACKS_DIR / f"Pulumi.{stack}.yaml"
        if path.exists():
            found.append((path.name, (yaml.safe_load(path.read_text()) or {}).get("config") or {}))
    return found


def _lookup(config: dict[str, Any], path: str) -> Any:
    """The first value at a key path in a stack's config (a list's first item that has the key)."""
    head, *rest = path.split(".")
    values: list[Any] = [config.get(head.removesuffix("[]"))] if head.removesuffix("[]") in config else []
    if head.endswith("[]"):
        values = [v for value in values if isinstance(value, list) for v in value]
    for part in rest:
        name = part.removesuffix("[]")
        values = [v[name] for v in values if isinstance(v, dict) and name in v]
        if part.endswith("[]"):
            values = [item for v in values if isinstance(v, list) for item in v]
    return values[0] if values else None


def example(key: Key, stacks: list[tuple[str, dict[str, Any]]]) -> tuple[Any, str] | None:
    """A value of the key from the first shipped stack that sets it, or the schema's own example."""
    for name, config in stacks:
        value = _lookup(config, key.path)
        if value is not None:
            return value, name
    examples = key.schema.get("examples")
    return (examples[0], "") if examples else None


def markdown() -> str:
    """The reference: every key with its type and allowed values, default, what it decides and an example."""
    schema = stack_file_schema()
    defs = schema["$defs"]
    stacks = _stack_values()
    lines = ["# Stack keys", "",
             "<!-- Generated by `triarch reference` from components/triarch/config: edit the schema, not this "
             "file. -->", "",
             "Every key a `stacks/Pulumi.<stack>.yaml` may set under `config:`, with what it decides. Editors "
             "validate a stack file as it is typed with the JSON Schema beside this file: the first line",
             "`# yaml-language-server: $schema=../docs/stack.schema.json` of a stack file points the YAML language "
             "server (VS Code's YAML extension, Neovim, Helix, ...) at it. `triarch plan` checks what a schema "
             "cannot: keys that depend on each other, the catalog, the driver/CUDA matrix.", ""]
    every = list(keys())
    for i, key in enumerate(every):
        siblings = _same_as_next(every, i)
        if siblings is None:
            continue  # described with the last of its run
        depth = key.path.count(".")
        target = resolve(key.schema, defs)
        description = key.schema.get("description") or target.get("description", "")
        parent, _, leaf = key.path.rpartition(".")
        title = f"`{key.path}`" if len(siblings) == 1 else f"`{parent}.<key>`: {', '.join(siblings)}"
        lines.append(f"{'#' * min(2 + depth, 6)} {title}")
        lines.append("")
        needed = "required" if key.required else (
            f"required {REQUIRED_WHEN[key.path]}" if key.path in REQUIRED_WHEN else "optional")
        facts = [f"**{needed}**", allowed(key.schema, defs)]
        if "default" in key.schema:
            facts.append(f"default `{shown(key.schema['default'])}`")
        if key.path.removeprefix(f"{NAMESPACE}:") in SECRET_KEYS:
            facts[1] = "a Pulumi secret (`secure:`)"
        lines.append(" · ".join(facts))
        lines.append("")
        if description:
            lines += [description, ""]
        found = example(key, stacks)
        if found is not None and not target.get("properties") and "$ref" not in target.get("items", {}):
            value, where = found
            leaf = key.path.rsplit(".", 1)[-1].removesuffix("[]")
            lines += [f"Example{f' ({where})' if where else ''}: `{leaf}: {shown(value)}`", ""]
    return "\n".join(lines).rstrip() + "\n"


def _same_as_next(every: list[Key], i: int) -> list[str] | None:
    """Sibling keys with one schema (the chart images) are described once: None for all but the last of such a
    run, which gets every name of the run."""
    def parent(key: Key) -> str:
        return key.path.rpartition(".")[0]
    key = every[i]
    if i + 1 < len(every) and parent(every[i + 1]) == parent(key) and every[i + 1].schema == key.schema:
        return None
    run = [key]
    while i - len(run) >= 0 and parent(every[i - len(run)]) == parent(key) and every[i - len(run)].schema == key.schema:
        run.insert(0, every[i - len(run)])
    return [k.path.rpartition(".")[2] for k in run]


def schema_json() -> str:
    return json.dumps(stack_file_schema(), indent=2, sort_keys=False) + "\n"


def write(into: Path = DOCS_DIR) -> list[Path]:
    """Write the reference and the schema; returns the files written."""
    into.mkdir(parents=True, exist_ok=True)
    written = [into / SCHEMA_FILE.name, into / REFERENCE_FILE.name]
    written[0].write_text(schema_json())
    written[1].write_text(markdown())
    return written


def field_schema(model: type[BaseModel], key: str) -> tuple[Schema, Schema] | None:
    """A field's schema as the reference shows it, and the definitions it refers to (for messages)."""
    schema = _model_schema()
    defs = schema["$defs"]
    own = schema if model is StackConfig else defs.get(model.__name__)
    if own is None or key not in own.get("properties", {}):
        return None
    return own["properties"][key], defs
