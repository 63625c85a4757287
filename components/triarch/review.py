"""The pull-request comment: for every stack, what `triarch check --plan` and `triarch diff --plan` found and what
the change does to capacity and cost, read from the files the review workflow writes (nothing is planned here):

    review/head/<stack>/    plan.json, capacity.json and manifests of the head (`triarch plan`)
    review/base/<stack>/    the same for the base commit (`triarch plan --at BASE`; absent for a new stack)
    review/check/<stack>.json   `triarch check --plan review/head/<stack> --format json`
    review/diff/<stack>.json    `triarch diff --base review/base/<stack> --plan review/head/<stack> --format json`
    review/errors/<stack>.txt   what `triarch plan` printed where the head did not plan
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from triarch.cost import at_least_line, price_gap_line
from triarch.report.changes import capacity_change_table, cold_start_table
from triarch.report.summary import total_cell, usage_line, usd

MARKER = "<!-- triarch-review -->"
"""The first line of the comment: the workflow updates the comment that starts with it instead of adding one."""
LAYERS = ("Kubernetes", "Ray", "vLLM")
LAYER_ROLE = {"Kubernetes": "where", "Ray": "how", "vLLM": "when"}


def _load(path: Path) -> dict[str, Any] | None:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


MAX_COMMENT = 60_000
"""GitHub refuses a comment body over 65,536 characters; the job summary and the artifact keep the rest."""


def stacks_of(directory: Path) -> list[str]:
    """Stacks planned, and stacks that did not plan (an errors/<stack>.txt)."""
    head, errors = directory / "head", directory / "errors"
    planned = {p.name for p in head.iterdir() if (p / "plan.json").is_file()} if head.is_dir() else set()
    failed = {p.stem for p in errors.glob("*.txt")} if errors.is_dir() else set()
    return sorted(planned | failed)


def plan_error(directory: Path, stack: str) -> str | None:
    """The reason a stack's head did not plan (the last line `triarch plan` printed), or None."""
    path = directory / "errors" / f"{stack}.txt"
    if (directory / "head" / stack / "plan.json").is_file() or not path.is_file():
        return None
    lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return (lines[-1] if lines else "no output").removeprefix("error: ")


def failures(directory: Path) -> list[str]:
    """What fails the review: a mandatory guardrail violation, an unintended stateful replacement, a stack whose
    check did not run."""
    found = []
    for stack in stacks_of(directory):
        error = plan_error(directory, stack)
        if error is not None:
            found.append(f"{stack}: does not plan: {error}")
            continue
        check = _load(directory / "check" / f"{stack}.json")
        if check is None:
            found.append(f"{stack}: no guardrail verdict (triarch check did not run)")
        else:
            mandatory = [v for v in check["violations"] if v["enforcementLevel"] == "mandatory"]
            if mandatory:
                found.append(f"{stack}: {len(mandatory)} mandatory guardrail violation(s)")
        diff = _load(directory / "diff" / f"{stack}.json")
        if diff is not None:
            blocking = [d for d in [*diff["replaced"], *diff["removed"]] if d["stateful"] and not d.get("intended")]
            if blocking:
                found.append(f"{stack}: {len(blocking)} unintended stateful replacement(s) or removal(s): "
                             + ", ".join(d["name"] for d in blocking))
    return found


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _mermaid_id(prefix: str, name: str) -> str:
    return prefix + re.sub(r"\W", "_", name)


def placement_diagram(capacity: dict[str, Any]) -> list[str]:
    """Models placed on pools, as a Mermaid flowchart GitHub renders in the comment."""
    lines = ["```mermaid", "flowchart LR"]
    for pool in capacity["pools"]:
        nodes = str(pool["minNodes"]) if pool["minNodes"] == pool["maxNodes"] else \
            f"{pool['minNodes']}-{pool['maxNodes']}"
        label = f"{pool['name']}: {pool['instanceType'] or 'existing nodes'} x {nodes}, {pool['gpu']}"
        lines.append(f'  subgraph {_mermaid_id("pool_", pool["name"])}["{label}"]')
        for model in (m for m in capacity["models"] if m["pool"] == pool["name"]):
            replicas = (str(model["replicasMin"]) if model["replicasMin"] == model["replicasMax"]
                        else f"{model['replicasMin']}-{model['replicasMax']}")
            lines.append(f'    {_mermaid_id("model_", model["name"])}["{model["name"]} ({model["engine"]}): '
                         f'{model["gpusPerReplica"]} GPU x {replicas}"]')
        lines.append("  end")
    lines.append("```")
    return lines


def _stack_section(directory: Path, stack: str) -> list[str]:
    error = plan_error(directory, stack)
    if error is not None:
        return [f"### :x: `{stack}`", "", f"**Does not plan:** {_cell(error)}"]
    check = _load(directory / "check" / f"{stack}.json")
    diff = _load(directory / "diff" / f"{stack}.json")
    capacity = _load(directory / "head" / stack / "capacity.json")
    mandatory = [v for v in (check or {}).get("violations", []) if v["enforcementLevel"] == "mandatory"]
    # Replacements, and removals that lose state: what the change cannot undo.
    lossy = [*(diff or {}).get("replaced", []), *(d for d in (diff or {}).get("removed", []) if d["stateful"])]
    blocking = [d for d in lossy if d["stateful"] and not d.get("intended")]
    ok = check is not None and not mandatory and not blocking
    lines = [f"### {':white_check_mark:' if ok else ':x:'} `{stack}`", ""]

    # What the change replaces comes first: it is what cannot be undone.
    if diff is None:
        lines.append("**Diff:** no base plan (a new stack, or the base commit does not plan it): everything is new.")
    else:
        counts = ", ".join(f"{len(diff[k])} {k}" for k in ("replaced", "added", "removed", "changed"))
        lines.append(f"**Diff against the base:** {counts}.")
        if diff.get("effects"):
            # What running traffic feels comes before the tables of what changes (triarch.effects).
            lines += ["", "**Effects on running traffic:**", "", *(f"- {_cell(e)}" for e in diff["effects"])]
        if lossy:
            lines += ["", "| | replaced or removed | inputs | why |", "|---|---|---|---|"]
            for d in lossy:
                mark = ":warning: stateful" if d["stateful"] and not d.get("intended") else \
                    ("intended" if d.get("intended") else "")
                inputs = ", ".join(d["inputs"]) or ("removed" if d in diff["removed"] else "")
                lines.append(f"| {mark} | `{d['type']}` `{d['name']}` | {inputs} | {_cell(d['cause'])} |")
        other = [(kind, d) for kind in ("added", "removed", "changed") for d in diff[kind]
                 if not (kind == "removed" and d["stateful"])]
        if other:
            lines += ["", f"<details><summary>{len(other)} added, removed or changed in place</summary>", "",
                      *(f"- {kind}: `{d['type']}` `{d['name']}`"
                        + (f" ({', '.join(d['inputs'])})" if d["inputs"] else "") for kind, d in other),
                      "", "</details>"]
        if diff.get("engineArgs"):
            lines += ["", "**Engine args per model:**", ""]
            for change in diff["engineArgs"]:
                shown = ", ".join(f"`{k}` {v['before']} -> {v['after']}" for k, v in change["changes"].items())
                lines.append(f"- `{change['model']}`: {shown}")
        if diff.get("vllm"):
            lines += ["", "**vLLM release:**", "", *(f"- {note}" for note in diff["vllm"])]
    lines.append("")

    if check is None:
        lines.append("**Guardrails:** not evaluated (triarch check did not run).")
    else:
        advisory = len(check["violations"]) - len(mandatory)
        lines.append(f"**Guardrails:** {len(mandatory)} mandatory, {advisory} advisory.")
        for layer in LAYERS:
            found = [v for v in check["violations"] if v["layer"] == layer]
            if found:
                lines += ["", f"*{layer} ({LAYER_ROLE[layer]})*", ""]
                lines += [f"- **{v['enforcementLevel']}** `{v['policy']}` on `{v['resource']['name']}`: "
                          f"{_cell(v['message'])}" for v in found]
        if check.get("placement"):
            lines += ["", "<details><summary>Placement: where each pod template runs, and its room</summary>", "",
                      *(f"- {p}" for p in check["placement"]), "", "</details>"]
    lines.append("")

    heading = ("**Capacity and cost per month** (idle: what fixed replicas and autoscaling minimums hold; at min "
               "nodes - at max nodes):")
    if diff is not None and diff.get("capacity"):
        lines += [heading, "", *capacity_change_table(diff["capacity"])]
    elif capacity is not None:
        lines += [heading, "", "| pool | head |", "|---|---|"]
        for pool in capacity["pools"]:
            idle = f"idle {pool['nodesIdle']} node(s) {usd(pool.get('monthlyUsdIdle'))}, " \
                if pool.get("nodesIdle") is not None else ""
            lines.append(f"| `{pool['name']}` | {pool['gpusAtMin']}-{pool['gpusAtMax']} GPUs, {idle}"
                         f"{usd(pool['monthlyUsdAtMin'])}-{usd(pool['monthlyUsdAtMax'])} |")
        for item in capacity.get("fixed", []):
            lines.append(f"| {item['name']} | idle {usd(item.get('monthlyUsdIdle'))}, "
                         f"{usd(item['monthlyUsdAtMin'])}-{usd(item['monthlyUsdAtMax'])} |")
        if capacity.get("region"):
            lines.append(f"| **total** | idle {total_cell(capacity, 'monthlyUsdIdle')}, "
                         f"{total_cell(capacity, 'monthlyUsdAtMin')}-{total_cell(capacity, 'monthlyUsdAtMax')} |")
    if capacity is not None:
        if capacity.get("usage"):
            lines += ["", "Billed by use, not in the total: " + "; ".join(usage_line(u) for u in capacity["usage"])
                      + "."]
        if capacity.get("region"):
            spot = any(p.get("capacityType") == "SPOT" for p in capacity["pools"])
            lines += ["", f"On-demand list prices, {capacity['region']}, retrieved {capacity['pricesRetrieved']} "
                          "(templates/compat/prices.yaml)" + ("; spot pools at that price, an upper bound." if spot
                                                             else ".")]
            gap = price_gap_line(capacity)
            if gap:
                lines += ["", f":warning: {gap}."]
            floor = at_least_line(capacity)
            if floor:
                lines += ["", f"The {floor}."]
        if capacity["models"]:
            lines += ["", *cold_start_table((diff or {}).get("capacity"), capacity)]
            lines += ["", *placement_diagram(capacity)]
    mirrored = _load(directory / "head" / stack / "mirror.json")
    if mirrored and mirrored.get("images"):
        lines += ["", "<details><summary>Images: what the nodes pull, and the release each one is</summary>", "",
                  *(_image_line(i) for i in mirrored["images"]), "", "</details>"]
    return lines


def _image_line(image: dict[str, str]) -> str:
    """One pulled image: straight from its upstream registry, or a mirror's copy and the release it is."""
    where = f"- `{image['key']}`" + (f" ({image['chart']})" if image.get("chart") else "")
    if image["pulled"] == image["upstream"]:
        return f"{where}: `{image['pulled']}`, from its upstream registry"
    return f"{where}: `{image['pulled']}`, a mirror's copy of `{image['upstream']}`"


def _ref(ref: str) -> str:
    """A commit as the heading shows it (12 characters), with what follows it (`+ working tree`) kept."""
    commit, _, rest = ref.partition(" ")
    return f"`{commit[:12]}`" + (f" {rest}" if rest else "")


def review_markdown(directory: Path, base_ref: str | None = None, head_ref: str | None = None) -> str:
    stacks = stacks_of(directory)
    failing = failures(directory)
    refs = f" of {_ref(head_ref)} against {_ref(base_ref)}" if head_ref and base_ref else ""
    verdict = (":x: " + "; ".join(failing)) if failing else ":white_check_mark: no mandatory violation, no " \
        "unintended stateful replacement or removal"
    lines = [MARKER, f"## Triarch review{refs}", "", verdict, ""]
    if not stacks:
        lines.append("No stack was planned.")
    for stack in stacks:
        lines += _stack_section(directory, stack)
        lines.append("")
    lines.append("<sub>Planned offline under Pulumi's mock engine (`triarch plan`, `check --plan`, "
                 "`diff --plan`); no cloud credentials were used.</sub>")
    text = "\n".join(lines) + "\n"
    if len(text) > MAX_COMMENT:
        cut = text.rfind("\n", 0, MAX_COMMENT - 200)
        text = text[:cut] + "\n\n_Cut here: the comment would exceed GitHub's limit. The job summary and the " \
            "`triarch-review` artifact hold all of it._\n"
    return text
