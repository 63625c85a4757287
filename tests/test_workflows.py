"""The GitHub workflows: every `triarch` command in them parses with the real CLI, every action is pinned by
commit, every job holds only the permissions it names, and the pull-request review runs as written: its steps
are executed on two commits of a temporary repository and produce the comment."""

from __future__ import annotations

import copy
import math
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT
from triarch.cli import build_parser
from triarch.local import engines
from triarch.review import MARKER

WORKFLOWS = ROOT / ".github" / "workflows"
ACTIONS = ROOT / ".github" / "actions"
SHELL_OPERATORS = {"|", "||", "&&", ";", ">", ">>", "2>", "<", "(", ")", "&"}


def workflows() -> dict[str, dict[str, Any]]:
    # PyYAML reads the key `on` as True; the workflows are read for their jobs and steps only.
    return {p.name: yaml.safe_load(p.read_text(encoding="utf-8")) for p in sorted(WORKFLOWS.glob("*.yml"))}


def run_blocks() -> list[tuple[str, str]]:
    return [(f"{name}:{job_id}", step["run"]) for name, workflow in workflows().items()
            for job_id, job in workflow["jobs"].items() for step in job.get("steps", []) if "run" in step]


def triarch_commands(script: str) -> list[list[str]]:
    """The argument lists given to `triarch` in a shell script (continuation lines joined, redirections and
    what follows an operator dropped; `$stack` and the like stay as the words they are)."""
    joined = script.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
        for i, word in enumerate(words):
            if word == "triarch" and (i == 0 or words[i - 1] in ("run", "then", "!", "if", *SHELL_OPERATORS)):
                argv = []
                for arg in words[i + 1:]:
                    if arg in SHELL_OPERATORS or arg.endswith(">") or arg == "2":
                        break
                    argv.append(arg)
                commands.append(argv)
    return commands


def test_the_workflows_call_triarch(tmp_path: Path) -> None:
    commands = [c for _, script in run_blocks() for c in triarch_commands(script)]
    subcommands = sorted({c[0] for c in commands})
    assert subcommands == ["comment", "local", "refdata", "review"]


PENDING = {("refdata", "fill"): "the reference-data cache", ("local", "netns"): "the rootless network namespaces"}
"""Commands the workflows call that other branches add (issue 32): until one is merged the CLI refuses it as an
unknown choice, and its block is skipped saying so; once merged it parses like any other."""


@pytest.mark.parametrize(("where", "script"), run_blocks())
def test_every_triarch_command_in_a_workflow_parses(where: str, script: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    pending = []
    for argv in triarch_commands(script):
        try:
            parser.parse_args(argv)
        except SystemExit:
            err = capsys.readouterr().err
            first, second = [*argv, "", ""][:2]
            key = (first, second)
            if key in PENDING and any(f"invalid choice: '{word}'" in err for word in key):
                pending.append(f"`triarch {first} {second}` ({PENDING[key]})")
                continue
            pytest.fail(f"{where}: `triarch {' '.join(argv)}` does not parse: {err}")
    if pending:
        pytest.skip(f"{where}: not in this CLI yet, added by another branch: {', '.join(sorted(set(pending)))}")


def test_the_command_extraction_itself() -> None:
    script = ('if ! uv run triarch plan --stack "$stack" --out "r/$stack" 2> "e.txt"; then\n'
              '  uv run triarch check --plan "r/$stack" --format json \\\n    > "c.json" || true\nfi\n')
    assert triarch_commands(script) == [["plan", "--stack", "$stack", "--out", "r/$stack"],
                                        ["check", "--plan", "r/$stack", "--format", "json"]]


PIN = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}$")


def test_every_action_is_pinned_by_commit_with_its_version_in_a_comment() -> None:
    for path in [*sorted(WORKFLOWS.glob("*.yml")), *sorted(ACTIONS.glob("*/action.yml"))]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            match = re.match(r"^\s*(?:- )?uses:\s*(\S+)(.*)$", line)
            if not match:
                continue
            target, rest = match.groups()
            if target.startswith("$/"):  # this repository's own workflow or action
                local = ROOT / target[2:]
                assert local.is_file() or (local / "action.yml").is_file(), f"{path.name}:{number}"
                continue
            assert PIN.match(target), f"{path.name}:{number}: {target} is not pinned to a commit"
            assert re.match(r"^\s+# v\d+\.\d+\.\d+", rest), f"{path.name}:{number}: no `# vX.Y.Z` after the pin"


def test_every_job_names_its_permissions_and_the_workflows_grant_none() -> None:
    for name, workflow in workflows().items():
        assert workflow["permissions"] == {}, name
        triggers = workflow[True]
        assert "pull_request_target" not in (triggers if isinstance(triggers, dict) else {}), name
        for job_id, job in workflow["jobs"].items():
            assert isinstance(job.get("permissions"), dict), f"{name}:{job_id}"
            assert "write-all" not in str(job["permissions"]), f"{name}:{job_id}"
            writes = {k for k, v in job["permissions"].items() if v == "write"}
            assert writes <= {"id-token", "pull-requests"}, f"{name}:{job_id}: {writes}"
            for step in job.get("steps", []):
                if str(step.get("uses", "")).startswith("actions/checkout@"):
                    assert step["with"]["persist-credentials"] is False, f"{name}:{job_id}"


def test_only_same_repository_pull_requests_get_credentials() -> None:
    flows = workflows()
    preview = flows["preview.yml"]["jobs"]["preview"]
    assert "github.event.pull_request.head.repo.full_name == github.repository" in preview["if"]
    for name, workflow in flows.items():
        for job_id, job in workflow["jobs"].items():
            if job.get("permissions", {}).get("id-token") == "write":
                # Only the Pulumi jobs, which run on pushes to main and on this repository's pull requests.
                assert name in ("preview.yml", "deploy.yml"), f"{name}:{job_id}"
                assert any(str(s.get("uses")) == "$/.github/actions/pulumi" for s in job["steps"])
    # Deploys never comment: their jobs hold no pull-request permission.
    assert all("pull-requests" not in job["permissions"] for job in flows["deploy.yml"]["jobs"].values())


def test_prod_is_updated_after_dev_and_behind_its_environment() -> None:
    deploy = workflows()["deploy.yml"]["jobs"]
    assert deploy["prod"]["needs"] == "dev"
    assert (deploy["dev"]["environment"], deploy["prod"]["environment"]) == ("dev", "prod")
    assert "needs.dev.result == 'success'" in deploy["prod"]["if"]
    for stack in ("dev", "prod"):
        job = deploy[stack]
        assert job["concurrency"] == {"group": f"pulumi-up-{stack}", "cancel-in-progress": False}
        [step] = [s for s in job["steps"] if s.get("uses") == "$/.github/actions/pulumi"]
        assert step["with"]["stack"] == stack and step["with"]["command"] == "up"
    action = yaml.safe_load((ACTIONS / "pulumi" / "action.yml").read_text(encoding="utf-8"))
    [pulumi] = [s for s in action["runs"]["steps"] if str(s.get("uses", "")).startswith("pulumi/actions@")]
    assert pulumi["with"]["policyPacks"] == "policies" and pulumi["with"]["refresh"] is True
    assert pulumi["with"]["policyPackConfigs"] == "${{ steps.policy.outputs.file }}"


# --- the tests' two jobs: where the real-engine tier could not run ------------------------------------------------

TIMINGS = ROOT / ".ci" / "timings.yaml"
ENGINE_CACHE = "~/.cache/triarch/engines"
REFERENCE_CACHE = "~/.cache/triarch/reference"
ENGINES_KEY = "hashFiles('tools/engines/**', 'components/triarch/local/engines.py')"
REFERENCE_KEY = "hashFiles('tools/reference/sources.yaml')"


def _action(step: dict[str, Any]) -> str:
    """The action a step uses, without its pin (actions/cache/restore), or ""."""
    return str(step.get("uses", "")).split("@", 1)[0]


def _paths(step: dict[str, Any]) -> list[str]:
    return [line.strip() for line in str((step.get("with") or {}).get("path", "")).splitlines() if line.strip()]


def _runs(step: dict[str, Any], *command: str) -> bool:
    """The step runs `triarch COMMAND...`."""
    return any(argv[:len(command)] == list(command) for argv in triarch_commands(str(step.get("run", ""))))


def _pytest_marks(step: dict[str, Any]) -> list[str]:
    """The -m expression of each pytest the step runs ("" for a pytest without one)."""
    marks = []
    for line in str(step.get("run", "")).replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if "pytest" in words:
            rest = words[words.index("pytest") + 1:]
            marks.append(rest[rest.index("-m") + 1] if "-m" in rest[:-1] else "")
    return marks


def _job_running(workflow: dict[str, Any], mark: str) -> tuple[str, dict[str, Any], int] | None:
    """The job that runs `pytest -m MARK`, and the index of that step."""
    for job_id, job in workflow["jobs"].items():
        for index, step in enumerate(job.get("steps", [])):
            if mark in _pytest_marks(step):
                return job_id, job, index
    return None


def _cache_problems(where: str, steps: list[dict[str, Any]], cache: str, key: str) -> list[str]:
    restores = [i for i, s in enumerate(steps) if _action(s) in ("actions/cache", "actions/cache/restore")
                and cache in _paths(s) and key in str(s["with"].get("key", ""))]
    saves = [i for i, s in enumerate(steps) if _action(s) in ("actions/cache", "actions/cache/save")
             and cache in _paths(s)]
    problems = []
    if not restores:
        problems.append(f"{where}: no actions/cache or actions/cache/restore step restores {cache} with a key on "
                        f"{key}")
    if not saves:
        problems.append(f"{where}: nothing saves {cache} (actions/cache or actions/cache/save), so every run is cold")
    return problems


MIRROR_VARIABLE = "${{ vars.TRIARCH_REFERENCE_MIRROR }}"


def _fill_step_problems(where: str, step: dict[str, Any]) -> list[str]:
    """Why a `triarch refdata fill` step would not do what its exit code promises: fill exits 0 where it left out
    only files that need a mirror (recording them, so their tests skip under CI) and 1 on any other problem, so the
    step must fail with it, fill from the TRIARCH_REFERENCE_MIRROR variable where it is set and from upstream
    (which writes that record) where it is not."""
    run = str(step.get("run", ""))
    fills = [argv for argv in triarch_commands(run) if argv[:2] == ["refdata", "fill"]]
    problems = []
    if step.get("continue-on-error"):
        problems.append(f"{where}: the `triarch refdata fill` step has continue-on-error, so a failed fill (a sha256 "
                        f"that differs, a failed download) passes")
    if any("||" in line for line in run.splitlines() if "refdata fill" in line):
        problems.append(f"{where}: `triarch refdata fill ... ||` swallows the fill's exit code")
    if ["refdata", "fill"] not in fills:
        problems.append(f"{where}: no plain `triarch refdata fill` (from upstream) where TRIARCH_REFERENCE_MIRROR is "
                        f"unset: nothing records the files that need a mirror, and their tests fail under CI")
    given = (step.get("env") or {}).get("MIRROR")
    if given != MIRROR_VARIABLE or ["refdata", "fill", "--from", "$MIRROR"] not in fills:
        problems.append(f"{where}: the fill step does not run `triarch refdata fill --from \"$MIRROR\"` with MIRROR: "
                        f"{MIRROR_VARIABLE}")
    return problems


def _fill_problems(where: str, steps: list[dict[str, Any]], before: int) -> list[str]:
    problems = _cache_problems(where, steps, REFERENCE_CACHE, REFERENCE_KEY)
    fills = [s for s in steps[:before] if _runs(s, "refdata", "fill")]
    if not fills:
        problems.append(f"{where}: no `triarch refdata fill` step before pytest (the reference data on a cache miss)")
    for step in fills:
        problems += _fill_step_problems(where, step)
    return problems


def _timeout_problems(where: str, job: dict[str, Any], minutes: float, how: str) -> list[str]:
    needed = math.ceil(minutes)
    given = job.get("timeout-minutes")
    if not isinstance(given, int):
        return [f"{where}: no timeout-minutes (GitHub's default is 6 hours); {how} needs >= {needed}"]
    return [] if given >= needed else [f"{where}: timeout-minutes {given} < {needed} = {how}"]


def tier_problems(workflow: dict[str, Any], timings: dict[str, Any]) -> list[str]:
    """Why the real-engine tier could not run in this workflow (and why the fast job would miss its data or
    time), one line each; [] where nothing stops them."""
    margin = float(timings["margin"])
    build, tier, fast = (float(timings[k]["minutes"]) for k in ("engine_build_cold", "real_tier_warm", "fast_job"))
    found = _job_running(workflow, "engines")
    if found is None:
        return ["no job runs `pytest -m engines`: the real-engine tier never runs"]
    job_id, job, at = found
    where, steps = f"job {job_id} (pytest -m engines)", job["steps"]
    problems = []
    go_file = str(engines.GO_VERSION_FILE.relative_to(ROOT))
    setup_go = [s for s in steps[:at] if _action(s) == "actions/setup-go"]
    if not setup_go:
        problems.append(f"{where}: no actions/setup-go step before pytest")
    for step in setup_go:
        if not PIN.match(str(step["uses"])):
            problems.append(f"{where}: actions/setup-go is not pinned by commit: {step['uses']}")
        given = (step.get("with") or {}).get("go-version-file")
        if given != go_file:
            problems.append(f"{where}: setup-go's go-version-file is {given!r}, not {go_file!r} (the file "
                            f"`triarch local build` checks go against)")
    problems += _cache_problems(where, steps, ENGINE_CACHE, ENGINES_KEY)
    if not any(_runs(s, "local", "build") for s in steps[:at]):
        problems.append(f"{where}: no `triarch local build` step before pytest (a cache miss leaves no engine)")
    if not any(_runs(s, "local", "netns") for s in steps[:at]):
        problems.append(f"{where}: no `triarch local netns` step before pytest (the namespace mode, or a fast "
                        f"failure where none works)")
    problems += _fill_problems(where, steps, at)
    problems += _timeout_problems(where, job, (build + tier) * margin,
                                  f"ceil((engine_build_cold {build:g} + real_tier_warm {tier:g}) * margin {margin:g})")
    fast_job = _job_running(workflow, "not engines")
    if fast_job is None:
        problems.append("no job runs `pytest -m \"not engines\"`: the tests that need no engine never run")
    else:
        fast_id, fast_steps_job, fast_at = fast_job
        fast_where = f"job {fast_id} (pytest -m \"not engines\")"
        problems += _fill_problems(fast_where, fast_steps_job["steps"], fast_at)
        problems += _timeout_problems(fast_where, fast_steps_job, fast * margin,
                                      f"ceil(fast_job {fast:g} * margin {margin:g})")
    return problems


def pull_request_workflow() -> dict[str, Any]:
    return yaml.safe_load((WORKFLOWS / "pull-request.yml").read_text(encoding="utf-8"))


def timings() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(TIMINGS.read_text(encoding="utf-8"))
    return loaded


def test_the_real_engine_tier_can_run_in_the_pull_request_workflow() -> None:
    assert tier_problems(pull_request_workflow(), timings()) == []


def _steps(workflow: dict[str, Any], job_id: str) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = workflow["jobs"][job_id]["steps"]
    return steps


def _drop(job_id: str, keep: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any]], None]:
    def mutate(workflow: dict[str, Any]) -> None:
        steps = _steps(workflow, job_id)
        kept = [s for s in steps if keep(s)]
        assert len(kept) < len(steps), "the mutation removed nothing"
        steps[:] = kept
    return mutate


def _edit(job_id: str, which: Callable[[dict[str, Any]], bool],
          change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def mutate(workflow: dict[str, Any]) -> None:
        chosen = [s for s in _steps(workflow, job_id) if which(s)]
        assert chosen, "the mutation found no step"
        for step in chosen:
            change(step)
    return mutate


def _move_last(job_id: str, which: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any]], None]:
    def mutate(workflow: dict[str, Any]) -> None:
        steps = _steps(workflow, job_id)
        moved = [s for s in steps if which(s)]
        assert moved, "the mutation found no step"
        steps[:] = [s for s in steps if not which(s)] + moved
    return mutate


def _is_engine_cache(step: dict[str, Any]) -> bool:
    return ENGINE_CACHE in _paths(step)


def _is_reference_cache(step: dict[str, Any]) -> bool:
    return REFERENCE_CACHE in _paths(step)


def _set_timeout(job_id: str, minutes: int | None) -> Callable[[dict[str, Any]], None]:
    def mutate(workflow: dict[str, Any]) -> None:
        if minutes is None:
            del workflow["jobs"][job_id]["timeout-minutes"]
        else:
            workflow["jobs"][job_id]["timeout-minutes"] = minutes
    return mutate


def _unmark(workflow: dict[str, Any]) -> None:
    for step in _steps(workflow, "engines"):
        if "engines" in _pytest_marks(step):
            step["run"] = "uv run --extra test pytest tests/test_real_engines.py"


MUTANTS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "no pytest -m engines": (_unmark, "no job runs `pytest -m engines`"),
    "no setup-go": (_drop("engines", lambda s: _action(s) != "actions/setup-go"),
                    "job engines (pytest -m engines): no actions/setup-go step before pytest"),
    "setup-go by tag": (_edit("engines", lambda s: _action(s) == "actions/setup-go",
                              lambda s: s.update(uses="actions/setup-go@v7")),
                        "actions/setup-go is not pinned by commit: actions/setup-go@v7"),
    "setup-go reads another file": (
        _edit("engines", lambda s: _action(s) == "actions/setup-go",
              lambda s: s["with"].update({"go-version-file": "go.mod"})),
        "setup-go's go-version-file is 'go.mod', not 'tools/engines/.go-version'"),
    "setup-go given a version": (
        _edit("engines", lambda s: _action(s) == "actions/setup-go",
              lambda s: s.update({"with": {"go-version": "1.26"}})),
        "setup-go's go-version-file is None, not 'tools/engines/.go-version'"),
    "engine cache not restored": (
        _drop("engines", lambda s: not (_is_engine_cache(s) and _action(s) == "actions/cache/restore")),
        f"no actions/cache or actions/cache/restore step restores {ENGINE_CACHE} with a key on {ENGINES_KEY}"),
    "engine cache keyed on something else": (
        _edit("engines", lambda s: _is_engine_cache(s) and "restore-keys" in s["with"],
              lambda s: s["with"].update(key="engines-${{ runner.os }}")),
        f"restores {ENGINE_CACHE} with a key on {ENGINES_KEY}"),
    "engine cache never saved": (
        _drop("engines", lambda s: not (_is_engine_cache(s) and _action(s) == "actions/cache/save")),
        f"job engines (pytest -m engines): nothing saves {ENGINE_CACHE}"),
    "no build": (_drop("engines", lambda s: not _runs(s, "local", "build")),
                 "no `triarch local build` step before pytest"),
    "no netns": (_drop("engines", lambda s: not _runs(s, "local", "netns")),
                 "job engines (pytest -m engines): no `triarch local netns` step before pytest"),
    "netns after pytest": (_move_last("engines", lambda s: _runs(s, "local", "netns")),
                           "no `triarch local netns` step before pytest"),
    "reference cache not restored": (
        _drop("engines", lambda s: not (_is_reference_cache(s) and _action(s) == "actions/cache/restore")),
        f"job engines (pytest -m engines): no actions/cache or actions/cache/restore step restores "
        f"{REFERENCE_CACHE}"),
    "no fill": (_drop("engines", lambda s: not _runs(s, "refdata", "fill")),
                "job engines (pytest -m engines): no `triarch refdata fill` step before pytest"),
    "fill swallows its failure": (
        _edit("engines", lambda s: _runs(s, "refdata", "fill"),
              lambda s: s.update(run=s["run"].replace('--from "$MIRROR"', '--from "$MIRROR" || true'))),
        "job engines (pytest -m engines): `triarch refdata fill ... ||` swallows the fill's exit code"),
    "fill continues on error": (
        _edit("test", lambda s: _runs(s, "refdata", "fill"), lambda s: s.update({"continue-on-error": True})),
        "job test (pytest -m \"not engines\"): the `triarch refdata fill` step has continue-on-error"),
    "fill never from upstream": (
        _edit("test", lambda s: _runs(s, "refdata", "fill"),
              lambda s: s.update(run='uv run triarch refdata fill --from "$MIRROR"\n')),
        "job test (pytest -m \"not engines\"): no plain `triarch refdata fill` (from upstream)"),
    "fill ignores the mirror": (
        _edit("engines", lambda s: _runs(s, "refdata", "fill"),
              lambda s: s.update(run="uv run triarch refdata fill\n")),
        "job engines (pytest -m engines): the fill step does not run `triarch refdata fill --from \"$MIRROR\"`"),
    "tier timeout short": (_set_timeout("engines", 30),
                           "job engines (pytest -m engines): timeout-minutes 30 < 116 = ceil((engine_build_cold 45 + "
                           "real_tier_warm 32) * margin 1.5)"),
    "tier timeout missing": (_set_timeout("engines", None), "job engines (pytest -m engines): no timeout-minutes"),
    "fast job gone": (_drop("test", lambda s: "not engines" not in _pytest_marks(s)),
                      "no job runs `pytest -m \"not engines\"`"),
    "fast job without the reference cache": (
        _drop("test", lambda s: not (_is_reference_cache(s) and _action(s) == "actions/cache/restore")),
        f"job test (pytest -m \"not engines\"): no actions/cache or actions/cache/restore step restores "
        f"{REFERENCE_CACHE}"),
    "fast job without fill": (_drop("test", lambda s: not _runs(s, "refdata", "fill")),
                              "job test (pytest -m \"not engines\"): no `triarch refdata fill` step before pytest"),
    "fast timeout short": (_set_timeout("test", 5),
                           "job test (pytest -m \"not engines\"): timeout-minutes 5 < 8 = ceil(fast_job 5 * margin "
                           "1.5)"),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_checker_reports_each_thing_the_tier_needs_when_it_is_missing(mutant: str) -> None:
    mutate, said = MUTANTS[mutant]
    workflow = copy.deepcopy(pull_request_workflow())
    mutate(workflow)
    problems = tier_problems(workflow, timings())
    assert any(said in problem for problem in problems), f"{mutant}: {said!r} not in {problems}"


def test_a_longer_measured_build_asks_for_a_longer_timeout() -> None:
    longer = copy.deepcopy(timings())
    longer["engine_build_cold"]["minutes"] = 60
    assert tier_problems(pull_request_workflow(), longer) == [
        "job engines (pytest -m engines): timeout-minutes 116 < 138 = ceil((engine_build_cold 60 + real_tier_warm 32) "
        "* margin 1.5)"]


def test_the_timings_say_how_each_was_measured() -> None:
    for key in ("engine_build_cold", "real_tier_warm", "fast_job"):
        entry = timings()[key]
        assert entry["minutes"] > 0 and entry["what"] and entry["measured"], key
        assert "TODO" not in entry["measured"] and "2026-" in entry["measured"], f"{key}: measured when, how?"
    assert timings()["margin"] >= 1


def test_main_fills_the_caches_pull_requests_restore() -> None:
    """A pull request reads main's caches, not another pull request's: caches.yml saves them under the keys and
    paths pull-request.yml restores, so only the first run after a pin change builds cold."""
    def caches(workflow: dict[str, Any], job_id: str) -> dict[tuple[str, ...], tuple[str, str]]:
        return {tuple(_paths(s)): (s["with"]["key"], s["with"].get("restore-keys", ""))
                for s in _steps(workflow, job_id) if _action(s) == "actions/cache/restore"}

    flows = workflows()
    warm = caches(flows["caches.yml"], "caches")
    assert caches(flows["pull-request.yml"], "engines") == warm
    assert set(caches(flows["pull-request.yml"], "test").items()) <= set(warm.items())
    job = flows["caches.yml"]["jobs"]["caches"]
    assert [a for s in job["steps"] if (a := _action(s)) == "actions/setup-go"] == ["actions/setup-go"]
    assert any(_runs(s, "local", "build") for s in job["steps"])
    [fill] = [s for s in job["steps"] if _runs(s, "refdata", "fill")]
    assert _fill_step_problems("caches.yml", fill) == []
    t = timings()
    assert job["timeout-minutes"] >= math.ceil(t["engine_build_cold"]["minutes"] * t["margin"])
    assert flows["caches.yml"][True]["push"]["branches"] == ["main"]


def test_every_real_tier_test_is_marked_so_the_split_drops_none() -> None:
    """`pytest -m "not engines"` (the fast job) collects no test of tests/test_real_*.py but those that start no
    engine (NOT_ENGINES); the real-engine job collects the rest with `-m engines`."""
    real = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_real_*.py"))
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-m", "not engines", *real], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode in (0, 5), done.stdout[-3000:] + done.stderr[-3000:]
    unmarked = [line for line in done.stdout.splitlines() if "::" in line]
    stray = [line for line in unmarked if line.split("::", 1)[0] not in NOT_ENGINES]
    assert stray == [], ("tests of tests/test_real_*.py without the `engines` marker (use a fixture of "
                         "conftest.ENGINE_FIXTURES, e.g. `engines_required`):\n" + "\n".join(stray))
    # Each exemption is still true: its file exists and starts no engine.
    assert {line.split("::", 1)[0] for line in unmarked} == set(NOT_ENGINES)


NOT_ENGINES = {"tests/test_real_flags.py": "reads the pinned vLLM releases' flag lists from the reference data and "
                                           "starts no engine; it runs in the fast job, which fills that data too"}


def test_tests_outside_test_real_files_are_marked_by_the_fixtures_they_use() -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-m", "engines", "tests/test_alert_rules.py", "tests/test_local.py"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    marked = {line.split("[", 1)[0] for line in done.stdout.splitlines() if "::" in line}
    assert marked == {"tests/test_alert_rules.py::test_every_alert_fires_when_it_should_and_only_then",
                      "tests/test_alert_rules.py::test_a_broken_alert_fails_its_scenario",
                      "tests/test_alert_rules.py::test_every_dashboard_query_shows_the_data_it_is_for"}, done.stdout


# --- the review, run as written ------------------------------------------------------------------------------------

def _copy_tree(target: Path) -> None:
    """The working tree as git sees it (tracked and new files, not ignored ones) in a fresh repository."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.test",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.test"}
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True, env=env).stdout.strip()


def _uv_shim(directory: Path, repo: Path) -> Path:
    """`uv run CMD...` as the workflow writes it, run with this environment (the repository's own package first
    on the path) instead of a fresh `uv sync`, which the test machine may not reach."""
    shim = directory / "uv"
    shim.write_text("#!/bin/sh\n"
                    '[ "$1" = run ] || { echo "shim: only uv run" >&2; exit 2; }\n'
                    "shift\n"
                    f'PYTHONPATH="{repo / "components"}" exec "$@"\n', encoding="utf-8")
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    return directory


@pytest.fixture(scope="module")
def reviewed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """Two commits (the tree as it is; then prod with a larger L4 pool and a shorter context for `chat`), and the
    review job's steps run on the second as the pull-request workflow writes them."""
    repo = tmp_path_factory.mktemp("repo")
    _git(repo, "init", "-q", "-b", "main")
    _copy_tree(repo)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD")
    prod = repo / "stacks" / "Pulumi.prod.yaml"
    text = prod.read_text(encoding="utf-8")
    assert "      max: 6\n" in text and "      maxModelLen: 32768\n" in text
    prod.write_text(text.replace("      max: 6\n", "      max: 8\n", 1)
                    .replace("      maxModelLen: 32768\n", "      maxModelLen: 16384\n", 1), encoding="utf-8")
    _git(repo, "commit", "-q", "-am", "head")
    head = _git(repo, "rev-parse", "HEAD")

    job = workflows()["pull-request.yml"]["jobs"]["review"]
    expressions = {"github.event.pull_request.base.sha": base, "github.event.pull_request.head.sha": head,
                   "github.event.pull_request.number": "42"}
    bin_dir = _uv_shim(tmp_path_factory.mktemp("bin"), repo)
    summary = repo / "summary.md"
    env = {**os.environ, "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
           "GITHUB_STEP_SUMMARY": str(summary)}
    env.pop("VIRTUAL_ENV", None)
    done = None
    for step in job["steps"]:
        if "run" not in step or step.get("name") == "install":
            continue
        step_env = {k: re.sub(r"\$\{\{\s*(\S+)\s*\}\}", lambda m: expressions[m.group(1)], str(v))
                    for k, v in (step.get("env") or {}).items()}
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", step["run"]], cwd=repo,
                              env={**env, **step_env}, capture_output=True, text=True, check=False)
        if step["name"].startswith("verdict"):
            break
        assert done.returncode == 0, f"step {step['name']!r} failed:\n{done.stdout}\n{done.stderr}"
    assert done is not None
    return repo, done


def test_the_review_comments_every_stack_with_check_diff_capacity_and_cost(
        reviewed: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    repo, verdict = reviewed
    assert verdict.returncode == 0, verdict.stderr  # nothing mandatory, nothing stateful replaced
    comment = (repo / "review" / "comment.md").read_text(encoding="utf-8")
    assert comment.startswith(MARKER)
    assert (repo / "summary.md").read_text(encoding="utf-8") == comment
    assert (repo / "review" / "pr-number").read_text(encoding="utf-8").strip() == "42"
    stacks = sorted(p.name.split(".")[1] for p in (repo / "stacks").glob("Pulumi.*.yaml"))
    for stack in stacks:
        section = comment.split(f"`{stack}`", 1)[1].split("\n### ", 1)[0]
        assert "**Diff against the base:**" in section, stack
        assert "**Guardrails:** 0 mandatory" in section, stack
        assert "**Capacity and cost per month**" in section, stack
    prod = comment.split("`prod`", 1)[1]
    assert "- `chat`: `max_model_len` 32768 -> 16384" in prod
    # The L4 pool (g6.2xlarge, one GPU each) grew from 6 to 8 nodes: its row shows both.
    [l4] = [line for line in prod.splitlines() if line.startswith("| `l4` :arrow_right:")]
    assert "g6.2xlarge x 0-6, 0-6 GPUs" in l4 and "g6.2xlarge x 0-8, 0-8 GPUs" in l4
    assert "```mermaid" in prod
    dev = comment.split("`dev`", 1)[1].split("\n### ", 1)[0]
    assert "0 replaced, 0 added, 0 removed, 0 changed" in dev


def test_the_review_writes_what_it_compared(reviewed: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    repo, _ = reviewed
    review = repo / "review"
    for stack in ("dev", "prod", "local"):
        for part in (f"head/{stack}/plan.json", f"head/{stack}/capacity.json", f"base/{stack}/plan.json",
                     f"check/{stack}.json", f"diff/{stack}.json"):
            assert (review / part).is_file(), part
    assert not any((review / "errors").iterdir())


def test_a_reviewer_builds_the_comment_locally_before_pushing(tmp_path: Path) -> None:
    """`triarch review` in a clone with an uncommitted edit: the comment of that edit against main, in review/,
    which git ignores (so it is never committed by accident)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _copy_tree(repo)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    _git(repo, "checkout", "-q", "-b", "bigger-pool")
    dev = repo / "stacks" / "Pulumi.dev.yaml"
    text = dev.read_text(encoding="utf-8")
    assert "      max: 2\n" in text
    dev.write_text(text.replace("      max: 2\n", "      max: 3\n", 1), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(repo / "components")}
    done = subprocess.run([sys.executable, "-m", "triarch.cli", "review", "--stack", "dev"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr
    assert "wrote review/comment.md" in done.stdout, done.stdout
    comment = (repo / "review" / "comment.md").read_text(encoding="utf-8")
    head = _git(repo, "rev-parse", "HEAD")
    assert comment.startswith(f"{MARKER}\n## Triarch review of `{head[:12]}` + working tree against "
                              f"`{head[:12]}`"), comment[:200]
    assert "g6.xlarge x 0-2" in comment and "g6.xlarge x 0-3" in comment, comment
    for part in ("head/dev/plan.json", "base/dev/plan.json", "check/dev.json", "diff/dev.json"):
        assert (repo / "review" / part).is_file(), part
    assert _git(repo, "status", "--porcelain", "--untracked-files=all", "review") == ""
    assert _git(repo, "check-ignore", "review/comment.md") == "review/comment.md"
