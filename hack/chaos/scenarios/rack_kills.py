"""Scenario: a rack's power brake, one rack finding, while the operator is SIGKILLed and the API server
crashes.

Four nodes of one rack (``topology.kubernetes.io/rack``) under a policy whose power-brake rule holds
a node after ``sustainedFor`` 4 s, and calls a brake on 3 nodes of a rack the rack's
(``rules.powerBrake.rack``: minNodes 3, action ``observe`` and ``cordon`` in turn). Each round the
rack's power shelf brakes 3 or 4 of its nodes at one moment (clock reason 0x80); the brakes hold past
``sustainedFor``, so each node's own finding is due and only the rack's finding keeps it from being
held alone; then they lift node by node, 1-4 s apart, the last one 6-9 s after the others are back in
service (longer than ``sustainedFor``). The kill monkey SIGKILLs the operator every 10-25 s, and each
round also the moment one braked node is seen with the rack's finding while another is not (the
rack's decision half written) and right after the first brake lifts; the API server is SIGKILLed
once a round, after the second brake lifted.

Judged (hack/chaos/decisions.py): no node of the rack held alone for its own power brake (its status
reason or its taint ``PowerBrake``) from the moment 3 nodes report the brake until none does, sampled
every 0.3 s; every node back in service, uncordoned, at the end of each round.
"""

from __future__ import annotations

import time
from typing import Any

from devkit.k8s import healthy_spec, utcnow
from hack.chaos import decisions as dc
from hack.chaos import invariants as inv
from hack.chaos.scenarios import decision_kit as kit
from hack.chaos.scenarios.common import drain_policy
from hack.chaos.scenarios.context import Ctx

RACK_LABEL = "topology.kubernetes.io/rack"
MIN_NODES = 3
POWER_BRAKE = 0x80  # NVML's HW power brake clock event reason
HW_SLOWDOWN = 0x8


def braked(since: str) -> dict[str, Any]:
    spec = healthy_spec()
    spec["devices"][1].update(clockEventReasons=POWER_BRAKE | HW_SLOWDOWN, clockEventsSince=since)
    return spec


def is_braked(report: dict[str, Any] | None) -> bool:
    devices = ((report or {}).get("spec") or {}).get("devices") or []
    return any(int(d.get("clockEventReasons") or 0) & POWER_BRAKE for d in devices if isinstance(d, dict))


def rack_policy(action: str) -> dict[str, Any]:
    spec = drain_policy(maxSlow="100%")
    spec["rules"]["powerBrake"] = {"sustainedFor": "4s", "rack": {"minNodes": MIN_NODES, "action": action}}
    return spec


ACTIONS = ("observe", "cordon")  # the rack's action, round by round: observe (the default) first


def rack_kills(ctx: Ctx) -> None:
    rounds = ctx.n(3, 1)
    rack = f"{ctx.group}-r1"[:63]
    members = ctx.make_nodes(4, labels={RACK_LABEL: rack})
    name = ctx.policy(rack_policy(ACTIONS[0]))
    for n in members:
        ctx.put_report(n, healthy_spec())
        ctx.expect[n] = "healthy"
    op = ctx.operator()
    ctx.wait_states(members, lambda s: s.get("state") == "Healthy", 60, "all Healthy")

    samples: list[dc.RackSample] = []
    path: dict[str, list[str]] = {n: [] for n in members}  # each node's (reason, taint value, braked) as sampled

    def look() -> None:
        seen, reports = inv.snapshot(ctx)
        t = time.monotonic()
        now_braked = frozenset(n for n in members if is_braked(reports.get(n)))
        own = {}
        for n in members:
            status = (reports.get(n) or {}).get("status") or {}
            how = dc.own_brake(status.get("reason"), kit.taint_value(seen.get(n)))
            if how:
                own[n] = how
            pos = f"{status.get('reason') or '-'}/{kit.taint_value(seen.get(n)) or '-'}"
            pos += "/braked" if n in now_braked else ""
            if not path[n] or path[n][-1] != pos:
                path[n].append(pos)
        samples.append(dc.RackSample(t, rack, now_braked, own))

    kit.sampling(ctx, look, "rack-sampler")
    monkey = kit.TimedMonkey(ctx, op, gap=kit.GAP, down=(0.0, 1.5))

    def where() -> str:
        seen, st = kit.nodes(ctx), ctx.statuses(members)
        return "; ".join(f"{n}: {kit.node_words(seen.get(n), st.get(n, {}))}" for n in members)

    try:
        for r in range(rounds):
            if r:
                ctx.retry(
                    ctx.kube.apply_policy, name, {**ctx.kube.get_policy(name)["spec"], **rack_policy(ACTIONS[r % 2])}
                )
            hit = ctx.rng.sample(members, ctx.rng.choice((3, 4)))

            def half_decided(hit: list[str] = hit) -> bool:
                reasons = {ctx.statuses(hit).get(n, {}).get("reason") for n in hit}
                return "RackPowerBrake" in reasons and len(reasons) > 1

            watches = [kit.kill_when(ctx, monkey, half_decided, f"rack finding half written r{r}")]
            since = utcnow()
            for n in hit:
                ctx.put_report(n, braked(since))
                ctx.fault(kind="gpu")

            def rack_finding(hit: list[str] = hit) -> bool:
                st = ctx.statuses(hit)
                return all(st.get(n, {}).get("reason") == "RackPowerBrake" for n in hit)

            kit.settle(ctx, rack_finding, 90, f"round {r}: the rack's finding on every braked node", where)
            time.sleep(ctx.rng.uniform(4.0, 8.0))  # past sustainedFor: each node's own finding is due
            order = list(hit)
            ctx.rng.shuffle(order)
            for i, n in enumerate(order[:-1]):
                ctx.put_report(n, healthy_spec())
                if i == 0:
                    time.sleep(ctx.rng.uniform(0.0, 1.0))
                    monkey.bounce(f"first brake lifted r{r}")
                elif i == 1:
                    kit.crash_apiserver(ctx, f"r{r}: second brake lifted")
                time.sleep(ctx.rng.uniform(1.0, 4.0))
            # The others back in service, the last node's brake outlasts theirs by more than
            # sustainedFor: alone under the brake, it is held for its own if the episode ended early.
            kit.back_in_service(ctx, order[:-1], 120, f"round {r}: the nodes whose brake lifted back")
            time.sleep(ctx.rng.uniform(6.0, 9.0))
            ctx.put_report(order[-1], healthy_spec())
            kit.back_in_service(ctx, members, 120, f"round {r}: the rack back in service")
            for w in watches:
                w.set()
            ctx.cycles += 1
    finally:
        kit.finish_monkey(ctx, monkey)
        time.sleep(1.0)  # the sampler's last look
        ctx.stop_background()
        for p in dc.rack_nodes_alone(samples, MIN_NODES):
            ctx.violate(p)
    ctx.stats["rack_samples"] = len(samples)
    ctx.stats["paths"] = {n: " > ".join(p) for n, p in path.items()}
    ctx.stats["samples_in_an_episode"] = sum(1 for s in samples if s.braked)
    ctx.note(
        f"{ctx.cycles} rounds of a power brake on 3-4 of a rack's 4 nodes, lifted node by node, "
        f"{monkey.kills} SIGKILLs (by moment: {monkey.by_mode}), "
        f"{len(ctx.stats.get('apiserver_crashes', []))} kube-apiserver crashes"
    )
