"""A change between two plans, worded: `triarch diff`'s text and markdown (what is replaced, added, removed and
changed, engine args, vLLM releases), and the capacity, cost and cold-start tables the review comment shares."""

from __future__ import annotations

from typing import Any

from triarch.coldfacts import Range
from triarch.diff import KINDS as DIFF_KINDS
from triarch.diff import Diff, Difference
from triarch.planners.coldstart import duration, span
from triarch.report.summary import usd

DIFF_HEADINGS = {"replaced": "Replaced", "added": "Added", "removed": "Removed", "changed": "Changed in place"}


def _diff_line(d: Difference) -> str:
    mark = "!" if d.stateful and d.kind in ("replaced", "removed") and not d.intended else " "
    inputs = f" [{', '.join(d.inputs)}]" if d.inputs else ""
    intended = " (intended)" if d.intended else ""
    return f"  {mark} {d.type} {d.name}{inputs}: {d.cause}{intended}"


def diff_text(result: Diff, stack: str, base: str, compared: str = "") -> str:
    lines = [f"triarch diff: stack {stack} against {base}", *([compared] if compared else [])]
    if result.effects:
        lines += ["", "Effects on running traffic", *(f"  {effect}" for effect in result.effects)]
    for kind in DIFF_KINDS:
        found = result.of(kind)
        if found:
            lines += ["", f"{DIFF_HEADINGS[kind]} ({len(found)})", *(_diff_line(d) for d in found)]
    if result.engine:
        lines += ["", "Engine args"]
        for change in result.engine:
            shown = ", ".join(f"{k} {b} -> {a}" for k, (b, a) in change.changes.items())
            lines.append(f"  {change.model}: {shown}")
    if result.vllm:
        lines += ["", "vLLM releases", *(f"  {note}" for note in result.vllm)]
    if result.capacity:
        lines += ["", *capacity_change_lines(result.capacity)]
    if not result.differences and not result.engine:
        lines += ["", "no differences"]
    blocking = result.blocking
    lines += ["", f"{len(blocking)} stateful replacement(s) or removal(s) not marked intended"
              + (" (--intended NAME marks one)" if blocking else "")]
    return "\n".join(lines)


def diff_markdown(result: Diff, stack: str, base: str, compared: str = "") -> str:
    blocking = result.blocking
    verdict = (f"{len(blocking)} unintended stateful replacement(s) or removal(s)" if blocking
               else "no unintended replacement or removal")
    counts = ", ".join(f"{len(result.of(k))} {k}" for k in DIFF_KINDS)
    lines = [f"### `triarch diff` of `{stack}` against `{base}`: {verdict}", "", *([compared, ""] if compared else []),
             *(["**Effects on running traffic**", "", *(f"- {e}" for e in result.effects), ""] if result.effects
               else []), counts]
    rows = [d for kind in DIFF_KINDS for d in result.of(kind)]
    if rows:
        lines += ["", "| | change | resource | inputs | cause |", "|---|---|---|---|---|"]
        for d in rows:
            flag = ":warning:" if d.stateful and d.kind in ("replaced", "removed") and not d.intended else ""
            cause = d.cause.replace("|", "\\|")
            lines.append(f"| {flag} | {d.kind} | `{d.type}` `{d.name}` | {', '.join(d.inputs)} | {cause} |")
    if result.engine:
        lines += ["", "**Engine args**", ""]
        for change in result.engine:
            shown = ", ".join(f"`{k}` {b} -> {a}" for k, (b, a) in change.changes.items())
            lines.append(f"- `{change.model}`: {shown}")
    if result.vllm:
        lines += ["", "**vLLM releases**", "", *(f"- {note}" for note in result.vllm)]
    if result.capacity:
        lines += ["", "**Capacity and cost per month**", "", *capacity_change_table(result.capacity)]
    return "\n".join(lines)


def _range(low: Any, high: Any, money: bool = False) -> str:
    show = usd if money else str
    return show(low) if low == high else f"{show(low)}-{show(high)}"


def _pool_cell(view: dict[str, Any] | None) -> str:
    if view is None:
        return "-"
    idle = (f"idle {view['nodesIdle']} node(s) {usd(view.get('monthlyUsdIdle'))}, "
            if view.get("nodesIdle") is not None else "")
    return (f"{view['instanceType'] or 'existing'} x {_range(view['minNodes'], view['maxNodes'])}, "
            f"{_range(view['gpusAtMin'], view['gpusAtMax'])} GPUs, {idle}"
            f"{_range(view['monthlyUsdAtMin'], view['monthlyUsdAtMax'], money=True)}")


def _total_cell(total: dict[str, Any] | None) -> str:
    if total is None:
        return "unknown (the base wrote no capacity.json)"
    idle = f"idle {usd(total['monthlyUsdIdle'])}, " if total.get("monthlyUsdIdle") is not None else ""
    return idle + _range(total["monthlyUsdAtMin"], total["monthlyUsdAtMax"], money=True)


COST_LABELS = {"monthlyUsdIdle": "idle", "monthlyUsdAtMin": "at min", "monthlyUsdAtMax": "at max"}


def _signed(value: float | None) -> str:
    if value is None:
        return "unknown"
    return f"{'+' if value >= 0 else '-'}${abs(value):,.0f}"


def cost_explanation(change: dict[str, Any]) -> list[str]:
    """The total's change line by line: each line whose monthly cost moves, and by how much in each column."""
    explained = []
    for row in change.get("lines") or []:
        moves = [f"{label} {usd(row['before'][key])} -> {usd(row['after'][key])} ({_signed(row['change'][key])})"
                 for key, label in COST_LABELS.items() if row["before"][key] != row["after"][key]]
        explained.append(f"{row['line']}: " + ("; ".join(moves) if moves else "renamed, same cost"))
    return explained


def capacity_change_lines(change: dict[str, Any]) -> list[str]:
    lines = ["Capacity and cost per month (idle: what fixed replicas and autoscaling minimums hold; at min nodes - "
             "at max nodes)"]
    for row in change["pools"]:
        before, after = _pool_cell(row["before"]), _pool_cell(row["after"])
        lines.append(f"  {row['pool']}: {after}" if before == after else f"  {row['pool']}: {before} -> {after}")
    before, after = _total_cell(change["total"]["before"]), _total_cell(change["total"]["after"])
    lines.append(f"  total: {after}" if before == after else f"  total: {before} -> {after}")
    explained = cost_explanation(change)
    if explained:
        lines += ["  what moves the total:", *(f"    {line}" for line in explained)]
    moved = cold_start_change_rows(change)
    if moved:
        lines += ["Cold start from no node to Ready (predicted)",
                  *(f"  {model}: {before} -> {after}" for model, before, after in moved)]
    return lines


def capacity_change_table(change: dict[str, Any]) -> list[str]:
    lines = ["| pool | base | head |", "|---|---|---|"]
    for row in change["pools"]:
        before, after = _pool_cell(row["before"]), _pool_cell(row["after"])
        mark = "" if before == after else " :arrow_right:"
        lines.append(f"| `{row['pool']}`{mark} | {before} | {after} |")
    lines.append(f"| **total** | {_total_cell(change['total']['before'])} | {_total_cell(change['total']['after'])} |")
    explained = cost_explanation(change)
    if explained:
        lines += ["", "What moves the total, line by line:", "", *(f"- {line}" for line in explained)]
    return lines


def cold_start_cell(document: dict[str, Any] | None) -> str:
    """A model's prediction as capacity.json keeps it, in one cell."""
    if document is None:
        return "-"
    text = span(Range(document["secondsLow"], document["secondsHigh"]))
    if document["unknown"]:
        text += f" + {', '.join(document['unknown'])} (unknown)"
    return text + f", startup probe {duration(document['startupBudgetSeconds'])}"


def cold_start_change_rows(change: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(model, base, head) for every model whose prediction differs between the plans."""
    rows = []
    for row in change.get("coldStart") or []:
        before, after = cold_start_cell(row["before"]), cold_start_cell(row["after"])
        if before != after:
            rows.append((row["model"], before, after))
    return rows


def cold_start_table(change: dict[str, Any] | None, head: dict[str, Any] | None) -> list[str]:
    """Every model's predicted cold start in the head plan, beside the base's where there is one (marked where it
    moved)."""
    if change is not None:
        rows = [(r["model"], cold_start_cell(r["before"]), cold_start_cell(r["after"]))
                for r in change.get("coldStart") or []]
    else:
        rows = [(m["name"], "-", cold_start_cell(m.get("coldStart"))) for m in (head or {}).get("models", [])]
    if not rows:
        return []
    return ["**Cold start from no node to Ready** (predicted from published figures; `triarch plan` shows the "
            "parts):", "", "| model | base | head |", "|---|---|---|",
            *(f"| `{model}`{'' if before == after else ' :arrow_right:'} | {before} | {after} |"
              for model, before, after in rows)]
