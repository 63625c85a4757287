"""The IAM actions `pulumi up` needs, per AWS resource type the program creates (templates/compat/
deploy-permissions.yaml, each with its source), and the policy document Triarch ships from them
(docs/iam-policy.json): one file both the simulation and the policy read, so they never disagree."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from triarch.datafiles import read_yaml
from triarch.paths import COMPAT_DIR, PROJECT_ROOT

PERMISSIONS_FILE = COMPAT_DIR / "deploy-permissions.yaml"
POLICY_FILE = PROJECT_ROOT / "docs" / "iam-policy.json"
"""The shipped policy; `triarch preflight --policy docs/iam-policy.json` writes it again."""
ACTION = re.compile(r"^[a-z0-9-]+:[A-Z][A-Za-z0-9]+$")
"""service-prefix:ActionName, as IAM spells every action (no wildcards: each action is one the program calls)."""
STEPS = ("create", "read", "update", "delete")


@dataclass(frozen=True)
class ResourcePermissions:
    """What the provider calls to create, read, update and delete one resource type."""

    type: str
    create: tuple[str, ...]
    read: tuple[str, ...]
    update: tuple[str, ...]
    delete: tuple[str, ...]
    source: str

    @property
    def actions(self) -> frozenset[str]:
        return frozenset((*self.create, *self.read, *self.update, *self.delete))


@dataclass(frozen=True)
class DeployPermissions:
    resources: dict[str, ResourcePermissions]
    provider: tuple[str, ...]
    """What any `pulumi up` of a created cluster calls (the provider's credential check)."""
    preflight: tuple[str, ...]
    """What `triarch preflight` reads."""
    services: dict[str, str]
    """Service prefix -> its Service Authorization Reference page."""

    def deploy_actions(self, types: Iterable[str] | None = None) -> tuple[str, ...]:
        """The actions `pulumi up` needs for these resource types (all the program can create by default)."""
        chosen = self.resources.values() if types is None else [self.resources[t] for t in types]
        return tuple(sorted(set(self.provider).union(*(r.actions for r in chosen))))


def _actions(raw: Any, where: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(a, str) and ACTION.match(a) for a in raw):
        raise ValueError(f"{PERMISSIONS_FILE.name}: {where}: expected a list of IAM actions (service:Action), "
                         f"got {raw!r}")
    return tuple(raw)


def load_permissions(path: Path = PERMISSIONS_FILE) -> DeployPermissions:
    raw = read_yaml(path)
    resources = {}
    for name, entry in raw["resources"].items():
        if not str(entry.get("source", "")).strip():
            raise ValueError(f"{path.name}: {name}: no source")
        steps = {step: _actions(entry[step], f"{name}.{step}") for step in STEPS}
        resources[name] = ResourcePermissions(name, **steps, source=" ".join(str(entry["source"]).split()))
    permissions = DeployPermissions(resources, _actions(raw["provider"]["actions"], "provider"),
                                    _actions(raw["preflight"]["actions"], "preflight"),
                                    {str(k): str(v) for k, v in raw["services"].items()})
    every = set(permissions.deploy_actions()) | set(permissions.preflight)
    unsourced = sorted({a.split(":")[0] for a in every} - set(permissions.services))
    if unsourced:
        raise ValueError(f"{path.name}: services: no Service Authorization Reference page for {unsourced}")
    return permissions


@cache
def deploy_permissions() -> DeployPermissions:
    return load_permissions()


def _sid(words: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", words) if part)


def policy_document(permissions: DeployPermissions) -> dict[str, Any]:
    """An identity policy for the principal that runs `pulumi up` and `triarch preflight`: one statement per
    service (Resource "*": the names are the stack's, chosen at plan time), then preflight's reads."""
    deploy = permissions.deploy_actions()
    by_service: dict[str, list[str]] = {}
    for action in deploy:
        by_service.setdefault(action.split(":")[0], []).append(action)
    statements = [{"Sid": f"Deploy{_sid(service)}", "Effect": "Allow", "Action": actions, "Resource": "*"}
                  for service, actions in sorted(by_service.items())]
    statements.append({"Sid": "Preflight", "Effect": "Allow",
                       "Action": sorted(set(permissions.preflight) - set(deploy)), "Resource": "*"})
    return {"Version": "2012-10-17", "Statement": statements}


def policy_text(permissions: DeployPermissions) -> str:
    """The policy as docs/iam-policy.json holds it, byte for byte."""
    return json.dumps(policy_document(permissions), indent=2) + "\n"
