"""Writes the GPUNodeHealth report: creates it, merge-patches facts, and heartbeats.

The heartbeat is a node Lease renewal (``lease.py``) when the agent knows its Lease namespace: the
report is then written only when a fact changes (and once on start). Without one, the heartbeat is
a merge patch of the report's ``heartbeatTime``, as older agents did.

How a write reaches the API (the transport, the report's identity) is ``transport.py``'s; this
module decides when to write. One publisher thread owns all API traffic. Each write attempt
re-renders from the *latest* snapshot and drained XIDs, so retries after an outage publish the
current state instead of replaying stale bodies. Retryable failures (409, 429, 5xx, connection errors) back off
exponentially with jitter through tenacity and never give up while the agent runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

import tenacity

from gpuhealth.agent.events import XidBuffer
from gpuhealth.agent.journal import not_yet_known
from gpuhealth.agent.merge_patch import merge_patch
from gpuhealth.agent.metrics import AgentMetrics
from gpuhealth.agent.model import Snapshot, XidEvent
from gpuhealth.agent.report import ReportBuilder, now_utc
from gpuhealth.agent.transport import AlreadyExistsError, NotFoundError, ReportTransport, report_body
from gpuhealth.kube.errors import is_conflict, retryable, status_of

log = logging.getLogger(__name__)


class Renewer(Protocol):
    """A heartbeat that is not a report write (``lease.NodeLease``); raises what the API raised."""

    def renew(self, now: datetime) -> str: ...

    def changed(self) -> bool:
        """What a renewal vouches for changed: renew now rather than on schedule."""
        ...


def is_retryable(exc: BaseException) -> bool:
    """Failures worth retrying with growing delays: conflicts (the patch is re-sent whole), what
    ``gpuhealth.kube.errors.retryable`` says (throttling, server errors, the network), and 401/403.

    A restarted API server answers 403 until its authorization caches have synced; treating that
    as permanent stopped the heartbeat for the longest back-off (found by chaos: 30 s of silence
    after a kube-apiserver crash). A real RBAC mistake is retried too, at the capped rate, and
    counted in ``gpuhealth_agent_publish_errors_total``.
    """
    if isinstance(exc, NotFoundError | AlreadyExistsError):
        return False
    return retryable(exc) or is_conflict(exc) or status_of(exc) in (401, 403)


class LatestSnapshot:
    """A one-slot mailbox: the sampler overwrites, the publisher reads the newest."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value: Snapshot | None = None

    def set(self, snapshot: Snapshot) -> None:
        with self._lock:
            self._value = snapshot

    def get(self) -> Snapshot | None:
        with self._lock:
            return self._value


class Publisher:
    """The publisher thread: restore, then write on change and heartbeat on schedule."""

    def __init__(
        self,
        transport: ReportTransport,
        builder: ReportBuilder,
        latest: LatestSnapshot,
        xids: XidBuffer,
        *,
        heartbeat_interval_s: float = 30.0,
        initial_backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        metrics: AgentMetrics | None = None,
        lease: Renewer | None = None,
    ) -> None:
        self._transport = transport
        self._lease = lease
        self._builder = builder
        self._latest = latest
        self._xids = xids
        self._heartbeat_s = heartbeat_interval_s
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max(max_backoff_s, initial_backoff_s)
        self._metrics = metrics
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._exists: bool | None = None
        self._last_write = float("-inf")
        self._last_renew = float("-inf")
        self.restored = threading.Event()
        # This boot's XIDs from the local journal (XidJournal.load), adopted once after restore.
        self.replay: list[tuple[XidEvent, bool]] = []
        self.last_loop = time.monotonic()
        # Seconds after which a write gives up; None retries until stopped (the daemon's way).
        self.give_up_after_s: float | None = None

    # ---- thread control --------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpuhealth-publisher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("publisher thread did not stop in time")

    def wake(self) -> None:
        """Ask for an immediate look at the latest state (new sample or XID)."""
        self._wake.set()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ---- synchronous API (used by the thread, --once and tests) ----------------------------

    def restore(self) -> None:
        """Read the existing report once (retrying) and adopt this boot's XID history."""
        existing = self._retrying(self._transport.get, self._builder.node_name)
        spec = existing.get("spec") if isinstance(existing, dict) else None
        self._exists = existing is not None
        kept = self._builder.restore(spec if isinstance(spec, dict) else None)
        if existing is not None:
            log.info("found existing report %s; kept %d XID event(s) from this boot", self._builder.node_name, kept)
        # XIDs journaled before a crash that never reached the API: the next write carries them.
        replayed = 0
        for event, baseline in not_yet_known(self.replay, self._builder.history.events):
            replayed += self._builder.add_xid(event, baseline=baseline)
        if self.replay:
            log.info("XID journal: %d of %d event(s) were not in the report yet", replayed, len(self.replay))
        self.replay = []
        self.restored.set()

    def publish(self, force: bool = False) -> str | None:
        """Write whatever is due now; returns "create", "patch", "heartbeat", "lease" or None."""
        kind: str | None = self._retrying(self._attempt, force)
        return kind

    # ---- internals -------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.restore()
                break
            except Exception as exc:
                if self._stop.is_set():
                    return
                log.error("cannot read the existing report (will retry): %s", exc)
                self._stop.wait(self._max_backoff_s)
        while not self._stop.is_set():
            self.last_loop = time.monotonic()
            self._wake.clear()
            try:
                self.publish()
            except Exception as exc:
                if self._stop.is_set():
                    return
                # Not retryable (e.g. 403, 422): keep the state dirty and try again later.
                log.error("publishing the report failed: %s", exc)
                if self._metrics is not None:
                    self._metrics.publish_errors.inc()
                self._stop.wait(self._max_backoff_s)
                continue
            last = self._last_renew if self._lease is not None else self._last_write
            # Nothing written yet: wait for the first sample (it wakes us).
            due = self._heartbeat_s if last == float("-inf") else last + self._heartbeat_s - time.monotonic()
            self._wake.wait(max(0.0, min(due, self._heartbeat_s)))

    def _retrying(self, fn: Callable[..., Any], *args: Any) -> Any:
        half_step, half_cap = self._initial_backoff_s / 2, self._max_backoff_s / 2
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(is_retryable),
            # "Equal jitter": half the exponential step fixed, half random, so a fleet of
            # agents coming back from the same API outage does not retry in lockstep.
            wait=tenacity.wait_exponential(multiplier=half_step, max=half_cap)
            + tenacity.wait_random_exponential(multiplier=half_step, max=half_cap),
            stop=self._should_stop,
            sleep=self._sleep,
            before_sleep=self._before_sleep,
            reraise=True,
        )
        return retrying(fn, *args)

    def _sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _should_stop(self, state: tenacity.RetryCallState) -> bool:
        if self._stop.is_set():
            return True
        elapsed = state.seconds_since_start or 0.0
        return self.give_up_after_s is not None and elapsed >= self.give_up_after_s

    def _before_sleep(self, state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        if self._metrics is not None:
            self._metrics.publish_errors.inc()
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning("API write failed (attempt %d, retry in %.1fs): %s", state.attempt_number, wait, exc)

    def _drain_xids(self) -> None:
        for event, baseline in self._xids.drain():
            if self._builder.add_xid(event, baseline=baseline) and self._metrics is not None:
                self._metrics.xid_events.labels(
                    gpu=str(event.gpu if event.gpu is not None else ""),
                    xid=str(event.xid),
                    source=event.source,
                ).inc()

    def _attempt(self, force: bool) -> str | None:
        self._drain_xids()
        snapshot = self._latest.get()
        if snapshot is None:
            return None  # nothing sampled yet; the first sample wakes us
        now = now_utc()
        kind = self._write_report(snapshot, now, force)
        due = self._lease is not None and time.monotonic() - self._last_renew >= self._heartbeat_s
        if self._lease is not None and (due or self._lease.changed()):
            # After the report: a renewal vouches for an agent whose report (and XID watch) exists.
            self._lease.renew(now)
            self._last_renew = time.monotonic()
            self._count("lease")
            kind = kind or "lease"
        return kind

    def _write_report(self, snapshot: Snapshot, now: datetime, force: bool) -> str | None:
        """The report write that is due, if any: the facts changed, or (without a Lease) a heartbeat."""
        name = self._builder.node_name
        full = force or self._exists is not True or self._builder.needs_write(snapshot)
        kind: str | None = None
        heartbeat_due = self._lease is None and time.monotonic() - self._last_write >= self._heartbeat_s
        if not full and heartbeat_due:
            patch = self._builder.heartbeat_patch(now)
            try:
                self._transport.patch(name, {"spec": patch})
                self._builder.commit_heartbeat(patch)
                kind = "heartbeat"
            except NotFoundError:
                log.warning("report %s disappeared; recreating it", name)
                self._exists = False
                full = True
        if full:
            spec = self._builder.render(snapshot, now)
            kind = self._write_full(name, spec)
            self._builder.commit(snapshot, spec)
        if kind is None:
            return None
        self._last_write = time.monotonic()
        self._count(kind)
        log.debug("report %s: %s", name, kind)
        return kind

    def _count(self, kind: str) -> None:
        if self._metrics is not None:
            self._metrics.writes.labels(kind=kind).inc()
            self._metrics.last_write.set(time.time())

    def _write_full(self, name: str, spec: dict[str, Any]) -> str:
        if self._exists is True:
            try:
                self._transport.patch(name, {"spec": merge_patch(self._builder.last_spec or {}, spec)})
                return "patch"
            except NotFoundError:
                log.warning("report %s disappeared; recreating it", name)
                self._exists = False
                self._builder.last_spec = None
        try:
            self._transport.create(report_body(name, spec))
            self._exists = True
            return "create"
        except AlreadyExistsError:
            # Created concurrently (or our view was stale): diff against what is there.
            current = self._transport.get(name)
            existing = current.get("spec") if isinstance(current, dict) else None
            self._builder.last_spec = existing if isinstance(existing, dict) else {}
            self._exists = True
        self._transport.patch(name, {"spec": merge_patch(self._builder.last_spec or {}, spec)})
        return "patch"
