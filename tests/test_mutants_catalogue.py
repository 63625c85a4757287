"""The mutation benchmark's catalogue stays applicable: each mutant's text is in the file it mutates, once the
code moves on (bench/mutants.py stops at the first mutant whose text is gone, so a drifted entry would hide every
mutant after it), and each names tests that exist."""

from __future__ import annotations

from conftest import bench_module

ROOT = bench_module("mutants").ROOT


def test_every_mutant_finds_its_text_and_names_existing_tests() -> None:
    module = bench_module("mutants")
    mutants = module.load(ROOT / "bench" / "mutants.yaml")
    assert len(mutants) > 100
    drifted = [m.id for m in mutants
               if m.find not in (ROOT / module.PACKAGE / m.file).read_text(encoding="utf-8")]
    assert drifted == []
    missing = sorted({t for m in mutants for t in m.tests if not (ROOT / t.split("::")[0]).is_file()})
    assert missing == []
    assert len({m.id for m in mutants}) == len(mutants)
