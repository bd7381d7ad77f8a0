"""Outputs of `make bench`: results.json (figures, targets, pass/fail), summary.md and report.png."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hack.bench.mig_report import mig_md, mig_targets_for
from hack.bench.targets import LARGE_FLEET_NODES, Target, _num, _rows, latency, measured, path

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
            Target(
                "startup",
                "Operator start-up to every node evaluated",
                "<= 60 s",
                lambda r: r["operator"]["startup_s"],
                lambda v, r: _num(v) and v <= 60,
                " s",
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
        Target(
            "failover_p50",
            "Failover: SIGKILL of the acting replica to a new fault's taint, p50",
            f"<= {failover_max} s",
            lambda r: r["failover"]["p50_s"],
            lambda v, r: _num(v) and v <= failover_max,
            " s",
        ),
        Target(
            "restart_writes",
            "Warm restart: operator writes during start-up",
            "0",
            lambda r: r["warm_restart"]["startup_writes"],
            lambda v, r: _num(v) and v == 0,
        ),
        Target(
            "restart_taint",
            "Warm restart: restart to a new fault's taint",
            "<= 30 s",
            lambda r: r["warm_restart"]["restart_to_first_taint_s"],
            lambda v, r: _num(v) and v <= 30,
            " s",
        ),
    ]


def evaluate(res: dict[str, Any]) -> dict[str, Any]:
    """Each target's value and verdict; a figure whose block the run lacks is "not measured", not a miss."""
    out: dict[str, Any] = {}
    for t in [*targets_for(res["nodes"]), *resilience_targets_for(res["nodes"]), *mig_targets_for(res["nodes"])]:
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
    return out


def tally(targets: dict[str, Any], nodes: int, of: Callable[[int], list[Target]] | None = None) -> tuple[int, int, int]:
    """(met, measured, not measured) over the current targets of a run's size (``of``: which list, the
    core phases' by default); older runs lack the newer ones."""
    entries = [targets.get(t.key) for t in (of or targets_for)(nodes)]
    done = [e for e in entries if measured(e)]
    return sum(1 for e in done if e and e["pass"]), len(done), len(entries) - len(done)


def heartbeat_line(res: dict[str, Any]) -> str:
    """The heartbeat traffic the figures were taken under, or "not measured" for runs before it existed."""
    h = res.get("heartbeats")
    if not h:
        return "Heartbeat traffic: not measured in this run."
    return (
        f"Heartbeat traffic: {h['agents']:,} simulated agents renewed their node Lease every {h['interval_s']:g} s "
        f"(agentSilence {h['agent_silence']}): {h['achieved_per_s']} renewals/s achieved of {h['asked_per_s']} "
        f"asked (restarted agents renew at once, on top), {h['failures']} failed, longest gap on one node "
        f"{h['max_gap_s']} s."
    )


def pods_rate(res: dict[str, Any]) -> str:
    """How fast the pods were placed (runs before it was recorded: nothing)."""
    if not _num(res.get("pods_per_s")):
        return ""
    return f" (Running {res['pods_start_s']} s after creation began: {res['pods_per_s']} pods/s)"


def _floor(t: dict[str, Any]) -> str:
    f = t.get("floor_ms")
    if not f or not f.get("samples"):
        return ""
    return f", the no-logic floor under the same traffic p50 {f['p50']} ms (ratio {t.get('ratio_to_floor')})"


def traffic_line(res: dict[str, Any]) -> str:
    """Detection under background fact traffic, rate by rate, or "not measured" for runs before it existed."""
    runs = res.get("traffic")
    if not runs:
        return "Fact traffic: not measured in this run."
    parts = []
    for t in runs:
        d = t["detect_to_taint_ms"]
        parts.append(
            f"{t['asked_per_s']:g}/s asked, {t['achieved_per_s']}/s achieved ({t['writes']:,} report writes, "
            f"{t['failures']} failed): detection to taint p50 {d['p50']} ms, p99 {d['p99']} ms over {d['samples']} "
            f"faults ({d['timeouts']} timed out){_floor(t)}; operator CPU {t['operator_cpu_percent']}% of a core "
            f"({t['operator_cpu_percent_traffic_only']}% with the traffic alone), operator writes "
            f"{t['operator_writes']} ({t['operator_writes_traffic_only']} with the traffic alone)"
        )
    return (
        "Fact traffic (corrected ECC errors and temperature moves on random healthy nodes, each a report write "
        "through the agent's publisher, below every threshold of the policy): " + "; ".join(parts) + "."
    )


def _rate(v: Any, unit: str) -> str:
    if not _num(v):
        return "n/a"
    if unit == "B/s":
        return f"{v / 1024:,.1f} KiB/s"
    return f"{v:,.2f} {unit}"


def api_line(res: dict[str, Any]) -> str:
    """The API traffic gpuhealth adds, operator and agents apart, or "not measured" for runs before it existed."""
    a = res.get("api")
    if not a:
        return "API traffic gpuhealth adds: not measured in this run."
    o, g = a["operator"], a["agent"]
    return (
        f"API traffic gpuhealth adds: the operator {_rate(o['requests_per_s'], 'requests/s')} "
        f"({_rate(o['writes_per_s'], 'writes/s')}, {_rate(o['idle_requests_per_s'], 'requests/s')} idle) and "
        f"{_rate(o['bytes_per_s'], 'B/s')} through its process; one agent {_rate(g['requests_per_s'], 'requests/s')}"
        f" and {_rate(g['bytes_per_s'], 'B/s')}, so {a['fleet_agents']:,} agents "
        f"{_rate(a['agents_requests_per_s'], 'requests/s')} and {_rate(a['agents_bytes_per_s'], 'B/s')} "
        "(requests from the audit log; bytes read and written by each process, /proc/PID/io, its log included)."
    )


def memory_line(res: dict[str, Any]) -> str:
    """Peak RSS of every process of the run (does a fleet this size fit the machine?)."""
    m = res.get("memory_mb")
    if not m:
        return "Memory per process: not measured in this run."
    procs = {k: v for k, v in m.items() if k != "machine_available_at_end"}
    return (
        "Peak RSS per process: "
        + ", ".join(f"{k} {v:,} MB" for k, v in sorted(procs.items(), key=lambda kv: -kv[1]))
        + f" (together {sum(procs.values()):,} MB); memory available on the machine at the end: "
        f"{m.get('machine_available_at_end', 0):,} MB."
    )


def device_line(res: dict[str, Any]) -> str:
    """Device detail (DeviceTaintRules on DRA nodes), or "not measured" for runs before it existed."""
    d, s = res.get("device_to_rule_ms"), res.get("device_storm")
    if not d or not s:
        return "Devices (DRA): not measured in this run."
    return (
        f"Devices (DRA): fault to DeviceTaintRule p50 {d['p50']} ms, p90 {d['p90']} ms, p99 {d['p99']} ms over "
        f"{d['samples']} GPUs ({d['timeouts']} timed out); storm of {s['gpus']} GPUs: {s['rules']} rules in "
        f"{s['seconds']} s ({s['rules_per_s']} rules/s), each report write to its rule p50 "
        f"{s['report_to_rule_ms_p50']} ms; node taints on DRA nodes: {d.get('nodes_tainted', 0) + s['nodes_tainted']}."
    )


def e2e_line(res: dict[str, Any]) -> str:
    """The end-to-end detail for summaries, or "not measured" for runs before it existed."""
    e = res.get("e2e")
    if not e:
        return "End to end (real agents): not measured in this run."
    a, o, g = e["emit_to_taint_ms"], e["report_to_taint_ms"], e["emit_to_report_ms"]
    agents = f"{e['agents']} agent{'' if e['agents'] == 1 else 's'}"
    return (
        f"End to end (real agents): the fake NVML library's XID to the taint p50 {a['p50']} ms, p90 {a['p90']} ms, "
        f"p99 {a['p99']} ms, max {a['max']} ms over {e['faults']} faults on {agents} "
        f"({a['timeouts']} timed out); of it the agent (XID to report write seen) p50 {g['p50']} ms, "
        f"p99 {g['p99']} ms, and the operator (report write seen to taint) p50 {o['p50']} ms, p99 {o['p99']} ms."
        + _stuck(e)
    )


def _stuck(e: dict[str, Any]) -> str:
    """Nodes that did not come back after their release, and faults never injected because of them."""
    stuck, skipped = e.get("not_recovered") or 0, e.get("not_injected") or 0
    if not stuck:
        return ""
    return (
        f" {stuck} node{'' if stuck == 1 else 's'} did not come back within a minute of the release"
        + (f"; {skipped} faults were not injected" if skipped else "")
        + "."
    )


def drain_line(res: dict[str, Any]) -> str:
    """The drain storm's detail, or "not measured" for runs without the phase."""
    d = res.get("drain_storm")
    if not d:
        return "Drain storm: not measured in this run."
    m, p = d["mix"], d["pdb"]
    return (
        f"Drain storm: {d['nodes']} nodes x {d['pods_per_node']} pods faulted at once (maxConcurrentDrains 1000, "
        f"breaker 100%; {m['checkpoint']} pods acknowledging a checkpoint, {m['sigterm']} finishing on SIGTERM, "
        f"{m['gangs']} gangs of {m['gang_pods'] // max(1, m['gangs'])} ranks across node pairs, {m['pdb_pods']} "
        f"under a PDB): {d['evictions']} evictions, {d['evictions_per_s']}/s sustained (peak "
        f"{d['peak_evictions_in_a_second']} in one second; NVSentinel v0.4.0 published about "
        f"{NVSENTINEL_EVICTIONS_PER_S}/s), the first {d['first_eviction_s']} s and the last {d['last_eviction_s']} s "
        f"after the faults; {d['drains_completed']}/{d['nodes']} drains Completed "
        f"{'(not all)' if d['all_drains_completed_s'] is None else 'after ' + str(d['all_drains_completed_s']) + ' s'}"
        f"; {d['checkpoint_requests']} checkpoint requests, {d['checkpoint_acks']} acknowledgements (request to "
        f"acknowledgement p50 {d['request_to_ack_ms_p50']} ms); {d['double_actions']} pods evicted or asked twice; "
        f"PDB: {p['evictions']} evictions, {p['refused_429']} refused (429), fewest Ready {p['min_ready_seen']} "
        f"of {p['replicas']}."
    )


def failover_line(res: dict[str, Any]) -> str:
    """The failover detail, or "not measured" for runs without the phase."""
    f = res.get("failover")
    if not f:
        return "Failover: not measured in this run."
    samples = ", ".join("timeout" if s is None else f"{s} s" for s in f["kill_to_taint_s"])
    acting = ", ".join("n/a" if s is None else f"{s} s" for s in f.get("kill_to_acting_s") or [])
    return (
        f"Failover (two replicas, Kopf peering, keep-alive lifetime 15 s): SIGKILL of the acting replica to the "
        f"taint of a fault injected right after it, p50 {f['p50_s']} s, max {f['max_s']} s over {f['samples']} "
        f"kills ({f['timeouts']} timed out): {samples}; the standby said it acts after {acting}."
    )


def restart_line(res: dict[str, Any]) -> str:
    """The warm restart detail, or "not measured" for runs without the phase."""
    w = res.get("warm_restart")
    if not w:
        return "Warm restart: not measured in this run."
    kinds = json.dumps(w["startup_writes_by_kind"]) if w["startup_writes"] else "none"
    states = ", ".join(f"{n:,} {s}" for s, n in (w.get("evaluated_by_state") or {}).items())
    return (
        f"Warm restart: a fault published {w['fault_published_after_s']} s after a restart was tainted "
        f"{w['restart_to_first_taint_s']} s after it; a quiet restart with every node evaluated"
        f"{f' ({states})' if states else ''}: `watching` {w['startup_watching_s']} s after it, "
        f"{w['startup_writes']} operator writes in its first {w['startup_window_s']} s ({kinds})."
    )


def resilience_md(res: dict[str, Any]) -> list[str]:
    """The summary's section for the drain storm, failover and warm restart phases."""
    return [
        "## The fleet is never blind (drain storm, failover, warm restart)",
        "",
        "| figure | value | target | result |",
        "| --- | --- | --- | --- |",
        *_rows(res, resilience_targets_for(res["nodes"]), "pass", "**MISS**"),
        "",
        f"- {drain_line(res)}",
        f"- {failover_line(res)}",
        f"- {restart_line(res)}",
        "",
    ]


def summary_md(res: dict[str, Any]) -> str:
    targets = res["targets"]
    if "storm" not in res:  # a run of the issue #26 phases or the MIG fleet only (--phases without core)
        resilient = set(res["config"].get("phases") or []) & {"restart", "failover", "drain"}
        return "\n".join(
            [
                f"# gpuhealth bench: {res['nodes']} nodes{' (quick)' if res.get('quick') else ''}, "
                f"phases {', '.join(res['config'].get('phases') or [])}",
                "",
                f"Machine: {res['machine']}",
                "",
                *(resilience_md(res) if resilient else []),
                *(mig_md(res) if "mig" in res else []),
            ]
        )
    rows = [
        "| figure | value | target | result |",
        "| --- | --- | --- | --- |",
        *_rows(res, targets_for(res["nodes"]), "pass", "**MISS**"),
    ]
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
        f"{passed}/{counted} targets met{f' ({skipped} not measured)' if skipped else ''}.",
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
        *(resilience_md(res) if set(res["config"].get("phases") or ["core"]) - {"core"} else []),
    ]
    return "\n".join(lines)


def plot(path: Path, res: dict[str, Any], series: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    fig.suptitle(f"gpuhealth bench: {res['nodes']} nodes, {res.get('pods')} pods; {res['machine']}", fontsize=9)

    ax = axes[0][0]
    curves = (
        ("detect_ms", res.get("detect_to_taint_ms"), "gpuhealth: report -> taint", "tab:blue"),
        ("floor_ms", res.get("floor_ms"), "floor", "tab:gray"),
        ("device_ms", res.get("device_to_rule_ms"), "gpuhealth: GPU fault -> DeviceTaintRule", "tab:green"),
        ("e2e_ms", (res.get("e2e") or {}).get("emit_to_taint_ms"), "real agent: NVML XID -> taint", "tab:red"),
    )
    for key, stats, label, color in curves:
        if not stats:
            continue
        vals = sorted(series.get(key) or [])
        timeouts = int(stats.get("timeouts") or 0)
        if vals:
            # Faults whose taint never came within the timeout count in the denominator (the curve stops short of 1).
            ys = [(i + 1) / (len(vals) + timeouts) for i in range(len(vals))]
            extra = f", {timeouts} timed out" if timeouts else ""
            ax.step(
                vals,
                ys,
                where="post",
                label=f"{label} (p50 {stats['p50']:.0f} ms, n={len(vals)}{extra})",
                color=color,
            )
    ax.axvline(200, color="tab:green", ls="--", lw=1, label="target p50 200 ms")
    ax.axvline(1000, color="tab:red", ls="--", lw=1, label="target p99 1 s")
    ax.set_xscale("log")
    ax.set_xlabel("fault to taint (Node watch) or DeviceTaintRule (rule watch) (ms, log)")
    ax.set_ylabel("fraction of faults")
    ax.set_title("Latency CDF: one fault at a time")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)

    ax = axes[0][1]
    storm = series.get("storm") or []
    if storm:
        ax.step([t for t, _ in storm], [c for _, c in storm], where="post", color="tab:blue", label="quarantined")
    dstorm = series.get("device_storm") or []
    if dstorm:
        ax.step(
            [t for t, _ in dstorm],
            [c for _, c in dstorm],
            where="post",
            color="tab:green",
            label="device storm: GPUs with a rule",
        )
    pub = series.get("storm_published") or []
    if pub:
        ax.step(pub, [i + 1 for i in range(len(pub))], where="post", color="tab:gray", ls=":", label="reports written")
        ax.legend(fontsize=8, loc="lower right")
    s = res["storm"]
    ax.set_title(f"Storm, breaker 100%: {s['nodes']} nodes at once -> {s['nodes_per_s']} nodes/s")
    ax.set_xlabel("seconds since the reports were published")
    ax.set_ylabel("nodes quarantined (taint seen) / GPUs with a rule")
    ax.grid(alpha=0.3)

    ax = axes[1][0]
    br = series.get("breaker") or []
    if br:
        ax.plot([t for t, _ in br], [c for _, c in br], color="tab:orange", label="quarantined (50 ms samples)")
    b = res["breaker"]
    ax.axhline(b["limit"], color="tab:red", ls="--", lw=1, label=f"limit {b['limit']} ({b.get('max_unhealthy', '5%')})")
    ax.set_ylim(0, max(b["limit"], b["max_quarantined_seen"], b.get("faulted") or 0) * 1.15 + 1)
    ax.set_title(
        f"Breaker {b.get('max_unhealthy', '5%')}: {b.get('faulted')} nodes fault at once; "
        f"max seen {b['max_quarantined_seen']}"
    )
    ax.set_xlabel("seconds since the faults")
    ax.set_ylabel("nodes carrying the gpuhealth taint")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)

    ax = axes[1][1]
    rss = series.get("operator_rss") or []
    if rss:
        ax.plot([t for t, _ in rss], [r for _, r in rss], color="tab:purple", label="operator RSS")
    ax.axhline(250, color="tab:red", ls="--", lw=1, label="target 250 MB")
    o = res["operator"]
    t_op = next((p[1] for p in res.get("phases", []) if p[0] == "operator start-up"), 0.0)
    for name, t, *_ in res.get("phases", []):
        if t >= t_op:
            ax.axvline(t - t_op, color="gray", lw=0.5)
            ax.text(
                t - t_op, 5, name.split(":")[0].split(" (")[0][:24], rotation=90, fontsize=6, va="bottom", color="gray"
            )
    ax.set_ylim(0, max(260, max((r for _, r in rss), default=0) * 1.1))
    ax.set_title(f"Operator RSS (peak {o['peak_rss_mb']} MB), idle writes {o['idle_writes_per_min']}/min")
    ax.set_xlabel("seconds since the operator started")
    ax.set_ylabel("MB")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)

    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(out: Path, res: dict[str, Any], series: dict[str, Any]) -> None:
    res["targets"] = evaluate(res)
    res["all_targets_met"] = all(e["pass"] for e in res["targets"].values() if measured(e))
    (out / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / "series.json").write_text(json.dumps(series) + "\n")
    (out / "summary.md").write_text(summary_md(res))
    if "storm" in res:  # the plots are the core phases'
        plot(out / "report.png", res, series)
    print((out / "summary.md").read_text())
