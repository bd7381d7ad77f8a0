"""Rules the controller applies around the state machine, kept pure so they are tested like it.

- ``time_dependent``: whether the clock alone may change a node's verdict. The sweeper re-queues
  only those nodes, so a large idle fleet costs no reconciles and no writes.
- ``fatal``: whether the faults behind a drain are fatal to running work (a lost GPU, NVML gone, an
  XID whose catalog action is a node reboot): pods then get no time to finish on their own.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from gpuhealth.api.names import Signal, State
from gpuhealth.api.policy import Policy
from gpuhealth.api.status import Record
from gpuhealth.api.timeutil import parse_time
from gpuhealth.catalog import xid as catalog
from gpuhealth.evaluation.assess import THERMAL_REASONS, Assessment
from gpuhealth.evaluation.freshness import Seen, heard_at


def time_dependent(
    rec: Record | None,
    report: Mapping[str, Any] | None,
    policy: Policy | None,
    now: dt.datetime,
    seen: Seen | None = None,
) -> bool:
    """Whether the clock alone may change this node's verdict; everything else waits for an event.

    ``report`` is the cached GPUNodeHealth object, ``policy`` the one its status names (if known),
    ``seen`` when the operator last saw the agent write (freshness is judged by the operator's clock).
    """
    if rec is None or report is None:
        return True  # a new node, or one whose agent never reported: silence is measured by the clock
    if rec.state in (State.RECOVERING, State.DRAINING, State.DEGRADED) or rec.held_by_breaker:
        return True  # probation, drain deadlines and retries, breaker admission, app-XID windows
    status = report.get("status") or {}
    if status.get("pending"):
        return True  # sustained heat
    if rec.state == State.UNKNOWN:
        return False  # only a fresh report (an event) brings it back
    spec = report.get("spec") or {}
    heartbeat = heard_at(seen, parse_time(spec.get("heartbeatTime")))
    silence = policy.silence_after_s if policy else 0.0
    if heartbeat is None or (now - heartbeat).total_seconds() > silence:
        return True  # the agent went silent
    return any((d.get("clockEventReasons") or 0) & THERMAL_REASONS for d in spec.get("devices") or [])


def fatal(a: Assessment) -> bool:
    """Whether any finding means running work cannot continue on this node."""
    return any(
        f.signal in (Signal.GPU_LOST, Signal.NVML_UNAVAILABLE)
        or (f.signal == Signal.XID and f.code is not None and catalog.lookup(f.code).immediate_action == "REBOOT_NODE")
        for f in a.findings
    )
