"""The stack keys' reference and JSON Schema: generated from the schema, committed, and true to it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from triarch.cli import main
from triarch.config import reference
from triarch.paths import STACKS_DIR

STACK_FILES = sorted(STACKS_DIR.glob("Pulumi.*.yaml"))


def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(reference.SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def errors_of(document: dict[str, Any]) -> list[str]:
    return sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator().iter_errors(document))


def test_the_committed_reference_and_schema_are_what_the_schema_generates(tmp_path: Path) -> None:
    """Edit a key's docstring, default or bounds without `triarch reference` and this fails."""
    assert main(["reference", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "stack.schema.json").read_text() == reference.SCHEMA_FILE.read_text(), \
        "docs/stack.schema.json drifted from the schema: run `uv run triarch reference`"
    assert (tmp_path / "stack-keys.md").read_text() == reference.REFERENCE_FILE.read_text(), \
        "docs/stack-keys.md drifted from the schema: run `uv run triarch reference`"


@pytest.mark.parametrize("path", STACK_FILES, ids=lambda p: p.name)
def test_every_shipped_stack_file_is_valid_and_points_editors_at_the_schema(path: Path) -> None:
    assert path.read_text().splitlines()[0] == "# yaml-language-server: $schema=../docs/stack.schema.json"
    assert errors_of(yaml.safe_load(path.read_text())) == []


def test_the_schema_flags_what_an_editor_should_underline() -> None:
    dev = yaml.safe_load((STACKS_DIR / "Pulumi.dev.yaml").read_text())
    config = dev["config"]
    config["triarch:nodeGroups"][0]["instanceTyp"] = "g6.xlarge"          # a typo
    config["triarch:models"][0]["engine"] = "vllm-openai"                 # not an engine
    config["triarch:models"][0]["replicas"] = 0                           # below the minimum
    config["triarch:modles"] = []                                         # an unknown Triarch key
    config["triarch:hfToken"] = "hf_plaintext"                            # a secret in plain text
    config["aws:profile"] = "work"                                        # another provider's key: fine
    found = errors_of(dev)
    assert any(e.startswith("config/triarch:nodeGroups/0: Additional properties") and "instanceTyp" in e
               for e in found), found
    assert any(e.startswith("config/triarch:models/0/engine:") for e in found), found
    assert any(e.startswith("config/triarch:models/0/replicas:") for e in found), found
    assert any("triarch:modles" in e for e in found), found
    assert any(e.startswith("config/triarch:hfToken:") for e in found), found
    assert not any("aws:profile" in e for e in found), found
    assert len(found) == 5, found


def test_a_missing_required_key_is_flagged() -> None:
    dev = yaml.safe_load((STACKS_DIR / "Pulumi.dev.yaml").read_text())
    del dev["config"]["triarch:cluster"]["name"]
    assert errors_of(dev) == ["config/triarch:cluster: 'name' is a required property"]


def sections() -> dict[str, str]:
    """The reference's entries: heading -> text."""
    text = reference.REFERENCE_FILE.read_text()
    return {m.group(1): m.group(2) for m in re.finditer(r"^#+ ([^\n]+)\n\n(.*?)(?=^#+ |\Z)", text, re.M | re.S)}


def test_every_key_has_a_type_a_description_and_an_example() -> None:
    entries = sections()
    assert len(entries) > 100
    for heading, text in entries.items():
        if heading == "Stack keys":
            continue
        facts = text.split("\n")[0]
        assert facts.startswith(("**required** · ", "**optional** · ", "**required when the cluster is ")), (
            heading, facts)
        body = text.split("\n\n")
        assert len(body) >= 2 and body[1].strip(), f"{heading} says nothing of what it decides"
        holds_keys = "a mapping with the keys" in facts or ", each a mapping" in facts or "secret" in facts
        assert holds_keys or "\nExample" in "\n" + text, f"{heading} has no example"


def test_the_reference_says_types_and_defaults_in_words() -> None:
    entries = sections()
    assert entries["`triarch:models[].replicas`"].startswith(
        "**optional** · a whole number from 1 to 64 · default `1`")
    assert entries["`triarch:models[].engine`"].startswith("**required** · one of 'vllm', 'ray-serve'")
    assert entries["`triarch:models[].gpuMemoryUtilization`"].startswith(
        "**optional** · a number above 0.1 and at most 0.95 · default `0.92`")
    assert entries["`triarch:nodeGroups[].taint`"].startswith("**optional** · true or false · default `true`")
    assert "a DNS label" in entries["`triarch:cluster.name`"]
    assert "Example (Pulumi.dev.yaml): `instanceType: g6.xlarge`" in entries["`triarch:nodeGroups[].instanceType`"]
    chart_images = next(h for h in entries if h.startswith("`triarch:images.<key>`"))
    assert "devicePlugin" in chart_images and "karpenterController" in chart_images
    assert "pulumi config set --secret triarch:hfToken" in entries["`triarch:hfToken`"]
    assert "int ge" not in reference.REFERENCE_FILE.read_text()
