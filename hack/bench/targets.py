"""The bench's targets: what each figure is held to (the core phases' and the agent's, by fleet size, and
issue #26's), how a result entry reads, and its table rows.

Pure; shared by the run's summary (``report``), the MIG fleet's (``mig_report``) and the filed
docs (``docs``, ``scaling_docs``), so each holds a run to the same targets and renders them the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The targets for the 10,000-node run (and larger), where they differ from the 1,000-node ones.
LARGE_FLEET_NODES = 10000


@dataclass(frozen=True)
class Target:
    """A figure and what it is held to: an absolute target (``target``, ``ok``) and, where the run
    measures a no-logic floor for the same path (``floor``: its figure in the same unit; KeyError where
    the run has none), the ratio to it (issue #52: within ``RATIO_MAX`` of what the API server alone
    does). ``higher``: a throughput, whose ratio is floor / figure."""

    key: str
    label: str
    target: str
    value: Callable[[dict[str, Any]], Any]
    ok: Callable[[Any, dict[str, Any]], bool]
    unit: str = ""
    floor: Callable[[dict[str, Any]], Any] | None = None
    higher: bool = False
    # False: a figure judged by its ratio to its floor alone (no absolute target was ever set for it);
    # its absolute columns read "-" and it is left out of the absolute tallies.
    absolute: bool = True


# Issue #52: every path within 1.5x of its floor, measured in the same run (hack/bench/floors.py).
RATIO_MAX = 1.5
RATIO_MET, RATIO_MISSED, RATIO_UNMEASURED = "met", "missed", "unmeasured"
NO_FLOOR, FLOOR_TIMED_OUT = "no floor measured", "floor timed out"


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not (isinstance(v, float) and math.isnan(v))


def judge_ratio(value: Any, floor: Any, higher: bool = False) -> dict[str, Any]:
    """gpuhealth's figure against its floor: ``ratio`` = figure / floor (floor / figure for a throughput),
    met iff <= ``RATIO_MAX``.

    A floor that is missing (a run filed before floors, or a phase without one) or that timed out (None)
    makes the ratio unmeasured, never met; a measured floor beside a figure gpuhealth did not reach
    (None: its storm never finished) is a miss."""
    if floor is _MISSING:
        return {"floor": None, "ratio": None, "status": RATIO_UNMEASURED, "why": NO_FLOOR}
    if not _num(floor) or floor <= 0:
        return {"floor": None, "ratio": None, "status": RATIO_UNMEASURED, "why": FLOOR_TIMED_OUT}
    if not _num(value) or (higher and value <= 0):
        return {"floor": floor, "ratio": None, "status": RATIO_MISSED, "why": "no figure to compare"}
    ratio = floor / value if higher else value / floor
    status = RATIO_MET if ratio <= RATIO_MAX else RATIO_MISSED
    return {"floor": floor, "ratio": round(ratio, 2), "status": status}


_MISSING: Any = object()  # the run has no floor for the path at all (KeyError), as against one that timed out


def floor_of(t: Target, res: dict[str, Any]) -> Any:
    """The target's floor figure in ``res``; ``_MISSING`` where the run measured none."""
    if t.floor is None:
        return _MISSING
    try:
        return t.floor(res)
    except (KeyError, TypeError, IndexError):
        return _MISSING


def floor_latency(at: Callable[[dict[str, Any]], dict[str, Any]], q: str) -> Callable[[dict[str, Any]], Any]:
    """A latency floor's ``q`` (p50, p99) from the floor block ``at`` gives; None (timed out) where any
    of its samples timed out: a floor the API server did not serve in time is no floor."""

    def of(r: dict[str, Any]) -> Any:
        f = at(r)
        return None if f.get("timeouts") or not f.get("samples") else f[q]

    return of


def floor_figure(at: Callable[[dict[str, Any]], dict[str, Any]], key: str) -> Callable[[dict[str, Any]], Any]:
    """A floor block's figure ``key`` (a rate, seconds); None where the floor timed out."""

    def of(r: dict[str, Any]) -> Any:
        f = at(r)
        return None if f.get("timed_out") else f.get(key)

    return of


def path(*keys: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The results' block at ``keys`` (KeyError where the run lacks it: "not measured")."""

    def at(r: dict[str, Any]) -> dict[str, Any]:
        for k in keys:
            r = r[k]
        return r

    return at


def latency(
    key: str,
    label: str,
    at: Callable[[dict[str, Any]], dict[str, Any]],
    p50_ms: float = 200,
    floor: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> tuple[Target, Target]:
    """p50 <= ``p50_ms`` and p99 <= 1 s (with no timeouts) for the latency summary ``at`` gives of the
    results; each against the same quantile of the floor's latency summary ``floor`` gives, where it has one."""
    return (
        Target(
            f"{key}_p50",
            f"{label}, p50",
            f"<= {p50_ms:g} ms",
            lambda r: at(r)["p50"],
            lambda v, r: _num(v) and v <= p50_ms,
            " ms",
            floor_latency(floor, "p50") if floor else None,
        ),
        Target(
            f"{key}_p99",
            f"{label}, p99",
            "<= 1000 ms",
            lambda r: at(r)["p99"],
            lambda v, r: _num(v) and v <= 1000 and at(r)["timeouts"] == 0,
            " ms",
            floor_latency(floor, "p99") if floor else None,
        ),
    )


def ratio_only(
    key: str,
    label: str,
    value: Callable[[dict[str, Any]], Any],
    floor: Callable[[dict[str, Any]], Any],
    unit: str = "",
    higher: bool = False,
) -> Target:
    """A figure held to its floor alone (issue #52: p50 beside p99, the start-up at every size)."""
    return Target(key, label, "-", value, lambda v, r: True, unit, floor, higher, absolute=False)


def within_seconds(
    key: str,
    label: str,
    limit: float,
    value: Callable[[dict[str, Any]], Any],
    floor: Callable[[dict[str, Any]], Any] | None = None,
) -> Target:
    """A figure in seconds held to at most ``limit`` (and, with a ``floor`` in seconds, to its ratio)."""
    return Target(key, label, f"<= {limit:g} s", value, lambda v, r: _num(v) and v <= limit, " s", floor)


def measured(entry: dict[str, Any] | None) -> bool:
    """Whether a target entry (of a run filed before the target existed: None) was measured."""
    return entry is not None and entry.get("measured", True) is not False


def verdict(entry: dict[str, Any] | None, met: str, missed: str) -> str:
    if not measured(entry):
        return "not measured"
    assert entry is not None
    return met if entry["pass"] else missed


def _fmt(v: Any, unit: str) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:,.1f}{unit}" if abs(v) >= 10 else f"{v:.2f}{unit}"
    return f"{v}{unit}"


# The target tables' head: the figure, its floor and the ratio (issue #52's judgement), then the old
# absolute target beside it.
TABLE_HEAD = [
    f"| figure | result | floor | ratio to floor (<= {RATIO_MAX:g}x) | | absolute target | |",
    "| --- | --- | --- | --- | --- | --- | --- |",
]


def ratio_of(t: Target, e: dict[str, Any] | None, res: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """A measured entry's ratio judgement: as the run recorded it, or for a run filed before ratios were
    judged, from the floor its own results hold (detection's has been measured since the first runs);
    None for a figure with no floor path or an entry not measured."""
    if t.floor is None or not measured(e):
        return None
    assert e is not None
    if "ratio" in e:
        return dict(e["ratio"])
    return judge_ratio(e["value"], floor_of(t, res), t.higher) if res is not None else None


def ratio_cells(
    t: Target, e: dict[str, Any] | None, met: str, missed: str, res: dict[str, Any] | None = None
) -> tuple[str, str, str]:
    """(floor, ratio, verdict) cells of a target entry: "-" for a figure with no floor path; "no floor
    measured" for a run filed before floors (or a floor this run did not take), "floor timed out" where it
    did not finish: both unmeasured, neither met nor missed."""
    if t.floor is None:
        return "-", "-", "-"
    r = ratio_of(t, e, res)
    if not r:
        return "-", NO_FLOOR, RATIO_UNMEASURED
    floor = _fmt(r["floor"], t.unit) if r.get("floor") is not None else "-"
    if r["status"] == RATIO_UNMEASURED:
        return floor, r.get("why") or NO_FLOOR, RATIO_UNMEASURED
    ratio = f"{r['ratio']:.2f}x" if r.get("ratio") is not None else "n/a"
    return floor, ratio, met if r["status"] == RATIO_MET else missed


def row(t: Target, e: dict[str, Any] | None, met: str, missed: str, res: dict[str, Any] | None = None) -> str:
    """One target's table row: figure, result, floor, ratio and its verdict, absolute target and its verdict
    (``res``: the run, for the floors of a run filed before ratios were judged)."""
    value = _fmt(e["value"], t.unit) if e and measured(e) else "not measured"
    floor, ratio, judged = ratio_cells(t, e, met, missed, res)
    absolute = verdict(e, met, missed) if t.absolute else "-"
    return f"| {t.label} | {value} | {floor} | {ratio} | {judged} | {t.target} | {absolute} |"


def ratio_tally(res: dict[str, Any], targets: list[Target]) -> tuple[int, int, int]:
    """(ratios met, ratios measured, ratios unmeasured) over the targets that have a floor path."""
    status = [
        (ratio_of(t, res["targets"].get(t.key), res) or {}).get("status", RATIO_UNMEASURED)
        for t in targets
        if t.floor is not None
    ]
    judged = [s for s in status if s != RATIO_UNMEASURED]
    return sum(1 for s in judged if s == RATIO_MET), len(judged), len(status) - len(judged)


def ratio_sentence(res: dict[str, Any], targets: list[Target]) -> str:
    """ "Ratios to the floor: M of K met (U unmeasured)." for the targets with a floor path; "" without any."""
    met, judged, unmeasured = ratio_tally(res, targets)
    if not judged and not unmeasured:
        return ""
    if not judged:
        return f"Ratios to the no-logic floor (<= {RATIO_MAX:g}x): {NO_FLOOR} in this run."
    rest = f", {unmeasured} unmeasured" if unmeasured else ""
    return f"Ratios to the no-logic floor (<= {RATIO_MAX:g}x): **{met} of {judged} met**{rest}."


def _rows(res: dict[str, Any], targets: list[Target], met: str, missed: str) -> list[str]:
    return [row(t, res["targets"].get(t.key), met, missed, res) for t in targets]


def phase_md(title: str, res: dict[str, Any], targets: list[Target], line: str) -> list[str]:
    """A phase's section of the run's summary: its targets and its one-line account."""
    return [
        f"## {title}",
        "",
        *TABLE_HEAD,
        *_rows(res, targets, "pass", "**MISS**"),
        "",
        *([ratios, ""] if (ratios := ratio_sentence(res, targets)) else []),
        f"- {line}",
        "",
    ]


def phase_block(
    begin: str, end: str, what: str, rel: str, res: dict[str, Any], targets: list[Target], line: str
) -> str:
    """A phase's docs block from the newest filed run with it (``what``: the phase's name in prose);
    misses stay misses."""
    entries = [res["targets"].get(t.key) for t in targets if t.absolute]
    met = sum(1 for e in entries if e and e.get("measured", True) and e["pass"])
    counted = sum(1 for e in entries if e and e.get("measured", True))
    return "\n".join(
        [
            begin,
            f"Latest filed run of {what}: {res['nodes']:,} nodes; commit `{res['commit']}`, {res['date']}, "
            f"{res['machine']}; load average {res['load']} during the run. **{met} of {counted} targets met** "
            f"(`{rel}`). {ratio_sentence(res, targets)}".rstrip(),
            "",
            *TABLE_HEAD,
            *_rows(res, targets, "met", "**missed**"),
            "",
            line,
            end,
        ]
    )


HEARTBEAT_S = 30.0


def worst_traffic(r: dict[str, Any]) -> dict[str, Any]:
    """The detection latency under background fact traffic, at its worst over the rates measured.

    Each rate has its own p50/p99; the targets hold for every rate, so the worst p50, the worst p99 and all
    timeouts are what is checked. A run without the traffic phase raises KeyError: "not measured".
    """
    runs = r["traffic"]
    if not runs:
        raise KeyError("traffic")
    lat = [t["detect_to_taint_ms"] for t in runs]
    return {
        "p50": max(x["p50"] for x in lat),
        "p99": max(x["p99"] for x in lat),
        "timeouts": sum(x["timeouts"] for x in lat),
    }


def targets_for(nodes: int) -> list[Target]:
    """The targets a run of ``nodes`` nodes is held to: the 1,000-node ones, or the issue's 10k ones."""
    large = nodes >= LARGE_FLEET_NODES
    storm_min, rss_max = (25, 400) if large else (20, 250)
    out = [
        *latency("detect", "Detection to taint", path("detect_to_taint_ms"), floor=path("floor_ms")),
        *latency(
            "e2e",
            "XID to taint end to end (real agent)",
            path("e2e", "emit_to_taint_ms"),
            p50_ms=150 if large else 200,
        ),
        Target(
            "ratio_to_floor",
            "Ratio to the no-logic floor (p50)",
            "<= 5",
            lambda r: r["ratio_to_floor"],
            lambda v, r: _num(v) and v <= 5,
        ),
        Target(
            "storm_rate",
            "Storm at 100% breaker",
            f">= {storm_min} nodes/s",
            lambda r: r["storm"]["nodes_per_s"],
            lambda v, r: _num(v) and v >= storm_min,
            " nodes/s",
            floor_figure(path("floors", "storm"), "per_s"),
            higher=True,
        ),
        *latency("traffic", "Detection to taint under fact traffic (worst rate)", worst_traffic, p50_ms=150),
        *latency(
            "device", "Device fault to DeviceTaintRule", path("device_to_rule_ms"), floor=path("floors", "device")
        ),
        Target(
            "device_storm_rate",
            "Device storm (GPUs on distinct nodes at once)",
            ">= 20 rules/s",
            lambda r: r["device_storm"]["rules_per_s"],
            lambda v, r: _num(v) and v >= 20,
            " rules/s",
            floor_figure(path("floors", "device_storm"), "per_s"),
            higher=True,
        ),
        Target(
            "breaker",
            "Breaker at 5% (or half the storm): most quarantined at any instant",
            "<= limit",
            lambda r: r["breaker"]["max_quarantined_seen"],
            lambda v, r: _num(v) and v <= r["breaker"]["limit"],
        ),
        Target(
            "operator_rss",
            "Operator peak RSS",
            f"<= {rss_max} MB",
            lambda r: r["operator"]["peak_rss_mb"],
            lambda v, r: _num(v) and v <= rss_max,
            " MB",
        ),
        Target(
            "operator_idle_writes",
            "Operator writes while idle",
            "0 /min",
            lambda r: r["operator"]["idle_writes_per_min"],
            lambda v, r: _num(v) and v == 0,
            " /min",
        ),
    ]
    startup_floor = floor_figure(path("floors", "startup"), "seconds")
    if not large:  # issue #38's 60 s is the 10,000-node target; below it the start-up has its floor alone
        out.append(
            ratio_only(
                "startup",
                "Operator start-up to every node evaluated",
                lambda r: r["operator"]["startup_s"],
                startup_floor,
                " s",
            )
        )
    if large:
        out += [
            # Issue #38's start-up target; its floor is the lists and first writes alone.
            within_seconds(
                "startup",
                "Operator start-up to every node evaluated",
                60,
                lambda r: r["operator"]["startup_s"],
                floor=startup_floor,
            ),
            Target(
                "operator_idle_cpu",
                "Operator CPU while idle (one core)",
                "<= 10%",
                lambda r: r["operator"]["idle_cpu_percent"],
                lambda v, r: _num(v) and v <= 10,
                " %",
            ),
        ]
    return out + AGENT_TARGETS


AGENT_TARGETS = [
    Target(
        "agent_rss",
        "Agent RSS",
        "<= 60 MB",
        lambda r: r["agent"]["rss_mb"],
        lambda v, r: _num(v) and 0 < v <= 60,
        " MB",
    ),
    Target(
        "agent_cpu",
        "Agent CPU (one core)",
        "<= 1%",
        lambda r: r["agent"]["cpu_percent"],
        lambda v, r: _num(v) and v <= 1.0,
        " %",
    ),
    Target(
        "agent_writes",
        "Agent writes per hour (nothing changing)",
        f"<= ~{3600 / HEARTBEAT_S:.0f} (heartbeats only)",
        lambda r: r["agent"]["writes_per_hour"],
        lambda v, r: _num(v) and v <= 1.1 * 3600 / HEARTBEAT_S,
        " /h",
    ),
]


# The default run's (1,000 nodes) targets.
TARGETS = targets_for(1000)

# NVIDIA NVSentinel v0.4.0's published concurrent-drain figure (tests/scale-tests/results/
# Concurrent_Drain_Results.md in NVIDIA/NVSentinel): about 5 evictions/s, capped by client-side throttling.
NVSENTINEL_EVICTIONS_PER_S = 5


def resilience_targets_for(nodes: int) -> list[Target]:
    """Issue #26's targets (the fleet is never blind): the drain storm, failover and warm restart phases.

    A run without those phases (every run filed before them, and `--phases core`) leaves them "not measured".
    """
    failover_max = 60 if nodes >= LARGE_FLEET_NODES else 15
    return [
        Target(
            "drain_rate",
            "Drain storm: evictions per second (sustained)",
            f">= {10 * NVSENTINEL_EVICTIONS_PER_S} evictions/s",
            lambda r: r["drain_storm"]["evictions_per_s"],
            lambda v, r: _num(v) and v >= 10 * NVSENTINEL_EVICTIONS_PER_S,
            " /s",
            floor_figure(path("floors", "drain"), "evictions_per_s"),
            higher=True,
        ),
        Target(
            "drain_completed",
            "Drain storm: faults to every drain Completed",
            "every node",
            lambda r: r["drain_storm"]["all_drains_completed_s"],
            lambda v, r: _num(v) and r["drain_storm"]["drains_completed"] == r["drain_storm"]["nodes"],
            " s",
            floor_figure(path("floors", "drain"), "seconds"),
        ),
        Target(
            "drain_double",
            "Drain storm: pods evicted or asked twice (audit log)",
            "0",
            lambda r: r["drain_storm"]["double_actions"],
            lambda v, r: _num(v) and v == 0,
        ),
        Target(
            "drain_pdb",
            "Drain storm: fewest Ready pods under a PDB of maxUnavailable 1",
            ">= replicas - 1",
            lambda r: r["drain_storm"]["pdb"]["min_ready_seen"],
            lambda v, r: _num(v) and v >= r["drain_storm"]["pdb"]["replicas"] - 1,
        ),
        within_seconds(
            "failover_p50",
            "Failover: SIGKILL of the acting replica to a new fault's taint, p50",
            failover_max,
            lambda r: r["failover"]["p50_s"],
        ),
        Target(
            "restart_writes",
            "Warm restart: operator writes during start-up",
            "0",
            lambda r: r["warm_restart"]["startup_writes"],
            lambda v, r: _num(v) and v == 0,
        ),
        within_seconds(
            "restart_taint",
            "Warm restart: restart to a new fault's taint",
            30,
            lambda r: r["warm_restart"]["restart_to_first_taint_s"],
            floor=floor_figure(path("floors", "restart"), "seconds"),
        ),
        within_seconds(
            "restart_evaluated",
            "Warm restart: start-up to every node evaluated",
            60,
            lambda r: r["warm_restart"]["startup_evaluated_s"],
            floor=floor_figure(path("floors", "restart"), "seconds"),
        ),
    ]
