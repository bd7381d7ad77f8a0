"""P2P-aware repair: a GPU whose recovery action needs its NVLink peers idle holds them out with it.

NVIDIA's recovery actions ``DRAIN_AND_RESET`` (4) and ``DRAIN_P2P`` (3) ask that every process doing
peer-to-peer traffic with the faulted GPU end first (``api/recovery.py``). The agent reports, per GPU,
the GPUs of the node it reaches over NVLink (``spec.devices[].nvlink.peers``; None: not known). With
them known, the faulted GPU and its peers are one *group*:

- each peer gets a drain-level, device-scoped :data:`PEER` finding, so it goes the way of any GPU
  held out: its DeviceTaintRule (NoSchedule: nothing new lands on it), the drain of the pods holding
  it (with the checkpoint handshake, never a forced kill), its record in ``status.devices[]``. Where
  no ResourceSlice publishes the GPUs (no DRA), placement falls the findings back to node scope: the
  node is drained, which is what such a node's topology requires (a peer cannot be held out alone);
- the group leaves service as one breaker decision (``decide_devices`` admits all of it or none),
  and its peers do not count as bad GPUs (``devices.maxBadGPUsPerNode``): they are not faulty;
- the peers stay held while the GPU still asks for the drain, and while its reset Job is in flight
  (a GPU reset on an NVSwitch system must not meet peer traffic), but not once the GPU waits for a
  human (AwaitingRepair: its ladder is exhausted, no reset by gpuhealth is coming, and 7 healthy GPUs
  are not kept idle for one that waits for an RMA); then they return at once, without probation:
  their own facts were judged all along, and a peer with a fault of its own carries that finding
  and follows its own path.

``DRAIN_P2P`` names no repair: "drain P2P, then read the field again, which then names another
action". With the peers known (and ``spec.remediation`` on) its finding is the GPU's (``scope.py``),
the group is drained the same way, and no step starts (:func:`awaiting_reread`): the agent's next
reading names the next action, which the GPU then follows like any other (``Reset`` or ``BusReset``:
a reset, the peers returned since it needs them no more; ``DrainAndReset``: the reset with the peers
still held; ``None``: probation; a reboot: the node's). If the reading still says ``DrainP2P``
:data:`REREAD_TIMEOUT_S` after the GPU's drain completed, the ladder's conservative ``NodeReboot``
applies.

Peers unknown (None): nothing is added; the ladder skips ``GPUReset`` (``api/remediation.py``
``steps_for``), ``DrainP2P`` stays the node's, and the remediator says why in an Event.

Pure.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from gpuhealth.api.devices import DeviceRecord, DeviceState
from gpuhealth.api.names import Action, Scope, Signal
from gpuhealth.api.recovery import RecoveryAction
from gpuhealth.api.remediation import StepKind
from gpuhealth.api.remediation_status import LadderRecord, Phase
from gpuhealth.api.report import Device, Report
from gpuhealth.evaluation.findings import Assessment, Finding

PEER = Signal.NVLINK_PEER
# How long a DrainP2P GPU whose group is drained waits for the agent's next reading of its recovery
# action before the conservative NodeReboot: the agent reads it every few seconds, so ten minutes is
# a reading that will not change, not one not yet taken.
REREAD_TIMEOUT_S = 600.0
_RESET_IN_FLIGHT = frozenset({Phase.PENDING, Phase.RUNNING})


def peers_of(device: Device | None) -> tuple[int, ...] | None:
    """The GPUs ``device`` reaches over NVLink (itself left out); None when the agent does not know."""
    if device is None or device.nvlink is None or device.nvlink.peers is None:
        return None
    return tuple(sorted({p for p in device.nvlink.peers if p != device.index}))


def needs_peers_idle(device: Device | None) -> bool:
    """The GPU's recovery action now asks for its NVLink peers to be idle (``Recovery.drain_peers``)."""
    return device is not None and device.recovery_action is not None and device.recovery_action.row.drain_peers


def p2p_drain(device: Device | None) -> bool:
    """``DrainP2P`` with the GPU's peers known: the peers are drained, then the field is read again."""
    return device is not None and device.recovery_action == RecoveryAction.DRAIN_P2P and peers_of(device) is not None


def awaiting_reread(rec: DeviceRecord, now: dt.datetime) -> float | None:
    """Seconds a DrainP2P GPU (group drained or draining) still waits for the next reading; None when
    the wait is over (the conservative NodeReboot applies). Measured from the end of its drain."""
    if rec.state != DeviceState.QUARANTINED or not rec.drained or rec.since is None:
        return REREAD_TIMEOUT_S
    left = REREAD_TIMEOUT_S - (now - rec.since).total_seconds()
    return left if left > 0 else None


@dataclass(frozen=True)
class Group:
    """A faulted GPU and the NVLink peers held out with it."""

    gpu: int
    peers: tuple[int, ...]
    why: str  # the GPU's recovery action, or its reset in flight

    @property
    def members(self) -> frozenset[int]:
        return frozenset((self.gpu, *self.peers))


def groups(
    report: Report | None,
    findings: Iterable[Finding],
    ladders: Mapping[int, LadderRecord],
    prior: Mapping[int, DeviceRecord],
) -> tuple[Group, ...]:
    """The groups this pass holds out (see the module docstring).

    A GPU heads a group while it has a quarantine-level device finding and its recovery action asks
    for idle peers, with peers known; or while its GPUReset Job is in flight and its peers were held
    for it (the record's reason says so): the reset never meets a returning peer."""
    if report is None:
        return ()
    faulted = {f.gpu for f in findings if f.gpu is not None and f.scope == Scope.DEVICE and f.action.quarantines}
    out: list[Group] = []
    for d in report.devices:
        peers = peers_of(d)
        own = prior.get(d.index)
        lad = ladders.get(d.index)
        if not peers or (own is not None and own.state == DeviceState.AWAITING_REPAIR):
            continue  # no peers to hold, or no reset by gpuhealth is coming: a human has the GPU
        if d.index in faulted and needs_peers_idle(d):
            action = d.recovery_action
            out.append(Group(d.index, peers, f"its recovery action {action} needs its NVLink peers idle"))
            continue
        held = [p for p in peers if (r := prior.get(p)) is not None and r.out_of_service and r.reason == PEER]
        if lad is not None and lad.step == StepKind.GPU_RESET and lad.phase in _RESET_IN_FLIGHT and held:
            out.append(Group(d.index, peers, "its GPU reset is in flight"))
    return tuple(out)


def peer_findings(report: Report, group: Group, since_of: Mapping[int, Finding]) -> tuple[Finding, ...]:
    """A drain-level, device-scoped finding on each peer of ``group``."""
    head = since_of.get(group.gpu)
    out: list[Finding] = []
    for p in group.peers:
        dev = report.device(p)
        detail = f"NVLink peer of GPU {group.gpu}, which is being repaired: {group.why}; held out until it is done"
        out.append(
            Finding(
                PEER,
                Action.DRAIN,
                detail,
                gpu=p,
                uuid=dev.uuid if dev is not None else "",
                since=head.since if head is not None else None,
                scope=Scope.DEVICE,
            )
        )
    return tuple(out)


def with_peers(a: Assessment, report: Report | None, gs: Iterable[Group]) -> Assessment:
    """``a`` with each group's peer findings added (none when there is no group)."""
    gs = tuple(gs)
    if report is None or not gs:
        return a
    heads = {f.gpu: f for f in a.findings if f.gpu is not None and f.scope == Scope.DEVICE and f.action.quarantines}
    extra = [f for g in gs for f in peer_findings(report, g, heads)]
    return replace(a, findings=(*a.findings, *extra))
