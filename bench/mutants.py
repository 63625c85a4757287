"""Mutation benchmark: does the suite notice a plausible bug? Each mutant of bench/mutants.yaml is applied to a
fresh copy of the project (the working tree is never touched) and the tests it names are run there; a mutant
they pass survives. Run: `uv run --extra test python bench/mutants.py [--only ID ...] [--confirm]`.

`--confirm` re-runs each survivor against the whole suite, so a survivor is a bug no test catches, not one the
named tests happen to miss. Exit code 1 when a mutant survives. Not part of .ci/run (about an hour: the real-engine
mutants each start a plane).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from triarch import refdata

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path("components/triarch")
COPIED = ("components", "tests", "templates", "policies", "stacks", "bench", "tools", "docs", "Pulumi.yaml",
          "__main__.py", "pyproject.toml", "uv.lock", "README.md", ".ci")


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]


def load(path: Path) -> list[Mutant]:
    entries = yaml.safe_load(path.read_text(encoding="utf-8"))["mutants"]
    mutants = [Mutant(e["id"], e["file"], e["find"], e["replace"], tuple(e["tests"])) for e in entries]
    ids = [m.id for m in mutants]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise SystemExit(f"bench/mutants.yaml: ids used twice: {', '.join(duplicates)}")
    return mutants


def copy_project(into: Path) -> Path:
    """The project at `into`/triarch (its tests read the reference data from the same cache: run_tests)."""
    into = into / "triarch"
    into.mkdir()
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
        else:
            shutil.copy2(source, into / name)
    return into


def run_tests(project: Path, tests: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """pytest in the copy, importing the copy's package (PYTHONPATH comes before the editable install), reading the
    reference data from this project's cache (`triarch refdata fill`)."""
    env = {**os.environ, "PYTHONPATH": str(project / "components"), "PYTHONDONTWRITEBYTECODE": "1",
           "TRIARCH_REFERENCE_CACHE": str(refdata.cache_root())}
    return subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                          cwd=project, env=env, capture_output=True, text=True, check=False)


def mutate(project: Path, mutant: Mutant) -> str:
    path = project / PACKAGE / mutant.file
    original = path.read_text(encoding="utf-8")
    if mutant.find not in original:
        raise SystemExit(f"{mutant.id}: the text to mutate is not in {PACKAGE / mutant.file} (update "
                         "bench/mutants.yaml)")
    path.write_text(original.replace(mutant.find, mutant.replace, 1), encoding="utf-8")
    return original


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="mutant ids to run (default: all)")
    parser.add_argument("--confirm", action="store_true", help="re-run survivors against the whole suite")
    parser.add_argument("--catalogue", type=Path, default=ROOT / "bench" / "mutants.yaml")
    args = parser.parse_args(argv)
    mutants = load(args.catalogue)
    if args.only:
        unknown = sorted(set(args.only) - {m.id for m in mutants})
        if unknown:
            parser.error(f"no such mutant: {', '.join(unknown)}")
        mutants = [m for m in mutants if m.id in args.only]

    survivors: list[Mutant] = []
    with tempfile.TemporaryDirectory(prefix="triarch-mutants-") as tmp:
        project = copy_project(Path(tmp))
        baseline = run_tests(project, tuple(sorted({t for m in mutants for t in m.tests})))
        if baseline.returncode != 0:
            print(baseline.stdout[-2000:], baseline.stderr[-2000:], sep="\n")
            raise SystemExit("the named tests fail without any mutant: fix them first")
        for mutant in mutants:
            started = time.monotonic()
            original = mutate(project, mutant)
            try:
                result = run_tests(project, mutant.tests)
                if result.returncode == 0 and args.confirm:
                    result = run_tests(project, ("tests",))
            finally:
                (project / PACKAGE / mutant.file).write_text(original, encoding="utf-8")
            caught = result.returncode != 0
            if not caught:
                survivors.append(mutant)
            print(f"{'caught ' if caught else 'SURVIVED'} {mutant.id:45} {time.monotonic() - started:6.1f}s",
                  flush=True)
    print(f"\n{len(mutants) - len(survivors)} of {len(mutants)} mutants caught; {len(survivors)} survived"
          + (f": {', '.join(m.id for m in survivors)}" if survivors else ""))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
