"""The GPUNodeHealth status format, in one place: the operator writes it and the plugin reads it here.

``Record`` is the part the state machine owns (it resumes from it after a restart); ``node_status``
adds what the operator reports beside it (policy, GPU counts, evidence). ``status.drain`` holds a
drain's progress, ``status.deviceDrains`` each GPU's; ``drain_is_current`` is the one rule that says
whether a drain record belongs to the current Draining episode of its node or GPU, and ``drain_done``
whether the node's has completed. ``StoredStatus`` is a node's whole status typed, the one way every
reader reads it back (the operator's rooms, the sweeper, the domain and rack findings, ``kubectl
gpuhealth``); the operator's store keeps one per resourceVersion of a report. ``Running`` is what one
says runs now, counted across a policy's nodes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol, TypedDict, cast

from gpuhealth.api.devices import DeviceRecord, devices_from_status
from gpuhealth.api.names import OUT_OF_SERVICE, Action, State
from gpuhealth.api.remediation_status import LadderRecord, Phase, Repair, ladders_from_status, repairs_from_status
from gpuhealth.api.timeutil import format_time, parse_time
from gpuhealth.api.validation import NodeValidation, Outcome, Trigger

MAX_EVIDENCE = 16

DRAIN_ACTIONS = (Action.DRAIN, Action.REPAIR)  # the verdicts that start a drain (status drainAction)
BREAKER_STATES = ("Closed", "Open")  # a policy's status.breaker


@dataclass(frozen=True, slots=True)
class Record:
    """The part of GPUNodeHealth status the state machine owns."""

    state: State = State.HEALTHY
    reason: str = ""
    message: str = ""
    since: dt.datetime | None = None
    quarantines: tuple[dt.datetime, ...] = ()
    healthy_since: dt.datetime | None = None
    cleared_before: dt.datetime | None = None
    held_by_breaker: bool = False
    drain_action: str = ""  # the action that started the drain: drain or repair
    drained: bool = False  # this quarantine's drain has completed; never drain twice for it

    @property
    def out_of_service(self) -> bool:
        return self.state in OUT_OF_SERVICE

    def to_status(self) -> dict[str, Any]:
        return {
            "state": str(self.state),
            "reason": self.reason,
            "message": self.message,
            "since": format_time(self.since) if self.since else None,
            "quarantines": [format_time(t) for t in self.quarantines],
            "healthySince": format_time(self.healthy_since) if self.healthy_since else None,
            "clearedBefore": format_time(self.cleared_before) if self.cleared_before else None,
            "heldByBreaker": self.held_by_breaker,
            "drainAction": self.drain_action or None,
            "drained": self.drained or None,
        }

    @staticmethod
    def from_status(status: Mapping[str, Any] | None) -> Record:
        s = status or {}
        try:
            state = State(str(s.get("state") or "Healthy"))
        except ValueError:
            state = State.HEALTHY
        quarantines = tuple(t for t in (parse_time(str(x)) for x in (s.get("quarantines") or [])) if t)
        return Record(
            state=state,
            reason=str(s.get("reason") or ""),
            message=str(s.get("message") or ""),
            since=parse_time(s.get("since")),
            quarantines=quarantines,
            healthy_since=parse_time(s.get("healthySince")),
            cleared_before=parse_time(s.get("clearedBefore")),
            held_by_breaker=bool(s.get("heldByBreaker", False)),
            drain_action=str(s.get("drainAction") or ""),
            drained=bool(s.get("drained", False)),
        )


class PodDrain(TypedDict, total=False):
    """One pod's progress in ``status.drain.pods`` (keyed by pod uid)."""

    pod: str  # namespace/name
    node: str
    requestedAt: str
    acknowledgedAt: str
    overdueNotified: bool
    evictedAt: str
    blocked: int  # evictions a PodDisruptionBudget refused so far
    retryAt: str
    forceDeletedAt: str
    workload: str  # namespace/name of the Kueue Workload moved as a whole instead of evicting the pod


class WorkloadMove(TypedDict, total=False):
    """One Kueue Workload in ``status.drain.workloads`` (keyed by namespace/name): moved by our check's Retry."""

    workload: str
    uid: str
    state: str  # our check's state as last seen (Ready, Retry, Pending), or Evicted
    retriedAt: str  # when gpuhealth set its check to Retry (once)
    message: str
    fellBack: bool  # Kueue did not move it within drain/kueue.py MOVE_TIMEOUT_S: its pods were evicted


class DrainRecord(TypedDict, total=False):
    """``status.drain``: a drain's progress, written before its first request so a restart resumes it."""

    phase: str  # Queued, Running, Completed
    startedAt: str
    completedAt: str
    fatal: bool
    pods: dict[str, PodDrain]
    total: int
    evicted: int
    waitingForCheckpoint: int
    blockedByBudget: int
    timedOut: list[str]  # gangs whose checkpoint timeout was announced
    workloads: dict[str, WorkloadMove]  # Kueue Workloads moved through gpuhealth's AdmissionCheck


class ClockSkewRecord(TypedDict):
    """``status.clockSkew``: a clock-skew episode of the node's agent, while it lasts
    (``evaluation/freshness.py`` ``skew_episode``). Kept in the status so a restarted operator finds
    the episode it announced and does not announce it again."""

    offsetSeconds: int  # the agent's clock minus the operator's (or the API server's); positive: ahead
    since: str  # when the operator first saw it (RFC 3339)


def evidence_entry(
    signal: str,
    reason: str,
    action: str,
    detail: str,
    gpu: int | None = None,
    uuid: str = "",
    code: int | None = None,
    since: dt.datetime | None = None,
) -> dict[str, Any]:
    """One ``status.evidence`` item: a finding as the plugin shows it."""
    e: dict[str, Any] = {"signal": signal, "reason": reason, "action": action, "detail": detail}
    if gpu is not None:
        e["gpu"] = gpu
    if uuid:
        e["uuid"] = uuid
    if code is not None:
        e["code"] = code
    if since:
        e["since"] = format_time(since)
    return e


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True, slots=True)
class Evidence:
    """One ``status.evidence`` item as read back: a finding as the operator recorded it (``evidence_entry``)."""

    signal: str
    reason: str = ""
    action: str = ""
    detail: str = ""
    gpu: int | None = None
    uuid: str = ""
    code: int | None = None
    since: dt.datetime | None = None

    def to_status(self) -> dict[str, Any]:
        return evidence_entry(
            self.signal, self.reason, self.action, self.detail, self.gpu, self.uuid, self.code, self.since
        )

    @staticmethod
    def from_status(entry: Any) -> Evidence | None:
        """The item from a ``status.evidence`` entry; None for one that is not an object."""
        if not isinstance(entry, Mapping):
            return None
        return Evidence(
            signal=str(entry.get("signal") or ""),
            reason=str(entry.get("reason") or ""),
            action=str(entry.get("action") or ""),
            detail=str(entry.get("detail") or ""),
            gpu=_count(entry.get("gpu")),
            uuid=str(entry.get("uuid") or ""),
            code=_count(entry.get("code")),
            since=parse_time(entry.get("since")),
        )


def node_status(
    record: Record,
    *,
    policy: str,
    overridden: Sequence[str],
    dry_run: bool,
    total_gpus: int,
    healthy_gpus: int,
    last_xid: str,
    evidence: Sequence[Mapping[str, Any]],
    pending: Mapping[str, Any],
    unknown_message: str = "",
    devices: Sequence[Mapping[str, Any]] = (),
    in_service_gpus: int | None = None,
    clock_skew: ClockSkewRecord | None = None,
) -> dict[str, Any]:
    """The whole status the operator writes (``None`` drops a key in a merge patch).

    ``devices`` is the per-GPU record (``api.devices``); ``in_service_gpus`` the GPUs the scheduler
    may allocate (what ``kubectl get gpunodes`` shows as HEALTHY-GPUS); ``clock_skew`` the agent's
    clock-skew episode while it lasts.
    """
    body: dict[str, Any] = dict(record.to_status())
    body.update(
        policy=policy,
        overriddenPolicies=list(overridden) or None,
        dryRun=dry_run or None,
        totalGPUs=total_gpus,
        healthyGPUs=healthy_gpus,
        lastXid=last_xid or None,
        evidence=[dict(e) for e in evidence[:MAX_EVIDENCE]] or None,
        pending=dict(pending) or None,
        devices=[dict(d) for d in devices] or None,
        inServiceGPUs=in_service_gpus,
        clockSkew=dict(clock_skew) if clock_skew else None,
    )
    if record.state == State.UNKNOWN:
        body["message"] = unknown_message or body.get("message")
    return body


def status_changes(prev: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``body`` that differ from ``prev`` (a ``None`` for a key already absent is no change)."""
    return {k: v for k, v in body.items() if prev.get(k) != v and not (v is None and k not in prev)}


class Episode(Protocol):
    """A record whose state began at ``since``: a node's ``Record``, a GPU's ``api.devices.DeviceRecord``."""

    @property
    def since(self) -> dt.datetime | None: ...


def drain_is_current(drain: Mapping[str, Any], episode: Episode) -> bool:
    """The drain record (the node's ``status.drain``, or a GPU's ``status.deviceDrains`` entry) belongs
    to the episode's current Draining episode: it started at or after the episode began (a second's
    slack, times are written to the second), or one of the two times is unknown."""
    started = parse_time(drain.get("startedAt"))
    return started is None or episode.since is None or started >= episode.since - dt.timedelta(seconds=1)


def drain_done(drain: DrainRecord, rec: Record) -> bool:
    """This episode's drain has completed."""
    return drain.get("phase") == "Completed" and bool(drain.get("startedAt")) and drain_is_current(drain, rec)


def read_drain(status: Mapping[str, Any] | None) -> DrainRecord:
    """``status.drain`` (a copy), empty when there is none."""
    return cast(DrainRecord, dict((status or {}).get("drain") or {}))


def read_device_drains(status: Mapping[str, Any] | None) -> dict[int, DrainRecord]:
    """``status.deviceDrains`` by GPU index (each a copy): each device drain's progress."""
    raw = (status or {}).get("deviceDrains") or {}
    out: dict[int, DrainRecord] = {}
    if isinstance(raw, Mapping):
        for k, v in raw.items():
            if str(k).isdigit() and isinstance(v, Mapping):
                out[int(k)] = DrainRecord(**v)  # type: ignore[typeddict-item]
    return out


def written_status(report: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The status of a GPUNodeHealth object (or of none) as written, empty when it has none."""
    return (report or {}).get("status") or {}


class StoredStatus:
    """A node's GPUNodeHealth status as every reader reads it back, typed: what the state machine, the
    GPUs' verdicts, the drains, the repair ladders and the node's validation each resume from, and
    what the plugin shows. Each part is parsed when first read and kept (most passes read few of them:
    a healthy node's none but the record). Read only: a room copies what it edits."""

    def __init__(self, written: Mapping[str, Any]) -> None:
        self.written = written  # the status as written: what the next status write is diffed against

    @staticmethod
    def read(status: Mapping[str, Any] | None) -> StoredStatus:
        return StoredStatus(status or {})

    @staticmethod
    def of(report: Mapping[str, Any] | None) -> StoredStatus:
        """The status of a GPUNodeHealth object (or of none: empty)."""
        return StoredStatus(written_status(report))

    @property
    def state(self) -> State | None:
        """The node's verdict; None before the operator has written one."""
        return self.record.state if self.decided else None

    @property
    def policy(self) -> str | None:
        """The governing policy the operator named ("" none governs); None before it wrote one."""
        value = self.written.get("policy")
        return value if isinstance(value, str) else None

    @property
    def overridden_policies(self) -> tuple[str, ...]:
        """Policies that also select the node and lost to ``policy``."""
        value = self.written.get("overriddenPolicies")
        return tuple(str(p) for p in value) if isinstance(value, list) else ()

    @property
    def dry_run(self) -> bool:
        return bool(self.written.get("dryRun", False))

    @property
    def total_gpus(self) -> int | None:
        return _count(self.written.get("totalGPUs"))

    @property
    def healthy_gpus(self) -> int | None:
        return _count(self.written.get("healthyGPUs"))

    @property
    def in_service_gpus(self) -> int | None:
        """The GPUs the scheduler may allocate (``kubectl get gpunodes`` HEALTHY-GPUS)."""
        return _count(self.written.get("inServiceGPUs"))

    @property
    def last_xid(self) -> str | None:
        value = self.written.get("lastXid")
        return None if value is None else str(value)

    @cached_property
    def evidence(self) -> tuple[Evidence, ...]:
        """``status.evidence``: the findings behind the verdict (the first ``MAX_EVIDENCE``)."""
        raw = self.written.get("evidence")
        if not isinstance(raw, list):
            return ()
        return tuple(e for e in (Evidence.from_status(x) for x in raw) if e is not None)

    @cached_property
    def record(self) -> Record:
        """The state machine's record as written."""
        return Record.from_status(self.written)

    @property
    def decided(self) -> bool:
        """A verdict has been written (the operator has decided on this node before)."""
        return bool(self.written.get("state"))

    @cached_property
    def devices(self) -> Mapping[int, DeviceRecord]:
        """The per-GPU records (``status.devices``) by index."""
        return devices_from_status(self.written)

    @cached_property
    def unreadable(self) -> bool:
        """Some GPU verdict (``status.devices``) or ladder (``status.remediation``) as written could not be
        read (a damaged status, or one a newer version wrote): a reader that must not guess what it
        says (the sweeper) takes the node as changing."""
        devices = self.written.get("devices")
        ladders = self.written.get("remediation")
        return (devices is not None and (not isinstance(devices, list) or len(devices) != len(self.devices))) or (
            ladders is not None and (not isinstance(ladders, Mapping) or len(ladders) != len(self.ladders))
        )

    @cached_property
    def drain(self) -> DrainRecord:
        """``status.drain``, empty when none."""
        return read_drain(self.written)

    @cached_property
    def device_drains(self) -> Mapping[int, DrainRecord]:
        """``status.deviceDrains`` by GPU index."""
        return read_device_drains(self.written)

    @cached_property
    def ladders(self) -> Mapping[int, LadderRecord]:
        """``status.remediation`` by GPU index."""
        return ladders_from_status(self.written)

    @cached_property
    def ladder_entries(self) -> Mapping[str, Mapping[str, Any]]:
        """``status.remediation`` as written (a merge patch's base)."""
        entries = self.written.get("remediation") or {}
        return entries if isinstance(entries, Mapping) else {}

    @cached_property
    def repairs(self) -> Mapping[str, tuple[Repair, ...]]:
        """``status.repairs`` by GPU UUID."""
        return repairs_from_status(self.written)

    @cached_property
    def node_validation(self) -> NodeValidation | None:
        return NodeValidation.from_status(self.written.get("nodeValidation"))

    @property
    def pending(self) -> Mapping[str, Any]:
        """First-seen times of duration-based signals."""
        return self.written.get("pending") or {}

    @property
    def clock_skew(self) -> Mapping[str, Any] | None:
        """``status.clockSkew`` as written."""
        skew = self.written.get("clockSkew")
        return skew if isinstance(skew, Mapping) else None

    @property
    def skew_seconds(self) -> int | None:
        """The agent's clock offset while a skew episode lasts (positive: ahead), else None."""
        skew = self.clock_skew
        return _count(skew.get("offsetSeconds")) if skew is not None else None


@dataclass(frozen=True, slots=True)
class Running:
    """What a node's status says runs now, counted across a policy's nodes against its limits:
    ``spec.remediation.maxConcurrent`` (ladder steps in flight), ``spec.validation.maxConcurrent``
    (the GPUs' validation Jobs and the node's after a release) and ``newNodes.batchSize`` (burn-ins)."""

    policy: str | None  # the governing policy the status names
    steps: int = 0
    validations: int = 0
    burn_ins: int = 0

    @staticmethod
    def of(stored: StoredStatus) -> Running:
        ladders = stored.ladders.values()
        nv = stored.node_validation
        node_running = nv is not None and nv.validation.outcome == Outcome.RUNNING
        return Running(
            policy=stored.policy,
            steps=sum(1 for r in ladders if r.in_flight),
            validations=sum(
                1
                for r in ladders
                if r.phase == Phase.VALIDATING and r.validation and r.validation.outcome == Outcome.RUNNING
            )
            + (node_running and nv is not None and nv.trigger == Trigger.RELEASE),
            burn_ins=int(node_running and nv is not None and nv.trigger == Trigger.BURN_IN),
        )
