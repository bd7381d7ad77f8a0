"""Scenario: kube-apiserver and etcd go away in the middle of drains."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

from gpuhealth.workload import REQUESTED, acknowledge
from tests.chaos import invariants as inv
from tests.chaos.scenarios.common import drain_policy, drained
from tests.chaos.scenarios.context import Ctx
from tests.support.k8s import wait_for


def control_plane_restarts(ctx: Ctx) -> None:
    """A drain is waiting for checkpoints when kube-apiserver (then, separately, etcd) goes away for a
    few seconds. Operator and agents must be back within 30 s of the API returning and finish it."""
    down = 5.0
    components = ["kube-apiserver", "etcd"] * ctx.n(2, 1)
    targets = ctx.make_nodes(len(components))
    spares = ctx.make_nodes(2)
    # Every drain must still be waiting for its checkpoints at the last restart: a timeout longer
    # than the whole scenario (each restart round takes about 40 s on 2 cores).
    ctx.policy(
        drain_policy()
        | {"rules": {"agentSilence": {"after": "30s"}}, "actions": {"drain": {"checkpointTimeout": "10m"}}}
    )
    fleet = ctx.agents(targets + spares, heartbeat=2.0)
    ctx.operator()
    ctx.wait_states(targets + spares, lambda s: s.get("state") == "Healthy", 90, "agents report, all Healthy")
    ns = ctx.namespace()
    recover, finish, agents_back = [], [], []
    # Every target's drain starts at once and waits for its checkpoints; each restart then happens in
    # the middle of all the drains still waiting, and one of them is acknowledged after it.
    jobs = [f"j{i}" for i in range(len(targets))]
    for job, target in zip(jobs, targets, strict=True):
        ctx.training_job(ns, job, target)
    for job, target in zip(jobs, targets, strict=True):
        ctx.wait_job_on(ns, job, target)
    for target in targets:
        fleet[target].inject_xid(gpu=ctx.rng.randrange(8), code=48)
        ctx.fault(kind="gpu")
    for component, target, job in zip(components, targets, jobs, strict=True):

        def requested(job: str = job) -> list[Any]:
            ps = [p for p in ctx.pods(ns) if (p.metadata.labels or {}).get("app") == job]
            asked = [p for p in ps if (p.metadata.annotations or {}).get(REQUESTED)]
            return asked if len(asked) == 4 else []

        asked = wait_for(requested, timeout=60, what="checkpoint requested on all 4 ranks")
        t_restart = time.monotonic()
        ctx.cluster.restart(component, down_for=down)
        ctx.fault(kind="control_plane_restart")
        if component == "etcd":
            ctx.cluster._wait_ready()
        back = time.monotonic()
        back_wall = inv.now()
        ctx.stats.setdefault("restart_s", []).append(round(back - t_restart, 1))
        agents_at: list[float] = []

        def heartbeats(
            stop: threading.Event, back: float = back, back_wall: dt.datetime = back_wall, out: list[float] = agents_at
        ) -> None:
            while not stop.wait(0.5):
                try:
                    items = ctx.kube.custom.list_cluster_custom_object(inv.GROUP, inv.VERSION, "gpunodehealths")
                except Exception:
                    continue
                hb = {
                    r["metadata"]["name"]: inv.parse_time((r.get("spec") or {}).get("heartbeatTime"))
                    for r in items["items"]
                }
                if all((hb.get(n) or back_wall) > back_wall for n in targets + spares):
                    out.append(time.monotonic() - back)
                    return

        ctx.background(heartbeats, "heartbeats")
        for p in asked:
            ctx.retry(acknowledge, ns, p.metadata.name, ctx.kube.api)

        def acted(target: str = target, back_wall: dt.datetime = back_wall) -> bool:
            evs = inv.events_on(inv.operator_events(ctx), target, "Evicted")
            return any((inv.parse_time(e.get("eventTime")) or back_wall) >= back_wall for e in evs)

        wait_for(acted, timeout=90, interval=0.5, what=f"operator evicts after the {component} restart")
        recover.append(time.monotonic() - back)
        ctx.wait_states([target], drained, 120, f"drain finished after the {component} restart")
        finish.append(time.monotonic() - back)
        wait_for(lambda out=agents_at: out, timeout=90, interval=0.5, what="every agent heartbeats again")
        agents_back.append(agents_at[0])
        for what, secs in (("operator", recover[-1]), ("agents", agents_back[-1])):
            if secs > 30:
                ctx.violate(f"{component} restart: the {what} took {secs:.1f}s (> 30s) after the API returned")
        ctx.runs += 1
    for n in targets:
        ctx.expect[n] = "out"  # the XID stays in the agent's history: faulty facts, drained, quarantined
    for n in spares:
        ctx.expect[n] = "healthy"
    ctx.stats.update(
        operator_recovery_s=[round(x, 1) for x in recover],
        drain_finished_s=[round(x, 1) for x in finish],
        agents_recovery_s=[round(x, 1) for x in agents_back],
    )
    ctx.note(
        f"restarts {components}, each down {down:.0f}s: operator acted again after "
        f"{', '.join(f'{x:.1f}s' for x in recover)}, agents heartbeat again after "
        f"{', '.join(f'{x:.1f}s' for x in agents_back)} (limit 30s)"
    )
