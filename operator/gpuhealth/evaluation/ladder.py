"""The escalation ladder, one GPU at a time: record x GPU x what was observed x time -> next move.

Pure. The remediator (``controller/act/remediator.py``) reads the GPU's record and the Job's outcome,
checks the preconditions that need the API (rule still there, no pod holds the GPU, limits), and
hands the answer here; it then writes the record this returns *before* acting on it.

A ladder is an ordered list of steps (``GPUReset``, ``NodeReboot``, ``Replace``), each with a
timeout and a number of attempts. A step that fails (the Job failed, ran past its timeout, or
succeeded but the GPU's facts did not clear, or the fault came back during probation) is tried
again while it has attempts left, then the next step runs. Success is judged from evidence: the
Job succeeded *and* the agent's facts for that GPU are clean (volatile uncorrected ECC 0, NVML
recovery action None, no pending remap or retirement); the GPU then goes through the usual
probation. ``Replace`` ends the ladder: the GPU waits in AwaitingRepair with its history.

Proof before return (``spec.validation``, ``api/validation.py``): with it enabled, a ``GPUReset``
whose Job succeeded and whose facts are clean is not a success yet. The record goes to
``Validating``; once the remediator says the GPU may be tested (still held out by its rule, no pod
holds it, fewer than ``maxConcurrent`` validations in flight) ONE validation Job runs, under a name
recorded first. Its pass is the step's success; a failure, a timeout, a Job or pod lost, or a fault
during the run counts as the attempt failing (``ValidationFailed``, ``ValidationTimedOut``,
``ValidationLost``, ``Relapsed``): the next attempt or step follows, and with none left the GPU waits
in AwaitingRepair with the diagnostic's findings in its message.

Repeat offenders (``spec.remediation.repeatOffenders``): every finished attempt is also kept by the
GPU's UUID (``status.repairs``, which outlives the ladder record and a reboot that renumbers the GPUs).
A GPU that a ``GPUReset`` or ``NodeReboot`` fixed ``maxRepairs`` times within ``window`` and that fails
again (a new fault, a relapse in probation, a failed validation) skips the cheap steps: straight to
``Replace`` (``RepeatOffender``), with its history in the message.

Human approval (``spec.remediation.approval: Manual``): a ``GPUReset``, a ``NodeReboot`` hand-off or a
validation about to start waits in ``PendingApproval`` (one ``ApprovalRequired`` Event) until the
remediator observes a human's approval (``approved``: it starts once it may; the approval is recorded
in the record before anything runs) or rejection (Replace: AwaitingRepair). ``approval: TwoPerson``:
the same wait, and a step of ``twoPersonSteps`` (default the ``NodeReboot`` hand-off) runs only once two
distinct identities approved it (``Observed.approvers``, the API server's user names): the first
approval is recorded in the record (``approvers``, an ``ApprovalRecorded`` Event) and the step keeps
waiting; the same person again counts once; the second person's lets it run, and the ``StepApproved``
Event names both.

Which ladder a fault gets: the first of the policy's ``ladders`` that names its reason or XID,
else the catalog's (:func:`default_steps`): faults a GPU reset clears (volatile ECC, pending remap
or retirement, XIDs whose remedy is a reset) start at ``GPUReset``; XID 79 and other node-reboot
faults at ``NodeReboot``; XID 154 where its recovery action's row in ``api/recovery.py`` says
(``Reset`` and ``BusReset`` at ``GPUReset``, the others at ``NodeReboot``, ``None`` nowhere). A GPU
whose recovery action needs its NVLink peers idle first (``DrainAndReset``, ``DrainP2P``) skips
``GPUReset`` unless the report names its peers: then ``evaluation/peers.py`` holds them out with it,
and the reset starts only once they are drained too (``controller/act/remediator.py``).

The device-plugin route (a GPU no DRA ResourceSlice publishes, held out by the device plugin's own
withholding or gpuhealth's ``gpu-out`` node taint, ``actions/plugin_hold.py``): the GPU climbs the
same ladder (``GPU.plugin`` stands for its DeviceTaintRule). NVIDIA's device plugin holds a GPU it
marked ``Unhealthy`` so until it restarts, so a repaired GPU can stay withheld by the plugin after its
step succeeded and its probation passed. Then (``Observed.plugin_withheld``) the record goes to
``RestartingPlugin``: the remediator records the plugin's pod on the node, deletes it (its DaemonSet
recreates it) and the GPU returns only once the Node's allocatable shows it again
(:func:`awaits_plugin` keeps it Recovering until then). No pod, no permission, or no GPU back within
``spec.remediation.devicePlugin.returnTimeout``: a Warning Event and the record's message say that the
GPU stays withheld until the plugin restarts.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace

from gpuhealth.api import remediation
from gpuhealth.api.devices import DeviceState
from gpuhealth.api.durations import format_duration
from gpuhealth.api.recovery import RecoveryAction
from gpuhealth.api.remediation import (
    REBOOT_STEPS,
    RESET_STEPS,
    ApprovalStep,
    RemediationSettings,
    RepeatSettings,
    Step,
    StepKind,
)
from gpuhealth.api.remediation_status import (
    IN_FLIGHT,
    Approver,
    Attempt,
    LadderRecord,
    Phase,
    PluginRestart,
    Result,
    approver_words,
    repeat_offence,
)
from gpuhealth.api.timeutil import format_time
from gpuhealth.api.validation import Outcome, Validation, ValidationSettings
from gpuhealth.catalog import xid as catalog

__all__ = ["REBOOT_STEPS", "RESET_STEPS", "default_steps", "steps_for"]


def default_steps(reason: str, recovery_action: RecoveryAction | None = None) -> tuple[Step, ...]:
    """The catalog's ladder for a fault (``api.remediation.default_steps`` with NVIDIA's remedy)."""
    return remediation.default_steps(reason, recovery_action, catalog.remedy_of(reason))


def steps_for(
    settings: RemediationSettings,
    reason: str,
    recovery_action: RecoveryAction | None = None,
    peers_known: bool = False,
) -> tuple[Step, ...]:
    """The steps a fault climbs under ``settings`` (``api.remediation.steps_for`` with NVIDIA's remedy)."""
    return remediation.steps_for(settings, reason, recovery_action, catalog.remedy_of(reason), peers_known)


@dataclass(frozen=True)
class GPU:
    """What the ladder needs to know of one GPU this pass."""

    index: int
    uuid: str
    state: DeviceState
    reason: str
    since: dt.datetime | None
    drained: bool
    taint_rule: str
    facts_clean: bool  # the agent's facts (fresh) show no fault a reset or reboot clears
    plugin: bool = False  # held out on the device-plugin route: no rule, the plugin or the gpu-out taint holds it


@dataclass(frozen=True)
class Observed:
    """What the remediator read from the API this pass."""

    job: str = ""  # "" (not read), "Absent", "Running", "Succeeded", "Failed"
    may_start: bool = False  # a GPUReset's preconditions hold (drained, held out, unheld, limits)
    node_cleared: dt.datetime | None = None  # the node's last release (its reboot was handled)
    released: bool = False  # a human released the GPU this pass
    dry_run: bool = False
    may_validate: bool = False  # a validation's preconditions hold (held out, unheld, limits)
    validation: tuple[Outcome, str] | None = None  # the running validation Job's verdict and findings
    manual: bool = False  # spec.remediation.approval: Manual or TwoPerson; each step waits for people
    approved: bool = False  # approved enough: this GPU's waiting step may run (remediator.py counts)
    # Who approved the waiting step by identity so far: the record's and this pass's (gpuhealth.dev/approver*)
    approvers: tuple[Approver, ...] = ()
    # approval: TwoPerson: what needs two distinct approvers (spec.remediation.twoPersonSteps); else empty
    two_person: frozenset[ApprovalStep] = frozenset()

    def needed(self, what: ApprovalStep) -> int:
        """Distinct approvers ``what`` needs: 1, or 2 (TwoPerson, ``api/remediation.py`` ``approvers_needed``)."""
        return remediation.approvers_needed(what, self.two_person)

    rejected: bool = False  # a human rejected it (gpuhealth.dev/reject[-gpu])
    repairs: tuple[Attempt, ...] = ()  # the GPU's earlier attempts, by its UUID (status.repairs)
    repeat: RepeatSettings | None = None  # spec.remediation.repeatOffenders (None: not counted)
    # The device-plugin route: the Node's allocatable does not show the GPU (the plugin still withholds
    # it), in words; whether its probation is over; spec.remediation.devicePlugin's restart and timeout.
    plugin_withheld: bool = False
    plugin_counts: str = ""  # "allocatable nvidia.com/gpu 7 of 8"
    probation_over: bool = False
    plugin_restart: bool = True
    plugin_timeout_s: float = 300.0


@dataclass(frozen=True)
class Move:
    record: LadderRecord | None  # None: no record (never had one, or it is forgotten)
    start: StepKind | None = None  # create this attempt's Job (GPUReset) after writing the record
    stop_job: str = ""  # delete this Job (timed out)
    events: tuple[tuple[str, str, str], ...] = ()
    finished: tuple[tuple[str, str], ...] = ()  # (step, result) for gpuhealth_remediations_total
    back_in_service: float | None = None  # seconds from fault to service, for the MTTR histogram
    start_validation: bool = False  # create the validation Job recorded in ``record.validation``
    validated: tuple[str, float | None] | None = None  # (result, seconds) for gpuhealth_validations_*
    repeat_offender: bool = False  # the GPU went straight to Replace (gpuhealth_repeat_offenders_total)
    restart_plugin: bool = False  # delete the device plugin's pod recorded in ``record.plugin`` (picked first if none)


def _where(gpu: GPU | LadderRecord) -> str:
    return f"GPU {gpu.index}" + (f" ({gpu.uuid})" if gpu.uuid else "")


_REPAIRED = frozenset({Phase.SUCCEEDED, Phase.RESTARTING_PLUGIN})  # the step worked; the GPU comes back


def awaits_plugin(rec: LadderRecord, withheld: bool) -> bool:
    """Whether a repaired GPU may not return yet: its step worked (or the device plugin is being
    restarted for it) and the device plugin still ``withheld`` it (the Node's allocatable short of it).
    The per-GPU state machine keeps it Recovering past its probation while this holds."""
    return withheld and rec.phase in _REPAIRED


def repaired(rec: LadderRecord) -> bool:
    """The step worked: the GPU's evidence up to ``finished`` is acknowledged (``DeviceInputs.acknowledged``)."""
    return rec.phase in _REPAIRED


def restart_blocked(rec: LadderRecord, why: str, hint: str, counts: str) -> Move:
    """The device plugin cannot be restarted for the repaired GPU (``why``): the record says so and keeps
    watching the Node's allocatable; one Warning Event with what a human can do (``hint``)."""
    msg = (
        f"{_where(rec)}: repaired, but the device plugin still withholds it ({counts}) and gpuhealth cannot "
        f"restart the device plugin: {why}. The GPU stays withheld until the device plugin's pod on the node "
        f"restarts{f' ({hint})' if hint else ''}; gpuhealth returns it once allocatable shows it"
    )
    plugin = replace(rec.plugin or PluginRestart(started=rec.finished), blocked=why[:1024], pod="", uid="")
    return Move(replace(rec, plugin=plugin, message=msg), events=(("Warning", "DevicePluginNotRestarted", msg),))


def _step(steps: tuple[Step, ...], kind: StepKind) -> Step:
    return next((s for s in steps if s.kind == kind), Step(kind))


def holds(rec: LadderRecord, validation: ValidationSettings) -> bool:
    """Whether the ladder keeps the GPU from returning on its probation alone: a reset in flight
    that must still be validated, or a validation that failed and waits for the next step."""
    if not validation.enabled:
        return False
    if rec.step == StepKind.GPU_RESET and rec.phase in IN_FLIGHT:
        return True
    if rec.phase == Phase.PENDING_APPROVAL and rec.validation is not None:
        return True  # the reset worked; its validation waits for a human's approval
    last = rec.history[-1].result if rec.history else None
    failed = last in (Result.VALIDATION_FAILED, Result.VALIDATION_TIMED_OUT, Result.VALIDATION_LOST)
    return rec.phase == Phase.READY and failed


def advance(
    rec: LadderRecord | None,
    gpu: GPU,
    steps: tuple[Step, ...],
    obs: Observed,
    now: dt.datetime,
    validation: ValidationSettings | None = None,
) -> Move:
    """The next move for one GPU (see the module docstring)."""
    if gpu.state == DeviceState.IN_SERVICE or obs.released:
        if rec is None:
            return Move(None)
        mttr = None
        if rec.phase in _REPAIRED and gpu.state == DeviceState.IN_SERVICE and rec.fault_since:
            mttr = max(0.0, (now - rec.fault_since).total_seconds())
        events: tuple[tuple[str, str, str], ...] = ()
        if rec.phase == Phase.RESTARTING_PLUGIN and gpu.state == DeviceState.IN_SERVICE:
            counts = obs.plugin_counts or "allocatable"
            msg = f"{_where(gpu)}: the device plugin offers it again ({counts}); back in service"
            events = (("Normal", "DevicePluginOffersGPU", msg),)
        return Move(None, back_in_service=mttr, events=events)
    if rec is None:
        if not steps or gpu.state not in (DeviceState.QUARANTINED, DeviceState.DRAINING):
            return Move(None)
        first = steps[0]
        rec = LadderRecord(
            index=gpu.index, step=first.kind, reason=gpu.reason, uuid=gpu.uuid, since=now, fault_since=gpu.since
        )
        offence = repeat_offence(obs.repeat, obs.repairs, now)
        if obs.dry_run:
            at = f"{StepKind.REPLACE} (a repeat offender)" if offence else str(first.kind)
            msg = f"{_where(gpu)} ({gpu.reason}): would start the repair ladder at {at}; no Job was created"
            return Move(replace(rec, phase=Phase.DRY_RUN, message=msg), events=(("Normal", "RemediationDryRun", msg),))
        if offence:
            if gpu.state == DeviceState.DRAINING:
                return Move(None)  # its pods leave first; then it waits for a human
            return _offender(rec, gpu, offence, obs, now)
    if rec.phase == Phase.DRY_RUN:
        return Move(None) if not obs.dry_run else Move(rec)
    step = _step(steps, rec.step)
    if rec.phase == Phase.PENDING_APPROVAL:
        if obs.rejected:
            return _rejected(rec, gpu, now)
        what = f"level-{rec.validation.level} validation" if rec.validation is not None else f"{rec.step}"
        if not obs.approved:
            if obs.approvers == rec.approvers:
                return Move(rec)
            return _approval_recorded(rec, gpu, what, obs)
        by = f"by {approver_words(obs.approvers)}" if obs.approvers else "by a human"
        needed = obs.needed(rec.approval_step)
        of = f" ({len(obs.approvers)} of {needed} approvals)" if needed > 1 else ""
        approved = ("Normal", "StepApproved", f"{_where(gpu)}: {what} (attempt {rec.attempt}) approved {by}{of}")
        rec = replace(rec, approvers=obs.approvers)
        if rec.validation is not None:
            rec = replace(rec, phase=Phase.VALIDATING, message=f"{_where(gpu)}: {what} approved; it runs once it may")
            return _validate(rec, gpu, steps, obs, now, validation or ValidationSettings(enabled=True), (approved,))
        rec = replace(rec, phase=Phase.READY, approved=True)
        move = _start(rec, gpu, step, obs, now)
        return replace(move, record=move.record or rec, events=(approved, *move.events))
    if rec.phase == Phase.READY:
        return _start(rec, gpu, step, obs, now)
    if rec.phase == Phase.PENDING:
        if obs.job == "Absent":  # killed between the record and the create: create it now (once)
            return Move(rec, start=rec.step)
        rec = replace(rec, phase=Phase.RUNNING)
    if rec.phase == Phase.RUNNING:
        overdue = rec.started is not None and (now - rec.started).total_seconds() > step.timeout_s
        if obs.job == "Succeeded":
            rec = replace(rec, phase=Phase.VERIFYING, finished=now)
        elif obs.job == "Failed":
            return _fail(rec, gpu, steps, Result.FAILED, now, obs)
        elif obs.job == "Absent":
            return _fail(rec, gpu, steps, Result.LOST, now, obs)
        elif overdue:
            return replace(_fail(rec, gpu, steps, Result.TIMED_OUT, now, obs), stop_job=rec.job)
        else:
            return Move(rec)
    if rec.phase == Phase.VERIFYING:
        if gpu.facts_clean:
            if validation is not None and validation.enabled and rec.step == StepKind.GPU_RESET:
                msg = (
                    f"{_where(gpu)}: {rec.step} worked and its facts are clean; a level-{validation.level} "
                    "validation must pass before it returns"
                )
                v = Validation(level=validation.level)
                if obs.manual:
                    rec = replace(rec, validation=v)
                    return _await_approval(rec, gpu, f"level-{v.level} validation", now, obs.needed(rec.approval_step))
                rec = replace(rec, phase=Phase.VALIDATING, validation=v, message=msg)
                return _validate(rec, gpu, steps, obs, now, validation, (("Normal", "ValidationPending", msg),))
            return _succeed(rec, gpu, now)
        if rec.started is not None and (now - rec.started).total_seconds() > step.timeout_s:
            return _fail(rec, gpu, steps, Result.NOT_CLEAN, now, obs)
        return Move(rec)
    if rec.phase == Phase.VALIDATING:
        return _validate(rec, gpu, steps, obs, now, validation or ValidationSettings(enabled=True))
    if rec.phase == Phase.HANDED_OFF:
        if obs.node_cleared is not None and rec.started is not None and obs.node_cleared >= rec.started:
            if gpu.facts_clean:
                return _succeed(rec, gpu, obs.node_cleared)
            return _fail(rec, gpu, steps, Result.NOT_CLEAN, now, obs)
        if rec.started is not None and (now - rec.started).total_seconds() > step.timeout_s:
            return _fail(rec, gpu, steps, Result.TIMED_OUT, now, obs)
        return Move(rec)
    if rec.phase in _REPAIRED:
        relapsed = gpu.state in (DeviceState.QUARANTINED, DeviceState.DRAINING)
        if relapsed and gpu.since is not None and rec.finished is not None and gpu.since > rec.finished:
            return _fail(replace(rec, plugin=None), gpu, steps, Result.RELAPSED, now, obs)
        if rec.phase == Phase.RESTARTING_PLUGIN:
            return _plugin_wait(rec, gpu, obs, now)
        if gpu.plugin and obs.plugin_withheld and obs.probation_over:
            return _restart_plugin(rec, gpu, obs, now)
    return Move(rec)


def _restart_plugin(rec: LadderRecord, gpu: GPU, obs: Observed, now: dt.datetime) -> Move:
    """A repaired GPU through its probation that the device plugin still withholds: restart the plugin."""
    rec = replace(rec, phase=Phase.RESTARTING_PLUGIN, plugin=PluginRestart(started=now))
    if not obs.plugin_restart:
        return restart_blocked(rec, "spec.remediation.devicePlugin.restart is false", "", obs.plugin_counts)
    msg = (
        f"{_where(gpu)}: repaired and through its probation, but the device plugin still withholds it "
        f"({obs.plugin_counts}): it holds a GPU Unhealthy until it restarts. Restarting the device plugin's "
        "pod on the node; the GPU returns once allocatable shows it"
    )
    return Move(replace(rec, message=msg), restart_plugin=True, events=(("Normal", "RestartingDevicePlugin", msg),))


def _plugin_wait(rec: LadderRecord, gpu: GPU, obs: Observed, now: dt.datetime) -> Move:
    """The device plugin's restart: the delete (again, after a kill before it was recorded done), then
    the wait for the Node's allocatable, with one Warning Event past the timeout."""
    p = rec.plugin or PluginRestart(started=rec.finished)
    if not obs.plugin_withheld:  # the GPU returns this pass (awaits_plugin no longer holds it)
        return Move(replace(rec, message=f"{_where(gpu)}: the device plugin offers it again ({obs.plugin_counts})"))
    if p.blocked:
        return Move(rec)
    if not p.deleted:  # not picked yet, or killed between the record and the delete: (pick and) delete now
        return Move(rec, restart_plugin=True)
    overdue = p.started is not None and (now - p.started).total_seconds() > obs.plugin_timeout_s
    if p.timed_out or not overdue:
        return Move(rec)
    msg = (
        f"{_where(gpu)}: repaired, and the device plugin's pod {p.pod} was restarted, but {int(obs.plugin_timeout_s)}s "
        f"later the device plugin still does not offer the GPU ({obs.plugin_counts}; "
        "spec.remediation.devicePlugin.returnTimeout). It stays withheld: look at the device plugin's pod on the "
        "node and its log; gpuhealth returns the GPU once allocatable shows it"
    )
    rec = replace(rec, plugin=replace(p, timed_out=True), message=msg)
    return Move(rec, events=(("Warning", "DevicePluginWithholdsGPU", msg),))


def _waits_for(needed: int) -> str:
    if needed > 1:
        return f"approvals of {needed} different people (spec.remediation.approval: TwoPerson)"
    return "a human's approval (spec.remediation.approval: Manual)"


def _await_approval(rec: LadderRecord, gpu: GPU, what: str, now: dt.datetime, needed: int = 1) -> Move:
    """approval: Manual or TwoPerson: the step (or the validation) waits in PendingApproval; one Event says so."""
    msg = (
        f"{_where(gpu)} ({gpu.reason}): {what} (attempt {rec.attempt}) waits for {_waits_for(needed)}: "
        f"kubectl gpuhealth approve NODE --gpu {gpu.index}, or reject"
    )
    if rec.validation is not None:  # the reset's attempt stays as it was (started, finished, Job)
        rec = replace(rec, phase=Phase.PENDING_APPROVAL, approved=False, approvers=(), message=msg)
    else:
        rec = replace(
            rec,
            phase=Phase.PENDING_APPROVAL,
            started=now,
            finished=None,
            job="",
            approved=False,
            approvers=(),
            message=msg,
        )
    return Move(rec, events=(("Normal", "ApprovalRequired", msg),))


def _approval_recorded(rec: LadderRecord, gpu: GPU, what: str, obs: Observed) -> Move:
    """Not approved enough yet (TwoPerson: one person so far): who approved is recorded, the step waits."""
    new = [a.by for a in obs.approvers if a.by not in {r.by for r in rec.approvers}]
    needed = obs.needed(rec.approval_step)
    msg = (
        f"{_where(gpu)} ({gpu.reason}): {what} (attempt {rec.attempt}) has {len(obs.approvers)} of {needed} "
        f"approvals ({approver_words(obs.approvers)}); it waits for "
        f"{needed - len(obs.approvers)} more from a different person: kubectl gpuhealth approve NODE "
        f"--gpu {gpu.index}, or reject"
    )
    event = f"{_where(gpu)}: {what} (attempt {rec.attempt}) approved by {', '.join(new)}; {len(obs.approvers)} of "
    event += f"{needed} approvals, it still waits"
    rec = replace(rec, approvers=obs.approvers, message=msg)
    return Move(rec, events=(("Normal", "ApprovalRecorded", event),))


def _to_replace(rec: LadderRecord, now: dt.datetime, msg: str) -> LadderRecord:
    """The ladder ends at ``Replace`` now: the GPU waits in AwaitingRepair for a human, nothing runs."""
    return replace(
        rec,
        step=StepKind.REPLACE,
        attempt=1,
        phase=Phase.AWAITING_REPAIR,
        started=now,
        finished=now,
        job="",
        approved=False,
        message=msg,
    )


def _rejected(rec: LadderRecord, gpu: GPU, now: dt.datetime) -> Move:
    """A human rejected the waiting step: the GPU waits for repair (Replace), with its history."""
    what = f"level-{rec.validation.level} validation" if rec.validation is not None else f"{rec.step}"
    done = Attempt(rec.step, rec.attempt, rec.started, now, Result.REJECTED)
    msg = f"{_where(gpu)} ({gpu.reason}): {what} (attempt {rec.attempt}) rejected by a human; the GPU waits for repair"
    rec = _to_replace(replace(rec, history=(*rec.history, done)), now, msg)
    return Move(rec, events=(("Warning", "StepRejected", msg),), finished=((str(done.step), str(Result.REJECTED)),))


def _offender(rec: LadderRecord, gpu: GPU, fixed: tuple[Attempt, ...], obs: Observed, now: dt.datetime) -> Move:
    """A GPU that repairs fixed within the window fails again: straight to Replace, with its history."""
    window = obs.repeat.window_s if obs.repeat is not None else 0.0
    when = ", ".join(f"{a.step} at {format_time(a.finished)}" for a in fixed if a.finished)
    msg = (
        f"{_where(gpu)} ({gpu.reason}): a repeat offender: repaired {len(fixed)} time(s) within "
        f"{format_duration(window)} ({when}) and failing again; straight to Replace, it waits for a human"
    )
    rec = _to_replace(rec, now, msg)
    return Move(
        rec,
        events=(("Warning", "RepeatOffender", msg),),
        finished=((str(StepKind.REPLACE), "HandedOff"),),
        repeat_offender=True,
    )


def _start(rec: LadderRecord, gpu: GPU, step: Step, obs: Observed, now: dt.datetime) -> Move:
    n = f"{rec.attempt} of {step.attempts}"
    if obs.manual and not rec.approved and step.kind in (StepKind.GPU_RESET, StepKind.NODE_REBOOT):
        return _await_approval(rec, gpu, f"{step.kind}", now, obs.needed(ApprovalStep(str(step.kind))))
    if step.kind == StepKind.GPU_RESET:
        held = bool(gpu.taint_rule) or gpu.plugin  # its DeviceTaintRule, or the device-plugin route's hold
        if not (gpu.state == DeviceState.QUARANTINED and gpu.drained and held and obs.may_start):
            # Nothing to record before the first step runs, unless a human approved it already.
            return Move(rec if rec.history or rec.approved else None)
        rec = replace(rec, phase=Phase.PENDING, started=now, finished=None, approved=False)
        msg = f"{_where(gpu)} ({gpu.reason}): GPU reset, attempt {n}"
        return Move(rec, start=StepKind.GPU_RESET, events=(("Normal", "GPUReset", msg),))
    if step.kind == StepKind.NODE_REBOOT:
        msg = (
            f"{_where(gpu)} ({gpu.reason}): the node needs a reboot (attempt {n}); it is drained and handed to the "
            "node remediator (label gpuhealth.dev/state=AwaitingRepair, condition reason NodeRebootRequested); "
            "release the node once it is rebooted"
        )
        rec = replace(rec, phase=Phase.HANDED_OFF, started=now, finished=None, message=msg, approved=False)
        return Move(rec, events=(("Warning", "NodeRebootRequested", msg),), finished=((str(step.kind), "Started"),))
    tried = ", ".join(f"{a.step} #{a.attempt}: {a.result}" for a in rec.history) or "no step"
    msg = f"{_where(gpu)} ({gpu.reason}): the repair ladder is exhausted ({tried}); the GPU waits for a human"
    rec = replace(rec, phase=Phase.AWAITING_REPAIR, started=now, finished=now, message=msg)
    return Move(rec, events=(("Warning", "LadderExhausted", msg),), finished=((str(StepKind.REPLACE), "HandedOff"),))


def _fail(
    rec: LadderRecord, gpu: GPU, steps: tuple[Step, ...], result: Result, now: dt.datetime, obs: Observed
) -> Move:
    done = Attempt(rec.step, rec.attempt, rec.started, now, result)
    history = (*rec.history, done)
    step = _step(steps, rec.step)
    if rec.attempt < step.attempts:
        nxt = replace(rec, attempt=rec.attempt + 1)
    else:
        kinds = [s.kind for s in steps]
        later = kinds[kinds.index(rec.step) + 1 :] if rec.step in kinds else []
        nxt = replace(rec, step=later[0] if later else StepKind.REPLACE, attempt=1)
    nxt = replace(nxt, phase=Phase.READY, started=None, finished=None, job="", history=history)
    events: tuple[tuple[str, str, str], ...]
    finished = ((str(rec.step), str(result)),)
    fixed = repeat_offence(obs.repeat, (*obs.repairs, *history), now)
    if fixed:  # a GPU that repairs fixed fails again within the window: no cheap step is left to try
        msg = f"{_where(gpu)}: {rec.step} attempt {rec.attempt} {result}; next: {StepKind.REPLACE} (a repeat offender)"
        held = _offender(replace(nxt, history=history), gpu, fixed, obs, now)
        events = (("Warning", "RemediationFailed", msg), *held.events)
        return replace(held, events=events, finished=finished + held.finished)
    msg = f"{_where(gpu)}: {rec.step} attempt {rec.attempt} {result}; next: {nxt.step} attempt {nxt.attempt}"
    # Nothing read for the next step yet: it may not start a Job.
    blank = Observed(manual=obs.manual, two_person=obs.two_person)
    move = _start(nxt, gpu, _step(steps, nxt.step), blank, now) if nxt.step != StepKind.GPU_RESET else None
    events = (("Warning", "RemediationFailed", msg),)
    if move is not None and move.record is not None:
        return Move(move.record, events=events + move.events, finished=finished + move.finished)
    return Move(nxt, events=events, finished=finished)


def _validate(
    rec: LadderRecord,
    gpu: GPU,
    steps: tuple[Step, ...],
    obs: Observed,
    now: dt.datetime,
    settings: ValidationSettings,
    events: tuple[tuple[str, str, str], ...] = (),
) -> Move:
    """One move of a GPU whose reset worked and that must pass its validation before it returns."""
    v = rec.validation or Validation(level=settings.level)
    if v.outcome == Outcome.PENDING:
        if not obs.may_validate:
            return Move(rec, events=events)
        v = replace(v, outcome=Outcome.RUNNING, started=now, created=False)
        msg = f"{_where(gpu)} ({gpu.reason}): level-{v.level} validation after {rec.step} attempt {rec.attempt}"
        return Move(
            replace(rec, validation=v), start_validation=True, events=(*events, ("Normal", "ValidationStarted", msg))
        )
    if v.outcome != Outcome.RUNNING:  # a finished validation on a Validating record: read as its result
        return _validated(rec, gpu, steps, v, v.outcome, v.findings, now, "", obs)
    if not v.created:  # killed between the record and the create: create it now (409: it exists)
        return Move(rec, start_validation=True, events=events)
    relapsed = gpu.state in (DeviceState.QUARANTINED, DeviceState.DRAINING)
    if relapsed and gpu.since is not None and v.started is not None and gpu.since > v.started:
        fault = f"a fault during the run: {gpu.reason}"
        return _validated(rec, gpu, steps, v, Outcome.FAILED, fault, now, v.job, obs, True)
    outcome, findings = obs.validation or (Outcome.RUNNING, "")
    overdue = v.started is not None and (now - v.started).total_seconds() > settings.timeout_s
    if outcome == Outcome.RUNNING:
        if not overdue:
            return Move(rec, events=events)
        outcome, findings = Outcome.TIMED_OUT, f"no result within {int(settings.timeout_s)}s (spec.validation.timeout)"
    return _validated(rec, gpu, steps, v, outcome, findings, now, v.job if outcome == Outcome.TIMED_OUT else "", obs)


_RESULT_OF = {
    Outcome.FAILED: Result.VALIDATION_FAILED,
    Outcome.TIMED_OUT: Result.VALIDATION_TIMED_OUT,
    Outcome.LOST: Result.VALIDATION_LOST,
}


def _validated(
    rec: LadderRecord,
    gpu: GPU,
    steps: tuple[Step, ...],
    v: Validation,
    outcome: Outcome,
    findings: str,
    now: dt.datetime,
    stop_job: str,
    obs: Observed,
    relapsed: bool = False,
) -> Move:
    v = replace(v, outcome=outcome, finished=now, findings=findings)
    took = (now - v.started).total_seconds() if v.started else None
    rec = replace(rec, validation=v)
    if outcome == Outcome.PASSED:
        msg = f"{_where(gpu)}: level-{v.level} validation passed after {rec.step}; back in service after probation"
        move = _succeed(rec, gpu, now, msg)
        return replace(move, events=(("Normal", "ValidationPassed", msg),), validated=(str(outcome), took))
    result = Result.RELAPSED if relapsed else _RESULT_OF.get(outcome, Result.VALIDATION_FAILED)
    msg = f"{_where(gpu)}: level-{v.level} validation {outcome}: {findings or 'no findings'}"
    move = _fail(rec, gpu, steps, result, now, obs)
    nxt = move.record
    if nxt is not None and nxt.phase == Phase.AWAITING_REPAIR and not move.repeat_offender:
        nxt = replace(nxt, message=f"{nxt.message}. Last validation: {findings or outcome}")
    return replace(
        move,
        record=nxt,
        stop_job=stop_job,
        events=(("Warning", "ValidationFailed", msg), *move.events),
        validated=(str(outcome), took),
    )


def _succeed(rec: LadderRecord, gpu: GPU, at: dt.datetime, message: str = "") -> Move:
    history = (*rec.history, Attempt(rec.step, rec.attempt, rec.started, at, Result.SUCCEEDED))
    msg = message or f"{_where(gpu)}: {rec.step} worked, its facts are clean; back in service after probation"
    rec = replace(rec, phase=Phase.SUCCEEDED, finished=at, history=history, message=msg)
    return Move(rec, events=(("Normal", "RemediationSucceeded", msg),), finished=((str(rec.step), "Succeeded"),))
