"""A plane for a stack: what `triarch local up --stack NAME` starts (the stack's nodes, the CRDs of the components
it says the cluster runs, the kubeconfig path and context it names), and which planes are up."""

from __future__ import annotations

from pathlib import Path

from triarch.catalog import catalog
from triarch.config import StackConfig
from triarch.local.crds import CRD_SETS, crd_files, existing_crd_sets
from triarch.local.nodes import plane_nodes
from triarch.local.plane import STORAGE_CLASS, PlaneError, PlaneSpec, state_root


def spec_for_stack(name: str, stack: StackConfig, references: list[Path], all_crds: bool = False) -> PlaneSpec:
    """The plane an adopted stack's kubeconfig and context name (a created stack gets a context of its own, for
    dry runs of its objects)."""
    cluster = stack.cluster
    classes = [STORAGE_CLASS]
    if stack.serving.storage_class and stack.serving.storage_class not in classes:
        classes.append(stack.serving.storage_class)
    copy = Path(cluster.kubeconfig_path) if not cluster.create and cluster.kubeconfig else None
    return PlaneSpec(
        name=name,
        context=cluster.context or f"triarch-{name}",
        nodes=plane_nodes(stack, catalog()),
        crds=crd_files(list(CRD_SETS) if all_crds else existing_crd_sets(stack), references),
        storage_classes=tuple(classes),
        namespaces=(stack.observability.namespace,) if stack.prometheus == "existing" else (),
        kubeconfig_copy=copy,
    )


def planes_up() -> list[str]:
    root = state_root()
    return sorted(d.name for d in root.iterdir() if (d / "plane.json").is_file()) if root.is_dir() else []


def only_plane() -> str:
    """The plane a command means when it names none: the only one up."""
    up = planes_up()
    if len(up) == 1:
        return up[0]
    if not up:
        raise PlaneError("no local plane is up; start one with `triarch local up --stack lab`")
    raise PlaneError(f"{len(up)} local planes are up ({', '.join(up)}); name one with --name")
