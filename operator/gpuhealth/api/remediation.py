"""Repair, not only quarantine: the escalation ladder's settings and its per-GPU record.

``spec.remediation`` of a GPUHealthPolicy says whether gpuhealth may try to repair a GPU it holds
out, and how: an ordered ladder of steps per fault (``GPUReset`` -> ``NodeReboot`` -> ``Replace``),
each with a ``timeout`` and a number of ``attempts``. Off by default: without it gpuhealth holds
the GPU out and reports, as before.

The ladder's position is kept in GPUNodeHealth ``status.remediation["<GPU index>"]`` (a
:class:`LadderRecord`), written *before* any Job is created, so a restarted operator finds the
step, the attempt and the Job's name again and never starts a second reset.

Pure: parsing and the record's codec. Which ladder a fault gets when the policy names none (the
catalog's remedy) is decided in ``evaluation/ladder.py``; the Job itself in
``actions/remediation_jobs.py``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpuhealth.api.durations import parse_duration
from gpuhealth.api.names import (
    APPROVE_ANNOTATION,
    APPROVE_GPU_ANNOTATION,
    REJECT_ANNOTATION,
    REJECT_GPU_ANNOTATION,
    Signal,
)
from gpuhealth.api.names import StepKind as StepKind  # declared with the other vocabularies
from gpuhealth.api.recovery import RecoveryAction
from gpuhealth.api.timeutil import format_time, parse_time
from gpuhealth.api.validation import Validation

DEFAULT_NAMESPACE = "gpuhealth-remediation"
DEFAULT_SERVICE_ACCOUNT = "gpuhealth-remediation"
# NVIDIA's CUDA base image: nvidia-smi itself is mounted in by the NVIDIA Container Toolkit
# (NVIDIA_DRIVER_CAPABILITIES=utility), so any image with a shell-less libc works.
DEFAULT_IMAGE = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"
# Placeholders a policy's jobTemplate uses; replaced in every string of the template.
NODE_PLACEHOLDER = "${NODE_NAME}"
UUID_PLACEHOLDER = "${GPU_UUID}"
INDEX_PLACEHOLDER = "${GPU_INDEX}"
MAX_HISTORY = 10
MAX_REPAIRS = 10  # attempts kept per GPU UUID in status.repairs (the repeat offenders' history)
MAX_REPAIR_GPUS = 32  # GPU UUIDs kept in status.repairs (a node's GPUs and those replaced lately)
# NVIDIA's NVSentinel holds a node for a human after more than one remediation within 7 days: one
# repair per GPU in 7 days, and the next failure goes straight to Replace.
REPEAT_MAX_REPAIRS = 1
REPEAT_WINDOW_S = 7 * 24 * 3600.0


class RemediationError(ValueError):
    """A ``spec.remediation`` the operator refuses; the message names the field."""


class Approval(StrEnum):
    """Who lets a repair or validation step run (``spec.remediation.approval``)."""

    AUTOMATIC = "Automatic"  # gpuhealth, once the step's preconditions hold
    MANUAL = "Manual"  # a human: each step waits in PendingApproval for gpuhealth.dev/approve


class Phase(StrEnum):
    READY = "Ready"  # the step is next; it starts once its preconditions hold
    PENDING_APPROVAL = "PendingApproval"  # approval: Manual; the step (or validation) waits for a human
    PENDING = "Pending"  # write-ahead: the Job is being created under ``job``
    RUNNING = "Running"  # the Job exists
    VERIFYING = "Verifying"  # the Job succeeded; waiting for the agent's clean facts
    VALIDATING = "Validating"  # clean facts; the validation Job (spec.validation) must pass first
    HANDED_OFF = "HandedOff"  # NodeReboot: the node waits for its remediator
    SUCCEEDED = "Succeeded"  # clean facts after the step: probation runs as usual
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
class Step:
    kind: StepKind
    timeout_s: float = 600.0
    attempts: int = 1


@dataclass(frozen=True)
class Ladder:
    """Steps for faults matched by reason (``EccUncorrected``, ``XID48``, ...) or XID code."""

    steps: tuple[Step, ...]
    reasons: frozenset[str] = frozenset()
    xids: frozenset[int] = frozenset()

    def matches(self, reason: str) -> bool:
        if reason in self.reasons:
            return True
        return reason.startswith("XID") and reason[3:].isdigit() and int(reason[3:]) in self.xids


@dataclass(frozen=True)
class RepeatSettings:
    """Repeat offenders across repairs (``spec.remediation.repeatOffenders``): a GPU that repairs
    fixed ``max_repairs`` times within ``window_s`` and fails again skips its ladder for Replace."""

    enabled: bool = True
    max_repairs: int = REPEAT_MAX_REPAIRS
    window_s: float = REPEAT_WINDOW_S


@dataclass(frozen=True)
class RemediationSettings:
    enabled: bool = False
    ladders: tuple[Ladder, ...] = ()  # empty: the catalog's defaults (default_steps below)
    max_concurrent: int = 1  # resets in flight at once, across the policy's nodes
    namespace: str = DEFAULT_NAMESPACE
    service_account: str = DEFAULT_SERVICE_ACCOUNT
    image: str = DEFAULT_IMAGE
    job_template: Mapping[str, Any] | None = None  # a batch/v1 Job (metadata + spec) with placeholders
    approval: Approval = Approval.AUTOMATIC
    repeat: RepeatSettings = field(default_factory=RepeatSettings)


def _dur(v: Any, path: str) -> float:
    try:
        return parse_duration(v)
    except ValueError as e:
        raise RemediationError(f"{path}: {e}") from None


def _int(v: Any, path: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise RemediationError(f"{path}: must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def parse_steps(raw: Any, path: str) -> tuple[Step, ...]:
    if not isinstance(raw, list) or not raw:
        raise RemediationError(f"{path}: must be a non-empty list of steps")
    steps: list[Step] = []
    for i, s in enumerate(raw):
        p = f"{path}[{i}]"
        if not isinstance(s, Mapping):
            raise RemediationError(f"{p}: must be an object")
        try:
            kind = StepKind(str(s.get("type")))
        except ValueError:
            raise RemediationError(
                f"{p}.type: unknown step {s.get('type')!r} (GPUReset, NodeReboot or Replace)"
            ) from None
        if any(x.kind == kind for x in steps):
            raise RemediationError(f"{p}.type: {kind} appears twice (use attempts to repeat a step)")
        if steps and steps[-1].kind == StepKind.REPLACE:
            raise RemediationError(f"{p}: no step can follow Replace")
        if kind == StepKind.GPU_RESET and steps:
            raise RemediationError(f"{p}.type: GPUReset must be the first step (a reboot resets every GPU)")
        steps.append(
            Step(
                kind,
                _dur(s.get("timeout") or "10m", f"{p}.timeout"),
                _int(s.get("attempts") if s.get("attempts") is not None else 1, f"{p}.attempts", 1, 5),
            )
        )
    return tuple(steps)


def _validate_template(t: Any, path: str) -> Mapping[str, Any]:
    """What can be told before a GPU is known: the template pins its pod to the node and names the GPU."""
    if not isinstance(t, Mapping) or not isinstance(t.get("spec"), Mapping):
        raise RemediationError(f"{path}: must be a Job's metadata and spec (spec.template.spec.containers)")
    pod = ((t["spec"].get("template") or {}).get("spec")) or {}
    if not isinstance(pod, Mapping) or not pod.get("containers"):
        raise RemediationError(f"{path}.spec.template.spec.containers: the reset Job needs a container")
    pinned = pod.get("nodeName") == NODE_PLACEHOLDER or NODE_PLACEHOLDER in json.dumps(pod.get("affinity") or {})
    if not pinned:
        raise RemediationError(
            f"{path}.spec.template.spec: must be pinned to the GPU's node: nodeName {NODE_PLACEHOLDER} or a "
            f"required node affinity on kubernetes.io/hostname In [{NODE_PLACEHOLDER}]"
        )
    if UUID_PLACEHOLDER not in json.dumps(pod.get("containers")):
        raise RemediationError(
            f"{path}.spec.template.spec.containers: must name the GPU by {UUID_PLACEHOLDER} (e.g. env "
            f"NVIDIA_VISIBLE_DEVICES and the reset command), so no other GPU is reset"
        )
    return t


def parse_remediation(spec: Mapping[str, Any]) -> RemediationSettings:
    raw = spec.get("remediation") if isinstance(spec, Mapping) else None
    if raw is None:
        return RemediationSettings()
    if not isinstance(raw, Mapping):
        raise RemediationError("spec.remediation: must be an object")
    ladders: list[Ladder] = []
    for i, lad in enumerate(raw.get("ladders") or []):
        p = f"spec.remediation.ladders[{i}]"
        if not isinstance(lad, Mapping):
            raise RemediationError(f"{p}: must be an object")
        reasons = lad.get("reasons") or []
        xids = lad.get("xids") or []
        if not reasons and not xids:
            raise RemediationError(f"{p}: a ladder names the faults it is for (reasons, xids or both)")
        for j, code in enumerate(xids):
            _int(code, f"{p}.xids[{j}]", 1, 1023)
        ladders.append(
            Ladder(parse_steps(lad.get("steps"), f"{p}.steps"), frozenset(map(str, reasons)), frozenset(xids))
        )
    template = raw.get("jobTemplate")
    try:
        approval = Approval(str(raw.get("approval") or Approval.AUTOMATIC))
    except ValueError:
        raise RemediationError(
            f"spec.remediation.approval: must be Automatic or Manual, got {raw.get('approval')!r}"
        ) from None
    return RemediationSettings(
        enabled=bool(raw.get("enabled", False)),
        ladders=tuple(ladders),
        max_concurrent=_int(raw.get("maxConcurrent", 1), "spec.remediation.maxConcurrent", 1, 1000),
        namespace=str(raw.get("namespace") or DEFAULT_NAMESPACE),
        service_account=str(raw.get("serviceAccountName") or DEFAULT_SERVICE_ACCOUNT),
        image=str(raw.get("image") or DEFAULT_IMAGE),
        job_template=None if template is None else _validate_template(template, "spec.remediation.jobTemplate"),
        approval=approval,
        repeat=_parse_repeat(raw.get("repeatOffenders")),
    )


def _parse_repeat(raw: Any) -> RepeatSettings:
    if raw is None:
        return RepeatSettings()
    if not isinstance(raw, Mapping):
        raise RemediationError("spec.remediation.repeatOffenders: must be an object")
    p = "spec.remediation.repeatOffenders"
    window = _dur(raw["window"], f"{p}.window") if raw.get("window") else REPEAT_WINDOW_S
    if window <= 0:
        raise RemediationError(f"{p}.window: must be positive")
    return RepeatSettings(
        enabled=bool(raw.get("enabled", True)),
        max_repairs=_int(raw.get("maxRepairs", REPEAT_MAX_REPAIRS), f"{p}.maxRepairs", 1, 10),
        window_s=window,
    )


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
    approved: bool = False  # approval: Manual; a human approved this step, it starts once it may

    @property
    def in_flight(self) -> bool:
        return self.phase in IN_FLIGHT

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


@dataclass(frozen=True)
class Approvals:
    """What a human (``kubectl gpuhealth approve|reject``, or any system) asked of the Node's waiting
    steps: ``gpuhealth.dev/approve`` (all of them) or ``approve-gpu`` (``"3"``, ``"3,5"``), and the
    same for ``reject``. A rejection wins over an approval of the same GPU."""

    approve_all: bool = False
    approve: frozenset[int] = frozenset()
    reject_all: bool = False
    reject: frozenset[int] = frozenset()

    @staticmethod
    def from_annotations(annotations: Mapping[str, Any]) -> Approvals:
        return Approvals(
            approve_all=APPROVE_ANNOTATION in annotations,
            approve=_indices(annotations.get(APPROVE_GPU_ANNOTATION)),
            reject_all=REJECT_ANNOTATION in annotations,
            reject=_indices(annotations.get(REJECT_GPU_ANNOTATION)),
        )

    @property
    def any(self) -> bool:
        return self.approve_all or self.reject_all or bool(self.approve or self.reject)

    def rejects(self, index: int) -> bool:
        return self.reject_all or index in self.reject

    def approves(self, index: int) -> bool:
        return not self.rejects(index) and (self.approve_all or index in self.approve)


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


# -- the default ladders ---------------------------------------------------------------------------

RESET_STEPS = (Step(StepKind.GPU_RESET, 600.0, 2), Step(StepKind.NODE_REBOOT, 3600.0, 1), Step(StepKind.REPLACE))
REBOOT_STEPS = (Step(StepKind.NODE_REBOOT, 3600.0, 1), Step(StepKind.REPLACE))
RESET_REASONS = frozenset({str(Signal.ECC), str(Signal.PENDING_REMAP)})
REBOOT_REASONS = frozenset({str(Signal.GPU_LOST)})
_STEPS_FROM: dict[StepKind, tuple[Step, ...]] = {StepKind.GPU_RESET: RESET_STEPS, StepKind.NODE_REBOOT: REBOOT_STEPS}


def default_steps(
    reason: str, recovery_action: RecoveryAction | None = None, remedy: str | None = None
) -> tuple[Step, ...]:
    """The default ladder for a fault (empty: no ladder; the GPU is held and reported). ``remedy`` is
    NVIDIA's immediate action for an XID reason (``catalog.xid.remedy_of``), passed in so that this
    table stays in the contract, readable by the plugin as by the operator. XID 154 starts where its
    recovery action's row (``api/recovery.py``) says."""
    if reason in RESET_REASONS:
        return RESET_STEPS
    if reason in REBOOT_REASONS:
        return REBOOT_STEPS
    if reason.startswith("XID") and reason[3:].isdigit():
        code = int(reason[3:])
        action = remedy
        if code == 154:
            first = recovery_action.row.first_step if recovery_action is not None else None
            return _STEPS_FROM.get(first, ()) if first is not None else ()
        if action == "RESET_GPU":
            return RESET_STEPS
        if action == "REBOOT_NODE":
            return REBOOT_STEPS
    return ()


def steps_for(
    settings: RemediationSettings,
    reason: str,
    recovery_action: RecoveryAction | None = None,
    remedy: str | None = None,
    peers_known: bool = False,
) -> tuple[Step, ...]:
    """The steps a fault climbs under ``settings``; a recovery action that needs the GPU's NVLink
    peers idle first (``Recovery.drain_peers``) skips the reset unless the report names the peers
    (``peers_known``: ``evaluation/peers.py`` then holds them out, idle, before the reset starts)."""
    steps = next((lad.steps for lad in settings.ladders if lad.matches(reason)), None)
    if steps is None:
        steps = default_steps(reason, recovery_action, remedy)
    if recovery_action is not None and recovery_action.row.drain_peers and not peers_known:
        steps = tuple(s for s in steps if s.kind != StepKind.GPU_RESET)
    return steps
