"""The operator's and the agents' footprint in `make bench`: an idle window with nothing changing (the
operator's requests, writes and CPU while the sweep re-evaluates every node), then what the whole run
cost: peak RSS and CPU, every write by kind, the footprint agent's RSS, CPU and writes per hour, the
heartbeats achieved, each process's memory and the API traffic gpuhealth adds.

Runs last of the core phases, so the totals cover every phase before it.
"""

from __future__ import annotations

import time
from typing import Any

import psutil

from devkit.audit import AuditEntry, read_audit
from hack.bench.cluster import agent_silence
from hack.bench.context import AGENT_USER, OPERATOR_USER, Bench
from hack.bench.support import (
    ProcSampler,
    api_rates,
    describe,
    log,
    rate,
    steady_writes_per_hour,
)


def measure_idle(b: Bench) -> None:
    """The idle window and the run's footprint: ``operator`` (completed), ``agent``, ``heartbeats``,
    ``memory_mb`` and ``api``."""
    args, res, series, cluster = b.args, b.res, b.series, b.cluster
    op_sampler, op_t0, agent_sampler, agent = b.op_sampler, b.op_t0, b.agent_sampler, b.agent
    hb_stats, hb_from, sims, mem_samplers = b.hb_stats, b.hb_from, b.sims, b.mem_samplers

    b.phase(f"idle: {args.idle:.0f}s with nothing changing")
    time.sleep(max(2 * args.tick, 5.0))
    idle_from, idle_cpu_from = time.time(), op_sampler.cpu_s()
    time.sleep(args.idle)
    idle_to, idle_cpu_to = time.time(), op_sampler.cpu_s()
    time.sleep(1.0)  # the audit log is written when each request completes

    ops = list(read_audit(cluster.audit_log, OPERATOR_USER))
    idle = [e for e in ops if idle_from <= e.at < idle_to]
    minutes = (idle_to - idle_from) / 60
    res["operator"].update(
        {
            "peak_rss_mb": round(op_sampler.peak_rss / 2**20, 1),
            "cpu_s": round(op_sampler.cpu_s(), 1),
            "idle_requests_per_min": round(len(idle) / minutes, 1),
            "idle_writes_per_min": round(sum(e.write for e in idle) / minutes, 1),
            "idle_requests": describe(idle),
            # The sweep every --tick re-evaluates every node: what that costs while nothing changes.
            "idle_cpu_percent": round((idle_cpu_to - idle_cpu_from) / (idle_to - idle_from) * 100, 1),
            "requests_total": len(ops),
            "writes_total": sum(e.write for e in ops),
            "writes_by_kind": describe(e for e in ops if e.write),
            "wall_s": round(time.time() - op_t0, 1),
        }
    )
    series["operator_rss"] = [(t - op_t0, r / 2**20) for t, r in op_sampler.samples]

    agent_writes = sorted(e.at for e in read_audit(cluster.audit_log, AGENT_USER) if e.write)
    now = time.time()
    a_samples = [(t, r) for t, r in agent_sampler.samples if agent_writes and t >= agent_writes[0]]
    res["agent"] = {
        "rss_mb": round(max((r for _, r in a_samples), default=0) / 2**20, 1),
        "cpu_percent": None,
        "writes_per_hour": None,
        "writes": len(agent_writes),
        "window_s": round(now - agent_writes[0], 1) if agent_writes else 0.0,
    }
    if agent_writes and agent.alive():
        cpu_total = agent_sampler.cpu_s()
        # CPU from its first write on: what it uses running, not its start-up imports.
        cpu_first = agent_cpu_at_first_write(agent_sampler, agent_writes[0])
        res["agent"]["cpu_percent"] = round((cpu_total - cpu_first) / (now - agent_writes[0]) * 100, 2)
        per_hour, res["agent"]["startup_writes"] = steady_writes_per_hour(agent_writes)
        res["agent"]["writes_per_hour"] = round(per_hour, 1) if per_hour is not None else None
    hb_to = hb_stats.mark()
    achieved = rate(hb_from, hb_to)
    res["heartbeats"] = {
        "interval_s": args.heartbeat,
        "agents": len(sims),
        "asked_per_s": round(len(sims) / args.heartbeat, 2),
        "achieved_per_s": round(achieved, 2) if achieved is not None else None,
        "renewals": hb_to[1] - hb_from[1],
        "window_s": round(hb_to[0] - hb_from[0], 1),
        "failures": hb_stats.failures,
        "max_gap_s": round(hb_stats.max_gap_s, 1),
        "agent_silence": agent_silence(args.heartbeat),
    }
    res["memory_mb"] = {
        **{n: round(m.peak_rss / 2**20) for n, m in mem_samplers.items()},
        "operator": round(op_sampler.peak_rss / 2**20),
        "machine_available_at_end": round(psutil.virtual_memory().available / 2**20),
    }
    res["api"] = api_footprint(res, ops, list(read_audit(cluster.audit_log, AGENT_USER)), op_sampler, agent_sampler)
    log(f"  heartbeats: {res['heartbeats']}")
    log(f"  operator: {res['operator']}")
    log(f"  agent: {res['agent']}")
    log(f"  API traffic gpuhealth adds: {res['api']}")


def api_footprint(
    res: dict[str, Any],
    op_entries: list[AuditEntry],
    agent_entries: list[AuditEntry],
    op_sampler: ProcSampler,
    agent_sampler: ProcSampler,
) -> dict[str, Any]:
    """The API traffic gpuhealth adds, operator and agents apart.

    Requests per second from the audit log (the operator over the measured run, from every node evaluated to
    the end, and over the idle window; the footprint agent from its first request on, and that times the
    fleet's agents, one per node, since the simulated agents' identity is not audited). Bytes per second are
    what each process read and wrote through system calls over the same windows (/proc/PID/io: its API
    traffic, TLS included, plus its log writes); the audit log records no sizes.
    """
    now = time.time()
    op_from = op_sampler.samples[0][0] + float(res["operator"].get("startup_s") or 0.0)
    first = min((e.at for e in agent_entries), default=now)
    agent = {**api_rates(agent_entries, first, now), "bytes_per_s": _round(agent_sampler.io_rate(first, now))}
    fleet = res["nodes"]
    return {
        "operator": {
            **api_rates(op_entries, op_from, now),
            "bytes_per_s": _round(op_sampler.io_rate(op_from, now)),
            "idle_requests_per_s": round(res["operator"]["idle_requests_per_min"] / 60, 3),
        },
        "agent": agent,
        "fleet_agents": fleet,
        "agents_requests_per_s": _round(None if agent["requests_per_s"] is None else agent["requests_per_s"] * fleet),
        "agents_bytes_per_s": _round(None if agent["bytes_per_s"] is None else agent["bytes_per_s"] * fleet),
    }


def _round(v: float | None, digits: int = 1) -> float | None:
    return None if v is None else round(v, digits)


def agent_cpu_at_first_write(sampler: ProcSampler, first_write: float) -> float:
    """The agent's CPU seconds at its first write, from the sampler's record (closest sample after it)."""
    for t, cpu in sampler.cpu_samples:
        if t >= first_write:
            return cpu
    return sampler.cpu_s()
