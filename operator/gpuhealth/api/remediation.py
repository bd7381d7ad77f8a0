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
from gpuhealth.api.names import Signal
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


class RemediationError(ValueError):
    """A ``spec.remediation`` the operator refuses; the message names the field."""


class Phase(StrEnum):
    READY = "Ready"  # the step is next; it starts once its preconditions hold
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
class RemediationSettings:
    enabled: bool = False
    ladders: tuple[Ladder, ...] = ()  # empty: the catalog's defaults (default_steps below)
    max_concurrent: int = 1  # resets in flight at once, across the policy's nodes
    namespace: str = DEFAULT_NAMESPACE
    service_account: str = DEFAULT_SERVICE_ACCOUNT
    image: str = DEFAULT_IMAGE
    job_template: Mapping[str, Any] | None = None  # a batch/v1 Job (metadata + spec) with placeholders


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
    return RemediationSettings(
        enabled=bool(raw.get("enabled", False)),
        ladders=tuple(ladders),
        max_concurrent=_int(raw.get("maxConcurrent", 1), "spec.remediation.maxConcurrent", 1, 1000),
        namespace=str(raw.get("namespace") or DEFAULT_NAMESPACE),
        service_account=str(raw.get("serviceAccountName") or DEFAULT_SERVICE_ACCOUNT),
        image=str(raw.get("image") or DEFAULT_IMAGE),
        job_template=None if template is None else _validate_template(template, "spec.remediation.jobTemplate"),
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
