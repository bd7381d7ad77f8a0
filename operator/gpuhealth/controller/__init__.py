"""The operator's side effects, in four rooms by concern. Data flows intake -> state -> act:

- ``state``: the store of slim objects (and the slim shapes it keeps) and decision records, the
  per-policy tallies, the breaker: what the operator knows and may still do.
- ``intake``: the watches (one list-then-watch reflector, its instances), the feeders that put
  what they bring into the state and queue the nodes it touches, the work queue: what the API
  server says, reduced to what is read. It fills ``state``, so it sits above it.
- ``act``: the reconcilers, drainers, repairs, admission check, policy status, Events: the writes,
  each room planned by a pure function below ``controller`` and written in an order that survives
  a kill at any line.
- ``process``: Kopf wiring, the runtime that builds the rooms and runs their workers, leadership,
  the command line.

Beside them, shared by every room: ``metrics`` (the Prometheus families) and ``backoff`` (the one
retry formula). Every API call goes through ``gpuhealth.kube.aio.AsyncKube``. A room imports only
the rooms before it (state < intake < act < process) and the shared modules;
``tests/unit/test_layers.py`` holds it to that.
"""
