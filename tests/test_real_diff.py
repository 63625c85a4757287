"""`triarch diff` against the real engine: for realistic edits of the deployed lab stack, `pulumi preview --json`
(the real CLI and Kubernetes provider, server-side dry runs against the real API server) and `triarch diff` (two
offline plans) must agree on which Kubernetes resources are created, updated in place, replaced and deleted.

Two edits are changes of Triarch's own code (a release that adds a namespace label, one that changes the dashboard):
the same patched program runs under the mock engine for the plan and under the CLI for the preview."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT
from engine_tier import Lab, scratch_project
from triarch.diff import diff_plans
from triarch.offline import read_stack_config, run_program, write_plan

Edit = Callable[[dict[str, Any]], object]

PATCHES = {
    "namespace-label": (
        "import triarch.planners.pods as pods\n"
        "original = pods.namespace\n"
        "def labelled(*args, **kwargs):\n"
        "    namespace = original(*args, **kwargs)\n"
        "    namespace['metadata']['labels']['triarch.dev/tier'] = 'serving'\n"
        "    return namespace\n"
        "pods.namespace = labelled\n"),
    "dashboard-data": (
        "import triarch.planners.dashboard as dashboard\n"
        "original = dashboard.dashboard\n"
        "def retitled(*args, **kwargs):\n"
        "    body = original(*args, **kwargs)\n"
        "    body['title'] = body['title'] + ' (lab)'\n"
        "    return body\n"
        "dashboard.dashboard = retitled\n"),
}
"""Code edits: Python run before the program (both engines run the same text)."""


def _model(config: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(m for m in config["triarch:models"] if m["name"] == name)
    return found


def _pool(config: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(g for g in config["triarch:nodeGroups"] if g["name"] == name)
    return found


CONFIG_EDITS: dict[str, Edit] = {
    "image-bump": lambda c: c.setdefault("triarch:images", {}).update(vllm="vllm/vllm-openai:v0.29.0"),
    "engine-arg": lambda c: _model(c, "chat").update(maxModelLen=4096),
    "model-added": lambda c: c["triarch:models"].append(
        {"name": "coder", "model": "Qwen/Qwen2.5-7B-Instruct", "engine": "vllm", "nodeGroup": "a10g",
         "maxModelLen": 4096}),
    "model-renamed": lambda c: _model(c, "chat").update(name="assistant"),
    "model-removed": lambda c: c["triarch:models"].remove(_model(c, "embed")),
    "pool-max": lambda c: _pool(c, "a10g").update(max=6),
    "cache-size": lambda c: _model(c, "chat").update(cacheGiB=64),
    "slo-threshold": lambda c: _model(c, "chat").update(timeToFirstTokenSloSeconds=1.5),
    # the Kubernetes provider is named after the cluster: every object changes provider, with the same target
    "cluster-renamed": lambda c: c["triarch:cluster"].update(name="lab-b"),
}

OPS = {"create": "added", "delete": "removed", "update": "changed", "replace": "replaced",
       "create-replacement": "replaced", "delete-replaced": "replaced"}
"""Pulumi's step ops, in triarch diff's words."""


def _kind_of(resource_type: str) -> bool:
    return resource_type.startswith("kubernetes:") and not resource_type.startswith("pulumi:providers:")


def preview_changes(document: dict[str, Any]) -> dict[tuple[str, str], str]:
    """(type, name) -> what `pulumi preview --json` will do to each Kubernetes resource it changes."""
    found: dict[tuple[str, str], str] = {}
    for step in document.get("steps", []):
        op = step.get("op")
        urn: str = step["urn"]
        resource_type = urn.split("::")[2].rsplit("$", 1)[-1]
        if op not in OPS or not _kind_of(resource_type):
            continue
        found[(resource_type, urn.split("::")[-1])] = OPS[op]
    return found


def diff_changes(base: dict[str, Any], head: dict[str, Any]) -> dict[tuple[str, str], str]:
    result = diff_plans(base, head)
    return {(d.type, d.name): d.kind for d in result.differences if _kind_of(d.type)}


PLAN_SCRIPT = """
import sys
from pathlib import Path
from triarch.offline import read_stack_config, run_program, write_plan
config, secret_keys = read_stack_config(Path(sys.argv[1]))
def program():
    from triarch.program import main
    main()
write_plan(run_program("lab", config, secret_keys, program), Path(sys.argv[2]))
"""


def _plan(config_file: Path, tmp: Path, patch: str | None) -> dict[str, Any]:
    """The offline plan; a code edit is planned in a Python process of its own, so the patch dies with it."""
    out = tmp / "plan"
    if patch is None:
        config, secret_keys = read_stack_config(config_file)
        write_plan(run_program("lab", config, secret_keys), out)
    else:
        script = tmp / "plan_patched.py"
        script.write_text(patch + PLAN_SCRIPT)
        subprocess.run([sys.executable, str(script), str(config_file), str(out)], check=True, cwd=ROOT,
                       capture_output=True, text=True)
    loaded: dict[str, Any] = json.loads((out / "plan.json").read_text())
    return loaded


@contextmanager
def patched_project(lab: Lab, tmp: Path, patch: str) -> Iterator[Path]:
    """A scratch project whose program runs `patch` first, with the lab's stack file (same project name, so the
    same stack and state)."""
    project = scratch_project(tmp / "patched", patch + "from triarch.program import main\nmain()\n")
    shutil.copy2(lab.stack_file, project / lab.stack_file.name)
    yield project


@pytest.fixture(scope="session")
def base_plan(deployed: Lab, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _plan(deployed.stack_file, tmp_path_factory.mktemp("base"), None)


def _compare(deployed: Lab, base: dict[str, Any], tmp: Path, edit: Edit | None,
             patch: str | None) -> tuple[dict[tuple[str, str], str], dict[tuple[str, str], str]]:
    edited = copy.deepcopy(deployed.config)
    if edit is not None:
        edit(edited)
    deployed.write_config(edited)
    try:
        head = _plan(deployed.stack_file, tmp, patch)
        if patch is None:
            done = deployed.pulumi("preview", "--json")
        else:
            (tmp / "patched").mkdir()
            with patched_project(deployed, tmp, patch) as project:
                done = deployed.pulumi("preview", "--json", cwd=project)
    finally:
        deployed.write_config(deployed.config)
    return diff_changes(base, head), preview_changes(json.loads(done.stdout))


@pytest.mark.parametrize("name", sorted(CONFIG_EDITS))
def test_diff_agrees_with_the_real_preview_on_a_stack_edit(deployed: Lab, base_plan: dict[str, Any],
                                                           tmp_path: Path, name: str) -> None:
    ours, real = _compare(deployed, base_plan, tmp_path, CONFIG_EDITS[name], None)
    assert ours == real
    assert real or name == "pool-max", "the edit changes something"


@pytest.mark.parametrize("name", sorted(PATCHES))
def test_diff_agrees_with_the_real_preview_on_a_code_edit(deployed: Lab, base_plan: dict[str, Any],
                                                          tmp_path: Path, name: str) -> None:
    ours, real = _compare(deployed, base_plan, tmp_path, None, PATCHES[name])
    assert ours == real
    assert real


def test_a_claims_access_mode_change_is_a_replacement_the_real_preview_cannot_show(
        deployed: Lab, base_plan: dict[str, Any], tmp_path: Path) -> None:
    """Found on the real engine: a claim's spec is immutable, so triarch diff (rightly) says the claims are
    replaced, losing their caches; pulumi-kubernetes 4.25.0's preview dry-runs the replacement as an apply to the
    live claim of the same name, and the API server refuses it (pulumi-kubernetes#3767). The preview fails; the
    diff is what shows the change."""
    edited = copy.deepcopy(deployed.config)
    edited["triarch:serving"]["accessMode"] = "ReadWriteOnce"
    deployed.write_config(edited)
    try:
        head = _plan(deployed.stack_file, tmp_path, None)
        done = deployed.pulumi("preview", check=False)
    finally:
        deployed.write_config(deployed.config)
    ours = diff_changes(base_plan, head)
    claims = {name: kind for (kind_type, name), kind in ours.items() if kind_type.endswith("PersistentVolumeClaim")}
    assert claims == {"persistentvolumeclaim-llm-chat-hf-cache": "replaced",
                      "persistentvolumeclaim-llm-llm-hf-cache": "replaced"}
    assert all(d.stateful for d in diff_plans(base_plan, head).of("replaced"))
    assert done.returncode != 0
    assert "spec is immutable after creation" in done.stdout

