"""Pure planners: stack config in, plain dicts out. No Pulumi here, so every decision is testable alone."""
