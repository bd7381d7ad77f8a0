"""Scenario: kube-apiserver and etcd SIGKILLed at random instants in the middle of drains.

Crashes, not shutdowns: SIGKILL (no graceful stop), with etcd syncing its WAL to disk as a real one
does (this control plane runs etcd without ``--unsafe-no-fsync``). Half of the crashes land while a
drain waits for its checkpoints, half right after its ranks acknowledge, while the operator writes
the evictions. One target and one spare carry a cordon and a taint of another controller, logged
like the foreign writer's. Nothing may be lost: every drain finishes once, no pod is evicted twice or
unasked, every quarantine stays, no foreign cordon or taint is lifted.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import signal
import threading
import time
from typing import Any

from devkit.k8s import wait_for
from gpuhealth.workload import REQUESTED, acknowledge
from hack.chaos import invariants as inv
from hack.chaos.foreign import resource_version
from hack.chaos.scenarios.common import drain_policy, drained
from hack.chaos.scenarios.context import Ctx

FOREIGN_TAINT = "example.com/chaos-crash"


def _foreign_cordon(ctx: Ctx, node: str) -> None:
    """Another controller cordons and taints ``node`` (logged as its own write)."""
    body = json.loads(ctx.retry(ctx.kube.core.read_node, node, _preload_content=False).data)
    spec = body.setdefault("spec", {})
    spec["unschedulable"] = True
    spec["taints"] = [*(spec.get("taints") or []), {"key": FOREIGN_TAINT, "value": "x", "effect": "NoSchedule"}]
    ctx.foreign.begin(node, frozenset({FOREIGN_TAINT}), True)
    resp = ctx.retry(ctx.kube.core.replace_node, node, body, _preload_content=False)
    ctx.foreign.record(node, resource_version(json.loads(resp.data)), frozenset({FOREIGN_TAINT}), True)
    ctx.fault(kind="foreign_write")


def _watch_heartbeats(ctx: Ctx, nodes: list[str], back: float, back_wall: dt.datetime) -> list[float]:
    """Seconds after ``back`` until every node's agent has heartbeat again (filled in the background)."""
    out: list[float] = []

    def loop(stop: threading.Event) -> None:
        while not stop.wait(0.5):
            try:
                items = ctx.kube.custom.list_cluster_custom_object(inv.GROUP, inv.VERSION, "gpunodehealths")
            except Exception:
                continue
            hb = {
                r["metadata"]["name"]: inv.parse_time((r.get("spec") or {}).get("heartbeatTime"))
                for r in items["items"]
            }
            if all((hb.get(n) or back_wall) > back_wall for n in nodes):
                out.append(time.monotonic() - back)
                return

    ctx.background(loop, "heartbeats")
    return out


def control_plane_crashes(ctx: Ctx) -> None:
    """Drains are under way when kube-apiserver (then etcd) is SIGKILLed at a random instant and
    started again after a random pause. Operator and agents must be back within 30 s of the API
    returning, and finish every drain exactly once."""
    components = ["kube-apiserver", "etcd"] * ctx.n(2, 1)
    targets = ctx.make_nodes(len(components))
    spares = ctx.make_nodes(2)
    # Every drain must still be waiting for its checkpoints at the last crash: a timeout longer than
    # the whole scenario. The agents' silence bound covers an outage plus their reconnect.
    ctx.policy(
        drain_policy()
        | {"rules": {"agentSilence": {"after": "30s"}}, "actions": {"drain": {"checkpointTimeout": "10m"}}}
    )
    fleet = ctx.agents(targets + spares, heartbeat=2.0)
    ctx.operator()
    ctx.wait_states(targets + spares, lambda s: s.get("state") == "Healthy", 90, "agents report, all Healthy")
    ns = ctx.namespace()
    recover: list[float] = []
    finish: list[float] = []
    agents_back: list[float] = []
    moments: list[str] = []
    # Every target's drain starts at once and waits for its checkpoints; each crash then happens in
    # the middle of all the drains still waiting.
    jobs = [f"j{i}" for i in range(len(targets))]
    for job, target in zip(jobs, targets, strict=True):
        ctx.training_job(ns, job, target)
    for job, target in zip(jobs, targets, strict=True):
        ctx.wait_job_on(ns, job, target)
    _foreign_cordon(ctx, targets[0])
    _foreign_cordon(ctx, spares[0])
    for target in targets:
        fleet[target].inject_xid(gpu=ctx.rng.randrange(8), code=48)
        ctx.fault(kind="gpu")
    for i, (component, target, job) in enumerate(zip(components, targets, jobs, strict=True)):

        def requested(job: str = job) -> list[Any]:
            ps = [p for p in ctx.pods(ns) if (p.metadata.labels or {}).get("app") == job]
            asked = [p for p in ps if (p.metadata.annotations or {}).get(REQUESTED)]
            for p in asked:
                ctx.workload_saw.setdefault(f"{ns}/{p.metadata.name}", inv.now())
            return asked if len(asked) == 4 else []

        asked = wait_for(requested, timeout=60, what="checkpoint requested on all 4 ranks")
        evicting = i % 2 == 1  # every other crash lands while the operator writes the evictions
        if evicting:
            for p in asked:
                ctx.retry(acknowledge, ns, p.metadata.name, ctx.kube.api)
        time.sleep(ctx.rng.uniform(0.0, 1.0 if evicting else 2.0))
        down = ctx.rng.uniform(1.0, 5.0)
        t_crash = time.monotonic()
        ctx.cluster.restart(component, down_for=down, sig=signal.SIGKILL)
        ctx.fault(kind="apiserver_crash" if component == "kube-apiserver" else "etcd_crash")
        if component == "etcd":
            ctx.cluster._wait_ready()
        back = time.monotonic()
        back_wall = inv.now()
        moments.append(f"{component} {'mid-eviction' if evicting else 'mid-wait'}, down {down:.1f}s")
        ctx.stats.setdefault("crash_to_ready_s", []).append(round(back - t_crash, 1))
        agents_at = _watch_heartbeats(ctx, targets + spares, back, back_wall)
        if not evicting:
            for p in asked:
                ctx.retry(acknowledge, ns, p.metadata.name, ctx.kube.api)

            def acted(target: str = target, back_wall: dt.datetime = back_wall) -> bool:
                evs = inv.events_on(inv.operator_events(ctx), target, "Evicted")
                return any((inv.parse_time(e.get("eventTime")) or back_wall) >= back_wall for e in evs)

            wait_for(acted, timeout=90, interval=0.5, what=f"operator evicts after the {component} crash")
            recover.append(time.monotonic() - back)
        ctx.wait_states([target], drained, 120, f"drain finished after the {component} crash")
        finish.append(time.monotonic() - back)
        wait_for(functools.partial(list, agents_at), timeout=90, interval=0.5, what="every agent heartbeats again")
        agents_back.append(agents_at[0])
        operator_s = finish[-1] if evicting else recover[-1]
        for what, secs in (("operator", operator_s), ("agents", agents_back[-1])):
            if secs > 30:
                ctx.violate(f"{component} crash: the {what} took {secs:.1f}s (> 30s) after the API returned")
        ctx.cycles += 1
    for n in targets:
        ctx.expect[n] = "out"  # the XID stays in the agent's history: faulty facts, drained, quarantined
    for n in spares:
        ctx.expect[n] = "healthy"
    ctx.stats.update(
        crashes=moments,
        operator_recovery_s=[round(x, 1) for x in recover],
        drain_finished_s=[round(x, 1) for x in finish],
        agents_recovery_s=[round(x, 1) for x in agents_back],
    )
    ctx.note(
        f"SIGKILLs ({'; '.join(moments)}), etcd with fsync: operator evicted again after "
        f"{', '.join(f'{x:.1f}s' for x in recover)}, drains finished {', '.join(f'{x:.1f}s' for x in finish)} "
        f"after the API returned; agents heartbeat again after {', '.join(f'{x:.1f}s' for x in agents_back)} "
        "(limit 30s)"
    )
