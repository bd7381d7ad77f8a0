"""A slim list-then-watch of the agents' node Leases: heartbeats that cost no reconcile.

Each agent renews a `coordination.k8s.io/v1` Lease named after its node every heartbeat (30 s),
and writes its GPUNodeHealth report only when a fact changes. A renewal is a sign of life and
nothing else: the runtime folds it into the freshness record (by the operator's clock) and queues
the node only where a sign of life can change the verdict (Unknown, or no verdict yet). So a
steady fleet's heartbeats cost the operator no reconcile and no write, and the agents' silence is
still measured by the sweeper from the last renewal or report change.

Only the Leases labelled by the agents are watched (label selector, server-side), in one
namespace (the agents'). Each is slimmed to name, uid, ``renewTime`` and the API server's time of
that renewal (from ``managedFields``, for start-up freshness) as soon as it is parsed.
The protocol (list, watch with bookmarks, resume, list again on 410 Gone, growing retry delays) is
``reflector.py``'s.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuhealth.api.names import AGENT_LEASE_SELECTOR
from gpuhealth.controller import metrics
from gpuhealth.controller.reflector import WATCH_TIMEOUT_S, LoopReflector
from gpuhealth.evaluation.freshness import LEASE_HEARTBEAT, written


class LeaseSource(Protocol):
    def list_leases_rv(
        self, namespace: str, label_selector: str, transform: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], str]: ...

    def watch_leases(
        self, namespace: str, label_selector: str, resource_version: str, timeout_s: int
    ) -> Iterator[dict[str, Any]]: ...


def slim_lease(body: Mapping[str, Any]) -> dict[str, Any]:
    """Name, uid, the renewal time and the API server's time of it: all that freshness reads."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    slim_meta = {k: meta[k] for k in ("name", "uid", "resourceVersion") if k in meta}
    slim_meta.update(written(meta, LEASE_HEARTBEAT))
    return {"metadata": slim_meta, "spec": {LEASE_HEARTBEAT: spec.get(LEASE_HEARTBEAT)}}


Items = list[dict[str, Any]]  # (a name of its own: `list` is a method of the watch below)


@dataclass
class LeaseWatch(LoopReflector[dict[str, Any]]):
    """Feeds ``on_event(type, slim_lease)`` and ``on_replace(slim_leases)`` on ``loop``, from a thread."""

    source: LeaseSource
    namespace: str
    on_event: Callable[[str, dict[str, Any]], None]
    on_replace: Callable[[list[dict[str, Any]]], None]
    selector: str = AGENT_LEASE_SELECTOR
    resource_version: str = ""
    stopping: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    NAME = "lease-watch"

    def list(self) -> list[dict[str, Any]]:
        """The initial (or a fresh) full list; the watch continues from its resourceVersion."""
        leases, self.resource_version = self.source.list_leases_rv(self.namespace, self.selector, slim_lease)
        return leases

    def _list(self) -> Items:
        return self.list()

    def _watch(self) -> Iterable[Mapping[str, Any]]:
        return self.source.watch_leases(self.namespace, self.selector, self.resource_version, WATCH_TIMEOUT_S)

    def _slim(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        return slim_lease(obj)

    def _failed(self, e: BaseException) -> None:
        metrics.LEASE_WATCH_ERRORS.inc()
