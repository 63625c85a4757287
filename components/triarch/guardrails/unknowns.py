"""Which values a rule read that are known only after apply, so that a rule which could not see what it judges
says so instead of passing.

During `pulumi preview` a value computed from another resource's output is unknown (an offline plan marks what
only the cloud assigns the same way). A rule that reads such a value and finds nothing wrong has not judged it:
the verdict is an advisory note naming the value, and `pulumi up`, which registers the resource once the value
is known, judges it for real. The properties are handed to the rule in containers that record each unknown value
they hand out, with its path; nothing else about the rule changes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from triarch.guardrails.base import Config, Resource, Rule
from triarch.known import KNOWN_AFTER_APPLY as UNKNOWN


@dataclass
class Reads:
    """The unknown values handed out, in order, each as (the resource as given, property path)."""

    seen: list[tuple[Resource, str]] = field(default_factory=list)

    def note(self, resource: Resource, path: str, value: object) -> object:
        if isinstance(value, str) and value == UNKNOWN:
            self.seen.append((resource, path))
        return value


class _WatchedDict(dict[str, Any]):
    """A resource's mapping that records each unknown value a rule takes out of it."""

    def __init__(self, items: dict[str, Any], reads: Reads, resource: Resource, path: str) -> None:
        super().__init__({k: watched(v, reads, resource, f"{path}.{k}" if path else str(k)) for k, v in items.items()})
        self._reads, self._resource, self._path = reads, resource, path

    def _at(self, key: object) -> str:
        return f"{self._path}.{key}" if self._path else str(key)

    def __getitem__(self, key: str) -> Any:
        return self._reads.note(self._resource, self._at(key), super().__getitem__(key))

    def get(self, key: str, default: Any = None) -> Any:
        return self._reads.note(self._resource, self._at(key), super().get(key, default))

    def values(self) -> Any:
        return [self[k] for k in self]

    def items(self) -> Any:
        return [(k, self[k]) for k in self]


class _WatchedList(list[Any]):
    """A resource's list that records each unknown item a rule takes out of it."""

    def __init__(self, items: list[Any], reads: Reads, resource: Resource, path: str) -> None:
        super().__init__(watched(v, reads, resource, f"{path}[{i}]") for i, v in enumerate(items))
        self._reads, self._resource, self._path = reads, resource, path

    def __getitem__(self, index: Any) -> Any:
        value = super().__getitem__(index)
        if isinstance(index, int):
            return self._reads.note(self._resource, f"{self._path}[{index % max(len(self), 1)}]", value)
        return value

    def __iter__(self) -> Iterator[Any]:
        for index in range(len(self)):
            yield self[index]


def watched(value: Any, reads: Reads, resource: Resource, path: str = "") -> Any:
    """`value` with every mapping and list in it replaced by one that records the unknown values read."""
    if isinstance(value, dict):
        return _WatchedDict(value, reads, resource, path)
    if isinstance(value, list):
        return _WatchedList(value, reads, resource, path)
    return value


def _watching(resource: Resource, reads: Reads) -> Resource:
    return Resource(resource.type, resource.name, watched(dict(resource.props), reads, resource), resource.urn)


def unjudged(reads: Reads) -> str:
    """The advisory note for a rule that found nothing but read values known only after apply."""
    resource, path = reads.seen[0]
    more = len({(r.urn, r.name, p) for r, p in reads.seen}) - 1
    also = f" (and {more} more such value{'s' if more > 1 else ''})" if more > 0 else ""
    return (f"{resource.name}: {path} is known only after apply (another resource's output){also}, so this rule cannot "
            "judge it at preview; `pulumi up` judges it once it is known")


def judge_resource(rule: Rule, resource: Resource, settings: Config) -> tuple[list[str], str | None]:
    """The rule's messages on one resource, and the note to give instead when it found nothing but read unknowns."""
    assert rule.check_resource is not None
    reads = Reads()
    messages = rule.check_resource(_watching(resource, reads), settings)
    return messages, (unjudged(reads) if reads.seen and not messages else None)


def judge_stack(rule: Rule, resources: list[Resource],
                settings: Config) -> tuple[list[tuple[Resource, str]], tuple[Resource, str] | None]:
    """A stack rule's findings (on the resources as given), and a note for the first resource it read an unknown
    of and found nothing wrong with (other resources' findings stand beside it)."""
    assert rule.check_stack is not None
    reads = Reads()
    watching = [_watching(r, reads) for r in resources]
    original = {id(w): r for w, r in zip(watching, resources, strict=True)}
    found = [(original.get(id(r), r), m) for r, m in rule.check_stack(watching, settings)]
    flagged = {(r.urn, r.name) for r, _ in found}
    reads.seen = [(r, p) for r, p in reads.seen if (r.urn, r.name) not in flagged]
    return found, ((reads.seen[0][0], unjudged(reads)) if reads.seen else None)
