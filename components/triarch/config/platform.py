"""The stack's platform settings: where serving runs and what reaches it, observability, images and the
registry they come from, and the cluster components Triarch installs or finds."""

from __future__ import annotations

from collections.abc import Mapping
from ipaddress import IPv4Network
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from triarch.config.base import DnsLabel, _Model


class ServingConfig(_Model):
    """Where the serving workloads live, who may call them, what they may reach, and how their model cache is
    stored."""

    namespace: DnsLabel = Field("llm", examples=["inference"])
    """The namespace of the serving workloads, their Services and model caches."""
    client_namespaces: list[DnsLabel] = []
    """Namespaces whose pods may call the OpenAI port (an ingress or gateway namespace); the serving namespace
    itself always may. Nothing else in the cluster reaches the models."""
    hub_cidrs: list[IPv4Network] = Field([IPv4Network("0.0.0.0/0")], examples=[["203.0.113.0/24"]])
    """Where the pods may download weights from over HTTPS (the Hugging Face hub, or a proxy or mirror); on a
    created cluster the VPC's own range is excluded, so the API server and the nodes stay out of reach."""
    storage_class: str | None = Field(None, examples=["efs-models"])
    """StorageClass of the model caches. Default: on a created cluster, the EFS class Triarch installs (shared by
    all replicas); on an adopted cluster, the cluster's default class."""
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce"] | None = None
    """Default: ReadWriteMany on a created cluster (EFS), ReadWriteOnce on an adopted one."""
    compile_cache: bool | None = Field(None, examples=[False])
    """Keep vLLM's torch.compile cache (VLLM_CACHE_ROOT) on the model cache volume, one directory per GPU type
    (vLLM keys its entries by model and engine config), so the next replica and the next node start warm. Default:
    on where the cache is ReadWriteMany; a ReadWriteOnce volume cannot be shared by replicas on several nodes."""
    weights_role_arn: Annotated[str, Field(pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+$")] | None = Field(
        None, examples=["arn:aws:iam::123456789012:role/llm-weights-reader"])
    """Adopted EKS cluster, models with weightsUri: the IAM role the serving pods assume (IRSA: their service account
    is annotated with it) to read the weights. A created cluster gets a role per model from Triarch."""


class ObservabilityConfig(_Model):
    """What the stack gives a Prometheus Operator (kube-prometheus-stack or alike) already in the cluster."""

    prometheus: Literal["none", "existing", "install"] | None = None
    """install: kube-prometheus-stack (pinned; the Prometheus Operator's CRDs as their own release) in `namespace`;
    existing: a Prometheus Operator the cluster runs. Either way: PodMonitors for the vLLM and Ray pods,
    ServiceMonitors for the KubeRay operator, Karpenter and the DCGM exporter, the layer alerts (a PrometheusRule),
    a Grafana dashboard, and the Prometheus namespace may scrape the serving namespace. Default: install on a created
    cluster, none on an adopted one."""
    namespace: DnsLabel = Field("monitoring", examples=["observability"])
    """Where that Prometheus runs (created by Triarch with install)."""
    monitor_labels: dict[str, str] = Field({"release": "kube-prometheus-stack"}, examples=[{"release": "prometheus"}])
    """Labels the Prometheus selects monitors and rules by (kube-prometheus-stack: release=<its release name>)."""
    prometheus_url: str = Field("http://kube-prometheus-stack-prometheus.monitoring.svc:9090", examples=["http://prometheus-operated.observability.svc:9090"])
    """Where KEDA queries (kube-prometheus-stack's Prometheus Service for a release of that name)."""
    dcgm_exporter: bool = True
    """With a Prometheus: install NVIDIA's DCGM exporter on the GPU nodes (GPU use, memory, XID and memory errors
    per pod); false where the cluster already runs one (the GPU operator's, say)."""
    keda: Literal["none", "existing", "install"] = Field("none", examples=["install"])
    """KEDA for `engine: vllm` models with `autoscaling` (a ScaledObject each): one the cluster runs, or the pinned
    chart Triarch installs."""
    storage_gib: int = Field(50, ge=10, le=16384, examples=[200])
    """With prometheus: install, the size of Prometheus' volume (a claim that survives restarts; on a created cluster
    encrypted EBS gp3, on an adopted one the cluster's default class). Data beyond 85% of it is dropped oldest
    first."""
    retention: str = Field("15d", pattern=r"^[1-9][0-9]*(h|d|w|y)$", examples=["30d"])
    """With prometheus: install, how long Prometheus keeps samples (its --storage.tsdb.retention.time)."""


class ImagePin(_Model):
    """An image as the nodes pull it and the upstream release it is. `image`: any full reference (a mirror's
    registry and path, a tag, a digest, or both); `release`: the upstream tag (or `repository:tag`) of
    templates/compat/images.yaml, which decides the CUDA, vLLM and Ray inside. Without `release`, `image` must name
    the upstream repository (maybe under a mirror's prefix) and a tag Triarch knows. A plain string is `image`."""

    image: str
    """The reference the nodes pull: registry/repository with a tag, a digest (@sha256:...), or both."""
    release: str | None = None
    """The upstream release it is (a tag of templates/compat/images.yaml), where `image` does not say (a mirror, a
    digest)."""

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        return {"image": value} if isinstance(value, str) else value


class ImagesConfig(_Model):
    """Serving images, pinned; each resolves to a release of templates/compat/images.yaml so its CUDA is known.
    Beside them, the images of the charts Triarch installs, by their key in templates/compat/charts.yaml
    (devicePlugin, kuberayOperator, karpenterController, keda, dcgmExporter, prometheus, ...): a mirror or a digest
    of the release the pinned chart runs."""

    vllm: ImagePin = ImagePin(image="vllm/vllm-openai:v0.33.0")
    """The image of engine: vllm models; its vLLM release decides the engine args and flags Triarch emits."""
    ray_llm: ImagePin = ImagePin(image="rayproject/ray-llm:2.60.0-py312-cu130")
    """The image of engine: ray-serve worker groups and Ray heads (Ray Serve LLM with its vLLM)."""
    charts: dict[str, ImagePin] = {}
    """The images of the installed charts, each by its key beside vllm and rayLlm (not under a `charts` key)."""

    @model_validator(mode="before")
    @classmethod
    def _chart_images(cls, value: Any) -> Any:
        """Chart images sit beside vllm and rayLlm in the stack file."""
        if not isinstance(value, Mapping):
            return value
        serving = {"vllm", "rayLlm"}
        found = {k: v for k, v in value.items() if k in serving}
        others = {k: v for k, v in value.items() if k not in serving}
        return {**found, "charts": others} if others else found


class RegistryConfig(_Model):
    """Where the nodes pull images and Helm pulls charts: a team's own registry instead of the public ones."""

    images: str | dict[str, str] | None = Field(None, examples=["123456789012.dkr.ecr.us-east-1.amazonaws.com/mirror"])
    """One prefix for every image from a public registry (`<prefix>/<upstream path>`, e.g.
    123456789012.dkr.ecr.us-east-1.amazonaws.com/mirror), or one prefix per upstream registry host (docker.io,
    quay.io, nvcr.io, ghcr.io, public.ecr.aws, registry.k8s.io), as an ECR pull-through cache rule or a proxy project
    per upstream gives. An image pinned with its own registry under triarch:images stays as given."""
    charts: str | dict[str, str] | None = Field(None, examples=["oci://123456789012.dkr.ecr.us-east-1.amazonaws.com/charts"])
    """One OCI prefix for every chart (`<prefix>/<chart name>`, e.g.
    oci://123456789012.dkr.ecr.us-east-1.amazonaws.com/charts), or the OCI reference of each chart by name."""
    crds: str | None = Field(None, pattern=r"^(https://|file://|/)\S+$", examples=["https://artifacts.example.com/crds"])
    """Where the CRD files Triarch manages apart from their charts (KubeRay's) come from:
    `<crds>/<chart>/<version>/<file>` instead of the release's published URL; each is checked against its sha256
    before `pulumi up` registers it (mirror.json lists them)."""
    username: str | None = Field(None, examples=["robot$triarch"])
    """For a registry that takes credentials (not ECR: the nodes' role pulls there): the user; its password is the
    Pulumi secret triarch:registryPassword. Every pod Triarch defines, and every chart it installs, pulls with an
    image pull Secret made from them."""
    server: str | None = Field(None, examples=["harbor.example.com"])
    """The registry host the credentials are for; default: the host of `images` when it is one prefix."""

    @property
    def credentials_host(self) -> str | None:
        if self.server:
            return self.server
        return self.images.split("/", 1)[0] if isinstance(self.images, str) else None


ComponentMode = Literal["install", "existing"]
"""install: Triarch installs the component's pinned chart (its CRDs with it); existing: the cluster already runs
it (installing a second copy would break both), so Triarch installs nothing and `pulumi preview` checks that the
CRDs Triarch's objects need are in the cluster."""


class DevicePluginConfig(_Model):
    """The NVIDIA device plugin, which advertises each GPU node's nvidia.com/gpu to the scheduler."""

    mode: ComponentMode = Field("install", examples=["existing"])
    """install: the pinned chart; existing: the cluster runs one already (the NVIDIA GPU operator's, say)."""
    gpu_feature_discovery: bool = Field(True, examples=[False])
    """Also run GPU feature discovery, which labels each node with its GPU model, memory, driver and CUDA."""


class KubeRayConfig(_Model):
    """The KubeRay operator, which turns the RayService of the engine: ray-serve models into Ray clusters."""

    mode: ComponentMode = Field("install", examples=["existing"])
    """install: the pinned chart (with its CRDs); existing: an operator the cluster runs."""


class LeaderWorkerSetConfig(_Model):
    """The LeaderWorkerSet controller, which runs a vllm model's replica across nodes (only needed by such models)."""

    mode: ComponentMode = Field("install", examples=["existing"])
    """install: the pinned chart (its CRDs as their own resources); existing: a controller the cluster runs."""
