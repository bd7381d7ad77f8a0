"""Scopes above the node: an NVLink (IMEX) domain and a rack, correlated across nodes. Pure.

The agent reports facts about its own node only; which nodes share a fault is the operator's call,
made here from the Nodes' labels (``spec.topology``, ``api/slow_policy.py``) and the reports' facts:

* **Domain.** Every node with the same value of the domain label (GPU Feature Discovery's
  ``nvidia.com/gpu.clique=<clusterUuid>.<cliqueId>``) shares one multi-node NVLink domain. A GPU
  whose recovery action is ``RecoverImexDomain``, or whose fabric health mask says its routes are
  unhealthy (``ROUTE_UNHEALTHY`` = true, ``spec.devices[].fabric.routeUnhealthy``), on any of them is a
  fault of the whole domain:
  every member gets the same :func:`domain_finding` (scope ``Domain``), so the members leave service
  as one decision (``controller/state/breaker.py`` admits a domain whole or not at all) and return
  together when the action clears, since the finding is computed from the same facts for each.
* **Rack.** A power brake (clock reason 0x80) is usually the rack's power shelf. Seen on at least
  ``rules.powerBrake.rack.minNodes`` nodes of one rack, each of those nodes' power-brake findings
  becomes one :func:`rack_finding` (scope ``Rack``, ``rules.powerBrake.rack.action``) that names
  the rack and points at the facility, instead of a repair per node.

Everything here reads slim report objects as the operator caches them (``spec.devices[]``), so a
member's facts are read without parsing its whole report.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpuhealth.api.names import Action, Scope, Signal, State
from gpuhealth.api.policy import Policy
from gpuhealth.api.recovery import RecoveryAction
from gpuhealth.api.status import Record, StoredStatus
from gpuhealth.api.validation import Trigger
from gpuhealth.evaluation.assess import HW_POWER_BRAKE
from gpuhealth.evaluation.findings import Assessment, Finding

IMEX_RECOVERY = RecoveryAction.RECOVER_IMEX_DOMAIN


ROUTE_UNHEALTHY = "fabric routes unhealthy"


@dataclass(frozen=True)
class DomainFault:
    """A GPU of a domain member with a fault of the domain's: its recovery action, or its fabric routes."""

    node: str
    gpu: int | None
    uuid: str = ""
    cause: str = f"recovery action {IMEX_RECOVERY}"

    def words(self) -> str:
        gpu = "a GPU" if self.gpu is None else f"GPU {self.gpu}"
        return f"{self.cause} on {gpu}{f' ({self.uuid})' if self.uuid else ''} of node {self.node}"


def labels_of(node: Mapping[str, Any] | None) -> Mapping[str, str]:
    return ((node or {}).get("metadata") or {}).get("labels") or {}


def _devices(report: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    devices = ((report or {}).get("spec") or {}).get("devices") or []
    return [d for d in devices if isinstance(d, Mapping)] if isinstance(devices, list) else []


def _is_imex(recovery: Any) -> bool:
    if not isinstance(recovery, str) or not recovery:
        return False
    # A recovery action newer than api/recovery.py parses to None: not known to be the domain's.
    return RecoveryAction.parse(recovery) is IMEX_RECOVERY


def _routes_unhealthy(device: Mapping[str, Any]) -> bool:
    fabric = device.get("fabric")
    return isinstance(fabric, Mapping) and fabric.get("routeUnhealthy") is True


def _domain_cause(device: Mapping[str, Any]) -> str | None:
    if _is_imex(device.get("recoveryAction")):
        return f"recovery action {IMEX_RECOVERY}"
    if _routes_unhealthy(device):
        return ROUTE_UNHEALTHY
    return None


def imex_faults(node: str, report: Mapping[str, Any] | None) -> tuple[DomainFault, ...]:
    """The GPUs of ``node`` with a fault of the whole domain: recovery action ``RecoverImexDomain``, or
    a fabric health mask whose ``ROUTE_UNHEALTHY`` sub-field is true (``api/fabric.py`` decodes it; only
    a sub-field equal to 1 is a fault, never a non-zero mask)."""
    out = []
    for d in _devices(report):
        if cause := _domain_cause(d):
            index = d.get("index")
            out.append(DomainFault(node, index if isinstance(index, int) else None, str(d.get("uuid") or ""), cause))
    return tuple(out)


def power_braked(report: Mapping[str, Any] | None, policy: Policy) -> bool:
    """Whether a GPU of the node reports a power brake now. The asking node's own brake must have held
    for ``sustainedFor`` (its finding); the others count as soon as they report it, so that a rack
    whose nodes' brakes began a few polls apart is still one rack finding, and the node whose brake
    held longest is not cordoned on its own for the moments before the others' hold as long."""
    return policy.power_brake.enabled and any(_reasons(d) & HW_POWER_BRAKE for d in _devices(report))


def _reasons(device: Mapping[str, Any]) -> int:
    v = device.get("clockEventReasons")
    return v if isinstance(v, int) else 0


def correlation_facts(report: Mapping[str, Any] | None) -> tuple[bool, bool]:
    """(any GPU asks for its domain's recovery, any GPU reports a power brake): what, when it changes
    on one node, may change the verdict of its domain's or rack's other nodes (``feeders``)."""
    devices = _devices(report)
    imex = any(_domain_cause(d) is not None for d in devices)
    brake = any(_reasons(d) & HW_POWER_BRAKE for d in devices)
    return imex, brake


def domain_finding(
    key: str, domain: str, nodes: tuple[str, ...], faults: Iterable[DomainFault], since: dt.datetime | None = None
) -> Finding | None:
    """The one finding every member of ``domain`` gets while any of its GPUs asks for the domain's
    recovery; None when none does. Its detail is the same on every member (the decision is one)."""
    found = sorted(faults, key=lambda f: (f.node, -1 if f.gpu is None else f.gpu))
    if not found:
        return None
    which = ", ".join(f.words() for f in found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    detail = f"NVLink domain {key}={domain} ({len(nodes)} nodes): {which}; the whole domain leaves service as one"
    action = IMEX_RECOVERY.row.verdict
    return Finding(Signal.IMEX_DOMAIN, action, detail, since=since, scope=Scope.DOMAIN)


def rack_finding(
    policy: Policy,
    key: str,
    rack: str,
    braked: Iterable[str],
    since: dt.datetime | None = None,
    episode: bool = False,
) -> Finding | None:
    """The rack's finding while at least ``rack.minNodes`` of its nodes are under a power brake, and
    after that while its episode lasts (``episode``, :func:`rack_episode`): as long as any node of the
    rack is still braked, however few, the brake stays the rack's."""
    nodes = sorted(braked)
    if not nodes or (len(nodes) < policy.power_brake.rack.min_nodes and not episode):
        return None
    shown = ", ".join(nodes[:5]) + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")
    count = f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}"
    least = policy.power_brake.rack.min_nodes
    rest = (
        f", still the rack's episode (begun on {least} or more; it lasts until none is braked)"
        if len(nodes) < least
        else ""
    )
    detail = (
        f"rack {key}={rack}: hardware power brake on {count} ({shown}){rest}: "
        "the rack's power or the facility, not these nodes; see the runbook, RackPowerBrake"
    )
    return Finding(Signal.RACK_POWER_BRAKE, policy.power_brake.rack.action, detail, since=since, scope=Scope.RACK)


def rack_episode(statuses: Iterable[StoredStatus]) -> bool:
    """Whether a rack's episode is on: the written status of one of its nodes (``statuses``, each typed,
    ``api/status.py`` ``StoredStatus``) carries the rack's finding, in its evidence, or as the reason it
    is held (the evidence keeps its first ``MAX_EVIDENCE`` items only). Read from what was written, so a
    restarted operator finds the episode where its predecessor left it; it ends once no node of the
    rack is braked any more (:func:`rack_finding` gets no node), when each node's next status drops it."""
    for s in statuses:
        rec = s.record
        if s.decided and rec.reason == Signal.RACK_POWER_BRAKE and rec.state in _HELD_FOR_RACK:
            return True
        if any(e.signal == Signal.RACK_POWER_BRAKE for e in s.evidence):
            return True
    return False


# A node's states while the rack's finding holds it (observe: Degraded; cordon: out of service). Once its
# brake lifts it is Healthy, or Recovering with nothing of the rack's left in its evidence.
_HELD_FOR_RACK = frozenset({State.DEGRADED, State.QUARANTINED, State.DRAINING})


def with_rack(a: Assessment, rack: Finding | None) -> Assessment:
    """``a`` with its power-brake findings replaced by the rack's one finding (unchanged without one)."""
    if rack is None:
        return a
    kept = tuple(f for f in a.findings if f.signal != Signal.POWER_BRAKE)
    if len(kept) == len(a.findings):
        return a  # this node is not under the brake itself: the rack's finding is not its own
    findings = tuple(sorted((*kept, rack), key=lambda f: f.key))
    braked = {f.gpu for f in a.findings if f.signal == Signal.POWER_BRAKE and f.action.quarantines}
    still = {f.gpu for f in kept if f.gpu is not None and f.action.quarantines}
    healthy = a.healthy_gpus + len({g for g in braked if g not in still})
    return replace(a, findings=findings, healthy_gpus=min(a.total_gpus, healthy))


def holds_domain(rec: Record | None) -> bool:
    """Whether ``rec`` is out of service for its NVLink domain's episode: out for ``ImexDomain``,
    and not waiting for a human (``AwaitingRepair``: its validation failed, it left the episode, as
    :func:`domain_return` says). While a member holds it, the domain's decision is taken: its other
    members follow (:func:`domain_decided`), and the breaker keeps their slots for them
    (``controller/state/breaker.py``), whatever else asks meanwhile, by this record alone."""
    return (
        rec is not None
        and rec.out_of_service
        and rec.reason == Signal.IMEX_DOMAIN
        and rec.state != State.AWAITING_REPAIR
    )


def domain_decided(records: Mapping[str, Record], nodes: Iterable[str]) -> bool:
    """Whether the domain's decision is already taken: a member is out of service for it (its
    persisted record says so, :func:`holds_domain`), so the others follow. Their slots were held
    for them from that record on (the breaker counts every member of a decided domain), so
    following spends no budget another node was given. A killed operator resumes here from the
    records it wrote, never leaving a partial domain."""
    return any(holds_domain(records.get(n)) for n in nodes)


@dataclass(frozen=True)
class DomainReturn:
    """What a member on probation for its domain waits for before it returns: the other members that
    left service for the domain and cannot return yet (none: it returns), and when the last of those
    whose probation is all they wait for ends it (its next pass; None: a watch event or the sweep)."""

    waits_for: tuple[str, ...] = ()
    retry_at: dt.datetime | None = None


def domain_return(
    name: str,
    record: Record,
    others: Mapping[str, StoredStatus],
    probation_s: float,
    now: dt.datetime,
) -> DomainReturn:
    """Whether ``name`` (its ``record``), out of service for its NVLink domain and through its own
    probation, may return: only together with every other member that left service for the domain
    (``others``: each member's status as written, typed). A member waits for another that is:

    * still out of service for the domain (its reason ``ImexDomain``): quarantined or draining (its
      pass after the fault cleared has not come yet), on probation that has not ended, on probation
      with Unknown facts (none counts), or held by its node validation after a release;

    and not for one that is back in service, out for another reason, held by a fault of its own (a
    quarantine-level finding in its evidence other than the domain's), or waiting for a human
    (AwaitingRepair: its validation failed): those left the domain's episode. A member that left for a
    fault of its own returns on its own. Read from the written statuses, so a restarted operator holds
    the domain just the same."""
    if record.state != State.RECOVERING or record.reason != Signal.IMEX_DOMAIN:
        return DomainReturn()
    probation = dt.timedelta(seconds=probation_s)
    waits: list[str] = []
    ends: list[dt.datetime] = []
    for n, status in sorted(others.items()):
        if n == name or not status.written:
            continue
        rec = status.record
        if not rec.out_of_service or rec.reason != Signal.IMEX_DOMAIN or rec.state == State.AWAITING_REPAIR:
            continue
        if _held_by_own_fault(status):
            continue
        if rec.state == State.RECOVERING and rec.healthy_since is not None:
            end = rec.healthy_since + probation
            if end > now:
                ends.append(end)
            elif not _validation_holds(status):
                continue
        waits.append(n)
    return DomainReturn(tuple(waits), max(ends) if waits and ends else None)


def _held_by_own_fault(status: StoredStatus) -> bool:
    for e in status.evidence:
        if e.signal in ("", Signal.IMEX_DOMAIN):
            continue
        try:
            if Action(e.action).quarantines:
                return True
        except ValueError:
            continue
    return False


def _validation_holds(status: StoredStatus) -> bool:
    """The member's validation after a release has not passed: it holds the member's probation
    (``evaluation/node_validation.py``); a burn-in holds with a taint, not the state."""
    nv = status.node_validation
    return nv is not None and nv.trigger == Trigger.RELEASE and not nv.done and not nv.dry_run
