"""The stack's schema: one typed model for a whole stack, defaults in one place. Stacks
(stacks/Pulumi.<stack>.yaml) only override. Checks that span fields or need the catalog are in
`triarch.config.checks`; reading Pulumi config and wording its mistakes in `triarch.config.reading`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from ipaddress import IPv4Network
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, Field, model_validator

from triarch.config.base import DnsLabel, DriverVersion, _Model
from triarch.config.platform import (
    DevicePluginConfig,
    ImagesConfig,
    KubeRayConfig,
    LeaderWorkerSetConfig,
    ObservabilityConfig,
    RegistryConfig,
    ServingConfig,
)

RAY_HEAD_SYSTEM_INSTANCE = "m7i.xlarge"
"""The system nodes' default type where a Ray head runs there: 4 vCPU, 16 GiB (templates/compat/instances.yaml)."""
UPSTREAM_IMAGES = {"vllm": "vllm/vllm-openai", "ray-serve": "rayproject/ray-llm"}
"""The upstream repository of each serving engine's image, as templates/compat/images.yaml keys it."""
SUPPORTED_KUBERNETES = tuple(f"1.{minor}" for minor in range(25, 38))
"""Kubernetes minors whose schemas the strict manifest validation knows (kubernetes-validate 1.37)."""


class SystemNodeGroup(_Model):
    """CPU nodes for cluster add-ons, operators, Karpenter and Ray heads: GPU nodes are tainted and keep them off.

    An EKS managed node group on its own AMI release: bumping a GPU pool's release must not roll the nodes that
    run the Ray head and the node provisioner."""

    instance_type: str = "m7i.large"
    """EC2 instance type of the system nodes: a CPU type of templates/compat/instances.yaml. Default m7i.large, or
    m7i.xlarge where a model runs on ray-serve (the Ray head, which runs here, requests 2 CPU and 8 GiB: more than
    an m7i.large has beside what its kubelet reserves)."""
    min: int = Field(2, ge=1)
    """Fewest system nodes; two keep the add-ons up through a node's replacement."""
    max: int = Field(4, ge=1)
    """Most system nodes the managed node group may have."""
    disk_gib: int = Field(50, ge=20, le=1000, alias="diskGiB", examples=[100])
    """Root volume of each system node (encrypted gp3)."""
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
    """true: Triarch creates the EKS cluster, its VPC and node pools; false: it adopts a cluster that a kubeconfig
    context reaches."""
    name: DnsLabel
    """The cluster's name: the EKS cluster's, and the prefix of what Triarch names after it (a new name is a new
    cluster)."""
    kubernetes_version: str
    """Kubernetes minor as a string ("1.35"). A created cluster moves one minor up per `pulumi up`, never down."""
    zones: list[str] = []
    """Created cluster: the availability zones of aws:region it spans, two or more (EKS accepts new subnets only in
    the zones it was created with)."""
    vpc_cidr: IPv4Network = Field(IPv4Network("10.0.0.0/16"), examples=["10.40.0.0/16"])
    """Created cluster: the VPC's address range, split into one private and one public subnet per zone."""
    nat_gateways: Literal["single", "perZone"] = "single"
    """Created cluster: one NAT gateway for all zones (cheaper), or one per zone (a zone's outage leaves the others
    their way out)."""
    endpoint_public_access_cidrs: list[IPv4Network] | None = Field(None, examples=[["198.51.100.7/32"]])
    """Created cluster: who may reach the API server from outside the VPC, `pulumi up` among them: your egress
    address as /32 (`curl -s https://checkip.amazonaws.com`) and your CI runners' ranges. `[]` keeps the endpoint
    private: then `privateAccessCidrs` names the way in."""
    private_access_cidrs: list[IPv4Network] = Field([], examples=[["10.200.0.0/16"]])
    """Created cluster: ranges inside your network (a VPN, a peered VPC, a bastion's subnet) that reach the private
    endpoint; the cluster's security group admits HTTPS (443) from each."""
    system_node_group: SystemNodeGroup = SystemNodeGroup()
    """Created cluster: the CPU nodes of the add-ons, operators and Ray heads."""
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
    node_provisioner: NodeProvisioner | None = Field(None, examples=["none"])
    """What adds nodes to the GPU pools. Created cluster: `karpenter` (default; Triarch installs it) or `none`
    (every pool a fixed-size managed node group). Adopted cluster: what the cluster already runs, `none` by
    default; a pool that may be at zero needs `karpenter` or `cluster-autoscaler` there."""
    node_repair: bool | None = Field(None, examples=[False])
    """Created cluster with Karpenter pools: replace a GPU node whose GPU failed. Triarch installs the EKS node
    monitoring agent (an EKS add-on: DaemonSets on the nodes already priced, nothing of its own to price; its DCGM
    host engine made to tolerate the GPU taint) and turns on Karpenter's NodeRepair gate: a node the agent marks
    AcceleratedHardwareReady=False (an Xid of its list, a double-bit ECC, NVLink or DCGM failure;
    templates/compat/node-repair.yaml) is terminated 10 minutes later, without a drain, unless more than 20% of its
    pool is unhealthy. Default: on where Triarch creates the cluster and
    Karpenter launches a pool (a failed GPU otherwise holds its replicas' slots until someone replaces the node by
    hand); off on an adopted cluster, where Triarch installs neither (`triarch verify` reports whether the GPU nodes
    carry the condition). Managed node group pools are not repaired by Karpenter."""

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

    replicas: int = Field(ge=2, le=16, examples=[4])
    """How many pods share one GPU; each gets 1/replicas of its memory by vLLM's gpu_memory_utilization."""


CAPACITY_RESERVATION_ID = r"^cr-[0-9a-f]{17}$"
"""An EC2 capacity reservation id: `cr-` and 17 hex digits (EC2 API reference, CapacityReservation; Karpenter
1.14.1's CRD accepts any `^cr-[0-9a-z]+$`, and EC2 then finds no such reservation)."""


class CapacityReservationConfig(_Model):
    """One EC2 capacity reservation a Karpenter pool launches into ahead of on-demand: an On-Demand Capacity
    Reservation or a Capacity Block for ML, by id or by tags (a term of the EC2NodeClass's
    capacityReservationSelectorTerms, Karpenter 1.14.1). You reserve or buy it in EC2; Triarch never creates,
    buys or cancels one."""

    id: Annotated[str, Field(pattern=CAPACITY_RESERVATION_ID)] | None = Field(None,
                                                                            examples=["cr-0123456789abcdef0"])
    """The reservation's id (`cr-` and 17 hex digits). Either id or tags."""
    tags: dict[str, str] | None = Field(None, examples=[{"team": "ml-serving"}])
    """Tags that select reservations (`*` as a value: any value of that key), at most 20. Either id or tags."""
    owner_id: Annotated[str, Field(pattern=r"^\d{12}$")] | None = Field(None, alias="ownerID",
                                                                       examples=["123456789012"])
    """With tags: only reservations this AWS account owns (one shared with you through AWS RAM)."""
    type: Literal["odcr", "capacityBlock"] = Field("odcr", examples=["capacityBlock"])
    """odcr: an On-Demand Capacity Reservation, billed at the on-demand rate while it exists, used or not.
    capacityBlock: a Capacity Block for ML, paid upfront for its days; Karpenter drains its nodes 40 minutes before
    it ends (10 before EC2 starts terminating them)."""
    count: int | None = Field(None, ge=1, le=1000, examples=[2])
    """Instances the reservation holds (for a tags term, all it selects together). The placement proof and the
    cost count them apart; unknown otherwise, and the cost is then a floor."""
    hourly_usd: float | None = Field(None, gt=0, examples=[31.464])
    """capacityBlock, required: what you pay per instance-hour, as its purchase recorded it (its upfront price
    divided by its hours and instances). An odcr is priced at the on-demand rate of templates/compat/prices.yaml."""
    ends_at: AwareDatetime | None = Field(None, examples=["2027-01-15T11:30:00Z"])
    """When the reservation ends (UTC), as EC2 shows it: `triarch diff` says what that end does to the replicas on
    its nodes."""


class NodeGroupConfig(_Model):
    """A pool of identical GPU nodes. EKS-managed when the cluster is created, otherwise existing nodes."""

    name: DnsLabel
    """The pool's name: its nodes' triarch.dev/pool label, and what models[].nodeGroup names."""
    # EKS-managed node groups (cluster.create: true)
    instance_type: str | None = None
    """Created cluster, required: the GPU instance type of the pool's nodes (templates/compat/instances.yaml)."""
    ami_type: Literal["AL2023_x86_64_NVIDIA", "AL2023_ARM_64_NVIDIA"] = Field("AL2023_x86_64_NVIDIA",
                                                                          examples=["AL2023_ARM_64_NVIDIA"])
    """Created cluster: the EKS AMI family, x86_64 or Arm (Graviton with NVIDIA GPUs)."""
    ami_release: str | None = None
    """EKS AMI release (e.g. v20260512): pins the NVIDIA driver. Unpinned AMIs roll the driver under you."""
    capacity_type: Literal["ON_DEMAND", "SPOT"] = Field("ON_DEMAND", examples=["SPOT"])
    """SPOT is opt-in: a spot node gets two minutes' notice, which every pod's drain must fit."""
    provisioner: PoolProvisioner | None = Field(None, examples=["managedNodeGroup"])
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
    """Existing nodes, required: their GPU, a key of templates/compat/gpus.yaml (e.g. l4, a10g, rtx-4060-laptop)."""
    gpus_per_node: int | None = Field(None, ge=1, le=16)
    """Existing nodes: GPUs in each node (default 1)."""
    driver_version: DriverVersion | None = None
    """Existing nodes, required: the NVIDIA driver they run, as `nvidia-smi` prints it; checked against the serving
    image's CUDA."""
    nodes: list[str] = []
    """Existing node names to label (and taint) as this pool; min and max default to how many are listed."""
    # both
    min: int = Field(0, ge=0)
    """Fewest nodes: 0 on a Karpenter pool (it launches nodes for pending pods); a managed node group is fixed, min
    == max; existing nodes: at least 1 unless the cluster's provisioner adds nodes."""
    max: int = Field(1, ge=0)
    """Most nodes of the pool: what its replicas, a rollout's surge and a RayService upgrade must fit in."""
    taint: bool = True
    """Taint the nodes with nvidia.com/gpu:NoSchedule. Only a single-node cluster should turn this off."""
    time_slicing: TimeSlicing | None = None
    """Share each GPU between several pods (the device plugin's time-slicing): for small models only."""
    efa: bool = False
    """Created cluster, Karpenter pool of an EFA instance type (p4d, p4de, p5, p5e): the pods of a replica across
    nodes get every EFA interface of their node, through the EFA device plugin; the nodes get no public address
    and a security group open to itself."""
    placement_group: bool = False
    """With efa: a cluster placement group Triarch creates for the pool, so its nodes sit close on the network. A
    cluster placement group lives in one zone: the pool's `zones` must name exactly one."""
    fast_image_pull: bool | None = Field(None, examples=[False])
    """Created cluster: containerd pulls and unpacks an image's layers in parallel (the AMI's SOCI snapshotter,
    nodeadm's FastImagePull), about twice as fast for a 10+ GB serving image. Default: on where the AMI release has
    it (v20250821 or later) and the instance has 4+ vCPUs and 7+ GiB, which every GPU type here has."""
    instance_store: bool | None = Field(None, examples=[False])
    """Created cluster: the instance's local NVMe, as one RAID0 array, holds containerd's images and the kubelet's
    files (Karpenter's instanceStorePolicy; nodeadm's localStorage for a managed node group), so image layers are
    not written to the network-attached root volume. Default: on where the instance type has an instance store."""
    disk_throughput_mib_s: int | None = Field(None, ge=125, le=1000, alias="diskThroughputMiBps", examples=[1000])
    """Created cluster: the gp3 root volume's throughput. Default: 600 MiB/s where images are unpacked on it in
    parallel (fastImagePull without instanceStore), which the AMI's docs name as the floor for that mode; else
    gp3's included 125."""
    reservations: list[CapacityReservationConfig] = Field([], max_length=30, examples=[
        [{"id": "cr-0123456789abcdef0", "count": 2}]])
    """Created cluster, Karpenter pool: EC2 capacity reservations and Capacity Blocks its nodes launch into first
    (Karpenter's `reserved` capacity type, ahead of capacityType), at most 30 (Karpenter's limit). The reservations'
    instance type must be the pool's."""
    reserved_only: bool = Field(False, examples=[True])
    """With reservations: launch only into them (the NodePool's capacity type is `reserved` alone); pods beyond
    them wait Pending. Default: on capacityType once the reservations are full."""

    @model_validator(mode="before")
    @classmethod
    def _listed_nodes_are_the_pool(cls, value: Any) -> Any:
        """Listed nodes exist: unless told otherwise, the pool is exactly those nodes, never empty."""
        if isinstance(value, Mapping) and isinstance(value.get("nodes"), list) and value["nodes"]:
            listed = len(value["nodes"])
            return {"min": listed, "max": listed, **value}
        return value


class AutoscalingConfig(_Model):
    """Replicas follow the load: Ray Serve's autoscaler (engine ray-serve) or KEDA on vLLM's queue (engine vllm)."""

    min: int = Field(1, ge=0, examples=[1])
    """Fewest replicas; 0 (ray-serve only) lets the model scale to zero and cold-start on the next request."""
    max: int = Field(ge=1, examples=[4])
    """Most replicas; the pool's max must hold them."""


RAY_EVICTION_THRESHOLD_CHARS = 400_000
"""PrefixCacheAffinityRouter's eviction_threshold_chars default (Ray 2.60, prefix_aware_router.py initialize_state),
which Triarch replaces with one from the replica's KV cache (planners/router_memory.py)."""


class PrefixRoutingConfig(_Model):
    """Ray Serve's prefix-aware router for a ray-serve model (Ray 2.60's PrefixCacheAffinityRouter): a request goes
    to the replica whose earlier requests shared the longest start of its prompt, so that replica's vLLM prefix cache
    answers the shared part instead of computing it again. Defaults: the router's own (Ray 2.60,
    prefix_aware_router.py, initialize_state), except where a key says Triarch's."""

    enabled: bool = Field(True, examples=[False])
    """false: Ray Serve's default router (the less busy of two random replicas). Default: on for a generate model
    on engine ray-serve with prefixCaching on and more than one replica at most."""
    imbalanced_threshold: int | None = Field(None, ge=0, examples=[32])
    """Requests in flight by which the busiest replica may lead the least busy before the router stops following
    prefixes and balances load; below each replica's batch (max_num_seqs, its max_ongoing_requests), or it never
    balances. Default (Triarch's): half the tuned batch, rounded down (0 at batch 1: any difference balances); Ray's
    own default is never to balance."""
    match_rate_threshold: float | None = Field(None, ge=0, le=1, examples=[0.2])
    """Below this share of the prompt matched, the router sends the request to the replica that remembers the
    least text. Ray's default: 0.1."""
    eviction: bool = Field(True, examples=[False])
    """Forget each replica's least recently routed prompts past evictionThresholdChars (Triarch's default; Ray's
    is never to forget, and the router's prefix tree, in a Ray actor, then grows with every prompt)."""
    eviction_threshold_chars: int | None = Field(None, ge=1, examples=[2_000_000])
    """Characters of prompts remembered per replica above which the oldest are forgotten. Default (Triarch's): what
    the replica's KV cache holds, its tuned tokens at 4 characters each (vLLM keeps a prefix only while its cache
    does); Ray's own default is 400000 whatever the replica."""
    eviction_target_chars: int | None = Field(None, ge=1, examples=[1_800_000])
    """What each replica's remembered prompts are cut back to, at most evictionThresholdChars. Default: 0.9 of the
    threshold (Ray's own share: 360000 of 400000)."""
    eviction_interval_seconds: int | None = Field(None, ge=1, examples=[30])
    """How often the prefix tree forgets. Ray's default: 10."""


DEFAULT_KV_CONNECTOR = "NixlConnector"
"""vLLM's NIXL connector (vllm/distributed/kv_transfer/kv_connector/factory.py, 0.29.0), for which Ray 2.60 has its
own backend (ray/llm/_internal/serve/engines/vllm/kv_transfer/factory.py BUILTIN_BACKENDS): it sets each replica's
side channel (VLLM_NIXL_SIDE_CHANNEL_HOST/PORT) and engine id."""


class RoleConfig(_Model):
    """One role of a split model: its replicas, the pool they run on and their tensor-parallel size. The tuner sizes
    the role's engine args on that pool."""

    replicas: int = Field(1, ge=1, le=64, examples=[2])
    """Fixed number of this role's replicas (Ray Serve deployments `Prefill:<model>` and `Decode:<model>`), without
    autoscaling."""
    node_group: str | None = Field(None, examples=["h100"])
    """The nodeGroups[].name of the pool this role runs on. Default: the model's nodeGroup."""
    tensor_parallel_size: int | None = Field(None, ge=1, le=16, examples=[2])
    """GPUs one replica of this role splits each layer over, within a node. Default: the tuner's choice on the
    role's pool."""
    autoscaling: AutoscalingConfig | None = Field(None, examples=[{"min": 1, "max": 4}])
    """This role's replicas between min and max by its own load, instead of the fixed `replicas`: Ray Serve's
    autoscaler on the role's deployment (Ray 2.60 takes each LLMConfig's deployment_config), so prompts queued for
    prefill add prefill replicas and generations in flight add decode replicas."""


class PrefillRoleConfig(RoleConfig):
    """The prefill role of a split model, which the tuner sizes from the prompts it expects."""

    prompt_length: int | None = Field(None, ge=16, le=1_048_576, examples=[8000])
    """A typical prompt's length in tokens. The role's batch (max_num_seqs) is the prompts of this length its KV
    cache holds, and its step (max_num_batched_tokens) at least one of them, so a typical prompt is computed in one
    step.
    Default: 2048 for the batch (the tuner's typical request), 16384 for the step (vLLM's advice for throughput,
    templates/compat/prefill-decode.yaml prefillStep). At most the decode role's maxModelLen."""


class DisaggregationConfig(_Model):
    """Prefill/decode split (engine ray-serve): Ray Serve LLM's P/D application (`build_pd_openai_app`, Ray 2.60)
    runs the model twice, prefill replicas that compute each prompt's KV cache and decode replicas that receive it
    over vLLM's KV connector and generate. Off unless a model asks for it; docs/prefill-decode.md says when it pays."""

    enabled: bool = Field(True, examples=[False])
    """false: the model is served whole again (one Ray Serve LLM application of `replicas` replicas)."""
    connector: str = Field(DEFAULT_KV_CONNECTOR, examples=["NixlConnector"])
    """vLLM's KV connector between the roles (kv_transfer_config.kv_connector), by the name vLLM registers it under:
    NixlConnector, over the NIXL backend `backend` names."""
    backend: Literal["UCX", "LIBFABRIC"] = Field("UCX", examples=["LIBFABRIC"])
    """NIXL's transport between the roles (kv_connector_extra_config.backends). UCX: vLLM's default, bundled with
    NIXL in the ray-llm image; between EFA pools it moves the KV cache over EFA where the image carries libefa,
    over TCP otherwise. LIBFABRIC: libfabric's EFA provider, only where both roles' pools have EFA and the image is
    known to carry the EFA installer (templates/compat/efa-images.yaml): its plugin cannot load without it."""
    prefill: PrefillRoleConfig = PrefillRoleConfig()
    """The prefill role: its replicas compute each prompt to its first token and hold its KV cache until a decode
    replica reads it. The tuner sizes it for throughput: a batch of the prompts its KV cache holds and steps of at
    least 16384 tokens."""
    decode: RoleConfig = RoleConfig()
    """The decode role: its replicas hold every running request's KV cache, so the tuner gives them the model's
    whole batch."""


class KvOffloadConfig(_Model):
    """KV cache offload to host memory: vLLM's native offloading keeps KV blocks that leave the GPUs in a buffer of
    the node's memory (the pod's memory-backed /dev/shm), so a prompt whose start was evicted from the GPUs is loaded
    back instead of computed again. Costs nothing beyond the node: its memory is in the node's price."""

    enabled: bool = Field(True, examples=[False])
    """false: no offload (the same as leaving kvOffload out)."""
    size_gib: int | None = Field(None, ge=1, le=16384, alias="sizeGiB", examples=[64])
    """GiB of host memory for one replica, all its GPUs together (vLLM's --kv-offloading-size), committed when the
    replica starts. Default: what the pod may take of its share of the node after the node's system reserve, less
    the memory the engine keeps (docs/tuning.md, "KV offload to host memory"). Refused where the node cannot hold it
    beside the engine."""


S3_PREFIX = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[\w./=+-]*)?$"
"""An S3 bucket and optional prefix (weightsUri, adapters[].s3)."""


class HubAdapter(_Model):
    """A LoRA adapter on the Hugging Face Hub, at a commit."""

    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")] = Field(examples=["my-org/support-lora"])
    """The adapter's repo id."""
    revision: Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")] = Field(
        examples=["0123456789abcdef0123456789abcdef01234567"])
    """The commit (40 hex digits) the pods download (vLLM's own Hub resolver takes no revision, so Triarch fetches
    it before vLLM starts). Required: a branch would move under running replicas."""


class AdapterConfig(_Model):
    """One LoRA adapter of the model, served under its own name beside the base model (docs/adapters.md)."""

    name: DnsLabel = Field(examples=["support"])
    """The name clients call the adapter by (the `model` of a request; engine ray-serve: `<model>:<name>`)."""
    hub: HubAdapter | None = Field(None, examples=[{"id": "my-org/support-lora",
                                                    "revision": "0123456789abcdef0123456789abcdef01234567"}])
    """Engine vllm: the adapter on the Hub, downloaded at that commit into the model cache before vLLM starts and
    loaded at start (--lora-modules). Either hub or s3."""
    s3: Annotated[str, Field(pattern=S3_PREFIX)] | None = Field(None, examples=["s3://my-bucket/adapters/support"])
    """Engine ray-serve: the adapter's S3 prefix, `<root>/<name>` with one root for all of a model's adapters (Ray
    Serve LLM 2.60's lora_config.dynamic_lora_loading_path, which loads `<root>/<adapter>` on a replica's first
    request for it); the pods read it through the same role as S3 weights. Either hub or s3."""
    rank: int = Field(ge=1, le=512, examples=[16])
    """The adapter's LoRA rank (`r` of its adapter_config.json). The slots every replica reserves are sized for the
    largest rank, rounded up to a --max-lora-rank vLLM takes (1, 8, 16, 32, 64, 128, 256, 320, 512)."""

    @model_validator(mode="after")
    def _one_source(self) -> AdapterConfig:
        if (self.hub is None) == (self.s3 is None):
            raise ValueError("give either hub: {id, revision} or s3: s3://bucket/prefix")
        return self


class ModelConfig(_Model):
    """One served model; its workload is placed on one node group, its engine args come from the tuner."""

    name: DnsLabel
    """The model's name: its Service, the name clients call it by (--served-model-name) and the names of its objects.
    A rename is a new model to clients."""
    model: Annotated[str, Field(pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")]
    """Hugging Face repo id: a model of templates/models, or any model of an architecture the tuner knows, read from
    the Hub (or given by modelConfig)."""
    model_config_path: str | None = Field(None, alias="modelConfig", examples=["models/my-org-model/config.json"])
    """Path (relative to the project) of the model's config.json, for models outside templates/models where the
    Hugging Face Hub cannot be reached (elsewhere Triarch reads it from the Hub: `triarch model fetch`)."""
    revision: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$", max_length=255)] | None = Field(
        None, examples=["0123456789abcdef0123456789abcdef01234567"])
    """The model's revision on the Hub: a commit (40 hex digits), or a branch or tag, which can move. The tuner
    sizes that revision's files (read from the Hub, even for a model of templates/models) and vLLM loads the commit
    the plan read (--revision). Default: none; the plan sizes the Hub's main as it is then, says which commit that
    was, and vLLM loads main as it is when a pod starts."""
    engine: Literal["vllm", "ray-serve"]
    """vllm: a Deployment of `vllm serve` (a LeaderWorkerSet across nodes) behind its own Service; ray-serve: a Ray
    Serve LLM application in the RayService of its pool's worker group."""
    node_group: str
    """The nodeGroups[].name of the pool the model runs on."""
    task: Literal["generate", "embed"] | None = Field(None, examples=["embed"])
    """Default: embed for models whose name says Embedding, generate otherwise."""
    replicas: int = Field(1, ge=1, le=64)
    """Fixed number of replicas (without autoscaling); each holds tensor x pipeline GPUs."""
    tensor_parallel_size: int | None = Field(None, ge=1, le=16)
    """GPUs one pipeline stage splits each layer over, within a node. Default: the tuner's choice."""
    pipeline_parallel_size: int | None = Field(None, ge=1, le=64)
    """Stages the layers are split into. A replica of tensor x pipeline GPUs beyond one node's spans whole nodes
    (a LeaderWorkerSet group for engine vllm, one Ray Serve placement group for ray-serve). Default: 1, or as many
    nodes as the tuner needs to hold the model."""
    max_model_len: int | None = Field(None, ge=128)
    """Longest request in tokens (prompt and output). Default: the longest the KV cache holds at a useful batch,
    capped by the model's own; `triarch plan` says when and why it capped."""
    gpu_memory_utilization: float = Field(0.92, gt=0.1, le=0.95, examples=[0.9])
    """vLLM's default since 0.20; above 0.95 leaves too little for CUDA graphs and fragmentation."""
    kv_cache_dtype: Literal["auto", "fp8"] = Field("auto", examples=["fp8"])
    """fp8 halves the KV cache's memory (twice the tokens or batch) for a small loss of accuracy."""
    autoscaling: AutoscalingConfig | None = None
    """Replicas between min and max by load, instead of the fixed `replicas`."""
    route_prefix: Annotated[str, Field(pattern=r"^/[a-z0-9/_-]*$")] | None = Field(None, examples=["/chat"])
    """Ray Serve route prefix (ray-serve engine); default /<name>."""
    startup_minutes: int | None = Field(None, ge=1, le=240, examples=[45])
    """How long the startup probe waits for the weights to load and vLLM to start before restarting the container.
    Default: the cold-start prediction's slow end with a margin (`triarch plan` shows both); a value below the
    prediction is refused."""
    weights_uri: Annotated[str, Field(pattern=S3_PREFIX)] | None = None
    """s3://bucket/prefix holding the model's files (config, tokenizer, safetensors), which vLLM streams
    into the GPUs with the Run:ai Model Streamer (--load-format runai_streamer) instead of downloading them from the
    hub into the model cache (engine ray-serve: Ray Serve LLM's model_source, which it hands to vLLM without a
    download). The pods read it through a role: on a created cluster one Triarch makes, scoped to the prefix (a Ray
    worker group's to its models' prefixes); on an adopted one triarch:serving.weightsRoleArn."""
    warm_replicas: int = Field(0, ge=0, le=16, examples=[1])
    """Replicas' worth of GPU capacity kept running empty beside the model's own, so a scale-up or a replacement
    skips the node's launch (and, with placeholder pods, the image pull). Billed as the nodes it keeps."""
    ttft_slo_seconds: float | None = Field(None, gt=0, le=600, alias="timeToFirstTokenSloSeconds")
    """Alert when the p90 time to first token stays above this (with observability.prometheus)."""
    cache_gib: int | None = Field(None, ge=1, le=4096, alias="cacheGiB", examples=[200])
    """Size of the Hugging Face cache volume; default twice the weights, at least 20 GiB."""
    prefix_caching: bool = Field(True, examples=[False])
    """vLLM's automatic prefix caching: a request whose prompt starts like an earlier one reuses that start's KV
    cache instead of computing it again. On by vLLM's default for every generate model Triarch sizes (0.29.0 and
    0.33.0, ModelConfig.is_prefix_caching_supported); false turns it off (enable_prefix_caching: false,
    `--no-enable-prefix-caching`)."""
    prefix_routing: PrefixRoutingConfig | None = Field(None, examples=[{"enabled": False}])
    """Route each request to the replica most likely to hold its prompt's start in its prefix cache. Engine
    ray-serve: Ray Serve's router, tuned by the keys below; default on where it can pay, a generate model with
    prefixCaching on and more than one replica at most. Engine vllm: only `enabled`; true puts llm-d-router's
    endpoint picker (an InferencePool over the model's pods, with an Envoy proxy) in front of them, and the model's
    Service moves to the proxy; default off (it adds a pod on the system nodes); refused for a replica across nodes
    (a LeaderWorkerSet), whose workers the picker would route to too."""

    disaggregation: DisaggregationConfig | None = Field(
        None, examples=[{"prefill": {"replicas": 1}, "decode": {"replicas": 2}}])
    """Split prefill from decode (engine ray-serve, generate models): each role its own replicas (fixed, or
    autoscaling on its own load), pool and engine args, the KV cache handed over by vLLM's NIXL connector. Default:
    off. Replaces the model's `replicas` and `autoscaling`."""
    kv_offload: KvOffloadConfig | None = Field(None, examples=[{"sizeGiB": 64}])
    """Offload the KV cache to the node's memory (vLLM's native offloading, both engines; a split's roles each on
    their own pool, beside NIXL in a MultiConnector). `{}` sizes it from the node's memory; `sizeGiB` fixes it. The
    pod gets a memory-backed /dev/shm of that size and its memory request and limit raised to match. Default: off.
    Refused on a vLLM release without --kv-offloading-size and for a replica across nodes."""
    adapters: list[AdapterConfig] = Field([], max_length=64, examples=[
        [{"name": "support", "rank": 16, "hub": {"id": "my-org/support-lora",
                                                 "revision": "0123456789abcdef0123456789abcdef01234567"}}]])
    """LoRA adapters served beside the model (generate models on one node per replica): vLLM's --enable-lora with a
    slot for each adapter (--max-loras) of the largest rank (--max-lora-rank), whose memory the tuner takes out
    before the KV cache. Engine vllm: Hub adapters, loaded at start; engine ray-serve: S3 adapters under one root,
    loaded on first use (lora_config). Default: none."""

    @property
    def resolved_task(self) -> Literal["generate", "embed"]:
        if self.task is not None:
            return self.task
        return "embed" if "embedding" in self.model.lower() else "generate"


class StackConfig(_Model):
    """A whole stack: the cluster, its GPU pools, the models they serve and the platform around them."""

    aws_region: str | None = None
    """aws:region: where a created cluster lives."""
    cluster: ClusterConfig
    """The cluster: created on EKS, or adopted through a kubeconfig context."""
    node_groups: list[NodeGroupConfig] = Field(min_length=1)
    """The GPU pools, one or more: each a set of identical GPU nodes, labelled and tainted."""
    models: list[ModelConfig] = []
    """The served models, each on one pool."""
    images: ImagesConfig = ImagesConfig()
    registry: RegistryConfig = RegistryConfig()
    device_plugin: DevicePluginConfig = DevicePluginConfig()
    kuberay: KubeRayConfig = KubeRayConfig()
    leader_worker_set: LeaderWorkerSetConfig = LeaderWorkerSetConfig()
    serving: ServingConfig = ServingConfig()
    observability: ObservabilityConfig = ObservabilityConfig()

    @model_validator(mode="before")
    @classmethod
    def _system_nodes_hold_the_ray_head(cls, value: Any) -> Any:
        """The system nodes' default type grows to hold a Ray head when a model needs one."""
        if not isinstance(value, Mapping):
            return value
        models, cluster = value.get("models"), value.get("cluster")
        ray = isinstance(models, list) and any(isinstance(m, Mapping) and m.get("engine") == "ray-serve"
                                               for m in models)
        if not (ray and isinstance(cluster, Mapping) and cluster.get("create") is True):
            return value
        system = cluster.get("systemNodeGroup", {})
        if not isinstance(system, Mapping) or "instanceType" in system:
            return value
        system = {**system, "instanceType": RAY_HEAD_SYSTEM_INSTANCE}
        return {**value, "cluster": {**cluster, "systemNodeGroup": system}}

    def node_group(self, name: str) -> NodeGroupConfig:
        return next(group for group in self.node_groups if group.name == name)

    def node_group_key(self, name: str) -> str:
        """The key path of a node group, for a message: `triarch:nodeGroups[<its index>]`."""
        return f"triarch:nodeGroups[{next(i for i, g in enumerate(self.node_groups) if g.name == name)}]"

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
