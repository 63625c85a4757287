"""Reading a stack from Pulumi config, and wording the first mistake in the stack's own keys."""

from __future__ import annotations

import difflib
import functools
import importlib.util
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from triarch.catalog import catalog
from triarch.config.base import NAMESPACE, SECRET_KEYS, key_path
from triarch.config.checks import check_stack
from triarch.config.reference import field_schema
from triarch.config.schema import StackConfig
from triarch.config.words import allowed
from triarch.errors import ConfigError

RENAMED_KEYS = {
    "releaseVersion": "amiRelease",
    "instance_type": "instanceType",
    "k8sVersion": "kubernetesVersion",
    "version": "kubernetesVersion",
    "enabled": "mode",
}
"""Keys users reach for, mapped to the key Triarch reads; rejected with a message naming the new key."""

TOP_LEVEL_KEYS = {to_camel(name): name for name in StackConfig.model_fields if name != "aws_region"}


def from_pulumi_config(values: Mapping[str, Any]) -> StackConfig:
    """Validate a stack from Pulumi config ("ns:key" -> value; objects may be JSON strings, as Pulumi passes them).

    Raises ConfigError with the first mistake; keys of other namespaces (aws:, kubernetes:, pulumi:) are ignored.
    """
    data: dict[str, Any] = {}
    for key, value in values.items():
        namespace, _, name = key.partition(":")
        if key == "aws:region":
            data["awsRegion"] = value
        if namespace != NAMESPACE:
            _check_other_namespace(key, value)
            continue
        if name in SECRET_KEYS:
            continue
        if name not in TOP_LEVEL_KEYS:
            known = sorted([*TOP_LEVEL_KEYS, *SECRET_KEYS])
            raise ConfigError(key, value, f"is not a Triarch config key{_closest(name, known, NAMESPACE + ':')}",
                              ", ".join(f"{NAMESPACE}:{k}" for k in known), show_value=False)
        if isinstance(value, str) and value[:1] in "[{":
            try:
                value = json.loads(value)
            except json.JSONDecodeError as error:
                raise ConfigError(key, value, f"is not valid JSON ({error.msg})", "a YAML mapping or list") from None
        data[name] = value
    try:
        stack = StackConfig.model_validate(data)
    except ValidationError as error:
        raise _first_error(error) from None
    check_stack(stack, catalog())
    return stack


PROVIDER_PACKAGES = {"aws": "pulumi_aws"}
"""Providers whose config keys a stack sets beside Triarch's, by namespace: each key is held to the pinned provider's
own list (its SDK's config/vars.py), so a misspelt one is named instead of silently ignored. (pulumi_kubernetes has no
such list: Triarch's Kubernetes providers are explicit, configured from the cluster, not from `kubernetes:` keys.)"""


@functools.cache
def provider_keys(namespace: str) -> tuple[str, ...]:
    """The config keys the pinned provider SDK reads (`__config__.get...('key')` in its config/vars.py)."""
    spec = importlib.util.find_spec(PROVIDER_PACKAGES[namespace])  # finds the package without importing it
    if spec is None or spec.origin is None:
        return ()
    text = (Path(spec.origin).parent / "config" / "vars.py").read_text()
    return tuple(sorted(set(re.findall(r"__config__\.get(?:_[a-z]+)?\('([A-Za-z]+)'", text))))


def _check_other_namespace(key: str, value: Any) -> None:
    """A key outside Triarch's namespace: refused where its namespace is a misspelt `triarch` (Pulumi would pass it
    on and Triarch would plan without it), or where it is not a key of the provider it names."""
    namespace, _, name = key.partition(":")
    if namespace.lower() != NAMESPACE and _closest(namespace, [NAMESPACE]):
        raise ConfigError(key, value, f"is not read by Triarch: the namespace is '{NAMESPACE}' (did you mean "
                          f"'{NAMESPACE}:{name}'?)", f"{NAMESPACE}:<key>", show_value=False)
    if namespace.lower() == NAMESPACE:
        raise ConfigError(key, value, f"is not read by Triarch: the namespace is '{NAMESPACE}', in lower case (did "
                          f"you mean '{NAMESPACE}:{name}'?)", f"{NAMESPACE}:<key>", show_value=False)
    if namespace in PROVIDER_PACKAGES and (known := provider_keys(namespace)) and name not in known:
        raise ConfigError(key, value, f"is not a config key of the {namespace} provider"
                          f"{_closest(name, list(known), namespace + ':')}",
                          ", ".join(f"{namespace}:{k}" for k in known), show_value=False)


def _closest(key: str, known: list[str], prefix: str = "") -> str:
    """` (did you mean 'x'?)` for the known key a typo is closest to, or nothing."""
    match = difflib.get_close_matches(key.lower(), [k.lower() for k in known], n=1, cutoff=0.6)
    if not match:
        return ""
    found = next(k for k in known if k.lower() == match[0].lower())
    return f" (did you mean '{prefix}{found}'?)"


ERROR_ORDER = {"extra_forbidden": 0, "missing": 2}
"""A key that is not Triarch's is reported before a required key that is missing: a misspelt required key is
both, and the misspelling is the mistake to name."""


def _first_error(error: ValidationError) -> ConfigError:
    errors = error.errors(include_url=False)
    first = min(errors, key=lambda e: ERROR_ORDER.get(e["type"], 1))
    loc = list(first["loc"])
    if loc and loc[0] == "awsRegion":
        path = "aws:region"
    elif loc:
        path = key_path(f"{NAMESPACE}:{loc[0]}", *loc[1:])
    else:
        path = NAMESPACE
    kind, value = first["type"], first.get("input")
    if kind == "extra_forbidden":
        key = str(loc[-1])
        known = _allowed_keys(loc[:-1])
        renamed = RENAMED_KEYS.get(key) or (to_camel(key) if "_" in key else None)
        if renamed and renamed in known:
            return ConfigError(path, value, f"is not read by Triarch: the key is '{renamed}'", renamed,
                               show_value=False)
        return ConfigError(path, value, f"is not a known key{_closest(key, known)}", ", ".join(known),
                           show_value=False)
    if kind == "missing":
        return ConfigError(path, None, "is required", _describe_field(loc))
    takes = _describe_field(loc)
    if kind == "string_type" and isinstance(value, int | float) and not isinstance(value, bool):
        return ConfigError(path, value, "is a number where a string is read: quote it (YAML reads an unquoted 1.30 "
                           "as the number 1.3)", takes)
    if kind in PROBLEMS:
        return ConfigError(path, value, PROBLEMS[kind], takes)
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return ConfigError(path, value, "is not of the right type", takes)
    message = re.sub(r"^(Value error|Assertion failed), ", "", first["msg"])
    return ConfigError(path, value, f"is invalid: {message[0].lower()}{message[1:]}", takes)


PROBLEMS = {
    "literal_error": "is not an allowed value",
    "enum": "is not an allowed value",
    "string_pattern_mismatch": "has the wrong form",
    "greater_than": "is too small", "greater_than_equal": "is too small",
    "less_than": "is too large", "less_than_equal": "is too large",
    "too_short": "has too few entries", "too_long": "has too many entries",
    "int_parsing": "is not a whole number", "int_type": "is not a whole number",
    "int_from_float": "is not a whole number",
    "float_parsing": "is not a number", "float_type": "is not a number",
    "bool_parsing": "is not true or false", "bool_type": "is not true or false",
    "string_type": "is not a string", "list_type": "is not a list",
    "dict_type": "is not a mapping", "model_type": "is not a mapping", "model_attributes_type": "is not a mapping",
    "ip_v4_network": "is not an IPv4 range in CIDR form",
}
"""Each kind of mistake the schema finds, in words; the allowed values follow from the key's schema."""


def _key(name: str, field: FieldInfo) -> str:
    """The key a stack file uses for a field: its explicit alias, else its camelCase name."""
    return field.alias or to_camel(name)


def _model_at(loc: list[Any]) -> type[BaseModel] | None:
    """The model class reached by a validation location (list indexes skipped)."""
    model: type[BaseModel] = StackConfig
    for part in loc:
        if isinstance(part, int):
            continue
        field = next((f for n, f in model.model_fields.items() if _key(n, f) == part or n == part), None)
        if field is None:
            return None
        target = _inner_model(field.annotation)
        if target is None:
            return None
        model = target
    return model


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _allowed_keys(loc: list[Any]) -> list[str]:
    model = _model_at(loc)
    return sorted(_key(name, f) for name, f in model.model_fields.items()) if model else []


def _describe_field(loc: list[Any]) -> str:
    """What the key at `loc` takes, in the reference's words."""
    model = _model_at(loc[:-1])
    found = field_schema(model, str(loc[-1])) if model is not None else None
    return allowed(*found) if found else ""
