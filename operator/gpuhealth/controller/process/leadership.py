"""Whether this replica may act, and re-reading the world before it starts acting again.

Kopf peering runs the ``acting`` daemon only on the replica that leads (handlers.py): each running
daemon ``hold``s, each stopped one ``release``s. Only while held is ``active`` set, and the
workers wait on it, so a standby replica never acts.

The caches of Nodes, reports, pods and Leases are kept by watches that run whether or not this
replica acts (objectwatch.py), so they never go stale. What does: the decision records and breaker
slots in memory, and the rules listed at start, since another replica may act while this one is
paused. So a resync (forget them, list again) runs on the first activation after a pause, never on
the first activation after start-up: that one waits for the start-up list to finish instead, and
re-listing a fleet that was just listed (at 10,000 nodes, minutes) bought nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class Leadership:
    def __init__(self, resync: Callable[[], Awaitable[None]]) -> None:
        self._resync = resync
        self.active = asyncio.Event()
        self.resync_needed = False
        self._loaded = asyncio.Event()
        self._holders = 0
        self._activation: asyncio.Task[None] | None = None

    def loaded(self) -> None:
        """The start-up list is complete (every cache primed, the watches running from it)."""
        self._loaded.set()

    def hold(self) -> None:
        self._holders += 1
        if self._holders == 1:
            self._activation = asyncio.get_running_loop().create_task(self._activate())

    async def _activate(self) -> None:
        """Start acting once the caches are primed; first re-read what a pause may have made stale."""
        await self._loaded.wait()
        if self.resync_needed:
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
            self.resync_needed = True  # another replica may act meanwhile: our records go stale

    async def resync(self) -> None:
        self.resync_needed = False
        await self._resync()
