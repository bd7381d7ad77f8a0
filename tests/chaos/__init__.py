"""Fault injection against a real local control plane: `make chaos` (hack/chaos.py) and, with small
counts, tests/integration/test_chaos_short.py. Scenarios live in scenarios/ (one module each), the invariants every
scenario must keep in invariants.py; docs/chaos.md says what each one proves."""
