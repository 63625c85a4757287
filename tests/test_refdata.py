"""The reference data as a pinned input (triarch.refdata, tools/reference/sources.yaml): every file's sha256 held
against ../shared/reference, the cache filled from a directory or from upstream, a changed byte refused, a missing
file named in one line with the command that brings it, and `triarch refdata` exit codes."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

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
        assert set(spec) <= {"sha256", "source", "derived"}, rel
        assert re.fullmatch(r"[0-9a-f]{64}", spec["sha256"]), rel
        assert spec["source"] or spec.get("derived"), rel
        if spec["source"]:
            assert re.match(r"https://(raw\.githubusercontent\.com|github\.com|pypi\.org)/", spec["source"]), rel
    assert refdata.SOURCES.read_text(encoding="utf-8").startswith("# ")  # the header says what it is


def test_nothing_but_this_module_reads_shared_directly() -> None:
    pattern = re.compile(r"""/ ["']shared["']|["']\.\./shared/reference/""")
    readers = [str(p.relative_to(ROOT)) for folder in ("tests", "bench", "components")
               for p in (ROOT / folder).rglob("*.py")
               if pattern.search(p.read_text(encoding="utf-8")) and p.name != "test_refdata.py"]
    assert readers == []


# --- fill, path, directory ------------------------------------------------------------------------------------

def test_fill_from_a_directory_caches_every_file_verified(cache: Path, mirror: Path) -> None:
    assert refdata.fill(mirror) == []
    assert refdata.path("chart/crds/a.yaml") == cache / "chart" / "crds" / "a.yaml"
    assert refdata.path("chart/crds/a.yaml").read_bytes() == b"kind: A\n"
    assert refdata.directory("chart/crds") == cache / "chart" / "crds"
    assert refdata.status() == {"chart/crds/a.yaml": "ok", "cases.yaml": "ok"}


def test_a_changed_byte_is_refused_naming_both_digests(cache: Path, mirror: Path) -> None:
    (mirror / "chart" / "crds" / "a.yaml").write_bytes(b"kind: B\n")
    [problem] = refdata.fill(mirror)
    assert problem == (f"chart/crds/a.yaml: sha256 {_sha(B)} from "
                       f"{mirror / 'chart' / 'crds' / 'a.yaml'}, but sources.yaml pins {_sha(A)} "
                       f"(source: {(mirror / 'chart' / 'crds' / 'a.yaml').as_uri()}); not cached")
    assert not (cache / "chart" / "crds" / "a.yaml").exists()
    assert (cache / "cases.yaml").is_file()  # the other file is cached all the same


def test_a_cached_file_changed_since_is_refused_in_one_line(cache: Path, mirror: Path) -> None:
    assert refdata.fill(mirror) == []
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
                               "`uv run triarch refdata fill --from ../shared/reference` "
                               "(or `uv run triarch refdata fill` from upstream)")
    with pytest.raises(refdata.ReferenceMissing, match=r"cases\.yaml .*fill --from \.\./shared/reference`$"):
        refdata.path("cases.yaml")  # derived: only a copy brings it
    with pytest.raises(ValueError, match=r"^nope\.yaml is not listed in tools/reference/sources\.yaml$"):
        refdata.path("nope.yaml")


def test_each_file_is_hashed_at_most_once_per_process(cache: Path, mirror: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert refdata.fill(mirror) == []
    refdata._verified.clear()
    hashed: list[Path] = []
    digest = refdata._digest
    monkeypatch.setattr(refdata, "_digest", lambda p: hashed.append(p) or digest(p))
    for _ in range(3):
        refdata.path("cases.yaml")
    assert hashed == [cache / "cases.yaml"]


def test_fill_from_upstream_downloads_and_says_which_files_it_cannot(cache: Path, mirror: Path) -> None:
    [problem] = refdata.fill(None)
    assert problem.startswith("cases.yaml: cannot be downloaded, upstream does not hold these bytes (a curated "
                              "compilation); copy it with `uv run triarch refdata fill --from ../shared/reference`")
    assert (cache / "chart" / "crds" / "a.yaml").read_bytes() == b"kind: A\n"  # through urllib (a file: URL here)


def test_a_failed_download_is_one_line(cache: Path, mirror: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(url: str) -> bytes:
        raise OSError("timed out")

    monkeypatch.setattr(refdata, "_download", refuse)
    problems = refdata.fill(None)
    url = (mirror / "chart" / "crds" / "a.yaml").as_uri()
    assert problems[0] == f"chart/crds/a.yaml: download of {url} failed: timed out"


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

def test_a_missing_reference_skips_outside_ci_and_fails_under_ci(cache: Path, mirror: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match=r"^reference file cases\.yaml is not in"):
        conftest.reference_file("cases.yaml")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"^reference file chart/crds/a\.yaml is not in") as failed:
        conftest.reference_dir("chart", "crds")
    assert failed.value.pytrace is False


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
