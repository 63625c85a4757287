"""Advice that works (issue 51): each refusal of a corpus of refused stacks names what would plan, in stack keys; every
suggestion read from the refusal's line as a user reads it and applied as written plans the stack (exit 0), or meets a
different refusal that says why. The suggestions are parsed from the printed line, not taken from the code that wrote
it: a number or key the line gets wrong fails here."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import stack_document, write_stack_file
from test_first_hour import MINIMAL as FIRST_STACK
from triarch import cli

Config = dict[str, Any]
Suggestion = tuple[str, Callable[[Config], None]]
"""What a refusal suggests, as a user would say it, and the edit that applies it to the stack."""

MINIMAL: Config = FIRST_STACK
"""A created cluster with one L4 pool and one model: the smallest stack a newcomer writes (test_first_hour's)."""


def minimal(**model: Any) -> Config:
    config = copy.deepcopy(MINIMAL)
    config["triarch:models"][0].update(model)
    return config


def prod(mutate: Callable[[Config], None]) -> Config:
    config = stack_document("prod")
    mutate(config)
    return config


def _old_driver(config: Config) -> None:
    """The L4 pool on an AMI release whose driver (570) is older than the CUDA 13 images need, on a Kubernetes
    version that release has."""
    config["triarch:cluster"]["kubernetesVersion"] = "1.33"
    config["triarch:cluster"]["systemNodeGroup"]["amiRelease"] = "v20250807"
    config["triarch:nodeGroups"][0]["amiRelease"] = "v20250807"


@dataclass(frozen=True)
class Refused:
    name: str
    config: Config
    said: str
    """A piece of the refusal's line: the case is refused for the reason it is in the corpus for."""
    plans: str = "every"
    """Which suggestions plan at once: "every"; "one" where another suggestion meets the next check first; "none"
    where the first refusal cannot see what the next check counts (the tuner's node count knows nothing of a
    RayService upgrade's second cluster, which the pool check adds)."""


CORPUS = [
    Refused("a length the KV cache cannot hold", minimal(engine="vllm", maxModelLen=40960), "does not fit"),
    Refused("a length that fits at the nominal end only", minimal(engine="vllm", maxModelLen=26352),
            "may not start"),
    Refused("more replicas than the pool holds", minimal(replicas=3), "holds 2 GPU(s)"),
    Refused("a RayService upgrade beyond the pool", minimal(replicas=2), "RayService upgrade"),
    Refused("KEDA scaling on a created cluster without KEDA",
            minimal(engine="vllm", autoscaling={"min": 1, "max": 2}), "needs KEDA"),
    Refused("KEDA scaling without a Prometheus", {**minimal(engine="vllm", autoscaling={"min": 1, "max": 2}),
                                                  "triarch:observability": {"prometheus": "none"}}, "needs KEDA"),
    Refused("weights larger than the GPU", minimal(model="google/gemma-3-27b-it"), "of weights per GPU",
            plans="none"),
    Refused("a driver older than the image's CUDA", prod(_old_driver), "NVIDIA driver >="),
    Refused("a split that outgrows its pool", prod(lambda c: c["triarch:models"][2].update(
        disaggregation={"enabled": True, "prefill": {"replicas": 4}, "decode": {"replicas": 3}},
        autoscaling=None) or c["triarch:models"][2].pop("autoscaling")), "holds"),
]


def plan(tmp_path: Path, config: Config, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`triarch plan` of a stack: its exit code and its error line (empty when it plans)."""
    path = write_stack_file(tmp_path / "Pulumi.advice.yaml", config)
    code = cli.main(["plan", "--stack-file", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    return code, lines[0] if lines else ""


INDEX = re.compile(r"^error: triarch:(models|nodeGroups)\[(\d+)\]")


def suggestions(line: str, config: Config) -> list[Suggestion]:
    """What the line suggests in stack keys, each as the edit it asks for: `key: value` of the refused model,
    "ask for at most N" of its maxModelLen, ">= N nodes" of the refused pool's max, `observability: {...}`, and
    "amiRelease: R on node group 'G'"."""
    found: list[Suggestion] = []
    where = INDEX.match(line)
    if where is not None and where[1] == "models":
        model = config["triarch:models"][int(where[2])]
        for key, value in re.findall(r"(?<![.\w])(maxModelLen|kvCacheDtype|tensorParallelSize): (\w+)\b(?! would not)",
                                      line):
            found.append((f"{key}: {value}", lambda c, k=key, v=value, i=int(where[2]): c["triarch:models"][i].update(
                {k: int(v) if v.isdigit() else v})))
        for most in re.findall(r"ask for at most (\d+)", line):
            found.append((f"maxModelLen: {most}", lambda c, m=most, i=int(where[2]): c["triarch:models"][i].update(
                maxModelLen=int(m))))
        assert model  # the index names a model of the stack
    if where is not None and where[1] == "nodeGroups":
        for nodes in re.findall(r"allowed: >= (\d+) nodes", line):
            found.append((f"max: {nodes}", lambda c, n=nodes, i=int(where[2]): c["triarch:nodeGroups"][i].update(
                max=int(n))))
    for group, nodes in re.findall(r"triarch:nodeGroups\[(\d+)\]\.max >= (\d+)", line):
        found.append((f"nodeGroups[{group}].max: {nodes}", lambda c, n=nodes, i=int(group): c[
            "triarch:nodeGroups"][i].update(max=int(n))))
    for body in re.findall(r"observability: \{([^}]*)\}", line):
        pairs = dict(pair.split(": ") for pair in body.split(", "))
        found.append((f"observability: {pairs}", lambda c, p=pairs: c.setdefault("triarch:observability", {}).update(
            p)))
    for release, group in re.findall(r"amiRelease: (v\d+) on node group '([\w-]+)'", line):
        found.append((f"{group} amiRelease: {release}", lambda c, r=release, g=group: [
            n.update(amiRelease=r) for n in c["triarch:nodeGroups"] if n["name"] == g]))
    return found


@pytest.mark.parametrize("case", CORPUS, ids=[c.name for c in CORPUS])
def test_each_refusals_advice_plans_when_followed(case: Refused, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, line = plan(tmp_path, case.config, capsys)
    assert code == 2 and case.said in line, line
    advice = suggestions(line, case.config)
    assert advice, f"no suggestion in stack keys: {line}"
    planned = []
    for said, apply in advice:
        followed = copy.deepcopy(case.config)
        apply(followed)
        again, second = plan(tmp_path, followed, capsys)
        assert again == 0 or second.split(";")[0] != line.split(";")[0], f"{said}, as {line!r} advised: {second}"
        assert again in (0, 2), second
        planned += [said] if again == 0 else []
    expected = {"every": [said for said, _ in advice], "one": planned[:1] or ["one"], "none": planned}[case.plans]
    assert planned == expected, f"{line!r}: of {[said for said, _ in advice]} these plan: {planned}"


def test_a_gpu_has_one_memory_figure_in_the_pool_table_and_in_a_refusal(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The L4 as vLLM sees it (torch's 22.05 GiB, templates/compat/gpus.yaml), not nvidia-smi's 22.5, in both."""
    path = write_stack_file(tmp_path / "Pulumi.advice.yaml", MINIMAL)
    assert cli.main(["plan", "--stack-file", str(path), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out.splitlines()
    [row] = [line for line in printed if line.split()[:4] == ["l4", "g6.xlarge", "NVIDIA", "L4"]]
    assert "NVIDIA L4 22.0 GiB" in row, row
    _, line = plan(tmp_path, minimal(model="google/gemma-3-27b-it"), capsys)
    assert "NVIDIA L4 (22.0 GiB)" in line, line


def test_keda_advice_on_a_created_cluster_keeps_the_prometheus_it_installs(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A created cluster installs a Prometheus by default: the advice names KEDA alone (`prometheus: existing`
    would turn the installed one off), and names a Prometheus only where the stack has none."""
    _, line = plan(tmp_path, minimal(engine="vllm", autoscaling={"min": 1, "max": 2}), capsys)
    assert line.endswith("allowed: observability: {keda: install}, or engine: ray-serve"), line
    _, line = plan(tmp_path, {**minimal(engine="vllm", autoscaling={"min": 1, "max": 2}),
                              "triarch:observability": {"keda": "install", "prometheus": "none"}}, capsys)
    assert "allowed: observability: {prometheus: install} (prometheus: existing where" in line, line


def test_a_driver_mismatch_names_the_oldest_ami_release_that_fixes_it(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """CUDA 13.0 needs driver 580.65.06 (templates/compat/cuda.yaml); of the AL2023 NVIDIA releases with an AMI for
    Kubernetes 1.33 (templates/compat/amis.yaml), v20251108 is the oldest that ships a 580 driver (580.95.05):
    v20251023 has it too, but no 1.33 AMI."""
    _, line = plan(tmp_path, prod(_old_driver), capsys)
    assert "pin amiRelease: v20251108 on node group 'l4' (driver 580.95.05)" in line, line
    assert "pin a driver" not in line


def test_the_ray_image_warning_names_a_tag_seen_upstream_that_plans(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """prod's default Ray image was never seen upstream; the warning names the newest tag that was (2.58.0 on
    CUDA 13.0, templates/compat/images.yaml), and prod pinned to it plans without the warning."""
    path = write_stack_file(tmp_path / "Pulumi.advice.yaml", stack_document("prod"))
    assert cli.main(["plan", "--stack-file", str(path), "--out", str(tmp_path / "out")]) == 0
    warned = [line for line in capsys.readouterr().out.splitlines() if "not seen upstream" in line]
    assert warned and all(line.endswith(", or pin the newest tag seen upstream, rayproject/ray-llm:2.58.0-py312-cu130 "
                                        "(Ray 2.58.0, vLLM 0.26.0)") for line in warned), warned
    config = stack_document("prod")
    config.setdefault("triarch:images", {})["rayLlm"] = "rayproject/ray-llm:2.58.0-py312-cu130"
    path = write_stack_file(tmp_path / "Pulumi.advice.yaml", config)
    assert cli.main(["plan", "--stack-file", str(path), "--out", str(tmp_path / "out")]) == 0
    assert "not seen upstream" not in capsys.readouterr().out


def test_the_summary_shows_what_an_endpoint_picker_costs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two pickers and two proxies (1.5 CPU, 2.5 GiB requested, planners/picker.py) on m7i.large system nodes
    ($0.1008 an hour in us-east-1, templates/compat/prices.yaml): 0.1008 x 730 h x 1.5 / 2 vCPU = $55 a month of
    them, said in the summary, not only in capacity.json."""
    path = write_stack_file(tmp_path / "Pulumi.advice.yaml",
                            minimal(engine="vllm", replicas=2, prefixRouting={"enabled": True}))
    assert cli.main(["plan", "--stack-file", str(path), "--out", str(tmp_path / "out")]) == 0
    assert ("  Endpoint pickers (on the system nodes, in their row's cost): chat 4 pods requesting 1.5 CPU and 2.5 "
            "GiB, $55 of m7i.large (2 vCPU) by CPU\n") in capsys.readouterr().out


def _dropped(stack: str, drop: Callable[[Config], object]) -> Config:
    config = stack_document(stack)
    drop(config)
    return config


REQUIRED_CASES: dict[str, Config] = {
    "aws:region": _dropped("dev", lambda c: c.pop("aws:region")),
    "triarch:cluster.adminRoleArns": _dropped("dev", lambda c: c["triarch:cluster"].pop("adminRoleArns")),
    "triarch:cluster.endpointPublicAccessCidrs": _dropped(
        "dev", lambda c: c["triarch:cluster"].pop("endpointPublicAccessCidrs")),
    "triarch:cluster.systemNodeGroup.amiRelease": _dropped(
        "dev", lambda c: c["triarch:cluster"]["systemNodeGroup"].pop("amiRelease")),
    "triarch:nodeGroups[].instanceType": _dropped("dev", lambda c: c["triarch:nodeGroups"][0].pop("instanceType")),
    "triarch:nodeGroups[].amiRelease": _dropped("dev", lambda c: c["triarch:nodeGroups"][0].pop("amiRelease")),
    "triarch:cluster.context": _dropped("local", lambda c: c["triarch:cluster"].pop("context")),
    "triarch:nodeGroups[].gpu": _dropped("local", lambda c: c["triarch:nodeGroups"][0].pop("gpu")),
    "triarch:nodeGroups[].driverVersion": _dropped("local", lambda c: c["triarch:nodeGroups"][0].pop("driverVersion")),
}
"""dev (a created cluster) or local (an adopted one) without the key."""


@pytest.mark.parametrize("key", sorted(REQUIRED_CASES))
def test_a_key_the_reference_calls_required_for_a_cluster_is_refused_without_it(
        key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/stack-keys.md says "required when the cluster is created/adopted" of exactly the keys whose check refuses
    a stack of that kind without them (config/base.py REQUIRED_WHEN gives both the words)."""
    from triarch.config.base import REQUIRED_WHEN

    assert set(REQUIRED_CASES) == set(REQUIRED_WHEN)
    reference = (Path(__file__).resolve().parents[1] / "docs" / "stack-keys.md").read_text()
    section = reference.split(f"`{key}`\n\n", 1)[1].split("\n", 1)[0]
    assert section.startswith(f"**required {REQUIRED_WHEN[key]}**"), section
    code, line = plan(tmp_path, REQUIRED_CASES[key], capsys)
    path = key.replace("[]", "[0]")
    assert code == 2 and line.startswith(f"error: {path}: ") and f"is required {REQUIRED_WHEN[key]}" in line, line
