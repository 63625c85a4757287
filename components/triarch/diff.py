"""What a change does to a live stack: two plans compared resource by resource (by URN), each difference
classified as Pulumi would act on it: added, removed, changed in place, or replaced (and why).

Replacement comes from templates/compat/replacement.yaml: per resource type, the inputs the provider cannot
change in place (each type with its source), and whether replacing it loses state. A value only the cloud knows
(`<known after apply>` in both plans) is taken to follow its dependencies: where one of them is replaced and the
value feeds a replace-on-change input, the resource is replaced too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml

from triarch.engine_changes import EngineChange, engine_changes, vllm_release_changes
from triarch.errors import ConfigError
from triarch.known import KNOWN_AFTER_APPLY as UNKNOWN
from triarch.paths import COMPAT_DIR

Kind = Literal["added", "removed", "changed", "replaced"]
KINDS: tuple[Kind, ...] = ("replaced", "added", "removed", "changed")


@dataclass(frozen=True)
class TypeRule:
    replace_on: tuple[str, ...]
    unordered: tuple[str, ...]
    stateful: str | None
    """Why replacing it loses something (None: nothing is lost but a moment of service)."""
    lost_on_removal: str | None = None
    """Why deleting it loses something although a replacement does not (a Secret: its replacement carries the
    same value, its removal leaves the pods that read it without)."""
    immutable: tuple[str, ...] = ()
    """Inputs the API server refuses to change while the provider would update them in place (`pulumi up` fails)."""
    kept_on_removal: str | None = None
    """What stays in the cluster when it goes from the stack (a CRD Triarch retains on delete, as Helm keeps its
    crds/): said with the removal, never counted as a loss."""

    def loses(self, kind: str) -> str | None:
        """What a difference of this kind loses (None: nothing)."""
        if kind == "added":
            return None
        return self.stateful or (self.lost_on_removal if kind == "removed" else None)


@dataclass(frozen=True)
class Rules:
    types: dict[str, TypeRule]
    kubernetes_always: tuple[str, ...]
    """Inputs whose change replaces any Kubernetes object (its identity)."""

    def of(self, resource_type: str) -> TypeRule:
        rule = self.types.get(resource_type)
        if rule is not None:
            return rule
        if resource_type.startswith("kubernetes:"):
            return TypeRule(self.kubernetes_always, (), None)
        return TypeRule((), (), None)


@cache
def rules(path: Path = COMPAT_DIR / "replacement.yaml") -> Rules:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    always = tuple(data["kubernetes"]["always"])
    types = {}
    for name, entry in (data.get("types") or {}).items():
        replace_on = tuple(entry.get("replaceOn") or ())
        if name.startswith("kubernetes:"):
            replace_on = (*always, *replace_on)
        types[name] = TypeRule(replace_on, tuple(entry.get("unordered") or ()), entry.get("stateful"),
                               entry.get("lostOnRemoval"), tuple(entry.get("immutable") or ()),
                               entry.get("keptOnRemoval"))
    return Rules(types, always)


@dataclass(frozen=True)
class Difference:
    kind: Kind
    type: str
    name: str
    urn: str
    inputs: list[str]
    """Input paths that differ (empty for added and removed resources)."""
    stateful: bool
    cause: str
    intended: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"type": self.type, "name": self.name, "inputs": self.inputs, "stateful": self.stateful,
                "cause": self.cause, **({"intended": True} if self.intended else {})}


@dataclass
class Diff:
    differences: list[Difference] = field(default_factory=list)
    engine: list[EngineChange] = field(default_factory=list)
    vllm: list[str] = field(default_factory=list)
    """Flags and metrics of the base's vLLM release that the head's release no longer has."""
    capacity: dict[str, Any] | None = None
    """GPUs and monthly cost per pool, before and after (triarch.cost.capacity_change); None without capacity.json."""
    effects: list[str] = field(default_factory=list)
    """What the change does to running traffic (triarch.effects), beyond the resources it changes."""

    def of(self, kind: Kind) -> list[Difference]:
        return [d for d in self.differences if d.kind == kind]

    @property
    def blocking(self) -> list[Difference]:
        """Stateful replacements and removals nobody said they intended: either way the state is gone."""
        return [d for d in [*self.of("replaced"), *self.of("removed")] if d.stateful and not d.intended]

    def as_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {kind: [d.as_json() for d in self.of(kind)] for kind in KINDS}
        document["engineArgs"] = [{"model": e.model, "changes": {k: {"before": b, "after": a}
                                                                 for k, (b, a) in e.changes.items()}}
                                  for e in self.engine]
        document["vllm"] = self.vllm
        document["capacity"] = self.capacity
        document["effects"] = self.effects
        return document


# --- comparing inputs ---------------------------------------------------------------------------------------------

def changed_paths(before: Any, after: Any, rule: TypeRule, path: str = "") -> list[str]:
    """Input paths whose values differ. Lists of plain values the provider treats as sets compare unordered."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        found: list[str] = []
        for key in sorted(set(before) | set(after), key=str):
            child = f"{path}.{key}" if path else str(key)
            found += changed_paths(before.get(key), after.get(key), rule, child)
        return found
    if isinstance(before, list) and isinstance(after, list):
        if path in rule.unordered:
            same = sorted(map(_key, before)) == sorted(map(_key, after))
            return [] if same else [path]
        if len(before) != len(after) or not all(isinstance(v, Mapping | list) for v in [*before, *after]):
            return [] if before == after else [path]
        found = []
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            found += changed_paths(b, a, rule, f"{path}[{i}]")
        return found
    return [] if before == after else [path]


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _covers(rule_path: str, path: str) -> bool:
    return path == rule_path or path.startswith((f"{rule_path}.", f"{rule_path}["))


def _replacing(paths: Iterable[str], rule: TypeRule) -> list[str]:
    return [p for p in paths if any(_covers(r, p) for r in rule.replace_on)]


def _kept(paths: Iterable[str], resource: Mapping[str, Any]) -> list[str]:
    """The paths Pulumi acts on: an input under the resource's `ignoreChanges` keeps its old value, so a change
    there neither updates nor replaces it."""
    ignored = resource.get("ignoreChanges") or []
    return [p for p in paths if not any(_covers(i, p) for i in ignored)]


def _at(value: Any, path: str) -> Any:
    for key in path.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def immutable_changes(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], str, Any,
                                                                                      Any]]:
    """(the head's resource, input, before, after) for each change of an input the API server refuses to change on
    a resource the provider updates in place: `pulumi up` would fail on it. A resource replaced anyway (by one of
    its own inputs) is a new object, which takes any value."""
    table = rules()
    before = {r["urn"]: r for r in base["resources"]}
    found = []
    for resource in head["resources"]:
        old, rule = before.get(resource["urn"]), table.of(resource["type"])
        if old is None or not rule.immutable:
            continue
        paths = _kept(changed_paths(old["inputs"], resource["inputs"], rule), resource)
        if _replacing(paths, rule):
            continue
        for field_path in rule.immutable:
            if any(_covers(field_path, p) for p in paths):
                found.append((resource, field_path, _at(old["inputs"], field_path), _at(resource["inputs"],
                                                                                         field_path)))
    return found


def _follows(resource: Mapping[str, Any], rule: TypeRule, replaced: Mapping[str, str],
             resources: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Why a resource is replaced because a resource it takes an unknown value from is (None if it is not)."""
    sources = resource.get("propertyDependencies") or {}
    forcing: list[str] = []
    followed: set[str] = set()
    for path in _replacing(_kept(_unknown_paths(resource["inputs"]), resource), rule):
        top = path.split(".", 1)[0].split("[", 1)[0]
        gone = [u for u in sources.get(top, []) if u in replaced]
        if gone:
            forcing.append(path)
            followed.update(resources[u]["name"] for u in gone if u in resources)
    if not forcing:
        return None
    return f"{', '.join(forcing)} take(s) a new value from {', '.join(sorted(followed))}, which is replaced"


def _unknown_paths(value: Any, path: str = "") -> list[str]:
    if value == UNKNOWN:
        return [path]
    if isinstance(value, Mapping):
        return [p for k, v in value.items() for p in _unknown_paths(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _unknown_paths(v, f"{path}[{i}]")]
    return []


# --- comparing plans ----------------------------------------------------------------------------------------------

def _resources(plan: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Custom resources by URN (components are only groupings: their children say what changes)."""
    return {r["urn"]: r for r in plan["resources"] if not _is_component(r["type"])}


def _provider_moves(old: str, new: str, before: Mapping[str, Mapping[str, Any]],
                    after: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether a resource's provider now points somewhere else. A provider renamed with the same configuration (an
    adopted cluster's kubeconfig and context) moves nothing: the real engine diffs the resource as before. One whose
    configuration changes, or comes from other resources (a renamed EKS cluster's endpoint), targets another
    cluster: its resources are created there."""
    if old == new:
        return False
    was, now = before.get(old), after.get(new)
    if was is None or now is None:
        return True
    return bool(was["inputs"] != now["inputs"]
                or was.get("propertyDependencies", {}) != now.get("propertyDependencies", {}))


def _is_component(resource_type: str) -> bool:
    return resource_type.startswith("triarch:") or resource_type == "pulumi:pulumi:Stack"


def diff_plans(base: Mapping[str, Any], head: Mapping[str, Any], intended: Iterable[str] = (),
               replacement: Rules | None = None) -> Diff:
    """The differences between two plan.json documents of one stack."""
    rules_ = replacement or rules()
    marked = set(intended)
    before, after = _resources(base), _resources(head)
    result = Diff()
    replaced: dict[str, str] = {}
    changed: dict[str, list[str]] = {}
    for urn in sorted(set(before) & set(after)):
        rule = rules_.of(after[urn]["type"])
        paths = _kept(changed_paths(before[urn]["inputs"], after[urn]["inputs"], rule), after[urn])
        if paths:
            changed[urn] = paths
        forcing = _replacing(paths, rule)
        old_provider, new_provider = before[urn].get("provider"), after[urn].get("provider")
        if old_provider and new_provider and _provider_moves(old_provider, new_provider, before, after):
            replaced[urn] = (f"its provider changes to another target ({old_provider.rsplit('::', 1)[-1]} -> "
                             f"{new_provider.rsplit('::', 1)[-1]}): it is created there and deleted here")
        elif forcing:
            replaced[urn] = f"{', '.join(forcing)} cannot change in place"
    # A replaced resource gets new ids: an input whose value only the cloud knows and that comes from it (the
    # engine's property dependencies) changes too; where that input cannot change in place, the resource is
    # replaced as well. Iterated until nothing more follows.
    progress = True
    while progress:
        progress = False
        for urn in sorted(set(before) & set(after)):
            if urn in replaced:
                continue
            cause = _follows(after[urn], rules_.of(after[urn]["type"]), replaced, after)
            if cause:
                replaced[urn] = cause
                progress = True

    def difference(kind: Kind, resource: Mapping[str, Any], paths: list[str], cause: str) -> Difference:
        rule = rules_.of(resource["type"])
        is_marked = resource["name"] in marked or resource["urn"] in marked
        lost = rule.loses(kind)
        if kind == "removed" and rule.kept_on_removal:
            cause = f"{cause}; {rule.kept_on_removal}"
        return Difference(kind, resource["type"], resource["name"], resource["urn"], paths,
                          rule.stateful is not None or lost is not None, cause if lost is None else f"{cause}; {lost}",
                          is_marked)

    for urn in sorted(set(after) - set(before)):
        result.differences.append(difference("added", after[urn], [], "new in the head"))
    for urn in sorted(set(before) - set(after)):
        result.differences.append(difference("removed", before[urn], [], "gone from the head"))
    for urn in sorted(set(before) & set(after)):
        if urn in replaced:
            result.differences.append(difference("replaced", after[urn], changed.get(urn, []), replaced[urn]))
        elif urn in changed:
            result.differences.append(difference("changed", after[urn], changed[urn], "updated in place"))
    result.engine = engine_changes(base, head)
    result.vllm = vllm_release_changes(base, head)
    return result


def load_plan(directory: Path, option: str = "--base") -> dict[str, Any]:
    path = directory / "plan.json"
    try:
        document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(option, str(directory), f"holds no readable plan.json ({error.__class__.__name__})",
                          "a directory written by `triarch plan`" + (", or a git ref" if option == "--base" else ""))\
            from None
    if not isinstance(document, dict) or "resources" not in document:
        raise ConfigError(option, str(directory), "holds a plan.json without resources",
                          "a directory written by `triarch plan`")
    for resource in document["resources"]:
        resource.setdefault("urn", urn_of(str(document.get("stack", "")), resource))
    return document


def load_capacity(directory: Path) -> dict[str, Any] | None:
    """capacity.json beside a plan (None for a plan written before Triarch wrote it)."""
    try:
        document = json.loads((directory / "capacity.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return document if isinstance(document, dict) else None


def urn_of(stack: str, resource: Mapping[str, Any]) -> str:
    """A resource's URN as the offline plan forms it (for plans written before plan.json carried URNs): the
    parent's own type, then the resource's type and name (the mock engine's form, which the URNs of any plan
    written by `triarch plan` follow)."""
    parts = str(resource.get("parent") or "").split("::")
    qualified = f"{parts[2].rsplit('$', 1)[-1]}${resource['type']}" if len(parts) >= 4 else resource["type"]
    return f"urn:pulumi:{stack}::triarch::{qualified}::{resource['name']}"
