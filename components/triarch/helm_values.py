"""Chart values as Helm computes them: our overrides coalesced onto the chart's defaults. Helm merges maps key by
key, replaces lists and scalars, and deletes a key whose override is null, so what a chart ships stays unless an
override replaces it: `capabilities: {drop: [ALL]}` keeps a default `add: [SYS_ADMIN]`. Checks of a release's
security read the coalesced values, never the overrides alone."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any


def coalesce(defaults: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The values a release renders with (Helm's coalescing of user values onto the chart's values.yaml)."""
    merged = copy.deepcopy(defaults)
    for key, value in overrides.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = coalesce(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _contexts(values: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every securityContext-like map in a values tree (a key named securityContext or containerSecurityContext,
    wherever a chart nests it), with its key path."""
    if isinstance(values, dict):
        for key, value in values.items():
            where = f"{path}.{key}" if path else str(key)
            if key in ("securityContext", "containerSecurityContext") and isinstance(value, dict):
                yield where, value
            yield from _contexts(value, where)
    elif isinstance(values, list):
        for index, item in enumerate(values):
            yield from _contexts(item, f"{path}[{index}]")


def privilege_findings(values: dict[str, Any], allowed_capabilities: frozenset[str] = frozenset()) -> list[str]:
    """What the coalesced values grant beyond a restricted container: privileged, added capabilities, privilege
    escalation turned on."""
    found = []
    for where, context in _contexts(values, ""):
        if context.get("privileged") is True:
            found.append(f"{where}.privileged: true")
        added = sorted({str(c).upper().removeprefix("CAP_") for c in (context.get("capabilities") or {}).get("add")
                        or []} - allowed_capabilities)
        if added:
            found.append(f"{where}.capabilities.add: {added}")
        if context.get("allowPrivilegeEscalation") is True:
            found.append(f"{where}.allowPrivilegeEscalation: true")
    return found
