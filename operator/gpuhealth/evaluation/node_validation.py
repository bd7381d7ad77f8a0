"""Proof before return at node scope: the node's validation record x what was observed -> next move.

Pure. The device path (``ladder.py``) validates one reset GPU; this validates a whole node (all its
GPUs, one Job) in two cases (``api/validation.py``, ``spec.validation``):

- **Release**: a human releases a node that was drained for a repair (a ``NodeReboot`` hand-off, or
  any AwaitingRepair release, or a release during such a drain). The release is recorded as a
  ``Pending`` validation at once; the Job starts once the node is ``Recovering`` (still tainted and
  cordoned, drained) and the remediator's limits allow it. Until it passes the node's probation may
  not end (``hold``); a failure sends the node to AwaitingRepair with the diagnostic's findings
  (``failed``, read by the state machine in ``transitions.py``), a timeout or a lost Job or pod too,
  each with its own words. A fault during the run is the node's own relapse: the run is recorded
  as failed and the state machine has already taken the node out again.
- **BurnIn** (``spec.validation.newNodes``): a GPU node seen without a verdict yet, or labelled
  ``gpuhealth.dev/burn-in=requested``, is held by gpuhealth's own NoSchedule taint (``taint``) until
  its validation passes; at most ``batchSize`` burn-ins run at once (the remediator counts them). A
  node that fails stays held with the findings until a human releases it, which lifts the taint.

Every move is written before it is acted on (the record names the Job before it is created), so a
restarted operator creates the recorded Job once (409: it exists) and never a second one.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace

from gpuhealth.api.names import Action, State
from gpuhealth.api.status import Record
from gpuhealth.api.validation import NodeValidation, Outcome, Trigger, Validation, ValidationSettings


@dataclass(frozen=True)
class NodeObserved:
    """What the reconciler read this pass (the API reads are the remediator's)."""

    released: bool = False  # a human's release is acknowledged this pass
    new_node: bool = False  # a GPU node without a verdict yet, or labelled for a burn-in
    may_validate: bool = False  # the preconditions of a node validation hold (limits, no pod on its GPUs)
    verdict: tuple[Outcome, str] | None = None  # the running Job's verdict and findings
    dry_run: bool = False


@dataclass(frozen=True)
class NodeMove:
    record: NodeValidation | None
    start: bool = False  # create the Job the record names (after writing the record)
    stop_job: str = ""  # delete this Job (timed out, or superseded)
    hold: bool = False  # the node's probation may not end: its validation has not passed
    failed: str = ""  # the Recovering node goes to AwaitingRepair with these findings
    taint: bool | None = None  # place (True) or lift (False) gpuhealth's burn-in taint
    events: tuple[tuple[str, str, str], ...] = ()
    validated: tuple[str, float | None] | None = None  # (result, seconds) for gpuhealth_validations_*


def wants_release_validation(prior: Record) -> bool:
    """A release of this node is a repair's release: it waits for a human, or was drained (or is being
    drained) for a repair. A drain-level quarantine released mid-drain keeps its remaining pods: no."""
    repair_drain = prior.state == State.DRAINING and prior.drain_action == Action.REPAIR
    return prior.state == State.AWAITING_REPAIR or repair_drain or (prior.out_of_service and prior.drained)


def _what(nv: NodeValidation) -> str:
    if nv.trigger == Trigger.BURN_IN:
        return f"burn-in (level-{nv.validation.level} validation of all its GPUs)"
    return f"level-{nv.validation.level} validation of all its GPUs after its release"


def node_move(
    prior: Record,
    nv: NodeValidation | None,
    obs: NodeObserved,
    now: dt.datetime,
    settings: ValidationSettings,
) -> NodeMove:
    """The next move of a node's validation (see the module docstring)."""
    if not settings.enabled:
        if nv is not None and nv.held:  # validation switched off: gpuhealth's hold goes with it
            return NodeMove(replace(nv, held=False), taint=False, stop_job=_running_job(nv))
        return NodeMove(nv)
    if obs.released:
        if nv is not None and nv.held:
            msg = f"Released by a human: lifting gpuhealth's burn-in taint ({_what(nv)}: {nv.validation.outcome})"
            lifted = replace(nv, held=False)
            if not nv.done:
                v = replace(nv.validation, outcome=Outcome.FAILED, finished=now, findings="released by a human")
                lifted = replace(lifted, validation=v)
            return NodeMove(lifted, taint=False, stop_job=_running_job(nv), events=(("Normal", "BurnInReleased", msg),))
        # A second release of a node whose validation is under way (or the same release seen again
        # before the watch brought its acknowledgement) changes nothing: one Job per episode.
        again = nv is not None and nv.trigger == Trigger.RELEASE and not nv.done and prior.state == State.RECOVERING
        if wants_release_validation(prior) and not obs.dry_run and not again:
            fresh = NodeValidation(Trigger.RELEASE, now, Validation(level=settings.level))
            msg = f"Released after {prior.reason or 'repair'}: a {_what(fresh)} must pass before the node returns"
            return NodeMove(fresh, hold=True, stop_job=_running_job(nv), events=(("Normal", "ValidationPending", msg),))
    if nv is None or (nv.done and not nv.held and obs.new_node):
        if not obs.new_node or not settings.new_nodes.enabled:
            return NodeMove(nv)
        fresh = NodeValidation(Trigger.BURN_IN, now, Validation(level=settings.level), dry_run=obs.dry_run)
        if obs.dry_run:
            msg = f"DryRun: a new node; would hold it (taint gpuhealth.dev/burn-in) and run its {_what(fresh)}"
            return NodeMove(fresh, events=(("Normal", "BurnInDryRun", msg),))
        fresh = replace(fresh, held=True)
        msg = f"A new GPU node: held (NoSchedule taint gpuhealth.dev/burn-in) until its {_what(fresh)} passes"
        return NodeMove(fresh, taint=True, events=(("Normal", "BurnInHeld", msg),))
    if nv.dry_run:  # what DryRun announced is forgotten once the policy enforces: the node has served since
        return NodeMove(nv if obs.dry_run else None)
    if nv.trigger == Trigger.RELEASE:
        return _release(prior, nv, obs, now, settings)
    return _burn_in(nv, obs, now, settings)


def _running_job(nv: NodeValidation | None) -> str:
    if nv is None or nv.validation.outcome != Outcome.RUNNING or not nv.validation.created:
        return ""
    return nv.validation.job


def _start(nv: NodeValidation, now: dt.datetime, hold: bool) -> NodeMove:
    v = replace(nv.validation, outcome=Outcome.RUNNING, started=now, created=False)
    msg = f"The node's {_what(nv)} starts"
    return NodeMove(replace(nv, validation=v), start=True, hold=hold, events=(("Normal", "ValidationStarted", msg),))


def _read(nv: NodeValidation, obs: NodeObserved, now: dt.datetime, settings: ValidationSettings) -> tuple[Outcome, str]:
    """The running Job's outcome: its verdict, or TimedOut once past ``spec.validation.timeout``."""
    outcome, findings = obs.verdict or (Outcome.RUNNING, "")
    v = nv.validation
    overdue = v.started is not None and (now - v.started).total_seconds() > settings.timeout_s
    if outcome == Outcome.RUNNING and overdue:
        return Outcome.TIMED_OUT, f"no result within {int(settings.timeout_s)}s (spec.validation.timeout)"
    return outcome, findings


def _finish(
    nv: NodeValidation, outcome: Outcome, findings: str, now: dt.datetime
) -> tuple[NodeValidation, float | None]:
    v = replace(nv.validation, outcome=outcome, finished=now, findings=findings)
    took = (now - v.started).total_seconds() if v.started else None
    return replace(nv, validation=v), took


def _release(
    prior: Record, nv: NodeValidation, obs: NodeObserved, now: dt.datetime, settings: ValidationSettings
) -> NodeMove:
    v = nv.validation
    if v.done:
        return NodeMove(nv)
    if v.outcome == Outcome.PENDING:
        if prior.state == State.RECOVERING and obs.may_validate:
            return _start(nv, now, hold=True)
        return NodeMove(nv, hold=True)
    if not v.created:  # killed between the record and the create: create it now (409: it exists)
        return NodeMove(nv, start=True, hold=True)
    if prior.state != State.RECOVERING:  # a fault during the run took the node out again
        done, took = _finish(nv, Outcome.FAILED, f"a fault during the run: {prior.reason}", now)
        msg = f"The node's {_what(nv)} ended: a fault during the run ({prior.reason})"
        return NodeMove(
            done, stop_job=v.job, events=(("Warning", "ValidationFailed", msg),), validated=(str(Outcome.FAILED), took)
        )
    outcome, findings = _read(nv, obs, now, settings)
    if outcome == Outcome.RUNNING:
        return NodeMove(nv, hold=True)
    done, took = _finish(nv, outcome, findings, now)
    stop = v.job if outcome == Outcome.TIMED_OUT else ""
    if outcome == Outcome.PASSED:
        msg = f"The node's {_what(nv)} passed; it returns after its probation"
        return NodeMove(done, events=(("Normal", "ValidationPassed", msg),), validated=(str(outcome), took))
    words = findings or str(outcome)
    msg = f"The node's {_what(nv)} {outcome}: {words}"
    return NodeMove(
        done,
        stop_job=stop,
        failed=f"node validation {outcome}: {words}",
        events=(("Warning", "ValidationFailed", msg),),
        validated=(str(outcome), took),
    )


def _burn_in(nv: NodeValidation, obs: NodeObserved, now: dt.datetime, settings: ValidationSettings) -> NodeMove:
    v = nv.validation
    if v.done:
        return NodeMove(nv)
    if v.outcome == Outcome.PENDING:
        return _start(nv, now, hold=False) if obs.may_validate else NodeMove(nv)
    if not v.created:
        return NodeMove(nv, start=True)
    outcome, findings = _read(nv, obs, now, settings)
    if outcome == Outcome.RUNNING:
        return NodeMove(nv)
    done, took = _finish(nv, outcome, findings, now)
    stop = v.job if outcome == Outcome.TIMED_OUT else ""
    if outcome == Outcome.PASSED:
        msg = f"The node's {_what(nv)} passed: lifting gpuhealth's burn-in taint"
        return NodeMove(
            replace(done, held=False) if nv.held else done,
            taint=False if nv.held else None,
            events=(("Normal", "BurnInPassed", msg),),
            validated=(str(outcome), took),
        )
    msg = (
        f"The node's {_what(nv)} {outcome}: {findings or outcome}. It stays held (taint gpuhealth.dev/burn-in) "
        "until a human releases it (kubectl gpuhealth release)"
    )
    return NodeMove(done, stop_job=stop, events=(("Warning", "BurnInFailed", msg),), validated=(str(outcome), took))
