"""The typed stack config: one validated model for a whole stack, defaults in one place.

Stacks (stacks/Pulumi.<stack>.yaml) only override. Every check that spans fields lives in
`StackConfig._cross_checks`, so a bad stack fails here, before any resource is registered.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from ipaddress import IPv4Network
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from triarch.catalog import Catalog, catalog, charts, version_tuple
from triarch.coldfacts import cold_start_facts
from triarch.errors import ConfigError
from triarch.images import ImageError, chart_release, parse_host, parse_prefix, release_of
from triarch.planners.network import plan_subnets

NAMESPACE = "triarch"
UPSTREAM_IMAGES = {"vllm": "vllm/vllm-openai", "ray-serve": "rayproject/ray-llm"}
"""The upstream repository of each serving engine's image, as templates/compat/images.yaml keys it."""
SUPPORTED_KUBERNETES = tuple(f"1.{minor}" for minor in range(25, 38))
"""Kubernetes minors whose schemas the strict manifest validation knows (kubernetes-validate 1.37)."""

DnsLabel = Annotated[str, Field(pattern=r"^[a-z]([-a-z0-9]{0,30}[a-z0-9])?$")]
DriverVersion = Annotated[str, Field(pattern=r"^\d{3}\.\d{1,3}(\.\d{1,3})?$")]

RENAMED_KEYS = {
    "releaseVersion": "amiRelease",
    "instance_type": "instanceType",
    "k8sVersion": "kubernetesVersion",
    "version": "kubernetesVersion",
    "enabled": "mode",
}
"""Keys users reach for, mapped to the key Triarch reads; rejected with a message naming the new key."""


EKS_NODE_GROUP_NAME_MAX = 63
"""EKS refuses a managed node group name longer than 63 characters (pulumi-aws eks.NodeGroup nodeGroupName)."""
NODE_GROUP_NAME_HASH = 6
"""The hash suffix of a managed node group's name (triarch.planners.nodegroups.managed_node_group_name)."""
SYSTEM_RELEASE_TABLE = "AL2023_x86_64_NVIDIA"
"""Where the system nodes' release is looked up: each AL2023 release ships every variant (standard, NVIDIA, ...)
with one release_version per Kubernetes minor, so the NVIDIA table also dates the standard AMI of the release."""


class _Model(BaseModel):
    # Only the documented camelCase keys: a snake_case key is unknown, and gets the rename hint.
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, validate_by_alias=True,
                              validate_by_name=False)


class SystemNodeGroup(_Model):
    """CPU nodes for cluster add-ons, operators, Karpenter and Ray heads: GPU nodes are tainted and keep them off.

    An EKS managed node group on its own AMI release: bumping a GPU pool's release must not roll the nodes that
    run the Ray head and the node provisioner."""

    instance_type: str = "m7i.large"
    min: int = Field(2, ge=1)
    max: int = Field(4, ge=1)
    disk_gib: int = Field(50, ge=20, le=1000, alias="diskGiB")
    ami_release: str | None = None
    """EKS AL2023 AMI release of the system nodes (e.g. v20260714); required when the cluster is created."""


NodeProvisioner = Literal["karpenter", "cluster-autoscaler", "none"]
IAM_PRINCIPAL = r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$"


def admin_key(principal_arn: str) -> str:
    """What names an administrator's access entry: the role or user name (not its position in the list, so a
    reordered list replaces nothing)."""
    return principal_arn.rsplit("/", 1)[-1]

PoolProvisioner = Literal["karpenter", "managedNodeGroup"]


class ClusterConfig(_Model):
    """Create an EKS cluster (create: true) or adopt an existing cluster through a kubeconfig context."""

    create: bool
    name: DnsLabel
    kubernetes_version: str
    zones: list[str] = []
    vpc_cidr: IPv4Network = IPv4Network("10.0.0.0/16")
    nat_gateways: Literal["single", "perZone"] = "single"
    endpoint_public_access_cidrs: list[IPv4Network] = []
    """Who may reach the API server from outside the VPC; empty keeps the endpoint private."""
    system_node_group: SystemNodeGroup = SystemNodeGroup()
    kubeconfig: str | None = None
    """Path to the kubeconfig of an adopted cluster (default ~/.kube/config)."""
    context: str | None = None
    """The kubeconfig context of an adopted cluster; required so the ambient context is never used."""
    admin_role_arns: list[Annotated[str, Field(pattern=IAM_PRINCIPAL)]] = []
    """Created cluster: the IAM roles (or users) that administer it through EKS access entries, the principal
    `pulumi up` runs as among them. The cluster's creator gets no implicit admin access."""
    log_retention_days: Literal[1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192,
                                2557, 2922, 3288, 3653] = 90
    """How long CloudWatch keeps the control plane's logs: the values CloudWatch Logs' PutRetentionPolicy accepts
    (as terraform-provider-aws v6.58.0 validates them, internal/service/logs/group.go)."""
    node_provisioner: NodeProvisioner | None = None
    """What adds nodes to the GPU pools. Created cluster: `karpenter` (default; Triarch installs it) or `none`
    (every pool a fixed-size managed node group). Adopted cluster: what the cluster already runs, `none` by
    default; a pool that may be at zero needs `karpenter` or `cluster-autoscaler` there."""

    @property
    def kubeconfig_path(self) -> str:
        """The adopted cluster's kubeconfig file, `~` expanded (default ~/.kube/config)."""
        return os.path.expanduser(self.kubeconfig or "~/.kube/config")

    @property
    def provisioner(self) -> NodeProvisioner:
        if self.node_provisioner is not None:
            return self.node_provisioner
        return "karpenter" if self.create else "none"


class TimeSlicing(_Model):
    """Advertise each physical GPU as `replicas` schedulable GPUs (no memory isolation between them)."""

    replicas: int = Field(ge=2, le=16)


class NodeGroupConfig(_Model):
    """A pool of identical GPU nodes. EKS-managed when the cluster is created, otherwise existing nodes."""

    name: DnsLabel
    # EKS-managed node groups (cluster.create: true)
    instance_type: str | None = None
    ami_type: Literal["AL2023_x86_64_NVIDIA", "AL2023_ARM_64_NVIDIA"] = "AL2023_x86_64_NVIDIA"
    ami_release: str | None = None
    """EKS AMI release (e.g. v20260512): pins the NVIDIA driver. Unpinned AMIs roll the driver under you."""
    capacity_type: Literal["ON_DEMAND", "SPOT"] = "ON_DEMAND"
    """SPOT is opt-in: a spot node gets two minutes' notice, which every pod's drain must fit."""
    provisioner: PoolProvisioner | None = None
    """Created cluster: `karpenter` (a NodePool that scales from zero; the default when the cluster runs
    Karpenter) or `managedNodeGroup` (an EKS managed node group of fixed size: min == max)."""
    disk_gib: int = Field(200, ge=50, le=4000, alias="diskGiB")
    """Root volume: serving images are 10-20 GiB compressed, and the image cache lives here."""
    zones: list[str] | None = None
    """Created cluster: the zones the pool's nodes come up in (default: the cluster's). Existing nodes: the zones
    they are in (their topology.kubernetes.io/zone label), so replicas spread over them with DoNotSchedule; where
    they are not given, the zones are unknown and the spread stays soft."""
    # existing nodes (cluster.create: false)
    gpu: str | None = None
    gpus_per_node: int | None = Field(None, ge=1, le=16)
    driver_version: DriverVersion | None = None
    nodes: list[str] = []
    """Existing node names to label (and taint) as this pool."""
    # both
    min: int = Field(0, ge=0)
    max: int = Field(1, ge=0)
    taint: bool = True
    """Taint the nodes with nvidia.com/gpu:NoSchedule. Only a single-node cluster should turn this off."""
    time_slicing: TimeSlicing | None = None
    efa: bool = False
    """Created cluster, Karpenter pool of an EFA instance type (p4d, p4de, p5, p5e): the pods of a replica across
    nodes get every EFA interface of their node, through the EFA device plugin; the nodes get no public address
    and a security group open to itself."""
    placement_group: bool = False
    """With efa: a cluster placement group Triarch creates for the pool, so its nodes sit close on the network. A
    cluster placement group lives in one zone: the pool's `zones` must name exactly one."""
    fast_image_pull: bool | None = None
    """Created cluster: containerd pulls and unpacks an image's layers in parallel (the AMI's SOCI snapshotter,
    nodeadm's FastImagePull), about twice as fast for a 10+ GB serving image. Default: on where the AMI release has
    it (v20250821 or later) and the instance has 4+ vCPUs and 7+ GiB, which every GPU type here has."""
    instance_store: bool | None = None
    """Created cluster: the instance's local NVMe, as one RAID0 array, holds containerd's images and the kubelet's
    files (Karpenter's instanceStorePolicy; nodeadm's localStorage for a managed node group), so image layers are
    not written to the network-attached root volume. Default: on where the instance type has an instance store."""
    disk_throughput_mib_s: int | None = Field(None, ge=125, le=1000, alias="diskThroughputMiBps")
    """Created cluster: the gp3 root volume's throughput. Default: 600 MiB/s where images are unpacked on it in
    parallel (fastImagePull without instanceStore), which the AMI's docs name as the floor for that mode; else
    gp3's included 125."""


class AutoscalingConfig(_Model):
    min: int = Field(1, ge=0)
    max: int = Field(ge=1)


class ModelConfig(_Model):
    """One served model; its workload is placed on one node group, its engine args come from the tuner."""

    name: DnsLabel
    model: Annotated[str, Field(pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")]
    """Hugging Face repo id; its architecture must be in templates/models (or given by modelConfig)."""
    model_config_path: str | None = Field(None, alias="modelConfig")
    """Path (relative to the project) of the model's config.json, for models outside templates/models."""
    engine: Literal["vllm", "ray-serve"]
    node_group: str
    task: Literal["generate", "embed"] | None = None
    """Default: embed for models whose name says Embedding, generate otherwise."""
    replicas: int = Field(1, ge=1, le=64)
    tensor_parallel_size: int | None = Field(None, ge=1, le=16)
    """GPUs one pipeline stage splits each layer over, within a node. Default: the tuner's choice."""
    pipeline_parallel_size: int | None = Field(None, ge=1, le=64)
    """Stages the layers are split into. A replica of tensor x pipeline GPUs beyond one node's spans whole nodes
    (a LeaderWorkerSet group for engine vllm, one Ray Serve placement group for ray-serve). Default: 1, or as many
    nodes as the tuner needs to hold the model."""
    max_model_len: int | None = Field(None, ge=128)
    gpu_memory_utilization: float = Field(0.92, gt=0.1, le=0.95)
    """vLLM's default since 0.20; above 0.95 leaves too little for CUDA graphs and fragmentation."""
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    autoscaling: AutoscalingConfig | None = None
    route_prefix: Annotated[str, Field(pattern=r"^/[a-z0-9/_-]*$")] | None = None
    """Ray Serve route prefix (ray-serve engine); default /<name>."""
    startup_minutes: int | None = Field(None, ge=1, le=240)
    """How long the startup probe waits for the weights to load and vLLM to start before restarting the container.
    Default: the cold-start prediction's slow end with a margin (`triarch plan` shows both); a value below the
    prediction is refused."""
    weights_uri: Annotated[str, Field(pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[\w./=+-]*)?$")] | None = None
    """s3://bucket/prefix holding the model's files (config, tokenizer, safetensors), which vLLM streams
    into the GPUs with the Run:ai Model Streamer (--load-format runai_streamer) instead of downloading them from the
    hub into the model cache (engine ray-serve: Ray Serve LLM's model_source, which it hands to vLLM without a
    download). The pods read it through a role: on a created cluster one Triarch makes, scoped to the prefix (a Ray
    worker group's to its models' prefixes); on an adopted one triarch:serving.weightsRoleArn."""
    warm_replicas: int = Field(0, ge=0, le=16)
    """Replicas' worth of GPU capacity kept running empty beside the model's own, so a scale-up or a replacement
    skips the node's launch (and, with placeholder pods, the image pull). Billed as the nodes it keeps."""
    ttft_slo_seconds: float | None = Field(None, gt=0, le=600, alias="timeToFirstTokenSloSeconds")
    """Alert when the p90 time to first token stays above this (with observability.prometheus)."""
    cache_gib: int | None = Field(None, ge=1, le=4096, alias="cacheGiB")
    """Size of the Hugging Face cache volume; default twice the weights, at least 20 GiB."""

    @property
    def resolved_task(self) -> Literal["generate", "embed"]:
        if self.task is not None:
            return self.task
        return "embed" if "embedding" in self.model.lower() else "generate"


class ServingConfig(_Model):
    """Where the serving workloads live, who may call them, what they may reach, and how their model cache is
    stored."""

    namespace: DnsLabel = "llm"
    client_namespaces: list[DnsLabel] = []
    """Namespaces whose pods may call the OpenAI port (an ingress or gateway namespace); the serving namespace
    itself always may. Nothing else in the cluster reaches the models."""
    hub_cidrs: list[IPv4Network] = [IPv4Network("0.0.0.0/0")]
    """Where the pods may download weights from over HTTPS (the Hugging Face hub, or a proxy or mirror); on a
    created cluster the VPC's own range is excluded, so the API server and the nodes stay out of reach."""
    storage_class: str | None = None
    """StorageClass of the model caches. Default: on a created cluster, the EFS class Triarch installs (shared by
    all replicas); on an adopted cluster, the cluster's default class."""
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce"] | None = None
    """Default: ReadWriteMany on a created cluster (EFS), ReadWriteOnce on an adopted one."""
    compile_cache: bool | None = None
    """Keep vLLM's torch.compile cache (VLLM_CACHE_ROOT) on the model cache volume, one directory per GPU type
    (vLLM keys its entries by model and engine config), so the next replica and the next node start warm. Default:
    on where the cache is ReadWriteMany; a ReadWriteOnce volume cannot be shared by replicas on several nodes."""
    weights_role_arn: Annotated[str, Field(pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+$")] | None = None
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
    namespace: DnsLabel = "monitoring"
    """Where that Prometheus runs (created by Triarch with install)."""
    monitor_labels: dict[str, str] = {"release": "kube-prometheus-stack"}
    """Labels the Prometheus selects monitors and rules by (kube-prometheus-stack: release=<its release name>)."""
    prometheus_url: str = "http://kube-prometheus-stack-prometheus.monitoring.svc:9090"
    """Where KEDA queries (kube-prometheus-stack's Prometheus Service for a release of that name)."""
    dcgm_exporter: bool = True
    """With a Prometheus: install NVIDIA's DCGM exporter on the GPU nodes (GPU use, memory, XID and memory errors
    per pod); false where the cluster already runs one (the GPU operator's, say)."""
    keda: Literal["none", "existing", "install"] = "none"
    """KEDA for `engine: vllm` models with `autoscaling` (a ScaledObject each): one the cluster runs, or the pinned
    chart Triarch installs."""
    storage_gib: int = Field(50, ge=10, le=16384)
    """With prometheus: install, the size of Prometheus' volume (a claim that survives restarts; on a created cluster
    encrypted EBS gp3, on an adopted one the cluster's default class). Data beyond 85% of it is dropped oldest
    first."""
    retention: str = Field("15d", pattern=r"^[1-9][0-9]*(h|d|w|y)$")
    """With prometheus: install, how long Prometheus keeps samples (its --storage.tsdb.retention.time)."""


class ImagePin(_Model):
    """An image as the nodes pull it and the upstream release it is. `image`: any full reference (a mirror's
    registry and path, a tag, a digest, or both); `release`: the upstream tag (or `repository:tag`) of
    templates/compat/images.yaml, which decides the CUDA, vLLM and Ray inside. Without `release`, `image` must name
    the upstream repository (maybe under a mirror's prefix) and a tag Triarch knows. A plain string is `image`."""

    image: str
    release: str | None = None

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
    ray_llm: ImagePin = ImagePin(image="rayproject/ray-llm:2.60.0-py312-cu130")
    charts: dict[str, ImagePin] = {}

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

    images: str | dict[str, str] | None = None
    """One prefix for every image from a public registry (`<prefix>/<upstream path>`, e.g.
    123456789012.dkr.ecr.us-east-1.amazonaws.com/mirror), or one prefix per upstream registry host (docker.io,
    quay.io, nvcr.io, ghcr.io, public.ecr.aws, registry.k8s.io), as an ECR pull-through cache rule or a proxy project
    per upstream gives. An image pinned with its own registry under triarch:images stays as given."""
    charts: str | dict[str, str] | None = None
    """One OCI prefix for every chart (`<prefix>/<chart name>`, e.g.
    oci://123456789012.dkr.ecr.us-east-1.amazonaws.com/charts), or the OCI reference of each chart by name."""
    crds: str | None = Field(None, pattern=r"^(https://|file://|/)\S+$")
    """Where the CRD files Triarch manages apart from their charts (KubeRay's) come from:
    `<crds>/<chart>/<version>/<file>` instead of the release's published URL; each is checked against its sha256
    before `pulumi up` registers it (mirror.json lists them)."""
    username: str | None = None
    """For a registry that takes credentials (not ECR: the nodes' role pulls there): the user; its password is the
    Pulumi secret triarch:registryPassword. Every pod Triarch defines, and every chart it installs, pulls with an
    image pull Secret made from them."""
    server: str | None = None
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

    mode: ComponentMode = "install"
    """install: the pinned chart; existing: the cluster runs one already (the NVIDIA GPU operator's, say)."""
    gpu_feature_discovery: bool = True


class KubeRayConfig(_Model):
    """The KubeRay operator, which turns the RayService of the engine: ray-serve models into Ray clusters."""

    mode: ComponentMode = "install"
    """install: the pinned chart (with its CRDs); existing: an operator the cluster runs."""


class LeaderWorkerSetConfig(_Model):
    """The LeaderWorkerSet controller, which runs a vllm model's replica across nodes (only needed by such models)."""

    mode: ComponentMode = "install"
    """install: the pinned chart (its CRDs as their own resources); existing: a controller the cluster runs."""


class StackConfig(_Model):
    aws_region: str | None = None
    cluster: ClusterConfig
    node_groups: list[NodeGroupConfig] = Field(min_length=1)
    models: list[ModelConfig] = []
    images: ImagesConfig = ImagesConfig()
    registry: RegistryConfig = RegistryConfig()
    device_plugin: DevicePluginConfig = DevicePluginConfig()
    kuberay: KubeRayConfig = KubeRayConfig()
    leader_worker_set: LeaderWorkerSetConfig = LeaderWorkerSetConfig()
    serving: ServingConfig = ServingConfig()
    observability: ObservabilityConfig = ObservabilityConfig()

    @model_validator(mode="after")
    def _cross_checks(self) -> StackConfig:
        check_stack(self, catalog())
        return self

    def node_group(self, name: str) -> NodeGroupConfig:
        return next(group for group in self.node_groups if group.name == name)

    @property
    def cache_access_mode(self) -> Literal["ReadWriteMany", "ReadWriteOnce"]:
        """serving.accessMode with its default resolved: ReadWriteMany on a created cluster (EFS), ReadWriteOnce on an
        adopted one (its default class)."""
        return self.serving.access_mode or ("ReadWriteMany" if self.cluster.create else "ReadWriteOnce")

    @property
    def prometheus(self) -> Literal["none", "existing", "install"]:
        """observability.prometheus with its default resolved: install on a created cluster, none on an adopted."""
        given = self.observability.prometheus
        if given is not None:
            return given
        return "install" if self.cluster.create else "none"


def _path(*parts: str | int) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _cluster_path(key: str) -> str:
    return f"{NAMESPACE}:cluster.{key}"


def check_stack(stack: StackConfig, facts: Catalog) -> None:
    """Every rule that spans fields or needs the catalog; raises ConfigError naming the key path."""
    cluster = stack.cluster
    if cluster.kubernetes_version not in SUPPORTED_KUBERNETES:
        raise ConfigError(_cluster_path("kubernetesVersion"), cluster.kubernetes_version,
                          "is not a supported Kubernetes version", ", ".join(SUPPORTED_KUBERNETES))
    if cluster.create:
        if stack.aws_region is None:
            raise ConfigError("aws:region", None, "must be set when triarch:cluster.create is true",
                              "an AWS region such as us-east-1")
        if len(cluster.zones) < 2:
            raise ConfigError(_cluster_path("zones"), cluster.zones,
                              "must list at least two zones (EKS places the control plane in two or more)",
                              f"zones of {stack.aws_region}, e.g. {stack.aws_region}a")
        for i, zone in enumerate(cluster.zones):
            if not (zone.startswith(stack.aws_region) and len(zone) == len(stack.aws_region) + 1):
                raise ConfigError(_path(f"{NAMESPACE}:cluster", "zones", i), zone,
                                  f"is not a zone of aws:region {stack.aws_region}", f"{stack.aws_region}a, ...")
        if len(set(cluster.zones)) != len(cluster.zones):
            raise ConfigError(_cluster_path("zones"), cluster.zones, "lists a zone twice", "distinct zones")
        plan_subnets(cluster.vpc_cidr, cluster.zones)  # the address plan must hold the zones, before any resource
        for key in ("kubeconfig", "context"):
            if getattr(cluster, key) is not None:
                raise ConfigError(_cluster_path(key), getattr(cluster, key),
                                  "only applies to an adopted cluster", "remove it, or set create: false")
        if not cluster.admin_role_arns:
            raise ConfigError(_cluster_path("adminRoleArns"), [],
                              "names no administrator: the cluster's creator gets no implicit access, so nobody "
                              "(`pulumi up` included) could reach the Kubernetes API",
                              "the IAM role ARNs that administer the cluster, the one `pulumi up` runs as among them")
        seen: dict[str, int] = {}
        for i, arn in enumerate(cluster.admin_role_arns):
            name = admin_key(arn)
            if name in seen:
                raise ConfigError(f"{_cluster_path('adminRoleArns')}[{i}]", arn,
                                  f"has the name {name!r} of entry [{seen[name]}]: each admin's access entry is named "
                                  "after it", "principals with distinct names")
            seen[name] = i
        if cluster.provisioner == "cluster-autoscaler":
            raise ConfigError(_cluster_path("nodeProvisioner"), cluster.node_provisioner,
                              "is not installed by Triarch on a created cluster",
                              "karpenter (installed, scales pools from zero), none (fixed-size pools)")
        system = cluster.system_node_group
        _check_ami_release(stack, SYSTEM_RELEASE_TABLE, system.ami_release,
                           _cluster_path("systemNodeGroup.amiRelease"), facts, shown="AL2023")
        if system.instance_type not in facts.instances or facts.instances[system.instance_type].gpu:
            allowed = sorted(n for n, i in facts.instances.items() if not i.gpu)
            raise ConfigError(_cluster_path("systemNodeGroup.instanceType"), system.instance_type,
                              "is not a known CPU instance type", ", ".join(allowed))
        if system.min > system.max:
            raise ConfigError(_cluster_path("systemNodeGroup.min"), system.min,
                              f"is greater than systemNodeGroup.max ({system.max})", f"0..{system.max}")
        for key, mode in (("devicePlugin", stack.device_plugin.mode), ("kuberay", stack.kuberay.mode),
                          ("leaderWorkerSet", stack.leader_worker_set.mode)):
            if mode == "existing":
                raise ConfigError(f"{NAMESPACE}:{key}.mode", mode,
                                  "says the cluster already runs the component, but Triarch creates this cluster: "
                                  "nothing runs there that Triarch does not install",
                                  "install (or create: false to adopt a cluster that runs it)")
    elif cluster.context is None:
        raise ConfigError(_cluster_path("context"), None, "must name the kubeconfig context of the adopted cluster",
                          "a context from `kubectl config get-contexts` (the ambient context is never used)")
    elif cluster.admin_role_arns:
        raise ConfigError(_cluster_path("adminRoleArns"), cluster.admin_role_arns,
                          "only applies to a cluster Triarch creates", "remove it (the kubeconfig context decides)")
    if cluster.create and stack.serving.weights_role_arn is not None:
        raise ConfigError(f"{NAMESPACE}:serving.weightsRoleArn", stack.serving.weights_role_arn,
                          "only applies to an adopted cluster: on a cluster it creates, Triarch gives each model with "
                          "weightsUri its own role, scoped to that prefix", "remove it")

    names: set[str] = set()
    for i, group in enumerate(stack.node_groups):
        _check_node_group(stack, group, _path(f"{NAMESPACE}:nodeGroups", i), facts)
        if group.name in names:
            raise ConfigError(_path(f"{NAMESPACE}:nodeGroups", i, "name"), group.name, "is used twice",
                              "a distinct name per node group")
        names.add(group.name)

    for key, pin, upstream in (("vllm", stack.images.vllm, UPSTREAM_IMAGES["vllm"]),
                               ("rayLlm", stack.images.ray_llm, UPSTREAM_IMAGES["ray-serve"])):
        try:
            release_of(pin.image, pin.release, upstream, facts.images)
        except ImageError as error:
            raise _pin_error(key, pin, error) from None
    _check_registry(stack, facts)

    models: set[str] = set()
    for i, model in enumerate(stack.models):
        path = _path(f"{NAMESPACE}:models", i)
        if model.name in models:
            raise ConfigError(f"{path}.name", model.name, "is used twice", "a distinct name per model")
        models.add(model.name)
        if model.node_group not in names:
            raise ConfigError(f"{path}.nodeGroup", model.node_group, "is not a node group of this stack",
                              ", ".join(sorted(names)))
        per_node = gpus_per_node(stack.node_group(model.node_group), facts)
        if model.tensor_parallel_size is not None and model.tensor_parallel_size > per_node:
            raise ConfigError(f"{path}.tensorParallelSize", model.tensor_parallel_size,
                              f"exceeds the {per_node} GPU(s) per node of node group '{model.node_group}'",
                              f"1..{per_node}")
        _check_parallelism(stack, model, path, per_node)
        _check_cold_start_settings(stack, model, path)
        if model.route_prefix is not None and model.engine != "ray-serve":
            raise ConfigError(f"{path}.routePrefix", model.route_prefix, "only applies to engine ray-serve",
                              "remove it (a vllm model gets its own Service)")
        if model.autoscaling is not None:
            if "replicas" in model.model_fields_set:
                raise ConfigError(f"{path}.replicas", model.replicas,
                                  "would be ignored beside autoscaling (Ray Serve keeps the replicas between "
                                  "autoscaling.min and max)", "remove replicas, or remove autoscaling")
            if model.engine == "vllm" and not (stack.observability.keda != "none"
                                               and stack.prometheus != "none"):
                raise ConfigError(f"{path}.autoscaling", model.autoscaling.model_dump(by_alias=True),
                                  "scales a vllm model with KEDA on vLLM's own metrics, which needs KEDA and a "
                                  "Prometheus in the cluster (a CPU HPA on a GPU server scales at the wrong time)",
                                  "observability: {prometheus: existing, keda: install}, or engine: ray-serve")
            if model.engine == "vllm" and model.autoscaling.min < 1:
                raise ConfigError(f"{path}.autoscaling.min", model.autoscaling.min,
                                  "leaves no vLLM server to queue the request that should wake one (KEDA's "
                                  "Prometheus trigger sees no waiting requests without a server)",
                                  f"1..{model.autoscaling.max} (scale to zero: engine ray-serve)")
            if model.autoscaling.min > model.autoscaling.max:
                raise ConfigError(f"{path}.autoscaling.min", model.autoscaling.min,
                                  f"is greater than autoscaling.max ({model.autoscaling.max})",
                                  f"0..{model.autoscaling.max}")


def _check_cold_start_settings(stack: StackConfig, model: ModelConfig, path: str) -> None:
    """Weights from S3 need a role that reads them and an engine that streams them; warm capacity needs a pool
    that scales; a shared compile cache needs a volume every replica can mount."""
    serving = stack.serving
    if model.weights_uri is not None and not stack.cluster.create and serving.weights_role_arn is None:
        raise ConfigError(f"{path}.weightsUri", model.weights_uri,
                          "names S3 weights, but no role can read them: the serving pods of an adopted cluster "
                          "assume triarch:serving.weightsRoleArn (IRSA), which is not set",
                          "triarch:serving.weightsRoleArn: arn:aws:iam::<account>:role/<a role that may "
                          "s3:GetObject and s3:ListBucket there>, or remove weightsUri")
    if model.warm_replicas:
        group = stack.node_group(model.node_group)
        scales = pool_provisioner(stack.cluster, group) == "karpenter" or (
            not stack.cluster.create and stack.cluster.provisioner != "none")
        if not scales:
            raise ConfigError(f"{path}.warmReplicas", model.warm_replicas,
                              f"keeps capacity warm on node group '{group.name}', whose nodes always run (nothing "
                              "scales it): there is no launch to skip", "0, or a pool Karpenter scales")
    compile_cache = serving.compile_cache
    mode = stack.cache_access_mode
    largest = model.autoscaling.max if model.autoscaling else model.replicas
    if compile_cache and mode == "ReadWriteOnce" and (largest > 1 or model.warm_replicas):
        raise ConfigError(f"{NAMESPACE}:serving.compileCache", True,
                          f"puts vLLM's compile cache on the ReadWriteOnce model cache that the {largest} replicas "
                          f"of '{model.name}' share: one node mounts it, a replica on another never starts",
                          "a ReadWriteMany storageClass (accessMode: ReadWriteMany), or compileCache: false")


def _check_parallelism(stack: StackConfig, model: ModelConfig, path: str, per_node: int) -> None:
    """A replica beyond one node takes whole nodes (one pod per node, all its GPUs), all at once: its GPUs are a
    whole number of nodes, the pool can hold one such group, and no GPU is a slice."""
    tp, pp = model.tensor_parallel_size, model.pipeline_parallel_size
    if pp is None:
        return
    group = stack.node_group(model.node_group)
    if group.time_slicing is not None and pp > 1:
        raise ConfigError(f"{path}.pipelineParallelSize", pp,
                          f"needs {(tp or 1) * pp} whole GPUs, but node group '{group.name}' slices each GPU "
                          f"{group.time_slicing.replicas} ways", "1, or a pool without timeSlicing")
    if tp is None:
        return  # the tuner picks TP within a node, keeping whole nodes
    gpus = tp * pp
    if gpus <= per_node:
        return
    if gpus % per_node:
        raise ConfigError(f"{path}.pipelineParallelSize", pp,
                          f"gives tensorParallelSize {tp} x pipelineParallelSize {pp} = {gpus} GPUs, "
                          f"{gpus / per_node:g} nodes of node group '{group.name}' ({per_node} GPUs each): a replica "
                          "beyond one node takes whole nodes",
                          f"tensor x pipeline a multiple of {per_node} (e.g. tensorParallelSize {per_node}, "
                          f"pipelineParallelSize {-(-gpus // per_node)})")
    nodes = gpus // per_node
    if group.max < nodes:
        raise ConfigError(f"{path}.pipelineParallelSize", pp,
                          f"spreads one replica over {nodes} nodes of node group '{group.name}' ({gpus} GPUs), "
                          f"but the pool's max is {group.max} node(s): not one replica could start",
                          f"node group '{group.name}' max >= {nodes}, or fewer stages")


def _pin_error(key: str, pin: ImagePin, error: ImageError) -> ConfigError:
    """A pin's mistake at its key (`.image` or `.release` where the pin is a mapping)."""
    path = f"{NAMESPACE}:images.{key}" + (f".{error.part}" if pin.release is not None else "")
    return ConfigError(path, pin.release if error.part == "release" else pin.image, error.reason, error.allowed)


def _check_registry(stack: StackConfig, facts: Catalog) -> None:
    """Chart images pinned under triarch:images are images of the pinned charts, of the release each chart runs;
    the registry's prefixes are registries and OCI references."""
    installed = charts()
    chart_images = {i.key: i for c in installed.values() for i in c.images}
    for key, pin in stack.images.charts.items():
        path = f"{NAMESPACE}:images.{key}"
        image = chart_images.get(key)
        if image is None:
            raise ConfigError(path, key, "is not an image Triarch deploys",
                              ", ".join(["vllm", "rayLlm", *sorted(chart_images)]))
        try:
            chart_release(pin.image, pin.release, image.image)
        except ImageError as error:
            raise _pin_error(key, pin, error) from None
    prefixes = stack.registry.images
    for host, prefix in (prefixes.items() if isinstance(prefixes, dict) else [("", prefixes)] if prefixes else []):
        path = f"{NAMESPACE}:registry.images" + (f".{host}" if host else "")
        if host and not parse_host(host):
            raise ConfigError(path, host, "is not a registry host", "docker.io, quay.io, nvcr.io, ghcr.io, "
                              "public.ecr.aws, registry.k8s.io, or another host[:port]")
        try:
            parse_prefix(prefix)
        except ImageError as error:
            raise ConfigError(path, prefix, error.reason, error.allowed) from None
    if isinstance(prefixes, dict) and stack.prometheus == "install":
        raise ConfigError(f"{NAMESPACE}:registry.images", ", ".join(sorted(prefixes)),
                          "maps registries one by one, but kube-prometheus-stack (observability.prometheus: install) "
                          "moves all its images and its subcharts' with one registry (global.imageRegistry)",
                          "one prefix for every registry, or observability.prometheus: existing")
    sources = stack.registry.charts
    for name, reference in (sources.items() if isinstance(sources, dict) else [("", sources)] if sources else []):
        path = f"{NAMESPACE}:registry.charts" + (f".{name}" if name else "")
        if name and name not in installed:
            raise ConfigError(path, name, "is not a chart Triarch installs", ", ".join(sorted(installed)))
        if not re.match(r"^oci://[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)*$", reference):
            raise ConfigError(path, reference, "is not an OCI reference",
                              "oci://<registry>/<path>, e.g. oci://123456789012.dkr.ecr.us-east-1.amazonaws.com/charts")


def _check_node_group(stack: StackConfig, group: NodeGroupConfig, path: str, facts: Catalog) -> None:
    cluster = stack.cluster
    if group.min > group.max:
        raise ConfigError(f"{path}.min", group.min, f"is greater than max ({group.max})", f"0..{group.max}")
    if cluster.create:
        for key in ("gpu", "gpus_per_node", "driver_version"):
            if getattr(group, key) is not None:
                alias = to_camel(key)
                raise ConfigError(f"{path}.{alias}", getattr(group, key),
                                  "is derived from instanceType and amiRelease on an EKS node group",
                                  "remove it")
        if group.nodes:
            raise ConfigError(f"{path}.nodes", group.nodes, "only applies to existing nodes", "remove it")
        gpu_types = sorted(n for n, i in facts.instances.items() if i.gpu)
        if group.instance_type is None or group.instance_type not in gpu_types:
            raise ConfigError(f"{path}.instanceType", group.instance_type, "is not a known GPU instance type",
                              ", ".join(gpu_types))
        _check_ami_release(stack, group.ami_type, group.ami_release, f"{path}.amiRelease", facts)
        for i, zone in enumerate(group.zones or []):
            if zone not in cluster.zones:
                raise ConfigError(f"{path}.zones[{i}]", zone, "is not one of the cluster's zones",
                                  ", ".join(cluster.zones))
        if group.max == 0:
            raise ConfigError(f"{path}.max", group.max, "leaves the node group without nodes", ">= 1")
        provisioner = pool_provisioner(cluster, group)
        if provisioner == "karpenter" and cluster.provisioner != "karpenter":
            raise ConfigError(f"{path}.provisioner", group.provisioner,
                              f"needs Karpenter, but triarch:cluster.nodeProvisioner is {cluster.provisioner!r}",
                              "managedNodeGroup, or nodeProvisioner: karpenter")
        if provisioner == "karpenter" and group.min != 0:
            raise ConfigError(f"{path}.min", group.min,
                              "has no meaning for a Karpenter pool: Karpenter launches nodes for pending pods and "
                              "keeps no idle ones", "0, or provisioner: managedNodeGroup for nodes that always run")
        longest = EKS_NODE_GROUP_NAME_MAX - len(cluster.name) - 2 - NODE_GROUP_NAME_HASH
        if provisioner == "managedNodeGroup" and len(group.name) > longest:
            raise ConfigError(f"{path}.name", group.name,
                              f"makes the EKS node group name {cluster.name}-{group.name}-<hash of "
                              f"{NODE_GROUP_NAME_HASH}>, longer than the {EKS_NODE_GROUP_NAME_MAX} characters EKS "
                              "allows",
                              f"at most {longest} characters")
        if provisioner == "managedNodeGroup" and group.min != group.max:
            raise ConfigError(f"{path}.min", group.min,
                              f"differs from max ({group.max}), but nothing scales a managed node group "
                              "(Triarch installs no cluster-autoscaler)",
                              f"min == max == {group.max} (a fixed-size pool), or provisioner: karpenter")
        _check_efa(stack, group, path, provisioner, facts)
        _check_image_pull(group, path, facts)
    else:
        for key in ("efa", "placement_group", "fast_image_pull", "instance_store", "disk_throughput_mib_s"):
            if getattr(group, key) is not None and getattr(group, key) is not False:
                alias = "diskThroughputMiBps" if key == "disk_throughput_mib_s" else to_camel(key)
                raise ConfigError(f"{path}.{alias}", getattr(group, key), "only applies when triarch:cluster.create "
                                  "is true (an adopted cluster's nodes come with their own interfaces, placement, "
                                  "disks and container runtime)", "remove it")
        if group.provisioner is not None:
            raise ConfigError(f"{path}.provisioner", group.provisioner,
                              "only applies when triarch:cluster.create is true",
                              "remove it; declare what scales the adopted cluster in triarch:cluster.nodeProvisioner")
        if group.min == 0 and cluster.provisioner == "none":
            raise ConfigError(f"{path}.min", group.min,
                              "lets the pool be empty, but triarch:cluster.nodeProvisioner is 'none': nothing "
                              "would add a node for a GPU pod",
                              "min >= 1, or nodeProvisioner: karpenter | cluster-autoscaler")
        if group.zones is not None and len(set(group.zones)) != len(group.zones):
            raise ConfigError(f"{path}.zones", group.zones, "lists a zone twice", "distinct zones")
        for key in ("instance_type", "ami_release"):
            if getattr(group, key) is not None:
                raise ConfigError(f"{path}.{to_camel(key)}", getattr(group, key),
                                  "only applies when triarch:cluster.create is true",
                                  "for existing nodes set gpu, gpusPerNode and driverVersion")
        if group.gpu is None or group.gpu not in facts.gpus:
            raise ConfigError(f"{path}.gpu", group.gpu, "is not a known GPU", ", ".join(sorted(facts.gpus)))
        if group.driver_version is None:
            raise ConfigError(f"{path}.driverVersion", None,
                              "must be declared for existing nodes (nvidia-smi prints it)", "e.g. 580.95.05")
        if version_tuple(group.driver_version) < (400,):
            raise ConfigError(f"{path}.driverVersion", group.driver_version, "is not an NVIDIA driver version",
                              "e.g. 580.95.05")


def _check_image_pull(group: NodeGroupConfig, path: str, facts: Catalog) -> None:
    """Parallel image pull only where the AMI release ships it and the node is big enough for nodeadm to turn it on
    (it ignores the gate silently otherwise); the instance store only where the type has one."""
    assert group.instance_type is not None and group.ami_release is not None
    cold = cold_start_facts()
    instance = facts.instances[group.instance_type]
    if group.fast_image_pull:
        if group.ami_release < cold.fast_pull_min_release:
            raise ConfigError(f"{path}.fastImagePull", True,
                              f"needs the SOCI snapshotter's parallel mode, which AMI release {group.ami_release} "
                              f"predates (it came after {cold.fast_pull_min_release})",
                              f"an amiRelease from {cold.fast_pull_min_release} on, or fastImagePull: false")
        if instance.vcpus < cold.fast_pull_min_vcpus or instance.memory_gib < cold.fast_pull_min_memory_gib:
            raise ConfigError(f"{path}.fastImagePull", True,
                              f"is ignored by nodeadm on {group.instance_type} ({instance.vcpus} vCPUs, "
                              f"{instance.memory_gib:g} GiB): it needs {cold.fast_pull_min_vcpus}+ vCPUs and "
                              f"{cold.fast_pull_min_memory_gib:g}+ GiB", "a larger instance type, or remove it")
    if group.instance_store and not instance.nvme_gb:
        with_store = sorted(n for n, i in facts.instances.items() if i.gpu and i.nvme_gb)
        raise ConfigError(f"{path}.instanceStore", True, f"asks for the instance store of {group.instance_type}, "
                          "which has none", f"an instance type with one ({', '.join(with_store)}), or remove it")


def _check_efa(stack: StackConfig, group: NodeGroupConfig, path: str, provisioner: str, facts: Catalog) -> None:
    """EFA only where the instance type has it and Karpenter attaches it (it adds one interface per
    vpc.amazonaws.com/efa a pod asks for); a cluster placement group only with EFA, in one zone."""
    assert group.instance_type is not None
    if group.efa:
        with_efa = sorted(n for n, i in facts.instances.items() if i.efa)
        if not facts.instances[group.instance_type].efa:
            raise ConfigError(f"{path}.efa", True, f"asks for EFA on {group.instance_type}, which has none",
                              f"an instance type with EFA ({', '.join(with_efa)}), or efa: false")
        if provisioner != "karpenter":
            raise ConfigError(f"{path}.efa", True,
                              "needs a Karpenter pool (Karpenter attaches the interfaces a pod asks for; Triarch "
                              "writes no launch template with them for a managed node group)",
                              "provisioner: karpenter, or efa: false")
    if group.placement_group:
        if not group.efa:
            raise ConfigError(f"{path}.placementGroup", True, "only serves nodes that talk over EFA", "efa: true")
        zones = group.zones or stack.cluster.zones
        if len(zones) != 1:
            raise ConfigError(f"{path}.zones", zones,
                              f"spread the pool over {len(zones)} zones, but a cluster placement group lives in one "
                              "(EC2 places its instances in a single zone)",
                              f"one zone, e.g. zones: [{zones[0]}], or placementGroup: false")


def _check_ami_release(stack: StackConfig, ami_type: str, release_name: str | None, path: str,
                       facts: Catalog, shown: str | None = None) -> None:
    """A release Triarch knows (so its NVIDIA driver is known), with an AMI for the cluster's Kubernetes minor."""
    kubernetes = stack.cluster.kubernetes_version
    releases = facts.amis.get(ami_type, {})
    if release_name is None or release_name not in releases:
        raise ConfigError(path, release_name,
                          f"is not a known {shown or ami_type} release in templates/compat/amis.yaml "
                          "(the driver it ships must be known)", ", ".join(sorted(releases)))
    if kubernetes not in releases[release_name].release_versions:
        fitting = sorted(r for r, a in releases.items() if kubernetes in a.release_versions)
        known = sorted({v for a in releases.values() for v in a.release_versions}, key=lambda v: tuple(
            int(part) for part in v.split(".")))
        raise ConfigError(path, release_name, f"has no AMI for Kubernetes {kubernetes}",
                          f"a release for {kubernetes}: " + ", ".join(fitting) if fitting else
                          f"no {shown or ami_type} release in templates/compat/amis.yaml has one; a Kubernetes "
                          f"version one has ({', '.join(known)}), or add the release with its source")


def pool_provisioner(cluster: ClusterConfig, group: NodeGroupConfig) -> Literal[PoolProvisioner, "existing"]:
    """What brings up a pool's nodes: a Karpenter NodePool, an EKS managed node group, or (adopted clusters)
    the nodes that are there, labelled by Triarch or by the cluster's own provisioner."""
    if not cluster.create:
        return "existing"
    if group.provisioner is not None:
        return group.provisioner
    return "karpenter" if cluster.provisioner == "karpenter" else "managedNodeGroup"


def gpu_of(group: NodeGroupConfig, facts: Catalog) -> str:
    """The GPU catalog key of a node group: from its instance type, or as declared for existing nodes."""
    if group.instance_type is not None:
        gpu = facts.instances[group.instance_type].gpu
        assert gpu is not None
        return gpu
    assert group.gpu is not None
    return group.gpu


def gpus_per_node(group: NodeGroupConfig, facts: Catalog) -> int:
    if group.instance_type is not None:
        return facts.instances[group.instance_type].gpus
    return group.gpus_per_node or 1


def driver_of(group: NodeGroupConfig, facts: Catalog) -> str:
    """The NVIDIA driver a node group's nodes run: the AMI release's, or as declared for existing nodes."""
    if group.ami_release is not None:
        return facts.amis[group.ami_type][group.ami_release].nvidia_driver
    assert group.driver_version is not None
    return group.driver_version


# --- reading Pulumi config -------------------------------------------------------------------------------

TOP_LEVEL_KEYS = {to_camel(name): name for name in StackConfig.model_fields if name != "aws_region"}
SECRET_KEYS = {"hfToken", "vllmApiKey", "grafanaAdminPassword", "registryPassword"}
"""Triarch keys read as Pulumi secrets by the program, never into the model (so never into a message)."""


def from_pulumi_config(values: Mapping[str, Any]) -> StackConfig:
    """Validate a stack from Pulumi config ("ns:key" -> value; objects may be JSON strings, as Pulumi passes them).

    Raises ConfigError with the first mistake; keys of other namespaces (aws:, kubernetes:, pulumi:) are ignored.
    """
    data: dict[str, Any] = {}
    for key, value in values.items():
        namespace, _, name = key.partition(":")
        if key == "aws:region":
            data["awsRegion"] = value
        if namespace != NAMESPACE:
            continue
        if name in SECRET_KEYS:
            continue
        if name not in TOP_LEVEL_KEYS:
            known = sorted([*TOP_LEVEL_KEYS, *SECRET_KEYS])
            raise ConfigError(key, value, f"is not a Triarch config key{_closest(name, known, NAMESPACE + ':')}",
                              ", ".join(f"{NAMESPACE}:{k}" for k in known), show_value=False)
        if isinstance(value, str) and value[:1] in "[{":
            try:
                value = json.loads(value)
            except json.JSONDecodeError as error:
                raise ConfigError(key, value, f"is not valid JSON ({error.msg})", "a YAML mapping or list") from None
        data[name] = value
    try:
        return StackConfig.model_validate(data)
    except ValidationError as error:
        raise _first_error(error) from None


def _closest(key: str, known: list[str], prefix: str = "") -> str:
    """` (did you mean 'x'?)` for the known key a typo is closest to, or nothing."""
    match = difflib.get_close_matches(key.lower(), [k.lower() for k in known], n=1, cutoff=0.6)
    if not match:
        return ""
    found = next(k for k in known if k.lower() == match[0].lower())
    return f" (did you mean '{prefix}{found}'?)"


ERROR_ORDER = {"extra_forbidden": 0, "missing": 2}
"""A key that is not Triarch's is reported before a required key that is missing: a misspelt required key is
both, and the misspelling is the mistake to name."""


def _first_error(error: ValidationError) -> ConfigError:
    errors = error.errors(include_url=False)
    first = min(errors, key=lambda e: ERROR_ORDER.get(e["type"], 1))
    loc = list(first["loc"])
    if loc and loc[0] == "awsRegion":
        path = "aws:region"
    elif loc:
        path = _path(f"{NAMESPACE}:{loc[0]}", *loc[1:])
    else:
        path = NAMESPACE
    kind, value = first["type"], first.get("input")
    if kind == "extra_forbidden":
        key = str(loc[-1])
        allowed = _allowed_keys(loc[:-1])
        renamed = RENAMED_KEYS.get(key) or (to_camel(key) if "_" in key else None)
        if renamed and renamed in allowed:
            return ConfigError(path, value, f"is not read by Triarch: the key is '{renamed}'", renamed,
                               show_value=False)
        return ConfigError(path, value, f"is not a known key{_closest(key, allowed)}", ", ".join(allowed),
                           show_value=False)
    if kind == "missing":
        return ConfigError(path, None, "is required", _describe_field(loc))
    if kind == "literal_error":
        return ConfigError(path, value, "is not an allowed value", first["ctx"]["expected"])
    if kind == "string_pattern_mismatch":
        return ConfigError(path, value, "has the wrong form", f"a string matching {first['ctx']['pattern']}")
    message = re.sub(r"^(Value error|Assertion failed), ", "", first["msg"])
    return ConfigError(path, value, f"is invalid: {message[0].lower()}{message[1:]}", _describe_field(loc))


def _key(name: str, field: FieldInfo) -> str:
    """The key a stack file uses for a field: its explicit alias, else its camelCase name."""
    return field.alias or to_camel(name)


def _model_at(loc: list[Any]) -> type[BaseModel] | None:
    """The model class reached by a validation location (list indexes skipped)."""
    model: type[BaseModel] = StackConfig
    for part in loc:
        if isinstance(part, int):
            continue
        field = next((f for n, f in model.model_fields.items() if _key(n, f) == part or n == part), None)
        if field is None:
            return None
        target = _inner_model(field.annotation)
        if target is None:
            return None
        model = target
    return model


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _allowed_keys(loc: list[Any]) -> list[str]:
    model = _model_at(loc)
    return sorted(_key(name, f) for name, f in model.model_fields.items()) if model else []


def _describe_field(loc: list[Any]) -> str:
    model = _model_at(loc[:-1])
    if model is None:
        return ""
    field = next((f for n, f in model.model_fields.items() if _key(n, f) == loc[-1]), None)
    if field is None:
        return ""
    annotation = field.annotation
    if get_origin(annotation) is Literal:
        return ", ".join(repr(a) for a in get_args(annotation))
    model = _inner_model(annotation)
    if model is not None:
        keys = ", ".join(_key(n, f) for n, f in model.model_fields.items())
        shape = "a list of mappings" if get_origin(annotation) is list else "a mapping"
        return f"{shape} with keys {keys}"
    name = getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
    bounds = [f"{m.__class__.__name__.lower()} {getattr(m, m.__class__.__name__.lower(), '')}"
              for m in field.metadata if m.__class__.__name__ in ("Ge", "Le", "Gt", "Lt")]
    return " ".join([name, *bounds]).strip()
