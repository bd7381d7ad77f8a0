"""A slim list-then-watch of scheduled Pods, for drains and restart-loop detection.

Pods are most of a cluster's objects, and the operator reads a handful of fields of each. Watched
through Kopf, every full pod body is wrapped and processed per object: at 8,000 pods that alone
cost the operator about 180 MB (``make bench``). This reflector slims each pod as soon as its
line is parsed and hands only that to the reconciler, on the event loop.

Protocol, as Kubernetes reflectors do it: list (paged) for a resourceVersion, watch from there
with bookmarks, resume from the last version seen after a dropped connection, and list again
(replacing the cache) when the API answers 410 Gone. Errors are retried with growing delays.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuhealth.controller import metrics
from gpuhealth.controller.backoff import growing_delay
from gpuhealth.kube.client import status_of

log = logging.getLogger(__name__)

Slim = Callable[[Mapping[str, Any]], dict[str, Any]]
WATCH_TIMEOUT_S = 300
# Reconnecting is one cheap request, and drains wait on this watch: retry soon after an API comes back.
RETRY_BASE_S, RETRY_MAX_S = 0.5, 5.0


class Gone(Exception):
    """The watch's resourceVersion is too old: list again."""


class PodSource(Protocol):
    def list_pods_rv(self, transform: Slim) -> tuple[list[dict[str, Any]], str]: ...

    def watch_pods(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]: ...


@dataclass
class PodWatch:
    """Feeds ``on_event(type, slim_pod)`` and ``on_replace(slim_pods)`` on ``loop``, from a thread."""

    source: PodSource
    slim: Slim
    on_event: Callable[[str, dict[str, Any]], None]
    on_replace: Callable[[list[dict[str, Any]]], None]
    resource_version: str = ""
    stopping: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def list(self) -> list[dict[str, Any]]:
        """The initial (or a fresh) full list; the watch continues from its resourceVersion."""
        pods, self.resource_version = self.source.list_pods_rv(self.slim)
        return pods

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._thread = threading.Thread(target=self._run, args=(loop,), name="pod-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        failures = 0
        while not self.stopping.is_set():
            try:
                if not self.resource_version:
                    pods = self.list()
                    loop.call_soon_threadsafe(self.on_replace, pods)
                    metrics.POD_WATCH_RELISTS.inc()
                started, seen = time.monotonic(), False
                for kind, pod in self.follow(self.source.watch_pods(self.resource_version, WATCH_TIMEOUT_S)):
                    loop.call_soon_threadsafe(self.on_event, kind, pod)
                    failures, seen = 0, True
                    if self.stopping.is_set():
                        return
                if not seen and time.monotonic() - started < 1.0:
                    # Closed at once with nothing in it: never reconnect in a tight loop.
                    failures += 1
                    self.stopping.wait(growing_delay(failures, RETRY_BASE_S, RETRY_MAX_S))
                # Otherwise the server ended the watch at its timeout: resume from the last version.
            except Gone:
                log.info("pod watch: resourceVersion %s expired; listing again", self.resource_version)
                self.resource_version = ""
            except Exception as e:
                if self.stopping.is_set() or loop.is_closed():
                    return
                failures += 1
                delay = growing_delay(failures, RETRY_BASE_S, RETRY_MAX_S)
                metrics.POD_WATCH_ERRORS.inc()
                if status_of(e) == 410:
                    self.resource_version = ""
                    continue
                log.warning("pod watch failed (%s); resuming in %.1fs", e, delay)
                self.stopping.wait(delay)

    def follow(self, events: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
        """Turn raw watch events into (type, slim pod), keeping the resourceVersion to resume from."""
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
                yield kind, self.slim(obj)


class WatchError(Exception):
    """An ERROR event other than 410: the watch is restarted after a delay."""
