"""The soak: random faults, recoveries, kills and node churn on a live fleet with real agents, for
minutes, while the operator's resources are sampled; `make soak` (hack/chaos/run.py --soak MINUTES).

One operator process runs throughout (its resources are what is measured, so it is not killed; the
kill scenarios cover restarts). Around it: real agents (fake NVML) whose GPUs develop and lose ECC
errors and XIDs, agents SIGKILLed and restarted, kube-apiserver SIGKILLed now and then, and Nodes
deleted (with their agents) and new ones added. Every 10 s: the operator's RSS, open file
descriptors and threads (psutil) and the nodes it tracks (the sum of its `gpuhealth_nodes` gauge, a
view of its per-node caches). By default the operator also runs with its heap profile on
(gpuhealth/controller/process/heapprofile.py), so the Python heap is reported apart from RSS with the
lines that grew most: a leak grows the heap, an allocator settling only RSS. The profiler's own
trace table grows RSS too, so `--no-heap-profile` runs the operator as it runs in production and
measures its RSS alone. The report fits a
least-squares line to each series over the run (after a warm-up) and gives its slope per hour next
to its mean, and checks that deleted Nodes left nothing behind: no report, and the operator's
tracked count back to the live fleet's size.
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from devkit.cluster import LocalCluster
from hack.chaos import invariants as inv
from hack.chaos.scenarios.context import Ctx

SAMPLE_S = 10.0
WARMUP_S = 60.0
HEAP_S = 30.0  # the operator's heap profile interval (gpuhealth/controller/process/heapprofile.py)


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys over xs (0 for fewer than two distinct xs)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def trend(xs: Sequence[float], ys: Sequence[float]) -> dict[str, float]:
    """Mean, slope per hour, and the slope's share of the mean per hour (a relative drift)."""
    if not ys:
        return {"mean": 0.0, "per_hour": 0.0, "per_hour_pct_of_mean": 0.0, "samples": 0}
    mean = sum(ys) / len(ys)
    per_hour = slope(xs, ys) * 3600.0
    return {
        "mean": round(mean, 2),
        "per_hour": round(per_hour, 2),
        "per_hour_pct_of_mean": round(100.0 * per_hour / mean, 2) if mean else 0.0,
        "samples": len(ys),
    }


@dataclass
class Series:
    t: list[float] = field(default_factory=list)
    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, at: float, **values: float) -> None:
        self.t.append(at)
        for k, v in values.items():
            self.values.setdefault(k, []).append(v)

    def trends(self, after: float) -> dict[str, dict[str, float]]:
        keep = [i for i, t in enumerate(self.t) if t >= after]
        xs = [self.t[i] for i in keep]
        return {k: trend(xs, [v[i] for i in keep]) for k, v in self.values.items()}


def _tracked(metrics: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(r"^gpuhealth_nodes\{[^}]*\}\s+(\S+)$", metrics, re.M))


def soak(
    cluster: LocalCluster, workdir: Path, minutes: float, seed: int, heap_profile_on: bool = True
) -> dict[str, Any]:
    ctx = Ctx("soak", cluster, workdir / "soak", seed=seed)
    rng = ctx.rng
    sampler = inv.Sampler(ctx).start()
    series = Series()
    events: dict[str, int] = {}
    deleted: list[str] = []
    leftovers: list[str] = []
    heap_file = ctx.workdir / "operator-heap.jsonl"
    try:
        nodes = ctx.make_nodes(12)
        ctx.policy(
            {
                "rules": {
                    "agentSilence": {"after": "30s"},
                    "xid": {"overrides": [{"code": 79, "action": "cordon"}]},
                    "ecc": {"action": "cordon"},
                },
                "safety": {
                    "maxUnhealthy": "100%",
                    "probation": "5s",
                    "flapping": {"maxQuarantines": 100, "window": "1m"},
                },
            }
        )
        fleet = ctx.agents(nodes, heartbeat=2.0)
        profile = {"GPUHEALTH_HEAP_PROFILE": str(heap_file), "GPUHEALTH_HEAP_PROFILE_INTERVAL": str(HEAP_S)}
        op = ctx.operator(env=profile if heap_profile_on else {})
        ctx.wait_states(nodes, lambda s: s.get("state") == "Healthy", 120, "agents report, all Healthy")
        proc = psutil.Process(op.popen.pid if op.popen else 0)
        live = list(nodes)
        ecc: dict[str, bool] = {}
        t0 = time.monotonic()
        end = t0 + minutes * 60
        next_sample = t0
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_sample:
                next_sample += SAMPLE_S
                try:
                    series.add(
                        now - t0,
                        rss_mb=proc.memory_info().rss / 2**20,
                        open_fds=float(proc.num_fds()),
                        threads=float(proc.num_threads()),
                        tracked_nodes=_tracked(op.metrics()),
                        live_nodes=float(len(live)),
                    )
                except Exception as e:  # the operator died: that is a finding, not a sample
                    ctx.violate(f"soak: could not sample the operator: {e!r}")
                    break
            what = rng.choices(
                ["ecc_on", "ecc_off", "xid", "agent_kill", "apiserver_kill", "churn"], [30, 30, 10, 15, 3, 6]
            )[0]
            events[what] = events.get(what, 0) + 1
            n = rng.choice(live)
            if what == "ecc_on":
                fleet[n].set(f"gpu {rng.randrange(8)} ecc_volatile_uncorrected 3")
                ecc[n] = True
                ctx.fault(kind="gpu")
            elif what == "ecc_off" and ecc.get(n):
                for g in range(8):
                    fleet[n].set(f"gpu {g} ecc_volatile_uncorrected 0")
                ecc[n] = False
            elif what == "xid":
                fleet[n].inject_xid(gpu=rng.randrange(8), code=79)
                ctx.fault(kind="gpu")
            elif what == "agent_kill":
                fleet[n].kill()
                time.sleep(rng.uniform(0.0, 3.0))
                fleet.launch(fleet[n])
                ctx.fault(kind="agent_kill")
            elif what == "apiserver_kill":
                cluster.restart("kube-apiserver", down_for=rng.uniform(0.5, 3.0), sig=signal.SIGKILL)
                ctx.fault(kind="apiserver_crash")
            elif what == "churn" and len(live) > 6:
                fleet[n].kill()
                cluster.kubectl("delete", "node", n, "--wait=false", check=False)
                live.remove(n)
                deleted.append(n)
                # Not ctx.make_nodes: it waits for every node of the group to be schedulable, and
                # quarantined ones are cordoned. The agent's report and KWOK follow by themselves.
                (fresh,) = ctx.retry(
                    cluster.add_gpu_nodes,
                    1,
                    prefix=f"{ctx.group}-",
                    start=len(ctx.all_nodes),
                    labels={"chaos-group": ctx.group},
                )
                ctx.all_nodes.append(fresh)
                fleet.start([fresh])  # one more agent; the others keep running
                live.append(fresh)
            time.sleep(rng.uniform(1.0, 4.0))
        ctx.cycles = sum(events.values())
        leftovers = _leftovers(ctx, deleted)
        for problem in leftovers:
            ctx.violate(f"soak: {problem}")
        tracked = _tracked(op.metrics())
        if tracked > len(live):
            ctx.violate(f"soak: the operator tracks {tracked:.0f} nodes, the fleet has {len(live)} (deleted ones kept)")
        for n in live:
            ctx.expect[n] = "any"
    finally:
        ctx.stop_background()
        ctx.violations += sampler.stop()
        ctx.cleanup()
    return {
        "minutes": minutes,
        "seed": seed,
        "events": events,
        "faults": ctx.faults,
        "nodes_deleted": len(deleted),
        "leftovers": leftovers,
        "violations": ctx.violations,
        "trends": series.trends(WARMUP_S),
        "heap_profile": heap_profile_on,
        "heap": heap_profile(heap_file) if heap_profile_on else {},
        "series": {
            "t": [round(t, 1) for t in series.t],
            **{k: [round(x, 2) for x in v] for k, v in series.values.items()},
        },
    }


def heap_profile(path: Path, top: int = 12) -> dict[str, Any]:
    """The operator's Python heap over the run, from its heap profile: the bytes its objects hold
    (what a leak grows) apart from the process's RSS (which the allocator settling grows too), and
    the lines whose holdings grew most from the baseline to the last sample."""
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    t = [float(x["t"]) for x in lines]
    heap = [x["traced_bytes"] / 2**20 for x in lines]
    overhead = [x["overhead_bytes"] / 2**20 for x in lines]
    keep = [i for i, at in enumerate(t) if at >= WARMUP_S]
    xs = [t[i] for i in keep]
    last: list[dict[str, Any]] = next((x["growth"] for x in reversed(lines) if "growth" in x), [])
    return {
        "t": [round(x, 1) for x in t],
        "python_heap_mb": [round(x, 3) for x in heap],
        "tracemalloc_overhead_mb": [round(x, 3) for x in overhead],
        "trends": {
            "python_heap_mb": trend(xs, [heap[i] for i in keep]),
            "tracemalloc_overhead_mb": trend(xs, [overhead[i] for i in keep]),
        },
        "growth": last[:top],
    }


def _leftovers(ctx: Ctx, deleted: list[str], settle: float = 60.0) -> list[str]:
    """What deleted Nodes left behind: their reports (the agent is gone too), once the API settles."""
    deadline = time.monotonic() + settle
    while True:
        items = ctx.retry(ctx.kube.custom.list_cluster_custom_object, inv.GROUP, inv.VERSION, "gpunodehealths")
        names = {r["metadata"]["name"] for r in items["items"]}
        left = [f"the report of deleted node {n} is still there" for n in deleted if n in names]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(2.0)
