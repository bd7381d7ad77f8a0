"""Every request the operator makes has a deadline, and every response goes back to the pool.

The Kubernetes client waits forever by default: a request whose answer never comes (a half-open
connection after a network partition or an API server failover, a server that stalls) holds the
node it was made for in its reconcile for as long as the process lives, since a key is processed
by one worker at a time (``controller/intake/workqueue.py``). With a deadline the call fails, the
reconcile is retried with growing delays and the warning names the node. Watches bring their own
(``watches.py``: the server ends them at their timeout, the client gives up 30 s later).

Calls made with ``_preload_content=False`` whose body nobody reads (patches and deletes answered
with the object, evictions, Events) are read and released here too, so their connection is reused
instead of being dropped when the response is collected (one new TLS handshake per eviction).
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

CONNECT_S = 10.0
READ_S = 30.0  # as Kopf's own requests here (settings.networking.request_timeout); lists are paged, writes idempotent


def bounded(api: client.ApiClient, connect_s: float = CONNECT_S, read_s: float = READ_S) -> client.ApiClient:
    """``api`` with a default ``_request_timeout`` on every request that does not set its own."""
    rest = api.rest_client
    plain = rest.request

    def request(*args: Any, **kw: Any) -> Any:
        if not kw.get("_request_timeout"):
            kw["_request_timeout"] = (connect_s, read_s)
        return plain(*args, **kw)

    rest.request = request  # GET/POST/PATCH/... call self.request: the instance attribute wins
    return api


def drained(resp: Any) -> None:
    """Read and release an unparsed response whose body the caller does not need (anything else, such
    as a test double's answer, is left alone)."""
    read, release = getattr(resp, "read", None), getattr(resp, "release_conn", None)
    try:
        if read is not None:
            read()
    finally:
        if release is not None:
            release()
