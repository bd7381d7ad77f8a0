"""The many-node core phases of `make bench`: a storm of simultaneous faults with the breaker at 100%
(nodes per second), the recovery of every node faulted so far, and the breaker at 5% (or half the
storm, where 5% is not below it): the most nodes quarantined at any 50 ms sample against its limit.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence

from devkit.k8s import wait_for
from hack.bench.cluster import breaker_setting
from hack.bench.context import POLICY, Bench
from hack.bench.fleet import SimNode
from hack.bench.support import GROUP, TAINT, VERSION, log, percentile, publish_all


def measure_storm(b: Bench, storm_nodes: Sequence[str]) -> None:
    """``--storm`` nodes faulted at once: the ``storm`` result (and the operator's share of it)."""
    args, res, series, sims, node_watch = b.args, b.res, b.series, b.sims, b.node_watch
    b.phase(f"storm: {args.storm} nodes fault at once, breaker at 100%")
    published_at: dict[str, float] = {}

    def storm_fault(sim: SimNode) -> None:
        sim.fault()
        published_at[sim.name] = time.time()

    t0 = time.time()
    failed = publish_all(b.pool, storm_fault, [sims[n] for n in storm_nodes])
    published = time.time() - t0
    done = node_watch.wait_all(storm_nodes, TAINT, timeout=180)
    taint_at = {n: node_watch.seen_at[(n, TAINT)] for n in storm_nodes if (n, TAINT) in node_watch.seen_at}
    seen = sorted(t - t0 for t in taint_at.values())
    storm_s = seen[-1] if seen and done else None
    # The operator's share: from each node's report write (done) to its taint, and its own throughput.
    per_node = [(taint_at[n] - published_at[n]) * 1000 for n in taint_at if n in published_at]
    op_span = max(taint_at.values(), default=0.0) - min(published_at.values(), default=0.0)
    res["storm"] = {
        "nodes": args.storm,
        "quarantined": len(seen),
        "seconds": round(storm_s, 2) if storm_s else None,
        "nodes_per_s": round(args.storm / storm_s, 1) if storm_s else None,
        "publish_s": round(published, 2),
        "first_taint_s": round(seen[0], 3) if seen else None,
        "publish_failures": failed,
        "report_to_taint_ms_p50": round(percentile(per_node, 50), 1),
        "report_to_taint_ms_max": round(max(per_node, default=float("nan")), 1),
        "operator_nodes_per_s": round(len(taint_at) / op_span, 1) if op_span > 0 else None,
    }
    series["storm"] = [(0.0, 0), *[(s, i + 1) for i, s in enumerate(seen)]]
    series["storm_published"] = sorted(t - t0 for t in published_at.values())
    log(f"  {len(seen)}/{args.storm} quarantined in {storm_s}s (reports published in {published:.2f}s)")


def measure_recovery(b: Bench, faulted: Sequence[str]) -> None:
    """Every faulted node rebooted clean: the seconds to every governed node Healthy (``recovery``)."""
    b.phase("recovery: every fault cleared (clean reports after a reboot), probation 2s")
    t0 = time.time()
    publish_all(b.pool, SimNode.reboot, [b.sims[n] for n in faulted])
    back = b.report_watch.wait_states(b.governed, "Healthy", timeout=300)
    untainted = b.node_watch.wait_all(b.governed, TAINT, timeout=60, present=False)
    b.res["recovery"] = {
        "nodes": len(faulted),
        "seconds_to_all_healthy": round(back - t0, 1) if back else None,
        "untainted": untainted,
    }
    log(f"  {len(faulted)} nodes back to Healthy in {b.res['recovery']['seconds_to_all_healthy']}s")


def measure_breaker(b: Bench, breaker_nodes: Sequence[str]) -> None:
    """The breaker at its limit: ``--storm`` nodes fault at once and the Node watch's taint count is
    sampled every 50 ms for ``--breaker-window`` seconds (``breaker``)."""
    args, res, custom, node_watch = b.args, b.res, b.custom, b.node_watch
    max_unhealthy, limit = breaker_setting(args.nodes, args.storm)
    b.phase(f"breaker at maxUnhealthy {max_unhealthy} (limit {limit}): {args.storm} nodes fault at once")
    custom.patch_cluster_custom_object(
        GROUP, VERSION, "gpuhealthpolicies", POLICY, {"spec": {"safety": {"maxUnhealthy": max_unhealthy}}}
    )
    wait_for(
        lambda: (
            (custom.get_cluster_custom_object(GROUP, VERSION, "gpuhealthpolicies", POLICY).get("status") or {}).get(
                "breakerLimit"
            )
            == limit
        ),
        timeout=60,
        what=f"operator applied maxUnhealthy {max_unhealthy} (breakerLimit {limit})",
    )
    samples: list[tuple[float, int]] = []
    stop_sampling = threading.Event()

    def sample() -> None:
        while not stop_sampling.is_set():
            samples.append((time.time(), node_watch.tainted(TAINT)))
            stop_sampling.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    t0 = time.time()
    sampler.start()
    publish_all(b.pool, SimNode.fault, [b.sims[n] for n in breaker_nodes])
    time.sleep(max(0.0, args.breaker_window - (time.time() - t0)))
    stop_sampling.set()
    sampler.join()
    max_seen = max((c for _, c in samples), default=0)
    actual = sum(
        1
        for n in json.loads(
            b.core.list_node(label_selector="nvidia.com/gpu.present=true", _preload_content=False).data
        )["items"]
        if any(t.get("key") == TAINT for t in (n.get("spec") or {}).get("taints") or [])
    )
    pstatus = custom.get_cluster_custom_object(GROUP, VERSION, "gpuhealthpolicies", POLICY).get("status") or {}
    res["breaker"] = {
        "max_unhealthy": max_unhealthy,
        "limit": limit,
        "max_quarantined_seen": max_seen,
        "quarantined_at_end": actual,
        "held_back": pstatus.get("heldBack"),
        "breaker": pstatus.get("breaker"),
        "samples": len(samples),
        "faulted": len(breaker_nodes),
    }
    b.series["breaker"] = [(t - t0, c) for t, c in samples]
    log(f"  max quarantined seen {max_seen} (limit {limit}); breaker {pstatus.get('breaker')}")
