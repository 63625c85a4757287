"""The pieces of the pull-request review: capacity and cost from a price table, `triarch check --plan` and
`triarch diff --plan` reusing a plan, and the comment assembled from what they wrote."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from conftest import stack_document, write_stack_file
from triarch import cli
from triarch.catalog import catalog
from triarch.config import from_pulumi_config
from triarch.cost import Price, PriceTable, Rate, capacity_change, capacity_report, price_table
from triarch.diff import Difference
from triarch.offline import read_stack_config
from triarch.planners.models import plan_models
from triarch.review import MARKER, failures, review_markdown

SOURCE = "https://example.test/prices"
TABLE = PriceTable(
    retrieved="2026-12-01", hours_per_month=730,
    instances={"us-east-1": {"g6.xlarge": Price(1.0, SOURCE, None), "g6.2xlarge": Price(2.0, SOURCE, None),
                             "m7i.large": Price(0.1, SOURCE, None), "m7i.xlarge": Price(0.2, SOURCE, None)}},
    fixed={"us-east-1": {"eksControlPlane": Price(0.1, SOURCE, None), "natGateway": Price(0.05, SOURCE, None),
                         "publicIpv4": Price(0.01, SOURCE, None)}},
    not_offered={},
    storage={"us-east-1": {"ebsGp3": Rate(0.1, SOURCE, None), "efsStandard": Rate(0.3, SOURCE, None)}},
    usage={"us-east-1": {"natGatewayProcessed": Rate(0.05, SOURCE, None), "efsElasticRead": Rate(0.03, SOURCE, None),
                         "efsElasticWrite": Rate(0.06, SOURCE, None), "logsIngested": Rate(0.5, SOURCE, None),
                         "logsStored": Rate(0.03, SOURCE, None)}})
"""Round prices, so every expected figure below is arithmetic a reader can redo."""


def report(name: str, tmp_path: Path, table: PriceTable = TABLE) -> dict[str, Any]:
    values, _ = read_stack_config(write_stack_file(tmp_path / f"Pulumi.{name}.yaml", stack_document(name)))
    stack = from_pulumi_config(values)
    return capacity_report(name, stack, plan_models(stack, catalog()), catalog(), table)


# --- capacity and cost ---------------------------------------------------------------------------------------------

def test_dev_costs_its_pool_at_min_and_max_plus_the_fixed_part(tmp_path: Path) -> None:
    capacity = report("dev", tmp_path)
    [pool] = capacity["pools"]
    # dev: one L4 pool of g6.xlarge (1 GPU), 0-2 nodes, at $1/h for 730 h.
    assert (pool["name"], pool["gpusAtMin"], pool["gpusAtMax"]) == ("l4", 0, 2)
    assert (pool["monthlyUsdAtMin"], pool["monthlyUsdAtMax"]) == (0, 1460)
    fixed = {item["key"]: (item["monthlyUsdIdle"], item["monthlyUsdAtMin"], item["monthlyUsdAtMax"]) for item in
             capacity["fixed"]}
    system = stack_document("dev")["triarch:cluster"]["systemNodeGroup"]
    assert system.get("instanceType", "m7i.large") == "m7i.large" and "diskGiB" not in system
    assert (system.get("min", 2), system.get("max", 4)) == (2, 4)
    # Root volumes: 50 GiB per system node (2-4), 200 GiB per L4 node (idle 1: embed's replica), at $0.1 per GiB-month.
    # Prometheus: 50 GiB at $0.1. EFS: Qwen3-Embedding-0.6B's 0.6B bf16 weights, 1.1 GiB at $0.3.
    assert fixed == {"systemNodes": (146, 146, 292), "eksControlPlane": (73, 73, 73), "natGateways": (36.5, 36.5, 36.5),
                     "publicIpv4": (7.3, 7.3, 7.3), "ebsRootVolumes": (30, 10, 60), "prometheusVolume": (5, 5, 5),
                     "efsModelCaches": (0.33, 0.33, 0.33)}
    [efs] = [item for item in capacity["fixed"] if item["key"] == "efsModelCaches"]
    assert "1.1 GiB" in efs["name"]
    assert capacity["monthlyUsdIdle"] == round(730 + 146 + 73 + 36.5 + 7.3 + 30 + 5 + 0.33, 2)
    assert capacity["monthlyUsdAtMin"] == round(0 + 146 + 73 + 36.5 + 7.3 + 10 + 5 + 0.33, 2)
    assert capacity["monthlyUsdAtMax"] == round(1460 + 292 + 73 + 36.5 + 7.3 + 60 + 5 + 0.33, 2)
    # What is billed by use has a rate and, where one event's size is known, its price; never a monthly figure.
    usage = {item["key"]: item for item in capacity["usage"]}
    assert set(usage) == {"natGatewayProcessed", "efsElasticRead", "efsElasticWrite", "logsIngested", "logsStored"}
    assert usage["efsElasticRead"]["usd"] == 0.03 and "embed $0.03" in usage["efsElasticRead"]["perEvent"]
    assert usage["logsIngested"]["perEvent"] is None
    assert not any("monthlyUsd" in key for item in capacity["usage"] for key in item)
    [model] = capacity["models"]
    assert (model["name"], model["pool"], model["gpusPerReplica"], model["replicasMin"]) == ("embed", "l4", 1, 1)


def test_prod_counts_a_nat_gateway_per_zone_and_eight_gpus_per_a100_node(tmp_path: Path) -> None:
    capacity = report("prod", tmp_path)
    pools = {p["name"]: p for p in capacity["pools"]}
    assert (pools["a100"]["gpusAtMin"], pools["a100"]["gpusAtMax"]) == (0, 16)  # p4de.24xlarge: 8 x A100, 0-2 nodes
    assert pools["a100"]["monthlyUsdAtMax"] is None  # the table above has no p4de price: unknown, not zero
    assert capacity["monthlyUsdAtMax"] is None
    assert pools["l4"]["monthlyUsdAtMax"] == 6 * 2.0 * 730
    [nat] = [item for item in capacity["fixed"] if item["name"].startswith("NAT")]
    assert nat["name"].startswith("NAT gateways (3") and nat["monthlyUsdAtMin"] == round(3 * 0.05 * 730, 2)


def test_an_existing_cluster_has_no_price(tmp_path: Path) -> None:
    capacity = report("local", tmp_path)
    assert capacity["region"] is None and capacity["fixed"] == []
    assert all(p["monthlyUsdAtMax"] is None for p in capacity["pools"])
    assert capacity["monthlyUsdAtMin"] is None


def test_the_shipped_price_table_prices_every_instance_type_in_the_stacks_regions() -> None:
    table = price_table()
    facts = catalog()
    regions = {stack_document(n).get("aws:region") for n in ("dev", "prod")}
    for region in regions:
        assert region is not None
        missing = sorted(set(facts.instances) - set(table.instances[region]) - set(table.not_offered[region]))
        # Every type Triarch knows has a us-east-1 row (SkyPilot's catalog gave g4dn, p5.4xlarge and p6-b200 too).
        assert missing == [], f"{region}: no price for {missing}"
        assert set(table.instances[region]).isdisjoint(table.not_offered[region])
        assert set(table.fixed[region]) == {"eksControlPlane", "natGateway", "publicIpv4"}
        assert set(table.storage[region]) == {"ebsGp3", "ebsGp3Throughput", "efsStandard"}
        assert set(table.usage[region]) == {"natGatewayProcessed", "efsElasticRead", "efsElasticWrite",
                                            "logsIngested", "logsStored"}
        for rate in [*table.storage[region].values(), *table.usage[region].values()]:
            assert rate.source.startswith("https://") and rate.source_date and rate.usd > 0
    for prices in table.instances.values():
        for name, price in prices.items():
            assert price.source.startswith("https://") and price.hourly_usd > 0, name


def test_a_capacity_change_compares_pools_by_name() -> None:
    base = {"pools": [{"name": "l4", "instanceType": "g6.xlarge", "minNodes": 0, "maxNodes": 2, "gpusAtMin": 0,
                       "gpusAtMax": 2, "monthlyUsdAtMin": 0, "monthlyUsdAtMax": 1460}],
            "monthlyUsdAtMin": 100, "monthlyUsdAtMax": 1560}
    head = {"pools": [{**base["pools"][0], "maxNodes": 3, "gpusAtMax": 3, "monthlyUsdAtMax": 2190},
                      {"name": "a100", "instanceType": "p4de.24xlarge", "minNodes": 0, "maxNodes": 1,
                       "gpusAtMin": 0, "gpusAtMax": 8, "monthlyUsdAtMin": 0, "monthlyUsdAtMax": None}],
            "monthlyUsdAtMin": 100, "monthlyUsdAtMax": None}
    change = capacity_change(base, head)
    assert change is not None
    rows = {row["pool"]: row for row in change["pools"]}
    assert rows["a100"]["before"] is None and rows["a100"]["after"]["gpusAtMax"] == 8
    assert rows["l4"]["before"]["maxNodes"] == 2 and rows["l4"]["after"]["maxNodes"] == 3
    # capacity.json written before the idle floor existed: its idle total is unknown, not zero
    assert change["total"] == {"before": {"monthlyUsdIdle": None, "monthlyUsdAtMin": 100, "monthlyUsdAtMax": 1560},
                               "after": {"monthlyUsdIdle": None, "monthlyUsdAtMin": 100, "monthlyUsdAtMax": None}}
    unknown_base = capacity_change(None, head)
    assert unknown_base is not None and unknown_base["baseKnown"] is False
    assert all(row["before"] is None for row in unknown_base["pools"])


# --- check and diff reuse a plan -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def prod_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prod-plan")
    assert cli.main(["plan", "--stack", "prod", "--out", str(out)]) == 0
    return out


def test_plan_writes_capacity_beside_the_plan(prod_plan: Path) -> None:
    capacity = json.loads((prod_plan / "capacity.json").read_text(encoding="utf-8"))
    assert capacity["stack"] == "prod" and capacity["region"] == "us-east-1"
    assert [p["name"] for p in capacity["pools"]] == [g["name"] for g in stack_document("prod")["triarch:nodeGroups"]]


def test_check_of_a_plan_reads_it_instead_of_planning(prod_plan: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "--stack", "prod", "--format", "json"]) == 0
    planned_now = json.loads(capsys.readouterr().out)
    assert cli.main(["check", "--plan", str(prod_plan), "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == planned_now
    assert "checking stack" not in captured.err  # nothing planned


def test_check_of_a_plan_finds_what_the_plan_holds(prod_plan: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The verdict comes from the plan's own inputs: a plan edited to open the OpenAI port to every namespace
    is refused, though the stack file would not be."""
    broken = tmp_path / "plan"
    shutil.copytree(prod_plan, broken)
    document = json.loads((broken / "plan.json").read_text(encoding="utf-8"))
    [policy] = [r for r in document["resources"] if r["name"] == "networkpolicy-llm-allow-openai-http"]
    policy["inputs"]["spec"]["ingress"][0]["from"] = [{"namespaceSelector": {}}]
    (broken / "plan.json").write_text(json.dumps(document), encoding="utf-8")
    assert cli.main(["check", "--plan", str(broken), "--format", "json"]) == 1
    violations = json.loads(capsys.readouterr().out)["violations"]
    assert [(v["policy"], v["resource"]["name"]) for v in violations] == [
        ("serving-network-isolated", "networkpolicy-llm-allow-openai-http")]


def test_diff_of_a_plan_against_itself(prod_plan: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["diff", "--base", str(prod_plan), "--plan", str(prod_plan), "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert all(result[k] == [] for k in ("replaced", "added", "removed", "changed"))
    capacity = result["capacity"]
    assert capacity["baseKnown"] is True
    assert all(row["before"] == row["after"] for row in capacity["pools"])


def test_check_and_diff_refuse_a_directory_without_a_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "--plan", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --plan: '{tmp_path}' holds no readable plan.json")
    assert cli.main(["diff", "--base", str(tmp_path), "--plan", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: --plan: ")


# --- the comment ---------------------------------------------------------------------------------------------------

def violation(policy: str, layer: str, level: str, message: str) -> dict[str, Any]:
    return {"policy": policy, "layer": layer, "enforcementLevel": level, "message": message,
            "resource": {"type": "kubernetes:apps/v1:Deployment", "name": "deployment-llm-chat", "urn": "urn:x"}}


def replaced(name: str, stateful: bool, intended: bool = False) -> dict[str, Any]:
    """A replacement as `triarch diff --format json` writes it."""
    return Difference("replaced", "aws:efs/fileSystem:FileSystem", name, f"urn:{name}", ["kmsKeyId"], stateful,
                      "kmsKeyId cannot change in place", intended).as_json()


def review_dir(tmp_path: Path, prod_plan: Path) -> Path:
    root = tmp_path / "review"
    for sub in ("head", "base", "check", "diff", "errors"):
        (root / sub).mkdir(parents=True)
    shutil.copytree(prod_plan, root / "head" / "prod")
    shutil.copytree(prod_plan, root / "base" / "prod")
    (root / "check" / "prod.json").write_text(json.dumps({"stack": "prod", "placement": ["a pod fits"], "violations": [
        violation("gpu-zone-spread", "Kubernetes", "advisory", "spread softly"),
        violation("vllm-memory-utilization", "vLLM", "mandatory", "0.97 is above 0.95")]}), encoding="utf-8")
    capacity = json.loads((prod_plan / "capacity.json").read_text(encoding="utf-8"))
    (root / "diff" / "prod.json").write_text(json.dumps({
        "replaced": [replaced("llm-prod-models-fs", stateful=True)], "added": [], "removed": [], "changed": [],
        "engineArgs": [{"model": "chat", "changes": {"max_model_len": {"before": 32768, "after": 16384}}}],
        "vllm": [], "capacity": capacity_change(capacity, capacity)}), encoding="utf-8")
    (root / "errors" / "broken.txt").write_text("planning stack broken ...\nerror: triarch:cluster: bad\n",
                                                encoding="utf-8")
    return root


def test_the_comment_puts_replacements_first_then_guardrails_by_layer_then_cost(tmp_path: Path,
                                                                                 prod_plan: Path) -> None:
    root = review_dir(tmp_path, prod_plan)
    text = review_markdown(root, "a" * 40, "b" * 40)
    assert text.startswith(MARKER + "\n## Triarch review of `bbbbbbbbbbbb` against `aaaaaaaaaaaa`")
    order = [text.index(s) for s in ("### :x: `broken`", "### :x: `prod`", ":warning: stateful",
                                     "**Engine args per model:**", "**Guardrails:** 1 mandatory, 1 advisory",
                                     "*Kubernetes (where)*", "*vLLM (when)*", "**Capacity and cost per month**",
                                     "```mermaid")]
    assert order == sorted(order)
    assert "`max_model_len` 32768 -> 16384" in text
    assert "**Does not plan:** triarch:cluster: bad" in text
    assert 'subgraph pool_a100["a100: p4de.24xlarge x 0-2, NVIDIA A100' in text
    assert 'model_chat["chat (ray-serve): 2 GPU x 1-4"]' in text
    assert failures(root) == ["broken: does not plan: triarch:cluster: bad",
                              "prod: 1 mandatory guardrail violation(s)",
                              "prod: 1 unintended stateful replacement(s) or removal(s): llm-prod-models-fs"]


def test_the_comment_says_what_a_change_does_to_running_traffic_above_its_tables(
        tmp_path: Path, prod_plan: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A renamed Ray Serve model on prod: the diff's effects lead the stack's section, before what it replaces."""
    root = review_dir(tmp_path, prod_plan)
    config = stack_document("prod")
    next(m for m in config["triarch:models"] if m["name"] == "qwen")["name"] = "qwen3"
    (tmp_path / "edited").mkdir()
    head = write_stack_file(tmp_path / "edited" / "Pulumi.prod.yaml", config)
    capsys.readouterr()
    assert cli.main(["diff", "--base", str(prod_plan), "--stack-file", str(head), "--format", "json"]) == 0
    effects = json.loads(capsys.readouterr().out)["effects"]
    written = json.loads((root / "diff" / "prod.json").read_text(encoding="utf-8"))
    (root / "diff" / "prod.json").write_text(json.dumps({**written, "effects": effects}), encoding="utf-8")
    text = review_markdown(root, "a" * 40, "b" * 40)
    assert "- clients: Ray Serve application(s) qwen (/qwen) of RayService llm go, qwen3 (/qwen3) come" in text
    order = [text.index(s) for s in ("### :x: `prod`", "**Effects on running traffic:**",
                                     *(f"- {e}" for e in effects), ":warning: stateful")]
    assert order == sorted(order) and len(effects) == 3


def test_comment_strict_fails_only_on_what_blocks(tmp_path: Path, prod_plan: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    root = review_dir(tmp_path, prod_plan)
    out = tmp_path / "comment.md"
    assert cli.main(["comment", str(root), "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8").startswith(MARKER)
    assert cli.main(["comment", str(root), "--strict", "--out", str(out)]) == 1
    assert "review: prod: 1 unintended stateful replacement(s) or removal(s)" in capsys.readouterr().err
    # Intended, advisory only, and every stack planned: nothing blocks.
    (root / "errors" / "broken.txt").unlink()
    check = json.loads((root / "check" / "prod.json").read_text(encoding="utf-8"))
    check["violations"] = [v for v in check["violations"] if v["enforcementLevel"] == "advisory"]
    (root / "check" / "prod.json").write_text(json.dumps(check), encoding="utf-8")
    diff = json.loads((root / "diff" / "prod.json").read_text(encoding="utf-8"))
    diff["replaced"] = [replaced("llm-prod-models-fs", stateful=True, intended=True)]
    (root / "diff" / "prod.json").write_text(json.dumps(diff), encoding="utf-8")
    assert cli.main(["comment", str(root), "--strict", "--out", str(out)]) == 0
    comment = out.read_text(encoding="utf-8")
    assert ":white_check_mark: no mandatory violation" in comment
    assert "### :white_check_mark: `prod`" in comment  # the stack's own verdict agrees with the gate


def test_a_missing_check_fails_the_review(tmp_path: Path, prod_plan: Path) -> None:
    root = review_dir(tmp_path, prod_plan)
    (root / "check" / "prod.json").write_text("", encoding="utf-8")  # check crashed before printing
    assert "prod: no guardrail verdict (triarch check did not run)" in failures(root)


def test_a_long_comment_is_cut_below_githubs_limit(tmp_path: Path, prod_plan: Path) -> None:
    root = review_dir(tmp_path, prod_plan)
    check = json.loads((root / "check" / "prod.json").read_text(encoding="utf-8"))
    check["violations"] = [violation("pinned-images", "Kubernetes", "advisory", "x" * 500) for _ in range(200)]
    (root / "check" / "prod.json").write_text(json.dumps(check), encoding="utf-8")
    text = review_markdown(root)
    assert len(text) < 65_536 and "the `triarch-review` artifact hold all of it" in text


def test_a_stateful_removal_fails_the_stack_section_and_leads_it(tmp_path: Path, prod_plan: Path) -> None:
    """The stack's own verdict counts removals as the review's failures do: a deleted Secret is shown in the table
    of what cannot be undone, not folded into the details."""
    root = review_dir(tmp_path, prod_plan)
    (root / "check" / "prod.json").write_text(json.dumps({"stack": "prod", "violations": []}), encoding="utf-8")
    secret = Difference("removed", "kubernetes:core/v1:Secret", "secret-llm-hf-token", "urn:s", [], True,
                        "gone from the head; the pods that read it fail").as_json()
    diff = json.loads((root / "diff" / "prod.json").read_text(encoding="utf-8"))
    diff.update(replaced=[], removed=[secret])
    (root / "diff" / "prod.json").write_text(json.dumps(diff), encoding="utf-8")
    (root / "errors" / "broken.txt").unlink()
    text = review_markdown(root)
    assert "### :x: `prod`" in text
    table = text.split("| | replaced or removed | inputs | why |", 1)[1].split("\n\n", 1)[0]
    assert "`secret-llm-hf-token` | removed |" in table
    assert "- removed: `kubernetes:core/v1:Secret`" not in text
    assert failures(root) == ["prod: 1 unintended stateful replacement(s) or removal(s): secret-llm-hf-token"]


def test_the_comment_says_which_release_each_pulled_image_is(tmp_path: Path, prod_plan: Path) -> None:
    """From mirror.json beside the head's plan: a mirrored, digest-pinned vLLM image and the release it is."""
    root = review_dir(tmp_path, prod_plan)
    listed = json.loads((root / "head" / "prod" / "mirror.json").read_text(encoding="utf-8"))
    pulled = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mirror/vllm-openai@sha256:" + "ab" * 32
    [vllm] = [i for i in listed["images"] if i["key"] == "vllm"]
    vllm["pulled"] = pulled
    (root / "head" / "prod" / "mirror.json").write_text(json.dumps(listed), encoding="utf-8")
    text = review_markdown(root)
    assert f"- `vllm`: `{pulled}`, a mirror's copy of `vllm/vllm-openai:v0.33.0`" in text
    assert ("- `kuberayOperator` (kuberay-operator): `quay.io/kuberay/operator:v1.7.0`, from its upstream registry"
            in text)  # not "`X` is `X`"


def test_the_comment_says_an_image_change_rolls_the_pods(tmp_path: Path, prod_plan: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The vLLM image pinned by digest on prod: no resource is added or replaced, yet every embed pod restarts; the
    comment says so among the effects on running traffic (issue 36)."""
    root = review_dir(tmp_path, prod_plan)
    config = stack_document("prod")
    config["triarch:images"] = {"vllm": "vllm/vllm-openai:v0.33.0@sha256:" + "a" * 64}
    (tmp_path / "edited").mkdir()
    head = write_stack_file(tmp_path / "edited" / "Pulumi.prod.yaml", config)
    capsys.readouterr()
    assert cli.main(["diff", "--base", str(prod_plan), "--stack-file", str(head), "--format", "json"]) == 0
    effects = json.loads(capsys.readouterr().out)["effects"]
    written = json.loads((root / "diff" / "prod.json").read_text(encoding="utf-8"))
    (root / "diff" / "prod.json").write_text(json.dumps({**written, "effects": effects}), encoding="utf-8")
    text = review_markdown(root, "a" * 40, "b" * 40)
    assert "**Effects on running traffic:**" in text
    assert ("- Deployment deployment-llm-embed: every pod is replaced onto the new image, one rolling update "
            "(maxSurge 0, maxUnavailable 1: each old replica stops before its replacement starts") in text
