"""What the tuner refuses, and why: one exception per kind of refusal, each message with the numbers."""

from __future__ import annotations

from triarch.errors import TriarchError


class TuneError(TriarchError):
    """No configuration of the model fits the GPU(s), or the model is one the tuner cannot size; the message says
    why with the numbers. `weights_alone`: the weights leave no room for any KV cache, so no KV setting helps."""

    def __init__(self, message: str, *, weights_alone: bool = False) -> None:
        super().__init__(message)
        self.weights_alone = weights_alone


class LengthRefused(TuneError):
    """An explicit max_model_len vLLM would refuse (beyond the context it derives, or beyond the KV cache)."""
