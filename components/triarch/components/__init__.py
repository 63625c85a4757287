"""Thin Pulumi components: each registers what a planner decided, parented, with an explicit provider."""
