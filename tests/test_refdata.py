"""The reference data as a pinned input (triarch.refdata, tools/reference/sources.yaml): every file's sha256 held
against ../shared/reference, the cache filled from a directory or from upstream, a changed byte refused, a missing
file named in one line with the command that brings it, derived files made from upstream by their recipes, and
`triarch refdata` exit codes."""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
import urllib.error
from collections.abc import Callable
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
import yaml

import conftest
from triarch import cli, refdata

ROOT = Path(__file__).resolve().parents[1]
SHARED_REFERENCE = ROOT.parent / "shared" / "reference"
"""The one direct reader of ../shared: the sha256s of sources.yaml are held against its files here."""


A, B = b"kind: A\n", b"kind: B\n"
CASE_1, CASE_2 = b"- case: 1\n", b"- case: 2\n"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty reference cache for the test (TRIARCH_REFERENCE_CACHE)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("TRIARCH_REFERENCE_CACHE", str(root))
    return root


@pytest.fixture
def mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory laid out like ../shared/reference with two files, and sources pinning them (one derived)."""
    root = tmp_path / "mirror"
    (root / "chart" / "crds").mkdir(parents=True)
    (root / "chart" / "crds" / "a.yaml").write_bytes(b"kind: A\n")
    (root / "cases.yaml").write_bytes(b"- case: 1\n")
    pinned = {
        "chart/crds/a.yaml": refdata.Source("chart/crds/a.yaml", _sha(b"kind: A\n"),
                                            (root / "chart" / "crds" / "a.yaml").as_uri()),
        "cases.yaml": refdata.Source("cases.yaml", _sha(b"- case: 1\n"), "https://example.com/issues",
                                     "a curated compilation"),
    }
    monkeypatch.setattr(refdata, "load_sources", lambda: pinned)
    return root


# --- sources.yaml against ../shared ---------------------------------------------------------------------------

def test_every_reference_file_is_pinned_with_the_sha256_of_shared_reference() -> None:
    if not SHARED_REFERENCE.is_dir():
        pytest.skip(f"{SHARED_REFERENCE} is absent: sources.yaml's sha256s cannot be held against it here")
    present = {str(p.relative_to(SHARED_REFERENCE)) for p in SHARED_REFERENCE.rglob("*") if p.is_file()}
    pinned = refdata.load_sources()
    assert sorted(present - set(pinned)) == [], "in ../shared/reference but not in tools/reference/sources.yaml"
    assert sorted(set(pinned) - present) == [], "in tools/reference/sources.yaml but not in ../shared/reference"
    differing = [rel for rel, entry in pinned.items() if _sha((SHARED_REFERENCE / rel).read_bytes()) != entry.sha256]
    assert differing == []


def test_every_entry_has_a_digest_and_a_source_or_says_how_it_was_made() -> None:
    raw = yaml.safe_load(refdata.SOURCES.read_text(encoding="utf-8"))["files"]
    for rel, spec in raw.items():
        assert set(spec) <= {"sha256", "source", "derived", "derive"}, rel
        assert re.fullmatch(r"[0-9a-f]{64}", spec["sha256"]), rel
        assert spec["source"] or spec.get("derived"), rel
        if spec["source"]:
            assert re.match(r"https://(raw\.githubusercontent\.com|github\.com|pypi\.org)/", spec["source"]), rel
        if "derive" in spec:  # a recipe says how the bytes were made in words too, and pins its input
            assert spec.get("derived"), rel
            assert re.fullmatch(r"[0-9a-f]{64}", spec["derive"]["from_sha256"]), rel
    # every recipe names a known function with exactly its parameters (load_sources refuses anything else)
    assert {entry.derive.recipe for entry in refdata.load_sources().values() if entry.derive} == set(refdata.RECIPES)
    assert refdata.SOURCES.read_text(encoding="utf-8").startswith("# ")  # the header says what it is


def test_nothing_but_this_module_reads_shared_directly() -> None:
    pattern = re.compile(r"""/ ["']shared["']|["']\.\./shared/reference/""")
    readers = [str(p.relative_to(ROOT)) for folder in ("tests", "bench", "components")
               for p in (ROOT / folder).rglob("*.py")
               if pattern.search(p.read_text(encoding="utf-8")) and p.name != "test_refdata.py"]
    assert readers == []


GITHUB_AT = re.compile(r"^https://(raw\.githubusercontent\.com/[^/]+/[^/]+|github\.com/[^/]+/[^/]+/tree)/([^/]+)/")


def test_every_upstream_location_a_fill_reads_is_immutable() -> None:
    """A file `fill` brings from GitHub is read at a full commit id, never a tag, a branch or a short id (a tag can
    move, and a short id can become ambiguous); the other upstream is PyPI's release files (issue 48)."""
    read = [(rel, url) for rel, entry in refdata.load_sources().items() if entry.from_upstream
            for url in ([entry.derive.source] if entry.derive else [entry.source]) if url]
    assert len(read) >= 40
    github = [(rel, GITHUB_AT.match(url)) for rel, url in read if "github" in url]
    assert [rel for rel, found in github if found is None or not re.fullmatch(r"[0-9a-f]{40}", found.group(2))] == []
    assert [(rel, url) for rel, url in read if "github" not in url
            and not url.startswith("https://files.pythonhosted.org/packages/")] == []


SKIP_LOGIC = {"conftest.py": "reference_file and reference_dir: skip in a fork, fail under CI, in one line",
              "engine_tier.py": "the real tier's own skip, which names the missing folder in its one line",
              "test_refdata.py": "the cache itself, against mirrors this module makes"}
"""The test files that may ask the reference cache for a file or folder directly, each with why."""


def test_every_test_reads_the_reference_data_through_the_skip_logic() -> None:
    """A test that asks refdata for a file itself errors in a fork without that file instead of skipping with the
    line that says how to fill it (issue 48: the policy cases once did): only the skip logic asks directly."""
    pattern = re.compile(r"refdata\.(path|directory)\(")
    readers = sorted(p.name for p in (ROOT / "tests").rglob("*.py") if pattern.search(p.read_text(encoding="utf-8")))
    assert readers == sorted(SKIP_LOGIC)


# --- fill, path, directory ------------------------------------------------------------------------------------

def test_fill_from_a_directory_caches_every_file_verified(cache: Path, mirror: Path) -> None:
    assert refdata.fill(mirror) == refdata.Filled()
    assert refdata.path("chart/crds/a.yaml") == cache / "chart" / "crds" / "a.yaml"
    assert refdata.path("chart/crds/a.yaml").read_bytes() == b"kind: A\n"
    assert refdata.directory("chart/crds") == cache / "chart" / "crds"
    assert refdata.status() == {"chart/crds/a.yaml": "ok", "cases.yaml": "ok"}


def test_a_changed_byte_is_refused_naming_both_digests(cache: Path, mirror: Path) -> None:
    (mirror / "chart" / "crds" / "a.yaml").write_bytes(b"kind: B\n")
    [problem] = refdata.fill(mirror).problems
    assert problem == (f"chart/crds/a.yaml: sha256 {_sha(B)} from "
                       f"{mirror / 'chart' / 'crds' / 'a.yaml'}, but sources.yaml pins {_sha(A)} "
                       f"(source: {(mirror / 'chart' / 'crds' / 'a.yaml').as_uri()}); not cached")
    assert not (cache / "chart" / "crds" / "a.yaml").exists()
    assert (cache / "cases.yaml").is_file()  # the other file is cached all the same


def test_a_cached_file_changed_since_is_refused_in_one_line(cache: Path, mirror: Path) -> None:
    assert refdata.fill(mirror) == refdata.Filled()
    refdata._verified.clear()  # a new process: nothing checked yet
    (cache / "cases.yaml").write_bytes(b"- case: 2\n")
    with pytest.raises(refdata.ReferenceMissing) as info:
        refdata.path("cases.yaml")
    message = str(info.value)
    assert "\n" not in message
    assert f"has sha256 {_sha(CASE_2)}, not the pinned {_sha(CASE_1)}" in message
    assert refdata.status()["cases.yaml"] == f"sha256 {_sha(CASE_2)}"


def test_a_missing_file_is_named_in_one_line_with_its_source_and_the_command(cache: Path, mirror: Path) -> None:
    with pytest.raises(refdata.ReferenceMissing) as info:
        refdata.path("chart/crds/a.yaml")
    assert str(info.value) == (f"reference file chart/crds/a.yaml is not in {cache} (source: "
                               f"{(mirror / 'chart' / 'crds' / 'a.yaml').as_uri()}); bring it with "
                               "`uv run triarch refdata fill` (from upstream; or "
                               "`uv run triarch refdata fill --from ../shared/reference` where it is beside the clone)")
    with pytest.raises(refdata.ReferenceMissing,
                       match=r"cases\.yaml .*`uv run triarch refdata fill --from DIR\|URL` "
                             r"\(\.\./shared/reference or a mirror\), in CI the repository variable "
                             r"TRIARCH_REFERENCE_MIRROR$"):
        refdata.path("cases.yaml")  # derived: only a copy brings it
    with pytest.raises(ValueError, match=r"^nope\.yaml is not listed in tools/reference/sources\.yaml$"):
        refdata.path("nope.yaml")


def test_each_file_is_hashed_at_most_once_per_process(cache: Path, mirror: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert refdata.fill(mirror) == refdata.Filled()
    refdata._verified.clear()
    hashed: list[Path] = []
    digest = refdata._digest
    monkeypatch.setattr(refdata, "_digest", lambda p: hashed.append(p) or digest(p))
    for _ in range(3):
        refdata.path("cases.yaml")
    assert hashed == [cache / "cases.yaml"]


def test_fill_from_upstream_downloads_and_says_which_files_need_a_mirror(cache: Path, mirror: Path) -> None:
    filled = refdata.fill(None)
    assert filled.problems == []
    assert filled.need_mirror == ["cases.yaml: needs a mirror, upstream does not hold these bytes (a curated "
                                  "compilation); bring it with `uv run triarch refdata fill --from DIR|URL` "
                                  "(../shared/reference or a mirror), in CI the repository variable "
                                  "TRIARCH_REFERENCE_MIRROR"]
    assert (cache / "chart" / "crds" / "a.yaml").read_bytes() == b"kind: A\n"  # through urllib (a file: URL here)


def test_a_failed_download_is_one_line(cache: Path, mirror: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(url: str) -> bytes:
        raise OSError("timed out")

    monkeypatch.setattr(refdata, "_download", refuse)
    problems = refdata.fill(None).problems
    url = (mirror / "chart" / "crds" / "a.yaml").as_uri()
    assert problems[0] == f"chart/crds/a.yaml: download of {url} failed: timed out"


def test_an_unreachable_upstream_is_one_line_and_asked_once_per_host(cache: Path, mirror: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Offline (or behind a proxy that refuses): one line for every file its host could not bring, naming the
    host and why, and each host asked once, not once per file (each would wait out its timeout)."""
    (mirror / "chart" / "crds" / "b.yaml").write_bytes(B)  # a second file from the same host
    refdata.load_sources()["chart/crds/b.yaml"] = refdata.Source(
        "chart/crds/b.yaml", _sha(B), (mirror / "chart" / "crds" / "b.yaml").as_uri())
    asked: list[str] = []

    def offline(url: str) -> bytes:
        asked.append(url)
        raise urllib.error.URLError(OSError(101, "Network is unreachable"))

    monkeypatch.setattr(refdata, "_download", offline)
    assert cli.main(["refdata", "fill"]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1] == (f"0 of 3 reference files cached and verified in {cache}; 1 need a mirror "
                                             "(recorded in .needs-mirror: under CI their tests skip)")
    err = captured.err.splitlines()
    assert err[0] == f"warning: {NEEDS_MIRROR_LINE}"
    assert err[1:] == ["error: chart/crds/a.yaml and 1 more: not brought, upstream cannot be reached (file: [Errno "
                       "101] Network is unreachable); fill where it can be, or bring them with `uv run triarch "
                       "refdata fill --from DIR|URL` (../shared/reference or a mirror), in CI the repository variable "
                       "TRIARCH_REFERENCE_MIRROR"]
    assert len(asked) == 1  # the host, once
    # an answer is not unreachability: a 404 stays the file's own line, and the host is asked again
    asked.clear()

    def missing(url: str) -> bytes:
        asked.append(url)
        raise urllib.error.HTTPError(url, 404, "Not Found", Message(), None)

    monkeypatch.setattr(refdata, "_download", missing)
    problems = refdata.fill(None).problems
    assert len(problems) == len(asked) == 2 and all("HTTP Error 404: Not Found" in p for p in problems), problems
    assert [p.split(":")[0] for p in problems] == ["chart/crds/a.yaml", "chart/crds/b.yaml"]


# --- derivation recipes: pure transforms -----------------------------------------------------------------------

def _targz(members: dict[str, bytes]) -> bytes:
    """A small .tar.gz (an sdist, say) holding `members`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


TEMPLATE = (b"{{- if .Values.crds.install }}\napiVersion: v1\nmetadata:\n  labels:\n    app: {{ .Values.name }}\n"
            b"  name: x\n{{- end -}}\n")
PLAIN = b"# plain\napiVersion: v1\nmetadata:\n  labels:\n  name: x\n"
ARGS_PY = b"""import dataclasses
TOP: int = 1
@dataclasses.dataclass
class Base:
    port: int = 8000
    host: str | None = None
    def method(self) -> None:
        local: int = 2
class Args(Base):
    model: str = "m"
    api_key: str = ""
    port: int = 9000
    note = "not annotated"
"""
METRICS_PY = b"""NAMES = ["vllm:b_total", "vllm:a_seconds", "vllm:b_total"]
def build(name: str = "vllm:c_info") -> str:
    return f"vllm:{name}"  # not a whole literal
OTHER = "vllm:Not-Matching", "prefix vllm:d"
"""
SDIST = _targz({"pkg-1.0/pkg/args.py": ARGS_PY, "pkg-1.0/pkg/v1/metrics/m.py": METRICS_PY,
                "pkg-1.0/pkg/v1/spec/s.py": b'X = "vllm:spec_drafts"\n', "pkg-1.0/pkg/v2/n.py": b'Y = "vllm:later"\n',
                "pkg-1.0/README.md": b"vllm:readme\n"})


def test_strip_helm_lines_drops_every_line_with_an_action_and_puts_the_header_on_top() -> None:
    assert refdata.strip_helm_lines(TEMPLATE, "# plain") == PLAIN


def test_stamp_chart_version_sets_the_two_top_level_lines_and_keeps_every_other_byte() -> None:
    chart = b"apiVersion: v2\nversion: 1.13.0  \nappVersion: 1.13.0\ndependencies:\n  - version: 9.9.9\n"
    assert refdata.stamp_chart_version(chart, "1.14.1", "1.14.2") == (
        b"apiVersion: v2\nversion: 1.14.1\nappVersion: 1.14.2\ndependencies:\n  - version: 9.9.9\n")
    with pytest.raises(ValueError, match=r"^0 top-level `appVersion:` lines, not one$"):
        refdata.stamp_chart_version(b"version: 1\n", "2", "2")


def test_class_fields_in_declaration_order_or_sorted_each_name_once() -> None:
    assert refdata.class_fields(SDIST, "pkg-1.0/pkg/args.py", ["Args"], sort=False) == b"model\napi_key\nport\n"
    assert refdata.class_fields(SDIST, "pkg-1.0/pkg/args.py", ["Base", "Args"], sort=True) == (
        b"api_key\nhost\nmodel\nport\n")
    with pytest.raises(ValueError, match=r"^no class Gone in pkg-1\.0/pkg/args\.py$"):
        refdata.class_fields(SDIST, "pkg-1.0/pkg/args.py", ["Gone"], sort=True)
    with pytest.raises(ValueError, match=r"^no Python file under pkg-1\.0/pkg/gone\.py in the archive$"):
        refdata.class_fields(SDIST, "pkg-1.0/pkg/gone.py", ["Args"], sort=True)


def test_literal_names_are_the_whole_matching_literals_under_a_folder_sorted_once() -> None:
    assert refdata.literal_names(SDIST, "pkg-1.0/pkg/v1/metrics/", "vllm:[a-z0-9_]+") == (
        b"vllm:a_seconds\nvllm:b_total\nvllm:c_info\n")
    assert refdata.literal_names(SDIST, "pkg-1.0/pkg/v1/", "vllm:[a-z0-9_]+") == (
        b"vllm:a_seconds\nvllm:b_total\nvllm:c_info\nvllm:spec_drafts\n")
    with pytest.raises(ValueError, match=r"^not a readable \.tar\.gz"):
        refdata.literal_names(b"not gzip", "pkg-1.0/", "vllm:.*")


def test_sources_yaml_refuses_an_unknown_recipe_or_wrong_parameters(tmp_path: Path) -> None:
    def load(derive: dict[str, Any]) -> dict[str, refdata.Source]:
        path = tmp_path / f"sources-{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text(yaml.safe_dump({"files": {"a.yaml": {"sha256": "0" * 64, "source": "https://x/a.yaml",
                                                              "derived": "made", "derive": derive}}}))
        return refdata.load_sources(path)

    entry = load({"recipe": "strip-helm-lines", "header": "# h"})["a.yaml"]
    assert entry.derive == refdata.Derive("strip-helm-lines", "https://x/a.yaml", None, {"header": "# h"})
    assert entry.bring == ("`uv run triarch refdata fill` (from upstream; or "
                           "`uv run triarch refdata fill --from ../shared/reference` where it is beside the clone)")
    with pytest.raises(ValueError, match=r"^a\.yaml: unknown recipe 'sed' \(known: class-fields, "):
        load({"recipe": "sed"})
    with pytest.raises(ValueError, match=r"^a\.yaml: recipe strip-helm-lines takes header, not heading$"):
        load({"recipe": "strip-helm-lines", "heading": "# h"})


# --- the recipes against the real reference data -------------------------------------------------------------

def _member(archive: Path, name: str) -> bytes:
    with tarfile.open(archive, "r:gz") as tar:
        handle = tar.extractfile(name)
        assert handle is not None
        return handle.read()


def test_the_keda_recipes_make_the_pinned_crds_from_the_templates_of_the_pinned_chart_archive() -> None:
    """The archive was packaged from the commit `source` names, so its templates are the recipe's input."""
    archive = conftest.reference_file("charts", "keda-2.20.2.tgz")
    made = [rel for rel, entry in refdata.load_sources().items() if entry.derive and rel.startswith("keda-")]
    assert made == ["keda-2.20.2/crds/crd-scaledobjects.yaml", "keda-2.20.2/crds/crd-triggerauthentications.yaml"]
    for rel in made:
        derive = refdata.load_sources()[rel].derive
        assert derive is not None
        template = _member(archive, "keda/templates/crds/" + rel.rsplit("/", 1)[1])
        assert _sha(template) == derive.sha256, rel
        assert _sha(derive.apply(template)) == refdata.load_sources()[rel].sha256, rel


def test_the_karpenter_chart_yaml_is_the_tags_file_stamped() -> None:
    """The tag's file is not in the reference set: un-stamping the pinned file gives bytes with the input's pinned
    sha256 (checked by hand against the Go module zip of the tag), and the recipe gives them back."""
    entry = refdata.load_sources()["karpenter-v1.14.1/Chart.yaml"]
    pinned = conftest.reference_file("karpenter-v1.14.1", "Chart.yaml").read_bytes()
    assert entry.derive is not None
    tag = refdata.stamp_chart_version(pinned, "1.13.0", "1.13.0")
    assert _sha(tag) == entry.derive.sha256
    assert _sha(entry.derive.apply(tag)) == entry.sha256


def test_the_prometheus_operator_crds_are_kube_prometheus_stacks_copies_as_is() -> None:
    archive = conftest.reference_file("charts", "kube-prometheus-stack-88.5.3.tgz")
    for kind in ("podmonitors", "prometheusrules", "servicemonitors"):
        entry = refdata.load_sources()[f"prometheus-operator-v0.93.1/crds/crd-{kind}.yaml"]
        assert entry.derive is None and entry.derived is None
        assert entry.source is not None and entry.source.endswith(f"/charts/crds/crds/crd-{kind}.yaml")
        assert _sha(_member(archive, f"kube-prometheus-stack/charts/crds/crds/crd-{kind}.yaml")) == entry.sha256


# --- fill from upstream with recipes ---------------------------------------------------------------------------

SDIST_URL = "https://files.example/pkg-1.0.tar.gz"
TEMPLATE_URL = "https://raw.example/chart/templates/crd.yaml"


@pytest.fixture
def upstream(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Sources pinning three derived files made by recipes from two upstream inputs, served by a stubbed download
    (tests never touch the network); the URLs asked come back in order."""
    pinned = {
        "crds/a.yaml": refdata.Source("crds/a.yaml", _sha(PLAIN), TEMPLATE_URL, "the template stripped",
                                      refdata.Derive("strip-helm-lines", TEMPLATE_URL, _sha(TEMPLATE),
                                                     {"header": "# plain"})),
        "args.txt": refdata.Source("args.txt", _sha(b"model\napi_key\nport\n"), "https://pypi.example/pkg",
                                   "fields", refdata.Derive("class-fields", SDIST_URL, _sha(SDIST),
                                                            {"member": "pkg-1.0/pkg/args.py", "classes": ["Args"],
                                                             "sort": False})),
        "metrics.txt": refdata.Source("metrics.txt", _sha(b"vllm:spec_drafts\n"), "https://pypi.example/pkg",
                                      "names", refdata.Derive("literal-names", SDIST_URL, _sha(SDIST),
                                                              {"under": "pkg-1.0/pkg/v1/spec/",
                                                               "pattern": "vllm:[a-z_]+"})),
    }
    served = {TEMPLATE_URL: TEMPLATE, SDIST_URL: SDIST}
    asked: list[str] = []
    monkeypatch.setattr(refdata, "load_sources", lambda: pinned)
    monkeypatch.setattr(refdata, "_download", lambda url: asked.append(url) or served[url])
    return asked


def test_fill_from_upstream_makes_derived_files_by_their_recipes_each_input_downloaded_once(
        cache: Path, upstream: list[str]) -> None:
    lines: list[str] = []
    assert refdata.fill(None, log=lines.append) == refdata.Filled()
    assert upstream == [TEMPLATE_URL, SDIST_URL]
    assert refdata.path("crds/a.yaml").read_bytes() == PLAIN
    assert refdata.path("args.txt").read_bytes() == b"model\napi_key\nport\n"
    assert refdata.path("metrics.txt").read_bytes() == b"vllm:spec_drafts\n"
    assert lines[0] == f"crds/a.yaml: cached from strip-helm-lines of {TEMPLATE_URL}"


def test_a_broken_recipe_is_refused_by_the_pinned_sha256(cache: Path, upstream: list[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(refdata.RECIPES, "strip-helm-lines", lambda data, header: data)  # forgets to strip
    [problem] = refdata.fill(None).problems
    assert problem == (f"crds/a.yaml: sha256 {_sha(TEMPLATE)} from strip-helm-lines of {TEMPLATE_URL}, but "
                       f"sources.yaml pins {_sha(PLAIN)} (source: {TEMPLATE_URL}); not cached")
    assert not (cache / "crds" / "a.yaml").exists()
    assert (cache / "args.txt").is_file()


def test_an_input_that_is_not_the_pinned_one_is_refused_before_its_recipe_runs(
        cache: Path, upstream: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    changed = SDIST + b"\0"
    monkeypatch.setattr(refdata, "_download", lambda url: changed)
    problems = refdata.fill(None).problems
    assert problems[1] == (f"args.txt: class-fields of {SDIST_URL} failed: its input has sha256 "
                           f"{_sha(changed)}, but sources.yaml pins {_sha(SDIST)}")
    assert len(problems) == 3 and not cache.exists()


def test_a_file_with_a_recipe_is_brought_from_upstream_in_its_missing_line(cache: Path, upstream: list[str]) -> None:
    with pytest.raises(refdata.ReferenceMissing, match=r"crds/a\.yaml .*; bring it with `uv run triarch refdata fill` "
                                                       r"\(from upstream;"):
        refdata.path("crds/a.yaml")


# --- the command line -----------------------------------------------------------------------------------------

def test_status_exits_1_until_everything_is_filled(cache: Path, mirror: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["refdata", "status"]) == 1
    out = capsys.readouterr().out
    assert "missing: chart/crds/a.yaml" in out and "0 of 2 reference files cached and verified" in out
    assert cli.main(["refdata", "fill", "--from", str(mirror)]) == 0
    assert "2 of 2 reference files cached and verified" in capsys.readouterr().out
    assert cli.main(["refdata", "status"]) == 0


def test_fill_exits_1_naming_each_file_it_could_not_bring(cache: Path, mirror: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    (mirror / "cases.yaml").unlink()
    assert cli.main(["refdata", "fill", "--from", str(mirror)]) == 1
    assert capsys.readouterr().err == f"error: cases.yaml: not in {mirror}\n"


def test_a_from_directory_that_does_not_exist_is_one_line_and_exit_2(cache: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["refdata", "fill", "--from", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err == f"error: --from {tmp_path / 'nowhere'}: no such directory\n"
    assert not cache.exists()


# --- how tests meet a missing file ----------------------------------------------------------------------------

def _outcome(read: Callable[..., Path], *parts: str) -> tuple[str, str]:
    """What a test reading a reference file through conftest does: ("skip" | "fail", its line). Both are caught
    here, so a skip where a failure is due fails this test instead of skipping it."""
    with pytest.raises((pytest.skip.Exception, pytest.fail.Exception)) as info:
        read(*parts)
    if isinstance(info.value, pytest.fail.Exception):
        assert info.value.pytrace is False
        return "fail", info.value.msg
    return "skip", info.value.msg


def test_a_missing_reference_skips_outside_ci_and_fails_under_ci(cache: Path, mirror: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "false")
    decided, line = _outcome(conftest.reference_file, "cases.yaml")
    assert decided == "skip" and line.startswith("reference file cases.yaml is not in")
    monkeypatch.setenv("CI", "true")
    decided, line = _outcome(conftest.reference_dir, "chart", "crds")
    assert decided == "fail" and line.startswith("reference file chart/crds/a.yaml is not in")


def test_a_mirror_url_is_read_as_url_slash_file_and_held_to_the_same_sha256(
        cache: Path, mirror: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`--from https://...`: a company's mirror laid out like ../shared/reference, derived files included (they
    are bytes like any other there); a byte changed on the mirror is refused as from a directory."""
    asked: list[str] = []

    def serve(url: str) -> bytes:
        asked.append(url)
        return (mirror / url.removeprefix("https://mirror.example/reference/")).read_bytes()

    monkeypatch.setattr(refdata, "_download", serve)
    (mirror / "chart" / "crds" / "a.yaml").write_bytes(B)
    assert cli.main(["refdata", "fill", "--from", "https://mirror.example/reference/"]) == 1
    assert sorted(asked) == ["https://mirror.example/reference/cases.yaml",
                             "https://mirror.example/reference/chart/crds/a.yaml"]
    assert capsys.readouterr().err == (
        f"error: chart/crds/a.yaml: sha256 {_sha(B)} from https://mirror.example/reference/chart/crds/a.yaml, but "
        f"sources.yaml pins {_sha(A)} (source: {(mirror / 'chart' / 'crds' / 'a.yaml').as_uri()}); not cached\n")
    assert refdata.status() == {"chart/crds/a.yaml": "missing", "cases.yaml": "ok"}


# --- a fork without a mirror: files only a mirror holds are recorded, not failures ----------------------------

def _marker(cache: Path) -> str | None:
    marker = cache / refdata.NEEDS_MIRROR
    return marker.read_text(encoding="utf-8") if marker.exists() else None


NEEDS_MIRROR_LINE = ("cases.yaml: needs a mirror, upstream does not hold these bytes (a curated compilation); bring it "
                     "with `uv run triarch refdata fill --from DIR|URL` (../shared/reference or a mirror), in CI the "
                     "repository variable TRIARCH_REFERENCE_MIRROR")


def test_fill_from_upstream_missing_only_mirror_files_exits_0_and_records_them(
        cache: Path, mirror: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["refdata", "status"]) == 1  # no fill yet: missing, whatever sources.yaml says of it
    assert "missing: cases.yaml\n" in capsys.readouterr().out
    assert cli.main(["refdata", "fill"]) == 0
    out, err = capsys.readouterr()
    assert err == f"warning: {NEEDS_MIRROR_LINE}\n"
    assert out.splitlines()[-1] == (f"1 of 2 reference files cached and verified in {cache}; 1 need a mirror "
                                    f"(recorded in .needs-mirror: under CI their tests skip)")
    assert _marker(cache) == ("# left out by the last `triarch refdata fill` from upstream: only a mirror holds them\n"
                              "cases.yaml\n")
    assert refdata.needs_mirror() == {"cases.yaml"}
    assert cli.main(["refdata", "status"]) == 0  # status says the same
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "needs a mirror: cases.yaml",
        f"1 of 2 reference files cached and verified in {cache}; 1 need a mirror, as the last fill from upstream "
        "recorded: bring them with `uv run triarch refdata fill --from DIR|URL` (../shared/reference or a mirror), "
        "in CI the repository variable TRIARCH_REFERENCE_MIRROR"]


def test_fill_from_upstream_still_exits_1_on_any_other_problem(cache: Path, mirror: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    def refuse(url: str) -> bytes:
        raise OSError("timed out")

    monkeypatch.setattr(refdata, "_download", refuse)
    assert cli.main(["refdata", "fill"]) == 1  # a download failed for a file upstream does serve
    url = (mirror / "chart" / "crds" / "a.yaml").as_uri()
    assert capsys.readouterr().err == (f"warning: {NEEDS_MIRROR_LINE}\n"
                                       f"error: chart/crds/a.yaml: download of {url} failed: timed out\n")
    assert refdata.needs_mirror() == {"cases.yaml"}  # recorded all the same
    assert cli.main(["refdata", "status"]) == 1
    assert "missing: chart/crds/a.yaml\nneeds a mirror: cases.yaml\n" in capsys.readouterr().out


def test_fill_from_upstream_exits_1_on_a_changed_byte(cache: Path, mirror: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (mirror / "chart" / "crds" / "a.yaml").write_bytes(B)  # what upstream serves changed
    assert cli.main(["refdata", "fill"]) == 1
    assert f"error: chart/crds/a.yaml: sha256 {_sha(B)} from " in capsys.readouterr().err


def test_a_mirror_only_file_cached_with_other_bytes_is_a_failure_not_left_out(
        cache: Path, mirror: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache.mkdir()
    (cache / "cases.yaml").write_bytes(CASE_2)
    filled = refdata.fill(None)
    assert filled.need_mirror == [] and _marker(cache) is None
    assert filled.problems == [f"cases.yaml: sha256 {_sha(CASE_2)} in {cache}, not the pinned {_sha(CASE_1)}, and "
                               "upstream does not hold these bytes (a curated compilation); bring it with `uv run "
                               "triarch refdata fill --from DIR|URL` (../shared/reference or a mirror), in CI the "
                               "repository variable TRIARCH_REFERENCE_MIRROR"]


def test_a_fill_from_a_directory_or_mirror_clears_the_marker(cache: Path, mirror: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    assert refdata.fill(None).need_mirror != []
    assert refdata.fill(mirror) == refdata.Filled()  # brings cases.yaml
    assert _marker(cache) is None and refdata.needs_mirror() == frozenset()
    assert refdata.fill(None) == refdata.Filled()  # from upstream with everything cached: nothing left out
    assert _marker(cache) is None
    # a directory without the file: a failure (exit 1), and no marker to skip it by
    (cache / "cases.yaml").unlink()
    assert refdata.fill(None).need_mirror != []
    (mirror / "cases.yaml").unlink()
    assert refdata.fill(mirror).problems == [f"cases.yaml: not in {mirror}"]
    assert _marker(cache) is None
    # a mirror by URL that serves nothing: the same
    assert refdata.fill(None).need_mirror != []
    monkeypatch.setattr(refdata, "_download", lambda url: (_ for _ in ()).throw(OSError("404")))
    assert refdata.fill("https://mirror.example/reference").problems == [
        "cases.yaml: download of https://mirror.example/reference/cases.yaml failed: 404"]
    assert _marker(cache) is None


def _missing(relpath: str) -> refdata.ReferenceMissing:
    with pytest.raises(refdata.ReferenceMissing) as info:
        refdata.path(relpath)
    return info.value


def test_the_verdict_under_ci_skips_only_an_absent_mirror_only_file_the_last_fill_recorded(
        cache: Path, mirror: Path) -> None:
    cases, crd = _missing("cases.yaml"), _missing("chart/crds/a.yaml")
    assert (cases.relpath, cases.absent) == ("cases.yaml", True)
    skipped = ("skip", "reference file cases.yaml needs a mirror: upstream does not hold it, and the last fill was "
                       "from upstream; set TRIARCH_REFERENCE_MIRROR (or fill --from DIR|URL) to run this")
    assert refdata.verdict(cases, ci=True, marked={"cases.yaml"}) == skipped
    assert refdata.verdict(cases, ci=True, marked=set()) == ("fail", str(cases))  # no marker: .ci/run's case
    assert refdata.verdict(cases, ci=True, marked={"other.yaml"}) == ("fail", str(cases))  # not marked
    assert refdata.verdict(cases, ci=False, marked=set()) == ("skip", str(cases))
    # a marker cannot excuse a file upstream serves, nor bytes that differ
    assert refdata.verdict(crd, ci=True, marked={"chart/crds/a.yaml"}) == ("fail", str(crd))
    cache.mkdir()
    (cache / "cases.yaml").write_bytes(CASE_2)
    changed = _missing("cases.yaml")
    assert not changed.absent
    assert refdata.verdict(changed, ci=True, marked={"cases.yaml"}) == ("fail", str(changed))


def test_a_test_needing_a_recorded_file_skips_under_ci_and_any_other_still_fails(
        cache: Path, mirror: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    decided, line = _outcome(conftest.reference_file, "cases.yaml")  # no marker yet: .ci/run's case
    assert decided == "fail" and line.startswith("reference file cases.yaml is not in")
    (mirror / "chart" / "crds" / "a.yaml").write_bytes(B)  # upstream's file fails its sha256
    assert refdata.fill(None).problems != []
    assert _outcome(conftest.reference_file, "cases.yaml") == (
        "skip", "reference file cases.yaml needs a mirror: upstream does not hold it, and the last fill was from "
                "upstream; set TRIARCH_REFERENCE_MIRROR (or fill --from DIR|URL) to run this")
    decided, line = _outcome(conftest.reference_dir, "chart", "crds")
    assert decided == "fail" and line.startswith("reference file chart/crds/a.yaml is not in")


def test_a_directory_names_a_file_upstream_serves_before_one_only_a_mirror_holds(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pinned = {"d/m.txt": refdata.Source("d/m.txt", _sha(A), None, "curated"),
              "d/u.txt": refdata.Source("d/u.txt", _sha(B), "https://example.com/u.txt")}
    monkeypatch.setattr(refdata, "load_sources", lambda: pinned)
    with pytest.raises(refdata.ReferenceMissing) as info:
        refdata.directory("d")
    assert info.value.relpath == "d/u.txt"  # so a marker for d/m.txt cannot skip the missing d/u.txt
