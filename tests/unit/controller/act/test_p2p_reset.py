"""P2P-aware repair through the node pipeline, with the in-memory fake API: on an 8-GPU NVSwitch node
a DrainAndReset GPU holds its 7 NVLink peers out with it, ONE reset Job runs once they are drained and
free, the peers come back at once and the GPU after its probation; a pod on a peer blocks the reset;
the group is one breaker decision; a restart neither creates a second Job nor loses a peer's hold;
peers unknown -> NodeReboot, said in an Event; gpuhealth_peer_holds counts the peers held."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
from typing import Any

from gpuhealth.controller import metrics
from gpuhealth.controller.process.runtime import Runtime
from gpuhealth.evaluation.peers import REREAD_TIMEOUT_S
from tests.unit.builders import gpu, report_obj, xid_event
from tests.unit.controller.act._device_support import Clock, claim, runtime
from tests.unit.fake_kube import FakeKube

NS = "gpuhealth-remediation"
POLICY = {"safety": {"maxUnhealthyGPUs": 8, "probation": "2s"}, "remediation": {"enabled": True}}
ALL = range(8)


def nvswitch(action: str = "DrainAndReset", peers: bool = True, seconds: float = 0.0) -> dict[str, Any]:
    """n1's report: every GPU reaches the 7 others over NVLink (``peers`` False: not known); GPU 3 asks
    for ``action`` after an XID 154."""

    def entry(i: int) -> dict[str, Any]:
        nvlink: dict[str, Any] = {"links": 18, "active": 18}
        if peers:
            nvlink["peers"] = [p for p in ALL if p != i]
        return gpu(i, nvlink=nvlink, **({"recoveryAction": action} if i == 3 else {}))

    return report_obj(
        name="n1", devices=[entry(i) for i in ALL], xids=[xid_event(154, -1, gpu_index=3)], heartbeat=seconds
    )


def setup(policy: dict[str, Any] | None = None, peers: bool = True, kube: FakeKube | None = None) -> FakeKube:
    kube = kube or FakeKube()
    kube.add_policy("p", policy or POLICY)
    kube.add_node("n1")
    kube.add_report(nvswitch(peers=peers))
    return kube


def devices(kube: FakeKube) -> dict[int, dict[str, Any]]:
    return {d["index"]: d for d in (kube.reports["n1"].get("status") or {}).get("devices", [])}


def ladder(kube: FakeKube, index: int = 3) -> dict[str, Any]:
    return dict((kube.reports["n1"].get("status") or {}).get("remediation", {}).get(str(index)) or {})


async def passes(rt: Runtime, clock: Clock, n: int) -> None:
    for _ in range(n):
        await rt.reconciler.reconcile("n1")
        clock.t += dt.timedelta(seconds=1)


def report_clean(kube: FakeKube, rt: Runtime, clock: Clock) -> None:
    """The agent's next reading after the reset: no recovery action any more (the XID stays in history)."""
    clean = nvswitch(action="None", seconds=(clock.t - Clock().t).total_seconds())
    kube.reports["n1"]["spec"] = clean["spec"]
    rt.on_report("MODIFIED", copy.deepcopy(kube.reports["n1"]), enqueue=False)


def test_peers_drained_one_reset_job_then_the_peers_and_the_gpu_come_back() -> None:
    kube = setup()
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await passes(rt, clock, 4)
        held = devices(kube)
        assert {i for i, d in held.items() if d["state"] != "InService"} == set(ALL)
        assert {held[i]["reason"] for i in ALL if i != 3} == {"NVLinkPeer"}
        assert len(kube.jobs) == 1
        ((ns, name),) = kube.jobs
        assert ns == NS and ladder(kube)["job"] == f"{NS}/{name}" and ladder(kube)["step"] == "GPUReset"
        assert kube.jobs[(ns, name)]["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] == "GPU-0003"
        kube.finish_job(ns, name, "Complete")
        report_clean(kube, rt, clock)
        await passes(rt, clock, 1)  # the pass that reads the Job's end: the peers were decided with it in flight
        assert all(devices(kube)[i]["state"] != "InService" for i in ALL)
        await passes(rt, clock, 1)
        back = devices(kube)
        assert {i for i, d in back.items() if d["state"] == "InService"} == set(ALL) - {3}, "peers back at once"
        await passes(rt, clock, 5)
        await rt.events.flush()

    asyncio.run(body())
    assert len(kube.jobs) == 1, "ONE reset Job, for the faulted GPU alone"
    assert all(d["state"] == "InService" for d in devices(kube).values())
    assert not kube.rules, "every rule gpuhealth wrote, the peers' too, is lifted by gpuhealth"
    reasons = kube.reasons("n1")
    assert reasons.count("GPUReset") == 1 and "RemediationSucceeded" in reasons
    assert reasons.count("PeerReturned") == 7


def test_a_pod_on_a_peer_blocks_the_reset() -> None:
    kube = setup()
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await passes(rt, clock, 3)  # every GPU drained (nobody held one): the reset would start now...
        kube.jobs.clear()
        kube.reports["n1"]["status"].pop("remediation", None)
        rt.on_report("MODIFIED", copy.deepcopy(kube.reports["n1"]), enqueue=False)
        kube.add_pod("ml", "late", "n1")  # ...but a pod grabbed peer GPU 5: in the API, not yet in the cache
        kube.claims = [claim("c5", "gpu-5", "late")]
        await passes(rt, clock, 4)
        await rt.events.flush()

    asyncio.run(body())
    assert not kube.jobs
    blocked = [e["message"] for e in kube.events if e["reason"] == "RemediationBlocked"]
    assert len(blocked) == 1 and "NVLink peer GPU 5" in blocked[0] and "ml/late" in blocked[0]


def test_the_group_is_one_breaker_decision() -> None:
    kube = setup({**POLICY, "safety": {"maxUnhealthyGPUs": 7, "probation": "2s"}})
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await passes(rt, clock, 3)
        await rt.events.flush()

    asyncio.run(body())
    assert all(d["state"] == "InService" for d in devices(kube).values()), "never a partial group"
    assert not kube.jobs and "QuarantineHeldBack" in kube.reasons("n1")


class KilledCreate(FakeKube):
    """The process dies right after the record is written: the first create never reaches the API."""

    killed = False

    def create_job(self, namespace: str, body: Any) -> dict[str, Any]:
        if not self.killed:
            self.killed = True
            raise RuntimeError("SIGKILL")
        return super().create_job(namespace, body)


def test_a_restart_creates_one_job_and_keeps_every_peer_held() -> None:
    kube = setup(kube=KilledCreate())
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        for _ in range(5):
            try:
                await rt.reconciler.reconcile("n1")
            except RuntimeError:
                break
            clock.t += dt.timedelta(seconds=1)
        assert ladder(kube)["phase"] == "Pending" and not kube.jobs
        for _ in range(2):  # two restarts: the first creates the recorded Job, the second finds it
            rt = await runtime(kube, clock)
            await passes(rt, clock, 2)
            assert all(d["state"] != "InService" for d in devices(kube).values()), "no peer's hold lost"

    asyncio.run(body())
    assert len(kube.jobs) == 1 and f"{NS}/{next(iter(kube.jobs))[1]}" == ladder(kube)["job"]
    assert ladder(kube)["attempt"] == 1 and ladder(kube)["phase"] == "Running"


def test_peers_unknown_take_the_node_to_a_reboot_and_say_why() -> None:
    kube = setup(peers=False)
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await passes(rt, clock, 4)
        await rt.events.flush()

    asyncio.run(body())
    assert not kube.jobs
    assert {i for i, d in devices(kube).items() if d["state"] != "InService"} == {3}
    assert ladder(kube)["step"] == "NodeReboot"
    unknown = [e["message"] for e in kube.events if e["reason"] == "PeersUnknown"]
    assert len(unknown) == 1 and "nvlink.peers" in unknown[0]


def test_drain_p2p_drains_the_group_then_follows_the_next_reading() -> None:
    kube = setup()
    kube.reports["n1"]["spec"] = nvswitch(action="DrainP2P")["spec"]
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await passes(rt, clock, 4)
        assert {i for i, d in devices(kube).items() if d["state"] == "Quarantined"} == set(ALL)
        assert not kube.jobs and not ladder(kube), "DrainP2P names no repair: nothing starts"
        assert (kube.reports["n1"]["status"].get("state")) == "Degraded", "the GPU's, not the node's"
        # The agent reads the field again: it now names a GPU reset, which needs no idle peers.
        then = nvswitch(action="Reset", seconds=(clock.t - Clock().t).total_seconds())
        kube.reports["n1"]["spec"] = then["spec"]
        rt.on_report("MODIFIED", copy.deepcopy(kube.reports["n1"]), enqueue=False)
        await passes(rt, clock, 3)
        await rt.events.flush()

    asyncio.run(body())
    assert len(kube.jobs) == 1 and ladder(kube)["step"] == "GPUReset"
    assert {i for i, d in devices(kube).items() if d["state"] != "InService"} == {3}, "the peers are back"
    waits = [e["message"] for e in kube.events if e["reason"] == "RemediationBlocked"]
    assert len(waits) == 1 and "DrainP2P" in waits[0] and "next reading" in waits[0]


def test_drain_p2p_still_unchanged_after_the_timeout_takes_the_conservative_reboot() -> None:
    kube = setup()
    kube.reports["n1"]["spec"] = nvswitch(action="DrainP2P")["spec"]
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await passes(rt, clock, 4)
        assert not ladder(kube)
        clock.t += dt.timedelta(seconds=REREAD_TIMEOUT_S + 1)
        still = nvswitch(action="DrainP2P", seconds=(clock.t - Clock().t).total_seconds())
        kube.reports["n1"]["spec"] = still["spec"]
        rt.on_report("MODIFIED", copy.deepcopy(kube.reports["n1"]), enqueue=False)
        await passes(rt, clock, 2)
        await rt.events.flush()

    asyncio.run(body())
    assert not kube.jobs
    assert (ladder(kube)["step"], ladder(kube)["phase"]) == ("NodeReboot", "HandedOff")
    assert "NodeRebootRequested" in kube.reasons("n1")


def test_the_peer_holds_gauge_counts_the_peers_held_and_drops_to_zero_when_they_return() -> None:
    kube = setup()
    kube.reports["n1"]["spec"] = nvswitch(action="DrainP2P")["spec"]
    clock = Clock()
    seen: list[float | None] = []

    async def body() -> None:
        rt = await runtime(kube, clock)
        await passes(rt, clock, 4)
        await rt.policy_status.update()
        seen.append(metrics.REGISTRY.get_sample_value("gpuhealth_peer_holds", {"policy": "p"}))
        then = nvswitch(action="Reset", seconds=(clock.t - Clock().t).total_seconds())
        kube.reports["n1"]["spec"] = then["spec"]
        rt.on_report("MODIFIED", copy.deepcopy(kube.reports["n1"]), enqueue=False)
        await passes(rt, clock, 3)
        await rt.policy_status.update()
        seen.append(metrics.REGISTRY.get_sample_value("gpuhealth_peer_holds", {"policy": "p"}))
        await rt.events.flush()

    asyncio.run(body())
    assert seen == [7.0, 0.0], "the 7 peers of GPU 3 while DrainP2P holds them, none once a reset needs them no more"
    assert {i for i, d in devices(kube).items() if d["state"] != "InService"} == {3}
