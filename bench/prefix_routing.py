"""Prefix routing, measured: two replicas of the prod stack's `qwen` (as planned, on vLLM's CPU build under Ray Serve
2.60, tests/dataplane.py) behind Triarch's PrefixCacheAffinityRouter settings, then behind Ray's default router, on
the same shared-prefix workload in one run. For each: the prefix-cache hit rate from the replicas' own counters
(vLLM's prefix_cache_hits / prefix_cache_queries, through Ray's metrics agent) and the median time to first token
of streamed requests. Then the open risk of the router: where its prefix tree actor lands, and what a request does
once that actor is gone (as when its node goes).

    uv run --extra test python bench/prefix_routing.py [--prefixes 8] [--requests 96] [--concurrency 8]

Needs the ray-2.60 data-plane environment (`uv run triarch local build ray-2.60`) and a network namespace; about
ten minutes on two cores. A benchmark: it prints, it asserts nothing. The last line reads
`hit rate: triarch X default Y`."""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from conftest import plan_config, stack_document  # noqa: E402
from dataplane import (  # noqa: E402
    RAY_METRICS_PORT,
    SERVE_URL,
    TREE_ACTOR,
    DataPlane,
    RayHead,
    counter,
    data_plane_in,
    ray_head,
    require_dataplane,
)
from engine_tier import eventually  # noqa: E402
from triarch.local.cpu_serving import cpu_serve_config  # noqa: E402
from triarch.local.inside import Answer  # noqa: E402
from triarch.local.tiny_models import prompt  # noqa: E402
from triarch.planners.ray import ROUTER_SOURCE  # noqa: E402

MODEL = "qwen"
REPLICAS = 2


def app_config(routed: bool) -> tuple[dict[str, Any], list[str]]:
    """prod's `qwen` application at two fixed replicas (its autoscaling from one would keep one replica under this
    load), with Triarch's router settings or without any (Ray's default: power of two choices)."""
    plan = plan_config("prod", stack_document("prod"), Path(tempfile.mkdtemp(prefix="prefix-bench-")))
    [service] = plan.objects("RayService")
    serve = yaml.safe_load(service["spec"]["serveConfigV2"])
    [app] = [a for a in serve["applications"] if a["name"] == MODEL]
    app = copy.deepcopy(app)
    deployment = app["args"]["llm_configs"][0]["deployment_config"]
    deployment.pop("autoscaling_config", None)
    deployment["num_replicas"] = REPLICAS
    swaps = [f"deployment_config.autoscaling_config -> num_replicas {REPLICAS}"]
    if not routed:
        router = deployment.pop("request_router_config")
        swaps.append(f"deployment_config.request_router_config ({router['request_router_class']}) dropped")
    return {"applications": [app]}, swaps


def counters(plane: DataPlane) -> dict[str, float]:
    """The replicas' prefix-cache counters once Ray's agent has exported all they counted: it exports every few
    seconds, so a reading right after the last request lags it. Read until two readings ten seconds apart agree."""
    last = read_counters(plane)
    while True:
        time.sleep(10)
        now = read_counters(plane)
        if now == last:
            return now
        last = now


def read_counters(plane: DataPlane) -> dict[str, float]:
    body = plane.client.get(f"http://127.0.0.1:{RAY_METRICS_PORT}/metrics").body
    return {key: counter(body, f"ray_vllm_prefix_cache_{key}_total", model_name=MODEL) for key in ("hits", "queries")}


def workload(prefixes: int, requests: int, seed: int = 7) -> list[str]:
    """`requests` prompts over `prefixes` shared system prompts (about 400 tokens each) with short distinct tails,
    in a shuffled order: each prefix recurs, interleaved with the others."""
    shared = [prompt(400, seed=100 + p) for p in range(prefixes)]
    prompts = [f"{shared[i % prefixes]} {prompt(24, seed=1000 + i)}" for i in range(requests)]
    random.Random(seed).shuffle(prompts)
    return prompts


def run(plane: DataPlane, prompts: list[str], concurrency: int) -> list[Answer]:
    answers: list[Answer] = []
    for start in range(0, len(prompts), concurrency):
        futures = [plane.client.submit("POST", f"{SERVE_URL}/{MODEL}/v1/completions",
                                       {"model": MODEL, "prompt": p, "max_tokens": 8, "stream": True},
                                       timeout=300, stream=True) for p in prompts[start:start + concurrency]]
        answers += [f.result(400) for f in futures]
    return answers


def deploy(head: RayHead, plane: DataPlane, config: dict[str, Any], name: str) -> None:
    deployed, _ = cpu_serve_config(config, plane.tiny_model)
    head.deploy(deployed, plane.work / f"{name}.yaml")
    if not eventually(lambda: head.applications().get(MODEL, {}).get("status") == "RUNNING", 900, 3):
        raise SystemExit(f"{name}: not RUNNING: {head.applications()}\n{head.logs()}")


def measure(head: RayHead, plane: DataPlane, routed: bool, prompts: list[str], concurrency: int
            ) -> tuple[float, float]:
    name = "triarch" if routed else "default"
    config, swaps = app_config(routed)
    deploy(head, plane, config, name)
    print(f"{name}: {MODEL} as planned for prod, {'; '.join(swaps)}", flush=True)
    run(plane, prompts[:REPLICAS * 2], concurrency)  # warm: each replica's first request pays more than its prefix
    before = counters(plane)
    answers = run(plane, prompts, concurrency)
    after = counters(plane)
    failed = [a.error or a.status for a in answers if a.status != 200 or not a.done]
    if failed:
        raise SystemExit(f"{name}: {len(failed)} requests failed: {failed[:3]}")
    hits, queries = after["hits"] - before["hits"], after["queries"] - before["queries"]
    ttft = statistics.median((a.first or a.ended) - a.started for a in answers)
    rate = hits / queries if queries else 0.0
    print(f"{name}: prefix-cache hit rate {rate:.3f} ({hits:.0f} of {queries:.0f} prompt tokens), "
          f"median time to first token {ttft * 1000:.0f} ms over {len(answers)} requests", flush=True)
    return rate, ttft


def tree_actor_risk(head: RayHead, plane: DataPlane) -> None:
    """Where the tree actor is, and what a request does once it is gone."""
    config, _ = app_config(routed=True)
    deploy(head, plane, config, "triarch-again")
    run(plane, [prompt(40)], 1)
    listed = head.run("ray", "list", "actors", "--format", "json", "--detail", "--address=127.0.0.1:6379")
    actors = [a for a in json.loads(listed.stdout or "[]") if a.get("name") == TREE_ACTOR]
    for actor in actors:
        print(f"tree actor: {actor.get('ray_namespace')}, node {actor.get('node_id', '')[:12]}, detached "
              f"{actor.get('is_detached')}, required resources {actor.get('required_resources')}, restarts "
              f"{actor.get('num_restarts')} (max_restarts unset: 0)", flush=True)
    kill = ("import ray, sys; ray.init(address='127.0.0.1:6379', namespace=sys.argv[1]); "
            "ray.kill(ray.get_actor(sys.argv[2]))")
    for actor in actors:
        head.run("python", "-c", kill, actor["ray_namespace"], TREE_ACTOR)
    answer = plane.client.submit("POST", f"{SERVE_URL}/{MODEL}/v1/completions",
                                 {"model": MODEL, "prompt": prompt(40), "max_tokens": 8}, timeout=60).result(120)
    outcome = f"HTTP {answer.status} after {answer.seconds:.1f}s" if answer.status else f"no answer within 60s " \
              f"({answer.error})"
    print(f"after the tree actor is gone (its node drained, say): a request gets {outcome}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefixes", type=int, default=8)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--no-risk", action="store_true", help="skip the tree actor's risk")
    args = parser.parse_args()
    try:
        require_dataplane("ray-serve")
    except BaseException as skipped:  # pytest's skip outside pytest
        raise SystemExit(str(skipped)) from None
    prompts = workload(args.prefixes, args.requests)
    # Triarch's router on the node's PYTHONPATH, as the pods mount its ConfigMap (planners/ray.py)
    with tempfile.TemporaryDirectory(prefix="prefix-bench-") as work, data_plane_in(Path(work), "dpbench") as plane, \
            ray_head(plane, ROUTER_SOURCE.parent) as head:
        started = time.monotonic()
        triarch = measure(head, plane, True, prompts, args.concurrency)
        default = measure(head, plane, False, prompts, args.concurrency)
        if not args.no_risk:
            tree_actor_risk(head, plane)
        print(f"({time.monotonic() - started:.0f}s)")
        print(f"hit rate: triarch {triarch[0]:.3f} default {default[0]:.3f}")

if __name__ == "__main__":
    main()
