"""How a plan writes a value only the cloud knows: the one marker `triarch plan` writes (offline.py), `triarch diff`
compares and the guardrails refuse to judge."""

KNOWN_AFTER_APPLY = "<known after apply>"
