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
    key: str
    label: str
    target: str
    value: Callable[[dict[str, Any]], Any]
    ok: Callable[[Any, dict[str, Any]], bool]
    unit: str = ""


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not (isinstance(v, float) and math.isnan(v))


def path(*keys: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The results' block at ``keys`` (KeyError where the run lacks it: "not measured")."""

    def at(r: dict[str, Any]) -> dict[str, Any]:
        for k in keys:
            r = r[k]
        return r

    return at


def latency(
    key: str, label: str, at: Callable[[dict[str, Any]], dict[str, Any]], p50_ms: float = 200
) -> tuple[Target, Target]:
    """p50 <= ``p50_ms`` and p99 <= 1 s (with no timeouts) for the latency summary ``at`` gives of the results."""
    return (
        Target(
            f"{key}_p50",
            f"{label}, p50",
            f"<= {p50_ms:g} ms",
            lambda r: at(r)["p50"],
            lambda v, r: _num(v) and v <= p50_ms,
            " ms",
        ),
        Target(
            f"{key}_p99",
            f"{label}, p99",
            "<= 1000 ms",
            lambda r: at(r)["p99"],
            lambda v, r: _num(v) and v <= 1000 and at(r)["timeouts"] == 0,
            " ms",
        ),
    )


def within_seconds(key: str, label: str, limit: float, value: Callable[[dict[str, Any]], Any]) -> Target:
    """A figure in seconds held to at most ``limit``."""
    return Target(key, label, f"<= {limit:g} s", value, lambda v, r: _num(v) and v <= limit, " s")


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


def _rows(res: dict[str, Any], targets: list[Target], met: str, missed: str) -> list[str]:
    rows = []
    for t in targets:
        e = res["targets"].get(t.key)
        value = _fmt(e["value"], t.unit) if e and measured(e) else "not measured"
        rows.append(f"| {t.label} | {value} | {t.target} | {verdict(e, met, missed)} |")
    return rows


def phase_md(title: str, res: dict[str, Any], targets: list[Target], line: str) -> list[str]:
    """A phase's section of the run's summary: its targets and its one-line account."""
    return [
        f"## {title}",
        "",
        "| figure | value | target | result |",
        "| --- | --- | --- | --- |",
        *_rows(res, targets, "pass", "**MISS**"),
        "",
        f"- {line}",
        "",
    ]


def phase_block(
    begin: str, end: str, what: str, rel: str, res: dict[str, Any], targets: list[Target], line: str
) -> str:
    """A phase's docs block from the newest filed run with it (``what``: the phase's name in prose);
    misses stay misses."""
    entries = [res["targets"].get(t.key) for t in targets]
    met = sum(1 for e in entries if e and e.get("measured", True) and e["pass"])
    counted = sum(1 for e in entries if e and e.get("measured", True))
    return "\n".join(
        [
            begin,
            f"Latest filed run of {what}: {res['nodes']:,} nodes; commit `{res['commit']}`, {res['date']}, "
            f"{res['machine']}; load average {res['load']} during the run. **{met} of {counted} targets met** "
            f"(`{rel}`).",
            "",
            "| figure | result | target | |",
            "| --- | --- | --- | --- |",
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
        *latency("detect", "Detection to taint", path("detect_to_taint_ms")),
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
        ),
        *latency("traffic", "Detection to taint under fact traffic (worst rate)", worst_traffic, p50_ms=150),
        *latency("device", "Device fault to DeviceTaintRule", path("device_to_rule_ms")),
        Target(
            "device_storm_rate",
            "Device storm (GPUs on distinct nodes at once)",
            ">= 20 rules/s",
            lambda r: r["device_storm"]["rules_per_s"],
            lambda v, r: _num(v) and v >= 20,
            " rules/s",
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
    if large:
        out += [
            within_seconds(
                "startup", "Operator start-up to every node evaluated", 60, lambda r: r["operator"]["startup_s"]
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
        ),
        Target(
            "drain_completed",
            "Drain storm: faults to every drain Completed",
            "every node",
            lambda r: r["drain_storm"]["all_drains_completed_s"],
            lambda v, r: _num(v) and r["drain_storm"]["drains_completed"] == r["drain_storm"]["nodes"],
            " s",
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
        ),
        within_seconds(
            "restart_evaluated",
            "Warm restart: start-up to every node evaluated",
            60,
            lambda r: r["warm_restart"]["startup_evaluated_s"],
        ),
    ]
