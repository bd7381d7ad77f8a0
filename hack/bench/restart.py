"""The warm restart phase of `make bench` (``--phases restart``, issue #26): how long a restarted
operator leaves the fleet blind, and what it writes while starting against a fleet already evaluated
(target: nothing, since nothing changed while it was down).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from devkit.audit import read_audit
from devkit.k8s import OperatorProcess
from hack.bench.resilience import EVALUATED, PODS_LISTED, WATCHING, ResilienceContext, wait_ready
from hack.bench.startup_writes import list_profile
from hack.bench.support import TAINT, describe, find_log_line, log

# The operator's line per watch list (controller/intake/objectwatch.py).
_WATCH_LIST = re.compile(r"(\w+)-watch: listed (\d+) in ([\d.]+)s, (streamed|paged)")


def watch_lists(text: str) -> dict[str, dict[str, Any]]:
    """Each watch's first list from an operator's log: how many objects, how long it took, and whether
    the server streamed it. A streamed list's end is not in the audit log (the stream goes on as the
    watch), so these lines are what times the lists a restarted operator waits for."""
    out: dict[str, dict[str, Any]] = {}
    for m in _WATCH_LIST.finditer(text):
        out.setdefault(m.group(1), {"objects": int(m.group(2)), "s": float(m.group(3)), "how": m.group(4)})
    return out


def measure_restart(
    ctx: ResilienceContext, operator: OperatorProcess, governed: Sequence[str], first_startup_s: float = 0.0
) -> tuple[dict[str, Any], OperatorProcess]:
    """Warm restart: two restarts of an operator whose fleet is evaluated; returns the figures and the
    operator left running.

    The first has a fault injected the moment the process starts: the restart to that fault's taint
    is the time the fleet was blind. The second is quiet, with that node quarantined beside the
    evaluated rest: its writes from process start until three sweeps after its pods are listed
    ("listed N pods", after "watching": the Nodes, reports, policies and Leases) are the
    start-up's (target 0: nothing changed while it was down), and the operator's line saying every
    node was passed with its pods (``controller/process/firstpass.py``) ends its start-up (target
    <= 60 s: such a start-up writes nothing, so only the operator sees its end); the window is at least as long as the
    run's first start-up took to evaluate every node (``first_startup_s``), so a fleet-sized start-up
    is counted whole.
    """
    ctx.phase("warm restart: the operator restarts with every node evaluated")
    operator.stop()
    (node,) = ctx.take(1)
    op, path, t0 = ctx.start_operator("restart-1")
    ctx.sims[node].fault()
    published = time.time()
    tainted = ctx.node_watch.wait_taint(node, TAINT, timeout=600)
    found1 = find_log_line(path, WATCHING, timeout=60)
    pods1 = find_log_line(path, PODS_LISTED, timeout=600)
    blind: dict[str, Any] = {
        "first_startup_watching_s": round(found1[0] - t0, 2) if found1 else None,
        "first_startup_pods_listed_s": round(pods1[0] - t0, 2) if pods1 else None,
        "fault_published_after_s": round(published - t0, 2),
        "restart_to_first_taint_s": round(tainted - t0, 2) if tainted else None,
        "fault_to_taint_s": round(tainted - published, 2) if tainted else None,
    }
    log(f"  restart 1: a fault published at start was tainted {blind['restart_to_first_taint_s']}s after the restart")
    time.sleep(1.0)  # the audit log is written as each request completes
    # What the blind time was spent on: the lists a restarted operator waits for before deciding.
    blind["lists"] = list_profile(read_audit(ctx.cluster.audit_log, ctx.operator_user), t0, tainted or time.time())
    blind["watch_lists"] = watch_lists(Path(path).read_text(errors="replace"))
    wait_ready(op, path)
    ctx.report_watch.wait_states([node], "Quarantined", timeout=60)
    time.sleep(3 * ctx.tick)  # its Events and the policy's counts are written before the quiet restart

    states = ("Healthy", "Quarantined", "Draining", "AwaitingRepair", "Degraded")
    evaluated = {s: ctx.report_watch.count(governed, s) for s in states}
    op.stop()
    op, path, t0 = ctx.start_operator("restart-2")
    found = find_log_line(path, WATCHING, timeout=600)
    watching_s = round(found[0] - t0, 2) if found else None
    pods = find_log_line(path, PODS_LISTED, timeout=600)  # then every node is passed again, with its pods
    done = find_log_line(path, EVALUATED, timeout=600)  # the last of those passes: the start-up is over
    time.sleep(max(3 * ctx.tick, first_startup_s - (time.time() - t0)))
    t1 = time.time()
    time.sleep(1.0)  # the audit log is written as each request completes
    asked = ctx.requests_between(t0, t1)
    writes = [e for e in asked if e.write]
    evaluated_s = round(done[0] - t0, 2) if done else None
    log(
        f"  restart 2: watching after {watching_s}s, every node evaluated after {evaluated_s}s; "
        f"{len(writes)} writes in the {t1 - t0:.0f}s after start"
    )
    res = {
        "evaluated_nodes": sum(evaluated.values()),
        "evaluated_by_state": {s: n for s, n in evaluated.items() if n},
        "startup_watching_s": watching_s,
        # The floor's clock starts at its first list; the operator's at its process start. The gap is the
        # interpreter, its imports and Kopf's start-up, before it asks the API server anything.
        "startup_first_request_s": round(min(e.at for e in asked) - t0, 2) if asked else None,
        # The pods are listed after "watching" (the fleet is acted on meanwhile): drains wait for them.
        "startup_pods_listed_s": round(pods[0] - t0, 2) if pods else None,
        # The operator's own line: nothing outside sees the passes of a start-up that writes nothing.
        "startup_evaluated_s": evaluated_s,
        "startup_window_s": round(t1 - t0, 1),
        "startup_writes": len(writes),
        "startup_writes_by_kind": describe(writes),
        **blind,
    }
    return res, op
