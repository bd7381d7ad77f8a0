"""The agent's local XID journal: every XID is on disk before it is handed to the publisher.

NVML delivers each XID event exactly once (``nvmlEventSetWait``). Without a local record, an
agent killed after NVML handed it an XID but before its report write forgot the fault for good:
the restarted agent registers anew and NVML never repeats a past event. So the producer thread
appends each XID here (one JSON line, flushed and fsynced) before it hands the event on, and a
restarted agent replays the entries of this host boot into its report.

The file lives in ``--state-dir`` (an ``emptyDir`` in the DaemonSet: it survives container
restarts and agent crashes, not pod re-creation or a reboot). It is bounded: rewritten atomically
(temp file, fsync, rename) to the report's XID limit at start and whenever it grows past twice
that. A torn last line (a kill mid-append) or garbage is skipped with a warning and counted in
``gpuhealth_agent_journal_errors_total``; an unwritable directory disables the journal with a
warning instead of stopping the agent.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import deque
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuhealth.agent.metrics import AgentMetrics
from gpuhealth.agent.model import XidEvent
from gpuhealth.agent.report import rfc3339
from gpuhealth.agent.xid_history import instance_id
from gpuhealth.api.timeutil import parse_time

log = logging.getLogger(__name__)

JOURNAL_FILE = "xid-journal.jsonl"
# /proc/stat's btime is whole seconds; the /proc/uptime fallback of read_boot_time drifts by a
# fraction of one between calls. Two boots are never this close.
BOOT_TOLERANCE_S = 2.0
_SOURCES = ("nvml", "dcgm", "simulated")


def encode(event: XidEvent, baseline: bool, boot_time: datetime) -> str:
    """One journal line: what :class:`XidEvent` needs, the DCGM baseline mark, and the boot."""
    entry: dict[str, Any] = {
        "xid": event.xid,
        "time": rfc3339(event.time),
        "source": event.source,
        "gpu": event.gpu,
        "uuid": event.uuid or None,  # unknown: left out, as before
        "detail": event.detail,
        "gpuInstanceId": event.gpu_instance,
        "computeInstanceId": event.compute_instance,
        "baseline": baseline,
        "bootTime": rfc3339(boot_time),
    }
    return json.dumps({k: v for k, v in entry.items() if v is not None}, sort_keys=True) + "\n"


def decode(line: str) -> tuple[XidEvent, bool, datetime] | None:
    """(event, baseline, boot time) of one line, or None when it is not a whole, valid entry."""
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    if not isinstance(entry, dict):
        return None
    xid, when, boot = entry.get("xid"), parse_time(entry.get("time")), parse_time(entry.get("bootTime"))
    source, gpu, uuid, detail = entry.get("source"), entry.get("gpu"), entry.get("uuid"), entry.get("detail")
    if not isinstance(xid, int) or isinstance(xid, bool) or when is None or boot is None or source not in _SOURCES:
        return None
    if (gpu is not None and not isinstance(gpu, int)) or not isinstance(uuid, str | None):
        return None
    event = XidEvent(
        xid=xid,
        time=when,
        source=source,
        gpu=gpu,
        uuid=uuid or "",
        detail=detail if isinstance(detail, str) else None,
        gpu_instance=instance_id(entry.get("gpuInstanceId")),
        compute_instance=instance_id(entry.get("computeInstanceId")),
    )
    return event, entry.get("baseline") is True, boot


class XidJournal:
    """Append-only, fsynced XID log for one host boot; thread-safe (NVML and DCGM producers)."""

    def __init__(
        self, state_dir: str | os.PathLike[str], boot_time: datetime, limit: int, metrics: AgentMetrics | None = None
    ) -> None:
        self.path = Path(state_dir) / JOURNAL_FILE
        self._boot = boot_time
        self._limit = max(1, limit)
        self._metrics = metrics
        self._lock = threading.Lock()
        # What the file holds (this boot's entries, oldest first), to compact without re-reading it.
        self._entries: deque[tuple[XidEvent, bool]] = deque()
        self.enabled = True

    def load(self) -> list[tuple[XidEvent, bool]]:
        """Read the journal, keep this boot's newest entries, rewrite the file; call before appends.

        Returns the kept (event, baseline) pairs, oldest first, for the report to adopt. Entries
        from an earlier boot are dropped: the operator already has them or the reboot repaired
        the GPU. On any error the journal is disabled (the agent works on without it).
        """
        with self._lock:
            kept: list[tuple[XidEvent, bool]] = []
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                text = self.path.read_text(encoding="utf-8", errors="replace") if self.path.exists() else ""
            except OSError as exc:
                self._fail("read", "cannot read the XID journal %s (%s); running without it", exc)
                return []
            bad = other_boot = 0
            for line in text.splitlines():
                if not line.strip():
                    continue
                decoded = decode(line)
                if decoded is None:
                    bad += 1
                    continue
                event, baseline, boot = decoded
                if abs((boot - self._boot).total_seconds()) > BOOT_TOLERANCE_S or event.time <= self._boot:
                    other_boot += 1
                    continue
                kept.append((event, baseline))
            if bad:
                log.warning("XID journal %s: skipped %d torn or invalid line(s)", self.path, bad)
                if self._metrics is not None:
                    self._metrics.journal_errors.labels(op="read").inc(bad)
            kept.sort(key=lambda item: item[0].time)
            kept = kept[-self._limit :]
            self._entries = deque(kept)
            try:
                self._rewrite_locked()
            except OSError as exc:
                self._fail("write", "cannot write the XID journal %s (%s); running without it", exc)
                return kept
            log.info(
                "XID journal %s: %d event(s) of this boot to replay, %d from an earlier boot dropped",
                self.path,
                len(kept),
                other_boot,
            )
            return kept

    def append(self, event: XidEvent, baseline: bool = False) -> None:
        """Make ``event`` durable (write, flush, fsync) before the caller hands it on; never raises."""
        with self._lock:
            if not self.enabled:
                return
            try:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(encode(event, baseline, self._boot))
                    f.flush()
                    os.fsync(f.fileno())
                self._entries.append((event, baseline))
                if len(self._entries) > 2 * self._limit:
                    while len(self._entries) > self._limit:
                        self._entries.popleft()
                    self._rewrite_locked()
            except OSError as exc:
                # Keep trying on later events (a full disk may drain); the event itself goes on.
                log.warning("cannot append XID %d to the journal %s: %s", event.xid, self.path, exc)
                if self._metrics is not None:
                    self._metrics.journal_errors.labels(op="write").inc()

    def _rewrite_locked(self) -> None:
        """Atomically replace the file with ``self._entries``: temp file, fsync, rename, fsync dir."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(encode(e, b, self._boot) for e, b in self._entries)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        try:
            fd = os.open(self.path.parent, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError as exc:  # some filesystems refuse fsync on a directory; the rename stands
            log.debug("fsync of %s: %s", self.path.parent, exc)
        finally:
            os.close(fd)

    def _fail(self, op: str, message: str, exc: OSError) -> None:
        self.enabled = False
        log.warning(message, self.path, exc)
        if self._metrics is not None:
            self._metrics.journal_errors.labels(op=op).inc()


def not_yet_known(entries: list[tuple[XidEvent, bool]], known: tuple[XidEvent, ...]) -> list[tuple[XidEvent, bool]]:
    """The journal entries the restored report does not already hold (same GPU, XID and time).

    The report and the journal write the same instant (RFC 3339 with microseconds), so an event
    that reached the API before the restart compares equal and is not counted twice.
    """

    def same(a: XidEvent, b: XidEvent) -> bool:
        same_gpu = (bool(a.uuid) and a.uuid == b.uuid) or (a.gpu is not None and a.gpu == b.gpu)
        return same_gpu and a.xid == b.xid and a.time == b.time

    return [(e, baseline) for e, baseline in entries if not any(same(e, k) for k in known)]
