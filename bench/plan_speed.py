"""How fast `triarch plan` is, against bare Pulumi mock registration of as many resources.

    uv run python bench/plan_speed.py [--repeat 5]

Reports (1) the in-process plan of the prod stack (validation, matrix, the whole program, manifests) against a
program that registers the same number of plain custom resources under Pulumi's own mocks, both warm and in
the same process; (2) the cold command-line time; (3) how plan time grows with the number of models and node
groups. A benchmark, not a test: it prints numbers and asserts nothing.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pulumi
import yaml

from triarch.config import from_pulumi_config
from triarch.offline import read_stack_config, run_program, stack_file, write_plan
from triarch.paths import PROJECT_ROOT


class _Bare(pulumi.CustomResource):
    def __init__(self, name: str, index: int, parent: pulumi.Resource | None = None) -> None:
        super().__init__("bench:index:Resource", name, {"index": index, "labels": {"a": "b"}},
                         pulumi.ResourceOptions(parent=parent))


class _Group(pulumi.ComponentResource):
    def __init__(self, name: str) -> None:
        super().__init__("bench:index:Group", name)


def bare_program(count: int) -> Callable[[], None]:
    def program() -> None:
        group = _Group("group")
        for i in range(count):
            _Bare(f"r{i}", i, parent=group)
    return program


class _Replayed(pulumi.CustomResource):
    """One recorded registration, replayed: same type, name and inputs, no Triarch code in the way."""

    def __init__(self, type_: str, name: str, inputs: dict[str, object]) -> None:
        super().__init__(type_, name, inputs)


def replay_program(resources: list[tuple[str, str, dict[str, object]]]) -> Callable[[], None]:
    def program() -> None:
        for type_, name, inputs in resources:
            _Replayed(type_, name, inputs)
    return program


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up: imports and caches
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def plan_once(name: str, config: dict[str, str], out: Path) -> int:
    from_pulumi_config(config)
    run = run_program(name, config, [])
    write_plan(run, out)
    return len(run.resources)


def scaled_config(models: int, node_groups: int) -> dict[str, str]:
    document = yaml.safe_load(stack_file("prod").read_text())
    config = document["config"]
    base_group = config["triarch:nodeGroups"][0]
    config["triarch:nodeGroups"] = [{**copy.deepcopy(base_group), "name": f"g{i}"} for i in range(node_groups)]
    config["triarch:models"] = [
        {"name": f"m{i}", "model": "Qwen/Qwen3-Embedding-0.6B", "engine": "vllm", "nodeGroup": f"g{i % node_groups}"}
        for i in range(models)
    ]
    path = Path(tempfile.mkdtemp()) / "Pulumi.bench.yaml"
    path.write_text(yaml.safe_dump(document))
    return read_stack_config(path)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp())

    config, _ = read_stack_config(stack_file("prod"))
    count = plan_once("prod", config, out)
    recorded = [(r.type, r.name, r.inputs) for r in run_program("prod", config, []).resources
                if r.custom and not r.type.startswith("pulumi:providers:")]
    plan_time = median_seconds(lambda: plan_once("prod", config, out), args.repeat)
    replay_time = median_seconds(lambda: run_program("replay", {}, [], program=replay_program(recorded)), args.repeat)
    bare_time = median_seconds(lambda: run_program("bare", {}, [], program=bare_program(count - 1)), args.repeat)
    print(f"prod stack: {count} resources")
    print(f"  triarch plan (in-process, warm)                 {plan_time * 1000:8.1f} ms")
    print(f"  bare registration of the same resources+inputs  {replay_time * 1000:8.1f} ms"
          f"   ratio {plan_time / replay_time:5.2f}  (aim: <= 1.5)")
    print(f"  bare registration of as many tiny resources     {bare_time * 1000:8.1f} ms"
          f"   ratio {plan_time / bare_time:5.2f}")

    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "triarch.cli", "plan", "--stack", "prod", "--out", str(out / "cli")],
                   cwd=PROJECT_ROOT, check=True, capture_output=True)
    print(f"  cold command line (imports included) {time.perf_counter() - start:6.2f} s")

    print("\ngrowth (warm, median):")
    print("  models  node groups  resources   ms     ms/resource")
    for models, groups in ((1, 1), (4, 1), (16, 1), (4, 2), (8, 4), (16, 8)):
        scaled = scaled_config(models, groups)
        n = plan_once("bench", scaled, out)
        seconds = median_seconds(lambda s=scaled: plan_once("bench", s, out), max(1, args.repeat // 2))
        print(f"  {models:6}  {groups:11}  {n:9}  {seconds * 1000:7.1f}  {seconds * 1000 / n:8.2f}")


if __name__ == "__main__":
    main()
