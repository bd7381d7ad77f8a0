"""Says so in the log when the operator is stalled: a reconcile that runs long, or a blocked loop.

A key is reconciled by one worker at a time (``workqueue.py``), so a reconcile that never ends
holds its node silently: new facts about it are queued behind it and nothing is decided. And
everything the operator does runs on one asyncio loop, so a call that blocks the loop stalls every
node at once. Neither shows in the decisions themselves; both are named here (the node and how
long), once per reconcile and once per stall, so that an SRE (or a test that timed out) can tell a
stall from a decision.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

SLOW_RECONCILE_S = 15.0  # a reconcile is a few requests; one this long waits on something
LOOP_LAG_S = 2.0  # the loop woke this much later than asked
PERIOD_S = 1.0


class Watchdog:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._running: dict[str, float] = {}  # node -> when its reconcile started
        self._told: set[str] = set()

    def started(self, name: str) -> None:
        self._running[name] = self.clock()

    def finished(self, name: str) -> None:
        began = self._running.pop(name, None)
        told = name in self._told
        self._told.discard(name)
        if began is not None:
            took = self.clock() - began
            if took >= SLOW_RECONCILE_S or told:
                log.warning("reconcile of %s took %.1fs", name, took)

    def check(self) -> list[str]:
        """Warn once about each reconcile running for longer than SLOW_RECONCILE_S; their nodes."""
        now = self.clock()
        slow = [n for n, t in self._running.items() if now - t >= SLOW_RECONCILE_S and n not in self._told]
        for n in slow:
            self._told.add(n)
            log.warning("reconcile of %s has been running for %.0fs", n, now - self._running[n])
        return slow

    async def run(self) -> None:
        """Check every PERIOD_S; a wake-up much later than asked means the loop was blocked."""
        while True:
            asked = self.clock()
            await asyncio.sleep(PERIOD_S)
            late = self.clock() - asked - PERIOD_S
            if late >= LOOP_LAG_S:
                log.warning("the event loop was blocked for %.1fs: every reconcile waited", late)
            self.check()
