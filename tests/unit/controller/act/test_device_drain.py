"""A quarantined GPU's drain: only the pods holding it are moved, judged on a claim list from after
the allocation, with the claim fields the slim pod cache keeps; a GPU nobody holds is drained with
one list and one write."""

from __future__ import annotations

import asyncio
from typing import Any

from gpuhealth.api import pods as P
from tests.unit.controller.act._device_support import Clock, claim, runtime, setup


def test_a_drain_does_not_judge_on_a_claim_list_from_before_the_allocation() -> None:
    """Regression (chaos device_kills): a claim list cached (CLAIMS_TTL_S) from just before the pod's
    claim was allocated found nobody on the bad GPU, and the device drain completed at once, leaving the
    pod running on it."""
    kube = setup()
    allocated = kube.claims
    kube.claims = []  # listed a moment before the scheduler allocated them
    clock = Clock()

    async def body() -> None:
        rt = await runtime(kube, clock)
        await rt.device_drainer.claims()
        kube.claims = allocated
        await rt.reconciler.reconcile("n1")  # the rule
        await rt.reconciler.reconcile("n1")  # the drain, within CLAIMS_TTL_S of the cached list

    asyncio.run(body())
    assert kube.pods["ml", "on-gpu-3"]["metadata"]["annotations"].get(P.CHECKPOINT_REQUESTED)
    assert kube.reports["n1"]["status"]["deviceDrains"]["3"].get("phase") != "Completed"


def test_the_pod_cache_keeps_the_claim_fields_a_device_drain_reads() -> None:
    from gpuhealth.controller.state.slim import slim_pod
    from gpuhealth.drain.claims import pod_claim_names

    pod = {
        "metadata": {"name": "p", "namespace": "ml", "uid": "u", "managedFields": [{}]},
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "main"}],
            "resourceClaims": [{"name": "shared", "resourceClaimName": "team-gpus"}],
        },
        "status": {
            "phase": "Running",
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x1"}],
            "extendedResourceClaimStatus": {"resourceClaimName": "p-extended-resources-y2"},
        },
    }
    slim = slim_pod(pod)
    assert "containers" not in slim["spec"] and "managedFields" not in slim["metadata"]
    assert pod_claim_names(slim) == {"team-gpus", "p-gpu-x1", "p-extended-resources-y2"}


def test_a_gpu_nobody_holds_is_drained_with_one_list_and_one_write() -> None:
    kube = setup()
    kube.claims = [claim("c5", "gpu-5", "on-gpu-5")]  # nothing holds gpu-3
    clock = Clock()
    lists = 0
    real = kube.list_resource_claims

    def counted() -> list[dict[str, Any]]:
        nonlocal lists
        lists += 1
        return real()

    kube.list_resource_claims = counted  # type: ignore[method-assign]

    async def body() -> None:
        rt = await runtime(kube, clock)
        await rt.reconciler.reconcile("n1")  # the record and the rule
        before = kube.writes.count(("patch", "report/n1/status"))
        await rt.reconciler.reconcile("n1")  # the drain: nothing to move
        assert kube.writes.count(("patch", "report/n1/status")) == before + 1
        assert lists == 1

    asyncio.run(body())
    assert kube.reports["n1"]["status"]["deviceDrains"]["3"]["phase"] == "Completed"
    assert not [w for w in kube.writes if w[1].startswith("pod/")]


def test_a_gpu_leaving_draining_loses_its_drain_record_in_the_same_write() -> None:
    """The pass that moves a drained GPU to Quarantined drops its ``deviceDrains`` entry in the same status
    patch (``DeviceDrainer.fold``): at 10,000 nodes a device fault was four status patches, the last two
    of them in one pass (docs/scaling.md)."""
    kube = setup()
    kube.claims = [claim("c5", "gpu-5", "on-gpu-5")]  # nothing holds gpu-3
    clock = Clock()
    patches: list[dict[str, Any]] = []
    real = kube.patch_report_status

    def recorded(name: str, patch: Any) -> dict[str, Any]:
        patches.append(dict(patch["status"]))
        return real(name, patch)

    kube.patch_report_status = recorded  # type: ignore[method-assign]

    async def body() -> None:
        rt = await runtime(kube, clock)
        await rt.reconciler.reconcile("n1")  # the record and the rule
        await rt.reconciler.reconcile("n1")  # the drain: nothing to move, Completed
        del patches[:]
        await rt.reconciler.reconcile("n1")  # GPU 3 Quarantined
        await rt.reconciler.reconcile("n1")  # nothing left to write
        await rt.events.flush()

    asyncio.run(body())
    assert len(patches) == 1, patches
    (patch,) = patches
    assert next(d for d in patch["devices"] if d["index"] == 3)["state"] == "Quarantined"
    assert patch["deviceDrains"] == {"3": None}
    assert not kube.reports["n1"]["status"].get("deviceDrains")
