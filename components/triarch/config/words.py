"""What a stack key accepts, in words a person reads: the generated reference and the error messages say it the
same way, from the key's JSON Schema (never from the validation library's own wording)."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

PATTERN_WORDS = {
    r"^[a-z]([-a-z0-9]{0,30}[a-z0-9])?$":
        "a DNS label (lowercase letters, digits and '-', starting with a letter, at most 32 characters)",
    r"^\d{3}\.\d{1,3}(\.\d{1,3})?$": "an NVIDIA driver version as nvidia-smi prints it (e.g. 580.95.05)",
    r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$": "an IAM role or user ARN",
    r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+$": "an IAM role ARN",
    r"^[A-Za-z0-9][\w.-]*/[\w.-]+$": "a Hugging Face repository id (owner/name)",
    r"^/[a-z0-9/_-]*$": "a path starting with '/' (lowercase letters, digits, '/', '_' and '-')",
    r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[\w./=+-]*)?$": "an S3 URI, s3://<bucket>/<prefix>",
    r"^[1-9][0-9]*(h|d|w|y)$": "a duration: a number and h, d, w or y (e.g. 15d)",
    r"^(https://|file://|/)\S+$": "an https:// or file:// URL, or an absolute path",
}
"""The stack's string patterns, said in words (a pattern with no entry is shown as the pattern)."""

FORMAT_WORDS = {"ipv4network": "an IPv4 range in CIDR form (e.g. 10.0.0.0/16)"}


def resolve(schema: Schema, defs: Schema) -> Schema:
    """A `$ref` followed into the definitions; any other schema as it is."""
    ref = schema.get("$ref")
    return defs[ref.rsplit("/", 1)[-1]] if ref else schema


def _bounds(schema: Schema) -> str:
    low, high = schema.get("minimum"), schema.get("maximum")
    above, below = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if low is not None and high is not None:
        return f" from {low:g} to {high:g}"
    parts = []
    if low is not None:
        parts.append(f"at least {low:g}")
    if above is not None:
        parts.append(f"above {above:g}")
    if high is not None:
        parts.append(f"at most {high:g}")
    if below is not None:
        parts.append(f"below {below:g}")
    return " " + " and ".join(parts) if parts else ""


def allowed(schema: Schema, defs: Schema) -> str:
    """What values a key takes: "a whole number from 1 to 64", "one of 'vllm', 'ray-serve'", "true or false"."""
    schema = resolve(schema, defs)
    if "anyOf" in schema:
        return " or ".join(allowed(option, defs) for option in schema["anyOf"])
    if "enum" in schema:
        values = [_literal(v) for v in schema["enum"]]
        return values[0] if len(values) == 1 else "one of " + ", ".join(values)
    kind = schema.get("type")
    if kind == "boolean":
        return "true or false"
    if kind == "integer":
        return "a whole number" + _bounds(schema)
    if kind == "number":
        return "a number" + _bounds(schema)
    if kind == "string":
        if "pattern" in schema:
            return PATTERN_WORDS.get(schema["pattern"], f"a string matching {schema['pattern']}")
        return FORMAT_WORDS.get(schema.get("format", ""), "a string")
    if kind == "array":
        least = schema.get("minItems")
        return ("a list" + (f" of at least {least}" if least else "") + ", each "
                + allowed(schema.get("items", {}), defs))
    if kind == "object":
        if schema.get("properties"):
            return "a mapping with the keys " + ", ".join(schema["properties"])
        each = schema.get("additionalProperties")
        if isinstance(each, dict):
            return "a mapping of names to " + allowed(each, defs).removeprefix("a ").removeprefix("an ") + "s"
        return "a mapping"
    return "any value"


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else str(value)


def shown(value: Any) -> str:
    """A default or example as the stack file writes it (YAML flow style)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"' if value == "" or value[:1] in "[{*&!|>'\"%@`#" or ": " in value else value
    if isinstance(value, list):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {shown(v)}" for k, v in value.items()) + "}"
    return str(value)
