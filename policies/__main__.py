"""The triarch-guardrails policy pack: each rule of triarch.guardrails.registry as a Pulumi policy.

Constructing PolicyPack starts the Analyzer gRPC server and blocks; the rules themselves are plain functions
that `triarch check` runs too. A rule that found nothing but read a value unknown at preview raises Pulumi's own
UnknownValueError, which the CLI shows as an advisory "can't run policy ... during preview" with our note.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    PolicyPack,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import UnknownValueError

from triarch.guardrails.base import Resource, Rule
from triarch.guardrails.registry import RULES
from triarch.guardrails.unknowns import judge_resource, judge_stack
from triarch.guardrails.workloads import UNKNOWN

LEVELS = {"mandatory": EnforcementLevel.MANDATORY, "advisory": EnforcementLevel.ADVISORY,
          "disabled": EnforcementLevel.DISABLED}


def plain(value: Any) -> Any:
    """Engine properties as the rules (and `triarch check`) see them: plain dicts and lists, whole numbers as
    integers (protobuf carries every number as a float), values unknown during preview as the plan's marker."""
    if isinstance(value, Mapping):
        return {key: _item(value, key) for key in value}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_item(value, i) for i in range(len(value))]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _item(container: Any, key: Any) -> Any:
    try:
        return plain(container[key])
    except UnknownValueError:
        return UNKNOWN


class CannotJudge(UnknownValueError):
    """Pulumi's unknown-at-preview error carrying our note (its own message names only a path of the proxy)."""

    def __init__(self, note: str) -> None:
        Exception.__init__(self, note)
        self.unknown_type_sentinel, self.props, self.message = "", [], note


def resource_policy(rule: Rule) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
        resource = Resource(args.resource_type, args.name, plain(args.props), args.urn)
        messages, note = judge_resource(rule, resource, rule.settings(plain(args.get_config())))
        for message in messages:
            report(message, None)
        if note is not None:  # Pulumi reports it as an advisory "can't run policy ... during preview: <note>"
            raise CannotJudge(note)

    return ResourceValidationPolicy(name=rule.name, description=rule.description, validate=validate,
                                    enforcement_level=LEVELS[rule.enforcement], config_schema=_schema(rule))


def stack_policy(rule: Rule) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report: ReportViolation) -> None:
        resources = [Resource(r.resource_type, r.name, plain(r.props), r.urn) for r in args.resources]
        found, unjudged = judge_stack(rule, resources, rule.settings(plain(args.get_config())))
        for resource, message in found:
            report(message, resource.urn or None)
        if unjudged is not None:
            raise CannotJudge(unjudged[1])

    return StackValidationPolicy(name=rule.name, description=rule.description, validate=validate,
                                 enforcement_level=LEVELS[rule.enforcement], config_schema=_schema(rule))


def _schema(rule: Rule) -> PolicyConfigSchema | None:
    if not rule.config:
        return None
    properties: dict[str, Any] = {k: dict(v) for k, v in rule.config.items()}
    return PolicyConfigSchema(properties=properties)


PolicyPack(
    name="triarch-guardrails",
    description="Three-layer rules for GPU inference on Kubernetes: placement, Ray, vLLM.",
    policies=[resource_policy(r) if r.check_resource else stack_policy(r) for r in RULES],
)
