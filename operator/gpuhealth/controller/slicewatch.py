"""A slim list-then-watch of DRA ResourceSlices: which device each GPU is, without asking per fault.

ResourceSlices carry every attribute and capacity a driver publishes (a few KB per node); the
operator needs the driver, pool and each device's name, UUID and index, so each slice is slimmed
(``actions.slices.slim_slice``) as soon as it is read and kept in a :class:`SliceCache`, which
readers query from any thread. The protocol is the pod reflector's (``podwatch.py``): list (paged)
for a resourceVersion, watch from there with bookmarks, resume after a dropped connection, list
again and replace the cache on 410 Gone, retry errors with growing delays.

On a cluster without DRA (no resource.k8s.io/v1, or no slices) the cache stays empty and every
GPU falls back to node scope.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuhealth.actions.slices import DeviceMatch, SlimSlice, find_device, slim_slice
from gpuhealth.controller.backoff import growing_delay
from gpuhealth.controller.podwatch import Gone, WatchError
from gpuhealth.kube.errors import status_of

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 300
RETRY_BASE_S, RETRY_MAX_S = 0.5, 30.0


class SliceSource(Protocol):
    def list_resource_slices_rv(self, transform: Callable[[dict[str, Any]], Any]) -> tuple[list[Any], str]: ...

    def watch_resource_slices(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]: ...


class SliceCache:
    """Slim ResourceSlices by name; safe to read from any thread while the watch updates it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slices: dict[str, SlimSlice] = {}
        self.synced = threading.Event()  # set after the first full list

    def replace(self, slices: Iterable[SlimSlice]) -> None:
        with self._lock:
            self._slices = {s.name: s for s in slices}
        self.synced.set()

    def apply(self, kind: str, s: SlimSlice) -> None:
        with self._lock:
            if kind == "DELETED":
                self._slices.pop(s.name, None)
            else:
                self._slices[s.name] = s

    def slices(self) -> list[SlimSlice]:
        with self._lock:
            return list(self._slices.values())

    def find(self, node: str, drivers: Sequence[str], index: int | None, uuid: str) -> DeviceMatch:
        """The DRA device of GPU ``index`` / ``uuid`` on ``node`` (see ``actions.slices.find_device``)."""
        return find_device(self.slices(), node, drivers, index, uuid)


@dataclass
class SliceWatch:
    """Keeps ``cache`` current from a thread; ``on_change(pool)`` (optional) hears which pool changed."""

    source: SliceSource
    cache: SliceCache = field(default_factory=SliceCache)
    on_change: Callable[[str], None] | None = None
    resource_version: str = ""
    stopping: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def list(self) -> None:
        """A fresh full list; the watch continues from its resourceVersion."""
        slices, self.resource_version = self.source.list_resource_slices_rv(slim_slice)
        self.cache.replace(slices)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="slice-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def _notify(self, pool: str) -> None:
        if self.on_change is not None:
            try:
                self.on_change(pool)
            except Exception:
                log.exception("slice watch: on_change failed")

    def _run(self) -> None:
        failures = 0
        while not self.stopping.is_set():
            try:
                if not self.resource_version:
                    self.list()
                    self._notify("")
                started, seen = time.monotonic(), False
                for kind, s in self.follow(self.source.watch_resource_slices(self.resource_version, WATCH_TIMEOUT_S)):
                    self.cache.apply(kind, s)
                    self._notify(s.pool)
                    failures, seen = 0, True
                    if self.stopping.is_set():
                        return
                if not seen and time.monotonic() - started < 1.0:
                    failures += 1
                    self.stopping.wait(growing_delay(failures, RETRY_BASE_S, RETRY_MAX_S))
            except Gone:
                log.info("slice watch: resourceVersion %s expired; listing again", self.resource_version)
                self.resource_version = ""
            except Exception as e:
                if self.stopping.is_set():
                    return
                failures += 1
                if status_of(e) == 410:
                    self.resource_version = ""
                    continue
                delay = growing_delay(failures, RETRY_BASE_S, RETRY_MAX_S)
                # 404: this API server does not serve resource.k8s.io/v1; keep trying, slowly.
                log.warning("slice watch failed (%s); retrying in %.1fs", e, delay)
                self.stopping.wait(delay)

    def follow(self, events: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, SlimSlice]]:
        """Raw watch events -> (type, slim slice), keeping the resourceVersion to resume from."""
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
                yield str(kind), slim_slice(obj)
