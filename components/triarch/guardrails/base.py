"""What a guardrail is: the resource it reads, its layer and enforcement, its thresholds, and its check. A resource
rule sees one resource's properties; a stack rule sees all of them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Layer = Literal["Kubernetes", "Ray", "vLLM"]
Enforcement = Literal["mandatory", "advisory", "disabled"]
Config = Mapping[str, Any]


@dataclass(frozen=True)
class Resource:
    type: str
    name: str
    props: Mapping[str, Any]
    urn: str = ""


ResourceCheck = Callable[[Resource, Config], list[str]]
StackCheck = Callable[[list[Resource], Config], list[tuple[Resource, str]]]


@dataclass(frozen=True)
class Rule:
    name: str
    layer: Layer
    description: str
    enforcement: Enforcement
    check_resource: ResourceCheck | None = None
    check_stack: StackCheck | None = None
    config: dict[str, dict[str, Any]] = field(default_factory=dict)
    """JSON schema of each threshold, with its default."""

    def settings(self, given: Config | None) -> dict[str, Any]:
        values = {key: schema["default"] for key, schema in self.config.items()}
        values.update({k: v for k, v in (given or {}).items() if k in self.config})
        return values


def rule(name: str, layer: Layer, description: str, check: ResourceCheck, enforcement: Enforcement = "mandatory",
         config: dict[str, dict[str, Any]] | None = None) -> Rule:
    """A rule that sees one resource at a time."""
    return Rule(name, layer, description, enforcement, check, None, config or {})


def stack_rule(name: str, layer: Layer, description: str, check: StackCheck, enforcement: Enforcement = "mandatory",
               config: dict[str, dict[str, Any]] | None = None) -> Rule:
    """A rule that sees every resource of the stack together."""
    return Rule(name, layer, description, enforcement, None, check, config or {})
