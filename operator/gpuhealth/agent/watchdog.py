"""The NVML watchdog: a call into a wedged GPU or driver can block forever, and that is a fault too.

Without it a hung NVML call was reported as nothing: the sampler stopped, the publisher kept renewing
the node Lease from the last snapshot, so a fresh heartbeat vouched for stale facts; the liveness
probe then restarted the agent, ``nvmlInit`` blocked again, and the node ended as a silent agent.
NVIDIA's NVSentinel treats a telemetry call that never returns as a fault of its own (a watchdog at
three poll intervals, a marker that survives restarts).

So the sampler brackets every sample (``begin``/``end``) and this thread, which never touches NVML,
checks it: a sample in progress for longer than the bound (``after_s``, three sampling intervals by
default) is a hang. It names the call (the innermost ``pynvml`` function on the sampler's stack) and
when it started, puts that into the snapshot the publisher writes (``nvml.unresponsive`` in the
report, the Lease annotation ``gpuhealth.dev/nvml-unresponsive``) and keeps it on disk, in the state
directory the XID journal lives in (``HangMarker``), so a restarted agent whose ``nvmlInit`` blocks
again says so at once instead of going silent. A sample that completes ends it, and the marker goes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuhealth.agent.journal import BOOT_TOLERANCE_S
from gpuhealth.agent.metrics import AgentMetrics
from gpuhealth.agent.model import NvmlStatus, Snapshot, SourceName
from gpuhealth.agent.publisher import LatestSnapshot
from gpuhealth.agent.report import now_utc, rfc3339
from gpuhealth.api.report import NvmlHang
from gpuhealth.api.timeutil import parse_time

log = logging.getLogger(__name__)

MARKER_FILE = "nvml-unresponsive.json"
UNKNOWN_CALL = "unknown"


def call_in_progress(thread_id: int | None) -> str:
    """The innermost ``pynvml`` NVML function on the stack of thread ``thread_id`` (the C call it is
    blocked in has the same name), or ``"unknown"``. Read from another thread: the blocked one holds
    no lock we need, and ctypes released the GIL for the call."""
    frame = sys._current_frames().get(thread_id) if thread_id is not None else None
    while frame is not None:
        if frame.f_globals.get("__name__") == "pynvml" and frame.f_code.co_name.startswith("nvml"):
            return frame.f_code.co_name
        frame = frame.f_back
    return UNKNOWN_CALL


class HangMarker:
    """This boot's hang, on disk (written atomically), so that it outlives the agent's restarts.

    Like the XID journal it belongs to one host boot: a marker of another boot (a reboot is what
    clears a wedged GPU) is ignored. Without a state directory there is no marker.
    """

    def __init__(self, state_dir: str | None, boot_time: datetime | None) -> None:
        self.path = Path(state_dir) / MARKER_FILE if state_dir else None
        self.boot_time = boot_time

    def load(self) -> NvmlHang | None:
        if self.path is None or not self.path.exists():
            return None
        try:
            raw: Any = json.loads(self.path.read_text())
            boot = parse_time(raw.get("bootTime"))
            since = parse_time(raw.get("since"))
            call = raw.get("call")
        except (OSError, ValueError, AttributeError) as exc:
            log.warning("ignoring unreadable NVML hang marker %s: %s", self.path, exc)
            return None
        if since is None or not isinstance(call, str) or not call:
            return None
        if self.boot_time is None or boot is None or abs((boot - self.boot_time).total_seconds()) > BOOT_TOLERANCE_S:
            return None  # another boot's
        return NvmlHang(call, since, parse_time(raw.get("lastSample")))

    def save(self, hang: NvmlHang) -> None:
        if self.path is None:
            return
        body = {
            "call": hang.call,
            "since": rfc3339(hang.since),
            "lastSample": rfc3339(hang.last_sample) if hang.last_sample else None,
            "bootTime": rfc3339(self.boot_time) if self.boot_time else None,
        }
        tmp = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w") as f:
                f.write(json.dumps(body, sort_keys=True))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("cannot keep the NVML hang marker in %s (a restart will not know): %s", self.path, exc)

    def clear(self) -> None:
        if self.path is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("cannot remove the NVML hang marker %s: %s", self.path, exc)


class NvmlWatchdog:
    """Watches the sampler from a thread of its own; see the module's doc."""

    def __init__(
        self,
        *,
        after_s: float,
        latest: LatestSnapshot,
        wake: Callable[[], None],
        marker: HangMarker,
        sources: tuple[SourceName, ...] = ("nvml",),
        metrics: AgentMetrics | None = None,
        check_s: float | None = None,
    ) -> None:
        self.after_s = after_s
        self.check_s = check_s if check_s is not None else max(0.05, min(1.0, after_s / 10))
        self._latest = latest
        self._wake = wake
        self._marker = marker
        self._sources = sources
        self._metrics = metrics
        self._lock = threading.Lock()
        self._started: tuple[float, datetime, int] | None = None  # monotonic, wall, thread of the sample
        self.hang: NvmlHang | None = None
        self.last_sample: datetime | None = None  # when the newest completed sample was taken
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- the sampler's side ---------------------------------------------------------------

    def begin(self) -> None:
        """A sample starts (on the sampler's thread)."""
        with self._lock:
            self._started = (time.monotonic(), now_utc(), threading.get_ident())

    def end(self, snapshot: Snapshot | None) -> None:
        """The sample returned: ``snapshot`` becomes the latest (None: it failed). NVML answered, so a
        hang is over either way."""
        with self._lock:
            self._started = None
            hang, self.hang = self.hang, None
            if snapshot is not None:
                self.last_sample = snapshot.time
                self._latest.set(snapshot)
        if hang is not None:
            self._marker.clear()
            log.warning("NVML answers again (%s had hung since %s)", hang.call, rfc3339(hang.since))
            if self._metrics is not None:
                self._metrics.nvml_unresponsive.set(0)

    def restore(self) -> NvmlHang | None:
        """At start: this boot's marker, if a previous run left one, is the latest snapshot (no GPU facts,
        NVML unresponsive since then) until a sample completes."""
        hang = self._marker.load()
        if hang is None:
            return None
        log.error("NVML was unresponsive before this restart (%s since %s)", hang.call, rfc3339(hang.since))
        with self._lock:
            self.hang = hang
            status = NvmlStatus(available=False, error=_message(hang), hang=hang)
            self._latest.set(Snapshot(time=hang.last_sample or hang.since, nvml=status, sources=self._sources))
        if self._metrics is not None:
            self._metrics.nvml_unresponsive.set(1)
        return hang

    # ---- the watchdog's side --------------------------------------------------------------

    def check(self, now: float | None = None) -> NvmlHang | None:
        """Declare a hang if the sample in progress has run past the bound; returns a new hang."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._started is None or self.hang is not None or now - self._started[0] <= self.after_s:
                return None
            _, since, thread_id = self._started
            hang = NvmlHang(call_in_progress(thread_id), since, self.last_sample)
            self.hang = hang
            base = self._latest.get() or Snapshot(
                time=since, nvml=NvmlStatus(available=False, error="NVML not initialised yet"), sources=self._sources
            )
            nvml = dataclasses.replace(base.nvml, hang=hang)
            if not nvml.available:
                nvml = dataclasses.replace(nvml, error=_message(hang))
            self._latest.set(dataclasses.replace(base, nvml=nvml))
        self._marker.save(hang)
        log.error("%s; the GPU facts are no longer refreshed", _message(hang))
        if self._metrics is not None:
            self._metrics.nvml_unresponsive.set(1)
        self._wake()
        return hang

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpuhealth-nvml-watchdog", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.check_s):
            try:
                self.check()
            except Exception:
                log.exception("NVML watchdog check failed")


def _message(hang: NvmlHang) -> str:
    return f"NVML unresponsive: {hang.call} has not returned since {rfc3339(hang.since)}"
