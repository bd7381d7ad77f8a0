"""Scenario: NVLink domains taken out and returned as one while the operator is SIGKILLed and the API
server crashes.

Two domains of 3 nodes (the clique label ``nvidia.com/gpu.clique``) under one policy whose breaker
admits 4 nodes: each round a GPU of one member of each domain asks for its domain's recovery (in
turn its recovery action ``RecoverImexDomain``, or its fabric routes unhealthy), at once. One domain
fits: it must leave whole while the other is held back whole by the breaker (``heldByBreaker``, no
member tainted); once the first one's fault clears it returns as one and the second leaves as one;
then it clears too and returns. The kill monkey SIGKILLs the operator every 2-6 s, and each round
also the moment a domain is seen partly tainted (its decision half written), leaving and returning;
the API server is SIGKILLed once a round, the moment the second domain starts leaving.

Judged (hack/chaos/decisions.py): no domain sampled half out for longer than SETTLE_S of the
operator's acting time (a decision left half written), each settle point all out or all back in one
read of the Nodes, the members out for the domain's reason (``ImexDomain``), and the breaker never
over its limit (sampled).
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from devkit.k8s import OperatorProcess, healthy_spec
from hack.chaos import decisions as dc
from hack.chaos import invariants as inv
from hack.chaos.scenarios import decision_kit as kit
from hack.chaos.scenarios.common import drain_policy
from hack.chaos.scenarios.context import Ctx

CLIQUE = "nvidia.com/gpu.clique"
SIZE = 3
LIMIT = 4  # the breaker's maxUnhealthy: one domain fits, two do not
# A domain half out longer than this, counted in the operator's acting time (its start-ups not held
# against it: dc.half_domains), is a decision left half written, not one in flight or a restart
# finishing it; an API server crash and its recovery under load fit well within it.
SETTLE_S = 30.0


def _acting(op: OperatorProcess) -> bool:
    """The operator is up and its start-up is over (``gpuhealth_startup_seconds`` set: every node passed
    once); killed, importing or listing, it is not."""
    try:
        return bool(op.metric("gpuhealth_startup_seconds"))
    except Exception:
        return False


def _faulty(kind: str, gpu: int) -> dict[str, Any]:
    spec = healthy_spec()
    if kind == "imex":
        spec["devices"][gpu]["recoveryAction"] = "RecoverImexDomain"
    else:
        spec["devices"][gpu]["fabric"] = {
            "state": "Completed",
            "status": 0,
            "clusterUuid": "5a4b3c2d-1e0f-4a1b-9c8d-7e6f5a4b3c2d",
            "cliqueId": 1,
            "healthSummary": "Unhealthy",
            "routeUnhealthy": True,
            "healthMask": 0x1 << 4,
        }
    return spec


def domain_kills(ctx: Ctx) -> None:
    rounds = ctx.n(4, 1)
    domains = {f"{ctx.group}.{k}": ctx.make_nodes(SIZE, labels={CLIQUE: f"{ctx.group}.{k}"}) for k in (1, 2)}
    members = [n for ns in domains.values() for n in ns]
    name = ctx.policy(drain_policy(maxUnhealthy=LIMIT))
    ctx.breakers[name] = (members, LIMIT)
    for n in members:
        ctx.put_report(n, healthy_spec())
        ctx.expect[n] = "healthy"  # judged at the end even if a round does not settle
    op = ctx.operator()
    ctx.wait_states(members, lambda s: s.get("state") == "Healthy", 60, "all Healthy")

    samples: list[dc.DomainSample] = []

    def look() -> None:
        acting = _acting(op)
        seen, t = kit.nodes(ctx), time.monotonic()
        acting = acting and _acting(op)  # and still: not killed while the Nodes were read
        for d, ns in domains.items():
            out = {n: inv._our_taint(seen.get(n) or {}) is not None for n in ns}
            samples.append(dc.DomainSample(t, d, out, acting))

    kit.sampling(ctx, look, "domain-sampler")
    monkey = kit.TimedMonkey(ctx, op, gap=kit.GAP, down=(0.0, 1.5))

    def half(which: list[str]) -> bool:
        seen = kit.nodes(ctx)
        return len({inv._our_taint(seen.get(n) or {}) is not None for n in which}) > 1

    def out(which: list[str]) -> bool:
        seen = kit.nodes(ctx)
        return all(inv._our_taint(seen.get(n) or {}) is not None for n in which)

    def moving(which: list[str]) -> bool:
        return half(which) or out(which)

    def where() -> str:
        seen, st = kit.nodes(ctx), ctx.statuses(members)
        return "; ".join(f"{n}: {kit.node_words(seen.get(n), st.get(n, {}))}" for n in members)

    def settled(out_d: list[str], rest: list[str], held: bool, what: str) -> None:
        """Wait until ``out_d`` is out for the domain's reason and ``rest`` is untainted (held back by the
        breaker, or Healthy); then judge one read of the Nodes: each domain all out or all back."""

        def done() -> bool:
            seen, st = kit.nodes(ctx), ctx.statuses(members)
            gone = all(
                inv._our_taint(seen.get(n) or {}) is not None and st.get(n, {}).get("reason") == "ImexDomain"
                for n in out_d
            )
            back = all(
                inv._our_taint(seen.get(n) or {}) is None
                and (st.get(n, {}).get("heldByBreaker") if held else st.get(n, {}).get("state") == "Healthy")
                for n in rest
            )
            return gone and back

        kit.settle(ctx, done, 120, what, where, acting=partial(_acting, op))
        seen = ctx.retry(kit.nodes, ctx)  # the API server may be crashing on purpose right now
        for d, ns in domains.items():
            taints = {n: inv._our_taint(seen.get(n) or {}) is not None for n in ns}
            for p in dc.settled_domain_problems(d, taints, ns == out_d):
                ctx.violate(f"{what}: {p}")

    try:
        for r in range(rounds):
            kind = ("imex", "routes")[r % 2]
            bad = [(ctx.rng.choice(ns), ctx.rng.randrange(8)) for ns in domains.values()]
            watches = [
                kit.kill_when(ctx, monkey, partial(half, ns), f"domain half tainted leaving r{r}")
                for ns in domains.values()
            ]
            for n, gpu in bad:
                ctx.put_report(n, _faulty(kind, gpu))
                ctx.fault(kind="gpu")
            # One domain leaves whole, the other is held back whole: which one is the operator's call.
            first: list[str] = []

            def one_out() -> bool:
                nonlocal first
                first = next((ns for ns in domains.values() if out(ns)), [])
                return bool(first)

            kit.settle(ctx, one_out, 120, f"round {r}: a domain out", where, acting=partial(_acting, op))
            second = next(ns for ns in domains.values() if ns != first)
            settled(first, second, True, f"round {r}: one domain out, the other held")
            # The first returns as one, the second leaves as one: kill when either is seen half way, and
            # crash the API server as the second starts leaving.
            watches += [
                kit.kill_when(ctx, monkey, partial(half, first), f"domain half tainted returning r{r}"),
                kit.kill_when(ctx, monkey, partial(half, second), f"second domain half tainted leaving r{r}"),
                kit.crash_when(ctx, partial(moving, second), f"r{r}: the second domain leaving"),
            ]
            for n, _ in bad:
                if n in first:
                    ctx.put_report(n, healthy_spec())
            settled(second, first, False, f"round {r}: the first back, the second out")
            watches.append(
                kit.kill_when(ctx, monkey, partial(half, second), f"second domain half tainted returning r{r}")
            )
            for n, _ in bad:
                if n in second:
                    ctx.put_report(n, healthy_spec())
            settled([], members, False, f"round {r}: both back")
            kit.back_in_service(ctx, members, 60, f"round {r}: schedulable")
            for w in watches:  # a moment not seen this round is not waited for in the next
                w.set()
            ctx.cycles += 1
    finally:
        kit.finish_monkey(ctx, monkey)
        time.sleep(1.0)  # the sampler's last look
        ctx.stop_background()
        for p in dc.half_domains(samples, SETTLE_S):
            ctx.violate(p)
    ctx.stats["domain_samples"] = len(samples)
    ctx.stats["half_samples"] = sum(1 for s in samples if len(set(s.out.values())) > 1)
    # How close the run came to SETTLE_S: the longest stretches a domain was sampled half out, as
    # [seconds of the operator's acting time, seconds in all].
    stretches = sorted(dc.half_stretches(samples), key=lambda h: h.acting_s, reverse=True)[:5]
    ctx.stats["longest_half_s"] = [[round(h.acting_s, 1), round(h.seconds, 1)] for h in stretches]
    ctx.stats["acting_samples"] = sum(1 for s in samples if s.acting)
    ctx.note(
        f"{ctx.cycles} rounds of two {SIZE}-node NVLink domains faulted at once under a breaker of {LIMIT}, "
        f"{monkey.kills} SIGKILLs (by moment: {monkey.by_mode}), "
        f"{len(ctx.stats.get('apiserver_crashes', []))} kube-apiserver crashes"
    )
