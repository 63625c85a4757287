"""Errors a user can fix: one line naming the key path, the bad value and what is allowed (exit code 2)."""

from __future__ import annotations

import re
from typing import Any

EXIT_USAGE = 2

SECRET_LIKE = re.compile(r"token|key|password|secret|credential", re.IGNORECASE)
"""A key whose name says it holds a secret: its value is never written into a message (CI logs keep them)."""
TOKEN_LIKE = re.compile(r"\b(hf_|ghp_|gho_|github_pat_|sk-|AKIA|ASIA|xox[bp]-)[A-Za-z0-9_\-]{8,}")
"""Values shaped like well-known tokens (Hugging Face, GitHub, OpenAI-style, AWS access keys, Slack), withheld
even under a key that is not secret-like: a token pasted into the wrong key must not reach a log."""


class TriarchError(Exception):
    """A mistake in the stack's input, caught before any resource is registered."""


class ConfigError(TriarchError):
    """`<path>: <value> <problem>; allowed: <what is>`. The value is left out where it must not be repeated: a key
    that is not Triarch's (it may be a secret put in the wrong place) or whose name says it is secret."""

    def __init__(self, path: str, value: Any, problem: str, allowed: str | None = None, *,
                 show_value: bool = True) -> None:
        self.path, self.value, self.problem, self.allowed = path, value, problem, allowed
        last = re.split(r"[.:\[]", path)[-1]
        shown = show_value and value is not None and not SECRET_LIKE.search(last)
        text = f"{path}: {_show(value)} {problem}" if shown else f"{path}: {problem}"
        if allowed:
            text += f"; allowed: {allowed}"
        super().__init__(text)


class MatrixError(TriarchError):
    """A node's NVIDIA driver or GPU cannot run a serving image's CUDA."""


def _show(value: Any) -> str:
    text = repr(value)
    if TOKEN_LIKE.search(text):
        return "<a value shaped like a token, not shown>"
    return text if len(text) <= 80 else text[:77] + "..."
