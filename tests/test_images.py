"""Images the way companies run them: from a mirror, by digest, with the upstream release each one is declared or
read from the path a mirror keeps. A user's stack file in each form, and what plans from it (the pulled reference in
the manifests, the release's CUDA, vLLM and Ray everywhere else); bad references refused in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import MutatedConfig, plan_config, stack_document
from triarch.config import from_pulumi_config
from triarch.diff import diff_plans
from triarch.errors import ConfigError
from triarch.guardrails.check import evaluate, resources_of_plan
from triarch.images import ImageError, parse
from triarch.offline import plan_document

ROOT = Path(__file__).resolve().parents[1]
DIGEST = "sha256:" + "9f2c4e1d0b8a7f6e" * 4
ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
IMAGES = yaml.safe_load((ROOT / "templates" / "compat" / "images.yaml").read_text(encoding="utf-8"))["images"]


# --- references ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "registry", "repository", "tag", "digest"), [
    ("vllm/vllm-openai:v0.33.0", None, "vllm/vllm-openai", "v0.33.0", None),
    (f"{ECR}/hub/vllm/vllm-openai:v0.33.0", ECR, "hub/vllm/vllm-openai", "v0.33.0", None),
    (f"{ECR}/mirror/vllm-openai@{DIGEST}", ECR, "mirror/vllm-openai", None, DIGEST),
    (f"harbor.example.com:8443/proxy/vllm/vllm-openai:v0.33.0@{DIGEST}", "harbor.example.com:8443",
     "proxy/vllm/vllm-openai", "v0.33.0", DIGEST),
    ("localhost/llm:1", "localhost", "llm", "1", None),
])
def test_a_reference_reads_as_a_registry_does(text: str, registry: str | None, repository: str, tag: str | None,
                                              digest: str | None) -> None:
    reference = parse(text)
    assert (reference.registry, reference.repository, reference.tag, reference.digest) == (registry, repository,
                                                                                           tag, digest)
    assert str(reference) == text


@pytest.mark.parametrize(("text", "said"), [
    ("vllm/vllm-openai@sha256:abc", "which is not sha256: and 64 lowercase hex characters"),
    (f"vllm/vllm-openai@md5:{'a' * 32}", "which is not sha256:"),
    ("vllm/VLLM-openai:v1", "which is not a repository path"),
    ("vllm/vllm-openai:", "which is not a tag"),
    ("vllm/vllm-openai:-bad", "which is not a tag"),
])
def test_a_malformed_reference_says_which_part(text: str, said: str) -> None:
    with pytest.raises(ImageError) as info:
        parse(text)
    assert said in info.value.reason


# --- what a stack file may say ---------------------------------------------------------------------------------------

def _with_images(**images: Any) -> Any:
    def mutate(config: dict[str, Any]) -> None:
        config["triarch:images"] = images
    return mutate


def _refused(config: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as info:
        from_pulumi_config(config)
    message = str(info.value)
    assert "\n" not in message and "; allowed: " in message
    return message


def test_a_digest_alone_needs_its_release_declared(mutated_config: MutatedConfig) -> None:
    message = _refused(mutated_config("prod", _with_images(vllm=f"{ECR}/mirror/vllm-openai@{DIGEST}")))
    assert message.startswith(f"triarch:images.vllm: '{ECR}/") and " is not vllm/vllm-openai (or a mirror" in message
    assert "{release: <one of v0.9.0, " in message and f"image: {ECR}/mirror/vllm-openai@{DIGEST}}}" in message
    message = _refused(mutated_config("prod", _with_images(vllm=f"vllm/vllm-openai@{DIGEST}")))
    assert "is a digest without a tag, so its release is unknown" in message


@pytest.mark.parametrize(("pin", "head", "allowed"), [
    ({"release": "v0.99.0", "image": f"{ECR}/m/vllm-openai@{DIGEST}"},
     "triarch:images.vllm.release: 'v0.99.0' is not a release templates/compat/images.yaml has for vllm/vllm-openai",
     "v0.9.0, v0.11.0, v0.11.1, v0.12.0, v0.20.0, v0.29.0, v0.33.0"),
    ({"release": "v0.29.0", "image": "vllm/vllm-openai:v0.33.0"},
     "triarch:images.vllm.release: 'v0.29.0' differs from the tag of vllm/vllm-openai:v0.33.0",
     "v0.33.0 (the image's tag), or an image of that release"),
    ({"image": "harbor.example.com/hub/vllm/vllm-openai:latest"},
     "triarch:images.vllm: 'harbor.example.com/hub/vllm/vllm-openai:latest' is not pinned",
     "a versioned tag (v0.33.0), a digest (@sha256:<64 hex>), or both"),
    ({"image": "vllm/vllm-openai@sha256:12"},
     "triarch:images.vllm: 'vllm/vllm-openai@sha256:12' has digest 'sha256:12', which is not sha256: and 64",
     "name:tag, name@sha256:<64 hex>, or name:tag@sha256:<64 hex>"),
])
def test_a_bad_pin_is_one_line_naming_its_key(mutated_config: MutatedConfig, pin: dict[str, str], head: str,
                                              allowed: str) -> None:
    message = _refused(mutated_config("prod", _with_images(vllm=pin)))
    assert message.startswith(head) and message.endswith(f"; allowed: {allowed}"), message


@pytest.mark.parametrize(("key", "pin", "release"), [
    # digest only, from the upstream repository: the release declared
    ("vllm", {"release": "v0.33.0", "image": f"vllm/vllm-openai@{DIGEST}"}, "vllm/vllm-openai:v0.33.0"),
    # tag and digest: the release read from the tag
    ("vllm", f"vllm/vllm-openai:v0.29.0@{DIGEST}", "vllm/vllm-openai:v0.29.0"),
    # a pull-through cache by tag: the release read from the path it keeps
    ("vllm", f"{ECR}/hub/vllm/vllm-openai:v0.29.0", "vllm/vllm-openai:v0.29.0"),
    # Ray LLM from a mirror of another name, by digest: the release declared (its tag, or the whole reference)
    ("rayLlm", {"release": "2.58.0-py312-cu130", "image": f"{ECR}/ml/ray-llm@{DIGEST}"},
     "rayproject/ray-llm:2.58.0-py312-cu130"),
    ("rayLlm", {"release": "rayproject/ray-llm:2.58.0-py312-cu130", "image": f"{ECR}/ml/ray-llm:2.58.0@{DIGEST}"},
     "rayproject/ray-llm:2.58.0-py312-cu130"),
], ids=["digest-only", "tag-and-digest", "mirror-and-tag", "ray-mirror-digest", "ray-full-release"])
def test_each_form_pulls_as_given_and_runs_its_release(mutated_config: MutatedConfig, key: str, pin: Any,
                                                       release: str) -> None:
    from triarch.catalog import catalog
    from triarch.matrix import deployed_images, images_by_engine
    stack = from_pulumi_config(mutated_config("prod", _with_images(**{key: pin})))
    engine = "vllm" if key == "vllm" else "ray-serve"
    assert deployed_images(stack)[engine] == (pin["image"] if isinstance(pin, dict) else pin)
    assert images_by_engine(stack, catalog())[engine] == release


def test_a_chart_image_by_mirror_and_digest_with_its_release(mutated_config: MutatedConfig) -> None:
    """{release, image} for a chart's image: the release the pinned chart runs, the image into its values."""
    from triarch.catalog import charts
    from triarch.planners.registry import image_values
    pin = {"release": "v1.7.0", "image": f"{ECR}/quay/kuberay/operator@{DIGEST}"}
    stack = from_pulumi_config(mutated_config("prod", _with_images(kuberayOperator=pin)))
    assert image_values(charts()["kuberay-operator"], stack) == {
        "image": {"repository": f"{ECR}/quay/kuberay/operator", "tag": f"v1.7.0@{DIGEST}"}}
    message = _refused(mutated_config("prod", _with_images(kuberayOperator={**pin, "release": "v1.6.0"})))
    assert message.startswith("triarch:images.kuberayOperator.release: 'v1.6.0' is not the release the pinned "
                              "chart runs (quay.io/kuberay/operator:v1.7.0)"), message


# --- what plans from it ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mirrored(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """prod pulling vLLM by digest from its own ECR repository (release declared) and Ray LLM through an ECR
    pull-through cache of Docker Hub (the upstream path kept under the cache's prefix, so the release is read)."""
    config = stack_document("prod")
    config["triarch:images"] = {
        "vllm": {"release": "v0.33.0", "image": f"{ECR}/mirror/vllm-openai@{DIGEST}"},
        "rayLlm": f"{ECR}/hub/rayproject/ray-llm:2.60.0-py312-cu130",
    }
    return plan_config("prod", config, tmp_path_factory.mktemp("mirrored"))


def test_the_pods_pull_the_mirror_and_the_workload_says_which_release(mirrored: Any) -> None:
    [embed] = [d for d in mirrored.objects("Deployment") if d["metadata"]["name"] == "embed"]
    [container] = embed["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"{ECR}/mirror/vllm-openai@{DIGEST}"
    assert embed["metadata"]["annotations"]["triarch.dev/image-release"] == "vllm/vllm-openai:v0.33.0"
    assert "triarch.dev/image-release" not in (embed["spec"]["template"]["metadata"].get("annotations") or {})
    skips = [v for k, v in embed["metadata"]["annotations"].items() if k.startswith("checkov.io/skip")]
    assert skips and not [v for v in skips if v.startswith("CKV_K8S_43=")]  # a digest needs no tag exception
    [service] = mirrored.objects("RayService")
    assert service["metadata"]["annotations"]["triarch.dev/image-release"] == "rayproject/ray-llm:2.60.0-py312-cu130"
    cluster = service["spec"]["rayClusterConfig"]
    images = {c["image"] for c in cluster["headGroupSpec"]["template"]["spec"]["containers"]}
    images |= {c["image"] for g in cluster["workerGroupSpecs"] for c in g["template"]["spec"]["containers"]}
    assert images == {f"{ECR}/hub/rayproject/ray-llm:2.60.0-py312-cu130"}
    assert cluster["rayVersion"] == IMAGES["rayproject/ray-llm"]["2.60.0-py312-cu130"]["ray"]


def test_a_mirrored_stack_plans_what_the_upstream_one_does(mirrored: Any, shipped: dict[str, Any]) -> None:
    """Same release, so the same engine args, flags and placement: only the pulled references (and the annotation
    saying which release they are) differ, and no guardrail objects."""
    def stripped(plan: Any) -> list[Any]:
        found = []
        for obj in [*plan.objects("Deployment"), *plan.objects("RayService")]:
            text = yaml.safe_dump(obj, sort_keys=True)
            text = text.replace(f"{ECR}/mirror/vllm-openai@{DIGEST}", "vllm/vllm-openai:v0.33.0")
            text = text.replace(f"{ECR}/hub/rayproject/ray-llm", "rayproject/ray-llm")
            loaded = yaml.safe_load(text)
            loaded["metadata"].get("annotations", {}).pop("triarch.dev/image-release", None)
            if loaded["kind"] == "Deployment":  # the tag's scanner exception, which the digest does not need
                assert loaded["metadata"]["annotations"].pop("checkov.io/skip1", "").startswith("CKV_K8S_43=") \
                    is (plan is shipped["prod"])
            if not loaded["metadata"].get("annotations"):
                loaded["metadata"].pop("annotations", None)
            found.append(loaded)
        return found
    assert stripped(mirrored) == stripped(shipped["prod"])

    def findings(plan: Any) -> list[tuple[str, str]]:
        document = plan_document(plan.run)
        return sorted((f.rule.name, f.resource.name) for f in evaluate(resources_of_plan(document)))
    assert findings(mirrored) == findings(shipped["prod"])


def test_moving_to_a_mirror_of_the_same_release_is_no_release_change(mirrored: Any, shipped: dict[str, Any]) -> None:
    """The diff reads each workload's release from its annotation: the same vLLM and Ray LLM releases, so no vLLM
    release note and no engine arg change; the Deployments change in place (image and annotation only)."""
    result = diff_plans(plan_document(shipped["prod"].run), plan_document(mirrored.run))
    assert result.vllm == [] and result.engine == []
    [embed] = [d for d in result.differences if d.name == "deployment-llm-embed"]
    assert embed.kind == "changed"
    assert embed.inputs == ["metadata.annotations.checkov.io/skip1", "metadata.annotations.triarch.dev/image-release",
                            "spec.template.spec.containers[0].image"]


# --- a registry for everything ---------------------------------------------------------------------------------------

MIRROR = f"{ECR}/mirror"
CHARTS_MIRROR = f"oci://{ECR}/charts"


@pytest.fixture(scope="module")
def from_own_registry(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Any]]:
    """prod with one prefix for every image and every chart (an Artifactory or ECR mirror that keeps upstream
    paths), the KubeRay operator pinned by digest and Karpenter's controller by a digest of its release."""
    from triarch import cli
    config = stack_document("prod")
    config["triarch:registry"] = {"images": MIRROR, "charts": CHARTS_MIRROR}
    config["triarch:images"] = {"kuberayOperator": f"quay.io/kuberay/operator:v1.7.0@{DIGEST}",
                                "karpenterController": f"public.ecr.aws/karpenter/controller@{DIGEST}"}
    out = tmp_path_factory.mktemp("own-registry")
    stack_file = out / "Pulumi.prod.yaml"
    stack_file.write_text(yaml.safe_dump({"config": config}), encoding="utf-8")
    assert cli.main(["plan", "--stack-file", str(stack_file), "--out", str(out / "plan")]) == 0
    document = json.loads((out / "plan" / "plan.json").read_text(encoding="utf-8"))
    listed = json.loads((out / "plan" / "mirror.json").read_text(encoding="utf-8"))
    return document, listed


def _releases(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["inputs"]["name"]: r["inputs"] for r in document["resources"]
            if r["type"] == "kubernetes:helm.sh/v3:Release"}


def test_every_chart_comes_from_the_oci_mirror_at_its_pinned_version(from_own_registry: Any) -> None:
    document, _ = from_own_registry
    releases = _releases(document)
    versions = {name: c["version"] for name, c in yaml.safe_load(
        (ROOT / "templates" / "compat" / "charts.yaml").read_text(encoding="utf-8"))["charts"].items()}
    assert releases
    for release in releases.values():
        chart = release["chart"]
        assert chart.startswith(f"{CHARTS_MIRROR}/"), chart
        assert release["version"] == versions[chart.rsplit("/", 1)[1]]
        assert not release.get("repositoryOpts")


def test_every_image_is_pulled_from_the_mirror(from_own_registry: Any) -> None:
    document, _ = from_own_registry
    values = {name: r["values"] for name, r in _releases(document).items()}
    plugin = values["nvidia-device-plugin"]["image"]
    assert (plugin["repository"], plugin["tag"]) == (f"{MIRROR}/nvidia/k8s-device-plugin", "v0.20.0")
    operator = values["kuberay-operator"]["image"]
    assert (operator["repository"], operator["tag"]) == (f"{MIRROR}/kuberay/operator", f"v1.7.0@{DIGEST}")
    controller = values["karpenter"]["controller"]["image"]
    assert controller == {"repository": f"{MIRROR}/karpenter/controller", "tag": "1.14.1", "digest": DIGEST}
    assert values["dcgm-exporter"]["image"]["repository"] == f"{MIRROR}/nvidia/k8s/dcgm-exporter"
    assert values["kube-prometheus-stack"]["global"]["imageRegistry"] == MIRROR
    pods = [c["image"] for r in document["resources"] if r["type"] in (
        "kubernetes:apps/v1:Deployment", "kubernetes:ray.io/v1:RayService")
        for c in _containers(r["inputs"])]
    assert pods and all(p.startswith(f"{MIRROR}/") for p in pods), pods
    assert f"{MIRROR}/vllm/vllm-openai:v0.33.0" in pods


def _containers(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        return [*value.get("containers", []), *(c for v in value.values() for c in _containers(v))]
    if isinstance(value, list):
        return [c for v in value for c in _containers(v)]
    return []


def test_the_mirror_list_names_what_to_copy(from_own_registry: Any) -> None:
    document, listed = from_own_registry
    assert {c["name"] for c in listed["charts"]} == {r["chart"].rsplit("/", 1)[1]
                                                      for r in _releases(document).values()}
    karpenter = next(c for c in listed["charts"] if c["name"] == "karpenter")
    assert karpenter == {"name": "karpenter", "version": "1.14.1", "upstream": "oci://public.ecr.aws/karpenter/karpenter",
                         "pulledFrom": f"{CHARTS_MIRROR}/karpenter"}
    images = {i["key"]: i for i in listed["images"]}
    assert images["vllm"] == {"key": "vllm", "chart": None, "upstream": "vllm/vllm-openai:v0.33.0", "tag": "v0.33.0",
                              "digest": None, "pulled": f"{MIRROR}/vllm/vllm-openai:v0.33.0"}
    assert images["kuberayOperator"]["digest"] == DIGEST
    assert images["kuberayOperator"]["upstream"] == "quay.io/kuberay/operator:v1.7.0"
    assert images["prometheus"]["pulled"] == f"{MIRROR}/prometheus/prometheus:v3.14.0-distroless"
    assert any("kube-prometheus-stack 88.5.3" in note for note in listed["notListed"])


@pytest.mark.parametrize(("edit", "head"), [
    (lambda c: c.update({"triarch:images": {"kuberay": "quay.io/kuberay/operator:v1.7.0"}}),
     "triarch:images.kuberay: 'kuberay' is not an image Triarch deploys"),
    (lambda c: c.update({"triarch:images": {"kuberayOperator": "quay.io/kuberay/operator:v1.6.1"}}),
     "triarch:images.kuberayOperator: 'quay.io/kuberay/operator:v1.6.1' has tag v1.6.1, but the pinned chart runs"),
    (lambda c: c.update({"triarch:registry": {"charts": f"https://{ECR}/charts"}}),
     f"triarch:registry.charts: 'https://{ECR}/charts' is not an OCI reference"),
    (lambda c: c.update({"triarch:registry": {"images": {"docker.io": f"{ECR}/hub"}}}),
     "triarch:registry.images: 'docker.io' maps registries one by one, but kube-prometheus-stack"),
    (lambda c: c.update({"triarch:registry": {"images": "https://mirror"}}),
     "triarch:registry.images: 'https://mirror' is not a registry prefix"),
])
def test_a_bad_registry_setting_is_one_line(tmp_path: Path, edit: Any, head: str) -> None:
    from triarch.offline import read_stack_config
    config = stack_document("prod")
    edit(config)
    path = tmp_path / "Pulumi.prod.yaml"
    path.write_text(yaml.safe_dump({"config": config}), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        from_pulumi_config(read_stack_config(path)[0])
    assert str(info.value).startswith(head), str(info.value)


# --- pulls that work on EKS ------------------------------------------------------------------------------------------

def _plan_file(config: dict[str, Any], out: Path) -> dict[str, Any]:
    from triarch import cli
    stack_file = out / "Pulumi.prod.yaml"
    stack_file.write_text(yaml.safe_dump({"config": config}), encoding="utf-8")
    assert cli.main(["plan", "--stack-file", str(stack_file), "--out", str(out / "plan")]) == 0
    document: dict[str, Any] = json.loads((out / "plan" / "plan.json").read_text(encoding="utf-8"))
    return document


def test_an_ecr_mirror_lets_the_node_roles_import_through_the_cache_and_nothing_more(
        from_own_registry: Any, shipped: dict[str, Any]) -> None:
    """ECR pull-through cache: a node's first pull imports the upstream image and creates its repository (AWS ECR
    User Guide, pull-through-cache-iam): both node roles (managed groups, Karpenter) may, on the mirror's
    repositories only. Plain pulls stay with AmazonEC2ContainerRegistryPullOnly, which EKS's own images need."""
    document, _ = from_own_registry
    policies = [r for r in document["resources"] if r["type"] == "aws:iam/rolePolicy:RolePolicy"]
    pulls = [r for r in policies if "ecr:" in str(r["inputs"]["policy"])]
    assert sorted(r["name"] for r in pulls) == ["karpenter-nodes-pull-through", "llm-prod-nodes-pull-through"]
    for resource in pulls:
        [statement] = json.loads(resource["inputs"]["policy"])["Statement"]
        assert sorted(statement["Action"]) == ["ecr:BatchImportUpstreamImage", "ecr:CreateRepository"]
        assert statement["Resource"] == ["arn:aws:ecr:us-east-1:123456789012:repository/mirror/*"]
    shipped_document = plan_document(shipped["prod"].run)
    assert not [r for r in shipped_document["resources"] if r["type"] == "aws:iam/rolePolicy:RolePolicy"
                and "ecr:" in str(r["inputs"]["policy"])]


def _warm(config: dict[str, Any], model: str) -> None:
    config["triarch:models"] = [{**m, "warmReplicas": 1} if m["name"] == model else m
                                for m in config["triarch:models"]]


def _credentials(config: dict[str, Any]) -> dict[str, Any]:
    config["triarch:registry"] = {"images": "harbor.example.com/proxy", "username": "robot$triarch"}
    config["triarch:registryPassword"] = {"secure": "v1:robot-token"}
    return config


@pytest.fixture(scope="module")
def with_credentials(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """prod pulling everything from a Harbor proxy that takes a robot account's credentials, one model kept warm
    (a CapacityBuffer's PodTemplate: Triarch's Karpenter on a created cluster)."""
    config = _credentials(stack_document("prod"))
    _warm(config, "embed")
    out = tmp_path_factory.mktemp("credentials")
    return _plan_file(config, out), out / "plan"


def _pod_specs(obj: Any, where: str) -> list[tuple[str, dict[str, Any]]]:
    """Every pod spec in an object, wherever its kind keeps it (a Deployment's template, a RayService's groups, a
    LeaderWorkerSet's leader and worker, a PodTemplate's template)."""
    if isinstance(obj, dict):
        found = [(where, obj)] if isinstance(obj.get("containers"), list) else []
        return found + [s for k, v in obj.items() for s in _pod_specs(v, f"{where}.{k}")]
    if isinstance(obj, list):
        return [s for i, v in enumerate(obj) for s in _pod_specs(v, f"{where}[{i}]")]
    return []


def _pulls_with_the_secret(document: dict[str, Any], out: Path) -> set[str]:
    """Asserts every pod spec of every manifest names the registry's Secret, which exists in its namespace; the
    kinds seen."""
    assert "robot-token" not in json.dumps(document)
    secrets = [r for r in document["resources"] if r["type"] == "kubernetes:core/v1:Secret"
               and r["inputs"]["metadata"]["name"] == "triarch-registry"]
    for secret in secrets:
        assert secret["inputs"]["type"] == "kubernetes.io/dockerconfigjson"
        assert secret["inputs"]["stringData"] == {".dockerconfigjson": "[secret]"}
    namespaces = {s["inputs"]["metadata"]["namespace"] for s in secrets}
    kinds = set()
    for path in sorted((out / "manifests").glob("*.yaml")):
        obj = yaml.safe_load(path.read_text(encoding="utf-8"))
        for where, spec in _pod_specs(obj, f"{obj['kind']} {obj['metadata']['name']}"):
            kinds.add(obj["kind"])
            assert spec.get("imagePullSecrets") == [{"name": "triarch-registry"}], where
            assert obj["metadata"]["namespace"] in namespaces, where
    return kinds


def test_every_pod_triarch_defines_pulls_with_the_registry_secret(with_credentials: Any) -> None:
    document, out = with_credentials
    assert _pulls_with_the_secret(document, out) == {"Deployment", "RayService", "PodTemplate"}


@pytest.mark.parametrize(("stack", "edit", "kinds"), [
    # An adopted cluster whose own Karpenter scales the pool: warm capacity is placeholder pods that pull the image.
    ("lab", lambda c: (c["triarch:cluster"].update(nodeProvisioner="karpenter"), _warm(c, "chat")),
     {"Deployment", "RayService"}),
    # A replica across nodes: a LeaderWorkerSet's leader and worker templates.
    ("large", lambda c: None, {"LeaderWorkerSet", "RayService"}),
], ids=["warm-placeholders", "leader-worker-set"])
def test_every_pod_of_every_shape_pulls_with_the_registry_secret(tmp_path: Path, stack: str, edit: Any,
                                                                 kinds: set[str]) -> None:
    config = _credentials(stack_document(stack))
    edit(config)
    document = _plan_file(config, tmp_path)
    assert _pulls_with_the_secret(document, tmp_path / "plan") == kinds


def test_warm_placeholders_say_the_release_of_a_pinned_image(tmp_path: Path) -> None:
    """A placeholder runs the model's image: pulled from a mirror by digest, it says which release it is, as the
    model's own workload does (the diff, the guardrails and triarch verify read the release from it)."""
    config = stack_document("lab")
    config["triarch:cluster"]["nodeProvisioner"] = "karpenter"
    _warm(config, "chat")
    config["triarch:images"] = {"vllm": {"release": "v0.33.0", "image": f"{ECR}/mirror/vllm-openai@{DIGEST}"}}
    _plan_file(config, tmp_path)
    manifests = tmp_path / "plan" / "manifests"
    for name in ("deployment-llm-chat-warm.yaml", "deployment-llm-chat.yaml"):
        obj = yaml.safe_load((manifests / name).read_text(encoding="utf-8"))
        assert obj["metadata"]["annotations"]["triarch.dev/image-release"] == "vllm/vllm-openai:v0.33.0", name
        [container] = obj["spec"]["template"]["spec"]["containers"]
        assert container["image"] == f"{ECR}/mirror/vllm-openai@{DIGEST}", name


def test_every_chart_with_pods_pulls_with_the_registry_secret(with_credentials: Any) -> None:
    """Each release that runs pods names the Secret, which exists in its namespace; the CRD-only releases run
    no pod and get neither."""
    document, _ = with_credentials
    secrets = {r["inputs"]["metadata"]["namespace"] for r in document["resources"]
               if r["type"] == "kubernetes:core/v1:Secret" and r["inputs"]["metadata"]["name"] == "triarch-registry"}
    keys = {"kube-prometheus-stack": ("global", "imagePullSecrets")}
    crd_only = {"karpenter-crd", "prometheus-operator-crds"}
    releases = _releases(document)
    assert set(releases) >= {"nvidia-device-plugin", "kuberay-operator", "karpenter", "dcgm-exporter",
                             "kube-prometheus-stack"}
    for name, release in releases.items():
        chart = release["chart"].rsplit("/", 1)[-1]
        if chart in crd_only:
            assert "imagePullSecrets" not in json.dumps(release["values"]), name
            continue
        value: Any = release["values"]
        for key in keys.get(chart, ("imagePullSecrets",)):
            value = value[key]
        assert value == [{"name": "triarch-registry"}], name
        assert release["namespace"] in secrets, name


@pytest.mark.parametrize(("registry", "secret", "head"), [
    ({"images": "harbor.example.com/proxy"}, True,
     "triarch:registry.username: is not set, but triarch:registryPassword is"),
    ({"images": {"docker.io": "harbor.example.com/hub"}, "username": "robot"}, True,
     "triarch:registry.server: is not set, but triarch:registryPassword is"),
    ({"images": "harbor.example.com/proxy", "username": "robot"}, False,
     "triarch:registryPassword: is not set, but registry.username is ('robot')"),
    # An ECR password is a 12-hour token: a pull Secret of one breaks the next day; the node roles pull there.
    ({"images": f"{ECR}/hub", "username": "AWS"}, True,
     f"triarch:registry.username: 'AWS' gives credentials for {ECR}, an ECR registry, whose passwords expire"),
    ({"images": {"docker.io": f"{ECR}/hub"}, "server": ECR, "username": "AWS"}, True,
     f"triarch:registry.username: 'AWS' gives credentials for {ECR}, an ECR registry"),
])
def test_credentials_come_whole(tmp_path: Path, registry: dict[str, Any], secret: bool, head: str) -> None:
    from triarch import cli
    config = stack_document("dev")
    config["triarch:observability"] = {"prometheus": "existing"}
    config["triarch:registry"] = registry
    if secret:
        config["triarch:registryPassword"] = {"secure": "v1:x"}
    stack_file = tmp_path / "Pulumi.dev.yaml"
    stack_file.write_text(yaml.safe_dump({"config": config}), encoding="utf-8")
    import contextlib
    import io
    stderr = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        code = cli.main(["plan", "--stack-file", str(stack_file), "--out", str(tmp_path / "out")])
    assert code == 2
    [line] = [x for x in stderr.getvalue().splitlines() if x.strip()][-1:]
    assert head in line, stderr.getvalue()


# --- CRDs that upgrade ------------------------------------------------------------------------------------------------

KUBERAY_COMMIT = "59d663aeec13760646da3db9c1cf8cfe883e30b7"
"""ray-project/kuberay's v1.7.0 tag (the chart version Triarch pins)."""
KUBERAY_CRDS = ("ray.io_rayclusters.yaml", "ray.io_raycronjobs.yaml", "ray.io_rayjobs.yaml", "ray.io_rayservices.yaml")


def test_kuberays_crds_are_their_own_resources_applied_before_the_operator(shipped: dict[str, Any]) -> None:
    """Helm installs a chart's crds/ once and never upgrades them: the CRDs come from the release's files at the
    tag's commit, and the operator's release skips its crds/ and waits for them."""
    document = plan_document(shipped["prod"].run)
    files = {r["urn"]: r for r in document["resources"] if r["type"] == "kubernetes:yaml/v2:ConfigFile"}
    base = f"https://raw.githubusercontent.com/ray-project/kuberay/{KUBERAY_COMMIT}/ray-operator/config/crd/bases"
    assert sorted(r["inputs"]["file"] for r in files.values()) == [f"{base}/{f}" for f in KUBERAY_CRDS]
    [release] = [r for r in document["resources"] if r["type"] == "kubernetes:helm.sh/v3:Release"
                 and r["inputs"]["name"] == "kuberay-operator"]
    assert release["inputs"]["skipCrds"] is True
    assert set(files) <= set(release["dependencies"])


def test_the_crds_come_from_the_mirror_and_are_listed_with_their_digests(from_own_registry: Any,
                                                                         tmp_path: Path) -> None:
    _, listed = from_own_registry
    assert sorted(c["file"] for c in listed["crds"]) == list(KUBERAY_CRDS)
    config = stack_document("prod")
    config["triarch:registry"] = {"crds": "https://artifacts.example.com/crds"}
    document = _plan_file(config, tmp_path)
    urls = sorted(r["inputs"]["file"] for r in document["resources"] if r["type"] == "kubernetes:yaml/v2:ConfigFile")
    assert urls == [f"https://artifacts.example.com/crds/kuberay-operator/1.7.0/{f}" for f in KUBERAY_CRDS]


def test_a_crd_file_is_applied_only_if_it_is_the_releases(tmp_path: Path) -> None:
    """Before `pulumi up` applies them, each file is checked against the release's sha256: the pinned copies in
    the reference data (the v1.7.0 tag's files) pass; one changed byte is refused in one line with both digests."""
    from conftest import reference_dir
    from triarch.planners.registry import crd_sources, verify_crds
    reference = reference_dir("kuberay-v1.7.0")
    mirror = tmp_path / "crds" / "kuberay-operator" / "1.7.0"
    mirror.mkdir(parents=True)
    for name in KUBERAY_CRDS:
        (mirror / name).write_bytes((reference / name).read_bytes())
    config = stack_document("prod")
    config["triarch:registry"] = {"crds": str(tmp_path / "crds")}
    stack = from_pulumi_config({f"triarch:{k.split(':', 1)[1]}" if k.startswith("triarch:") else k:
                                json.dumps(v) if isinstance(v, dict | list) else v for k, v in config.items()})
    sources = crd_sources("kuberay-operator", stack)
    verify_crds(sources)
    (mirror / "ray.io_rayjobs.yaml").write_bytes((reference / "ray.io_rayjobs.yaml").read_bytes() + b"\n")
    with pytest.raises(ConfigError) as info:
        verify_crds(sources)
    message = str(info.value)
    assert message.startswith("triarch:registry.crds: ") and "ray.io_rayjobs.yaml" in message
    assert "not the release's 01a5cf3b17c1769fda44af7e82debcd98722f0c27b9ab84d084681c6649121f5" in message


def test_the_mirror_list_names_the_efa_image_the_nodes_pull(shipped: dict[str, Any]) -> None:
    """The EFA device plugin's image is EKS's copy in the stack's region (the chart's default is us-west-2's):
    mirror.json lists that one, the one the release's values name."""
    from triarch.planners.registry import mirror_list
    large = shipped["large"]
    stack = from_pulumi_config({k: v if isinstance(v, str) else json.dumps(v) for k, v in large.config.items()})
    [row] = [i for i in mirror_list(plan_document(large.run), stack)["images"] if i["key"] == "efaDevicePlugin"]
    [release] = [r for r in large.of_type("kubernetes:helm.sh/v3:Release") if r.name == "aws-efa-k8s-device-plugin"]
    repository = release.inputs["values"]["image"]["repository"]
    assert repository.startswith("602401143452.dkr.ecr.us-east-1.amazonaws.com/")
    assert row["pulled"] == row["upstream"] == f"{repository}:v0.5.20"
