"""The writes: the per-node and per-GPU reconcilers, DeviceTaintRules, drains, the repair ladder,
the Kueue admission check, policy status, report clean-up and Events. Each room takes what it
writes from a pure planner below ``controller`` and keeps the write order that survives a kill at
any line. Imports intake, state and the shared modules, never process."""
