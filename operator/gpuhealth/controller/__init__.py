"""The operator's side effects, in four rooms by concern, in the order data flows through them:

- ``intake``: the watches (one list-then-watch reflector, its instances), the slim cache shapes,
  the work queue: what the API server says, reduced to what is read.
- ``state``: the store of slim objects and decision records, the per-policy tallies, the breaker:
  what the operator knows and may still do.
- ``act``: the reconcilers, drainers, repairs, admission check, policy status, Events: the writes,
  each room planned by a pure function below ``controller`` and written in an order that survives
  a kill at any line.
- ``process``: Kopf wiring, the runtime that builds the rooms and runs their workers, leadership,
  the feeders that route watch events into the state and the queue, the command line.

Beside them, shared by every room: ``metrics`` (the Prometheus families) and ``backoff`` (the one
retry formula). Every API call goes through ``gpuhealth.kube.aio.AsyncKube``. A room imports only
the rooms before it (intake < state < act < process) and the shared modules;
``tests/unit/test_layers.py`` holds it to that.
"""
