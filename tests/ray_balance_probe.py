"""A driver for Ray 2.60's cluster in the data plane (run with its Python, Triarch's router on the PYTHONPATH): a
Serve application of two replicas that each take `batch` requests at once and hold each for a second, routed by the
prefix-aware router class and imbalanced_threshold given, is sent `count` requests of one prompt at once; prints how
many each replica answered, as JSON on a line of its own ("answered per replica: [4, 4]"). No engine: the router and
Serve's queues are what is measured.

    python ray_balance_probe.py APP ROUTER_CLASS BATCH THRESHOLD COUNT"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter

import ray
from ray import serve
from ray.serve.config import RequestRouterConfig

HOLD_SECONDS = 1.0


class Prompt:
    """What the router reads a request's text from: an argument with a `prompt` (as vLLM's requests have)."""

    def __init__(self, prompt: str) -> None:
        self.prompt = prompt


def main() -> None:
    app, router, batch, threshold, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(
        sys.argv[5])

    @serve.deployment(num_replicas=2, max_ongoing_requests=batch, ray_actor_options={"num_cpus": 0},
                      request_router_config=RequestRouterConfig(
                          request_router_class=router,
                          request_router_kwargs={"imbalanced_threshold": threshold, "do_eviction": False}))
    class Held:
        async def __call__(self, request: Prompt) -> str:
            await asyncio.sleep(HOLD_SECONDS)
            return str(serve.get_replica_context().replica_id.unique_id)

    ray.init(address="127.0.0.1:6379", namespace=app, logging_level="ERROR", log_to_driver=False)
    handle = serve.run(Held.bind(), name=app, route_prefix=None)
    text = "You are a careful assistant. Answer in one line. " * 8
    try:
        responses = [handle.remote(Prompt(text)) for _ in range(count)]
        answered = Counter(response.result(timeout_s=120) for response in responses)
    finally:
        serve.delete(app)
    print("answered per replica: " + json.dumps(sorted(answered.values(), reverse=True)), flush=True)


if __name__ == "__main__":
    main()
