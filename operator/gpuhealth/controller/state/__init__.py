"""What the operator knows and may still do: the store of slim objects (the slim shapes it keeps, in
``slim``), pod indexes and decision records, the per-policy tallies kept as they change, the
breaker's budgets and the capacity gauge read from the tallies. Imports only the controller's
shared modules."""
