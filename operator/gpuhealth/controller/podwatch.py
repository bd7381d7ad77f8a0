"""A slim list-then-watch of scheduled Pods, for drains and restart-loop detection.

Pods are most of a cluster's objects, and the operator reads a handful of fields of each. Watched
through Kopf, every full pod body is wrapped and processed per object: at 8,000 pods that alone
cost the operator about 180 MB (``make bench``). This reflector slims each pod as soon as its
line is parsed and hands only that to the runtime, on the event loop. The protocol (list, watch
with bookmarks, resume, list again on 410 Gone, growing retry delays) is ``reflector.py``'s.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuhealth.controller import metrics
from gpuhealth.controller.reflector import WATCH_TIMEOUT_S, Gone, LoopReflector, WatchError

__all__ = ["Gone", "PodSource", "PodWatch", "WatchError"]

Slim = Callable[[Mapping[str, Any]], dict[str, Any]]


class PodSource(Protocol):
    def list_pods_rv(self, transform: Slim) -> tuple[list[dict[str, Any]], str]: ...

    def watch_pods(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]: ...


Items = list[dict[str, Any]]  # (a name of its own: `list` is a method of the watch below)


@dataclass
class PodWatch(LoopReflector[dict[str, Any]]):
    """Feeds ``on_event(type, slim_pod)`` and ``on_replace(slim_pods)`` on ``loop``, from a thread."""

    source: PodSource
    slim: Slim
    on_event: Callable[[str, dict[str, Any]], None]
    on_replace: Callable[[list[dict[str, Any]]], None]
    resource_version: str = ""
    stopping: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    NAME = "pod-watch"
    # Reconnecting is one cheap request, and drains wait on this watch: retry soon after an API comes back.
    RETRY_BASE_S, RETRY_MAX_S = 0.5, 5.0

    def list(self) -> list[dict[str, Any]]:
        """The initial (or a fresh) full list; the watch continues from its resourceVersion."""
        pods, self.resource_version = self.source.list_pods_rv(self.slim)
        return pods

    def _list(self) -> Items:
        return self.list()

    def _watch(self) -> Iterable[Mapping[str, Any]]:
        return self.source.watch_pods(self.resource_version, WATCH_TIMEOUT_S)

    def _slim(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        return self.slim(obj)

    def _replaced(self, items: Items) -> None:
        super()._replaced(items)
        metrics.POD_WATCH_RELISTS.inc()

    def _failed(self, e: BaseException) -> None:
        metrics.POD_WATCH_ERRORS.inc()
