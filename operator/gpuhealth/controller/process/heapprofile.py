"""Opt-in heap profile: where the operator's Python memory grows, written while it runs.

Resident memory (RSS) that creeps up over hours can be a leak or the allocator settling; the two
look alike from outside. ``tracemalloc`` tells them apart: it counts the bytes Python objects hold,
by the line that allocated them. With ``--heap-profile PATH`` the operator traces allocations
(one frame each, to keep the cost low) and every ``--heap-profile-interval`` seconds appends one
JSON line to PATH: the traced bytes, tracemalloc's own overhead, and the lines whose holdings grew
most since the baseline (the first sample after ``warmup_s``). Off by default: tracing costs CPU
and memory of its own, which each line reports so it can be subtracted.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TOP = 25


def site(stat: tracemalloc.StatisticDiff) -> str:
    frame = stat.traceback[0]
    return f"{frame.filename}:{frame.lineno}"


def growth(now: tracemalloc.Snapshot, base: tracemalloc.Snapshot, top: int = TOP) -> list[dict[str, Any]]:
    """The ``top`` allocation sites by bytes gained since ``base`` (largest growth first)."""
    stats = now.compare_to(base, "lineno")
    stats.sort(key=lambda s: s.size_diff, reverse=True)
    return [
        {"site": site(s), "size_diff": s.size_diff, "count_diff": s.count_diff, "size": s.size}
        for s in stats[:top]
        if s.size_diff > 0
    ]


class HeapProfiler:
    """A daemon thread that samples tracemalloc into a JSON-lines file."""

    def __init__(self, path: Path, interval_s: float = 60.0, warmup_s: float = 60.0) -> None:
        self._path = path
        self._interval = max(1.0, interval_s)
        self._warmup = max(0.0, warmup_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heap-profile", daemon=True)
        self._base: tracemalloc.Snapshot | None = None

    def start(self) -> HeapProfiler:
        if not tracemalloc.is_tracing():
            tracemalloc.start(1)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        log.info("heap profile every %.0fs to %s (baseline after %.0fs)", self._interval, self._path, self._warmup)
        return self

    def stop(self) -> None:
        self._stop.set()

    def sample(self, elapsed: float) -> dict[str, Any]:
        """One line of the profile: totals, and growth by site once a baseline exists."""
        snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        traced, peak = tracemalloc.get_traced_memory()
        line: dict[str, Any] = {
            "t": round(elapsed, 1),
            "traced_bytes": traced,
            "peak_bytes": peak,
            "overhead_bytes": tracemalloc.get_tracemalloc_memory(),
        }
        if self._base is None and elapsed >= self._warmup:
            self._base = snap
            line["baseline"] = True
        elif self._base is not None:
            line["growth"] = growth(snap, self._base)
        return line

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.wait(self._interval):
            try:
                line = self.sample(time.monotonic() - t0)
                with self._path.open("a") as out:
                    out.write(json.dumps(line) + "\n")
            except Exception:  # a diagnostic must never take the operator down
                log.exception("heap profile sample failed")
