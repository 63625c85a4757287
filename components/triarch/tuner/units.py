"""Byte units the tuner reports in (vLLM's logs use binary GiB)."""

GIB = 1 << 30
MIB = 1 << 20
