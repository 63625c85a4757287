"""Errors a user can fix: one line naming the key path, the bad value and what is allowed (exit code 2)."""

from __future__ import annotations

from typing import Any

EXIT_USAGE = 2


class TriarchError(Exception):
    """A mistake in the stack's input, caught before any resource is registered."""


class ConfigError(TriarchError):
    def __init__(self, path: str, value: Any, problem: str, allowed: str | None = None) -> None:
        self.path, self.value, self.problem, self.allowed = path, value, problem, allowed
        text = f"{path}: {_show(value)} {problem}"
        if allowed:
            text += f"; allowed: {allowed}"
        super().__init__(text)


class MatrixError(TriarchError):
    """A node's NVIDIA driver or GPU cannot run a serving image's CUDA."""


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
