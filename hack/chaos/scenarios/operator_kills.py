"""Scenario: quarantine -> checkpoint-aware drain -> recovery while the operator is SIGKILLed."""

from __future__ import annotations

import time

from devkit.k8s import healthy_spec, wait_for
from hack.chaos.scenarios.common import drain_policy, drained
from hack.chaos.scenarios.context import Ctx, xid
from hack.chaos.scenarios.monkey import KillMonkey


def operator_kills(ctx: Ctx) -> None:
    """Quarantine -> checkpoint-aware drain -> recovery, over and over, while the operator is
    SIGKILLed at random instants (and restarted after a random pause)."""
    width = ctx.n(3, 6)
    rounds = ctx.n(10, 1)
    targets = ctx.make_nodes(width)
    spares = ctx.make_nodes(width)
    ctx.policy(drain_policy())
    for n in targets + spares:
        ctx.put_report(n, healthy_spec())
    op = ctx.operator()
    ctx.wait_states(targets + spares, lambda s: s.get("state") == "Healthy", 60, "all Healthy")
    ns = ctx.namespace()
    ctx.acknowledger([ns])
    monkey = KillMonkey(ctx, op, gap=(1.5, 6.0), down=(0.0, 2.0))
    durations = []
    for r in range(rounds):
        t0 = time.monotonic()
        jobs = [f"r{r}-{i}" for i in range(width)]
        for job, target in zip(jobs, targets, strict=True):
            ctx.training_job(ns, job, target)
        for job, target in zip(jobs, targets, strict=True):
            ctx.wait_job_on(ns, job, target)
        if r % 2 == 0:
            monkey.at_first_checkpoint_request(ns)
        for n in targets:
            ctx.put_report(n, healthy_spec(xids=[xid(48, gpu=ctx.rng.randrange(8))]))
            ctx.fault(kind="gpu")
        for n in spares:
            ctx.put_report(n, healthy_spec())  # fresh heartbeats
        ctx.wait_states(targets, drained, 180, f"round {r}: drained and quarantined")
        left = [p.metadata.name for p in ctx.pods(ns) if p.spec.node_name in targets]
        if left:
            ctx.violate(f"round {r}: drain completed with pods still on the nodes: {left}")
        for n in targets:
            ctx.put_report(n, healthy_spec())  # the GPU was reset: clean facts
        ctx.wait_states(targets, lambda s: s.get("state") == "Healthy", 120, f"round {r}: back in service")
        ctx.wait_schedulable(targets, 60, f"round {r}: taints and cordons lifted")
        for job in jobs:
            ctx.delete_job(ns, job)
        wait_for(lambda: not ctx.kube.core.list_namespaced_pod(ns).items, timeout=90, what="round's pods gone")
        ctx.cycles += 1
        durations.append(time.monotonic() - t0)
    monkey.finish()
    for n in targets + spares:
        ctx.put_report(n, healthy_spec())
        ctx.expect[n] = "healthy"
    ctx.stats["operator_kills"] = monkey.kills
    ctx.stats["targeted_kills"] = monkey.targeted
    ctx.stats["kills_by_moment"] = monkey.by_mode
    ctx.stats["round_seconds_max"] = round(max(durations), 1)
    ctx.note(
        f"{ctx.cycles} quarantine/drain/recovery rounds of {width} nodes (4-rank gangs), {monkey.kills} SIGKILLs "
        f"(by moment: {monkey.by_mode}; 'startup' before the metrics answer, 'resync' right after)"
    )
