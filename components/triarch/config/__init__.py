"""The stack config: its schema (`schema`, `platform`), the checks that span fields (`checks`, `pools`) and the
reading of Pulumi config with its messages (`reading`). Import from here."""

from triarch.config.base import NAMESPACE, SECRET_KEYS, key_path
from triarch.config.checks import check_stack
from triarch.config.platform import (
    ComponentMode,
    DevicePluginConfig,
    ImagePin,
    ImagesConfig,
    KubeRayConfig,
    LeaderWorkerSetConfig,
    ObservabilityConfig,
    RegistryConfig,
    ServingConfig,
)
from triarch.config.pools import (
    EKS_NODE_GROUP_NAME_MAX,
    NODE_GROUP_NAME_HASH,
    SYSTEM_RELEASE_TABLE,
    driver_of,
    gpu_of,
    gpus_per_node,
    pool_provisioner,
)
from triarch.config.reading import TOP_LEVEL_KEYS, from_pulumi_config
from triarch.config.schema import (
    SUPPORTED_KUBERNETES,
    UPSTREAM_IMAGES,
    AutoscalingConfig,
    CapacityReservationConfig,
    ClusterConfig,
    ModelConfig,
    NodeGroupConfig,
    NodeProvisioner,
    PoolProvisioner,
    StackConfig,
    SystemNodeGroup,
    TimeSlicing,
    admin_key,
)

__all__ = [
    "EKS_NODE_GROUP_NAME_MAX", "NAMESPACE", "NODE_GROUP_NAME_HASH", "SECRET_KEYS", "SUPPORTED_KUBERNETES",
    "SYSTEM_RELEASE_TABLE", "TOP_LEVEL_KEYS", "UPSTREAM_IMAGES", "AutoscalingConfig",
    "CapacityReservationConfig", "ClusterConfig",
    "ComponentMode", "DevicePluginConfig", "ImagePin", "ImagesConfig", "KubeRayConfig", "LeaderWorkerSetConfig",
    "ModelConfig", "NodeGroupConfig", "NodeProvisioner", "ObservabilityConfig", "PoolProvisioner",
    "RegistryConfig", "ServingConfig", "StackConfig", "SystemNodeGroup", "TimeSlicing", "admin_key",
    "check_stack", "driver_of", "from_pulumi_config", "gpu_of", "gpus_per_node", "key_path", "pool_provisioner",
]
