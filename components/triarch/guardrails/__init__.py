"""The three-layer guardrails: plain functions over resource properties (dicts), so the same code runs inside
the Pulumi policy pack (policies/) and inside `triarch check`."""
