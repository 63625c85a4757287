"""The README and docs/ as a reader follows them: every relative link and anchor lands, every page is found from the
README and leads back to it, the alerts' runbook link names a page that exists, the README's test command is the one
CI runs, and the mutation benchmark's count is stated once. Links break silently when a page or heading moves."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest
import yaml

from triarch.planners.observability import RUNBOOK

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GENERATED = {"stack-keys.md"}  # written by `triarch reference`, not by hand
LINK = re.compile(r"\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)")
CODE_SPAN = re.compile(r"`[^`]*`")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """Lines outside fenced code blocks, numbered from 1."""
    out, fence = [], ""
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if fence:
            if stripped.startswith(fence):
                fence = ""
            continue
        if stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
            continue
        out.append((number, line))
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """Every Markdown link's target on a prose line, leaving out those inside an inline code span."""
    found = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        spans = [m.span() for m in CODE_SPAN.finditer(line)]
        for match in LINK.finditer(line):
            if not any(start < match.start() < end for start, end in spans):
                found.append((number, match.group("target")))
    return found


def anchor(heading: str) -> str:
    """GitHub's id for a heading: links reduced to their text, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    ids = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        match = re.match(r"#{1,6} +(.+?) *#*$", line)
        if match:
            base = anchor(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            ids.add(base if count == 0 else f"{base}-{count}")
    return ids


def broken(path: Path, target: str) -> str | None:
    """Why a relative link from `path` does not land, or None when it does."""
    file_part, _, fragment = target.partition("#")
    dest = path if not file_part else (path.parent / unquote(file_part)).resolve()
    if not dest.exists():
        return f"{dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest} does not exist"
    if not dest.is_relative_to(ROOT):
        return "points outside the repository"
    if fragment and dest.suffix == ".md" and fragment not in anchors(dest):
        return f"{dest.relative_to(ROOT)} has no heading #{fragment}"
    return None


def test_the_github_anchor_of_a_heading() -> None:
    assert anchor("A first `pulumi up`") == "a-first-pulumi-up"
    assert anchor("Day 2: metrics, alerts, autoscaling and verifying a live cluster") == \
        "day-2-metrics-alerts-autoscaling-and-verifying-a-live-cluster"
    assert anchor("Cold start: from no node to a Ready replica") == "cold-start-from-no-node-to-a-ready-replica"


def test_a_broken_link_and_a_missing_anchor_are_found(tmp_path: Path) -> None:
    """The check itself: a page that does not exist, and a heading that does not, are both reported."""
    page = DOCS / "runbook.md"
    assert broken(page, "../README.md#a-first-review") is None
    assert broken(page, "no-such-page.md") is not None
    assert broken(page, "../README.md#no-such-heading") is not None
    assert broken(page, "#runbook-which-layer-is-failing") is None


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_lands(path: Path) -> None:
    found = [(n, t) for n, t in links(path) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto:
    problems = [f"{path.relative_to(ROOT)}:{n}: ({t}) {why}" for n, t in found if (why := broken(path, t))]
    assert problems == []


def test_every_docs_page_is_found_from_the_readme_and_leads_back() -> None:
    from_readme = {(ROOT / t.partition("#")[0]).resolve() for _, t in links(ROOT / "README.md")}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in from_readme]
    assert missing == [], "docs pages the README does not link"
    no_way_back = [p.name for p in sorted(DOCS.glob("*.md")) if p.name not in GENERATED
                   and not any(t.partition("#")[0] == "../README.md" for _, t in links(p))]
    assert no_way_back == [], "docs pages without a link back to the README"


def test_each_docs_page_opens_with_a_title_and_what_it_answers() -> None:
    for path in sorted(DOCS.glob("*.md")):
        if path.name in GENERATED:
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        assert lines[0].startswith("# "), path.name
        assert lines[1] == "" and lines[2] and not lines[2].startswith(("#", "```", "|", "- ")), path.name


def test_the_alerts_runbook_link_names_a_page_that_exists() -> None:
    assert broken(ROOT / "README.md", RUNBOOK) is None, RUNBOOK
    assert "| symptom | layer |" in (ROOT / RUNBOOK.partition("#")[0]).read_text(encoding="utf-8")


def test_the_readme_test_command_is_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    try_it = readme.split("## Try it", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    assert try_it[0] == "pip install uv && uv run triarch plan --stack prod --out out/prod"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert try_it[1] in ci, f"the README's test command {try_it[1]!r} is not a line of .ci/run"


def test_the_mutation_benchmarks_count_is_stated_once() -> None:
    """The count is edited by hand as mutants are added: in two places, one would go stale."""
    count = re.compile(r"\*\*\d+ mutants, \d+ caught\*\*")
    places = [(p.name, len(count.findall(p.read_text(encoding="utf-8")))) for p in pages()]
    assert [p for p in places if p[1]] == [("development.md", 1)]


def _readme_section(title: str) -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return readme.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def test_the_first_customisation_plans_as_the_readme_shows(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The README's first customisation, done as it says: its YAML block is dev's `triarch:models`, and the plan
    prints the rows and the tuner's note the README quotes; a third model on the pool is refused naming the key."""
    import yaml

    from conftest import plan_refusal, stack_document, write_stack_file
    from triarch import cli

    section = _readme_section("A first customisation: add a model, plan it")
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    config = stack_document("dev")
    config["triarch:models"] = yaml.safe_load(block)["triarch:models"]
    assert [m["name"] for m in config["triarch:models"]] == ["embed", "chat"]
    path = write_stack_file(tmp_path / "Pulumi.dev.yaml", config)
    assert cli.main(["plan", "--stack-file", str(path), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    quoted = section.split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    for line in quoted[1:]:  # the table's rows and the note; the header's columns are cut short with "..."
        shown = line.removesuffix("...").rstrip()
        assert shown in printed, f"the README shows {shown!r}; the plan printed:\n{printed}"
    third = {**config["triarch:models"][1], "name": "chat-2"}
    line = plan_refusal(tmp_path, capsys, {**config, "triarch:models": [*config["triarch:models"], third]})
    assert "triarch:nodeGroups[0].max" in line, line


OFFLINE_COMMANDS = {"plan", "tune", "check", "diff", "comment"}
"""The commands a reader can run as a docs page shows them, with no cluster, network or git history: run here."""
EXIT = re.compile(r"#\s*exit (\d+):")
"""A command's comment that says it exits non-zero on purpose (`# exit 1: the sample has mandatory findings`)."""


def shown_commands() -> list[tuple[str, list[str], int]]:
    """Each page's `uv run triarch ...` lines of its shell blocks that run offline, in the page's order: (page, argv,
    the exit code the page gives, else 0). Those that read a git ref (`--base main`, `--at`) need history a test
    has not, and so has what reads their output."""
    import shlex

    found = []
    unmade: set[str] = set()  # what a command not run here would have written
    for page in pages():
        text = page.read_text(encoding="utf-8")
        for block in re.findall(r"```(?:sh|bash|shell)\n(.*?)```", text, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                if not line.startswith("uv run triarch "):
                    continue
                command, _, comment = line.partition("#")
                argv = shlex.split(command)[3:]
                if argv[0] not in OFFLINE_COMMANDS:
                    continue
                if ("--at" in argv or ("--base" in argv and not argv[argv.index("--base") + 1].startswith("out/"))
                        or unmade.intersection(argv)):
                    unmade.update(argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--out")
                    continue
                said = EXIT.search("#" + comment) if comment else None
                found.append((page.name, argv, int(said[1]) if said else 0))
    return found


def test_the_docs_show_offline_commands_that_run_as_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Every offline command a page shows, run in order from a project-like folder (the repository's tests/ and
    bench/ beside it, as paths in the pages name them), exits as the page says."""
    from triarch import cli

    commands = shown_commands()
    assert {argv[0] for _, argv, _ in commands} >= {"plan", "tune", "check", "diff"}, commands
    for name in ("tests", "bench"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    for page, argv, expected in commands:
        code = cli.main(argv)
        said = capsys.readouterr()
        assert code == expected, f"{page}: `triarch {' '.join(argv)}` exited {code}, not {expected}: {said.err[-500:]}"


REAL_OR_STANDING_IN = "## What runs for real, and what stands in"
STAND_INS: dict[str, tuple[str, str]] = {
    "`triarch.local.kubelet`": ("components/triarch/local/operators.py", '"-m", "triarch.local.kubelet"'),
    "`tools/engines/pulumi-language-python`": ("tools/engines/engines.yaml", "sources: pulumi-language-python"),
    "`pulumi.runtime.set_mocks`": ("components/triarch/offline.py", "pulumi.runtime.set_mocks("),
    "`tests/aws_standin.py`": ("tests/test_real_policy.py", "aws_standin.py"),
    "`tests/ray_standin.py`": ("tests/test_real_ray.py", "ray_standin.py"),
    "`triarch.local.tiny_models`": ("tests/dataplane.py", "tiny_models"),
    "`triarch.local.cpu_serving`": ("tests/test_dataplane_ray.py", "cpu_serve_config("),
    "`tests/hub_server.py`": ("tests/conftest.py", "hub_server"),
}
"""Each stand-in the code uses, as the table names it, with a file and a line of it that use the stand-in: where the
code stops using one, this list and the table must say so."""
NOT_STAND_INS = {
    "conftest.py": "pytest's fixtures and the stacks' plans",
    "engine_tier.py": "starts and waits on the real engines of the tier",
    "dataplane.py": "starts the real vLLM and Ray Serve of the data plane",
    "ray_balance_probe.py": "a driver of Ray Serve's real router, with no engine behind it by design",
    "prometheus_harness.py": "runs the real Prometheus on what the real Prometheus Operator generated",
}
"""The tests' helper modules that stand in for nothing, with what they are."""


def real_table() -> list[tuple[str, str, str]]:
    """The rows of real-engines.md's table: (component, what runs for real, what stands in)."""
    text = (DOCS / "real-engines.md").read_text(encoding="utf-8")
    assert REAL_OR_STANDING_IN in text, "real-engines.md lost its table of what runs for real"
    section = text.split(REAL_OR_STANDING_IN, 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| Component")]
    assert rows and all(len(row) == 3 for row in rows), rows
    return [(row[0], row[1], row[2]) for row in rows]


def test_every_engine_built_is_named_as_what_runs_for_real() -> None:
    """Each binary `triarch local build` makes is named in the table's real column; an engine built at another
    version than its pin says which pin it stands in for, and an engine served by a main of ours names it."""
    engines = yaml.safe_load((ROOT / "tools/engines/engines.yaml").read_text(encoding="utf-8"))["engines"]
    rows = real_table()
    for name, engine in engines.items():
        for binary in engine["packages"]:
            if binary == engine.get("sources"):  # a main of ours: named as ours, wherever the row says it
                assert any(f"`tools/engines/{binary}`" in row[1] + row[2] for row in rows), (name, binary)
                continue
            holding = [row for row in rows if f"`{binary}`" in row[1]]
            assert holding, f"real-engines.md's table does not name `{binary}` (engine {name}) as what runs"
            [(_, real, standing_in)] = holding
            if "standsInFor" in engine:
                assert f"stands in for the pinned {engine['standsInFor'].lstrip('v')}" in standing_in, (name, binary)
            if engine.get("sources"):
                assert f"`tools/engines/{engine['sources']}`" in real + standing_in, (name, engine["sources"])


def test_every_stand_in_the_code_uses_is_named_with_its_reason() -> None:
    """Each stand-in is still in the code and named in the table's last column; a new helper module in tests/ must be
    placed as a stand-in or not, and a new user of Pulumi's mocks named."""
    stood_in = " ".join(row[2] for row in real_table())
    for named, (path, evidence) in STAND_INS.items():
        assert evidence in (ROOT / path).read_text(encoding="utf-8"), f"{path} no longer has {evidence!r}: {named}"
        assert named in stood_in, f"real-engines.md's table does not name {named} among the stand-ins"
    helpers = {p.name for p in (ROOT / "tests").glob("*.py") if not p.name.startswith("test_")}
    known = {m for named in STAND_INS for m in re.findall(r"`tests/(\w+\.py)`", named)} | set(NOT_STAND_INS)
    assert helpers == known, f"tests/ helpers not placed: {sorted(helpers - known)}; gone: {sorted(known - helpers)}"
    mocking = {str(p.relative_to(ROOT)) for base in ("components", "tests", "policies") for p in
               (ROOT / base).rglob("*.py") if p != Path(__file__) and "set_mocks(" in p.read_text(encoding="utf-8")}
    assert mocking == {STAND_INS["`pulumi.runtime.set_mocks`"][0]}, mocking


def test_every_pinned_chart_is_installed_by_the_whole_up_or_said_not_to_be() -> None:
    """The charts of templates/compat/charts.yaml: those the whole up installs (test_real_charts' releases) are named
    in the charts row's real column, each other one after "not installed" in its last column."""
    from test_real_charts import CHART_OF

    pinned = set(yaml.safe_load((ROOT / "templates/compat/charts.yaml").read_text(encoding="utf-8"))["charts"])
    installed = set(CHART_OF.values())
    assert installed <= pinned, installed - pinned
    [(_, real, standing_in)] = [row for row in real_table() if row[0] == "Charts"]
    not_installed = standing_in.split("not installed:", 1)[1]
    assert installed <= words(real), installed - words(real)
    assert pinned - installed <= words(not_installed), (pinned - installed) - words(not_installed)
    assert not installed & words(not_installed), installed & words(not_installed)


def words(cell: str) -> set[str]:
    """The lower-case words of a table cell, hyphens kept (chart names)."""
    return set(re.findall(r"[a-z][a-z0-9-]+", cell))


TEST_MAP = "## Where each module's tests are"
CLI_CALL = re.compile(r'main\(\[\s*"([a-z-]+)"')


def package_modules() -> list[str]:
    """Every module of the triarch package, dotted (a package by its own name)."""
    found = []
    for path in (ROOT / "components" / "triarch").rglob("*.py"):
        parts = list(path.relative_to(ROOT / "components").with_suffix("").parts)
        found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(found)


def naming_tests(modules: list[str]) -> dict[str, list[str]]:
    """For each module, the test modules that name it: import it or anything of it, spell its dotted name, or run
    its `triarch` command through `cli.main([...])` (the module of that command under triarch.cli)."""
    known = set(modules)
    named: dict[str, set[str]] = {module: set() for module in modules}
    for test in sorted((ROOT / "tests").glob("test_*.py")):
        text = test.read_text(encoding="utf-8")
        found: set[str] = set()
        for match in re.finditer(r"from (triarch(?:\.\w+)*) import \(?([\w, \n]+)", text):
            found.add(match[1])
            found.update(f"{match[1]}.{name}" for name in re.split(r"[,\s]+", match[2]) if name)
        for match in re.finditer(r"\b(triarch(?:\.\w+)+)", text):
            dotted = match[1]
            while dotted not in known and "." in dotted:
                dotted = dotted.rsplit(".", 1)[0]
            found.add(dotted)
        found.update(f"triarch.cli.{command}" for command in CLI_CALL.findall(text))
        for module in found & known:
            named[module].add(test.stem)
    return {module: sorted(tests) for module, tests in named.items()}


def map_section() -> str:
    """The section of docs/development.md that says where each module's tests are, as the tests stand."""
    named = naming_tests(package_modules())
    lines = [TEST_MAP, "",
             "Which test modules name each module of `components/triarch` (import it or something of it, spell its",
             "dotted name, or run its command through `cli.main`), so a change in one shows where its tests are. A",
             "module no test names is a gap: its behaviour is held, if at all, through the modules that use it.",
             "`tests/test_docs.py` keeps this list as the tests stand; it prints the list to paste when they move.", ""]
    for module, tests in named.items():
        lines.append(f"- `{module}`: " + (", ".join(tests) if tests else "**gap**: no test names it"))
    gaps = [module for module, tests in named.items() if not tests]
    lines += ["", f"{len(gaps)} of {len(named)} modules are gaps."]
    return "\n".join(lines) + "\n"


def test_the_test_map_is_the_tests_as_they_stand() -> None:
    """docs/development.md's map of which tests name which module is what the tests name today."""
    text = (DOCS / "development.md").read_text(encoding="utf-8")
    assert TEST_MAP in text, "development.md lost its test map"
    shown = TEST_MAP + text.split(TEST_MAP, 1)[1].split("\n## ", 1)[0].rstrip("\n") + "\n"
    expected = map_section()
    assert shown == expected, f"development.md's test map is stale; paste this section:\n\n{expected}"
