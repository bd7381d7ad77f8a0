"""When a start-up is over: every GPU node passed once with its pods in.

Until the start-up pod list is in, a pass only takes out (``evaluation/startup.py``); the list then
queues every node again (``runtime._list_pods``), and the last of those passes to succeed is the end
of the start-up: from there every verdict is whole. Nothing outside the process can see that moment
on a fleet whose verdicts did not change (a warm restart writes nothing), so it is said here, once: a
log line and ``gpuhealth_startup_seconds``. On-call reads how long a restart left verdicts partial;
``make bench`` reads a warm restart's start-up from the line (docs/bench.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from gpuhealth.controller import metrics

log = logging.getLogger(__name__)

LINE = "every GPU node evaluated"  # the log line's words, which make bench looks for


class FirstPass:
    """The nodes still owed a pass with the pods in, from ``expect`` until none is left."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._started = clock()
        self._owed: set[str] | None = None  # None: the pods are not listed yet
        self._nodes = 0
        self.seconds: float | None = None  # from the start to the last owed pass; None until then

    def start(self) -> None:
        """The start-up begins (the fleet's lists are about to be made)."""
        self._started = self._clock()

    def expect(self, names: Iterable[str]) -> None:
        """The pods are in and ``names`` (every cached node) are queued again."""
        if self.seconds is not None:
            return
        self._owed = set(names)
        self._nodes = len(self._owed)
        self._settle()

    def passed(self, name: str) -> None:
        """A pass on ``name`` that began after ``expect`` succeeded (or found the node gone)."""
        if self._owed is None or self.seconds is not None:
            return
        self._owed.discard(name)
        self._settle()

    def _settle(self) -> None:
        if self._owed:
            return
        took = self._clock() - self._started
        metrics.STARTUP_SECONDS.set(took)
        self.seconds = round(took, 2)
        log.info("%s: %d nodes, %.1fs after start", LINE, self._nodes, self.seconds)
