"""Pure evaluation: (policy, report, node, prior record, time) -> assessment. No I/O.

An assessment lists the findings (each a signal on a GPU with the action the policy attaches to it)
and whether the node's facts are fresh. It never decides state; see transitions.py for that.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpuhealth.api.device_facts import FAULT_FACTS
from gpuhealth.api.fabric import HW_POWER_BRAKE as HW_POWER_BRAKE
from gpuhealth.api.fabric import HW_SLOWDOWN, HW_THERMAL
from gpuhealth.api.names import GPU_COUNT_LABEL, Action, Signal
from gpuhealth.api.policy import Policy
from gpuhealth.api.recovery import RecoveryAction
from gpuhealth.api.report import Device, NvmlHang, Report
from gpuhealth.api.timeutil import format_time
from gpuhealth.catalog import xid as catalog
from gpuhealth.evaluation.fabric_rules import fabric_findings
from gpuhealth.evaluation.findings import Assessment as Assessment
from gpuhealth.evaluation.findings import Finding as Finding
from gpuhealth.evaluation.repeats import repeated_app_xids
from gpuhealth.evaluation.scope import scope_of

# NVML clock-event reasons (api/fabric.py, the one declaration of their bits), split by what they tell:
# HW thermal (0x40) is heat; HW power brake (0x80) is an external power brake, usually the rack's power
# shelf, which no reboot fixes; HW slowdown (0x8) is the hardware slowing down without saying why (heat,
# a power brake or fast-trigger protection). The last two are "slow, not broken" signals of their own
# (rules.powerBrake, rules.hwSlowdown); 0x8 alongside 0x40 or 0x80 is explained by the other bit.
# Every clock reason a rule reads over time (evaluation/rules.py re-passes nodes that carry one).
SLOW_REASONS = HW_SLOWDOWN | HW_THERMAL | HW_POWER_BRAKE


@dataclass(frozen=True)
class NodeView:
    """What evaluation needs to know about a Node."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    gpu_capacity: int | None = None

    def expected_gpus(self, policy: Policy) -> int | None:
        if policy.gpu_count_expected is not None:
            return policy.gpu_count_expected
        label = self.labels.get(GPU_COUNT_LABEL)
        if label and label.isdigit():
            return int(label)
        return self.gpu_capacity


def _xid_action(policy: Policy, code: int, device: Device | None) -> Action:
    if code in policy.xid_overrides:
        return policy.xid_overrides[code]
    if code == 154 and device is not None and device.recovery_action is not None:
        return device.recovery_action.row.verdict  # unknown (newer than api/recovery.py): the XID's default
    return Action(catalog.default_action(code))


def _assess_xids(policy: Policy, report: Report, cleared: dt.datetime | None) -> list[Finding]:
    findings: dict[str, Finding] = {}
    for ev in report.xids:
        if cleared is not None and ev.time <= cleared:
            continue
        device = report.device(ev.gpu)
        uuid = ev.uuid or (device.uuid if device else "")
        action = _xid_action(policy, ev.xid, device)
        f = Finding(Signal.XID, action, catalog.describe(ev.xid), ev.gpu, uuid, ev.xid, ev.time)
        findings[f"{f.key}/{'' if ev.gpu is not None else uuid}"] = f  # the latest of each (GPU, code) wins
    # Application XIDs repeated on one GPU, or on one MIG instance when NVML attributed them.
    for f in repeated_app_xids(policy, report, cleared):
        findings[f"{f.key}/{f.uuid if f.gpu is None else ''}"] = f
    return list(findings.values())


def _recovery_actions(policy: Policy, report: Report, found: Iterable[Finding]) -> list[Finding]:
    """A GPU whose recovery action (NVML field 230, ``spec.devices[].recoveryAction``) asks for something
    and that has no XID 154 finding of its own (the agent started after the XID, or missed the event; or
    a release acknowledged the XID while the field still asks): the finding its XID 154 would have, so
    the verdict, scope and first step come from the one table (``api/recovery.py``) all the same.
    ``RecoverImexDomain`` where the NVLink domain's finding (``evaluation/domains.py``) already takes the
    node out with its domain adds nothing: that finding is the fault's.

    The field is a live fact, not an event: it holds until a reset or a reboot clears it, so the
    finding has no time a release could acknowledge (``since`` None)."""
    found = tuple(found)
    covered = {f.gpu for f in found if f.signal == Signal.XID and f.code == 154}
    domain = any(f.signal == Signal.IMEX_DOMAIN for f in found)
    out = []
    for d in report.devices:
        action = d.recovery_action
        if action is None or action == RecoveryAction.NONE or d.index in covered or d.lost:
            continue
        if action == RecoveryAction.RECOVER_IMEX_DOMAIN and domain:
            continue
        detail = f"GPU recovery action {action} read from NVML: {action.row.means} (no XID 154 seen)"
        out.append(Finding(Signal.XID, _xid_action(policy, 154, d), detail, d.index, d.uuid, 154, None))
    return out


def _assess_device(
    policy: Policy,
    d: Device,
    report: Report,
    now: dt.datetime,
    prior_pending: Mapping[str, str],
    pending: dict[str, str],
) -> list[Finding]:
    from gpuhealth.api.timeutil import format_time, parse_time

    out: list[Finding] = []
    seen = report.observed
    if d.lost:
        out.append(
            Finding(
                Signal.GPU_LOST,
                policy.gpu_lost_action,
                "GPU is lost (NVML: GPU_IS_LOST)",
                d.index,
                d.uuid,
                None,
                seen,
            )
        )
        return out
    for fact in FAULT_FACTS:  # a boolean fact true is its own finding (api/device_facts.py Fault)
        fault = fact.fault
        if fault is not None and getattr(d, fact.attr) is True:
            out.append(Finding(fault.signal, fault.action, fault.detail, d.index, d.uuid, None, seen))
    if d.ecc_volatile_uncorrected >= policy.ecc_threshold:
        out.append(
            Finding(
                Signal.ECC,
                policy.ecc_action,
                f"{d.ecc_volatile_uncorrected} uncorrected ECC errors (threshold {policy.ecc_threshold})",
                d.index,
                d.uuid,
                None,
                seen,
            )
        )
    if d.remap_failure:
        out.append(
            Finding(
                Signal.ROW_REMAP_FAILURE,
                policy.row_remap_failure_action,
                "row remapping failed",
                d.index,
                d.uuid,
                None,
                seen,
            )
        )
    if d.remap_pending or d.retired_pending:
        what = "row remap pending" if d.remap_pending else "page retirement pending"
        out.append(
            Finding(
                Signal.PENDING_REMAP,
                policy.pending_remap_action,
                f"{what}: needs a GPU reset",
                d.index,
                d.uuid,
                None,
                seen,
            )
        )
    sustained = dt.timedelta(seconds=policy.thermal_sustained_s)
    out.extend(_clock_findings(policy, d, now))
    if d.temperature_c is not None and d.temperature_c >= policy.thermal_threshold_c:
        key = f"temp/{d.index}"
        first = parse_time(prior_pending.get(key)) or now
        pending[key] = format_time(first)
        if now - first >= sustained:
            out.append(
                Finding(
                    Signal.THERMAL,
                    policy.thermal_action,
                    f"temperature {d.temperature_c}C at or above {policy.thermal_threshold_c}C "
                    f"since {format_time(first)}",
                    d.index,
                    d.uuid,
                    None,
                    first,
                )
            )
    return out


def _hang_detail(hang: NvmlHang) -> str:
    """Stable while the hang lasts (no age in it), so a pass writes no status for it again."""
    newest = (
        f"newest GPU facts from {format_time(hang.last_sample)}"
        if hang.last_sample is not None
        else "no GPU facts since the agent started"
    )
    return f"NVML unresponsive: {hang.call} has not returned since {format_time(hang.since)} ({newest})"


def _clock_findings(policy: Policy, d: Device, now: dt.datetime) -> list[Finding]:
    """Clock-event reasons held for their rule's ``sustainedFor`` (the agent reports when the bitmask
    last changed): HW thermal is heat, HW power brake and an unexplained HW slowdown are slow, not broken."""
    reasons, since = d.clock_event_reasons, d.clock_events_since
    if not reasons or since is None:
        return []
    held = now - since
    # "since <time>", never "for <n>s": a detail is status evidence, and one that aged each pass would
    # be a status write each pass for as long as the finding holds (as _hang_detail and the silence).
    began = format_time(since)
    out: list[Finding] = []
    if policy.thermal_slowdown and reasons & HW_THERMAL and held >= dt.timedelta(seconds=policy.thermal_sustained_s):
        detail = f"hardware thermal slowdown (clock events 0x{reasons:x}) since {began}"
        out.append(Finding(Signal.THERMAL, policy.thermal_action, detail, d.index, d.uuid, None, since))
    brake = policy.power_brake
    if brake.enabled and reasons & HW_POWER_BRAKE and held >= dt.timedelta(seconds=brake.sustained_s):
        detail = f"hardware power brake (clock events 0x{reasons:x}) since {began}: slow, not broken"
        out.append(Finding(Signal.POWER_BRAKE, brake.finding_action, detail, d.index, d.uuid, None, since))
    slow = policy.hw_slowdown
    unexplained = reasons & HW_SLOWDOWN and not reasons & (HW_THERMAL | HW_POWER_BRAKE)
    if slow.enabled and unexplained and held >= dt.timedelta(seconds=slow.sustained_s):
        detail = f"HW slowdown, cause not given (clock events 0x{reasons:x}) since {began}: slow, not broken"
        out.append(Finding(Signal.HW_SLOWDOWN, slow.finding_action, detail, d.index, d.uuid, None, since))
    return out


def assess(
    policy: Policy,
    report: Report | None,
    node: NodeView,
    now: dt.datetime,
    prior_pending: Mapping[str, str] | None = None,
    cleared_before: dt.datetime | None = None,
    extra: Sequence[Finding] = (),
) -> Assessment:
    """Everything the facts say about the node under ``policy`` at ``now``.

    ``prior_pending`` carries first-seen times of duration-based signals between evaluations;
    ``cleared_before`` hides evidence a human acknowledged by releasing the node.
    """
    prior_pending = prior_pending or {}
    if report is None:
        return Assessment(unknown=True, unknown_reason="no GPUNodeHealth report from the node's agent")
    pending: dict[str, str] = {}
    findings: list[Finding] = []
    silent_for = None if report.heartbeat is None else (now - report.heartbeat).total_seconds()
    unknown = silent_for is None or silent_for > policy.silence_after_s
    # The time of the last heartbeat, not the silence's length: an Unknown node's status message is
    # this reason, and one that grew each pass was a status write each pass (every watch event of that
    # write queued the next) for as long as the agent stayed silent.
    unknown_reason = (
        "the agent never sent a heartbeat"
        if report.heartbeat is None
        else f"no heartbeat from the agent since {format_time(report.heartbeat)} (limit {int(policy.silence_after_s)}s)"
    )
    unknown_signal = Signal.AGENT_SILENT
    hang = report.nvml_hang
    if hang is not None and not unknown:
        # The agent lives (its heartbeat is fresh) and says its facts are not: a fault of its own.
        unknown = True
        unknown_signal = Signal.NVML_UNRESPONSIVE
        unknown_reason = _hang_detail(hang)
    elif not report.nvml_available and not unknown:
        # Likewise only while it lives: a silent agent's word is as stale as its facts, and the
        # operator's stub (no heartbeat, no nvml: the agent never wrote) is silence, not this.
        unknown = True
        unknown_signal = Signal.NVML_UNAVAILABLE
        unknown_reason = f"the agent cannot read the GPUs: {report.nvml_error or 'NVML unavailable'}"
    if hang is not None and policy.nvml_unresponsive_action.quarantines:
        findings.append(
            Finding(Signal.NVML_UNRESPONSIVE, policy.nvml_unresponsive_action, _hang_detail(hang), since=hang.since)
        )
    findings.extend(extra)
    findings.extend(_assess_xids(policy, report, cleared_before))
    findings.extend(_recovery_actions(policy, report, findings))
    for d in report.devices:
        findings.extend(_assess_device(policy, d, report, now, prior_pending, pending))
    findings.extend(fabric_findings(policy, report, prior_pending, pending, now, cleared_before))
    expected = node.expected_gpus(policy)
    if report.nvml_available and expected is not None and len(report.devices) < expected:
        findings.append(
            Finding(
                Signal.GPU_COUNT,
                policy.gpu_count_action,
                f"{len(report.devices)} of {expected} GPUs visible",
                since=report.observed,
            )
        )
    faulty = {f.gpu for f in findings if f.gpu is not None and f.action.quarantines}
    total = max(len(report.devices), expected or 0)
    healthy = sum(1 for d in report.devices if d.index not in faulty and not d.lost)
    last = report.xids[-1] if report.xids else None
    last_xid = "" if last is None else (f"{last.xid} (GPU {last.gpu})" if last.gpu is not None else str(last.xid))
    findings = [replace(f, scope=scope_of(f, policy, report)) for f in findings]
    return Assessment(
        findings=tuple(sorted(findings, key=lambda f: f.key)),
        unknown=unknown,
        unknown_reason=unknown_reason if unknown else "",
        unknown_signal=unknown_signal,
        pending=pending,
        total_gpus=total,
        healthy_gpus=healthy,
        last_xid=last_xid,
    )
