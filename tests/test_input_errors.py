"""Every kind of bad input is one line and exit code 2, never a traceback, never a secret: each case writes the
bad file the way a user would, and runs the command a user would run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT, stack_document, write_stack_file
from triarch import cli
from triarch.errors import ConfigError
from triarch.offline import read_text

TOKEN = "hf_PlantedTokenDoNotLeak0123456789"


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    assert code == 2, captured.out + captured.err
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


def write(tmp_path: Path, text: str | bytes, name: str = "Pulumi.bad.yaml") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


# --- the stack file itself ------------------------------------------------------------------------------------

def test_a_yaml_error_names_its_line_and_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "config:\n  aws:region: us-east-1\n  triarch:cluster: {create: true, name: [x\n")
    line = refused(capsys, "plan", "--stack-file", str(path))
    assert "is not valid YAML (line 4, column 1:" in line, line


def test_a_key_twice_is_refused_with_both_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = yaml.safe_dump({"config": stack_document("dev")}, sort_keys=False)
    text = text.replace("  aws:region: us-east-1\n", "  aws:region: us-east-1\n  aws:region: us-west-2\n", 1)
    line = refused(capsys, "plan", "--stack-file", str(write(tmp_path, text)))
    assert "names 'aws:region' twice (lines 2 and 3)" in line, line


def test_a_nested_key_twice_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = yaml.safe_dump({"config": stack_document("dev")}, sort_keys=False)
    text = text.replace("    max: 2\n", "    max: 2\n    max: 4\n", 1)
    assert "max: 4" in text
    line = refused(capsys, "plan", "--stack-file", str(write(tmp_path, text)))
    assert "names 'max' twice" in line


def test_a_list_instead_of_a_stack_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, "plan", "--stack-file", str(write(tmp_path, "- config\n- triarch:cluster\n")))
    assert "holds a YAML list, not a mapping" in line and "`config:`" in line


def test_keys_outside_config_are_told_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, yaml.safe_dump(stack_document("dev"), sort_keys=False))
    line = refused(capsys, "plan", "--stack-file", str(path))
    assert "at the top level, outside `config:`" in line and "triarch:cluster" in line
    assert "ClusterConfig" not in line


def test_a_file_that_is_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "config:\n  triarch:cluster: caf\xe9\n".encode("latin-1"))
    assert "is not UTF-8 text" in refused(capsys, "plan", "--stack-file", str(path))


def test_a_directory_as_the_stack_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "is a directory" in refused(capsys, "check", "--stack-file", str(tmp_path))


def test_an_unreadable_file_is_one_sentence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "config: {}\n")

    def denied(self: Path, encoding: str | None = None) -> str:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(ConfigError, match=r"cannot be read \(permission denied\)"):
        read_text(path, "--stack-file")


# --- values ---------------------------------------------------------------------------------------------------

def test_a_model_config_that_is_not_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(tmp_path, "{not json", "config.json")
    config = stack_document("local")
    config["triarch:models"][0].update(model="acme/custom", modelConfig=str(bad))
    line = refused(capsys, "plan", "--stack-file", str(write_stack_file(tmp_path / "Pulumi.x.yaml", config)))
    assert line.startswith("error: triarch:models[0].modelConfig:") and "is not JSON (line 1, column 2" in line


def test_a_length_beyond_the_model_is_refused_with_its_limit(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    config = stack_document("local")
    config["triarch:models"][0]["maxModelLen"] = 65536
    line = refused(capsys, "plan", "--stack-file", str(write_stack_file(tmp_path / "Pulumi.x.yaml", config)))
    assert line.startswith("error: triarch:models[0].maxModelLen: 65536 is refused")
    assert "derived max_model_len (max_position_embeddings=32768 " in line


def test_checks_run_before_the_progress_line(tmp_path: Path) -> None:
    """A refusal comes before `planning stack ...`: nothing is registered, and nothing says it started."""
    config = stack_document("dev")
    config["triarch:cluster"]["zones"] = ["us-east-1a", "us-east-1h"]
    path = write_stack_file(tmp_path / "Pulumi.dev.yaml", config)
    done = subprocess.run([sys.executable, "-c", "import sys; from triarch.cli import main; sys.exit(main())", "plan",
                           "--stack-file", str(path), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, check=False, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith("error: triarch:cluster.zones[1]: 'us-east-1h' has no slot in the address plan")
    assert "planning stack" not in done.stderr and not (tmp_path / "out").exists()


# --- secrets --------------------------------------------------------------------------------------------------

def test_a_plain_text_token_is_refused_with_the_command_that_encrypts_it(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    config = stack_document("dev")
    config["triarch:hfToken"] = TOKEN
    line = refused(capsys, "plan", "--stack-file", str(write_stack_file(tmp_path / "Pulumi.dev.yaml", config)))
    assert "pulumi config set --secret triarch:hfToken" in line
    assert "delete the line, rotate the value" in line
    assert TOKEN not in line


# --- a newcomer's first stack files ------------------------------------------------------------------------------

def test_yaml_merge_keys_and_anchors_are_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`<<: *pool` as Pulumi's own YAML reader takes it: the merged keys, overridden by the ones written beside."""
    text = (ROOT / "stacks" / "Pulumi.prod.yaml").read_text()
    merged = text.replace("    - name: l4\n", "    - &pool\n      name: l4\n", 1).replace(
        "    - name: a100\n", "    - <<: *pool\n      name: a100\n", 1)
    assert merged.count("*pool") == 1 and merged.count("&pool") == 1
    path = write(tmp_path, merged, "Pulumi.prod.yaml")
    code = cli.main(["plan", "--stack-file", str(path), "--out", str(tmp_path / "merged")])
    assert code == 0, capsys.readouterr().err
    assert cli.main(["plan", "--stack", "prod", "--out", str(tmp_path / "plain")]) == 0
    capsys.readouterr()
    assert (tmp_path / "merged" / "plan.json").read_text() == (tmp_path / "plain" / "plan.json").read_text()


def test_a_key_beside_a_merge_is_not_a_duplicate_but_a_key_twice_still_is(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    text = (ROOT / "stacks" / "Pulumi.dev.yaml").read_text()
    twice = text.replace("      max: 2\n", "      max: 2\n      max: 3\n", 1)
    assert twice != text
    assert "names 'max' twice" in refused(capsys, "plan", "--stack-file", str(write(tmp_path, twice)))


ADOPTED_MINIMAL = """\
config:
  triarch:cluster:
    create: false
    name: workstation
    kubernetesVersion: "1.34"
    context: mine
  triarch:nodeGroups:
    - name: gpu
      gpu: l4
      driverVersion: "580.95.05"
      nodes: [node-1]
  triarch:models:
    - name: chat
      model: Qwen/Qwen3-8B
      engine: vllm
      nodeGroup: gpu
"""


def test_the_minimal_adopted_stack_plans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One pool, one listed node, no provisioner: the listed node is the pool, which is never empty."""
    path = write(tmp_path, ADOPTED_MINIMAL, "Pulumi.adopted.yaml")
    assert cli.main(["plan", "--stack-file", str(path), "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "gpu   existing  NVIDIA L4" in out and " 1-1 " in out, out
    capacity = json.loads((tmp_path / "out" / "capacity.json").read_text())
    pool = next(p for p in capacity["pools"] if p["name"] == "gpu")
    assert (pool["minNodes"], pool["maxNodes"]) == (1, 1), pool


def test_an_adopted_pool_said_to_start_empty_still_needs_a_provisioner(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    text = ADOPTED_MINIMAL.replace("      nodes: [node-1]\n", "      nodes: [node-1]\n      min: 0\n")
    line = refused(capsys, "plan", "--stack-file", str(write(tmp_path, text)))
    assert line.startswith("error: triarch:nodeGroups[0].min: 0 lets the pool be empty"), line


@pytest.mark.parametrize(("key", "typed", "meant", "data"), [
    ("gpu", "a10", "a10g", "templates/compat/gpus.yaml"),
    ("gpu", "rtx-4060", "rtx-4060-laptop", "templates/compat/gpus.yaml"),
    ("gpu", "h100", "h100-80gb", "templates/compat/gpus.yaml"),  # its family, not the h200 a character closer
    ("gpu", "a100", "a100-80gb", "templates/compat/gpus.yaml"),
])
def test_an_unknown_gpu_suggests_the_nearest_and_how_to_add_one(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                key: str, typed: str, meant: str, data: str) -> None:
    text = ADOPTED_MINIMAL.replace("      gpu: l4\n", f"      {key}: {typed}\n")
    line = refused(capsys, "plan", "--stack-file", str(write(tmp_path, text)))
    assert line.startswith(f"error: triarch:nodeGroups[0].{key}: '{typed}' is not a known GPU (did you mean "
                           f"'{meant}'?); to add one, add it to {data}"), line


def test_an_unknown_instance_type_suggests_the_nearest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dev = (ROOT / "stacks" / "Pulumi.dev.yaml").read_text()
    text = dev.replace("instanceType: g6.xlarge", "instanceType: g6.xlarg")
    line = refused(capsys, "plan", "--stack-file", str(write(tmp_path, text)))
    assert line.startswith("error: triarch:nodeGroups[0].instanceType: 'g6.xlarg' is not a known GPU instance type "
                           "(did you mean 'g6.xlarge'?); to add one, add it to templates/compat/instances.yaml"), line


def test_a_missing_required_key_says_it_is_required(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (ROOT / "stacks" / "Pulumi.dev.yaml").read_text()
    without = text.replace("systemNodeGroup: {amiRelease: v20260714}", "systemNodeGroup: {}")
    assert without != text
    line = refused(capsys, "plan", "--stack-file", str(write(tmp_path, without)))
    assert line.startswith("error: triarch:cluster.systemNodeGroup.amiRelease: is required when the cluster is "
                           "created"), line


def test_a_bad_number_is_said_in_words(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (ROOT / "stacks" / "Pulumi.dev.yaml").read_text().replace("      max: 2\n", "      max: two\n", 1)
    line = refused(capsys, "plan", "--stack-file", str(write(tmp_path, text)))
    assert line == "error: triarch:nodeGroups[0].max: 'two' is not a whole number; allowed: a whole number at least 0"


def planted(config: dict[str, Any], where: str) -> dict[str, Any]:
    config = json.loads(json.dumps(config))
    if where == "unknown top-level key":
        config["triarch:hfTokn"] = TOKEN
    elif where == "unknown nested key":
        config["triarch:cluster"]["token"] = TOKEN
    elif where == "token in a known key":
        config["triarch:cluster"]["name"] = TOKEN
    elif where == "secret-like key":
        config["triarch:serving"] = {"apiKey": TOKEN}
    elif where == "plain text":
        config["triarch:hfToken"] = TOKEN
    elif where == "encrypted":
        config["triarch:hfToken"] = {"secure": "AAABA" + TOKEN}
    elif where == "plain text api key":
        config["triarch:vllmApiKey"] = TOKEN
    elif where == "encrypted api key":
        config["triarch:vllmApiKey"] = {"secure": "AAABA" + TOKEN}
    return config


@pytest.mark.parametrize("where", ["unknown top-level key", "unknown nested key", "secret-like key", "plain text",
                                   "encrypted", "token in a known key", "plain text api key", "encrypted api key"])
def test_a_planted_token_appears_in_no_output(tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str) -> None:
    stack = write_stack_file(tmp_path / "Pulumi.dev.yaml", planted(stack_document("dev"), where))
    outputs = []
    for argv in (["plan", "--stack-file", str(stack), "--out", str(tmp_path / "plan")],
                 ["check", "--stack-file", str(stack), "--format", "json"],
                 ["check", "--stack-file", str(stack), "--format", "markdown"],
                 ["diff", "--base", str(tmp_path / "plan"), "--stack-file", str(stack), "--format", "json"]):
        cli.main(argv)
        captured = capsys.readouterr()
        outputs += [captured.out, captured.err]
    written = [p.read_text(encoding="utf-8") for p in (tmp_path / "plan").rglob("*") if p.is_file()]
    for text in [*outputs, *written]:
        assert TOKEN not in text
        assert "PlantedToken" not in text
    if where == "encrypted":
        assert written, "an encrypted token plans"
        document = json.loads((tmp_path / "plan" / "plan.json").read_text(encoding="utf-8"))
        [secret] = [r for r in document["resources"] if r["type"] == "kubernetes:core/v1:Secret"
                    and r["inputs"]["metadata"]["name"] == "hf-token"]
        assert secret["inputs"]["stringData"] == {"token": "[secret]"}


PASSPHRASE = "correct horse battery staple"
"""A secret that looks like nothing in particular: only the key's name can tell it must not be shown."""


@pytest.mark.parametrize("key", ["apiKey", "accessToken", "password", "clientSecret", "awsCredentials"])
def test_a_value_under_a_secret_like_key_is_never_shown(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        key: str) -> None:
    config = stack_document("dev")
    config["triarch:serving"] = {key: PASSPHRASE}
    line = refused(capsys, "plan", "--stack-file", str(write_stack_file(tmp_path / "Pulumi.dev.yaml", config)))
    assert line.startswith(f"error: triarch:serving.{key}: "), line
    assert PASSPHRASE not in line and "horse" not in line



@pytest.mark.parametrize("path", ["triarch:serving.apiKey", "triarch:nodeGroups[0].taint.key", "triarch:hfToken",
                                  "triarch:x.dbPassword", "triarch:x.clientSecret", "triarch:x.awsCredentials"])
def test_a_known_key_named_like_a_secret_never_shows_its_value(path: str) -> None:
    """Even where the key is Triarch's own and the value merely invalid: the name is enough to withhold it."""
    message = str(ConfigError(path, PASSPHRASE, "is not valid", "a valid one"))
    assert message == f"{path}: is not valid; allowed: a valid one"


def test_an_ordinary_keys_bad_value_is_shown() -> None:
    message = str(ConfigError("triarch:serving.namespace", "Not_A_Label", "is not a DNS label"))
    assert message == "triarch:serving.namespace: 'Not_A_Label' is not a DNS label"
