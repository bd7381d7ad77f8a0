"""Scenario: real agents SIGKILLed."""

from __future__ import annotations

import datetime as dt
import json
import time

from devkit.agents import Agent
from devkit.k8s import healthy_spec, wait_for
from hack.chaos import invariants as inv
from hack.chaos.scenarios.context import Ctx


def agent_death(ctx: Ctx) -> None:
    """Real agents are SIGKILLed: a healthy node turns Unknown within two heartbeats plus
    agentSilence.after; the silence action applies; a node that was out of service stays out; an
    agent killed while it writes a new fault and restarted still gets the node quarantined; a node
    whose report is deleted is not Healthy; a report from a clock an hour ahead does not keep a
    silent node Healthy."""
    heartbeat, after, probation = 2.0, 5.0, 10.0
    sets = ctx.n(3, 1)
    healthy, quarantined, recovering, cordoned, midwrite, gone = [], [], [], [], [], []
    for _ in range(sets):
        a, b, c, m, g = ctx.make_nodes(5)
        midwrite.append(m)
        gone.append(g)
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
    everyone = healthy + quarantined + recovering + cordoned + midwrite + gone
    fleet = ctx.agents(everyone, heartbeat=heartbeat)
    (ahead,) = ctx.make_nodes(1)
    ctx.go_quiet(ahead)  # no heartbeater: one report, from a clock an hour ahead, then silence
    future = (inv.now() + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    ctx.put_report(ahead, {**healthy_spec(), "heartbeatTime": future})
    ctx.fault(kind="agent_clock_ahead")
    ctx.operator()
    ctx.wait_states(everyone, lambda s: s.get("state") == "Healthy", 90, "agents report, all Healthy")
    # Agents SIGKILLed while they publish a new fault, then restarted: the fault must not be forgotten.
    # The kill lands at a random instant after the agent holds the XID (NVML delivered it, which the
    # fake library logs, and the agent journaled it): the window between NVML's one delivery and the
    # report write, where an agent without its local journal forgot the fault.
    for m in midwrite:
        agent = fleet[m]
        seq = agent.xid_seq + 1
        agent.inject_xid(gpu=5, code=79)

        def delivered(agent: Agent = agent, seq: int = seq) -> bool:
            return seq in agent.emitted()

        def journaled(agent: Agent = agent) -> bool:
            return any(e.get("xid") == 79 and e.get("gpu") == 5 for e in agent.journal())

        wait_for(delivered, 10, 0.002, f"NVML delivered the XID on {m}")
        wait_for(journaled, 10, 0.002, f"the agent on {m} holds the XID")
        time.sleep(ctx.rng.uniform(0.0, 0.02))  # the report write follows within milliseconds
        fleet[m].kill()
        fleet.launch(fleet[m])
    ctx.fault(len(midwrite), kind="gpu")
    ctx.fault(len(midwrite), kind="agent_kill")
    try:
        ctx.wait_states(
            midwrite, lambda s: s.get("state") == "Quarantined", 30, "fault survives an agent kill mid-write"
        )
    except AssertionError:
        states = ctx.statuses(midwrite)  # recorded; the scenario goes on
        for m in midwrite:
            if states.get(m, {}).get("state") != "Quarantined":
                ctx.violate(f"agent kill mid-write lost the fault on {m}: {states.get(m, {}).get('state')}")
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
    for g in gone:  # the agent is dead; now its report goes too
        ctx.retry(ctx.kube.custom.delete_cluster_custom_object, inv.GROUP, inv.VERSION, "gpunodehealths", g)
    ctx.fault(len(gone), kind="report_deleted")
    # Long past the probation: nothing on stale data may return to service.
    time.sleep(max(0.0, probation + after + 3 - (time.monotonic() - t0)))
    ctx.cycles += 1
    for n in healthy:
        ctx.expect[n] = "unknown"
    for n in quarantined + cordoned + midwrite:
        ctx.expect[n] = "out"
    for n in gone:
        ctx.expect[n] = "no_report"
    ctx.expect[ahead] = "unknown"
    for n in recovering:
        ctx.expect[n] = "out_of_service"
    ctx.stats["unknown_after_s"] = round(took, 1)
    ctx.note(
        f"{len(everyone)} agents SIGKILLed (heartbeat {heartbeat:.0f}s, agentSilence.after {after:.0f}s): healthy "
        f"nodes Unknown after {took:.1f}s (bound {bound:.0f}s); quarantined and on-probation nodes stayed out "
        f"of service past the {probation:.0f}s probation; silence action cordon quarantined its nodes"
    )
