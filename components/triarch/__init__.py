"""Triarch: LLM inference on Kubernetes, with the three schedulers (Kubernetes, Ray, vLLM) kept apart."""
