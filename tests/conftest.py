"""Shared helpers: read the project's stacks as the CLI does, and build mutated copies of them."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from triarch.offline import read_stack_config

ROOT = Path(__file__).resolve().parents[1]
STACKS_DIR = ROOT / "stacks"
COMPAT_DIR = ROOT / "templates" / "compat"

STACK_NAMES = sorted(p.name.split(".")[1] for p in STACKS_DIR.glob("Pulumi.*.yaml"))
"""The stacks shipped in stacks/ (Pulumi.<name>.yaml)."""

Mutation = Callable[[dict[str, Any]], object]
"""Changes a stack's `config:` mapping in place (its return value is ignored)."""
StackConfigReader = Callable[[str], dict[str, str]]
MutatedConfig = Callable[[str, Mutation], dict[str, str]]
StackWriter = Callable[[Mapping[str, Any]], Path]


def stack_path(name: str) -> Path:
    return STACKS_DIR / f"Pulumi.{name}.yaml"


def stack_document(name: str) -> dict[str, Any]:
    """The `config:` mapping of a shipped stack as YAML values (a fresh copy, safe to mutate)."""
    document = yaml.safe_load(stack_path(name).read_text(encoding="utf-8"))
    return copy.deepcopy(document["config"])


def compat_data(name: str) -> dict[str, Any]:
    """A templates/compat/<name>.yaml file read as plain YAML, independently of triarch.catalog."""
    data = yaml.safe_load((COMPAT_DIR / f"{name}.yaml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def write_stack_file(path: Path, config: Mapping[str, Any]) -> Path:
    """Write a Pulumi stack file with the given `config:` mapping."""
    path.write_text(yaml.safe_dump({"config": dict(config)}, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture
def stack_config() -> StackConfigReader:
    """`stack_config("prod")`: a shipped stack's config ("ns:key" -> string or JSON), as `triarch plan`
    reads it."""

    def read(name: str) -> dict[str, str]:
        return read_stack_config(stack_path(name))[0]

    return read


@pytest.fixture
def write_stack(tmp_path: Path) -> StackWriter:
    """`write_stack(config)`: a stack file in tmp_path holding `config` (a YAML `config:` mapping)."""

    def write(config: Mapping[str, Any]) -> Path:
        return write_stack_file(tmp_path / "Pulumi.test.yaml", config)

    return write


@pytest.fixture
def mutated_config(write_stack: StackWriter) -> MutatedConfig:
    """`mutated_config("prod", lambda c: c["triarch:nodeGroups"][1].update(min=3))`: the shipped stack with
    one change, as the "ns:key" -> string mapping that `from_pulumi_config` accepts."""

    def build(name: str, mutate: Mutation) -> dict[str, str]:
        config = stack_document(name)
        mutate(config)
        return read_stack_config(write_stack(config))[0]

    return build


def unknown_paths(ours: Any, upstream: Any, path: str = "") -> list[str]:
    """Key paths set in `ours` that the chart's values.yaml does not have.

    Below a key whose upstream default is an empty map ({}) anything goes (config.map, nodeSelector,
    resources, securityContext, ...); a list replaces the upstream list whole, so its items are not compared.
    """
    if not isinstance(ours, dict):
        return []
    if not isinstance(upstream, dict):
        return [path or "<root>"]  # a map where the chart has a scalar or a list
    if not upstream:
        return []
    missing = []
    for key, value in ours.items():
        child = f"{path}.{key}" if path else str(key)
        if key not in upstream:
            missing.append(child)
        elif isinstance(value, dict) and upstream[key] is not None:
            missing += unknown_paths(value, upstream[key], child)
    return missing
