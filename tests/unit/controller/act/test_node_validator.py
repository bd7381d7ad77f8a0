"""The node validator (controller/act/node_validator.py) through the node pipeline, with the in-memory
fake API: a new node's burn-in record is written before gpuhealth's taint and before its Job, a
restart creates the recorded Job once, a pass lifts only gpuhealth's taint, the batch size holds,
and Paused and DryRun run nothing."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpuhealth.api.names import BURN_IN_TAINT_KEY
from tests.unit.builders import gpu, report_obj
from tests.unit.controller.act._device_support import Clock, runtime
from tests.unit.fake_kube import FakeKube, _error

NS = "gpuhealth-remediation"
BURN_IN = {
    "safety": {"probation": "2s"},
    "remediation": {"enabled": True},
    "validation": {"enabled": True, "newNodes": {"enabled": True, "batchSize": 1}},
}
PASS = json.dumps({"DCGM Diagnostic": {"test_categories": []}, "Overall Result": "Pass"})


def fleet(policy: dict[str, Any], nodes: tuple[str, ...] = ("n1",), kube: FakeKube | None = None) -> FakeKube:
    kube = kube or FakeKube()
    kube.add_policy("p", policy)
    for n in nodes:
        kube.add_node(n)
        kube.add_report(report_obj(name=n))
    return kube


def nv(kube: FakeKube, node: str = "n1") -> dict[str, Any]:
    return dict((kube.reports[node].get("status") or {}).get("nodeValidation") or {})


def taints(kube: FakeKube, node: str = "n1") -> list[str]:
    return [t["key"] for t in kube.nodes[node]["spec"].get("taints") or []]


def end_pod(kube: FakeKube, job: str, node: str, message: str, code: int = 0) -> None:
    """What the Job controller and the kubelet leave once the diagnostic ended."""
    kube.finish_job(NS, job, "Complete" if code == 0 else "Failed")
    kube.pods[NS, f"{job}-pod"] = {
        "metadata": {"name": f"{job}-pod", "namespace": NS, "labels": {"job-name": job}},
        "spec": {"nodeName": node},
        "status": {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [{"state": {"terminated": {"exitCode": code, "message": message}}}],
        },
    }


async def passes(kube: FakeKube, clock: Clock, nodes: tuple[str, ...] = ("n1",), n: int = 1) -> None:
    rt = await runtime(kube, clock, slices=None)
    for _ in range(n):
        for node in nodes:
            await rt.reconciler.reconcile(node)
        clock.t += dt.timedelta(seconds=1)
    await rt.events.flush()


def test_a_new_node_is_held_its_record_first_then_its_job_and_a_pass_lifts_only_gpuhealths_taint() -> None:
    kube = fleet(BURN_IN)
    kube.nodes["n1"]["spec"]["taints"] = [{"key": "example.com/other", "effect": "NoSchedule"}]
    clock = Clock()
    asyncio.run(passes(kube, clock, n=3))
    assert nv(kube)["trigger"] == "BurnIn" and nv(kube)["held"] is True and nv(kube)["result"] == "Running"
    assert set(taints(kube)) == {"example.com/other", BURN_IN_TAINT_KEY}
    # Healthy (nothing wrong is known) yet held: no GPU of it is in service (kubectl get gpunodes).
    status = kube.reports["n1"]["status"]
    assert status["state"] == "Healthy" and status["inServiceGPUs"] == 0 and status["totalGPUs"] == 8
    ((ns, job),) = kube.jobs
    assert nv(kube)["job"] == f"{ns}/{job}" and nv(kube)["created"] is True
    writes = [w for w in kube.writes if w[1] in ("report/n1/status", "node/n1") or w[1].startswith("job/")]
    held_at = writes.index(("patch", "node/n1"))
    assert writes[held_at - 1] == ("patch", "report/n1/status"), "the record before the taint"
    created = writes.index(next(w for w in writes if w[0] == "create"))
    assert writes[created - 1] == ("patch", "report/n1/status"), "the record before the Job"
    end_pod(kube, job, "n1", PASS)
    asyncio.run(passes(kube, clock, n=2))
    assert nv(kube)["result"] == "Passed" and not nv(kube).get("held")
    assert taints(kube) == ["example.com/other"], "only gpuhealth's taint is lifted"
    assert kube.reports["n1"]["status"]["inServiceGPUs"] == 8, "in service once the hold is lifted"
    assert "BurnInHeld" in kube.reasons("n1") and "BurnInPassed" in kube.reasons("n1")
    assert len(kube.jobs) == 1


class KilledCreate(FakeKube):
    """The process dies right after the record names the Job: the first create never reaches the API."""

    killed = False

    def create_job(self, namespace: str, body: Any) -> dict[str, Any]:
        if not self.killed:
            self.killed = True
            raise RuntimeError("SIGKILL")
        return super().create_job(namespace, body)


def test_a_restart_creates_the_recorded_burn_in_job_once() -> None:
    kube = fleet(BURN_IN, kube=KilledCreate())
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock, slices=None)
        for _ in range(3):
            try:
                await rt.reconciler.reconcile("n1")
            except RuntimeError:
                break
            clock.t += dt.timedelta(seconds=1)
        assert nv(kube)["job"] and not nv(kube).get("created") and not kube.jobs
        for _ in range(2):  # two restarts: the first creates the recorded Job, the second finds it
            await passes(kube, clock, n=2)

    asyncio.run(body())
    assert len(kube.jobs) == 1 and f"{NS}/{next(iter(kube.jobs))[1]}" == nv(kube)["job"]
    assert nv(kube)["created"] is True


def test_the_batch_size_bounds_the_burn_ins_running_at_once() -> None:
    nodes = ("n1", "n2", "n3")
    kube = fleet(BURN_IN, nodes)
    clock = Clock()
    asyncio.run(passes(kube, clock, nodes, n=3))
    assert all(BURN_IN_TAINT_KEY in taints(kube, n) for n in nodes), "all held at once"
    assert len(kube.jobs) == 1, "batchSize 1"
    assert sorted(nv(kube, n)["result"] for n in nodes) == ["Pending", "Pending", "Running"]
    blocked = [e["message"] for e in kube.events if e["reason"] == "RemediationBlocked"]
    assert blocked and all("batchSize (1)" in m for m in blocked)
    ((_, job),) = kube.jobs
    first = next(n for n in nodes if nv(kube, n)["result"] == "Running")
    end_pod(kube, job, first, PASS)
    asyncio.run(passes(kube, clock, nodes, n=2))
    assert nv(kube, first)["result"] == "Passed" and len(kube.jobs) == 2
    assert sorted(nv(kube, n)["result"] for n in nodes) == ["Passed", "Pending", "Running"]


def test_paused_and_dry_run_run_nothing_and_dry_run_says_what_it_would() -> None:
    paused = fleet({**BURN_IN, "mode": "Paused"})
    asyncio.run(passes(paused, Clock(), n=3))
    assert not paused.jobs and not nv(paused) and not taints(paused)
    dry = fleet({**BURN_IN, "mode": "DryRun"})
    asyncio.run(passes(dry, Clock(), n=3))
    assert not dry.jobs and not taints(dry)
    assert nv(dry)["dryRun"] is True and nv(dry)["result"] == "Pending"
    assert dry.reasons("n1").count("BurnInDryRun") == 1


def test_burn_in_off_by_default_holds_nothing() -> None:
    kube = fleet({**BURN_IN, "validation": {"enabled": True}})
    asyncio.run(passes(kube, Clock(), n=3))
    assert not kube.jobs and not nv(kube) and not taints(kube)


RELEASE = {
    "safety": {"probation": "2s"},
    "remediation": {"enabled": True},
    "validation": {"enabled": True, "maxConcurrent": 1},
}
FAIL = json.dumps(
    {
        "DCGM Diagnostic": {
            "test_categories": [
                {
                    "category": "Integration",
                    "tests": [
                        {
                            "name": "pcie",
                            "results": [
                                {"entity_id": 5, "status": "Fail", "warnings": [{"warning": "x8", "error_id": 46}]}
                            ],
                        }
                    ],
                }
            ]
        },
        "Overall Result": "Fail",
    }
)


def awaiting_repair(nodes: tuple[str, ...] = ("n1",), kube: FakeKube | None = None) -> FakeKube:
    kube = fleet(RELEASE, nodes, kube)
    for n in nodes:
        kube.reports[n]["status"] = {
            "policy": "p",
            "state": "AwaitingRepair",
            "reason": "NodeRebootRequested",
            "since": "2026-01-01T00:00:00Z",
            "drainAction": "repair",
            "drained": True,
        }
        kube.nodes[n]["metadata"]["annotations"] = {"gpuhealth.dev/release": "rebooted"}
    return kube


def test_a_released_node_waits_for_its_validation_and_a_failure_sends_it_back_with_the_findings() -> None:
    kube = awaiting_repair()
    clock = Clock()
    asyncio.run(passes(kube, clock, n=1))
    assert nv(kube)["trigger"] == "Release" and nv(kube)["result"] == "Pending"
    assert kube.reports["n1"]["status"]["state"] == "Recovering" and not kube.jobs
    asyncio.run(passes(kube, clock, n=6))  # well past the 2s probation: still no return, it is validating
    assert kube.reports["n1"]["status"]["state"] == "Recovering"
    ((_, job),) = kube.jobs
    body = kube.jobs[NS, job]
    env = {e["name"]: e["value"] for e in body["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GPU"] == "0,1,2,3,4,5,6,7"
    end_pod(kube, job, "n1", FAIL, code=1)
    asyncio.run(passes(kube, clock, n=2))
    status = kube.reports["n1"]["status"]
    assert status["state"] == "AwaitingRepair" and "DCGM error 46" in status["message"]
    assert nv(kube)["result"] == "Failed" and "DCGM error 46" in nv(kube)["findings"]
    assert len(kube.jobs) == 1
    assert "ValidationFailed" in kube.reasons("n1")


def test_a_released_node_returns_once_its_validation_passes_under_the_shared_limit() -> None:
    nodes = ("n1", "n2")
    kube = awaiting_repair(nodes)
    clock = Clock()
    asyncio.run(passes(kube, clock, nodes, n=4))
    assert len(kube.jobs) == 1, "spec.validation.maxConcurrent 1 across the policy's nodes"
    ((_, job),) = kube.jobs
    first = next(n for n in nodes if nv(kube, n)["result"] == "Running")
    end_pod(kube, job, first, PASS)
    asyncio.run(passes(kube, clock, nodes, n=3))
    assert kube.reports[first]["status"]["state"] == "Healthy" and nv(kube, first)["result"] == "Passed"
    assert len(kube.jobs) == 2
    assert "ReturnedToService" in kube.reasons(first)


def test_remediation_switched_off_lifts_gpuhealths_burn_in_hold() -> None:
    kube = fleet(BURN_IN)
    clock = Clock()
    asyncio.run(passes(kube, clock, n=1))
    assert BURN_IN_TAINT_KEY in taints(kube)
    kube.policies["p"]["spec"] = {**BURN_IN, "remediation": {"enabled": False}}
    asyncio.run(passes(kube, clock, n=2))
    assert BURN_IN_TAINT_KEY not in taints(kube) and not nv(kube).get("held")


def test_a_node_mixing_mig_modes_runs_no_job_and_says_which_gpus_are_which() -> None:
    """DCGM refuses MIG-enabled and disabled GPUs in one run: the burn-in holds and waits, once said."""
    kube = FakeKube()
    kube.add_policy("p", BURN_IN)
    kube.add_node("n1")
    mixed = [gpu(i, migMode="Enabled" if i == 1 else "Disabled") for i in range(8)]
    kube.add_report(report_obj(name="n1", devices=mixed))
    clock = Clock()
    asyncio.run(passes(kube, clock, n=4))
    assert not kube.jobs and taints(kube) == [BURN_IN_TAINT_KEY]
    waits = [e["message"] for e in kube.events if e["reason"] == "RemediationBlocked"]
    assert len(waits) == 1 and "MIG is enabled on GPU 1 and not on GPU 0, 2, 3, 4, 5, 6, 7" in waits[0]


class Snapshots(FakeKube):
    """Every state of the node's status a reader could have seen, one per status write."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str]] = []

    def patch_report_status(self, name: str, body: Any) -> dict[str, Any]:
        out = super().patch_report_status(name, body)
        status = self.reports[name].get("status") or {}
        self.seen.append((str(status.get("state")), str((status.get("nodeValidation") or {}).get("result"))))
        return out


def test_a_verdict_lands_in_the_same_write_as_the_state_it_decides() -> None:
    """No reader sees a node Healthy beside its validation still Running (CI caught that window on
    the real control plane), nor AwaitingRepair beside it: the two are one status patch."""
    for diagnostic, code, state, result in ((PASS, 0, "Healthy", "Passed"), (FAIL, 1, "AwaitingRepair", "Failed")):
        snap = Snapshots()
        awaiting_repair(kube=snap)
        clock = Clock()
        asyncio.run(passes(snap, clock, n=4))
        ((_, job),) = snap.jobs
        assert nv(snap)["result"] == "Running"
        end_pod(snap, job, "n1", diagnostic, code)
        asyncio.run(passes(snap, clock, n=4))
        assert snap.reports["n1"]["status"]["state"] == state and nv(snap)["result"] == result
        after = snap.seen[snap.seen.index(("Recovering", "Running")) :]
        assert (state, "Running") not in after, after
        assert after[after.index((state, result)) - 1] == ("Recovering", "Running"), after


class Forbidden(FakeKube):
    """The remediation namespace refuses Jobs (an RBAC or quota error), until someone fixes it."""

    refuse = True

    def create_job(self, namespace: str, body: Any) -> dict[str, Any]:
        if self.refuse:
            raise _error(403)
        return super().create_job(namespace, body)


def test_a_refused_job_is_said_once_raised_and_created_under_the_same_name_once_allowed() -> None:
    kube = Forbidden()
    fleet(BURN_IN, kube=kube)
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock, slices=None)
        for _ in range(3):
            with contextlib.suppress(ApiException):
                await rt.reconciler.reconcile("n1")
            clock.t += dt.timedelta(seconds=1)
        await rt.events.flush()

    asyncio.run(body())
    assert not kube.jobs and nv(kube)["job"] and not nv(kube).get("created")
    blocked = [e["message"] for e in kube.events if e["reason"] == "RemediationBlocked"]
    assert len(blocked) == 1 and f"could not be created in {NS}: 403" in blocked[0], blocked
    kube.refuse = False
    asyncio.run(passes(kube, clock, n=2))
    assert len(kube.jobs) == 1 and f"{NS}/{next(iter(kube.jobs))[1]}" == nv(kube)["job"]
    assert nv(kube)["created"] is True


class _FirstStatusWriteConflicts(FakeKube):
    """The agent's write wins the race with the node's first decision: that status write gets a 409."""

    conflicted = False

    def patch_report_status(self, name: str, patch: Any) -> dict[str, Any]:
        if not self.conflicted:
            self.conflicted = True
            raise ApiException(status=409, reason="Conflict")
        return super().patch_report_status(name, patch)


def test_a_conflict_on_a_new_nodes_first_decision_still_burns_it_in() -> None:
    """The 409 re-reads the report (no status yet) and decides again: the node is still new, so it is
    held and burned in, not returned Healthy unvalidated (the chaos burn-in scenario caught it)."""
    kube = _FirstStatusWriteConflicts()
    fleet(BURN_IN, kube=kube)
    asyncio.run(passes(kube, Clock(), n=2))
    assert kube.conflicted and nv(kube)["trigger"] == "BurnIn" and BURN_IN_TAINT_KEY in taints(kube)
