"""Every PromQL query Triarch ships (alerts, KEDA triggers, dashboard panels) is parsed and reads only series a
pinned exporter emits (templates/compat/metrics.yaml): a query that cannot parse or selects nothing real would
never fire or draw, silently. Checked when the plan is made, so the plan fails instead."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import promql_parser

from triarch.errors import TriarchError
from triarch.planners.observability import metric_names

SUFFIXES = re.compile(r"_(total|bucket|sum|count)$")


class QueryError(TriarchError):
    """A shipped query that cannot work: one line naming where it is and the series or the parse error."""


def _vector_selectors(expr: str) -> list[Any]:
    """The vector selector nodes of a parsed PromQL expression, in order (range selectors' included)."""
    nodes: list[Any] = []

    def walk(node: Any) -> None:
        if type(node).__name__ == "VectorSelector":
            nodes.append(node)
        for attr in ("lhs", "rhs", "expr", "vector_selector", "param"):
            child = getattr(node, attr, None)
            if child is not None and hasattr(child, "prettify"):
                walk(child)
        for child in getattr(node, "args", None) or []:
            walk(child)

    walk(promql_parser.parse(expr))
    return nodes


def selected_metrics(expr: str) -> list[str]:
    """The metric name of every vector selector in a PromQL expression (parsed, not matched by pattern)."""
    return [str(node.name) for node in _vector_selectors(expr)]


def selectors(expr: str) -> list[str]:
    """Every vector selector of a PromQL expression as PromQL (its metric and label matchers), each once."""
    return list(dict.fromkeys(str(node.prettify()) for node in _vector_selectors(expr)))


def exported(name: str) -> bool:
    """Whether a pinned exporter emits `name` (templates/compat/metrics.yaml; a counter or histogram by its base)."""
    data = metric_names()
    base = SUFFIXES.sub("", name)
    vllm = data["vllm"]["names"]
    if name.startswith("vllm:"):
        return base.removeprefix("vllm:") in vllm
    prefix = data["ray"]["rayVllmPrefix"]
    if name.startswith(prefix):  # vLLM inside Ray Serve: a split model's engines add their NIXL connector's
        return base.removeprefix(prefix) in vllm or base.removeprefix(prefix) in data["nixl"]["names"]
    return any(name in data[source]["names"] or base in data[source]["names"]
               for source in ("ray", "kuberay", "kubeStateMetrics", "dcgm", "endpointPicker"))


def check_queries(queries: Iterable[tuple[str, str]]) -> None:
    """(where, PromQL) pairs; raises QueryError at the first that does not parse or selects an unknown series."""
    for where, expr in queries:
        try:
            names = selected_metrics(expr)
        except (ValueError, SyntaxError, TypeError) as error:
            raise QueryError(f"{where}: its query does not parse ({error}): {expr}") from None
        unknown = [n for n in names if not exported(n)]
        if unknown:
            raise QueryError(f"{where}: its query selects {unknown[0]}, which no pinned exporter emits "
                             "(templates/compat/metrics.yaml)") from None


def shipped_queries(objects: Iterable[dict[str, Any]], dashboard: dict[str, Any] | None) -> list[tuple[str, str]]:
    """Every query in the plan's PrometheusRule, ScaledObjects and dashboard, with where it is."""
    found: list[tuple[str, str]] = []
    for obj in objects:
        if obj["kind"] == "PrometheusRule":
            found += [(f"alert {rule['alert']}", rule["expr"]) for group in obj["spec"]["groups"]
                      for rule in group["rules"]]
        elif obj["kind"] == "ScaledObject":
            found += [(f"ScaledObject {obj['metadata']['name']} trigger {t['name']}", t["metadata"]["query"])
                      for t in obj["spec"]["triggers"] if t["type"] == "prometheus"]
    for panel in (dashboard or {}).get("panels", []):
        found += [(f"dashboard panel {panel.get('title')!r}", t["expr"]) for t in panel.get("targets", [])]
    return found
