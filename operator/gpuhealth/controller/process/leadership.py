"""Whether this replica may act, and whether it must re-read the world before it acts again.

Kopf peering runs the ``acting`` daemon only on the replica that leads (handlers.py): each running
daemon ``hold``s, each stopped one ``release``s. Only while held is ``active`` set, and the
workers wait on it, so a standby replica never acts.

The caches of Nodes, reports, pods and Leases are kept by watches that run whether or not this
replica acts (objectwatch.py), so they never go stale. What does: the decision records and breaker
slots in memory, and the rules listed at start, since another replica may act while this one is
paused. So a resync (forget them, list again) runs on the first activation after a pause, never on
the first activation after start-up: that one waits for the start-up list to finish instead, and
re-listing a fleet that was just listed (at 10,000 nodes, minutes) bought nothing.

This is state only: it never calls the runtime. The runtime's lead loop (``runtime.py``) waits for
:meth:`Leadership.wanted`, runs the resync itself when one is due, and then asks :meth:`act`, which
acts only if nothing paused the replica meanwhile.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)


class Leadership:
    def __init__(self) -> None:
        self.active = asyncio.Event()
        self.resync_needed = False
        self._loaded = asyncio.Event()
        self._holders = 0
        self._wanted = asyncio.Event()  # held, and not acting yet

    def loaded(self) -> None:
        """The start-up list is complete (every cache primed, the watches running from it)."""
        self._loaded.set()

    def hold(self) -> None:
        self._holders += 1
        if self._holders == 1:
            self._wanted.set()

    def release(self) -> None:
        self._holders = max(0, self._holders - 1)
        if self._holders == 0:
            if self.active.is_set():
                log.info("paused: not acting until resumed")
            self.active.clear()
            self._wanted.clear()
            self.resync_needed = True  # another replica may act meanwhile: our records go stale

    async def wanted(self) -> bool:
        """Wait until this replica is held and its caches are primed; returns whether a resync is due
        first (and counts it as started: a pause during it asks for another)."""
        await self._wanted.wait()
        await self._loaded.wait()
        return self.take_resync()

    def act(self) -> bool:
        """Start acting, unless the replica was released meanwhile or a pause asked for another resync."""
        if self._holders == 0 or self.resync_needed:
            return False
        self._wanted.clear()
        if not self.active.is_set():
            self.active.set()
            log.info("acting (this replica leads)")
        return True

    def take_resync(self) -> bool:
        """Whether a resync is due (the sweeper's check), counting it as started."""
        due, self.resync_needed = self.resync_needed, False
        return due
