"""The XID event thread: waits on the device source and hands events off, never blocking.

NVML delivers events into a per-process queue that can overflow while nobody waits, so this
thread does nothing but wait and enqueue; all API work happens on the publisher thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from gpuhealth.agent.model import XidEvent
from gpuhealth.agent.source import DeviceSource

log = logging.getLogger(__name__)


class Journal(Protocol):
    """Where an XID is made durable before it is handed on (``journal.XidJournal``)."""

    def append(self, event: XidEvent, baseline: bool = False) -> None: ...


class XidBuffer:
    """Thread-safe hand-off of XID events from producers to the publisher.

    Bounded so an XID storm during a long API outage cannot exhaust memory; the report keeps
    only the newest events anyway, so dropping the oldest loses nothing it would carry.
    With a ``journal``, each event is appended to it on the producer's thread *before* it is
    queued: NVML delivers an XID once, so it must be on disk before the agent can be killed
    with it only in memory.
    """

    def __init__(self, maxlen: int = 1024, on_put: Callable[[], None] | None = None) -> None:
        self._items: deque[tuple[XidEvent, bool]] = deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self._on_put = on_put
        self.journal: Journal | None = None

    def put(self, event: XidEvent, *, baseline: bool = False) -> None:
        if self.journal is not None:
            self.journal.append(event, baseline)
        with self._lock:
            if len(self._items) == self._items.maxlen:
                log.warning("XID buffer full; dropping the oldest pending event")
            self._items.append((event, baseline))
        if self._on_put is not None:
            self._on_put()

    def drain(self) -> list[tuple[XidEvent, bool]]:
        with self._lock:
            items = list(self._items)
            self._items.clear()
        return items


class EventWatcher:
    """Runs ``source.wait_events`` in a loop on a daemon thread until stopped."""

    def __init__(
        self,
        source: DeviceSource,
        buffer: XidBuffer,
        *,
        timeout_s: float = 1.0,
        on_resample: Callable[[], None] | None = None,
        on_xid: Callable[[XidEvent], None] | None = None,
    ) -> None:
        self._source = source
        self._buffer = buffer
        self._timeout_s = timeout_s
        self._on_resample = on_resample
        self._on_xid = on_xid
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_loop = time.monotonic()

    def start(self) -> None:
        """Register for events now (one zero-timeout wait), then keep waiting on a thread.

        Registering synchronously means that once the agent has written its first report,
        XIDs are being watched: NVML never delivers events that predate the registration.
        """
        self._poll(0.0)
        self._thread = threading.Thread(target=self._run, name="gpuhealth-xid-events", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s if timeout_s is not None else self._timeout_s * 3 + 5)
            if self._thread.is_alive():
                log.warning("XID event thread did not stop in time")

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.last_loop = time.monotonic()
            if not self._poll(self._timeout_s):
                self._stop.wait(self._timeout_s)

    def _poll(self, timeout_s: float) -> bool:
        """One bounded wait; hands events off. False when the wait itself failed."""
        try:
            batch = self._source.wait_events(timeout_s)
        except Exception:
            log.exception("XID event wait failed; retrying")
            return False
        for event in batch.xids:
            self._buffer.put(event)
            if self._on_xid is not None:
                self._on_xid(event)
        if batch.resample and self._on_resample is not None:
            self._on_resample()
        return True
