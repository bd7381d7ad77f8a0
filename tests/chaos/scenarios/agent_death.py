"""Scenario: real agents SIGKILLed."""

from __future__ import annotations

import json
import time

from tests.chaos.scenarios.context import Ctx


def agent_death(ctx: Ctx) -> None:
    """Real agents are SIGKILLed: a healthy node turns Unknown within two heartbeats plus
    agentSilence.after; the silence action applies; a node that was out of service stays out."""
    heartbeat, after, probation = 2.0, 5.0, 10.0
    sets = ctx.n(3, 1)
    healthy, quarantined, recovering, cordoned = [], [], [], []
    for _ in range(sets):
        a, b, c = ctx.make_nodes(3)
        (d,) = ctx.make_nodes(1, labels={"chaos-silence": "cordon"})
        healthy.append(a)
        quarantined.append(b)
        recovering.append(c)
        cordoned.append(d)
    base = {
        "rules": {
            "agentSilence": {"after": f"{after:.0f}s"},
            "xid": {"overrides": [{"code": 79, "action": "cordon"}]},
            "ecc": {"action": "cordon"},
        },
        "safety": {"maxUnhealthy": "100%", "probation": f"{probation:.0f}s"},
    }
    ctx.policy(base)
    strict = json.loads(json.dumps(base))
    strict["rules"]["agentSilence"]["action"] = "cordon"
    strict["priority"] = 10
    ctx.policy(strict, name=f"{ctx.group}-cordon", match={"chaos-silence": "cordon"}, nodes=cordoned)
    everyone = healthy + quarantined + recovering + cordoned
    fleet = ctx.agents(everyone, heartbeat=heartbeat)
    ctx.operator()
    ctx.wait_states(everyone, lambda s: s.get("state") == "Healthy", 90, "agents report, all Healthy")
    for b in quarantined:
        fleet[b].inject_xid(gpu=1, code=79)
    for c in recovering:
        fleet[c].set("gpu 2 ecc_volatile_uncorrected 3")
    ctx.fault(len(quarantined) + len(recovering), kind="gpu")
    ctx.wait_states(quarantined + recovering, lambda s: s.get("state") == "Quarantined", 30, "quarantined")
    for c in recovering:
        fleet[c].set("gpu 2 ecc_volatile_uncorrected 0")
    ctx.wait_states(recovering, lambda s: s.get("state") == "Recovering", 30, "on probation")
    t0 = time.monotonic()
    for n in everyone:
        fleet[n].kill()
    ctx.fault(len(everyone), kind="agent_kill")
    bound = 2 * heartbeat + after
    ctx.wait_states(healthy, lambda s: s.get("state") == "Unknown", bound + 10, "Unknown", interval=0.25)
    took = time.monotonic() - t0
    if took > bound + 1.0:  # one sweep (--tick=1) of measuring slack
        ctx.violate(f"healthy nodes became Unknown {took:.1f}s after their agents died (bound {bound:.0f}s)")
    ctx.wait_states(cordoned, lambda s: s.get("state") == "Quarantined", 30, "silence action cordon applied")
    # Long past the probation: nothing on stale data may return to service.
    time.sleep(max(0.0, probation + after + 3 - (time.monotonic() - t0)))
    ctx.runs += len(everyone)
    for n in healthy:
        ctx.expect[n] = "unknown"
    for n in quarantined + cordoned:
        ctx.expect[n] = "out"
    for n in recovering:
        ctx.expect[n] = "out_of_service"
    ctx.stats["unknown_after_s"] = round(took, 1)
    ctx.note(
        f"{len(everyone)} agents SIGKILLed (heartbeat {heartbeat:.0f}s, agentSilence.after {after:.0f}s): healthy "
        f"nodes Unknown after {took:.1f}s (bound {bound:.0f}s); quarantined and on-probation nodes stayed out "
        f"of service past the {probation:.0f}s probation; silence action cordon quarantined its nodes"
    )
