"""Reading the project's own YAML data files (templates/, tools/) and the pinned reference data (CRDs): libyaml's
parser where PyYAML has it.

Every `triarch` process, Pulumi program and policy pack reads the compat tables at start; PyYAML's pure-Python parser
spent most of a second of each plan's CPU on them, and 15 seconds on the CRDs a local plane installs. The C parser
builds the same values (the same safe constructor and resolver on top). A stack file, a manifest or a values file a
user wrote is not read here: its errors name lines through its own loader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(path: Path) -> Any:
    """One YAML document of a data file the project ships."""
    with path.open(encoding="utf-8") as handle:
        return yaml.load(handle, Loader=_LOADER)


def read_yaml_documents(path: Path) -> list[Any]:
    """Every YAML document of a multi-document data file (a CRD file, a chart's manifests)."""
    with path.open(encoding="utf-8") as handle:
        return list(yaml.load_all(handle, Loader=_LOADER))
