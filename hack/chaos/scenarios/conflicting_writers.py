"""Scenario: gpuhealth quarantines and returns nodes while another writer changes them."""

from __future__ import annotations

import time

from devkit.k8s import healthy_spec
from hack.chaos import invariants as inv
from hack.chaos.scenarios.common import SILENCE
from hack.chaos.scenarios.context import Ctx, xid
from hack.chaos.scenarios.foreign_writer import ForeignWriter


def conflicting_writers(ctx: Ctx) -> None:
    """gpuhealth quarantines and returns nodes while another writer keeps changing their taints,
    labels and cordon: nothing of either is lost."""
    nodes = ctx.make_nodes(ctx.n(6, 3))
    cycles = ctx.n(5, 2)
    ctx.policy(
        {
            "rules": {"xid": {"overrides": [{"code": 79, "action": "cordon"}]}, "agentSilence": {"after": SILENCE}},
            "safety": {"maxUnhealthy": "100%", "probation": "2s", "flapping": {"maxQuarantines": 100}},
        }
    )
    for n in nodes:
        ctx.put_report(n, healthy_spec())
    ctx.operator()
    ctx.wait_states(nodes, lambda s: s.get("state") == "Healthy", 60, "all Healthy")
    writer = ForeignWriter(ctx, nodes)
    for c in range(cycles):
        for n in nodes:
            ctx.put_report(n, healthy_spec(xids=[xid(79, gpu=ctx.rng.randrange(8))]))
            ctx.fault(kind="gpu")
        ctx.wait_states(nodes, lambda s: s.get("state") == "Quarantined", 60, f"cycle {c}: quarantined")
        time.sleep(ctx.rng.uniform(0.5, 2.0))
        for n in nodes:
            ctx.put_report(n, healthy_spec())
        ctx.wait_states(nodes, lambda s: s.get("state") == "Healthy", 60, f"cycle {c}: back in service")
        ctx.cycles += 1
    time.sleep(1.0)
    writer.stop.set()
    time.sleep(0.5)
    for n in nodes:
        ctx.expect[n] = "healthy"
    ctx.stats.update(foreign_writes=writer.writes, foreign_conflicts=writer.conflicts, writer_checks=writer.checks)
    lifted = [e for n in nodes for e in inv.events_on(inv.operator_events(ctx), n, "LiftedByOthers")]
    ctx.note(
        f"{len(nodes)} nodes x {cycles} quarantine/recovery cycles against {writer.writes} foreign writes "
        f"({writer.conflicts} of the writer's updates refused with 409); LiftedByOthers events: {len(lifted)}"
    )
