"""The rest of the fleet while a drain storm runs: what the operator wrote to nodes that were not
drained, and how the fleet's verdicts moved meanwhile.

The 10,000-node storm at 744e38f saw the acting replica write node statuses and Nodes across the
fleet for minutes (the audit log), in the shape of verdict changes, and nothing recorded the
fleet's verdicts then to say which (docs/bench.md). Simulated agents whose Lease renewals fall behind
on a saturated machine turn ``Unknown`` and back; an operator that rewrote unchanged verdicts would
look the same in the audit log but not in the verdicts. These figures tell the two apart.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from devkit.audit import audit_entry

FLEET_RESOURCES = frozenset({"nodes", "gpunodehealths"})
SAMPLE_EVERY_S = 2.0


class VerdictSampler:
    """Counts the fleet's verdicts (``tally``: state -> nodes) every ``every_s`` from ``start`` to ``stop``."""

    def __init__(self, tally: Callable[[], Mapping[str, int]], every_s: float = SAMPLE_EVERY_S) -> None:
        self._tally = tally
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-verdicts", daemon=True)
        self.samples: list[tuple[float, dict[str, int]]] = []

    def start(self) -> VerdictSampler:
        self._thread.start()
        return self

    def stop(self) -> list[tuple[float, dict[str, int]]]:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.samples

    def _run(self) -> None:
        while True:
            self.samples.append((time.time(), dict(self._tally())))
            if self._stop.wait(self._every_s):
                return


def verdict_swings(samples: list[tuple[float, dict[str, int]]], t0: float) -> dict[str, Any]:
    """Each state's count at the first sample and its highest and lowest through the storm, and when
    (seconds after ``t0``) each state peaked; {} without samples."""
    if not samples:
        return {}
    states = sorted({s for _, tally in samples for s in tally})
    out: dict[str, Any] = {"samples": len(samples), "at_start": samples[0][1], "peak": {}, "low": {}, "peak_at_s": {}}
    for s in states:
        counts = [(tally.get(s, 0), t) for t, tally in samples]
        top = max(counts, key=lambda c: c[0])
        out["peak"][s] = top[0]
        out["low"][s] = min(c for c, _ in counts)
        out["peak_at_s"][s] = round(max(0.0, top[1] - t0), 1)  # the first sample may precede the faults
    return out


def writes_elsewhere(entries: Iterable[dict[str, Any]], drained: Iterable[str], t0: float) -> dict[str, Any]:
    """The operator's writes to Nodes and reports (their status included) received at or after ``t0``
    on nodes that were not drained: how many, on how many nodes, by verb and resource."""
    skip = set(drained)
    by: Counter[str] = Counter()
    names: set[str] = set()
    for e in filter(None, map(audit_entry, entries)):
        if not e.write or e.resource not in FLEET_RESOURCES or not e.name or e.name in skip or e.at < t0:
            continue
        sub = f"/{e.subresource}" if e.subresource else ""
        by[f"{e.verb} {e.resource}{sub}"] += 1
        names.add(e.name)
    return {"writes": sum(by.values()), "nodes": len(names), "by": dict(sorted(by.items()))}
