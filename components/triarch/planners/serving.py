"""Stack-wide serving decisions: the namespace of the workloads and the storage of their model caches."""

from __future__ import annotations

from triarch.config import StackConfig
from triarch.planners import pods

EFS_STORAGE_CLASS = "triarch-efs"
"""The shared-filesystem class a created cluster gets, so every replica reads one model cache."""


def serving_settings(stack: StackConfig, with_token: bool) -> pods.ServingSettings:
    serving = stack.serving
    created = stack.cluster.create
    storage_class = serving.storage_class or (EFS_STORAGE_CLASS if created else None)
    access_mode = serving.access_mode or ("ReadWriteMany" if created else "ReadWriteOnce")
    return pods.ServingSettings(serving.namespace, storage_class, access_mode, with_token)
