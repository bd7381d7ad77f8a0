"""The list-then-watch protocol, once: what every watch of the operator shares (Nodes, reports, pods,
Leases: ``objectwatch.py``; ResourceSlices: ``slicewatch.py``).

As Kubernetes reflectors do it: list (paged) for a resourceVersion, watch from there with
bookmarks, resume from the last version seen after a dropped connection or a server-side timeout,
and list again (replacing what is cached) when the API answers 410 Gone. Errors are retried with
growing delays, and a watch that closes at once with nothing in it is never reopened in a tight
loop. Each object is slimmed as soon as its line is parsed, so full bodies never pile up.

A watch supplies its source calls and what to do with the results through the hooks below; the
loop runs in its own thread (``start``), and stops soon after ``stop``. Every watch is counted in
one metric family labelled by ``watch`` (``gpuhealth_watch_events_total``, ``..._errors_total``,
``..._relists_total``), here, so no watch can forget its metrics.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from gpuhealth.controller import metrics
from gpuhealth.controller.backoff import growing_delay
from gpuhealth.kube.errors import status_of

log = logging.getLogger(__name__)

T = TypeVar("T")
WATCH_TIMEOUT_S = 300


class Gone(Exception):
    """The watch's resourceVersion is too old: list again."""


class WatchError(Exception):
    """An ERROR event other than 410: the watch is restarted after a delay."""


class Reflector(Generic[T]):
    """The loop; subclasses (dataclasses) provide ``resource_version``, ``stopping`` and the hooks."""

    NAME = "watch"  # the thread's name
    WATCH = "watch"  # the metrics' ``watch`` label (metrics.WATCHES)
    RETRY_BASE_S, RETRY_MAX_S = 0.5, 5.0
    resource_version: str
    stopping: threading.Event
    _thread: threading.Thread | None

    # -- hooks -------------------------------------------------------------------------------------

    def _list(self) -> list[T]:
        """A full list; sets ``resource_version`` to continue from."""
        raise NotImplementedError

    def _watch(self) -> Iterable[Mapping[str, Any]]:
        """Raw watch events from ``resource_version`` (with bookmarks, ending at WATCH_TIMEOUT_S)."""
        raise NotImplementedError

    def _slim(self, obj: Mapping[str, Any]) -> T:
        raise NotImplementedError

    def _replaced(self, items: list[T]) -> None:
        """A fresh full list (at first, and after 410 Gone): what is not in it is gone."""
        raise NotImplementedError

    def _event(self, kind: str, item: T) -> None:
        raise NotImplementedError

    def _closed(self) -> bool:
        """Whether whoever receives the results has gone away (then the loop ends quietly)."""
        return False

    # -- the loop ----------------------------------------------------------------------------------

    def full_list(self) -> list[T]:
        """A full list (``_list``), counted: the first, and each after 410 Gone."""
        items = self._list()
        metrics.WATCH_RELISTS.labels(self.WATCH).inc()
        return items

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=self.NAME, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        failures = 0
        events = metrics.WATCH_EVENTS.labels(self.WATCH)
        while not self.stopping.is_set():
            try:
                if not self.resource_version:
                    self._replaced(self.full_list())
                started, seen = time.monotonic(), False
                for kind, item in self.follow(self._watch()):
                    events.inc()
                    self._event(kind, item)
                    failures, seen = 0, True
                    if self.stopping.is_set():
                        return
                if not seen and time.monotonic() - started < 1.0:
                    # Closed at once with nothing in it: never reconnect in a tight loop.
                    failures += 1
                    self.stopping.wait(growing_delay(failures, self.RETRY_BASE_S, self.RETRY_MAX_S))
                # Otherwise the server ended the watch at its timeout: resume from the last version.
            except Gone:
                log.info("%s: resourceVersion %s expired; listing again", self.NAME, self.resource_version)
                self.resource_version = ""
            except Exception as e:
                if self.stopping.is_set() or self._closed():
                    return
                failures += 1
                metrics.WATCH_ERRORS.labels(self.WATCH).inc()
                if status_of(e) == 410:
                    self.resource_version = ""
                    continue
                delay = growing_delay(failures, self.RETRY_BASE_S, self.RETRY_MAX_S)
                log.warning("%s failed (%s); resuming in %.1fs", self.NAME, e, delay)
                self.stopping.wait(delay)

    def follow(self, events: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, T]]:
        """Raw watch events -> (type, slim object), keeping the resourceVersion to resume from."""
        for ev in events:
            kind = str(ev.get("type"))
            obj = ev.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Gone(obj.get("message", "410 Gone"))
                raise WatchError(f"watch error {obj.get('code')}: {obj.get('message')}")
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if rv:
                self.resource_version = str(rv)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                yield kind, self._slim(obj)


class LoopReflector(Reflector[T]):
    """A reflector whose results go to ``on_replace`` / ``on_event`` on an asyncio loop (the runtime's),
    handed over thread-safely; it ends quietly once that loop is closed.

    ``on_replace`` may hand its work back to the loop in turns: if it returns an iterator, the loop
    runs other work between its steps (a relist of 80,000 pods, applied in one callback, held the loop
    for 23 s at 10,000 nodes: no pass ran and the Kopf peering keep-alive lapsed, so the standby took
    over in the middle of a drain storm; docs/bench.md). The watch resumes only once the replace is
    done, so no event can land between its steps and be overwritten by the list's older copy."""

    on_event: Callable[[str, T], None]
    on_replace: Callable[[list[T]], Iterator[None] | None]
    _loop: asyncio.AbstractEventLoop | None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:  # type: ignore[override]
        self._loop = loop
        super().start()

    def _replaced(self, items: list[T]) -> None:
        assert self._loop is not None
        done = asyncio.run_coroutine_threadsafe(self._replace_in_turns(items), self._loop)
        while True:
            if self.stopping.is_set() or self._closed():
                done.cancel()
                return
            try:
                done.result(timeout=1.0)
                return
            except TimeoutError:
                continue
            except Exception:
                self.resource_version = ""  # half replaced: list again (after the run loop's delay)
                raise

    async def _replace_in_turns(self, items: list[T]) -> None:
        steps = self.on_replace(items)
        if steps is not None:
            for _ in steps:
                await asyncio.sleep(0)

    def _event(self, kind: str, item: T) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.on_event, kind, item)

    def _closed(self) -> bool:
        return self._loop is not None and self._loop.is_closed()
