"""Pure summary of the fleet for `kubectl gpuhealth status`: one row per GPU node, totals, lost capacity.

Inputs are the objects as the API returns them (GPU Nodes, GPUNodeHealth reports, GPUHealthPolicies);
nothing here talks to the API, so it is tested with plain dicts.

Cost of lost capacity: every node that gpuhealth holds out of service (Quarantined, Draining,
AwaitingRepair, Recovering) costs ``total GPUs x hours since status.since`` GPU-hours, summed per
state; nodes in ``Unknown`` (nobody can see their GPUs) are summed separately. Where the governing
policy has ``spec.cost.gpuHourly`` the GPU-hours are priced in its ``spec.cost.currency``. A verdict
computed under a DryRun policy changed no Node, so it holds nothing out of service and costs nothing.
A node held by its burn-in (``status.nodeValidation.held``: gpuhealth's taint ``gpuhealth.dev/burn-in``
until the burn-in passes, or a human releases a failed one) is out of service whatever its state says
(``Healthy``: nothing wrong was known when it joined); its GPU-hours count since the burn-in began,
under ``BurnIn``.
A GPU held out on its own (``status.devices[]``, a DeviceTaintRule) while its node serves on costs
``1 x hours since that GPU's since``; those GPU-hours are summed under ``Device``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuhealth.api.devices import DeviceRecord, DeviceState
from gpuhealth.api.names import OUT_OF_SERVICE, SLOW_SIGNALS, TAINT_KEY, Mode, State
from gpuhealth.api.nodes import count_of, node_gpus
from gpuhealth.api.policy import Policy, PolicyError, parse_policy, select_policy
from gpuhealth.api.slow_policy import Topology
from gpuhealth.api.status import StoredStatus
from gpuhealth.api.timeutil import format_time, parse_time
from gpuhealth.cli.ladderview import (
    AWAITING_APPROVAL,
    EXHAUSTED,
    HANDED_OFF,
    IN_FLIGHT,
    ladder_cell,
    ladder_view,
    node_validation_cell,
    node_validation_view,
)
from gpuhealth.cli.topology import groups

# Most urgent first: the order of the table and of the totals.
STATE_ORDER: tuple[State, ...] = (
    State.AWAITING_REPAIR,
    State.DRAINING,
    State.QUARANTINED,
    State.UNKNOWN,
    State.RECOVERING,
    State.DEGRADED,
    State.HEALTHY,
)
OUT_OF_SERVICE_ORDER: tuple[State, ...] = tuple(s for s in STATE_ORDER if s in OUT_OF_SERVICE)
NO_VERDICT = "NoVerdict"
"""Key in the per-state totals for nodes gpuhealth has not judged (no report, or no policy)."""
BURN_IN = "BurnIn"
"""Key in the GPU-hours held out for nodes held by their burn-in while no verdict holds them out."""


@dataclass(frozen=True)
class Price:
    hourly: float
    currency: str


def price_of(policy: Mapping[str, Any] | None) -> Price | None:
    """``spec.cost`` of a GPUHealthPolicy object, or None if it sets no price."""
    cost = ((policy or {}).get("spec") or {}).get("cost") or {}
    hourly = cost.get("gpuHourly")
    if hourly is None or isinstance(hourly, bool):
        return None
    try:
        value = float(hourly)
    except (TypeError, ValueError):
        return None
    return Price(value, str(cost.get("currency") or "USD"))


def gpu_hours(gpus: int, since: dt.datetime | None, now: dt.datetime) -> float:
    """GPU-hours of ``gpus`` GPUs held since ``since`` (0 for unknown or future times)."""
    if since is None or gpus <= 0:
        return 0.0
    return gpus * max(0.0, (now - since).total_seconds()) / 3600.0


@dataclass(frozen=True)
class Row:
    """One GPU node in the fleet table."""

    node: str
    state: str  # a State value, or "" when gpuhealth has no verdict for the node
    reason: str = ""
    message: str = ""
    policy: str = ""
    policy_mode: str = ""
    healthy_gpus: int | None = None
    total_gpus: int | None = None
    since: dt.datetime | None = None
    age_s: float | None = None
    last_xid: str = ""
    dry_run: bool = False
    node_exists: bool = True
    has_report: bool = True
    cordoned: bool = False
    taint: str = ""  # value of gpuhealth's taint, "" if none
    tainted: bool = False  # gpuhealth's taint is on the Node (whatever its value)
    gpu_hours: float | None = None  # out-of-service or Unknown capacity; None otherwise
    cost: float | None = None
    currency: str = ""
    in_service_gpus: int | None = None  # GPUs the scheduler may allocate (status.inServiceGPUs)
    gpus_held: int = 0  # GPUs held out one by one while the node serves on
    # Of the GPUs held out (the node's, or those held one by one): those for a slow, not broken, reason
    # (api/names.py SLOW_SIGNALS): degraded capacity, counted apart from the broken
    gpus_slow: int = 0
    device_gpu_hours: float = 0.0
    device_cost: float | None = None
    ladders: tuple[dict[str, Any], ...] = ()  # status.remediation as cli.ladderview rows
    node_validation: dict[str, Any] | None = None  # status.nodeValidation as cli.ladderview's view
    clock_skew_s: int | None = None  # status.clockSkew: the agent's clock offset while it is skewed
    domain: str = ""  # the NVLink domain label's value (the governing policy's spec.topology)
    rack: str = ""  # the rack label's value

    @property
    def burn_in_hold(self) -> bool:
        """Held by its burn-in while no verdict holds it out (nor leaves it Unknown): out of service all
        the same, the taint keeping every GPU from new work."""
        nv = self.node_validation or {}
        held = bool(nv.get("held")) and not nv.get("dryRun")
        return held and self.state not in OUT_OF_SERVICE and self.state != State.UNKNOWN and not self.dry_run

    @property
    def held_by(self) -> str:
        """What keeps new pods off the Node: ``taint`` (gpuhealth's alone: taint-only mode,
        ``spec.actions.cordon: false``), ``taint+cordon``, ``cordon``, or "" for neither."""
        return "+".join(w for w, on in (("taint", self.tainted), ("cordon", self.cordoned)) if on)

    @property
    def out_of_service(self) -> bool:
        return (self.state in OUT_OF_SERVICE or self.burn_in_hold) and not self.dry_run

    @property
    def ladder(self) -> str:
        """The LADDER cell: ``GPUReset 1/2 Running (GPU 3)``, ``+N`` for more GPUs on a ladder; else the
        node's validation while it is not passed (``BurnIn Running (held)``)."""
        if not self.ladders and self.validating:
            return node_validation_cell(self.node_validation)
        return ladder_cell(self.ladders)

    @property
    def validating(self) -> bool:
        """The node's validation has not passed (pending, running, or failed and holding it)."""
        return self.node_validation is not None and self.node_validation.get("result") != "Passed"

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "state": self.state or None,
            "reason": self.reason or None,
            "message": self.message or None,
            "policy": self.policy or None,
            "policyMode": self.policy_mode or None,
            "gpus": {"healthy": self.healthy_gpus, "total": self.total_gpus},
            "since": format_time(self.since) if self.since else None,
            "ageSeconds": None if self.age_s is None else round(self.age_s, 1),
            "lastXid": self.last_xid or None,
            "clockSkewSeconds": self.clock_skew_s,
            "dryRun": self.dry_run,
            "nodeExists": self.node_exists,
            "hasReport": self.has_report,
            "cordoned": self.cordoned,
            "taint": self.taint or None,
            "heldBy": self.held_by or None,
            "outOfService": self.out_of_service,
            "gpuHours": None if self.gpu_hours is None else round(self.gpu_hours, 3),
            "cost": None if self.cost is None else round(self.cost, 2),
            "currency": self.currency or None,
            "gpusInService": self.in_service_gpus,
            "gpusHeldOut": self.gpus_held,
            "gpusSlow": self.gpus_slow,
            "deviceGpuHours": round(self.device_gpu_hours, 3),
            "deviceCost": None if self.device_cost is None else round(self.device_cost, 2),
            "remediation": [
                {k: r.get(k) for k in ("gpu", "step", "attempt", "attempts", "phase", "standing", "reason", "job")}
                for r in self.ladders
            ],
            "nodeValidation": None
            if self.node_validation is None
            else {k: self.node_validation.get(k) for k in ("trigger", "level", "result", "job", "held", "findings")},
            "domain": self.domain or None,
            "rack": self.rack or None,
        }


@dataclass
class Totals:
    nodes: int = 0
    by_state: dict[str, int] = field(default_factory=dict)
    gpus_total: int = 0
    gpus_healthy: int = 0
    out_nodes: int = 0
    out_gpus: int = 0
    out_gpu_hours_by_state: dict[str, float] = field(default_factory=dict)
    out_cost: dict[str, float] = field(default_factory=dict)  # currency -> amount
    unpriced_nodes: int = 0  # out-of-service nodes whose policy sets no price
    out_gpus_slow: int = 0  # of out_gpus: held out for a slow, not broken, reason (degraded, not broken)
    unknown_nodes: int = 0
    unknown_gpus: int = 0
    unknown_gpu_hours: float = 0.0
    unknown_cost: dict[str, float] = field(default_factory=dict)
    dry_run_nodes: int = 0
    ladders: dict[str, int] = field(
        default_factory=lambda: {IN_FLIGHT: 0, HANDED_OFF: 0, AWAITING_APPROVAL: 0, EXHAUSTED: 0}
    )

    @property
    def out_gpu_hours(self) -> float:
        return sum(self.out_gpu_hours_by_state.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "byState": dict(self.by_state),
            "gpus": {"total": self.gpus_total, "healthy": self.gpus_healthy},
            "dryRunNodes": self.dry_run_nodes,
            "outOfService": {
                "nodes": self.out_nodes,
                "gpus": self.out_gpus,
                "gpuHours": round(self.out_gpu_hours, 3),
                "gpuHoursByState": {k: round(v, 3) for k, v in self.out_gpu_hours_by_state.items()},
                "cost": {k: round(v, 2) for k, v in self.out_cost.items()},
                "unpricedNodes": self.unpriced_nodes,
                "slowGpus": self.out_gpus_slow,
                "brokenGpus": max(0, self.out_gpus - self.out_gpus_slow),
            },
            "unknown": {
                "nodes": self.unknown_nodes,
                "gpus": self.unknown_gpus,
                "gpuHours": round(self.unknown_gpu_hours, 3),
                "cost": {k: round(v, 2) for k, v in self.unknown_cost.items()},
            },
            "remediation": dict(self.ladders),  # GPUs whose ladder is in flight, handed off, exhausted
        }


@dataclass
class Fleet:
    rows: list[Row]
    totals: Totals
    now: dt.datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "generatedAt": format_time(self.now),
            "nodes": [r.to_json() for r in self.rows],
            "totals": self.totals.to_json(),
            "groups": [g.to_json() for g in groups(self.rows)],
        }


def _sort_key(row: Row) -> tuple[int, str]:
    try:
        rank = 2 * STATE_ORDER.index(State(row.state))
    except ValueError:
        rank = 2 * STATE_ORDER.index(State.HEALTHY) - 1  # no verdict sorts just above Healthy
    return rank, row.node


def _parsed_policies(policies: Iterable[Mapping[str, Any]]) -> list[Policy]:
    out = []
    for p in policies:
        try:
            out.append(parse_policy(p))
        except PolicyError:
            continue  # the operator refuses it too (Event InvalidPolicy); it governs nothing
    return out


def _no_verdict(
    node: Mapping[str, Any] | None, has_report: bool, policies: list[Policy]
) -> tuple[str, str, Policy | None]:
    """Why gpuhealth has no verdict for a node: (reason, message, governing policy)."""
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    governing, _ = select_policy(policies, labels)
    if node is not None and governing is None:
        return "NoPolicy", "no GPUHealthPolicy selects this node: gpuhealth does not watch it", None
    if governing is not None and governing.mode == Mode.PAUSED:
        return "Paused", f"policy {governing.name} is Paused", governing
    if not has_report:
        return "NoReport", "no GPUNodeHealth report yet (the agent has not written one)", governing
    return "Pending", "not evaluated yet", governing


def summarize(
    nodes: Iterable[Mapping[str, Any]],
    reports: Iterable[Mapping[str, Any]],
    policies: Iterable[Mapping[str, Any]],
    now: dt.datetime,
    *,
    include_orphans: bool = True,
) -> Fleet:
    """Rows for every GPU node and every report (a report without a Node is an orphan, kept if asked)."""
    policy_objs = {str((p.get("metadata") or {}).get("name")): p for p in policies}
    parsed = _parsed_policies(policy_objs.values())
    node_by_name = {str(n["metadata"]["name"]): n for n in nodes}
    report_by_name = {str(r["metadata"]["name"]): r for r in reports}
    names = set(node_by_name)
    if include_orphans:
        names |= set(report_by_name)
    rows = [
        build_row(name, node_by_name.get(name), report_by_name.get(name), policy_objs, parsed, now) for name in names
    ]
    rows.sort(key=_sort_key)
    return Fleet(rows, totals(rows), now)


def build_row(
    name: str,
    node: Mapping[str, Any] | None,
    report: Mapping[str, Any] | None,
    policy_objs: Mapping[str, Mapping[str, Any]],
    parsed: list[Policy],
    now: dt.datetime,
) -> Row:
    status = StoredStatus.of(report)
    rec = status.record
    spec = (node or {}).get("spec") or {}
    ours = next((t for t in spec.get("taints") or [] if t.get("key") == TAINT_KEY), None)
    state = str(status.state or "")
    reason = rec.reason
    message = rec.message
    policy_name = status.policy or ""
    if not state:
        reason, message, governing = _no_verdict(node, report is not None, parsed)
        policy_name = policy_name or (governing.name if governing else "")
    policy_obj = policy_objs.get(policy_name)
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    topology = next((p.topology for p in parsed if p.name == policy_name), Topology())
    mode = str(((policy_obj or {}).get("spec") or {}).get("mode") or ("Enforce" if policy_obj else ""))
    total = count_of(status.total_gpus)
    if not total:
        total = node_gpus(node)
    healthy = count_of(status.healthy_gpus)
    since = rec.since
    age = None if since is None else max(0.0, (now - since).total_seconds())
    dry_run = status.dry_run
    hours: float | None = None
    cost: float | None = None
    currency = ""
    validation = node_validation_view(status.node_validation, now)
    burn_in = Row(name, state, dry_run=dry_run, node_validation=validation).burn_in_hold
    if not dry_run and (state in OUT_OF_SERVICE or state == State.UNKNOWN or burn_in):
        held_since = parse_time((validation or {}).get("episode")) if burn_in else since
        hours = gpu_hours(total or 0, held_since, now)
        price = price_of(policy_obj)
        if price is not None:
            cost = hours * price.hourly
            currency = price.currency
    held = [r for r in status.devices.values() if r.state != DeviceState.IN_SERVICE]
    device_hours = 0.0
    device_cost: float | None = None
    if held and not dry_run and state not in OUT_OF_SERVICE:
        device_hours = sum(gpu_hours(1, r.since, now) for r in held)
        price = price_of(policy_obj)
        if price is not None:
            device_cost, currency = device_hours * price.hourly, price.currency
    return Row(
        node=name,
        state=state,
        reason=reason,
        message=message,
        policy=policy_name,
        policy_mode=mode,
        healthy_gpus=healthy,
        total_gpus=total,
        since=since,
        age_s=age,
        last_xid=str(status.last_xid or ""),
        dry_run=dry_run,
        node_exists=node is not None,
        has_report=report is not None,
        cordoned=bool(spec.get("unschedulable")),
        taint=str(ours.get("value") or "") if ours else "",
        tainted=ours is not None,
        gpu_hours=hours,
        cost=cost,
        currency=currency,
        in_service_gpus=count_of(status.in_service_gpus),
        gpus_held=len(held) if state not in OUT_OF_SERVICE and not dry_run else 0,
        gpus_slow=_slow_gpus(state, reason, total, held, dry_run),
        device_gpu_hours=device_hours,
        device_cost=device_cost,
        ladders=tuple(ladder_view(status.ladders, next((p for p in parsed if p.name == policy_name), None), now)),
        node_validation=validation,
        clock_skew_s=status.skew_seconds,
        domain=str(labels.get(topology.domain_label) or ""),
        rack=str(labels.get(topology.rack_label) or ""),
    )


def _slow_gpus(state: str, reason: str, total: int | None, held: Iterable[DeviceRecord], dry_run: bool) -> int:
    """GPUs held out for a slow, not broken, reason: all the node's while it is out for one, else those
    held out one by one for one."""
    if dry_run:
        return 0
    if state in OUT_OF_SERVICE:
        return (total or 0) if reason in SLOW_SIGNALS else 0
    return sum(1 for r in held if r.reason in SLOW_SIGNALS)


def totals(rows: Iterable[Row]) -> Totals:
    t = Totals()
    for r in rows:
        t.nodes += 1
        t.out_gpus_slow += r.gpus_slow
        for lad in r.ladders:
            if lad.get("standing") in t.ladders:
                t.ladders[lad["standing"]] += 1
        key = r.state or NO_VERDICT
        t.by_state[key] = t.by_state.get(key, 0) + 1
        t.gpus_total += r.total_gpus or 0
        t.gpus_healthy += r.healthy_gpus if r.healthy_gpus is not None else 0
        if r.dry_run and r.state in OUT_OF_SERVICE:
            t.dry_run_nodes += 1
        if r.out_of_service:
            t.out_nodes += 1
            t.out_gpus += r.total_gpus or 0
            key = BURN_IN if r.burn_in_hold else r.state
            t.out_gpu_hours_by_state[key] = t.out_gpu_hours_by_state.get(key, 0.0) + (r.gpu_hours or 0.0)
            if r.cost is None:
                t.unpriced_nodes += 1
            else:
                t.out_cost[r.currency] = t.out_cost.get(r.currency, 0.0) + r.cost
        elif r.gpus_held:
            t.out_gpus += r.gpus_held
            t.out_gpu_hours_by_state["Device"] = t.out_gpu_hours_by_state.get("Device", 0.0) + r.device_gpu_hours
            if r.device_cost is not None:
                t.out_cost[r.currency] = t.out_cost.get(r.currency, 0.0) + r.device_cost
        if r.state == State.UNKNOWN and not r.dry_run:
            t.unknown_nodes += 1
            t.unknown_gpus += r.total_gpus or 0
            t.unknown_gpu_hours += r.gpu_hours or 0.0
            if r.cost is not None:
                t.unknown_cost[r.currency] = t.unknown_cost.get(r.currency, 0.0) + r.cost
    ordered = {str(s): t.by_state[str(s)] for s in STATE_ORDER if str(s) in t.by_state}
    if NO_VERDICT in t.by_state:
        ordered[NO_VERDICT] = t.by_state[NO_VERDICT]
    t.by_state = ordered
    t.out_gpu_hours_by_state = {
        str(s): t.out_gpu_hours_by_state[str(s)]
        for s in (*OUT_OF_SERVICE_ORDER, BURN_IN, "Device")
        if str(s) in t.out_gpu_hours_by_state
    }
    return t


def filter_rows(fleet: Fleet, states: Iterable[str] = (), policy: str = "") -> Fleet:
    """The fleet narrowed to some states (case-insensitive; ``NoVerdict`` for unjudged nodes) or one policy."""
    wanted = {s.lower() for s in states}
    rows = [
        r
        for r in fleet.rows
        if (not wanted or (r.state or NO_VERDICT).lower() in wanted) and (not policy or r.policy == policy)
    ]
    return Fleet(rows, totals(rows), fleet.now)
