"""The GitHub workflows: every `triarch` command in them parses with the real CLI, every action is pinned by
commit, every job holds only the permissions it names, and the pull-request review runs as written: its steps
are executed on two commits of a temporary repository and produce the comment."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT
from triarch.cli import build_parser
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
    assert subcommands == ["comment", "review"]


@pytest.mark.parametrize(("where", "script"), run_blocks())
def test_every_triarch_command_in_a_workflow_parses(where: str, script: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    for argv in triarch_commands(script):
        try:
            parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{where}: `triarch {' '.join(argv)}` does not parse: {capsys.readouterr().err}")


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
