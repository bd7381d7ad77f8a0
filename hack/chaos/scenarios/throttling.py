"""Scenario: a fault storm on an API server that refuses most requests (429)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from devkit.audit import audit_events
from devkit.k8s import Kube, healthy_spec
from hack.chaos import invariants as inv
from hack.chaos.scenarios.cluster import LOAD
from hack.chaos.scenarios.common import SILENCE
from hack.chaos.scenarios.context import Ctx, xid


def throttling(ctx: Ctx) -> None:
    """A storm of faults on an API server that refuses most requests (429): the operator backs off,
    completes, and does not busy-loop (its requests per node, from the audit log, stay bounded)."""
    count = ctx.n(20, 6)
    limit_per_node = 50
    nodes = ctx.make_nodes(count)
    ctx.policy(
        {
            "rules": {"xid": {"overrides": [{"code": 79, "action": "cordon"}]}, "agentSilence": {"after": SILENCE}},
            "safety": {"maxUnhealthy": "100%", "probation": "2s", "flapping": {"maxQuarantines": 100}},
        }
    )
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: ctx.put_report(n, healthy_spec()), nodes))
    ctx.operator()
    ctx.wait_states(nodes, lambda s: s.get("state") == "Healthy", 120, "all Healthy", interval=1.0)
    ns = ctx.namespace("load")
    load = Kube(ctx.cluster.kubeconfig_with_token(LOAD[0], ctx.workdir / "load.kubeconfig", LOAD[1]))
    blob = "x" * 900_000
    for i in range(8):
        ctx.retry(
            ctx.kube.core.create_namespaced_config_map, ns, {"metadata": {"name": f"big-{i}"}, "data": {"b": blob}}
        )
    since = inv.now()

    # Others keep the API server busy: slow LISTs of large objects hold the read slots, large writes the
    # mutating ones, so the operator's own requests are refused with 429 again and again.
    def reader(stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                load.core.list_namespaced_config_map(ns, _preload_content=False).data  # noqa: B018
            except Exception:
                time.sleep(0.01)

    def writer(stop: threading.Event) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                load.core.replace_namespaced_config_map(
                    f"big-{i % 8}", ns, {"metadata": {"name": f"big-{i % 8}"}, "data": {"b": blob[:-1] + str(i % 10)}}
                )
            except Exception:
                time.sleep(0.01)

    for i in range(ctx.n(5, 4)):
        ctx.background(reader, f"load-read-{i}")
    for i in range(3):
        ctx.background(writer, f"load-write-{i}")
    time.sleep(1.0)
    t0 = time.monotonic()
    with ThreadPoolExecutor(count) as pool:
        list(pool.map(lambda n: ctx.put_report(n, healthy_spec(xids=[xid(79, gpu=3)])), nodes))
    ctx.fault(count, kind="gpu")
    quarantine_s = ctx.wait_states(
        nodes, lambda s: s.get("state") == "Quarantined", 240, "storm quarantined", interval=1.0
    )
    with ThreadPoolExecutor(count) as pool:
        list(pool.map(lambda n: ctx.put_report(n, healthy_spec()), nodes))
    ctx.wait_states(nodes, lambda s: s.get("state") == "Healthy", 240, "storm cleared", interval=1.0)
    total_s = time.monotonic() - t0
    ctx.stop_background()
    time.sleep(2.0)  # a few idle sweeps, counted too
    entries = list(audit_events(ctx.cluster.audit_log, ctx.operator_users, since))
    codes: dict[str, int] = {}
    for e in entries:
        code = str((e.get("responseStatus") or {}).get("code"))
        codes[code] = codes.get(code, 0) + 1
    per_node = len(entries) / count
    ctx.cycles += 1
    ctx.stats.update(
        operator_requests=len(entries),
        requests_per_node=round(per_node, 1),
        responses=codes,
        storm_quarantined_s=round(quarantine_s, 1),
        storm_total_s=round(total_s, 1),
    )
    if per_node >= limit_per_node:
        ctx.violate(f"busy loop: {len(entries)} operator requests for {count} nodes ({per_node:.1f}/node >= 50)")
    throttled = codes.get("429", 0)
    if not throttled:
        ctx.note("the API server refused none of the operator's requests: throttling did not bite this run")

    def unposted() -> list[str]:
        events = inv.operator_events(ctx)
        return [
            f"{n}/{reason}"
            for n in nodes
            for reason in ("Quarantined", "ReturnedToService")
            if len(inv.events_on(events, n, reason)) != 1
        ]

    # Events are posted in the background and retried with growing delays: give the last ones time.
    deadline = time.monotonic() + 90
    while (lost := unposted()) and time.monotonic() < deadline:
        time.sleep(2)
    if lost:
        ctx.violate(
            f"Events lost under throttling: {len(lost)} of {2 * count} Quarantined/ReturnedToService Events "
            f"missing or repeated ({', '.join(lost[:4])}...); the operator log says 'could not post event'"
        )
    for n in nodes:
        ctx.expect[n] = "healthy"
    ctx.note(
        f"{count} nodes faulted at once and cleared: {len(entries)} operator requests ({per_node:.1f} per node, "
        f"limit {limit_per_node}), {throttled} answered 429; quarantined in {quarantine_s:.1f}s, done in {total_s:.1f}s"
    )
