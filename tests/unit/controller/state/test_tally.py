"""The store's per-policy tallies against a brute-force recount of the whole cache, after long
seeded random sequences of node, label, report, record and policy changes; and the breaker built
on them against the fleet-walking admission it replaced."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from gpuhealth.api.names import State
from gpuhealth.api.policy import Policy
from gpuhealth.api.status import Record
from gpuhealth.controller.act.policy_status import summarize
from gpuhealth.controller.state.breaker import Breaker
from gpuhealth.controller.state.store import Store
from gpuhealth.controller.state.tally import Tally

NODES = [f"n{i}" for i in range(12)]
POOLS = ["a", "b", "c"]
STATES = list(State)


def node(name: str, rng: random.Random) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.present": "true", "pool": rng.choice(POOLS)}
    if rng.random() < 0.3:
        labels["tier"] = "gold"
    if rng.random() < 0.2:
        labels["nvidia.com/gpu.count"] = str(rng.choice([4, 8]))
    status = {"capacity": {"nvidia.com/gpu": str(rng.choice([0, 4, 8]))}} if rng.random() < 0.9 else {}
    return {"metadata": {"name": name, "labels": labels}, "spec": {}, "status": status}


def report(name: str, rng: random.Random, rv: int) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": name, "resourceVersion": str(rv)}, "spec": {"nodeName": name}}
    if rng.random() < 0.8:
        devices = [
            {"index": i, "state": rng.choice(["InService", "Quarantined", "AwaitingRepair", None])}
            | ({"heldByBreaker": True} if rng.random() < 0.3 else {})
            | ({"reason": rng.choice(["NVLinkPeer", "XID79"])} if rng.random() < 0.5 else {})
            for i in range(rng.choice([0, 2, 8]))
        ]
        body["status"] = {
            "state": str(rng.choice(STATES)),
            "heldByBreaker": rng.random() < 0.2,
            "totalGPUs": rng.choice([0, 8, None]),
            "devices": devices,
        }
    return body


def policy(name: str, rng: random.Random) -> dict[str, Any]:
    selector = {"matchLabels": {"pool": rng.choice(POOLS)}} if rng.random() < 0.7 else {"matchLabels": {"tier": "gold"}}
    spec: dict[str, Any] = {"nodeSelector": selector, "priority": rng.choice([0, 10]), "maxUnhealthy": "50%"}
    if rng.random() < 0.1:
        spec["maxUnhealthy"] = "not a number"  # refused: its nodes fall to another policy, or none
    return {"metadata": {"name": name, "uid": f"uid-{name}", "generation": 1}, "spec": spec}


def recount(store: Store, p: Policy) -> Tally:
    """What the tally must equal: every cached node walked, as the breaker and status once did."""
    t = Tally()
    for name in store.nodes:
        winner, others = store.governing(name)
        if winner is p:
            rec = store.records.get(name)
            t.nodes += 1
            t.out += rec is not None and rec.out_of_service
            t.held += rec is not None and rec.held_by_breaker
            t.gpus += store.gpus_of(name)
            t.gpus_out += store.gpus_out(name)
            devices = ((store.reports.get(name) or {}).get("status") or {}).get("devices") or []
            # an entry without a state is in service (api/devices.py DeviceRecord.from_status)
            t.gpus_held += sum(1 for d in devices if d.get("heldByBreaker") and d.get("state") in ("InService", None))
            for d in devices:  # gpuhealth_devices and gpuhealth_peer_holds (controller/state/capacity.py)
                in_service = d.get("state") in ("InService", None)
                state = "InService" if in_service else d["state"]
                t.devices[state] = t.devices.get(state, 0) + 1
                t.peer_holds += not in_service and d.get("reason") == "NVLinkPeer"
            st = str((rec or Record()).state)
            t.counts[st] = t.counts.get(st, 0) + 1
            if rec is not None and rec.out_of_service:
                n = int(
                    (store.nodes[name]["metadata"].get("labels") or {}).get("nvidia.com/gpu.count")
                    or (store.nodes[name]["status"].get("capacity") or {}).get("nvidia.com/gpu")
                    or 0
                )
                if n:
                    t.gpus_by_state[st] = t.gpus_by_state.get(st, 0) + n
        elif winner is not None and p in others:
            t.overlaps[winner.name] = t.overlaps.get(winner.name, 0) + 1
    return t


def step(store: Store, rng: random.Random, i: int) -> None:
    name = rng.choice(NODES)
    roll = rng.random()
    if roll < 0.25:
        store.put_node(name, node(name, rng))
    elif roll < 0.32:
        store.forget_node(name)
    elif roll < 0.52:
        store.put_report(name, report(name, rng, i))
    elif roll < 0.58:
        store.reread_report(name, report(name, rng, i))
    elif roll < 0.64:
        store.wrote(name, report(name, rng, i))
    elif roll < 0.67:
        store.created(name, {"metadata": {"name": name, "resourceVersion": str(i)}, "spec": {}})
    elif roll < 0.72:
        store.drop_report(name)
    elif roll < 0.86:
        store.set_record(name, Record(state=rng.choice(STATES), held_by_breaker=rng.random() < 0.3, reason="XID79"))
    elif roll < 0.88:
        store.forget_records()
    elif roll < 0.96:
        pname = rng.choice(["p1", "p2", "p3"])
        store.put_policy(pname, policy(pname, rng))
    else:
        store.put_policy(rng.choice(["p1", "p2", "p3"]), None)


@pytest.mark.parametrize("seed", range(6))
def test_tallies_equal_a_brute_force_recount_after_random_changes(seed: int) -> None:
    rng = random.Random(seed)
    store = Store()
    seen_out = seen_overlap = False
    for i in range(400):
        step(store, rng, i)
        for p in store.policies.values():
            want = recount(store, p)
            assert store.tally(p) == want, f"seed {seed}, step {i}, policy {p.name}"
            view = summarize(store)[p.name]
            assert (view.nodes, view.counts, view.overlaps, view.gpus_out) == (
                want.nodes,
                want.counts,
                want.overlaps,
                want.gpus_out,
            )
            seen_out |= want.out > 0
            seen_overlap |= bool(want.overlaps)
    # The walk must have exercised what it claims: governed nodes, nodes out, overlaps.
    assert seen_out and seen_overlap, "the walk never had a node out of service, or never an overlap"


def test_a_superseded_policy_object_governs_nothing() -> None:
    store = Store()
    store.put_policy("p", {"metadata": {"name": "p"}, "spec": {}})
    old = store.policies["p"]
    store.put_node("n", {"metadata": {"name": "n", "labels": {}}, "status": {"capacity": {"nvidia.com/gpu": "8"}}})
    assert store.tally(old).nodes == 1
    store.put_policy("p", {"metadata": {"name": "p"}, "spec": {"priority": 5}})
    assert store.tally(old) == Tally()
    assert store.tally(store.policies["p"]).gpus == 8


async def walking_admit(store: Store, reserved: set[str], p: Policy, name: str) -> bool:
    """The admission the breaker made before tallies: every governed node's record, under the lock."""
    governed = [n for n in store.nodes if store.governing(n)[0] is p]
    out = {n for n in governed if (r := store.records.get(n)) is not None and r.out_of_service} | reserved
    out.discard(name)
    return len(out) + 1 <= p.breaker_limit(len(governed))


@pytest.mark.parametrize("seed", range(4))
def test_admission_answers_as_the_fleet_walk_did(seed: int) -> None:
    rng = random.Random(100 + seed)

    async def body() -> None:
        store = Store()
        breaker = Breaker(store)
        admitted = 0
        for i in range(300):
            step(store, rng, i)
            if not store.policies:
                continue
            name = rng.choice(NODES)
            p = store.governing(name)[0] or rng.choice(list(store.policies.values()))
            reserved = set(breaker._reserved.get(p.name, set()))
            want = await walking_admit(store, reserved, p, name)
            assert await breaker.admit(p, name) == want, f"seed {seed}, step {i}"
            admitted += want
            if rng.random() < 0.5:
                breaker.release(p, name)
        assert admitted > 0

    asyncio.run(body())


def test_put_policy_says_whether_what_the_policy_decides_changed() -> None:
    store = Store()
    body = {"metadata": {"name": "p", "generation": 1}, "spec": {}}
    assert store.put_policy("p", body).changed  # added
    assert not store.put_policy("p", {**body, "status": {"nodes": 4}}).changed  # its status, echoed
    assert store.put_policy("p", {"metadata": {"name": "p", "generation": 2}, "spec": {"priority": 5}}).changed
    bad = {"metadata": {"name": "p", "generation": 3}, "spec": {"mode": "Sometimes"}}
    refused = store.put_policy("p", bad)
    assert refused.changed and refused.error and "mode" in refused.error
    again = store.put_policy("p", {**bad, "status": {"nodes": 4}})
    assert not again.changed and again.error is None  # refused already: not announced twice
    assert store.put_policy("p", None).changed  # deleted
    assert not store.put_policy("p", None).changed
