"""A driver for Ray 2.60's cluster in the data plane (run with its Python, Triarch's router on the PYTHONPATH): for
each BATCH:THRESHOLD given, a Serve application of two replicas that each take `batch` requests at once and hold each
for a second, routed by the prefix-aware router class with that imbalanced_threshold; every application is sent
`count` requests of one prompt at once, all applications side by side (one driver and one wait, not one per batch);
prints how many each replica answered, as JSON on a line of its own per batch ("answered per replica at batch 4:
[4, 4]"). No engine: the router and Serve's queues are what is measured.

    python ray_balance_probe.py APP ROUTER_CLASS COUNT BATCH:THRESHOLD..."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from typing import Any

import ray
from ray import serve
from ray.serve.config import RequestRouterConfig

HOLD_SECONDS = 1.0


class Prompt:
    """What the router reads a request's text from: an argument with a `prompt` (as vLLM's requests have)."""

    def __init__(self, prompt: str) -> None:
        self.prompt = prompt


def held(batch: int, router: str, threshold: float) -> Any:
    """The application for one batch: two replicas that each hold `batch` requests at once for HOLD_SECONDS."""

    @serve.deployment(num_replicas=2, max_ongoing_requests=batch, ray_actor_options={"num_cpus": 0},
                      request_router_config=RequestRouterConfig(
                          request_router_class=router,
                          request_router_kwargs={"imbalanced_threshold": threshold, "do_eviction": False}))
    class Held:
        async def __call__(self, request: Prompt) -> str:
            await asyncio.sleep(HOLD_SECONDS)
            return str(serve.get_replica_context().replica_id.unique_id)

    return Held.bind()


def main() -> None:
    app, router, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    batches = {int(batch): float(threshold) for batch, threshold in (spec.split(":") for spec in sys.argv[4:])}
    ray.init(address="127.0.0.1:6379", namespace=app, logging_level="ERROR", log_to_driver=False)
    names = {batch: f"{app}-{batch}" for batch in batches}
    targets = [serve.RunTarget(held(batch, router, threshold), name=names[batch], route_prefix=None)
               for batch, threshold in batches.items()]
    handles = dict(zip(batches, serve.run_many(targets), strict=True))  # deployed together, one wait
    text = "You are a careful assistant. Answer in one line. " * 8
    try:
        responses = {batch: [handle.remote(Prompt(text)) for _ in range(count)] for batch, handle in handles.items()}
        answered = {batch: Counter(r.result(timeout_s=120) for r in sent) for batch, sent in responses.items()}
    finally:
        for name in names.values():
            serve.delete(name)
    for batch, counts in answered.items():
        print(f"answered per replica at batch {batch}: " + json.dumps(sorted(counts.values(), reverse=True)),
              flush=True)


if __name__ == "__main__":
    main()
