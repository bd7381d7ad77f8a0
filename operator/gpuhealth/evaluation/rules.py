"""Rules the controller applies around the state machine, kept pure so they are tested like it.

- ``time_dependent``: whether the clock alone may change a node's verdict. The sweeper re-queues
  only those nodes, every tick, so a large idle fleet costs no reconciles and no writes. A node that
  only holds GPUs out (``Degraded`` for ``DeviceQuarantined``, each held-out GPU ``Quarantined`` or
  ``AwaitingRepair``) is not one of them: those GPUs wait for clean facts, a release or a repair step,
  all events. Passing such nodes every tick made the operator's work grow with the number of GPUs
  held out across the fleet times the cost of one pass (a MIG node's maps 56 devices): at 1,000 MIG
  nodes with a hundred GPUs held out the event loop was never idle and a new fault waited seconds.
- ``fatal``: whether the faults behind a drain are fatal to running work (a lost GPU, NVML gone, an
  XID whose catalog action is a node reboot): pods then get no time to finish on their own.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from gpuhealth.api.devices import DeviceState
from gpuhealth.api.names import Signal, State
from gpuhealth.api.policy import Policy
from gpuhealth.api.remediation_status import IN_FLIGHT, Phase
from gpuhealth.api.status import Record, StoredStatus
from gpuhealth.api.timeutil import parse_time
from gpuhealth.catalog import xid as catalog
from gpuhealth.evaluation.assess import SLOW_REASONS, Assessment
from gpuhealth.evaluation.fabric_rules import is_counter_key
from gpuhealth.evaluation.freshness import Seen, heard_at


def time_dependent(
    rec: Record | None,
    report: Mapping[str, Any] | None,
    policy: Policy | None,
    now: dt.datetime,
    seen: Seen | None = None,
    status: StoredStatus | None = None,
) -> bool:
    """Whether the clock alone may change this node's verdict; everything else waits for an event.

    ``report`` is the cached GPUNodeHealth object, ``status`` its status typed (the store's, parsed once
    per version; read off ``report`` when not given), ``policy`` the one its status names (if known),
    ``seen`` when the operator last saw the agent write (freshness is judged by the operator's clock).
    """
    if rec is None or report is None:
        return True  # a new node, or one whose agent never reported: silence is measured by the clock
    if status is None:
        status = StoredStatus.of(report)
    if rec.state in (State.RECOVERING, State.DRAINING) or rec.held_by_breaker:
        return True  # probation, drain deadlines and retries, breaker admission
    if rec.state == State.DEGRADED and not _steady_hold_out(rec, status):
        return True  # app-XID and restart-loop windows; a GPU's probation, drain or budget wait
    pending = status.pending
    if isinstance(pending, Mapping) and any(not is_counter_key(str(k)) for k in pending):
        return True  # sustained heat (a counter's remembered value is memory, not a wait)
    if rec.state == State.UNKNOWN:
        return False  # only a fresh report (an event) brings it back
    spec = report.get("spec") or {}
    heartbeat = heard_at(seen, parse_time(spec.get("heartbeatTime")))
    silence = policy.silence_after_s if policy else 0.0
    if heartbeat is None or (now - heartbeat).total_seconds() > silence:
        return True  # the agent went silent
    return any((d.get("clockEventReasons") or 0) & SLOW_REASONS for d in spec.get("devices") or [])


# GPU states that no clock moves: they change with the agent's facts, a release, or a ladder step.
_STEADY_GPU = frozenset({DeviceState.IN_SERVICE, DeviceState.QUARANTINED, DeviceState.AWAITING_REPAIR})
# A ladder step that waits on time: its preconditions, its Job, or the facts after it (timeouts).
_LADDER_WAITS = frozenset({Phase.READY, Phase.RESTARTING_PLUGIN, *IN_FLIGHT})


def _steady_hold_out(rec: Record, status: StoredStatus) -> bool:
    """Whether a ``Degraded`` node is so only because some of its GPUs are held out, each in a state no
    clock moves (not on probation, not draining, not waiting for the breaker's GPU budget, no ladder
    step under way). Anything unreadable counts as not steady: the node keeps its pass every tick."""
    if rec.reason != Signal.DEVICE_QUARANTINED or status.unreadable:
        return False
    if any(d.held_by_breaker or d.state not in _STEADY_GPU for d in status.devices.values()):
        return False
    return not any(r.phase in _LADDER_WAITS for r in status.ladders.values())


def fatal(a: Assessment) -> bool:
    """Whether any finding means running work cannot continue on this node."""
    return any(
        f.signal in (Signal.GPU_LOST, Signal.NVML_UNAVAILABLE)
        or (f.signal == Signal.XID and f.code is not None and catalog.lookup(f.code).immediate_action == "REBOOT_NODE")
        for f in a.findings
    )
