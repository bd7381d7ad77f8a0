"""What the operator knows and may still do: the store of slim objects, pod indexes and decision
records, the per-policy tallies kept as they change, the breaker's budgets and the capacity gauge
read from the tallies. Imports intake (the slim shapes) and the shared modules."""
