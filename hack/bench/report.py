"""Outputs of `make bench`: results.json (figures, targets, pass/fail), series.json, summary.md and
report.png (hack/bench/plot.py). The targets are in ``targets``, ``mig_report`` and ``domain_report``, the summary's
detail sentences in ``details``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hack.bench.details import (
    api_line,
    device_line,
    drain_line,
    e2e_line,
    failover_line,
    floors_line,
    heartbeat_line,
    memory_line,
    pods_rate,
    restart_line,
    startup_line,
    traffic_line,
)
from hack.bench.domain_report import domain_md, domain_targets_for
from hack.bench.mig_report import mig_md, mig_targets_for
from hack.bench.plot import plot
from hack.bench.targets import (
    RATIO_MISSED,
    TABLE_HEAD,
    Target,
    _rows,
    floor_of,
    judge_ratio,
    measured,
    ratio_sentence,
    resilience_targets_for,
    targets_for,
)

RESILIENCE_PHASES = frozenset({"restart", "failover", "drain"})


def evaluate(res: dict[str, Any]) -> dict[str, Any]:
    """Each target's value and verdict; a figure whose block the run lacks is "not measured", not a miss."""
    out: dict[str, Any] = {}
    n = res["nodes"]
    for t in [*targets_for(n), *resilience_targets_for(n), *mig_targets_for(n), *domain_targets_for(n)]:
        try:
            v = t.value(res)
        except KeyError:
            out[t.key] = {"label": t.label, "target": t.target, "value": None, "pass": False, "measured": False}
            continue
        except TypeError:
            v = None
        try:
            ok = bool(t.ok(v, res))
        except (KeyError, TypeError):
            ok = False
        out[t.key] = {"label": t.label, "target": t.target, "value": v, "pass": ok}
        if not t.absolute:  # judged by its ratio alone
            out[t.key]["absolute"] = False
        if t.floor is not None:  # issue #52: the figure over its floor, measured in the same run
            out[t.key]["ratio"] = judge_ratio(v, floor_of(t, res), t.higher)
    return out


def all_met(targets: dict[str, Any]) -> bool:
    """Every measured target met, its absolute target and its ratio to the floor; an unmeasured ratio
    (no floor, or one that timed out) is neither met nor missed."""
    return all(
        e["pass"] and (e.get("ratio") or {}).get("status") != RATIO_MISSED for e in targets.values() if measured(e)
    )


def tally(targets: dict[str, Any], nodes: int, of: Callable[[int], list[Target]] | None = None) -> tuple[int, int, int]:
    """(met, measured, not measured) over the current targets of a run's size (``of``: which list, the
    core phases' by default); older runs lack the newer ones."""
    entries = [targets.get(t.key) for t in (of or targets_for)(nodes) if t.absolute]
    done = [e for e in entries if measured(e)]
    return sum(1 for e in done if e and e["pass"]), len(done), len(entries) - len(done)


def resilience_md(res: dict[str, Any]) -> list[str]:
    """The summary's section for the drain storm, failover and warm restart phases."""
    return [
        "## The fleet is never blind (drain storm, failover, warm restart)",
        "",
        *TABLE_HEAD,
        *_rows(res, resilience_targets_for(res["nodes"]), "pass", "**MISS**"),
        "",
        *([line, ""] if (line := ratio_sentence(res, resilience_targets_for(res["nodes"]))) else []),
        f"- {drain_line(res)}",
        f"- {failover_line(res)}",
        f"- {restart_line(res)}",
        "",
    ]


def summary_md(res: dict[str, Any]) -> str:
    targets = res["targets"]
    if "storm" not in res:  # a run of the issue #26 phases, the MIG fleet or the domain storm (--phases without core)
        resilient = set(res["config"].get("phases") or []) & RESILIENCE_PHASES
        return "\n".join(
            [
                f"# gpuhealth bench: {res['nodes']} nodes{' (quick)' if res.get('quick') else ''}, "
                f"phases {', '.join(res['config'].get('phases') or [])}",
                "",
                f"Machine: {res['machine']}",
                "",
                *(resilience_md(res) if resilient else []),
                *(mig_md(res) if "mig" in res else []),
                *(domain_md(res) if "domain_storm" in res else []),
                f"- {floors_line(res)}",
                "",
            ]
        )
    rows = [*TABLE_HEAD, *_rows(res, targets_for(res["nodes"]), "pass", "**MISS**")]
    d, f, s, b, o, a = (
        res["detect_to_taint_ms"],
        res["floor_ms"],
        res["storm"],
        res["breaker"],
        res["operator"],
        res["agent"],
    )
    passed, counted, skipped = tally(targets, res["nodes"])
    lines = [
        f"# gpuhealth bench: {res['nodes']} nodes{' (quick)' if res.get('quick') else ''}",
        "",
        f"Machine: {res['machine']}",
        "",
        f"{passed}/{counted} absolute targets met{f' ({skipped} not measured)' if skipped else ''}. "
        f"{ratio_sentence(res, targets_for(res['nodes']))}".rstrip(),
        "",
        *rows,
        "",
        "## Details",
        "",
        f"- Fleet: {res['nodes']} fake 8-GPU nodes governed by the policy, {res.get('pods')} running 1-GPU pods"
        f"{pods_rate(res)}; "
        f"{res['config']['floor_nodes']} floor nodes outside it; "
        f"{res['config'].get('real_agents', 1)} real agents, each on its own node"
        f"{' (under a policy of their own)' if 'real_agents' in res['config'] else ' (outside the policy)'}.",
        f"- Operator start-up: `watching N GPU nodes` after {o.get('startup_watching_s')} s, every node Healthy "
        f"after {o.get('startup_s')} s (from process start).",
        f"- {startup_line(res)}",
        f"- Detection to taint: p50 {d['p50']} ms, p90 {d['p90']} ms, p99 {d['p99']} ms, max {d['max']} ms over "
        f"{d['samples']} faults ({d['timeouts']} timed out after 10 s and count as 10 s); "
        f"the report write itself: p50 {d['publish_p50']} ms.",
        f"- Floor (watch report -> patch Node): p50 {f['p50']} ms, p90 {f['p90']} ms over {f['samples']} samples; "
        f"ratio {res['ratio_to_floor']}.",
        f"- Storm: {s['quarantined']}/{s['nodes']} quarantined in {s['seconds']} s ({s['nodes_per_s']} nodes/s); "
        f"reports published in {s['publish_s']} s, first taint after {s['first_taint_s']} s; each node's "
        f"report write to its taint p50 {s['report_to_taint_ms_p50']} ms, max {s['report_to_taint_ms_max']} ms; "
        f"first report written to last taint: {s['operator_nodes_per_s']} nodes/s.",
        f"- {e2e_line(res)}",
        f"- {device_line(res)}",
        f"- {heartbeat_line(res)}",
        f"- {traffic_line(res)}",
        f"- {api_line(res)}",
        f"- {memory_line(res)}",
        f"- {floors_line(res)}",
        f"- Recovery: {res['recovery']['nodes']} nodes back to Healthy in "
        f"{res['recovery']['seconds_to_all_healthy']} s "
        f"(probation 2 s, sweep every {res['config']['operator_tick_s']} s).",
        f"- Breaker at maxUnhealthy {b.get('max_unhealthy', '5%')}: limit {b['limit']}, "
        f"at most {b['max_quarantined_seen']} quarantined at any 50 ms sample, "
        f"{b['quarantined_at_end']} at the end, {b['held_back']} held back, breaker {b['breaker']}.",
        f"- Operator: peak RSS {o['peak_rss_mb']} MB, {o['cpu_s']} CPU s over {o['wall_s']} s; idle "
        f"{o['idle_requests_per_min']} requests/min, {o['idle_writes_per_min']} writes/min, "
        f"{o.get('idle_cpu_percent')}% of a core "
        f"({json.dumps(o['idle_requests'])}).",
        f"- Operator writes over the whole run: {o.get('writes_total')} ({json.dumps(o.get('writes_by_kind') or {})}).",
        "- Machine load (1-minute load average at the start of each phase; 2 would fill both cores): "
        + ", ".join(f"{p[0].split(':')[0].split(' (')[0]} {p[2]:.1f}" for p in res.get("phases", []) if len(p) > 2)
        + ".",
        f"- Agent: RSS {a['rss_mb']} MB, CPU {a['cpu_percent']}% of a core, {a['writes_per_hour']} writes/h "
        f"once started ({a['writes']} writes over {a['window_s']} s, {a.get('startup_writes')} of them its "
        "start-up: report create, Lease patch 404 and create).",
        "",
        *(resilience_md(res) if set(res["config"].get("phases") or ["core"]) & RESILIENCE_PHASES else []),
        *(domain_md(res) if "domain_storm" in res else []),
    ]
    return "\n".join(lines)


def write_outputs(out: Path, res: dict[str, Any], series: dict[str, Any]) -> None:
    res["targets"] = evaluate(res)
    res["all_targets_met"] = all_met(res["targets"])
    (out / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / "series.json").write_text(json.dumps(series) + "\n")
    (out / "summary.md").write_text(summary_md(res))
    if "storm" in res:  # the plots are the core phases'
        plot(out / "report.png", res, series)
    print((out / "summary.md").read_text())
