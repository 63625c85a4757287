"""A newcomer's first hour, as they would type it: the CLI explains itself, a small stack plans with the defaults,
and what cannot work is said in the stack's own words, root cause first."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from triarch import cli
from triarch.cli import build_parser

MINIMAL = {
    "aws:region": "us-east-1",
    "triarch:cluster": {"create": True, "name": "llm", "kubernetesVersion": "1.35",
                        "zones": ["us-east-1a", "us-east-1b"],
                        "adminRoleArns": ["arn:aws:iam::123456789012:role/admin"],
                        "endpointPublicAccessCidrs": ["198.18.0.7/32"],  # not a documentation range
                        "systemNodeGroup": {"amiRelease": "v20260714"}},
    "triarch:nodeGroups": [{"name": "l4", "instanceType": "g6.xlarge", "amiRelease": "v20260714", "max": 2}],
    "triarch:models": [{"name": "chat", "model": "Qwen/Qwen3-8B", "engine": "ray-serve", "nodeGroup": "l4"}],
}
"""A created cluster with one L4 pool and one model: the smallest stack a newcomer writes (test_advice refuses
edits of it too)."""


def write(tmp_path: Path, config: dict[str, object]) -> Path:
    path = tmp_path / "Pulumi.first.yaml"
    path.write_text(yaml.safe_dump({"config": config}, sort_keys=False), encoding="utf-8")
    return path


def plan(tmp_path: Path, config: dict[str, object], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["plan", "--stack-file", str(write(tmp_path, config)), "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def parsers(parser: argparse.ArgumentParser, path: str = "triarch") -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += parsers(sub, f"{path} {name}")
    return found


def test_every_command_says_what_it_does_and_every_flag_has_help() -> None:
    every = parsers(build_parser())
    assert len(every) >= 14
    for path, parser in every:
        if path != "triarch":
            assert parser.description and len(parser.description) > 20, f"`{path}` has no description"
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            assert action.help, f"`{path}` {'/'.join(action.option_strings) or action.dest} has no help"


def test_the_top_level_help_is_current(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "as the project grows" not in out
    for command in ("plan", "check", "diff", "tune", "review", "verify", "reference"):
        assert f"\n    {command} " in out or f"\n    {command}\n" in out, command
    assert "compare two plans" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    version = capsys.readouterr().out.strip()
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    declared = next(line.split('"')[1] for line in pyproject.splitlines() if line.startswith("version = "))
    assert version == f"triarch {declared}"


def test_a_ray_serve_stack_plans_with_the_default_system_nodes(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """m7i.large cannot hold a Ray head (2 CPU, 8 GiB requested); left unset, the system nodes are m7i.xlarge."""
    code, out, err = plan(tmp_path, MINIMAL, capsys)
    assert code == 0, err
    assert "system nodes (m7i.xlarge x 2-4)" in out, out


def test_a_stack_without_a_ray_serve_model_keeps_the_smaller_system_nodes(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    config = {**MINIMAL, "triarch:models": [{**MINIMAL["triarch:models"][0], "engine": "vllm"}]}  # type: ignore[index]
    code, out, err = plan(tmp_path, config, capsys)
    assert code == 0, err
    assert "system nodes (m7i.large x 2-4)" in out, out


def test_a_pool_too_small_for_its_own_replicas_says_so_first(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Three replicas of one GPU on a pool of two: the models do not fit, whatever an upgrade needs."""
    config = {**MINIMAL, "triarch:models": [{**MINIMAL["triarch:models"][0], "replicas": 3}]}  # type: ignore[index]
    code, _, err = plan(tmp_path, config, capsys)
    assert code == 2
    assert err.strip() == ("error: triarch:nodeGroups[0].max: 2 holds 2 GPU(s), but its models need 3 at their "
                           "largest on pool 'l4' (replicas x GPUs per replica: 'chat' 3); allowed: >= 6 nodes (3 for "
                           "the models at their largest, the rest for a RayService upgrade), or fewer replicas at the "
                           "largest (triarch:models[0].replicas)"), err


def test_a_pool_that_fits_the_models_but_not_an_upgrade_names_the_upgrade(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    config = {**MINIMAL, "triarch:models": [{**MINIMAL["triarch:models"][0], "replicas": 2}]}  # type: ignore[index]
    code, _, err = plan(tmp_path, config, capsys)
    assert code == 2
    assert err.startswith("error: triarch:nodeGroups[0].max: 2 holds 2 GPU(s), but a RayService upgrade on pool 'l4' "
                          "needs 4: the models fit (2), but an upgrade of 'chat' starts a new Ray cluster (2) beside "
                          "the running one at its largest (2); allowed: >= 4 nodes"), err


@pytest.mark.parametrize(("model", "gated"), [("meta-llama/Llama-3.1-8B-Instruct", True),
                                               # gemma-2-2b, not 9b: 4096 tokens of the 9b fit one L4 only at the
                                               # nominal end of the memory estimate, which the plan refuses
                                               ("google/gemma-2-2b-it", True),
                                               ("Qwen/Qwen3-8B", False)])
def test_a_gated_model_without_a_token_is_warned_of(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    model: str, gated: bool) -> None:
    models = [{"name": "chat", "model": model, "engine": "vllm", "nodeGroup": "l4", "maxModelLen": 4096}]
    code, out, err = plan(tmp_path, {**MINIMAL, "triarch:models": models}, capsys)
    assert code == 0, err
    warned = f"model 'chat' ({model}) is gated on Hugging Face" in out
    assert warned == gated, out
    if gated:
        assert "pulumi config set --secret triarch:hfToken" in out


def test_a_gated_model_with_a_token_or_s3_weights_is_not_warned_of(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    llama = {"name": "chat", "model": "meta-llama/Llama-3.1-8B-Instruct", "engine": "vllm", "nodeGroup": "l4",
             "maxModelLen": 4096}
    with_token = {**MINIMAL, "triarch:models": [llama], "triarch:hfToken": {"secure": "AAABAencrypted"}}
    code, out, err = plan(tmp_path, with_token, capsys)
    assert code == 0, err
    assert "is gated" not in out
    from_s3 = {**MINIMAL, "triarch:models": [{**llama, "weightsUri": "s3://weights-bucket/meta-llama/8b/"}]}
    code, out, err = plan(tmp_path, from_s3, capsys)
    assert code == 0, err
    assert "is gated" not in out


def test_tune_suggests_the_nearest_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tune", "--model", "Qwen/Qwen3-8B", "--gpu", "a10"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --gpu: 'a10' is not a known GPU or GPU instance type (did you mean 'a10g'?); to "
                          "add one, add it to templates/compat/gpus.yaml"), err
    assert cli.main(["tune", "--model", "Qwen/Qwen3-8B", "--gpu", "h100"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --gpu: 'h100' is not a known GPU or GPU instance type (did you mean "
                          "'h100-80gb'?)"), err
