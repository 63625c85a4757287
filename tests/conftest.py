"""Shared helpers: read the project's stacks as the CLI does, and build mutated copies of them."""

from __future__ import annotations

import atexit
import copy
import functools
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import jsonschema
import pytest
import yaml
from pulumi.runtime.mocks import MockMonitor

from triarch import refdata
from triarch.datafiles import read_yaml
from triarch.offline import PlanRun, Registered, manifests, read_stack_config, run_program

# A model outside the catalog is read from the Hugging Face Hub: no test may reach the real one (or read the
# developer's cache of it, or a token of theirs). The Hub by default is a loopback port nothing listens on (the
# connection is refused at once); tests that read a model serve their own Hub (tests/hub_server.py). triarch.hub
# imports the client (which reads its settings once) only when it first asks a Hub.
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"
os.environ["TRIARCH_HUB_CACHE"] = tempfile.mkdtemp(prefix="triarch-hub-cache-")
atexit.register(shutil.rmtree, os.environ["TRIARCH_HUB_CACHE"], True)
os.environ.pop("HF_TOKEN", None)
os.environ.pop("HF_HUB_OFFLINE", None)

ROOT = Path(__file__).resolve().parents[1]
STACKS_DIR = ROOT / "stacks"
COMPAT_DIR = ROOT / "templates" / "compat"

STACK_NAMES = sorted(p.name.split(".")[1] for p in STACKS_DIR.glob("Pulumi.*.yaml"))
"""The stacks shipped in stacks/ (Pulumi.<name>.yaml)."""

Mutation = Callable[[dict[str, Any]], object]
"""Changes a stack's `config:` mapping in place (its return value is ignored)."""
StackConfigReader = Callable[[str], dict[str, str]]
MutatedConfig = Callable[[str, Mutation], dict[str, str]]
StackWriter = Callable[[Mapping[str, Any]], Path]


def stack_path(name: str) -> Path:
    return STACKS_DIR / f"Pulumi.{name}.yaml"


def stack_document(name: str) -> dict[str, Any]:
    """The `config:` mapping of a shipped stack as YAML values (a fresh copy, safe to mutate)."""
    document = yaml.safe_load(stack_path(name).read_text(encoding="utf-8"))
    return copy.deepcopy(document["config"])


def compat_data(name: str) -> dict[str, Any]:
    """A templates/compat/<name>.yaml file read as plain YAML, independently of triarch.catalog."""
    data = yaml.safe_load((COMPAT_DIR / f"{name}.yaml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def write_stack_file(path: Path, config: Mapping[str, Any]) -> Path:
    """Write a Pulumi stack file with the given `config:` mapping."""
    path.write_text(yaml.safe_dump({"config": dict(config)}, sort_keys=False), encoding="utf-8")
    return path


def plan_refusal(tmp_path: Path, capsys: pytest.CaptureFixture[str], config: Mapping[str, Any]) -> str:
    """`triarch plan` of a stack with this `config:` refused as bad input: exit 2, one `error:` line on stderr and no
    traceback anywhere. Returns the line."""
    from triarch import cli

    path = write_stack_file(tmp_path / "Pulumi.bad.yaml", config)
    code = cli.main(["plan", "--stack-file", str(path), "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 2, captured.out + captured.err
    [line] = captured.err.splitlines()
    assert line.startswith("error: ") and "Traceback" not in captured.err + captured.out
    return line


@pytest.fixture
def stack_config() -> StackConfigReader:
    """`stack_config("prod")`: a shipped stack's config ("ns:key" -> string or JSON), as `triarch plan`
    reads it."""

    def read(name: str) -> dict[str, str]:
        return read_stack_config(stack_path(name))[0]

    return read


@pytest.fixture
def write_stack(tmp_path: Path) -> StackWriter:
    """`write_stack(config)`: a stack file in tmp_path holding `config` (a YAML `config:` mapping)."""

    def write(config: Mapping[str, Any]) -> Path:
        return write_stack_file(tmp_path / "Pulumi.test.yaml", config)

    return write


@pytest.fixture
def mutated_config(write_stack: StackWriter) -> MutatedConfig:
    """`mutated_config("prod", lambda c: c["triarch:nodeGroups"][1].update(min=3))`: the shipped stack with
    one change, as the "ns:key" -> string mapping that `from_pulumi_config` accepts."""

    def build(name: str, mutate: Mutation) -> dict[str, str]:
        config = stack_document(name)
        mutate(config)
        return read_stack_config(write_stack(config))[0]

    return build


def unknown_paths(ours: Any, upstream: Any, path: str = "", free: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """Key paths set in `ours` that the chart's values.yaml does not have.

    Below a key whose upstream default is an empty map ({}) anything goes (config.map, nodeSelector,
    resources, securityContext, ...), and below the paths in `free` (maps of names whose default is not empty);
    a list replaces the upstream list whole, so its items are not compared.
    """
    if not isinstance(ours, dict) or path in free:
        return []
    if not isinstance(upstream, dict):
        return [path or "<root>"]  # a map where the chart has a scalar or a list
    if not upstream:
        return []
    missing = []
    for key, value in ours.items():
        child = f"{path}.{key}" if path else str(key)
        if key not in upstream:
            missing.append(child)
        elif isinstance(value, dict) and upstream[key] is not None:
            missing += unknown_paths(value, upstream[key], child, free)
    return missing


def reference_unavailable(missing: refdata.ReferenceMissing) -> NoReturn:
    """Skip with the one line (reference data is not filled in this clone); under CI=true fail with it instead, as
    CI fills the cache first (.ci/run) and a skip there would hide a check that never ran, except for a file the
    last fill from upstream recorded as needing a mirror (a fork without TRIARCH_REFERENCE_MIRROR): refdata.verdict
    decides."""
    decided, line = refdata.verdict(missing, ci=os.environ.get("CI") == "true", marked=refdata.needs_mirror())
    if decided == "fail":
        pytest.fail(line, pytrace=False)
    pytest.skip(line)


def reference_file(*parts: str) -> Path:
    """A verified file of the reference cache (tools/reference/sources.yaml), e.g. reference_file("kuberay-v1.7.0",
    "values.yaml"); where it is not filled, the test skips (fails under CI, bar a file recorded as needing a mirror)
    with one line saying how to fill it."""
    try:
        return refdata.path("/".join(parts))
    except refdata.ReferenceMissing as missing:
        reference_unavailable(missing)


def reference_dir(*parts: str) -> Path:
    """A verified folder of the reference cache (every file listed under it checked), or skip / fail as above."""
    try:
        return refdata.directory("/".join(parts))
    except refdata.ReferenceMissing as missing:
        reference_unavailable(missing)


def crd_schema(*parts: str, version: str = "v1") -> dict[str, Any]:
    """The openAPIV3Schema the API server enforces for one served version of a CRD in the reference data (a copy:
    the file is parsed once per process, a CRD's schema is megabytes of YAML)."""
    [served] = [v for v in _crd(parts)["spec"]["versions"] if v["name"] == version]
    schema: dict[str, Any] = copy.deepcopy(served["schema"]["openAPIV3Schema"])
    return schema


@functools.cache
def _crd(parts: tuple[str, ...]) -> dict[str, Any]:
    crd: dict[str, Any] = read_yaml(reference_file(*parts))
    return crd


def schema_validate(instance: Any, schema: dict[str, Any]) -> None:
    """jsonschema.validate without checking the schema itself on every call (seconds for a CRD's): the CRDs are
    upstream's, and the API server has accepted them."""
    jsonschema.validators.validator_for(schema)(schema).validate(instance)


def unknown_fields(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Field paths of `value` that a structural schema does not declare (the API server would prune them
    silently; kubernetes-validate's strict mode rejects them)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found: list[str] = []
    if isinstance(value, dict):
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        for key, child in value.items():
            where = f"{path}.{key}" if path else key
            if properties is not None and key in properties:
                found += unknown_fields(child, properties[key], where)
            elif isinstance(additional, dict):
                found += unknown_fields(child, additional, where)
            elif properties is not None or additional is False:
                found.append(where)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            found += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return found


# --- plans shared by the whole session ----------------------------------------------------------------------

@dataclass
class StackPlan:
    """A stack planned through the whole program, with what the engine would receive beyond the inputs: each
    resource's dependencies and provider reference (read from the SDK's MockMonitor.RegisterResource request,
    wrapped for the one run)."""

    name: str
    config: dict[str, Any]
    """The stack's `config:` mapping as YAML values."""
    run: PlanRun
    dependencies: dict[str, list[str]]
    provider_of: dict[str, str]

    @property
    def resources(self) -> list[Registered]:
        return self.run.resources

    def of_type(self, type_: str) -> list[Registered]:
        return [r for r in self.run.resources if r.type == type_]

    def objects(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [o for o in manifests(self.run) if kind is None or o["kind"] == kind]


def plan_config(name: str, config: Mapping[str, Any], directory: Path) -> StackPlan:
    """Plan a stack mapping the way `triarch plan` does (its stack-file reader, the whole program)."""
    directory.mkdir(parents=True, exist_ok=True)
    values, secrets = read_stack_config(write_stack_file(directory / f"Pulumi.{name}.yaml", config))
    dependencies: dict[str, list[str]] = {}
    provider_of: dict[str, str] = {}
    original = MockMonitor.RegisterResource

    def recording(self: MockMonitor, request: Any) -> Any:
        response = original(self, request)
        dependencies[response.urn] = list(request.dependencies)
        provider_of[response.urn] = request.provider
        return response

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MockMonitor, "RegisterResource", recording)
        run = run_program(name, values, secrets)
    return StackPlan(name, dict(config), run, dependencies, provider_of)


@pytest.fixture(scope="session")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, StackPlan]:
    """Every shipped stack, planned once for the whole session."""
    return {name: plan_config(name, stack_document(name), tmp_path_factory.mktemp(name)) for name in STACK_NAMES}


def bench_module(name: str) -> ModuleType:
    """A script of bench/ imported as a module (bench is not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# The real-engine tier's session fixtures (tests/engine_tier.py), visible to every test module.
from dataplane import data_plane  # noqa: E402,F401
from engine_tier import deployed, engines_required, lab  # noqa: E402,F401

ENGINE_FIXTURES = frozenset({
    "engines_required", "lab", "deployed",  # tests/engine_tier.py: the tier itself, the lab plane, its `pulumi up`
    "bare_plane",  # test_real_policy.py: a plane with every CRD and nothing deployed
    "from_zero",  # test_real_karpenter.py: a plane whose Karpenter pools start empty
    "promtool",  # test_alert_rules.py: the built promtool
    "fresh",  # test_real_charts.py: the fresh stack's whole `pulumi up` on a plane of its own
    "data_plane",  # tests/dataplane.py: real vLLM engines on CPU (the data-plane environments, a namespace)
})
"""Fixtures that need the built engines (and, for a plane, a network namespace). A test using one, directly or
through another fixture, gets the `engines` marker: CI runs `pytest -m "not engines"` in its fast job and
`pytest -m engines` in the real-engine tier's (tests/test_workflows.py checks every tests/test_real_*.py test is
marked). A new fixture that starts engines goes here, or requests `engines_required`."""


PLANE_GROUPS = {"lab": "lab", "deployed": "lab", "from_zero": "from-zero", "bare_plane": "bare-plane",
                "fresh": "fresh"}
"""The session fixture that holds a plane -> the group of every test using it. Under pytest-xdist (`-n N`, the
suite's default in pyproject's addopts) a group's tests run on one worker, so each plane comes up once per run, while
the planes and the tests that need none run side by side: the real tier mostly waits on its engines."""

SHARED_GROUPS = {"reviewed": "review"}
"""Other fixtures that take minutes and serve several tests (test_workflows' review of a pull request, which runs
`triarch plan`, `check` and `diff` of every stack twice): their tests on one worker too, so each is made once per
run rather than once per worker its tests land on."""


DATAPLANE_FIXTURES = frozenset({"data_plane"})
"""Fixtures that start real vLLM or Ray Serve engines on CPU: a test using one gets the `dataplane` marker (and
`engines`: CI's real-engine tier runs it), and every such test is in one group, run on one worker. Their modules run
one at a time anyway (tests/dataplane.py's lock, for memory): as one group no second worker sits waiting on that
lock, with the tests queued behind it idle (CI 2026-12-07: the drain module waited 21 minutes, Ray's 18)."""

DATAPLANE_GROUP = "dataplane"

DATAPLANE_LAST = ("test_dataplane_ray.py", "test_dataplane_drain.py")
"""Data-plane modules run after the group's others, in this order: the ones whose figures depend most on the CPU
they get (Ray's deploy and routing deadlines, the drain's streams against its shutdown timeout) at the end, when the
other workers' planes have mostly ended; the others (the metrics and vLLM modules, whose engine starts only wait)
first, in file order."""


def plane_group(fixtures: Iterable[str]) -> str | None:
    groups = {**PLANE_GROUPS, **SHARED_GROUPS}
    found = [groups[f] for f in fixtures if f in groups]
    if DATAPLANE_FIXTURES.intersection(fixtures):
        found.append(DATAPLANE_GROUP)
    return min(found, default=None)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups: dict[str, str] = {}
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if ENGINE_FIXTURES.intersection(fixtures):
            item.add_marker(pytest.mark.engines)
        if DATAPLANE_FIXTURES.intersection(fixtures):
            item.add_marker(pytest.mark.dataplane)
        if (group := plane_group(fixtures)) is not None:
            groups[item.nodeid] = group
    items[:] = contiguous(items, groups)
    shared = getattr(config, "workerinput", {}).get(GROUPS_FILE)
    if shared:  # a worker tells the controller's scheduler (every worker collects the same; the last write wins)
        partial = Path(f"{shared}.{os.getpid()}")
        partial.write_text(json.dumps(groups))
        partial.replace(shared)


def contiguous(items: list[pytest.Item], groups: Mapping[str, str]) -> list[pytest.Item]:
    """The items with each group's tests moved up to where the group's first test stands, in their order: a plane
    comes up once and goes as soon as its last test ends (`pytest_runtest_teardown`), also in one process (-n 0), where
    the files' order would interleave the lab's modules with other planes'. Under pytest-xdist every worker orders the
    same way (the scheduler sends a group's tests to one worker, in this order)."""
    first: dict[str, int] = {}
    for at, item in enumerate(items):
        if (group := groups.get(item.nodeid)) is not None:
            first.setdefault(group, at)
    ranked = {item.nodeid: first[groups[item.nodeid]] if item.nodeid in groups else at for at, item in enumerate(items)}
    return sorted(items, key=lambda item: (ranked[item.nodeid], last_in_group(item.nodeid)))


def last_in_group(nodeid: str) -> int:
    """0 for most tests; 1, 2, ... for the data-plane modules that run after their group's others (DATAPLANE_LAST)."""
    module = nodeid.split("::")[0].rsplit("/", 1)[-1]
    return DATAPLANE_LAST.index(module) + 1 if module in DATAPLANE_LAST else 0


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A plane's fixtures end as soon as the next test uses none of its group, not at the end of the session: an idle
    plane (its API server, etcd, controllers, kwok's heartbeats and the operators' loops) costs CPU the rest of the
    run on two cores needs. A later test that needs the plane again would bring it up again (`contiguous` orders the
    tests so that none does)."""
    try:
        yield
    finally:
        if nextitem is not None:  # else the session's own teardown follows
            release_planes(item, nextitem)


def release_planes(item: pytest.Item, nextitem: pytest.Item) -> None:
    used = set(getattr(item, "fixturenames", ()))
    needed = {PLANE_GROUPS[f] for f in getattr(nextitem, "fixturenames", ()) if f in PLANE_GROUPS}
    ending = [f for f in PLANE_GROUPS if f in used and PLANE_GROUPS[f] not in needed]
    definitions = item._fixtureinfo.name2fixturedefs  # type: ignore[attr-defined]
    request = item._request  # type: ignore[attr-defined]
    for name in ending:
        for definition in reversed(definitions.get(name, ())):
            definition.finish(request)


# --- pytest-xdist: a plane's tests on one worker --------------------------------------------------------------------
# xdist's own `--dist loadgroup` renames a grouped test's node id, which pytest 9.2 no longer lets a plugin do (its
# node ids are structured), so every test would land on any worker and bring up a plane of its own. The scheduler
# below groups by the plane fixtures the workers saw instead, through a file the controller names.

GROUPS_FILE = "triarch_plane_groups"


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: absent under -p no:xdist
def pytest_configure_node(node: Any) -> None:  # the controller, once per worker it starts
    node.workerinput[GROUPS_FILE] = str(_groups_file(node.config))


def pytest_unconfigure(config: pytest.Config) -> None:
    if (path := config.stash.get(GROUPS_PATH, None)) is not None:
        shutil.rmtree(path.parent, ignore_errors=True)


GROUPS_PATH = pytest.StashKey[Path]()
"""Where the workers write which tests use which plane (the controller's, made when its first worker starts)."""


def _groups_file(config: pytest.Config) -> Path:
    if GROUPS_PATH not in config.stash:
        config.stash[GROUPS_PATH] = Path(tempfile.mkdtemp(prefix="triarch-xdist-")) / "groups.json"
    return config.stash[GROUPS_PATH]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    if config.getvalue("dist") == "each":
        return None

    groups_file = _groups_file(config)

    class PlaneGroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """LoadScope with one scope per plane (the rest: one test each); the largest scopes go first."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = json.loads(groups_file.read_text()) if groups_file.is_file() else {}
            return f"group {group}" if (group := self.groups.get(nodeid)) else nodeid

    return PlaneGroupScheduling(config, log)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How the real-engine tier's planes get their network namespace here (root, user namespaces, sudo), or why
    they cannot: one line (the controller's own choice; the workers choose the same on this machine)."""
    from triarch.local import netns

    try:
        line = netns.choose().line
    except netns.NetnsError as error:
        line = str(error)
    terminalreporter.write_line(f"real-engine tier: {line}")
