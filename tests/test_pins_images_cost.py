"""Pins (issue 53): what a user relies on in image references and mirrors, and in the price list and the cost lines
of `triarch plan`. Each expected value is written by hand from the docs (docs/deploy.md, docs/stack-keys.md,
docs/plan.md), the registry grammar, or computed here from templates/compat/*.yaml's raw figures by the documented
formula (hourly price x nodes x hoursPerMonth; a rate x a quantity) - never by asking the code under test."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
import shutil
from datetime import date
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import compat_data, stack_document, write_stack_file
from triarch import cli
from triarch.images import ImageError, mirror, parse, release_of
from triarch.paths import COMPAT_DIR

ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
MIRROR = f"{ECR}/mirror"
DIGEST = "sha256:" + "9f2c4e1d0b8a7f6e" * 4
PRIVATE_VLLM = "registry.example.com:5000/team/vllm-openai:v0.33.0"
PRICES = compat_data("prices")
US_EAST_1 = PRICES["regions"]["us-east-1"]
HOURS = PRICES["hoursPerMonth"]
SLICE = Path(__file__).resolve().parent / "fixtures" / "prices" / "AmazonEC2-us-east-1-slice.json"


def planned(config: dict[str, Any], directory: Path, name: str = "pins") -> tuple[str, Path]:
    """`triarch plan --stack-file` of `config`, as a user runs it: what it printed, and its output directory."""
    directory.mkdir(parents=True, exist_ok=True)
    path = write_stack_file(directory / f"Pulumi.{name}.yaml", config)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["plan", "--stack-file", str(path), "--out", str(directory / "out")])
    assert code == 0, err.getvalue()
    return out.getvalue(), directory / "out"


def capacity_section(printed: str) -> list[str]:
    """The lines of the summary's "Capacity and cost per month" section."""
    return ("Capacity and cost per month" + printed.split("\nCapacity and cost per month", 1)[1]).split("\n\n")[0] \
        .splitlines()


def row(section: list[str], starts: str) -> list[str]:
    [line] = [line for line in section if line.strip().startswith(starts)]
    return line.split()


def dollars(value: float) -> str:
    """A monthly amount as the summary prints it (whole dollars, thousands separated)."""
    return f"${value:,.0f}"


def containers(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        return [*value.get("containers", []), *(c for v in value.values() for c in containers(v))]
    if isinstance(value, list):
        return [c for v in value for c in containers(v)]
    return []


# --- image references --------------------------------------------------------------------------------------------

def test_a_registry_with_a_port_and_no_dot_is_a_registry() -> None:
    """The distribution grammar: a first component with a port (`host:5000`) names a registry, so the rest is the
    repository and the reference is accepted, not refused as a bad repository path."""
    reference = parse("myregistry:5000/vllm/vllm-openai:v0.33.0")
    assert (reference.registry, reference.repository, reference.tag) == ("myregistry:5000", "vllm/vllm-openai",
                                                                         "v0.33.0")
    assert reference.host == "myregistry:5000"


def test_a_single_prefix_keeps_docker_hubs_official_images_under_library() -> None:
    """An ECR pull-through cache (and Harbor's proxy) names Docker Hub's official images `library/<name>`
    (images.mirror's docstring; docs/stack-keys.md triarch:registry.images: `<prefix>/<upstream path>`)."""
    assert mirror("busybox:1.37", MIRROR) == f"{MIRROR}/library/busybox:1.37"
    assert mirror("vllm/vllm-openai:v0.33.0", MIRROR) == f"{MIRROR}/vllm/vllm-openai:v0.33.0"


def test_a_per_host_mapping_moves_docker_hub_images_by_docker_io() -> None:
    """docs/stack-keys.md: one prefix per upstream registry host (docker.io, quay.io, ...): an image with no registry
    is Docker Hub's, so the docker.io prefix applies; a host the mapping does not name stays as it is."""
    prefixes = {"docker.io": f"{ECR}/hub", "quay.io": f"{ECR}/quay"}
    assert mirror("vllm/vllm-openai:v0.33.0", prefixes) == f"{ECR}/hub/vllm/vllm-openai:v0.33.0"
    assert mirror("quay.io/kuberay/operator:v1.7.0", prefixes) == f"{ECR}/quay/kuberay/operator:v1.7.0"
    assert mirror("nvcr.io/nvidia/k8s-device-plugin:v0.20.0", prefixes) == "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"


def test_an_image_in_a_private_registry_stays_as_given_under_a_single_prefix() -> None:
    """docs/stack-keys.md triarch:registry.images: "An image pinned with its own registry under triarch:images
    stays as given" - the prefix moves images from public registries only."""
    assert mirror(PRIVATE_VLLM, MIRROR) == PRIVATE_VLLM
    assert mirror(f"{ECR}/team/vllm-openai:v0.33.0", "harbor.example.com/proxy") == f"{ECR}/team/vllm-openai:v0.33.0"


def test_a_repository_merely_ending_like_vllms_is_not_vllms_release() -> None:
    """docs/deploy.md: a release is read from the path a mirror keeps (`<mirror>/vllm/vllm-openai:<tag>`): a path
    component `myvllm` is another repository, whose CUDA Triarch does not know, so the release must be declared."""
    known = [f"vllm/vllm-openai:{tag}" for tag in compat_data("images")["images"]["vllm/vllm-openai"]]
    assert release_of(f"{ECR}/hub/vllm/vllm-openai:v0.33.0", None, "vllm/vllm-openai", known) == \
        "vllm/vllm-openai:v0.33.0"
    with pytest.raises(ImageError) as refused:
        release_of(f"{ECR}/hub/myvllm/vllm-openai:v0.33.0", None, "vllm/vllm-openai", known)
    assert "is not vllm/vllm-openai" in refused.value.reason


def test_a_digest_alone_is_told_the_known_releases_in_release_order() -> None:
    """docs/deploy.md: a digest alone without a declared release is refused with the line to add, naming the
    releases templates/compat/images.yaml has, oldest first (v0.9.x before v0.33.0, as versions, not as text)."""
    tags = list(compat_data("images")["images"]["vllm/vllm-openai"])
    in_order = sorted(tags, key=lambda t: [int(n) for n in re.findall(r"\d+", t)])
    with pytest.raises(ImageError) as refused:
        release_of(f"{ECR}/mirror/vllm-openai@{DIGEST}", None, "vllm/vllm-openai",
                   [f"vllm/vllm-openai:{t}" for t in tags])
    assert f"{{release: <one of {', '.join(in_order)}>, image: " in refused.value.allowed
    assert in_order.index("v0.33.0") == len(in_order) - 1


# --- what a plan renders and lists -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def prod_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The shipped prod stack, planned as `triarch plan --stack prod` plans it."""
    return planned(stack_document("prod"), tmp_path_factory.mktemp("prod"), "prod")


@pytest.fixture(scope="module")
def own_registry(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    """prod with one mirror prefix for the public images, vLLM pinned in a private registry with its release
    declared, and Karpenter's controller pinned by a digest alone (docs/deploy.md's forms)."""
    config = stack_document("prod")
    config["triarch:registry"] = {"images": MIRROR}
    config["triarch:images"] = {"vllm": {"release": "v0.33.0", "image": PRIVATE_VLLM},
                                "karpenterController": f"public.ecr.aws/karpenter/controller@{DIGEST}"}
    _, out = planned(config, tmp_path_factory.mktemp("own-registry"), "prod")
    return (json.loads((out / "plan.json").read_text(encoding="utf-8")),
            json.loads((out / "mirror.json").read_text(encoding="utf-8")))


def test_prod_runs_the_default_serving_images_unannotated(prod_plan: tuple[str, Path]) -> None:
    """docs/stack-keys.md triarch:images defaults: vllm/vllm-openai:v0.33.0 for engine: vllm models (embed),
    rayproject/ray-llm:2.60.0-py312-cu130 for the Ray Serve application; an upstream image needs no
    triarch.dev/image-release annotation (docs/deploy.md: only a workload pulling a mirror says it)."""
    document = json.loads((prod_plan[1] / "plan.json").read_text(encoding="utf-8"))
    by_name = {r["name"]: r["inputs"] for r in document["resources"]}
    assert {c["image"] for c in containers(by_name["deployment-llm-embed"])} == {"vllm/vllm-openai:v0.33.0"}
    assert {c["image"] for c in containers(by_name["rayservice-llm-llm"])} == \
        {"rayproject/ray-llm:2.60.0-py312-cu130"}
    for name in ("deployment-llm-embed", "rayservice-llm-llm"):
        assert "triarch.dev/image-release" not in (by_name[name]["metadata"].get("annotations") or {})


def test_a_private_pin_is_pulled_as_given_and_says_its_release(own_registry: Any) -> None:
    """The pinned private image is what embed's pods pull (not moved under the mirror prefix), with its declared
    release in the triarch.dev/image-release annotation; Ray's image, public, comes from the mirror."""
    document, _ = own_registry
    by_name = {r["name"]: r["inputs"] for r in document["resources"]}
    embed = by_name["deployment-llm-embed"]
    assert {c["image"] for c in containers(embed)} == {PRIVATE_VLLM}
    assert embed["metadata"]["annotations"]["triarch.dev/image-release"] == "vllm/vllm-openai:v0.33.0"
    assert {c["image"] for c in containers(by_name["rayservice-llm-llm"])} == \
        {f"{MIRROR}/rayproject/ray-llm:2.60.0-py312-cu130"}


def test_mirror_json_names_the_tag_of_an_image_pinned_by_digest_alone(own_registry: Any) -> None:
    """docs/deploy.md: mirror.json lists every image "with its tag, pinned digest and what the nodes pull": a
    digest-only pin of Karpenter's controller is the release the pinned chart runs (charts.yaml's image), so a
    mirroring job copies `controller:<that tag>` and checks the digest."""
    _, listed = own_registry
    upstream = compat_data("charts")["charts"]["karpenter"]["images"]["karpenterController"]["image"]
    images = {i["key"]: i for i in listed["images"]}
    assert images["karpenterController"] == {
        "key": "karpenterController", "chart": "karpenter", "upstream": upstream, "tag": upstream.rsplit(":", 1)[1],
        "digest": DIGEST, "pulled": f"{MIRROR}/karpenter/controller@{DIGEST}"}
    assert images["vllm"] == {"key": "vllm", "chart": None, "upstream": "vllm/vllm-openai:v0.33.0",
                              "tag": "v0.33.0", "digest": None, "pulled": PRIVATE_VLLM}


# --- cost lines ----------------------------------------------------------------------------------------------------

def test_each_rate_billed_by_use_is_the_price_lists(prod_plan: tuple[str, Path]) -> None:
    """prices.yaml us-east-1 `usage:` rows, printed as `$<usd> per <unit>` under "Billed by use, not in the total":
    NAT data, EFS elastic reads and writes (each its own rate), CloudWatch ingestion and storage."""
    section = capacity_section(prod_plan[0])
    usage = US_EAST_1["usage"]
    expected = {"data through the NAT gateways": f"${usage['natGatewayProcessed']['usd']:g} per GB",
                "EFS reads (elastic throughput)": f"${usage['efsElasticRead']['usd']:g} per GB",
                "EFS writes (elastic throughput)": f"${usage['efsElasticWrite']['usd']:g} per GB",
                "control-plane logs ingested (CloudWatch)": f"${usage['logsIngested']['usd']:g} per GB",
                "control-plane logs kept 365 days (CloudWatch)": f"${usage['logsStored']['usd']:g} per GB-month"}
    at = section.index("  Billed by use, not in the total:")
    for name, rate in expected.items():
        assert any(line.startswith(f"    {name} {rate}") for line in section[at + 1:]), (name, rate, section)


def test_logs_kept_a_year_are_billed_about_twelve_gb_months_per_gb(prod_plan: tuple[str, Path]) -> None:
    """prod keeps control-plane logs 365 days: each day's GB is stored 365 days = 12 months, so it is billed for
    about 12 GB-months (logRetentionDays x 12 / 365)."""
    [line] = [x for x in capacity_section(prod_plan[0]) if "control-plane logs kept" in x]
    assert line.endswith("(each day's logs are billed for about 12 GB-month(s) per GB)"), line


@pytest.fixture(scope="module")
def dev_without_efs(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """dev (one NAT gateway over two zones) with its model caches on a StorageClass of the cluster (gp3, not
    Triarch's EFS) and logs kept 30 days."""
    config = stack_document("dev")
    config["triarch:serving"] = {"storageClass": "gp3"}
    config["triarch:cluster"]["logRetentionDays"] = 30
    return capacity_section(planned(config, tmp_path_factory.mktemp("dev-gp3"), "dev")[0])


def test_caches_off_efs_print_no_efs_cost_or_rate(dev_without_efs: list[str]) -> None:
    """docs/plan.md: the weights on EFS are priced where the model caches are on Triarch's EFS; with
    serving.storageClass set they are not, so neither the EFS row nor the EFS read/write rates appear."""
    assert not [line for line in dev_without_efs if "EFS" in line], dev_without_efs
    assert any(line.startswith("    data through the NAT gateways ") for line in dev_without_efs)


def test_logs_kept_thirty_days_are_about_one_gb_month_per_gb(dev_without_efs: list[str]) -> None:
    """30 days x 12 / 365 = 0.99: about 1 GB-month per GB of a day's logs."""
    [line] = [x for x in dev_without_efs if "control-plane logs kept" in x]
    assert line.startswith("    control-plane logs kept 30 days (CloudWatch) ")
    assert line.endswith("about 1 GB-month(s) per GB)"), line


def test_a_single_nat_gateway_has_one_public_address(dev_without_efs: list[str]) -> None:
    """triarch:cluster.natGateways defaults to single: one gateway and its one Elastic IP, whatever the zones (dev
    has two): natGateway 0.045 and publicIpv4 0.005 per hour x 730 h, from prices.yaml."""
    nat = dollars(US_EAST_1["natGateway"]["hourlyUsd"] * HOURS)
    ipv4 = dollars(US_EAST_1["publicIpv4"]["hourlyUsd"] * HOURS)
    assert row(dev_without_efs, "NAT gateways")[2:] == ["(1,", "before", "data", "processed)", nat, nat, nat]
    assert row(dev_without_efs, "public IPv4 addresses")[3:] == ["(1,", "the", "NAT", "gateways'", "Elastic", "IPs)",
                                                                  ipv4, ipv4, ipv4]


def test_a_time_sliced_pool_idles_on_the_nodes_its_slices_fill(tmp_path: Path) -> None:
    """docs/stack-keys.md timeSlicing: replicas pods share one GPU. dev's L4 pool sliced two ways with embed's two
    fixed replicas: both fit one g6.xlarge, so one node runs idle (0.8048 x 730 h), not two."""
    config = stack_document("dev")
    config["triarch:nodeGroups"][0]["timeSlicing"] = {"replicas": 2}
    config["triarch:models"][0]["replicas"] = 2
    section = capacity_section(planned(config, tmp_path, "dev")[0])
    hourly = US_EAST_1["instances"]["g6.xlarge"]["hourlyUsd"]
    assert row(section, "l4")[1:7] == ["g6.xlarge", "0-2", "0-2", "1", "node(s)", dollars(hourly * HOURS)]


def test_warm_capacity_on_a_multi_gpu_node_keeps_a_whole_node(tmp_path: Path) -> None:
    """docs/stack-keys.md warmReplicas: "Billed as the nodes it keeps". One warm replica of prod's chat (2 GPUs of
    a p4de.24xlarge's 8) keeps one whole node running: 27.44705 x 730 h."""
    config = stack_document("prod")
    [chat] = [m for m in config["triarch:models"] if m["name"] == "chat"]
    chat["warmReplicas"] = 1
    section = capacity_section(planned(config, tmp_path, "prod")[0])
    node = dollars(US_EAST_1["instances"]["p4de.24xlarge"]["hourlyUsd"] * HOURS)
    [warm] = [line for line in section if line.startswith("  Warm capacity")]
    assert warm == f"  Warm capacity (kept running empty, in the pools' idle cost): chat 2 GPU(s) on 1 node(s), {node}"


# --- `triarch prices refresh` --------------------------------------------------------------------------------------

def offer_in(region: str, hourly: dict[str, str] | None = None) -> dict[str, Any]:
    """tests/fixtures/prices' slice of an EC2 offer file, as the offer of `region`, with some node prices set."""
    data: dict[str, Any] = copy.deepcopy(json.loads(SLICE.read_text(encoding="utf-8")))
    for product in data["products"].values():
        if "regionCode" in product.get("attributes", {}):
            product["attributes"]["regionCode"] = region
    for sku, usd in (hourly or {}).items():
        for term in data["terms"]["OnDemand"][sku].values():
            for dimension in term["priceDimensions"].values():
                dimension["pricePerUnit"]["USD"] = usd
    return data


def refresh(tmp_path: Path, region: str, offer: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    table = tmp_path / "prices.yaml"
    shutil.copy(COMPAT_DIR / "prices.yaml", table)
    source = tmp_path / "index.json"
    source.write_text(json.dumps(offer), encoding="utf-8")
    code = cli.main(["prices", "refresh", "--region", region, "--from", str(source), "--file", str(table)])
    return code, yaml.safe_load(table.read_text(encoding="utf-8"))


def test_refresh_records_a_govcloud_region(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """AWS's price list has an EC2 offer per region, GovCloud's (us-gov-west-1) among them: a region code the
    command accepts and records like any other, dated with the offer's publicationDate (2026-11-20 in the slice)."""
    code, table = refresh(tmp_path, "us-gov-west-1", offer_in("us-gov-west-1"))
    assert code == 0, capsys.readouterr().err
    rows = table["regions"]["us-gov-west-1"]["instances"]
    assert rows["g6.xlarge"]["hourlyUsd"] == 0.8048 and rows["g6.xlarge"]["sourceDate"] == date(2026, 11, 20)


def test_refresh_records_every_digit_of_the_offers_price(tmp_path: Path) -> None:
    """AWS quotes p4d.24xlarge at $21.957642 an hour in us-east-1 (prices.yaml's aws-price-list row); a refresh
    must record what the offer says, not a rounding of it (it wrote 6 significant digits, 21.9576, before)."""
    offer = offer_in("us-east-1", {"A6GXLNODE0000001": "21.9576420000"})
    code, table = refresh(tmp_path, "us-east-1", offer)
    assert code == 0
    assert table["regions"]["us-east-1"]["instances"]["g6.xlarge"]["hourlyUsd"] == 21.957642


def test_weights_streamed_from_s3_cross_no_nat_where_triarch_made_the_vpc(tmp_path: Path) -> None:
    """large streams DeepSeek's weights from s3:// at every replica start and downloads Llama's from the hub once:
    in the VPC Triarch creates, S3 is reached through its gateway endpoint (no charge, the VPC User Guide), so the
    NAT line prices only the hub download and names the S3 model as crossing no NAT; the EFS lines leave out the
    streamed model, whose weights never touch the cache (the Run:ai streamer reads S3 into the GPUs)."""
    section = capacity_section(planned(stack_document("large"), tmp_path, "large")[0])
    [nat] = [line for line in section if line.startswith("    data through the NAT gateways ")]
    assert "a model's first download from the hub: llama $" in nat and "deepseek $" not in nat, nat
    assert nat.endswith("weights from s3:// in the VPC's region take its S3 gateway endpoint, not the NAT (no "
                        "charge): deepseek)"), nat
    for efs in [line for line in section if line.startswith("    EFS ")]:
        assert "llama $" in efs and "deepseek" not in efs, efs
