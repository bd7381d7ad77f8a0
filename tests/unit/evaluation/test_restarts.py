"""Restart-loop detection (pure), and the operator's slim pod keeping every field it reads."""

from __future__ import annotations

from typing import Any

from gpuhealth.api.names import Signal
from gpuhealth.api.pods import failure
from gpuhealth.controller.state.slim import slim_pod as _slim_pod
from gpuhealth.evaluation.restarts import restart_loop_finding
from tests.unit.builders import NODE, at, iso, make_policy


def pod(
    name: str,
    node: str = NODE,
    rs: str = "web-abc",
    restarts: int = 0,
    finished: float | None = None,
    exit_code: int = 1,
    crashloop: bool = False,
    phase: str = "Running",
) -> dict[str, Any]:
    cs: dict[str, Any] = {
        "name": "c",
        "image": "registry.example.com/app:1.2.3",
        "imageID": "registry.example.com/app@sha256:" + "0" * 64,
        "containerID": "containerd://" + "f" * 64,
        "ready": not crashloop,
        "started": not crashloop,
        "restartCount": restarts,
        "state": {"running": {"startedAt": iso(-600)}},
    }
    if finished is not None:
        term = {"exitCode": exit_code, "reason": "Error", "finishedAt": iso(finished), "startedAt": iso(-900)}
        cs["lastState"] = {"terminated": term}
    if crashloop:
        waiting = {"reason": "CrashLoopBackOff", "message": "back-off 5m0s restarting failed container"}
        cs["state"] = {"waiting": waiting}
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "ownerReferences": [{"kind": "ReplicaSet", "name": rs, "controller": True}],
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 2000 + "}"},
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
        },
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "app"}]},
        "status": {"phase": phase, "startTime": iso(-1000), "containerStatuses": [cs], "podIP": "10.0.0.1"},
    }


def test_failure_counts_recent_nonzero_exits_and_crashloops() -> None:
    now = at(0)
    assert failure(pod("ok"), now, 900) is None
    assert failure(pod("a", restarts=4, finished=-60), now, 900) == (4, at(-60))
    assert failure(pod("old", restarts=4, finished=-1000), now, 900) is None, "outside the window"
    assert failure(pod("clean", restarts=4, finished=-60, exit_code=0), now, 900) is None, "exit 0 is no failure"
    assert failure(pod("cl", restarts=2, crashloop=True), now, 900) == (2, now)
    assert failure(pod("f", phase="Failed"), now, 1200) == (1, at(-1000)), "a failed pod counts from its start"
    assert failure(pod("f", phase="Failed"), now, 900) is None


def test_two_workloads_failing_here_but_fine_elsewhere_point_at_the_node() -> None:
    policy = make_policy()
    here = [pod("a-1", rs="a-1", restarts=5, finished=-30), pod("b-1", rs="b-1", restarts=3, finished=-10)]
    elsewhere = [pod("a-2", node="other", rs="a-1"), pod("b-2", node="other", rs="b-1")]
    workloads = {"default/ReplicaSet=a-1": [here[0], elsewhere[0]], "default/ReplicaSet=b-1": [here[1], elsewhere[1]]}
    f = restart_loop_finding(policy, NODE, here, workloads, at(0))
    assert f is not None and f.signal == Signal.RESTART_LOOP and f.since == at(-30)
    assert "2 workloads keep failing" in f.detail
    # One workload is not enough (minWorkloads 2), nor is a workload failing everywhere.
    assert restart_loop_finding(policy, NODE, here[:1], workloads, at(0)) is None
    failing_everywhere = {k: [p for p in v if p["spec"]["nodeName"] == NODE] for k, v in workloads.items()}
    assert restart_loop_finding(policy, NODE, here, failing_everywhere, at(0)) is None
    assert restart_loop_finding(make_policy({"restartLoop": {"enabled": False}}), NODE, here, workloads, at(0)) is None


def test_slim_pod_keeps_what_detection_and_drains_read_and_drops_the_bulk() -> None:
    full = pod("a", restarts=5, finished=-30)
    slim = _slim_pod(full)
    assert failure(slim, at(0), 900) == failure(full, at(0), 900)
    assert failure(_slim_pod(pod("cl", restarts=2, crashloop=True)), at(0), 900) == (2, at(0))
    assert list(slim["metadata"]["ownerReferences"]) == full["metadata"]["ownerReferences"]  # a tuple of leaves
    assert "managedFields" not in slim["metadata"]
    assert "kubectl.kubernetes.io/last-applied-configuration" not in (slim["metadata"].get("annotations") or {})
    assert set(slim["status"]["containerStatuses"][0]) <= {"restartCount", "state", "lastState"}
    assert _slim_pod(slim) == slim, "slimming twice changes nothing"
