"""Whether this replica may act, and re-reading the world before it starts acting again.

Kopf peering runs the ``acting`` daemon only on the replica that leads (handlers.py): each running
daemon ``hold``s, each stopped one ``release``s. Only while held is ``active`` set, and the
workers wait on it, so a standby replica never acts. While paused, another replica may act, so
our caches go stale: the next activation (or sweep) resyncs first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

RESYNC_AFTER_S = 5.0


class Leadership:
    def __init__(self, resync: Callable[[], Awaitable[None]]) -> None:
        self._resync = resync
        self.active = asyncio.Event()
        self.resync_needed = False
        self.loaded_at = 0.0
        self._holders = 0
        self._activation: asyncio.Task[None] | None = None

    def loaded(self) -> None:
        """Everything was just (re-)read."""
        self.loaded_at = time.monotonic()

    def hold(self) -> None:
        self._holders += 1
        if self._holders == 1:
            self._activation = asyncio.get_running_loop().create_task(self._activate())

    async def _activate(self) -> None:
        """Start acting; first re-read everything if our caches may be stale (a pause, or a late start)."""
        if self.resync_needed or time.monotonic() - self.loaded_at > RESYNC_AFTER_S:
            await self.resync()
        if self._holders > 0 and not self.active.is_set():
            self.active.set()
            log.info("acting (this replica leads)")

    def release(self) -> None:
        self._holders = max(0, self._holders - 1)
        if self._holders == 0:
            if self.active.is_set():
                log.info("paused: not acting until resumed")
            self.active.clear()
            self.resync_needed = True  # another replica may act meanwhile: our caches go stale

    async def resync(self) -> None:
        self.resync_needed = False
        await self._resync()
