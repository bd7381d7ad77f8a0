"""Events posted in the background, with one shared backoff.

Events go through their own small thread pool, so during a storm the Node writes that carry the
actual protection are never queued behind the announcements. Throttling or an API that is away
pauses *all* Events with growing delays: the record of an action is delayed, not dropped. Each
Event carries the time of the decision it announces, not the time it was posted.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from gpuhealth.controller import metrics
from gpuhealth.kube.client import retryable

log = logging.getLogger(__name__)

EVENT_RETRIES = 12  # about five minutes of growing delays


class PostEvent(Protocol):
    def __call__(
        self,
        kind: str,
        name: str,
        uid: str,
        type_: str,
        reason: str,
        message: str,
        api_version: str = "v1",
        at: dt.datetime | None = None,
        namespace: str = "",
    ) -> None: ...


EVENT_THREADS = 4  # Events posted at once


class EventPoster:
    """An ``EventSink`` that posts through ``post`` (``Kube.post_event``) without holding up the caller."""

    def __init__(self, post: PostEvent, threads: int = EVENT_THREADS) -> None:
        self._post = post
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="events")
        self._tasks: set[asyncio.Task[None]] = set()
        self._backoff = 0.0
        self._paused_until = 0.0

    def __call__(
        self,
        kind: str,
        name: str,
        uid: str,
        type_: str,
        reason: str,
        message: str,
        api_version: str = "v1",
        namespace: str = "",
    ) -> None:
        args = (kind, name, uid, type_, reason, message, api_version, dt.datetime.now(dt.UTC), namespace)
        task = asyncio.get_running_loop().create_task(self._send(args))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, args: tuple[Any, ...]) -> None:
        """Under throttling the API's write slots go to the Node and report writes that protect the
        fleet first; the announcements follow once the API takes requests again."""
        loop = asyncio.get_running_loop()
        for _ in range(EVENT_RETRIES + 1):
            pause = self._paused_until - loop.time()
            if pause > 0:
                await asyncio.sleep(pause)
            try:
                await loop.run_in_executor(self._pool, self._post, *args)
                self._backoff = 0.0
                return
            except Exception as e:
                if not retryable(e):
                    metrics.EVENTS_DROPPED.inc()
                    log.warning("could not post event %s on %s %s: %s", args[4], args[0], args[1], e)
                    return
                self._backoff = min(max(0.5, self._backoff * 2), 30.0)
                self._paused_until = max(self._paused_until, loop.time() + self._backoff)
        metrics.EVENTS_DROPPED.inc()
        log.warning("gave up posting event %s on %s %s", args[4], args[0], args[1])

    async def flush(self, timeout: float = 5.0) -> None:
        """On shutdown: give Events in flight a moment to land."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
