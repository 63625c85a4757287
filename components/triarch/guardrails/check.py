"""Evaluate every guardrail over a stack's resources, as `triarch check` and the tests do, with the same
per-policy configuration the Pulumi policy pack takes (`{"policy": {"enforcementLevel": ..., threshold: ...}}`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triarch.errors import ConfigError
from triarch.guardrails.base import Enforcement, Resource, Rule
from triarch.guardrails.registry import RULES
from triarch.guardrails.unknowns import judge_resource, judge_stack

LEVELS: tuple[Enforcement, ...] = ("mandatory", "advisory", "disabled")


@dataclass(frozen=True)
class Finding:
    rule: Rule
    enforcement: Enforcement
    resource: Resource
    message: str


def enforcement_of(rule: Rule, config: Mapping[str, Any]) -> Enforcement:
    given = (config.get(rule.name) or {})
    level = given if isinstance(given, str) else given.get("enforcementLevel", rule.enforcement)
    if level not in LEVELS:
        raise ConfigError(f"policy config {rule.name}.enforcementLevel", level, "is not an enforcement level",
                          ", ".join(LEVELS))
    return level


def evaluate(resources: list[Resource], config: Mapping[str, Any] | None = None) -> list[Finding]:
    """Every enabled rule's findings; where a rule found nothing but read a value known only after apply, an
    advisory note saying so (the pack reports the same note through Pulumi's own can't-run-during-preview
    diagnostic)."""
    config = config or {}
    unknown = sorted(set(config) - {r.name for r in RULES})
    if unknown:
        raise ConfigError("policy config", unknown[0], "is not a policy of triarch-guardrails",
                          ", ".join(r.name for r in RULES))
    findings: list[Finding] = []
    for rule in RULES:
        level = enforcement_of(rule, config)
        if level == "disabled":
            continue
        given = config.get(rule.name)
        settings = rule.settings(given if isinstance(given, Mapping) else None)
        if rule.check_resource is not None:
            for resource in resources:
                messages, note = judge_resource(rule, resource, settings)
                findings += [Finding(rule, level, resource, m) for m in messages]
                if note is not None:
                    findings.append(Finding(rule, "advisory", resource, note))
        if rule.check_stack is not None:
            found, unjudged = judge_stack(rule, resources, settings)
            findings += [Finding(rule, level, r, m) for r, m in found]
            if unjudged is not None:
                findings.append(Finding(rule, "advisory", *unjudged))
    return findings


def resources_of_plan(document: Mapping[str, Any]) -> list[Resource]:
    """The resources the policies see, from a plan.json: every custom resource (not Triarch's components, not
    providers), in URN order, with its inputs as the pack receives them."""
    return [Resource(r["type"], r["name"], r["inputs"], r["urn"])
            for r in sorted(document["resources"], key=lambda r: r["urn"])
            if not r["type"].startswith(("triarch:", "pulumi:"))]


def load_policy_config(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError("--policy-config", str(path), f"cannot be read as JSON ({error})",
                          "a Pulumi policy pack config file") from None
    if not isinstance(data, dict):
        raise ConfigError("--policy-config", str(path), "is not a JSON object", '{"policy-name": {...}}')
    return data


def report_text(findings: list[Finding], placement: list[str] | None = None) -> str:
    lines = []
    if placement:
        lines += ["Placement (where each pod template runs, and the room it has)", *(f"  {p}" for p in placement), ""]
    if not findings:
        return "\n".join([*lines, "triarch-guardrails: no violations"])
    for layer in ("Kubernetes", "Ray", "vLLM"):
        group = [f for f in findings if f.rule.layer == layer]
        if not group:
            continue
        lines.append(f"{layer} ({len(group)})")
        lines += [f"  [{f.enforcement}] {f.rule.name}: {f.message}" for f in group]
    mandatory = sum(f.enforcement == "mandatory" for f in findings)
    lines.append(f"{mandatory} mandatory, {len(findings) - mandatory} advisory")
    return "\n".join(lines)


def report_markdown(findings: list[Finding], stack: str, placement: list[str] | None = None) -> str:
    mandatory = sum(f.enforcement == "mandatory" for f in findings)
    head = f"### triarch-guardrails on `{stack}`: {mandatory} mandatory, {len(findings) - mandatory} advisory"
    if placement:
        head += ("\n\n<details><summary>Placement: where each pod template runs</summary>\n\n"
                 + "\n".join(f"- {p}" for p in placement) + "\n\n</details>")
    if not findings:
        return head + "\n\nNo violations."
    lines = [head, "", "| layer | level | policy | resource | finding and fix |", "|---|---|---|---|---|"]
    for f in findings:
        message = f.message.replace("|", "\\|")
        lines.append(f"| {f.rule.layer} | {f.enforcement} | `{f.rule.name}` | `{f.resource.name}` | {message} |")
    return "\n".join(lines)


def report_json(findings: list[Finding], stack: str, placement: list[str] | None = None) -> str:
    return json.dumps({"stack": stack, "placement": placement or [], "violations": [
        {"policy": f.rule.name, "layer": f.rule.layer, "enforcementLevel": f.enforcement,
         "resource": {"type": f.resource.type, "name": f.resource.name, "urn": f.resource.urn}, "message": f.message}
        for f in findings]}, indent=2)
