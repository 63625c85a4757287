"""Replicas larger than one node: tensor parallelism within a node, pipeline stages across nodes.

TP exchanges activations at every layer and wants NVLink; PP passes one activation per stage boundary and
tolerates the network between nodes. So a replica that a node cannot hold keeps TP at most a node's GPUs and adds
stages until the heaviest stage (the first holds the embedding, the last the LM head) leaves room for the KV cache.
A replica beyond one node takes whole nodes: one pod per node, all its GPUs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from triarch.catalog import Gpu
from triarch.tuner.arch import LengthRefused, ModelArch, TuneError
from triarch.tuner.report import Sizing
from triarch.tuner.search import tune
from triarch.tuner.weights import stage_weight_bytes

NODES_SEARCHED = 32
"""How far the refusal looks for the smallest pool that would hold a model (a 671B model in BF16 needs 3 nodes of
8 H200; nothing Triarch serves needs more than a few)."""


class NodesRefused(TuneError):
    """The model does not fit across the pool's nodes: why one node cannot hold it (``one_node``, the root cause),
    and the fewest nodes that would (``nodes_needed``; None: not even :data:`NODES_SEARCHED`)."""

    def __init__(self, message: str, one_node: TuneError, nodes_needed: int | None) -> None:
        super().__init__(message)
        self.one_node = one_node
        self.nodes_needed = nodes_needed


def whole_nodes(gpus: int, gpus_per_node: int) -> bool:
    """A replica either fits in one node or takes whole nodes."""
    return gpus <= gpus_per_node or gpus % gpus_per_node == 0


def _shapes(gpus_per_node: int, nodes: int, tp: int | None, pp: int | None) -> Iterator[tuple[int | None, int]]:
    """(tensor, pipeline) parallel sizes to try for a replica of ``nodes`` nodes, in order; tensor None: the
    tuner's own search within the node."""
    if pp is not None:
        if tp is None:
            # within one node, the tuner's own search of TP; across nodes, a whole node per stage
            yield (None, pp) if nodes == 1 else (gpus_per_node, pp)
        elif whole_nodes(tp * pp, gpus_per_node) and -(-tp * pp // gpus_per_node) == nodes:
            yield tp, pp
        return
    if nodes == 1:
        yield tp, 1
        return
    t = tp or gpus_per_node
    if (nodes * gpus_per_node) % t == 0:
        yield t, nodes * gpus_per_node // t


def _attempt(arch: ModelArch, gpu: Gpu, gpus_per_node: int, nodes: int, tp: int | None, pp: int | None,
             options: dict[str, Any]) -> Sizing | TuneError:
    error: TuneError = TuneError(f"no tensor x pipeline split of {nodes} node(s) of {gpus_per_node} GPU(s)")
    for t, p in _shapes(gpus_per_node, nodes, tp, pp):
        available = gpus_per_node if t is None else t * p
        try:
            sizing = tune(arch, gpu, tensor_parallel_size=t, pipeline_parallel_size=p,
                          gpus_available=available, tp_limit=gpus_per_node, **options)
        except LengthRefused:
            raise
        except TuneError as refused:
            error = refused
            continue
        gpus = sizing.tensor_parallel_size * sizing.pipeline_parallel_size
        if not whole_nodes(gpus, gpus_per_node):
            error = TuneError(f"tensor_parallel_size {sizing.tensor_parallel_size} x pipeline_parallel_size "
                              f"{sizing.pipeline_parallel_size} = {gpus} GPUs is not a whole number of nodes")
            continue
        stages = stage_weight_bytes(arch, sizing.pipeline_parallel_size, task=sizing.task)
        return dataclasses.replace(sizing, nodes=-(-gpus // gpus_per_node), gpus_per_node=gpus_per_node,
                                   stage_weights=tuple(-(-b // sizing.tensor_parallel_size) for b in stages))
    return error


def tune_nodes(arch: ModelArch, gpu: Gpu, *, gpus_per_node: int, max_nodes: int,
               tensor_parallel_size: int | None = None, pipeline_parallel_size: int | None = None,
               **options: Any) -> Sizing:
    """Engine args for ``arch`` on a pool of up to ``max_nodes`` nodes of ``gpus_per_node`` ``gpu``s.

    One node first, as :func:`tune` sizes it. A model one node cannot hold gets TP of a whole node (or
    ``tensor_parallel_size``) and as many pipeline stages as the fewest nodes that hold it need. Nodes are never
    added for the pessimistic end of the memory estimate: a shape that holds one request only nominally comes back
    sized for the nominal end (``sized_for``), which `triarch plan` refuses, naming more nodes among what fits. A given
    ``pipeline_parallel_size`` is taken as is (TP searched within the node, keeping whole nodes). All of that with
    vLLM's defaults first: :func:`tune`'s remedies (eager mode, a smaller batch) only when no shape within
    ``max_nodes`` holds the model without them, fewest nodes first. Raises
    :class:`NodesRefused` with the fewest nodes that would do when the pool's max is too small, and
    :class:`LengthRefused` as :func:`tune` does (more nodes are never added for a longer context: that is a
    choice of cost the stack makes with ``pipelineParallelSize``)."""
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    defaults = {**options, "remedies": False}
    if pp is not None:
        nodes = -(-(tp or 1) * pp // gpus_per_node)
        # the stages fit one node's GPUs only with a smaller TP: then a whole node per stage too
        counts = [nodes, pp] if nodes == 1 and tp is None else [nodes]
        result: Sizing | TuneError = TuneError(f"no split of {pp} stage(s)")
        for attempt in (defaults, options):
            for count in counts:
                result = _attempt(arch, gpu, gpus_per_node, count, tp, pp, attempt)
                if isinstance(result, Sizing):
                    return result
        assert isinstance(result, TuneError)
        raise result
    single = _attempt(arch, gpu, gpus_per_node, 1, tp, None, defaults)
    if isinstance(single, Sizing):
        return single
    needed: tuple[int, Sizing] | None = None
    for nodes in range(2, NODES_SEARCHED + 1):
        result = _attempt(arch, gpu, gpus_per_node, nodes, tp, None, defaults)
        if isinstance(result, TuneError):
            continue
        if nodes <= max_nodes:
            return result
        needed = nodes, result
        break
    for nodes in range(1, min(max_nodes, NODES_SEARCHED) + 1):  # with eager mode or a smaller batch
        result = _attempt(arch, gpu, gpus_per_node, nodes, tp, None, options)
        if isinstance(result, Sizing):
            return result
        if nodes == 1:
            single = result  # the one-node refusal, saying what was tried too
    if needed is not None:
        nodes, sizing = needed
        raise NodesRefused(
            f"across nodes it needs {nodes} of {gpus_per_node} GPU(s) each (tensor_parallel_size "
            f"{sizing.tensor_parallel_size} x pipeline_parallel_size {sizing.pipeline_parallel_size}), and the pool "
            f"has at most {max_nodes}", single, nodes)
    raise NodesRefused(f"not even {NODES_SEARCHED} nodes of {gpus_per_node} GPU(s) hold it", single, None)
