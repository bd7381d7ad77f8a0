"""The repair ladder's per-GPU record, the repairs kept by GPU UUID, and the approvals a step waits on.

Where each GPU stands on its ladder is kept in GPUNodeHealth ``status.remediation["<GPU index>"]`` (a
:class:`LadderRecord`), written *before* any Job is created, so a restarted operator finds the step,
the attempt and the Job's name again and never starts a second reset. Each finished attempt is also
kept by the GPU's UUID in ``status.repairs`` (:class:`Repair`): an index may change across a reboot,
a UUID does not, and that history is what makes a GPU a repeat offender. A human's answer to a
step that waits (``approval: Manual`` or ``TwoPerson``) is read from the Node's annotations
(:class:`Approvals`); who approved, and when gpuhealth saw it, is kept in the record (:class:`Approver`).

Pure: the record's codec and what it says. The settings the ladder climbs under (``spec.remediation``)
are ``api/remediation.py``'s; what moves the record is ``evaluation/ladder.py``'s.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpuhealth.api.names import (
    APPROVE_ANNOTATION,
    APPROVE_GPU_ANNOTATION,
    APPROVER_ANNOTATION_PREFIX,
    REJECT_ANNOTATION,
    REJECT_GPU_ANNOTATION,
    StepKind,
)
from gpuhealth.api.remediation import ApprovalStep, RepeatSettings
from gpuhealth.api.timeutil import format_time, parse_time
from gpuhealth.api.validation import Validation

MAX_HISTORY = 10
MAX_REPAIRS = 10  # attempts kept per GPU UUID in status.repairs (the repeat offenders' history)
MAX_REPAIR_GPUS = 32  # GPU UUIDs kept in status.repairs (a node's GPUs and those replaced lately)
MAX_APPROVERS = 16  # approvers kept per step (the CRD's maxItems); two are all a step ever needs
MAX_APPROVER_LEN = 512  # a longer user name counts as no approval (the CRD's maxLength)


class Phase(StrEnum):
    READY = "Ready"  # the step is next; it starts once its preconditions hold
    PENDING_APPROVAL = "PendingApproval"  # approval: Manual; the step (or validation) waits for a human
    PENDING = "Pending"  # write-ahead: the Job is being created under ``job``
    RUNNING = "Running"  # the Job exists
    VERIFYING = "Verifying"  # the Job succeeded; waiting for the agent's clean facts
    VALIDATING = "Validating"  # clean facts; the validation Job (spec.validation) must pass first
    HANDED_OFF = "HandedOff"  # NodeReboot: the node waits for its remediator
    SUCCEEDED = "Succeeded"  # clean facts after the step: probation runs as usual
    # Device-plugin route: repaired, on probation no longer, but the device plugin still withholds it
    # (it holds the GPU Unhealthy until it restarts): its pod is restarted, the GPU returns once the
    # Node's allocatable shows it again (``plugin``).
    RESTARTING_PLUGIN = "RestartingPlugin"
    AWAITING_REPAIR = "AwaitingRepair"  # Replace: the ladder is exhausted
    DRY_RUN = "DryRun"  # DryRun: what would be done was announced, nothing done


IN_FLIGHT = frozenset({Phase.PENDING, Phase.RUNNING, Phase.VERIFYING, Phase.VALIDATING})


class Result(StrEnum):
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"  # the Job failed
    TIMED_OUT = "TimedOut"  # the step ran past its timeout
    NOT_CLEAN = "NotClean"  # the Job succeeded but the GPU's facts did not clear in time
    LOST = "Lost"  # the Job vanished before its result was read
    RELAPSED = "Relapsed"  # clean after the step, then the fault came back
    HANDED_OFF = "HandedOff"
    VALIDATION_FAILED = "ValidationFailed"  # clean facts, but the validation Job failed (api/validation.py)
    VALIDATION_TIMED_OUT = "ValidationTimedOut"
    VALIDATION_LOST = "ValidationLost"  # the validation Job or its pod vanished before a result
    REJECTED = "Rejected"  # approval: Manual; a human rejected the step (gpuhealth.dev/reject)


@dataclass(frozen=True)
class Attempt:
    step: StepKind
    attempt: int
    started: dt.datetime | None
    finished: dt.datetime | None
    result: Result

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": str(self.step), "attempt": self.attempt, "result": str(self.result)}
        if self.started:
            out["startedAt"] = format_time(self.started)
        if self.finished:
            out["finishedAt"] = format_time(self.finished)
        return out

    @staticmethod
    def from_status(m: Mapping[str, Any]) -> Attempt | None:
        try:
            return Attempt(
                StepKind(str(m.get("step"))),
                int(m.get("attempt") or 1),
                parse_time(m.get("startedAt")),
                parse_time(m.get("finishedAt")),
                Result(str(m.get("result"))),
            )
        except (ValueError, TypeError):
            return None


@dataclass(frozen=True)
class PluginRestart:
    """The device plugin's restart after a repair (``Phase.RESTARTING_PLUGIN``), written before the pod
    is deleted: ``pod`` and ``uid`` first, then the delete (with that uid as its precondition, so it can
    never take the pod the DaemonSet made in its place), then ``deleted``. ``blocked``: why it could not
    be restarted (no such pod, no permission, a taint its DaemonSet would not tolerate); ``timed_out``:
    the Node's allocatable did not show the GPU within the policy's ``returnTimeout``."""

    started: dt.datetime | None = None
    pod: str = ""  # namespace/name of the plugin's pod on the node
    uid: str = ""
    deleted: bool = False
    blocked: str = ""
    timed_out: bool = False

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        optional: dict[str, Any] = {
            "startedAt": format_time(self.started) if self.started else "",
            "pod": self.pod,
            "uid": self.uid,
            "deleted": self.deleted,
            "blocked": self.blocked,
            "timedOut": self.timed_out,
        }
        out.update({k: v for k, v in optional.items() if v})
        return out

    @staticmethod
    def from_status(m: Any) -> PluginRestart | None:
        if not isinstance(m, Mapping):
            return None
        return PluginRestart(
            started=parse_time(m.get("startedAt")),
            pod=str(m.get("pod") or ""),
            uid=str(m.get("uid") or ""),
            deleted=m.get("deleted") is True,
            blocked=str(m.get("blocked") or ""),
            timed_out=m.get("timedOut") is True,
        )


@dataclass(frozen=True)
class Approver:
    """One person's approval of a waiting step: the user name the API server authenticated (the
    admission policy makes the annotation's value that), and when gpuhealth recorded it."""

    by: str
    at: dt.datetime | None = None

    def to_status(self) -> dict[str, Any]:
        return {"by": self.by, **({"at": format_time(self.at)} if self.at else {})}

    @staticmethod
    def from_status(m: Any) -> Approver | None:
        if not isinstance(m, Mapping) or not m.get("by"):
            return None
        return Approver(str(m["by"]), parse_time(m.get("at")))


def merge_approvers(have: Iterable[Approver], names: Iterable[str], now: dt.datetime) -> tuple[Approver, ...]:
    """``have`` and the approvers ``names`` not yet among them (seen ``now``): the same person
    approving twice counts once, with the time of the first."""
    out = list(have)
    known = {a.by for a in out}
    for n in sorted(set(names) - known):
        out.append(Approver(n, now))
    return tuple(out[:MAX_APPROVERS])


def approver_words(approvers: Iterable[Approver]) -> str:
    """``alice (at 2025-06-01T12:00:00Z) and bob (at ...)``: who approved, for a message or an Event."""
    parts = [f"{a.by} (at {format_time(a.at)})" if a.at else a.by for a in approvers]
    return " and ".join(parts) if len(parts) <= 2 else ", ".join(parts[:-1]) + f" and {parts[-1]}"


@dataclass(frozen=True)
class LadderRecord:
    """Where one GPU stands on its ladder (``status.remediation["<index>"]``)."""

    index: int
    step: StepKind
    attempt: int = 1
    phase: Phase = Phase.READY
    reason: str = ""  # the fault the ladder is for
    uuid: str = ""
    since: dt.datetime | None = None  # the ladder began (the episode: part of every Job name)
    fault_since: dt.datetime | None = None  # the GPU left service (for MTTR)
    started: dt.datetime | None = None  # this step's attempt began
    finished: dt.datetime | None = None  # this step's attempt ended (Job done, hand-off over)
    job: str = ""  # namespace/name of this attempt's Job, recorded before it is created
    message: str = ""
    history: tuple[Attempt, ...] = field(default=())
    validation: Validation | None = None  # this attempt's validation (Phase.VALIDATING and after)
    approved: bool = False  # approval: Manual/TwoPerson; approved enough, the step starts once it may
    plugin: PluginRestart | None = None  # the device plugin's restart (Phase.RESTARTING_PLUGIN)
    # Who approved this step (or its validation), by identity, first first; kept past the step's start
    # until the next step waits.
    approvers: tuple[Approver, ...] = ()

    @property
    def in_flight(self) -> bool:
        return self.phase in IN_FLIGHT

    @property
    def approval_step(self) -> ApprovalStep:
        """What the record waits to run in PendingApproval, as ``spec.remediation.twoPersonSteps`` names it."""
        if self.validation is not None:
            return ApprovalStep.VALIDATION
        return ApprovalStep.NODE_REBOOT if self.step == StepKind.NODE_REBOOT else ApprovalStep.GPU_RESET

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": str(self.step), "attempt": self.attempt, "phase": str(self.phase)}
        optional: dict[str, Any] = {
            "reason": self.reason,
            "uuid": self.uuid,
            "since": format_time(self.since) if self.since else "",
            "faultSince": format_time(self.fault_since) if self.fault_since else "",
            "startedAt": format_time(self.started) if self.started else "",
            "finishedAt": format_time(self.finished) if self.finished else "",
            "job": self.job,
            "message": self.message,
            "history": [a.to_status() for a in self.history[-MAX_HISTORY:]],
            "validation": self.validation.to_status() if self.validation else None,
            "approved": self.approved,
            "plugin": self.plugin.to_status() if self.plugin else None,
            "approvers": [a.to_status() for a in self.approvers],
        }
        out.update({k: v for k, v in optional.items() if v})
        return out

    @staticmethod
    def from_status(index: int, m: Mapping[str, Any]) -> LadderRecord | None:
        try:
            step, phase = StepKind(str(m.get("step"))), Phase(str(m.get("phase")))
        except ValueError:
            return None
        raw = m.get("history") or []
        history = tuple(a for a in (Attempt.from_status(x) for x in raw if isinstance(x, Mapping)) if a)
        return LadderRecord(
            index=index,
            step=step,
            attempt=int(m.get("attempt") or 1),
            phase=phase,
            reason=str(m.get("reason") or ""),
            uuid=str(m.get("uuid") or ""),
            since=parse_time(m.get("since")),
            fault_since=parse_time(m.get("faultSince")),
            started=parse_time(m.get("startedAt")),
            finished=parse_time(m.get("finishedAt")),
            job=str(m.get("job") or ""),
            message=str(m.get("message") or ""),
            history=history[-MAX_HISTORY:],
            validation=Validation.from_status(m.get("validation")),
            approved=m.get("approved") is True,
            plugin=PluginRestart.from_status(m.get("plugin")),
            approvers=tuple(a for a in map(Approver.from_status, m.get("approvers") or []) if a is not None),
        )


def ladders_from_status(status: Mapping[str, Any] | None) -> dict[int, LadderRecord]:
    """``status.remediation`` by GPU index; unreadable entries are dropped."""
    raw = (status or {}).get("remediation") or {}
    out: dict[int, LadderRecord] = {}
    if isinstance(raw, Mapping):
        for k, v in raw.items():
            if str(k).isdigit() and isinstance(v, Mapping):
                rec = LadderRecord.from_status(int(k), v)
                if rec is not None:
                    out[rec.index] = rec
    return out


# -- human approval: the Node's annotations -------------------------------------------------------


def _indices(raw: Any) -> frozenset[int]:
    return frozenset(int(p) for p in str(raw or "").replace(" ", "").split(",") if p.isdigit())


# gpuhealth.dev/approver.<slot> (the node) or gpuhealth.dev/approver-gpu-<index>.<slot> (one GPU).
_APPROVER_KEY = re.compile(re.escape(APPROVER_ANNOTATION_PREFIX) + r"(?:-gpu-(\d{1,4}))?\.[A-Za-z0-9][-A-Za-z0-9_.]*$")
_SLOT_CHARS = re.compile(r"[^a-z0-9]+")


def approver_key(user: str, gpu: int | None = None) -> str:
    """The annotation ``user``'s approval is written under (its value is ``user``): a slot of the user's
    own, readable and unique (a digest of the name), so two people's approvals never share a key."""
    digest = hashlib.sha256(user.encode()).hexdigest()[:10]
    readable = _SLOT_CHARS.sub("-", user.lower()).strip("-")[:30].strip("-")
    slot = f"{readable}-{digest}" if readable else digest
    return f"{APPROVER_ANNOTATION_PREFIX}{'' if gpu is None else f'-gpu-{gpu}'}.{slot}"


@dataclass(frozen=True)
class Approvals:
    """What people (``kubectl gpuhealth approve|reject``, or any system) asked of the Node's waiting
    steps: ``gpuhealth.dev/approve`` (all of them) or ``approve-gpu`` (``"3"``, ``"3,5"``), and the
    same for ``reject``; and approvals that record their approver (``gpuhealth.dev/approver.<slot>``,
    ``approver-gpu-<index>.<slot>``, the value the approver's user name). A rejection wins over an
    approval of the same GPU. ``keys``: the approval annotations read, removed once acted on."""

    approve_all: bool = False
    approve: frozenset[int] = frozenset()
    reject_all: bool = False
    reject: frozenset[int] = frozenset()
    by_all: frozenset[str] = frozenset()  # approvers of every waiting step of the node
    by_gpu: Mapping[int, frozenset[str]] = field(default_factory=dict)  # approvers of one GPU's step
    keys: frozenset[str] = frozenset()

    @staticmethod
    def from_annotations(annotations: Mapping[str, Any]) -> Approvals:
        by_all: set[str] = set()
        by_gpu: dict[int, set[str]] = {}
        keys = {k for k in APPROVAL_ANNOTATIONS if k in annotations}
        for k, v in annotations.items():
            m = _APPROVER_KEY.match(str(k))
            if m is None:
                continue
            keys.add(str(k))
            who = str(v or "").strip()
            if not who or len(who) > MAX_APPROVER_LEN:
                continue
            if m.group(1) is None:
                by_all.add(who)
            else:
                by_gpu.setdefault(int(m.group(1)), set()).add(who)
        return Approvals(
            approve_all=APPROVE_ANNOTATION in annotations,
            approve=_indices(annotations.get(APPROVE_GPU_ANNOTATION)),
            reject_all=REJECT_ANNOTATION in annotations,
            reject=_indices(annotations.get(REJECT_GPU_ANNOTATION)),
            by_all=frozenset(by_all),
            by_gpu={i: frozenset(v) for i, v in by_gpu.items()},
            keys=frozenset(keys),
        )

    @property
    def any(self) -> bool:
        return bool(self.keys) or self.approve_all or self.reject_all or bool(self.approve or self.reject)

    def rejects(self, index: int) -> bool:
        return self.reject_all or index in self.reject

    def approves(self, index: int) -> bool:
        """An approval that names nobody (``approve``, ``approve-gpu``): enough under ``approval: Manual``."""
        return not self.rejects(index) and (self.approve_all or index in self.approve)

    def approvers(self, index: int) -> frozenset[str]:
        """Who approved GPU ``index``'s waiting step by identity (none when it is rejected)."""
        return frozenset() if self.rejects(index) else self.by_all | self.by_gpu.get(index, frozenset())


APPROVAL_ANNOTATIONS = (APPROVE_ANNOTATION, APPROVE_GPU_ANNOTATION, REJECT_ANNOTATION, REJECT_GPU_ANNOTATION)


# -- repeat offenders: each GPU's repairs by UUID ------------------------------------------------


@dataclass(frozen=True)
class Repair:
    """One finished attempt on a GPU, kept by its UUID (``status.repairs["<uuid>"][]``): the index may
    change across a reboot, the UUID does not. What it was for (``reason``) and on which index."""

    attempt: Attempt
    reason: str = ""
    index: int | None = None

    def to_status(self) -> dict[str, Any]:
        out = self.attempt.to_status()
        if self.reason:
            out["reason"] = self.reason
        if self.index is not None:
            out["gpu"] = self.index
        return out

    @staticmethod
    def from_status(m: Mapping[str, Any]) -> Repair | None:
        a = Attempt.from_status(m)
        if a is None:
            return None
        gpu = m.get("gpu")
        index = gpu if isinstance(gpu, int) and not isinstance(gpu, bool) else None
        return Repair(a, str(m.get("reason") or ""), index)


def repairs_from_status(status: Mapping[str, Any] | None) -> dict[str, tuple[Repair, ...]]:
    """``status.repairs`` by GPU UUID, oldest first; unreadable entries are dropped."""
    raw = (status or {}).get("repairs") or {}
    out: dict[str, tuple[Repair, ...]] = {}
    if isinstance(raw, Mapping):
        for uuid, items in raw.items():
            if isinstance(items, list):
                rs = tuple(r for r in (Repair.from_status(x) for x in items if isinstance(x, Mapping)) if r)
                if rs:
                    out[str(uuid)] = rs[-MAX_REPAIRS:]
    return out


def repaired_within(history: tuple[Attempt, ...], now: dt.datetime, window_s: float) -> tuple[Attempt, ...]:
    """The repairs that fixed the GPU (a GPUReset or NodeReboot that succeeded) within ``window_s``
    before ``now``: what makes it a repeat offender. Each attempt once, however often it is listed."""
    seen: set[tuple[str, int, dt.datetime | None]] = set()
    out: list[Attempt] = []
    for a in history:
        key = (str(a.step), a.attempt, a.finished)
        if key in seen or a.result != Result.SUCCEEDED or a.step not in (StepKind.GPU_RESET, StepKind.NODE_REBOOT):
            continue
        seen.add(key)
        if a.finished is not None and 0 <= (now - a.finished).total_seconds() <= window_s:
            out.append(a)
    return tuple(out)


def repeat_offence(
    settings: RepeatSettings | None, history: tuple[Attempt, ...], now: dt.datetime
) -> tuple[Attempt, ...]:
    """The repairs that make a GPU failing now a repeat offender (empty: it is not one)."""
    if settings is None or not settings.enabled:
        return ()
    fixed = repaired_within(history, now, settings.window_s)
    return fixed if len(fixed) >= settings.max_repairs else ()
