"""`triarch --help` and every command's (and step's) help stay as they were when the CLI was one module: the texts
in tests/fixtures/cli-help were written by that module (`COLUMNS=80 triarch [COMMAND [STEP]] --help`), before the
CLI became a package of one module per command. A help that changes on purpose is written there again the same way;
a command added without its help there fails here, so the set of commands is held too."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from triarch.cli import build_parser

HELP = Path(__file__).resolve().parent / "fixtures" / "cli-help"


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path the parser takes, the bare `triarch` first: (), ("plan",), ("local", "up"), ..."""
    found = [path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += commands(sub, (*path, name))
    return found


def golden(path: tuple[str, ...]) -> Path:
    return HELP / f"{'_'.join(path) or 'triarch'}.txt"


def test_every_command_has_its_help_held() -> None:
    held = sorted(p.stem for p in HELP.glob("*.txt"))
    assert sorted(golden(path).stem for path in commands(build_parser())) == held
    assert {"triarch", "plan", "check", "diff", "verify", "comment", "tune", "review", "reference", "local_up",
            "local_build", "refdata_fill"} <= set(held)


@pytest.mark.parametrize("path", commands(build_parser()), ids=lambda path: " ".join(path) or "triarch")
def test_the_help_is_as_it_was(path: tuple[str, ...], monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([*path, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out == golden(path).read_text(encoding="utf-8")
