"""A slim list-then-watch of the agents' node Leases: heartbeats that cost no reconcile.

Each agent renews a `coordination.k8s.io/v1` Lease named after its node every heartbeat (30 s),
and writes its GPUNodeHealth report only when a fact changes. A renewal is a sign of life and
nothing else: the runtime folds it into the freshness record (by the operator's clock) and queues
the node only where a sign of life can change the verdict (Unknown, or no verdict yet). So a
steady fleet's heartbeats cost the operator no reconcile and no write, and the agents' silence is
still measured by the sweeper from the last renewal or report change.

Only the Leases labelled by the agents are watched (label selector, server-side), in one
namespace (the agents'). Each is slimmed to name, uid and ``renewTime`` as soon as it is parsed.
The protocol is the pod reflector's (``podwatch.py``): list (paged) for a resourceVersion, watch
from there with bookmarks, resume after a dropped connection, list again on 410 Gone, retry errors
with growing delays.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuhealth.api.names import AGENT_LEASE_SELECTOR
from gpuhealth.controller import metrics
from gpuhealth.controller.backoff import growing_delay
from gpuhealth.controller.podwatch import Gone, WatchError
from gpuhealth.kube.errors import status_of

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 300
RETRY_BASE_S, RETRY_MAX_S = 0.5, 5.0


class LeaseSource(Protocol):
    def list_leases_rv(
        self, namespace: str, label_selector: str, transform: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], str]: ...

    def watch_leases(
        self, namespace: str, label_selector: str, resource_version: str, timeout_s: int
    ) -> Iterator[dict[str, Any]]: ...


def slim_lease(body: Mapping[str, Any]) -> dict[str, Any]:
    """Name, uid and the renewal time: all that freshness reads."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    return {
        "metadata": {k: meta[k] for k in ("name", "uid", "resourceVersion") if k in meta},
        "spec": {"renewTime": spec.get("renewTime")},
    }


@dataclass
class LeaseWatch:
    """Feeds ``on_event(type, slim_lease)`` and ``on_replace(slim_leases)`` on ``loop``, from a thread."""

    source: LeaseSource
    namespace: str
    on_event: Callable[[str, dict[str, Any]], None]
    on_replace: Callable[[list[dict[str, Any]]], None]
    selector: str = AGENT_LEASE_SELECTOR
    resource_version: str = ""
    stopping: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def list(self) -> list[dict[str, Any]]:
        """The initial (or a fresh) full list; the watch continues from its resourceVersion."""
        leases, self.resource_version = self.source.list_leases_rv(self.namespace, self.selector, slim_lease)
        return leases

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._thread = threading.Thread(target=self._run, args=(loop,), name="lease-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        failures = 0
        while not self.stopping.is_set():
            try:
                if not self.resource_version:
                    loop.call_soon_threadsafe(self.on_replace, self.list())
                started, seen = time.monotonic(), False
                events = self.source.watch_leases(self.namespace, self.selector, self.resource_version, WATCH_TIMEOUT_S)
                for kind, lease in self.follow(events):
                    loop.call_soon_threadsafe(self.on_event, kind, lease)
                    failures, seen = 0, True
                    if self.stopping.is_set():
                        return
                if not seen and time.monotonic() - started < 1.0:
                    failures += 1  # closed at once with nothing in it: never reconnect in a tight loop
                    self.stopping.wait(growing_delay(failures, RETRY_BASE_S, RETRY_MAX_S))
            except Gone:
                log.info("lease watch: resourceVersion %s expired; listing again", self.resource_version)
                self.resource_version = ""
            except Exception as e:
                if self.stopping.is_set() or loop.is_closed():
                    return
                failures += 1
                delay = growing_delay(failures, RETRY_BASE_S, RETRY_MAX_S)
                metrics.LEASE_WATCH_ERRORS.inc()
                if status_of(e) == 410:
                    self.resource_version = ""
                    continue
                log.warning("lease watch failed (%s); resuming in %.1fs", e, delay)
                self.stopping.wait(delay)

    def follow(self, events: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
        """Turn raw watch events into (type, slim lease), keeping the resourceVersion to resume from."""
        for ev in events:
            kind = ev.get("type")
            obj = ev.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Gone(obj.get("message", "410 Gone"))
                raise WatchError(f"watch error {obj.get('code')}: {obj.get('message')}")
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if rv:
                self.resource_version = str(rv)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                yield kind, slim_lease(obj)
