"""The detail sentences of a bench run, one per figure block: what the summary's "Details" list and the
docs blocks say beside the target tables (hack/bench/report.py, hack/bench/docs.py).

Pure; each reads one block of results.json and says "not measured" for runs filed before the block
existed, so an old filed run renders as it always did.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from hack.bench.targets import NVSENTINEL_EVICTIONS_PER_S, _num


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
    if f.get("timeouts") == f["samples"]:
        # Every floor sample timed out: the API server and the bench's own watches were the limit, and
        # there is no ratio to give.
        return f", the no-logic floor under the same traffic timed out too ({f['samples']} of {f['samples']})"
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
        + node_writers(s)
        + floor_storm(res, "device_storm")
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
        f"of {p['replicas']}." + storm_cpu(d) + storm_elsewhere(d)
    )


def storm_elsewhere(d: dict[str, Any]) -> str:
    """The rest of the fleet during the storm (runs that measured it, ``drain_fleet.py``): the operator's
    writes to nodes not drained, and each verdict's count at the faults and at its peak."""
    w, v = d.get("elsewhere"), d.get("verdicts")
    if not w or not v:
        return ""
    by = ", ".join(f"{k} {n:,}" for k, n in sorted(w["by"].items(), key=lambda kv: -kv[1]))
    states = ", ".join(
        f"{s} {v['at_start'].get(s, 0):,} -> peak {n:,} at {max(0.0, v['peak_at_s'][s])} s"
        for s, n in sorted(v["peak"].items())
        if n != v["low"][s]
    )
    return (
        f" Elsewhere in the fleet meanwhile: {w['writes']:,} operator writes on {w['nodes']:,} nodes not drained"
        f"{' (' + by + ')' if by else ''}; verdicts that moved ({v['samples']} samples): {states or 'none'}."
    )


def node_writers(d: dict[str, Any], whose: str = "the storm") -> str:
    """Which processes changed the Nodes over a storm (runs that recorded it: the bench's node watch,
    each change by the manager of its newest managedFields entry). Every Node change is work for each
    Node watcher, kwok among them, on the cores the storm shares."""
    w = d.get("node_writes")
    if w is None:
        return ""
    if not w:
        return f" Node changes heard over {whose}: none."
    by = ", ".join(f"{n} {c:,}" for n, c in sorted(w.items(), key=lambda kv: -kv[1]))
    return f" Node changes heard over {whose}, by their last writer: {by}."


def cpu_used(c: dict[str, Any], whose: str) -> str:
    """CPU seconds per process over a window (hack/bench/cpu.py), busiest first, with the machine's busy share."""
    # Busiest first (a filed result file's keys come back sorted by name).
    procs = ", ".join(f"{n} {s} s" for n, s in sorted(c["cpu_s"].items(), key=lambda kv: -kv[1])[:6])
    busy = "" if c.get("machine_busy") is None else f", the machine {round(100 * c['machine_busy'])}% busy"
    return f" CPU over {whose} {c['wall_s']} s on {c['cores']} cores: {procs}{busy}."


def floor_storm(res: dict[str, Any], key: str) -> str:
    """Where the storm floor's time went, beside gpuhealth's (runs that recorded it): so a process busy
    over one storm and not the other shows as such, not as gpuhealth's share."""
    f = (res.get("floors") or {}).get(key) or {}
    c = f.get("cpu")
    return (cpu_used(c, "its floor's storm's") if c else "") + node_writers(f, "the floor's storm")


def storm_cpu(d: dict[str, Any]) -> str:
    """Where the storm's time went (runs that measured it): CPU seconds per process over the storm,
    the machine's busy share, who changed the Nodes meanwhile, and with a stack profile the acting
    operator's busy threads."""
    c = d.get("cpu")
    if not c:
        return node_writers(d)
    text = cpu_used(c, "the storm's") + node_writers(d)
    stacks = d.get("operator_stacks") or {}
    if stacks:
        name, s = max(stacks.items(), key=lambda kv: kv[1]["busy_threads"].get("event-loop", 0.0))
        threads = ", ".join(f"{g} {b}" for g, b in s["busy_threads"].items())
        top = ", ".join(f"`{f}` {n}" for f, n in s["gpuhealth"][:4])
        text += (
            f" The acting operator's stack profile ({name}, {s['samples']} samples): busy threads per sample "
            f"{threads}; under gpuhealth's {top}."
        )
    return text


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


def startup_line(res: dict[str, Any]) -> str:
    """What the operator's first start-up waited on (``hack/bench/startup_writes.py``), or "not measured"
    for runs filed before the audit log's two timestamps were read."""
    o = res.get("operator") or {}
    p = o.get("startup_profile")
    if not p:
        return "Start-up writes: not measured in this run."
    kinds = ", ".join(f"{k} {v:,}" for k, v in p["writes_by_kind"].items())
    cpu = p.get("cpu_percent") or {}
    busy = ", ".join(f"{n} {v}%" for n, v in sorted(cpu.items(), key=lambda kv: -kv[1]) if v >= 1)
    return (
        f"Start-up writes (the audit log, from the operator's first write to every node evaluated, "
        f"{p['window_s']} s): {p['writes']:,} writes on {p['nodes_written']:,} Nodes ({kinds}), "
        f"{p['writes_per_s']} writes/s; the API server's time per request p50 {p['server_ms']['p50']} ms, "
        f"p99 {p['server_ms']['p99']} ms; {p['in_flight_mean']} of the operator's {p['workers']} workers' "
        f"requests inside the API server on average ({p['waiting_on_server_share']:.0%} of their time; all "
        f"{p['workers']} at once {p['all_workers_in_server_share']:.0%} of the window, none "
        f"{p['none_in_server_share']:.0%})"
        + (f"; CPU in percent of one core: {busy}" if busy else "")
        + _passes(p)
        + "."
    )


def _passes(p: dict[str, Any]) -> str:
    n = p.get("passes") or {}
    if n.get("total") is None:
        return ""
    return f"; {n['total']:,.0f} node passes by then ({n.get('lease_requeues') or 0:,.0f} queued by Lease renewals)"


def restart_line(res: dict[str, Any]) -> str:
    """The warm restart detail, or "not measured" for runs without the phase."""
    w = res.get("warm_restart")
    if not w:
        return "Warm restart: not measured in this run."
    kinds = json.dumps(w["startup_writes_by_kind"]) if w["startup_writes"] else "none"
    states = ", ".join(f"{n:,} {s}" for s, n in (w.get("evaluated_by_state") or {}).items())
    # Runs before the pods were listed after "watching" have no such figure.
    listed = w.get("startup_pods_listed_s")
    pods = f" (its pods listed {listed} s after it)" if listed is not None else ""
    # Runs before the operator said when its start-up was over have no such figure.
    done = w.get("startup_evaluated_s", "")
    evaluated = f", every node evaluated {done} s after it (its own line)" if done != "" else ""
    # Runs before the audit's first request was read have no such figure.
    asked = w.get("startup_first_request_s")
    first = f"its first request to the API server {asked} s after it, " if asked is not None else ""
    lists = "; ".join(
        f"{r} {p['pages']} pages, {p['server_s']} s in the API server over {p['span_s']} s"
        for r, p in sorted((w.get("lists") or {}).items(), key=lambda kv: -kv[1]["span_s"])
        if p["span_s"] >= 1
    )
    # Runs before each watch logged its list have none; a streamed list is not in the audit's lists.
    watched = "; ".join(
        f"{kind} {v['objects']:,} {v['how']} in {v['s']} s"
        for kind, v in sorted((w.get("watch_lists") or {}).items(), key=lambda kv: -kv[1]["s"])
    )
    return (
        f"Warm restart: a fault published {w['fault_published_after_s']} s after a restart was tainted "
        f"{w['restart_to_first_taint_s']} s after it"
        + (f" (its lists until then, slowest first: {lists})" if lists else "")
        + (f" (the watches' lists, from its log, slowest first: {watched})" if watched else "")
        + "; a quiet restart with every node evaluated"
        f"{f' ({states})' if states else ''}: {first}`watching` {w['startup_watching_s']} s after it{pods}{evaluated}, "
        f"{w['startup_writes']} operator writes in its first {w['startup_window_s']} s ({kinds})."
    )


def floor_line_part(name: str, f: Mapping[str, Any]) -> str:
    """One floor in the run's detail sentence."""
    if f.get("timed_out"):
        return f"{name} timed out ({f.get('seen', '?')} of {f.get('items', '?')} seen)"
    if "p50" in f:
        late = f", {f['timeouts']} timed out" if f.get("timeouts") else ""
        return f"{name} p50 {f['p50']} ms, p99 {f['p99']} ms over {f['samples']} samples{late}"
    if "evictions_per_s" in f:
        return (
            f"{name} {f['evictions']} evictions of {f['pods']} pods in {f['seconds']} s ({f['evictions_per_s']}/s "
            f"first to last, {f['refused_429']} refused by the PDB, {f['concurrency']} at a time)"
        )
    if "per_s" in f and f.get("per_s") is not None:
        return f"{name} {f['items']} in {f['seconds']} s ({f['per_s']}/s, {f['concurrency']} at a time)"
    return f"{name} {f.get('seconds')} s"


FLOOR_NAMES = {
    "storm": "node storm",
    "device": "device path",
    "device_storm": "device storm",
    "domain": "domain storm",
    "mig": "MIG path (a GPU's seven rules)",
    "mig_storm": "MIG storm (GPUs)",
    "startup": "first start-up",
    "restart": "warm restart",
    "drain": "drain storm",
}


def floors_line(res: dict[str, Any]) -> str:
    """The no-logic floors the run measured besides detection's (hack/bench/floors.py), or "no floor
    measured" for runs filed before them."""
    floors = res.get("floors")
    if not floors:
        return "No-logic floors of the other paths: no floor measured in this run."
    parts = [floor_line_part(FLOOR_NAMES.get(k, k), f) for k, f in floors.items() if isinstance(f, dict)]
    return (
        "No-logic floors, same run and API server (the writes or lists gpuhealth must do for each path, "
        "at the operator's concurrency): " + "; ".join(parts) + "."
    )
