"""Triarch's prefix-aware request router for Ray Serve LLM: Ray 2.60's PrefixCacheAffinityRouter, made to hold where
it does not (issue 47, items 4 and 5).

- A request the router cannot read as text (token-id prompts, image-only messages, /detokenize, /v1/score) is routed
  by load alone; Ray's router divides by its empty text or raises, and the request waits for the client's timeout.
- When the prefix tree actor is gone (its node drained, consolidated or reclaimed: it is detached and never
  restarted), the request is routed by load and a new tree actor takes the name, with the replicas this router knows;
  Ray's router keeps the dead handle and routes nothing more.

This file runs inside the Ray pods, not in Triarch: the planner ships it as a ConfigMap mounted on every Ray
container's PYTHONPATH (planners/ray.py). It imports Ray alone; `ray_version` in templates/compat/images.yaml pins
the release it was read against."""

from __future__ import annotations

import logging
import time
from typing import Any, cast

import ray
from ray.exceptions import RayActorError
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import PrefixCacheAffinityRouter
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import PrefixTreeActor
from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_LOGGER_NAME, SERVE_NAMESPACE

logger = logging.getLogger(SERVE_LOGGER_NAME)

TREE_ACTOR = "LlmPrefixTreeActor"
"""The name Ray's router gives its tree actor, in a namespace of the deployment's (prefix_aware_router.py)."""


class ResilientPrefixRouter(PrefixCacheAffinityRouter):
    """PrefixCacheAffinityRouter, with every request answered: what it cannot match goes by load."""

    def initialize_state(self, *args: Any, **kwargs: Any) -> None:
        super().initialize_state(*args, **kwargs)  # Serve passes request_router_kwargs by name
        # Where a new tree actor goes if this one dies: the name and namespace Ray's router used; none where a
        # tree actor was handed in (Ray's tests).
        self._tree_namespace: str | None = None
        if kwargs.get("tree_actor") is None and len(args) < 7:
            deployment = self._deployment_id
            parts = [SERVE_NAMESPACE]
            if deployment is not None:
                parts += [part for part in (deployment.app_name, deployment.name) if part]
            self._tree_namespace = "::".join(parts)

    def routable_text(self, pending_request: Any) -> str:
        """The request's prompt as text, or "" where there is none to match on."""
        if pending_request is None or not pending_request.args:
            return ""
        try:
            return self._extract_text_from_request(pending_request) or ""
        except ValueError:  # neither `prompt` nor `messages`
            return ""

    async def _prefix_match_best_replicas(self, pending_request: Any, candidate_replicas: list[Any]) -> list[Any]:
        if not self.routable_text(pending_request):
            return [[]]  # no preference: choose_replicas falls back to the less busy of two
        try:
            return await super()._prefix_match_best_replicas(pending_request, candidate_replicas)
        except RayActorError as error:
            self.replace_tree(error)
            return [[]]

    def on_request_routed(self, pending_request: Any, replica_id: Any, result: Any) -> None:
        if not self.routable_text(pending_request):
            return
        try:
            super().on_request_routed(pending_request, replica_id, result)
        except RayActorError as error:
            self.replace_tree(error)

    def update_replicas(self, replicas: list[Any]) -> None:
        try:
            super().update_replicas(replicas)
        except RayActorError as error:
            self.replace_tree(error)

    def on_replica_actor_died(self, replica_id: Any) -> None:
        try:
            super().on_replica_actor_died(replica_id)
        except RayActorError as error:
            self.replace_tree(error)

    def replace_tree(self, error: Exception) -> None:
        """A new tree actor under the old name (every router of the deployment meets at it: get_if_exists), holding
        this router's replicas; what the old one remembered is gone, so prefixes are learnt again. Should this fail,
        the next request tries again."""
        logger.warning("prefix tree actor lost (%s): routing by load while a new one starts", type(error).__name__)
        if self._tree_namespace is None:
            return
        try:
            tree = cast(Any, PrefixTreeActor).options(name=TREE_ACTOR, namespace=self._tree_namespace,
                                                      get_if_exists=True, lifetime="detached").remote()
            ray.get(tree.add_tenants.remote([r.to_full_id_str() for r in self._replica_id_set], time.time()))
            if self._do_eviction:
                ray.get(tree.start_eviction_loop.remote(self._eviction_threshold_chars, self._eviction_target_chars,
                                                        self._eviction_interval_secs))
            controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
            ray.get(controller._register_shutdown_cleanup_actor.remote(tree))
            self._tree_actor = tree
        except Exception:  # routing by load meanwhile; the next failure tries again
            logger.exception("no new prefix tree actor yet")
