"""What Ray's prefix-aware router remembers per replica: bounded by what the replica's KV cache holds, since vLLM
keeps a prefix only while its cache does (issue 47, item 10). Facts in templates/compat/prefix-routing.yaml."""

from __future__ import annotations

from functools import cache

from triarch.config.schema import PrefixRoutingConfig
from triarch.datafiles import read_yaml
from triarch.paths import TEMPLATES_DIR
from triarch.planners.model_plan import ModelPlan

ROUTING_FACTS = TEMPLATES_DIR / "compat" / "prefix-routing.yaml"


@cache
def routing_facts() -> dict[str, float]:
    """charsPerToken and evictionTargetShare, each with its source in the data file."""
    loaded = read_yaml(ROUTING_FACTS)
    return {name: float(loaded[name]["value"]) for name in ("charsPerToken", "evictionTargetShare")}


def eviction_bounds(plan: ModelPlan) -> tuple[int, int]:
    """The characters of prompts the router remembers per replica before it forgets the least recently routed, and
    what it cuts back to: as the stack says, else what the replica's KV cache holds (its tuned tokens, at about four
    characters a token). Ray's fixed 400,000 characters (about 100,000 tokens) forgets what a replica of 1.8M tokens
    still holds, and on a replica of 18,000 remembers prefixes vLLM evicted long ago, where the router then sends
    prompts for a hit that is gone. The target keeps Ray's own share of the threshold (0.9)."""
    routing = plan.config.prefix_routing or PrefixRoutingConfig()
    facts = routing_facts()
    threshold = routing.eviction_threshold_chars or int(plan.sizing.kv_cache_tokens * facts["charsPerToken"])
    target = routing.eviction_target_chars or int(threshold * facts["evictionTargetShare"])
    return threshold, target
