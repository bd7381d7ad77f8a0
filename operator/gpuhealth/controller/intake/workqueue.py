"""A de-duplicating work queue: a key is processed by one worker at a time, and a key added while it
is being processed is processed once more afterwards (the client-go workqueue contract).

Keys added as urgent (an agent wrote new facts) are handed out before the others. Without it a
fault waits behind whatever the fleet queued first: when thousands of agents fall silent together
(a network partition, an overloaded API server), every one of their nodes is queued for its
``Unknown`` verdict, and a real XID on a node whose agent still speaks was measured waiting seconds
behind them (docs/scaling.md). A non-urgent key added again as urgent is promoted.
"""

from __future__ import annotations

import asyncio
from collections import deque


class WorkQueue:
    def __init__(self) -> None:
        # Waiting keys in hand-out order; an entry whose key is no longer waiting (promoted, or
        # already handed out through another entry) is skipped when it comes up.
        self._urgent: deque[str] = deque()
        self._normal: deque[str] = deque()
        self._dirty: dict[str, bool] = {}  # key -> urgent; added and not yet handed out
        self._processing: set[str] = set()
        self._wakeup = asyncio.Event()

    def add(self, key: str, urgent: bool = False) -> None:
        if key in self._dirty:
            if urgent and not self._dirty[key]:
                self._dirty[key] = True
                if key not in self._processing:
                    self._push(key, True)
            return
        self._dirty[key] = urgent
        if key not in self._processing:
            self._push(key, urgent)

    def _push(self, key: str, urgent: bool) -> None:
        (self._urgent if urgent else self._normal).append(key)
        self._wakeup.set()

    def _pop(self) -> str | None:
        for line in (self._urgent, self._normal):
            while line:
                key = line.popleft()
                if key in self._dirty and key not in self._processing:
                    return key
        return None

    async def get(self) -> str:
        while (key := self._pop()) is None:
            self._wakeup.clear()
            await self._wakeup.wait()
        del self._dirty[key]
        self._processing.add(key)
        return key

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._push(key, self._dirty[key])
