"""The cache feeders and the store keep the Node cache true to the API: a deleted Node stays deleted."""

from __future__ import annotations

import asyncio
from typing import Any

from gpuhealth.api.names import CHECKPOINT_COMPLETED, State
from gpuhealth.api.pods import shows_failure
from gpuhealth.api.status import Record
from gpuhealth.controller.intake.feeders import _commands
from gpuhealth.controller.process.runtime import Runtime
from gpuhealth.controller.state.slim import slim_node
from tests.unit.builders import T0, make_policy
from tests.unit.fake_kube import FakeKube


def _node(rv: str, **status: Any) -> dict[str, Any]:
    """A Node as the watch brings it: the kubelet's heartbeat fields change with every update."""
    return {
        "metadata": {"name": "n1", "resourceVersion": rv, "labels": {"nvidia.com/gpu.present": "true"}},
        "spec": {},
        "status": {
            "capacity": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": f"2026-12-02T06:00:{rv}Z"}],
            **status,
        },
    }


def test_our_own_write_answered_after_a_deletion_does_not_bring_the_node_back() -> None:
    """A Node patch answered just before the Node was deleted can resume after the DELETED event: the
    answer must not cache the Node again (it would be passed, and fail, forever; its report kept)."""

    async def body() -> None:
        r = Runtime(FakeKube(), clock=lambda: T0, workers=1)
        node = _node("10")
        node["metadata"]["uid"] = "u1"
        r.on_node("ADDED", slim_node(node))
        answer = {**node, "metadata": {**node["metadata"], "resourceVersion": "11"}}
        r.store.reflect_node("n1", answer)  # still cached: reflected
        assert r.store.nodes["n1"]["metadata"]["resourceVersion"] == "11"
        r.on_node("DELETED", {"metadata": {"name": "n1"}})
        r.store.reflect_node("n1", answer)  # deleted meanwhile: not brought back
        assert "n1" not in r.store.nodes
        again = {**node, "metadata": {**node["metadata"], "uid": "u2"}}  # a new Node of the same name
        r.on_node("ADDED", slim_node(again))
        r.store.reflect_node("n1", answer)  # the old Node's answer does not replace the new one
        assert r.store.nodes["n1"]["metadata"]["uid"] == "u2"

    asyncio.run(body())


def _pod(rv: str, ip: str, restarts: int = 0) -> dict[str, Any]:
    return {
        "metadata": {"name": "p1", "namespace": "ns", "uid": "pu1", "resourceVersion": rv},
        "spec": {"nodeName": "n1"},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "containerStatuses": [{"name": "c", "restartCount": restarts, "state": {"running": {}}}],
        },
    }


def _queued(r: Runtime) -> set[str]:
    return set(r.queue._dirty)


def test_an_update_that_changes_nothing_a_pass_reads_queues_no_pass() -> None:
    """The kubelet's periodic Node status update and a pod's IP or condition change alter only what the
    slim copies drop: the cache takes the new resourceVersion, no pass is queued (the fleet probe:
    those passes were most of the CPU at 1,000 pod events/s). What a pass reads still queues one."""

    async def body() -> None:
        r = Runtime(FakeKube(), clock=lambda: T0, workers=1)
        r.on_node("ADDED", slim_node(_node("10")))
        r.on_pod("ADDED", _pod("20", "10.0.0.1"))
        assert _queued(r) == {"n1"}
        r.queue._dirty.clear()
        r.on_node("MODIFIED", slim_node(_node("11")))  # only Ready's heartbeat moved
        r.on_pod("MODIFIED", _pod("21", "10.0.0.2"))  # only the IP moved
        assert _queued(r) == set()
        assert r.store.nodes["n1"]["metadata"]["resourceVersion"] == "11"
        assert r.store.pods.on("n1")[0]["metadata"]["resourceVersion"] == "21"
        r.on_pod("MODIFIED", _pod("22", "10.0.0.2", restarts=1))  # restart-loop detection reads this
        assert _queued(r) == {"n1"}
        r.queue._dirty.clear()
        tainted = _node("12")
        tainted["spec"] = {"taints": [{"key": "k", "effect": "NoSchedule"}]}
        r.on_node("MODIFIED", slim_node(tainted))  # a taint someone else set: a pass reads it
        assert _queued(r) == {"n1"}

    asyncio.run(body())


def _settled(r: Runtime, state: State = State.HEALTHY, gpu_state: str = "InService") -> None:
    r.on_node("ADDED", slim_node(_node("10")))
    r.store.put_report(
        "n1",
        {
            "metadata": {"name": "n1", "resourceVersion": "5"},
            "spec": {},
            "status": {"state": str(state), "devices": [{"index": 0, "state": gpu_state, "uuid": "GPU-0"}]},
        },
    )
    r.store.set_record("n1", Record(state=state, since=T0))
    r.queue._dirty.clear()


def test_a_quiet_pod_arriving_or_leaving_on_a_settled_node_queues_no_pass() -> None:
    """On a Healthy node with every GPU in service and no drain, a pass reads the pods only for restart
    loops: a pod that shows no failure changes nothing, arriving or leaving. One that shows a failure
    does; so does any pod of a node that is not settled, or a deletion known only by name."""

    async def body() -> None:
        r = Runtime(FakeKube(), clock=lambda: T0, workers=1)
        _settled(r)
        r.on_pod("ADDED", _pod("20", "10.0.0.1"))
        r.on_pod("DELETED", _pod("21", "10.0.0.1"))
        assert _queued(r) == set()
        assert r.store.pods.on("n1") == []
        r.on_pod("ADDED", _pod("22", "10.0.0.1", restarts=1))
        assert _queued(r) == {"n1"}
        r.queue._dirty.clear()
        r.on_pod("DELETED", {"metadata": {"uid": "pu1"}, "spec": {"nodeName": "n1"}})  # from a relist
        assert _queued(r) == {"n1"}
        for state, gpu_state in ((State.QUARANTINED, "InService"), (State.HEALTHY, "Quarantined")):
            r = Runtime(FakeKube(), clock=lambda: T0, workers=1)
            _settled(r, state, gpu_state)
            r.on_pod("ADDED", _pod("20", "10.0.0.1"))
            assert _queued(r) == {"n1"}, (state, gpu_state)

    asyncio.run(body())


def _gang_pod(uid: str, node: str, rank: int, rv: str = "1", job: str = "train-a") -> dict[str, Any]:
    """A rank of an indexed Job (a gang: api/pods.py ``gang_key``), quiet (no restart, no failure)."""
    return {
        "metadata": {
            "name": f"{job}-{rank}",
            "namespace": "ns",
            "uid": uid,
            "resourceVersion": rv,
            "labels": {"batch.kubernetes.io/job-name": job, "batch.kubernetes.io/job-completion-index": str(rank)},
        },
        "spec": {"nodeName": node},
        "status": {"phase": "Running", "containerStatuses": [{"name": "c", "restartCount": 0}]},
    }


def test_a_draining_node_is_queued_by_its_own_and_its_gangs_pods_only() -> None:
    """A drain reads its own pods and their gangs' members elsewhere (drain/plan.py): a pod of an
    unrelated workload anywhere in the fleet queues no draining node (at 1,000 pod events/s those passes
    held the workers from the next fault's), its own pod's deletion does, and so does a change of a
    gang member on another node."""

    async def body() -> None:
        r = Runtime(FakeKube(), clock=lambda: T0, workers=1)
        for name in ("n1", "n2", "n3"):
            node = _node("10")
            node["metadata"]["name"] = name
            r.on_node("ADDED", slim_node(node), enqueue=False)
        r.store.set_record("n1", Record(state=State.DRAINING, since=T0))
        for name in ("n2", "n3"):
            r.store.put_report(name, {"metadata": {"name": name}, "spec": {}, "status": {"devices": []}})
            r.store.set_record(name, Record(state=State.HEALTHY, since=T0))
        assert await r.breaker.take_drain_slot(make_policy(), "n1")
        r.on_pod("ADDED", _gang_pod("a0", "n1", 0), enqueue=False)
        r.on_pod("ADDED", _gang_pod("a1", "n2", 1), enqueue=False)
        r.on_pod("ADDED", _gang_pod("b0", "n3", 0, job="train-b"), enqueue=False)
        r.on_pod("ADDED", _pod("1", "10.0.0.9") | {"spec": {"nodeName": "n3"}}, enqueue=False)
        assert _queued(r) == set()

        acked = _gang_pod("b0", "n3", 0, rv="2", job="train-b")
        acked["metadata"]["annotations"] = {CHECKPOINT_COMPLETED: "2025-01-01T12:00:00Z"}
        r.on_pod("MODIFIED", acked)  # a change a pass reads, of another gang on a settled node
        r.on_pod("DELETED", _pod("2", "10.0.0.9") | {"spec": {"nodeName": "n3"}})  # no gang, elsewhere
        r.on_pod("ADDED", _gang_pod("b1", "n2", 1, job="train-b"))  # another gang, on a settled node
        assert _queued(r) == set()

        r.on_pod("DELETED", _gang_pod("a1", "n2", 1, rv="3"))  # the draining node's gang member, elsewhere
        assert _queued(r) == {"n1"}
        r.queue._dirty.clear()
        r.on_pod("DELETED", {"metadata": {"uid": "a0"}, "spec": {"nodeName": "n1"}})  # its own pod, gone
        assert _queued(r) == {"n1"}

    asyncio.run(body())


def test_the_pod_index_names_the_nodes_of_a_gang_among_candidates_either_way() -> None:
    """``hosting`` walks the smaller side: a gang's members or the candidate nodes' pods; both agree."""
    r = Runtime(FakeKube(), clock=lambda: T0, workers=1)
    pods = r.store.pods
    for rank in range(6):
        pods.put(_gang_pod(f"a{rank}", f"n{rank % 3}", rank))
    pods.put(_gang_pod("b0", "n3", 0, job="train-b"))
    gang = "ns/Job=train-a"
    assert pods.hosting(gang, {"n0"}) == {"n0"}  # one candidate, six members: the candidates' pods
    assert pods.hosting(gang, {"n0", "n1", "n3", "n4", "n5", "n6", "n7"}) == {"n0", "n1"}  # the members
    assert pods.hosting(gang, {"n3"}) == set() and pods.hosting("ns/Job=none", {"n0"}) == set()
    change = pods.put(_gang_pod("a0", "n0", 0, rv="2", job="train-b"))  # moved to another gang
    assert change is not None and set(change.gangs) == {gang, "ns/Job=train-b"}


def test_shows_failure_reads_every_sign_restart_loops_count() -> None:
    ok = _pod("1", "ip")
    assert not shows_failure(ok)
    assert shows_failure(_pod("1", "ip", restarts=2))
    assert shows_failure({**ok, "status": {**ok["status"], "phase": "Failed"}})
    waiting = {"name": "c", "restartCount": 0, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
    assert shows_failure({**ok, "status": {"containerStatuses": [waiting]}})
    died = {"name": "c", "restartCount": 0, "lastState": {"terminated": {"exitCode": 1}}}
    assert shows_failure({**ok, "status": {"containerStatuses": [died]}})
    assert shows_failure({"metadata": {"uid": "u"}})  # no status: cannot tell


def test_the_sweep_pauses_for_the_loop_between_batches_and_skips_nodes_deleted_meanwhile() -> None:
    """At 100,000 nodes one sweep would hold the event loop for most of a second every tick: it yields
    every ``SWEEP_BATCH`` nodes, and a node deleted during a pause is not queued."""
    from gpuhealth.controller.process.runtime import SWEEP_BATCH

    async def body() -> None:
        r = Runtime(FakeKube(), clock=lambda: T0, workers=1)
        n = 2 * SWEEP_BATCH + 10
        for i in range(n):
            node = _node("10")
            node["metadata"]["name"] = f"n{i}"
            r.on_node("ADDED", slim_node(node), enqueue=False)  # no report, no record: time decides
        steps = r._sweep_steps()
        next(steps)  # paused after the first batch
        assert len(_queued(r)) == SWEEP_BATCH - 1
        r.on_node("DELETED", {"metadata": {"name": f"n{n - 1}"}}, enqueue=False)
        assert list(steps) == [None]  # one more pause, then done
        assert _queued(r) == {f"n{i}" for i in range(n - 1)}
        r.queue._dirty.clear()
        r.sweep()  # the synchronous form sweeps the same nodes
        assert _queued(r) == {f"n{i}" for i in range(n - 1)}

    asyncio.run(body())


def test_the_heap_is_frozen_once_the_start_up_pod_list_is_in() -> None:
    """The caches live as long as the fleet: once listed, they leave the cyclic collector's full
    passes (half a second of CPU at 10,000 nodes with the loop stopped, docs/scaling.md)."""
    import gc

    async def body() -> None:
        kube = FakeKube()
        kube.add_node("n1")
        kube.add_pod("ns", "p1", "n1")
        r = Runtime(kube, clock=lambda: T0, workers=1)
        r.store.pods.expect()
        gc.unfreeze()
        try:
            await r._list_pods()
            assert gc.get_freeze_count() > 0
            assert not r.store.pods.pending and len(r.store.pods.on("n1")) == 1
        finally:
            gc.unfreeze()

    asyncio.run(body())


def test_an_approval_that_names_its_approver_is_a_command_like_approve() -> None:
    """A person's approval (gpuhealth.dev/approver*, approval: TwoPerson) puts the node ahead of the
    backlog as approve and release do; a second person's, under their own key, as well."""
    plain = _node("1")
    alice = {**plain, "metadata": {**plain["metadata"], "annotations": {"gpuhealth.dev/approver-gpu-3.a-1": "alice"}}}
    both = {
        **plain,
        "metadata": {
            **plain["metadata"],
            "annotations": {"gpuhealth.dev/approver-gpu-3.a-1": "alice", "gpuhealth.dev/approver-gpu-3.b-2": "bob"},
        },
    }
    other = {**plain, "metadata": {**plain["metadata"], "annotations": {"example.com/note": "x"}}}
    assert _commands(alice) != _commands(plain) and _commands(both) != _commands(alice)
    assert _commands(other) == _commands(plain), "another annotation is no command"
