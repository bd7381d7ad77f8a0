"""Slim list-then-watch of the GPU Nodes and the agents' reports: the fleet, without Kopf's per-object work.

Every GPU node is two watched objects, its Node and its GPUNodeHealth report. Watched through Kopf,
each event's full body was wrapped, queued to a per-object worker and handed over whole; at start-up
Kopf listed both again after the runtime's own list, and processed every object of both. At 10,000
nodes that was most of the operator's peak memory and a second reconcile of the whole fleet
(docs/scaling.md). Here, as for pods (``podwatch.py``), each object is slimmed as soon as its line
is parsed (``slim.py``) and only that is handed to the runtime, on its event loop, in the order the
API sent it. The runtime's own start-up list gives the resourceVersion the watch starts from, so
the fleet is listed once. The protocol (list, watch with bookmarks, resume, list again on 410 Gone,
growing retry delays) is ``reflector.py``'s.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuhealth.controller import metrics
from gpuhealth.controller.reflector import WATCH_TIMEOUT_S, LoopReflector

Slim = Callable[[Mapping[str, Any]], dict[str, Any]]
Lister = Callable[[Slim], tuple[list[dict[str, Any]], str]]
Watcher = Callable[[str, int], Iterator[dict[str, Any]]]

Items = list[dict[str, Any]]  # (a name of its own: `list` is a method of the watch below)


@dataclass
class ObjectWatch(LoopReflector[dict[str, Any]]):
    """Feeds ``on_event(type, slim body)`` and ``on_replace(slim bodies)`` on ``loop``, from a thread.

    ``lister(slim)`` lists (paged, each item slimmed) and returns the list's resourceVersion;
    ``watcher(resource_version, timeout_s)`` yields the raw watch events from there.
    """

    kind: str  # "nodes" or "reports": the thread's name and the metric's label
    lister: Lister
    watcher: Watcher
    slim: Slim
    on_event: Callable[[str, dict[str, Any]], None]
    on_replace: Callable[[list[dict[str, Any]]], None]
    resource_version: str = ""
    stopping: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    # Reconnecting is one cheap request, and faults arrive through these: retry soon after an API comes back.
    RETRY_BASE_S, RETRY_MAX_S = 0.5, 5.0

    def __post_init__(self) -> None:
        self.NAME = f"{self.kind}-watch"

    def list(self) -> list[dict[str, Any]]:
        """The initial (or a fresh) full list; the watch continues from its resourceVersion."""
        items, self.resource_version = self.lister(self.slim)
        return items

    def _list(self) -> Items:
        return self.list()

    def _watch(self) -> Iterable[Mapping[str, Any]]:
        return self.watcher(self.resource_version, WATCH_TIMEOUT_S)

    def _slim(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        return self.slim(obj)

    def _replaced(self, items: Items) -> None:
        super()._replaced(items)
        metrics.WATCH_RELISTS.labels(self.kind).inc()

    def _failed(self, e: BaseException) -> None:
        metrics.WATCH_ERRORS.labels(self.kind).inc()
