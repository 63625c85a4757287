"""What every part of the stack config shares: the namespace, the base model (camelCase keys only, every other
key refused), the key types and how a key path is written in messages."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

NAMESPACE = "triarch"
DnsLabel = Annotated[str, Field(pattern=r"^[a-z]([-a-z0-9]{0,30}[a-z0-9])?$")]
DriverVersion = Annotated[str, Field(pattern=r"^\d{3}\.\d{1,3}(\.\d{1,3})?$")]


class _Model(BaseModel):
    # Only the documented camelCase keys: a snake_case key is unknown, and gets the rename hint. The docstring
    # under a field is its description (the generated stack-key reference and JSON Schema read it).
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, validate_by_alias=True,
                              validate_by_name=False, use_attribute_docstrings=True)


def key_path(*parts: str | int) -> str:
    """`triarch:models[0].name` from ("triarch:models", 0, "name")."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


CREATED = "when the cluster is created (triarch:cluster.create: true)"
ADOPTED = "when the cluster is adopted (triarch:cluster.create: false)"
REQUIRED_WHEN = {
    "aws:region": CREATED,
    "triarch:cluster.adminRoleArns": CREATED,
    "triarch:cluster.endpointPublicAccessCidrs": CREATED,
    "triarch:cluster.systemNodeGroup.amiRelease": CREATED,
    "triarch:nodeGroups[].instanceType": CREATED,
    "triarch:nodeGroups[].amiRelease": CREATED,
    "triarch:cluster.context": ADOPTED,
    "triarch:nodeGroups[].gpu": ADOPTED,
    "triarch:nodeGroups[].driverVersion": ADOPTED,
}
"""Keys the schema leaves optional that a check requires of one kind of cluster: the refusal says `is required
<when>` (`required_when`), and the stack-key reference says the same, from this one table."""


def required_when(path: str) -> str:
    """`is required <when>` for a key of REQUIRED_WHEN, given by its path in a message (`triarch:nodeGroups[2].gpu`
    is `triarch:nodeGroups[].gpu`)."""
    return "is required " + REQUIRED_WHEN[re.sub(r"\[\d+\]", "[]", path)]


SECRET_KEYS = {
    "hfToken": "The Hugging Face token the serving pods download gated weights with (a Secret in the serving "
               "namespace); needed for gated models such as Llama and Gemma.",
    "vllmApiKey": "The API key clients must send (vLLM's --api-key); without it the OpenAI port takes any caller "
                  "the NetworkPolicy lets in.",
    "grafanaAdminPassword": "Grafana's admin password (observability.prometheus: install); without it one is "
                            "generated and kept in the state (`pulumi stack output grafanaAdminPassword`).",
    "registryPassword": "The password of registry.username at registry.server: the image pull Secret of every pod "
                        "and chart.",
}
"""Keys Triarch reads only as Pulumi secrets (`pulumi config set --secret`), never into the model (so never into a
message); with what each is for."""
