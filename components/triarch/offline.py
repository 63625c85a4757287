"""Run the unchanged Pulumi program in-process under Pulumi's mock engine: no CLI, no credentials, no cluster.

The mocks behave like a preview of a new stack: each resource's outputs are its inputs, and everything the
cloud assigns (ids, ARNs, endpoints) stays unknown, so values derived from them are marked known after apply.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import runpy
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.output import Unknown
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.rpc import UNKNOWN, _special_secret_sig, _special_sig_key
from pulumi.runtime.settings import get_root_resource
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from triarch.config import NAMESPACE, SECRET_KEYS
from triarch.errors import ConfigError
from triarch.known import KNOWN_AFTER_APPLY
from triarch.paths import PROGRAM, STACKS_DIR

_YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
"""libyaml's dumper where PyYAML was built with it: a plan writes a few dozen manifests."""

PROJECT = "triarch"
SECRET = "[secret]"
SECRET_INPUTS = {"kubernetes:core/v1:Secret": ("data", "stringData")}
PLAIN_TEXT_REFUSED = tuple(f"{NAMESPACE}:{key}" for key in SECRET_KEYS)
"""Keys that must be Pulumi secrets (`secure:` in the stack file), never plain text."""

NOT_MANIFESTS = ("kubernetes:helm.sh/", "pulumi:providers:", "kubernetes:yaml")


@dataclass(frozen=True)
class Registered:
    type: str
    name: str
    urn: str
    parent: str | None
    custom: bool
    inputs: dict[str, Any]
    dependencies: tuple[str, ...] = ()
    """URNs the resource waits for (depends_on and inputs from other resources), as the engine receives them."""
    property_dependencies: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Top-level input -> the URNs its value comes from (a value only the cloud knows follows those resources)."""
    ignore_changes: tuple[str, ...] = ()
    """Input paths Pulumi keeps at their old value on an update (the resource's ignoreChanges option)."""
    provider: str | None = None
    """The URN of the resource's explicit provider (a default provider is left out: its version may move freely)."""


@dataclass
class PlanRun:
    stack: str
    resources: list[Registered] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """What the program logged as warnings (pulumi.log.warn), in order."""
    outputs: dict[str, Any] = field(default_factory=dict)
    """The stack's outputs (`pulumi stack output`), a secret one as SECRET."""


def _clean(value: Any) -> Any:
    """Mock values as a plan shows them: integers as integers, unknowns and secrets marked."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Unknown) or value == UNKNOWN:
        return KNOWN_AFTER_APPLY
    if isinstance(value, Mapping):
        if value.get(_special_sig_key) == _special_secret_sig:
            # A Pulumi secret: its shape stays (a map keeps its keys), its values never reach the plan.
            inner = value.get("value")
            return dict.fromkeys(inner, SECRET) if isinstance(inner, Mapping) else SECRET
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return f"<{type(value).__name__}>"  # a resource reference or another SDK object


class _EngineLog(logging.Logger):
    """Stands in for the engine's log: keeps warnings and errors for the summary instead of printing them."""

    def __init__(self, run: PlanRun) -> None:
        super().__init__("triarch.offline", logging.WARNING)
        self.run = run

    def handle(self, record: logging.LogRecord) -> None:
        self.run.warnings.append(record.getMessage())


GENERATED_OUTPUTS: dict[str, dict[str, str]] = {
    "random:index/randomPassword:RandomPassword": {"result": "<generated at apply>"},
}
"""Outputs a provider generates without the cloud (a random password): the mock gives a placeholder, which every
consumer holds as a Pulumi secret, so a plan shows only that it is one."""

COMPUTED_NESTED_OUTPUTS: dict[str, tuple[tuple[str, str], ...]] = {
    "aws:eks/cluster:Cluster": (("vpcConfig", "clusterSecurityGroupId"), ("vpcConfig", "vpcId")),
}
"""Outputs the cloud assigns inside an input object: absent from the inputs a mock echoes, so marked unknown here
(as a preview shows them) rather than read as null. Top-level outputs a mock leaves out are unknown already."""


class _PreviewMocks(pulumi.runtime.Mocks):
    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict[str, Any]]:
        outputs = dict(args.inputs)
        if args.typ in GENERATED_OUTPUTS:
            # A value the provider generates at apply, known to be a string: a map holding it keeps its keys.
            outputs.update(GENERATED_OUTPUTS[args.typ])
        for parent, key in COMPUTED_NESTED_OUTPUTS.get(args.typ, ()):
            if isinstance(outputs.get(parent), dict):
                outputs[parent] = {**outputs[parent], key: UNKNOWN}
        return None, outputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        return {}, None


class _RecordingMonitor(MockMonitor):
    """The SDK's mock monitor, also keeping each registration's parent and order."""

    def __init__(self, mocks: pulumi.runtime.Mocks, run: PlanRun) -> None:
        super().__init__(mocks)
        self.run = run

    def RegisterResource(self, request: Any) -> Any:
        response = super().RegisterResource(request)  # type: ignore[no-untyped-call]  # SDK method is untyped
        if request.type != "pulumi:pulumi:Stack":
            inputs = _clean(self.resources[response.urn].state)
            for parent, key in COMPUTED_NESTED_OUTPUTS.get(request.type, ()):
                if isinstance(inputs.get(parent), dict):
                    inputs[parent].pop(key, None)  # an output the mock added, not an input
            for key in SECRET_INPUTS.get(request.type, ()):
                if key in inputs:  # a map keeps its keys; a map whose keys are not known yet is one secret
                    inputs[key] = dict.fromkeys(inputs[key], SECRET) if isinstance(inputs[key], Mapping) else SECRET
            by_property = {key: tuple(sorted(set(deps.urns))) for key, deps in request.propertyDependencies.items()
                           if deps.urns}
            self.run.resources.append(Registered(
                request.type, request.name, response.urn, request.parent or None, bool(request.custom), inputs,
                tuple(sorted(set(request.dependencies))), dict(sorted(by_property.items())),
                tuple(request.ignoreChanges), explicit_provider(request.provider)))
        return response


def explicit_provider(reference: str) -> str | None:
    """The provider's URN from a provider reference (`<urn>::<id>`), None for none or a default provider."""
    if not reference:
        return None
    urn = reference.rsplit("::", 1)[0]
    return None if urn.rsplit("::", 1)[-1].startswith("default") else urn


def _run_project_program() -> None:
    runpy.run_path(str(PROGRAM), run_name="__main__")


async def _record_outputs(run: PlanRun) -> None:
    """The stack's exports as `pulumi stack output` would list them (the mocks finish the root stack resource before
    the program runs, so its outputs are read here, not from a registration)."""
    root = get_root_resource()
    for name, value in sorted(getattr(root, "outputs", {}).items()):
        output = pulumi.Output.from_input(value)
        if await output.is_secret():
            run.outputs[name] = SECRET
        elif not await output.is_known():
            run.outputs[name] = KNOWN_AFTER_APPLY
        else:
            run.outputs[name] = _clean(await output.future())


def run_program(stack: str, config: Mapping[str, str], secret_keys: list[str],
                program: Callable[[], None] | None = None) -> PlanRun:
    """Register every resource of `program` (default: the project's __main__.py) with the given stack config."""
    run = PlanRun(stack)
    mocks = _PreviewMocks()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # before set_mocks: the root stack resource binds to the current loop
    try:
        pulumi.runtime.settings.reset_options()
        pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack, preview=True,
                                 monitor=_RecordingMonitor(mocks, run), logger=_EngineLog(run))
        pulumi.runtime.set_all_config(dict(config), secret_keys)
        body = program or _run_project_program

        def program_then_outputs() -> Awaitable[None]:
            body()
            return _record_outputs(run)

        _sync_await(run_pulumi_func(program_then_outputs))
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    return run


# --- stack files -------------------------------------------------------------------------------------------

def stack_file(name: str) -> Path:
    path = STACKS_DIR / f"Pulumi.{name}.yaml"
    if not path.is_file():
        known = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in STACKS_DIR.glob("Pulumi.*.yaml"))
        raise ConfigError("--stack", name, "is not a stack of this project", ", ".join(known))
    return path


def stack_name_of(path: Path) -> str:
    parts = path.name.split(".")
    return parts[1] if len(parts) == 3 and parts[0] == "Pulumi" else path.stem


class DuplicateKey(Exception):
    def __init__(self, key: Any, first: int, again: int) -> None:
        super().__init__(key)
        self.key, self.first, self.again = key, first, again


class _StackLoader(yaml.SafeLoader):
    """YAML as Pulumi reads a stack file: a mapping with a key twice is an error, not the last value winning; merge
    keys (`<<: *pool`) and anchors are YAML 1.1's, which Pulumi's reader accepts too, and a key written beside a
    merge overrides the merged one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # merged in by the base class, below the keys written here
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKey(key, seen[key], line)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def read_text(path: Path, what: str) -> str:
    """A file's text, or one sentence saying why it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise ConfigError(what, str(path), "is a directory", "a file") from None
    except FileNotFoundError:
        raise ConfigError(what, str(path), "does not exist", "an existing file") from None
    except PermissionError:
        raise ConfigError(what, str(path), "cannot be read (permission denied)", "a readable file") from None
    except UnicodeDecodeError as error:
        raise ConfigError(what, str(path), f"is not UTF-8 text (byte {error.start})", "a UTF-8 file") from None
    except OSError as error:
        raise ConfigError(what, str(path), f"cannot be read ({error.strerror})", "a readable file") from None


def read_stack_config(path: Path) -> tuple[dict[str, str], list[str]]:
    """A stack file's config as the Pulumi engine hands it to a program: strings, objects as JSON.

    Secure values cannot be decrypted offline; they are passed as a placeholder and marked secret.
    """
    text = read_text(path, "--stack-file")
    try:
        document = yaml.load(text, Loader=_StackLoader) or {}
    except DuplicateKey as error:
        raise ConfigError(str(path), None, f"names {error.key!r} twice (lines {error.first} and {error.again}); the "
                          "first value would be lost, and Pulumi refuses such a file", "each key once",
                          show_value=False) from None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(str(path), None, f"is not valid YAML ({where}{error.problem})",
                          "a Pulumi stack file", show_value=False) from None
    except yaml.YAMLError as error:
        raise ConfigError(str(path), None, f"is not valid YAML ({error})", "a Pulumi stack file",
                          show_value=False) from None
    if not isinstance(document, dict):
        raise ConfigError(str(path), None, f"holds a YAML {type(document).__name__}, not a mapping",
                          "a Pulumi stack file: a mapping with a `config:` mapping of the stack's keys",
                          show_value=False)
    raw = document.get("config")
    if raw is None:
        stray = sorted(k for k in document if str(k).startswith(f"{NAMESPACE}:") or str(k) == "aws:region")
        if stray:
            raise ConfigError(str(path), None,
                              f"has {', '.join(map(str, stray))} at the top level, outside `config:`",
                              "the keys indented under a `config:` key", show_value=False)
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: config", raw, "is not a mapping", "key: value pairs", show_value=False)
    config: dict[str, str] = {}
    secrets: list[str] = []
    for key, value in raw.items():
        if isinstance(value, dict) and set(value) == {"secure"}:
            config[key] = SECRET
            secrets.append(key)
        elif key in PLAIN_TEXT_REFUSED:
            raise ConfigError(key, None, "is in plain text in the stack file, where anyone who reads the repository "
                              "(or a CI log) sees it: delete the line, rotate the value (it is exposed wherever the "
                              "file went), then set the new one as a secret",
                              f"pulumi config set --secret {key} <value>", show_value=False)
        elif isinstance(value, dict | list):
            config[key] = json.dumps(value)
        elif isinstance(value, bool):
            config[key] = "true" if value else "false"
        else:
            config[key] = str(value)
    return config, secrets


# --- what a plan writes ------------------------------------------------------------------------------------

def api_version_of(type_token: str) -> str:
    """'kubernetes:apps/v1:Deployment' -> 'apps/v1'; the core group has no prefix."""
    group_version = type_token.split(":")[1]
    return group_version.removeprefix("core/")


def auto_name(resource: Registered) -> str:
    """What Pulumi names an object without metadata.name: its resource name plus a random suffix
    (here derived from the URN, so plans are reproducible)."""
    return f"{resource.name}-{hashlib.sha256(resource.urn.encode()).hexdigest()[:8]}"


def manifests(run: PlanRun) -> list[dict[str, Any]]:
    """Every Kubernetes object the stack creates, as it would be applied."""
    objects = []
    for resource in run.resources:
        if not resource.type.startswith("kubernetes:") or resource.type.startswith(NOT_MANIFESTS):
            continue
        if resource.type.endswith("Patch"):
            continue
        kind = resource.type.rsplit(":", 1)[1]
        body = {"apiVersion": api_version_of(resource.type), "kind": kind,
                **{k: v for k, v in resource.inputs.items() if k not in ("apiVersion", "kind")}}
        metadata = body.setdefault("metadata", {})
        metadata.setdefault("name", auto_name(resource))
        objects.append(body)
    return objects


def manifest_filename(obj: Mapping[str, Any]) -> str:
    metadata = obj["metadata"]
    namespace = metadata.get("namespace")
    parts = [obj["kind"].lower(), *([namespace] if namespace else []), metadata["name"]]
    return "-".join(parts) + ".yaml"


def plan_document(run: PlanRun) -> dict[str, Any]:
    """The plan as written to plan.json: resources in URN order, so two plans of one stack are byte-identical
    (registration order varies with the engine's concurrency) and two plans can be diffed."""
    return {
        "stack": run.stack,
        "resources": [
            {"type": r.type, "name": r.name, "urn": r.urn, "parent": r.parent, "dependencies": list(r.dependencies),
             "propertyDependencies": {k: list(v) for k, v in r.property_dependencies.items()},
             **({"ignoreChanges": list(r.ignore_changes)} if r.ignore_changes else {}),
             **({"provider": r.provider} if r.provider else {}), "inputs": r.inputs}
            for r in sorted(run.resources, key=lambda r: r.urn)
        ],
    }


def write_plan(run: PlanRun, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(plan_document(run), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    manifest_dir = out / "manifests"
    manifest_dir.mkdir(exist_ok=True)
    for stale in manifest_dir.glob("*.yaml"):
        stale.unlink()
    written = []
    for obj in manifests(run):
        path = manifest_dir / manifest_filename(obj)
        path.write_text(yaml.dump(obj, Dumper=_YAML_DUMPER, sort_keys=False), encoding="utf-8")
        written.append(path)
    return written
