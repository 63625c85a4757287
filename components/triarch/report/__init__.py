"""`triarch plan` and `triarch diff` for a reader: a stack file validated before the engine starts (validation),
registered under mocks and written out (planning), the plan summarised (summary), and a change between two plans
worded for a terminal or a comment (changes)."""
