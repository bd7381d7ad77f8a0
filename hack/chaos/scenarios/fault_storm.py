"""Scenario: half of the fleet faults at once against the breaker."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from devkit.k8s import healthy_spec, wait_for
from hack.chaos import invariants as inv
from hack.chaos.scenarios.common import SILENCE
from hack.chaos.scenarios.context import Ctx, xid


def fault_storm(ctx: Ctx) -> None:
    """Half of the fleet faults at once: the breaker holds at its limit, opens with an Event on the
    policy, and closes by itself once the reports clear."""
    count = ctx.n(40, 10)
    rounds = ctx.n(3, 1)
    nodes = ctx.make_nodes(count)
    limit = max(1, count // 5)
    pname = ctx.policy(
        {
            "rules": {"xid": {"overrides": [{"code": 79, "action": "cordon"}]}, "agentSilence": {"after": SILENCE}},
            "safety": {"maxUnhealthy": limit, "probation": "2s", "flapping": {"maxQuarantines": 100}},
        }
    )
    ctx.breakers[pname] = (nodes, limit)
    for n in nodes:
        ctx.put_report(n, healthy_spec())
    ctx.operator()
    ctx.wait_states(nodes, lambda s: s.get("state") == "Healthy", 60, "all Healthy")

    def more_than(reason: str, n: int) -> Callable[[], bool]:
        return lambda: len(policy_events(reason)) > n

    def policy_events(reason: str) -> list[Mapping[str, Any]]:
        return inv.events_on(inv.operator_events(ctx), pname, reason)

    for r in range(rounds):
        faulty = ctx.rng.sample(nodes, count // 2)
        opened0, closed0 = len(policy_events("BreakerOpen")), len(policy_events("BreakerClosed"))
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: ctx.put_report(n, healthy_spec(xids=[xid(79, gpu=4)])), faulty))
        ctx.fault(len(faulty), kind="gpu")
        wait_for(more_than("BreakerOpen", opened0), timeout=30, what="BreakerOpen Event")
        ctx.wait_states(
            faulty,
            lambda s: s.get("state") == "Quarantined" or bool(s.get("heldByBreaker")),
            30,
            "quarantined or held back",
        )
        st = ctx.statuses(faulty)
        out = [n for n in faulty if st[n].get("state") == "Quarantined"]
        held = [n for n in faulty if st[n].get("heldByBreaker")]
        if len(out) != limit or len(held) != len(faulty) - limit:
            ctx.violate(f"round {r}: {len(out)} quarantined and {len(held)} held back; expected {limit} at the limit")
        pst = ctx.kube.get_policy(pname).get("status") or {}
        if pst.get("breaker") != "Open":
            ctx.violate(f"round {r}: policy status says breaker {pst.get('breaker')!r} while holding back")
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: ctx.put_report(n, healthy_spec()), faulty))
        wait_for(more_than("BreakerClosed", closed0), timeout=60, what="BreakerClosed Event")
        ctx.wait_states(nodes, lambda s: s.get("state") == "Healthy", 60, "fleet back in service")
        ctx.cycles += 1
    time.sleep(1.0)
    opened, closed = len(policy_events("BreakerOpen")), len(policy_events("BreakerClosed"))
    if opened != rounds or closed != rounds:
        ctx.violate(f"{opened} BreakerOpen and {closed} BreakerClosed Events for {rounds} storms (want one each)")
    for n in nodes:
        ctx.expect[n] = "healthy"
    ctx.note(
        f"{rounds} storm(s) of {count // 2}/{count} nodes at once, breaker limit {limit}: {opened} BreakerOpen, "
        f"{closed} BreakerClosed"
    )
