"""Any Kubernetes YAML as the resources the guardrails read: files, directories (every .yaml, .yml and .json in
them, sorted) or `-` for standard input, multi-document streams and `kind: List` included. Each object becomes what
the policy pack sees for a Pulumi resource of that kind (type `kubernetes:<group/version>:<Kind>`, core/v1 for
the core group), so `triarch check --manifests` and the pack run the same rules."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from triarch.errors import TriarchError
from triarch.guardrails.base import Resource


class KubernetesYaml(yaml.SafeLoader):
    """YAML as Kubernetes reads it: a bare `=` is a string (an enum value in the Prometheus Operator's CRDs), not
    YAML 1.1's value tag, which PyYAML's safe loader refuses."""


def _string(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    return loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode) else loader.construct_object(node)


KubernetesYaml.add_constructor("tag:yaml.org,2002:value", _string)

SUFFIXES = (".yaml", ".yml", ".json")


def resource_type(api_version: str, kind: str) -> str:
    """'v1', 'Pod' -> 'kubernetes:core/v1:Pod'; 'apps/v1', 'Deployment' -> 'kubernetes:apps/v1:Deployment'."""
    group_version = api_version if "/" in api_version else f"core/{api_version}"
    return f"kubernetes:{group_version}:{kind}"


def _files(paths: Iterable[str]) -> Iterator[tuple[str, str]]:
    for given in paths:
        if given == "-":
            yield "<stdin>", sys.stdin.read()
            continue
        path = Path(given)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
            if not found:
                raise TriarchError(f"--manifests: {given!r} holds no .yaml, .yml or .json file; allowed: Kubernetes "
                                   "YAML files, directories of them, or - for standard input")
            for file in found:
                yield str(file), file.read_text(encoding="utf-8")
        elif path.is_file():
            yield str(path), path.read_text(encoding="utf-8")
        else:
            raise TriarchError(f"--manifests: {given!r} does not exist; allowed: Kubernetes YAML files, directories "
                               "of them, or - for standard input")


def _objects(document: Any) -> Iterator[dict[str, Any]]:
    if isinstance(document, dict) and document.get("kind") == "List" and isinstance(document.get("items"), list):
        for item in document["items"]:
            yield from _objects(item)
    elif isinstance(document, dict):
        yield document


def read_manifests(paths: Iterable[str]) -> list[Resource]:
    """Every Kubernetes object in `paths`; a document that is not YAML, or an object without apiVersion and kind,
    is refused naming the file (and the line)."""
    resources: list[Resource] = []
    for source, text in _files(paths):
        try:
            documents = list(yaml.load_all(text, Loader=KubernetesYaml))
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            raise TriarchError(f"--manifests: {source}{where} is not YAML ({getattr(error, 'problem', error)}); "
                               "allowed: Kubernetes YAML (helm template output, kubectl get -o yaml)") from None
        for index, document in enumerate(documents):
            for obj in _objects(document):
                api_version, kind = obj.get("apiVersion"), obj.get("kind")
                if not isinstance(api_version, str) or not isinstance(kind, str):
                    raise TriarchError(f"--manifests: {source} document {index + 1} has no apiVersion and kind; "
                                       "allowed: Kubernetes objects")
                name = str((obj.get("metadata") or {}).get("name") or f"{kind.lower()}-{index + 1}")
                resources.append(Resource(resource_type(api_version, kind), name, obj,
                                          f"{source}#{index + 1}:{kind}/{name}"))
    return resources
