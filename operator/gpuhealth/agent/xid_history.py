"""The bounded, time-ordered XID history the agent's report carries (``spec.xidEvents``).

Apart from the report's rendering (``report.py``) because it has rules of its own: the bound,
DCGM de-duplication, and re-adopting this boot's events from a report found on the server.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime

from gpuhealth.agent.model import XidEvent
from gpuhealth.api.timeutil import parse_time

log = logging.getLogger("gpuhealth.agent.report")

DEFAULT_MAX_XID_EVENTS = 64
# A DCGM exporter scrapes every few seconds to a minute; an XID it shows that NVML already
# delivered within this window is the same event seen twice.
DEFAULT_DCGM_DEDUPE_S = 120.0

_XID_MIN, _XID_MAX = 1, 1023


def instance_id(value: object) -> int | None:
    """A GPU index or MIG instance ID read back from a report or journal: an int >= 0, else unknown."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class XidHistory:
    """The bounded, time-ordered list of XID events the report carries."""

    def __init__(self, limit: int = DEFAULT_MAX_XID_EVENTS, dcgm_dedupe_s: float = DEFAULT_DCGM_DEDUPE_S) -> None:
        self._limit = max(1, limit)
        self._dedupe_s = dcgm_dedupe_s
        self._events: list[XidEvent] = []

    def __len__(self) -> int:
        return len(self._events)

    @property
    def events(self) -> tuple[XidEvent, ...]:
        return tuple(self._events)

    def add(self, event: XidEvent, *, baseline: bool = False) -> bool:
        """Record an event; False when it was dropped as out of range or a duplicate.

        DCGM only shows the *last* XID per GPU, so its events are dropped when NVML (or an
        earlier DCGM observation) already holds the same XID on the same GPU close in time.
        ``baseline`` marks the first value a DCGM gauge showed, which may predate this process:
        it is kept only if no event with that XID on that GPU is known at all.
        """
        if not _XID_MIN <= event.xid <= _XID_MAX:
            log.warning("ignoring XID %d outside the reportable range on GPU %s", event.xid, event.gpu)
            return False
        if event.source == "dcgm":
            for known in self._events:
                same_gpu = (known.uuid and known.uuid == event.uuid) or (
                    known.gpu is not None and known.gpu == event.gpu
                )
                if not same_gpu or known.xid != event.xid:
                    continue
                if baseline or abs((known.time - event.time).total_seconds()) <= self._dedupe_s:
                    return False
        self._events.append(event)
        self._events.sort(key=lambda e: e.time)
        del self._events[: max(0, len(self._events) - self._limit)]
        return True

    def restore(self, items: object, boot_time: datetime | None) -> int:
        """Re-adopt events from an existing report that happened during this host boot.

        Returns how many were kept. Without a known boot time nothing is kept: an XID from a
        previous boot would keep a healthy, rebooted node out of service.
        """
        if boot_time is None or not isinstance(items, list):
            return 0
        kept = 0
        for item in items:
            if not isinstance(item, Mapping):
                continue
            when = parse_time(item.get("time"))
            xid = item.get("xid")
            if when is None or not isinstance(xid, int) or when <= boot_time:
                continue
            source = item.get("source")
            self._events.append(
                XidEvent(
                    xid=xid,
                    time=when,
                    source=source if source in ("nvml", "dcgm", "simulated") else "nvml",
                    gpu=instance_id(item.get("gpu")),
                    uuid=uuid if isinstance(uuid := item.get("uuid"), str) else "",
                    detail=item.get("detail") if isinstance(item.get("detail"), str) else None,
                    gpu_instance=instance_id(item.get("gpuInstanceId")),
                    compute_instance=instance_id(item.get("computeInstanceId")),
                )
            )
            kept += 1
        self._events.sort(key=lambda e: e.time)
        del self._events[: max(0, len(self._events) - self._limit)]
        return kept
