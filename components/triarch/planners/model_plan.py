"""What a model's plan is: its pool, tuned sizing and image (ModelPlan), and its predicted cold start (ColdStart,
part by part). The model planner (models) fills them and the cold-start planner (coldstart) reads a ModelPlan and
makes a ColdStart, so the types live here, below both, and neither planner imports the other's types.
"""

from __future__ import annotations

from dataclasses import dataclass

from triarch.catalog import InstanceType
from triarch.coldfacts import Range
from triarch.config import ModelConfig
from triarch.disaggregation import PREFILL_SUFFIX, Role
from triarch.hub import HubModel
from triarch.planners.nodegroups import PoolPlan
from triarch.tuner import Sizing
from triarch.tuner.offload import HostMemory

CONTAINER_PARTS = ("weights", "engine")
"""The parts after the container starts: what the startup probe waits for."""


@dataclass(frozen=True)
class Part:
    key: str
    """node | image | ray | weights | engine."""
    seconds: Range | None
    """None: no published figure covers it."""
    how: str
    """What was counted, in one line."""
    sources: tuple[str, ...]
    """Keys of cold-start.yaml's sources behind the figure."""


@dataclass(frozen=True)
class ColdStart:
    model: str
    parts: tuple[Part, ...]
    first_start: str
    """What a model's very first start adds (the hub download, a cold compile)."""
    budget_seconds: int
    """The startup probe's budget (engine vllm)."""
    budget_reason: str
    warm_skips: tuple[str, ...] = ()
    """Parts a start onto the model's warm capacity skips."""
    margin: float = 1.0
    """The factor on the slow end that budgets allow (cold-start.yaml's startupMargin)."""
    first_container: Range | None = None
    """Weights and a cold engine start: what the first replica's container takes (the startup probe lets it
    through too)."""

    def total(self, skip: tuple[str, ...] = ()) -> Range:
        """The known parts added up (see `unknown` for what is missing)."""
        found = Range(0, 0)
        for part in self.parts:
            if part.seconds is not None and part.key not in skip:
                found = found + part.seconds
        return found

    def unknown(self, skip: tuple[str, ...] = ()) -> list[str]:
        return [part.key for part in self.parts if part.seconds is None and part.key not in skip]

    def part(self, key: str) -> Part | None:
        return next((p for p in self.parts if p.key == key), None)

    @property
    def container(self) -> Range | None:
        """Weights and engine: from the container's start to Ready (None where either is unknown)."""
        found = [self.part(key) for key in CONTAINER_PARTS]
        if any(p is None or p.seconds is None for p in found):
            return None
        return self.total(skip=tuple(p.key for p in self.parts if p.key not in CONTAINER_PARTS))

    @property
    def before_container(self) -> Range | None:
        """Node and image: before the container starts (None where either is unknown)."""
        before = [p for p in self.parts if p.key not in CONTAINER_PARTS]
        if any(p.seconds is None for p in before):
            return None
        return self.total(skip=CONTAINER_PARTS)

    def document(self) -> dict[str, object]:
        """The prediction as capacity.json carries it, for review to compare two plans."""
        total = self.total()
        warm = self.total(skip=self.warm_skips)
        return {
            "secondsLow": round(total.low), "secondsHigh": round(total.high), "unknown": self.unknown(),
            "parts": {p.key: (None if p.seconds is None else [round(p.seconds.low), round(p.seconds.high)])
                      for p in self.parts},
            "startupBudgetSeconds": self.budget_seconds,
            "ontoWarmCapacity": [round(warm.low), round(warm.high)] if self.warm_skips else None,
        }



@dataclass(frozen=True)
class ModelPlan:
    config: ModelConfig
    pool: PoolPlan
    instance: InstanceType | None
    """The node's instance type, when Triarch knows it (EKS node groups); sizes CPU and memory requests."""
    sizing: Sizing
    image: str
    cache_gib: int
    surge_fits: bool = True
    """Whether the pool has GPUs for one more replica while every other model on it runs at its largest: a
    rolling update can then add before it removes (it would wait forever otherwise)."""
    release: str = ""
    """The upstream release `image` is (a key of templates/compat/images.yaml): the same string unless the image
    comes from a mirror or by digest."""
    cold_start: ColdStart | None = None
    """From no node to Ready, predicted (planners/coldstart.py); the startup probe's budget comes from it."""
    hub: HubModel | None = None
    """What was read from the Hugging Face Hub for a model the catalog does not hold (or pinned to a revision):
    the commit it was sized at."""
    role: Role | None = None
    """A split model's role (models[].disaggregation): its decode role is the model's plan (its name, its
    application); its prefill role is a plan of its own, named `<model>-prefill`, on the prefill role's pool."""
    kv_backend: str | None = None
    """A split model's NIXL backend between its roles (disaggregation.backend), on both roles' plans."""
    kv_over_efa: bool = False
    """A split model's roles both on EFA pools: their pods take their GPUs' share of the node's interfaces, and the
    KV cache can cross over EFA (on both roles' plans)."""
    kv_offload_gib: int = 0
    """GiB of the node's memory one replica offloads its KV cache to (models[].kvOffload; 0: none): vLLM's
    --kv-offloading-size, the pod's /dev/shm and memory raised by as much (planners/kv_offload.py)."""
    host_memory: HostMemory | None = None
    """What the pod may take of its node, where kvOffload sized from it (the node's type known)."""

    @property
    def serving_revision(self) -> str | None:
        """The revision vLLM loads (--revision): the commit the plan read where the stack pins a revision (a branch
        or tag then serves what was sized, until the next plan), the stack's revision as written where the config
        came from modelConfig; None (the Hub's main at start) where the stack pins none."""
        if self.config.revision is None:
            return None
        return self.hub.commit if self.hub is not None else self.config.revision

    @property
    def name(self) -> str:
        """What the plan is known by (capacity.json, the cost report, refusals): the model's name, or for a split
        model's prefill role `<model>-prefill`."""
        return f"{self.config.name}{PREFILL_SUFFIX}" if self.role == "prefill" else self.config.name

    @property
    def gpus_per_replica(self) -> int:
        """What one replica reserves: tensor-parallel x pipeline-parallel GPUs."""
        return self.sizing.tensor_parallel_size * self.sizing.pipeline_parallel_size

    @property
    def nodes_per_replica(self) -> int:
        """Nodes one replica spans: 1, or the whole nodes its GPUs fill (a gang: all start, or none serves)."""
        return self.sizing.nodes

    @property
    def gpus_per_pod(self) -> int:
        """What one pod of a replica requests: the replica's GPUs, or a whole node's when it spans nodes."""
        return self.gpus_per_replica // self.nodes_per_replica

    @property
    def multi_node(self) -> bool:
        return self.nodes_per_replica > 1

    @property
    def route_prefix(self) -> str:
        return self.config.route_prefix or f"/{self.config.name}"
