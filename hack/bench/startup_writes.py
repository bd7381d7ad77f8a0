"""What the operator's start-up waits on (issue #38: every node evaluated within 60 s of a start).

An operator started on a fleet it has never evaluated writes each node's first verdict once: the
report's status, then the Node's ``GPUHealthy`` condition with its state label in the same patch
(``controller/act/node_reconciler.py``; before f030c0c the label was a Node write of its own), each a
round trip, one node per worker at a time. At 10,000 nodes that is 20,000 writes (30,000 before),
and whether the minutes they take are the operator's or the API server's is read here from two
witnesses nobody in the operator wrote:

- the API server's audit log, which stamps each request when it was received and when its answer
  was complete: the requests per second, the server's time per request, and how many of the
  operator's requests were inside the server at once (swept over the window, time-weighted). By
  Little's law that mean equals rate x mean server time; held against the operator's worker count it
  says what share of the workers' time was spent waiting on the server, and what share was the
  operator's own (its CPU, its queue, the network and TLS between the two);
- the processes' CPU over the same window (``ProcSampler``), in percent of one core.

Pure over its inputs, so ``tests/unit/bench/test_startup_writes.py`` checks the sweep on hand-made
timelines; ``python -m hack.bench.startup_writes`` computes the same figures from a kept audit log,
for a run whose result file predates them.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from devkit.audit import AuditEntry, read_audit
from hack.bench.context import OPERATOR_USER, OPERATOR_WORKERS
from hack.bench.support import describe, percentile, sample_rate

# Requests that are not a worker's round trip: the watches and the first lists (the operator's intake),
# and Events (posted from their own thread pool, controller/act/events.py).
_NOT_PASS_VERBS = frozenset({"watch", "list"})
_NOT_PASS_RESOURCES = frozenset({"events"})


def pass_requests(entries: Iterable[AuditEntry], start: float, end: float) -> list[AuditEntry]:
    """The workers' requests received in [start, end): reads and writes of the per-node passes."""
    return [
        e
        for e in entries
        if start <= e.at < end and e.verb not in _NOT_PASS_VERBS and e.resource not in _NOT_PASS_RESOURCES
    ]


def in_flight(entries: Sequence[AuditEntry], start: float, end: float) -> dict[int, float]:
    """Seconds of [start, end) during which exactly k of ``entries`` were inside the API server, by k.

    A request is inside from ``at`` (received) to ``done`` (answer complete); one without ``done`` is
    counted as instantaneous. The seconds sum to the window's length."""
    edges: list[tuple[float, int]] = []
    for e in entries:
        a, b = max(e.at, start), min(e.completed, end)
        if b > a:
            edges += [(a, 1), (b, -1)]
    edges.sort()
    out: dict[int, float] = {}
    level, t = 0, start
    for when, step in edges:
        if when > t:
            out[level] = out.get(level, 0.0) + (when - t)
            t = when
        level += step
    if end > t:
        out[level] = out.get(level, 0.0) + (end - t)
    return out


def startup_profile(
    entries: Iterable[AuditEntry],
    start: float,
    end: float,
    workers: int,
    cpu: Mapping[str, Sequence[tuple[float, float]]] | None = None,
) -> dict[str, Any]:
    """The figures of the window [start, end) (epoch seconds: from the operator's first write after its
    start to every node evaluated), for ``res["operator"]["startup_profile"]``.

    ``entries``: the operator's audit entries; ``workers``: its concurrent passes (``--workers``);
    ``cpu``: (time, CPU seconds) samples by process name."""
    span = end - start
    entries = list(entries)
    reqs = pass_requests(entries, start, end)
    writes = [e for e in reqs if e.write]
    server_ms = [(e.completed - e.at) * 1000 for e in reqs]
    # Inside the server during the window, wherever received (the sweep clips each to the window).
    levels = in_flight(pass_requests(entries, float("-inf"), end), start, end)
    mean_in_flight = sum(k * s for k, s in levels.items()) / span if span > 0 else 0.0
    at_workers = sum(s for k, s in levels.items() if k >= workers)
    out: dict[str, Any] = {
        "window_s": round(span, 1),
        "workers": workers,
        "requests": len(reqs),
        "writes": len(writes),
        "nodes_written": len({e.name for e in writes if e.resource == "nodes"}),
        "writes_by_kind": describe(writes),
        "requests_per_s": round(len(reqs) / span, 1) if span > 0 else None,
        "writes_per_s": round(len(writes) / span, 1) if span > 0 else None,
        "server_ms": {
            "p50": round(percentile(server_ms, 50), 1),
            "p90": round(percentile(server_ms, 90), 1),
            "p99": round(percentile(server_ms, 99), 1),
            "mean": round(sum(server_ms) / len(server_ms), 1) if server_ms else None,
        },
        # Little's law: the mean number of the workers' requests inside the API server; over the worker
        # count, the share of the workers' time spent waiting on it.
        "in_flight_mean": round(mean_in_flight, 2),
        "in_flight_max": max((k for k, s in levels.items() if s > 0), default=0),
        "waiting_on_server_share": round(mean_in_flight / workers, 3) if workers else None,
        "all_workers_in_server_share": round(at_workers / span, 3) if span > 0 else None,
        "none_in_server_share": round(levels.get(0, 0.0) / span, 3) if span > 0 else None,
    }
    if cpu:
        out["cpu_percent"] = {
            name: pct for name, samples in cpu.items() if (pct := cpu_percent(samples, start, end)) is not None
        }
    return out


def cpu_percent(samples: Sequence[tuple[float, float]], start: float, end: float) -> float | None:
    """Percent of one core a process used between two instants, from its samples nearest inside them."""
    rate = sample_rate(samples, start, end)
    return round(rate * 100, 1) if rate is not None else None


def list_profile(entries: Iterable[AuditEntry], start: float, end: float) -> dict[str, dict[str, float]]:
    """The operator's paged lists received in [start, end), by resource: how many lists and pages, the
    seconds the API server spent on them, and the span of the longest list (its first page received
    to its last answered; a page with a continue token belongs to the list before it). The span less
    the server's seconds is the operator's own time between pages (reading and slimming each one); a
    restarted operator decides nothing before its Nodes, reports, policies and Leases are all in
    (docs/architecture.md, "Restart safety"), so the slowest of these lists is how long it is blind.

    A streamed list (the pods: a watch that begins with the state) is not here: the operator watches
    on from the same stream, so the audit log has the watch's end, not the list's (its bookmark); the
    operator's ``listed N pods in`` line times it, and the pods are listed after the fleet anyway."""
    lists: dict[str, list[list[AuditEntry]]] = {}
    listed = (e for e in entries if e.verb == "list" and start <= e.at < end)
    for e in sorted(listed, key=lambda e: e.at):
        of = lists.setdefault(e.resource, [])
        if e.continued and of:
            of[-1].append(e)
        else:
            of.append([e])
    out: dict[str, dict[str, float]] = {}
    for resource, each in sorted(lists.items()):
        pages = [e for one in each for e in one]
        out[resource] = {
            "lists": len(each),
            "pages": len(pages),
            "server_s": round(sum(e.completed - e.at for e in pages), 1),
            "span_s": round(max(max(e.completed for e in one) - one[0].at for one in each), 1),
        }
    return out


def first_pass_write(entries: Iterable[AuditEntry], after: float) -> float | None:
    """When the operator's first write after ``after`` was received (the window's start): a policy's
    status or a node's first verdict, whichever its passes and sweeps wrote first."""
    return min((e.at for e in pass_requests(entries, after, float("inf")) if e.write), default=None)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m hack.bench.startup_writes", description=__doc__.split("\n\n")[0])
    ap.add_argument("audit", type=Path, help="the run's audit.log (its rotated parts beside it are read too)")
    ap.add_argument("--user", default=OPERATOR_USER)
    ap.add_argument("--after", type=float, required=True, help="the operator's start (epoch seconds)")
    ap.add_argument("--until", type=float, required=True, help="every node evaluated (epoch seconds)")
    ap.add_argument("--workers", type=int, default=OPERATOR_WORKERS)
    args = ap.parse_args(argv)
    entries = list(read_audit(args.audit, args.user))
    start = first_pass_write(entries, args.after)
    if start is None:
        raise SystemExit(f"no pass write by {args.user} after {args.after}")
    print(json.dumps(startup_profile(entries, start, args.until, args.workers), indent=2))


if __name__ == "__main__":
    main()
