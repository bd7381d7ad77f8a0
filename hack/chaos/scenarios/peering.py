"""Scenario: two replicas with Kopf peering."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from devkit.audit import audit_events
from devkit.cluster import REPO
from devkit.k8s import OperatorProcess, healthy_spec, wait_for
from hack.chaos import invariants as inv
from hack.chaos.scenarios.cluster import FALLBACK_CRD, FALLBACK_OBJECT, IDENTITIES, PEERING_CRD, PEERING_OBJECT
from hack.chaos.scenarios.common import SILENCE
from hack.chaos.scenarios.context import Ctx, xid


def _apply_peering(ctx: Ctx) -> str:
    """Kopf's ClusterKopfPeering CRD and the `gpuhealth` object: the manifests' own, else a fallback."""
    ours = PEERING_CRD.exists() and PEERING_OBJECT.exists()
    crd, obj = (PEERING_CRD, PEERING_OBJECT) if ours else (FALLBACK_CRD, FALLBACK_OBJECT)
    ctx.cluster.apply(crd)
    ctx.cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/clusterkopfpeerings.kopf.dev")
    ctx.cluster.apply(obj)
    return str(obj.relative_to(REPO))


def _writes_by(ctx: Ctx, user: str, since: dt.datetime, until: dt.datetime | None = None) -> list[dict[str, Any]]:
    """Mutating requests of one replica, other than Kopf's own peering keep-alives."""
    out = []
    for e in audit_events(ctx.cluster.audit_log, [user], since):
        if e.get("verb") not in ("create", "update", "patch", "delete"):
            continue
        if (e.get("objectRef") or {}).get("resource") == "clusterkopfpeerings":
            continue
        t = inv.parse_time(e.get("requestReceivedTimestamp"))
        if until is not None and t is not None and t > until:
            continue
        out.append(e)
    return out


def _describe(entries: list[dict[str, Any]], limit: int = 6) -> str:
    kinds: dict[str, int] = {}
    for e in entries:
        ref = e.get("objectRef") or {}
        k = f"{e.get('verb')} {ref.get('resource')}{'/' + ref['subresource'] if ref.get('subresource') else ''}"
        kinds[k] = kinds.get(k, 0) + 1
    return ", ".join(f"{n}x {k}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])[:limit])


def _paused(ctx: Ctx, replica: str) -> bool:
    """Whether the replica's reconciler last said it is paused (it logs each switch)."""
    text = (ctx.workdir / f"operator-{replica}.log").read_text(errors="replace")
    acting, paused = text.rfind("acting (this replica leads)"), text.rfind("paused: not acting")
    return paused > acting or acting < 0


def _acting_since(ctx: Ctx, replica: str, offset: int) -> bool:
    """Whether the replica logged that it leads after byte ``offset`` of its (appended) log."""
    with open(ctx.workdir / f"operator-{replica}.log", "rb") as f:
        f.seek(offset)
        return b"acting (this replica leads)" in f.read()


def _kill_at_takeover(ctx: Ctx, standby: OperatorProcess, leader: OperatorProcess, name: str, node: str) -> None:
    """The dead replica comes back as a standby and is SIGKILLed the instant it says it leads (it has
    resynced and starts acting): either at once, its peering priority being the higher, or when the
    leader is SIGKILLed with a fault pending. Whoever is left (or the standby, restarted with a random
    priority, above its dead self's 0) must then handle the fault, once."""
    log = ctx.workdir / f"operator-{name}.log"
    offset = log.stat().st_size
    # Which way, by the scenario's seed: a priority above any random one (1..1e6), or below.
    high = ctx.rng.random() < 0.5
    plain = list(standby.extra_args)
    standby.extra_args = [*plain, f"--priority={1_000_001 if high else 0}"]
    standby.start(wait=False)
    standby.extra_args = plain  # restarts get a random priority again
    t0 = time.monotonic()
    try:
        wait_for(lambda: _acting_since(ctx, name, offset), timeout=8, interval=0.02, what="takeover by priority")
        how = "priority"
    except AssertionError:
        how = "leader killed"
        ctx.put_report(node, healthy_spec(xids=[xid(79, gpu=3)]))
        ctx.fault(kind="gpu")
        leader.kill()
        ctx.fault(kind="operator_kill")
        t0 = time.monotonic()
        try:
            wait_for(lambda: _acting_since(ctx, name, offset), timeout=90, interval=0.02, what="the standby leads")
        except AssertionError:
            ctx.violate(f"replica {name} did not start acting within 90s of the leader's SIGKILL")
            return
    standby.kill()
    killed = time.monotonic()
    ctx.fault(kind="operator_kill")
    ctx.stats["takeover"] = how
    ctx.stats["takeover_killed_after_s"] = round(killed - t0, 2)
    if how == "priority":
        # The old leader, paused by the newcomer, must resume once the dead one's keep-alive expires.
        ctx.put_report(node, healthy_spec(xids=[xid(79, gpu=3)]))
        ctx.fault(kind="gpu")
    else:
        standby.start()
    try:
        ctx.wait_states([node], lambda s: s.get("state") == "Quarantined", 120, "after the killed takeover", 0.5)
        ctx.stats["after_killed_takeover_s"] = round(time.monotonic() - killed, 1)
    except AssertionError:
        ctx.violate(f"{node}: not quarantined within 120s after the new leader was SIGKILLed at its takeover")


def peering(ctx: Ctx) -> None:
    """Two replicas with Kopf peering: exactly one may act, killing the active one hands over within
    60 s without double actions, and so does killing the new leader at the instant it takes over."""
    source = _apply_peering(ctx)
    nodes = ctx.make_nodes(4)
    ctx.policy(
        {
            "rules": {"xid": {"overrides": [{"code": 79, "action": "cordon"}]}, "agentSilence": {"after": SILENCE}},
            "safety": {"maxUnhealthy": "100%", "probation": "3s"},
        }
    )
    for n in nodes:
        ctx.put_report(n, healthy_spec())
    a = ctx.operator("a", ["--peering=gpuhealth"])
    ctx.wait_states(nodes, lambda s: s.get("state") == "Healthy", 60, "Healthy under replica a")
    b = ctx.operator("b", ["--peering=gpuhealth"])
    time.sleep(3.0)  # both have seen each other's keep-alive
    paused = {k: _paused(ctx, k) for k in ("a", "b")}
    ctx.stats["paused_after_both_started"] = paused
    both_since = inv.now()

    # A fault while both replicas run; and a node whose probation ends while both run (time-driven,
    # which no watch event announces).
    ctx.put_report(nodes[0], healthy_spec(xids=[xid(79, gpu=1)]))
    ctx.fault(kind="gpu")
    handled = True
    try:
        ctx.wait_states([nodes[0]], lambda s: s.get("state") == "Quarantined", 15, "fault handled by a replica")
    except AssertionError:
        handled = False
        ctx.violate(
            "with both replicas running, a new fault was not handled within 15s: Kopf pauses every replica of "
            f"equal priority (paused: {paused}) and gpuhealth-operator has no way to set a peering priority"
        )
    time.sleep(4.0)  # the sweepers of both replicas keep running
    until = inv.now()
    writes = {k: _writes_by(ctx, IDENTITIES[k][1], both_since, until) for k in ("a", "b")}
    acting = [k for k, w in writes.items() if w]
    ctx.stats["writes_while_both_ran"] = {k: len(w) for k, w in writes.items()}
    if len(acting) > 1:
        ctx.violate(
            "both replicas wrote while both were running (Kopf paused their watches, not their reconcilers): "
            + "; ".join(f"replica {k}: {_describe(w)}" for k, w in writes.items())
        )
    for k in ("a", "b"):
        if paused[k] and writes[k]:
            ctx.violate(f"replica {k} is paused by Kopf peering but kept writing: {_describe(writes[k])}")

    # Kill the active one (or a, if neither acted) and time the handover.
    victim = acting[0] if len(acting) == 1 else "a"
    survivor = "b" if victim == "a" else "a"
    (a if victim == "a" else b).kill()
    ctx.fault(kind="operator_kill")
    ctx.put_report(nodes[1], healthy_spec(xids=[xid(79, gpu=2)]))
    ctx.fault(kind="gpu")
    try:
        handover = ctx.wait_states([nodes[1]], lambda s: s.get("state") == "Quarantined", 90, "handover", 0.5)
        ctx.stats["handover_s"] = round(handover, 1)
        if handover > 60:
            ctx.violate(f"handover took {handover:.1f}s after SIGKILL of the active replica (limit 60s)")
    except AssertionError:
        ctx.violate(f"replica {survivor} did not take over within 90s of the active replica's SIGKILL")
    if not handled:
        ctx.wait_states([nodes[0]], lambda s: s.get("state") == "Quarantined", 30, "first fault handled late")
    ops = {"a": a, "b": b}
    _kill_at_takeover(ctx, ops[victim], ops[survivor], victim, nodes[2])
    # No double actions, whoever acted. The fault handled across the killed takeover may have lost
    # an Event to the SIGKILL (they are posted after the status write), never doubled one.
    time.sleep(3.0)
    events = inv.operator_events(ctx)
    for i, n in enumerate(nodes[:3]):
        q = inv.events_on(events, n, "Quarantined")
        acts = inv.events_on(events, n, "GPUHealthAction")
        instances = {e.get("reportingInstance") for e in q + acts}
        lost_ok = i == 2 and len(q) <= 1 and len(acts) <= 1
        if (len(q) != 1 or len(acts) != 1) and not lost_ok:
            ctx.violate(
                f"{n}: {len(q)} Quarantined and {len(acts)} GPUHealthAction Events for one fault "
                f"(instances {sorted(i or '' for i in instances)})"
            )
    ctx.cycles += 1
    ctx.expect.update({nodes[0]: "out", nodes[1]: "out", nodes[2]: "out", nodes[3]: "healthy"})
    ctx.note(
        f"peering objects from {source}; paused after both started: {paused}; writes while both ran: "
        f"{ctx.stats['writes_while_both_ran']}; handover after SIGKILL of {victim}: {ctx.stats.get('handover_s')}s; "
        f"new leader SIGKILLed {ctx.stats.get('takeover_killed_after_s')}s into the next takeover "
        f"({ctx.stats.get('takeover')}), fault handled "
        f"{ctx.stats.get('after_killed_takeover_s')}s after that SIGKILL"
    )
