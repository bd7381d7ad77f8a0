"""Protection first: a fault's first pass writes the record and what holds the capacity out (the
Node's taint, or a GPU's DeviceTaintRule) and nothing else, so that in a storm every node and GPU is
held out before any worker spends requests on what the record already says (the GPUHealthy condition,
a device fault's Node label) or on a drain; the node's next pass, queued at once, writes those and
starts the drain. Through the in-memory Kube port; the storms' rates are measured by `make bench`."""

from __future__ import annotations

import asyncio

from gpuhealth.api.names import STATE_LABEL, TAINT_KEY
from tests.unit.controller.act._device_support import RULE, Clock, runtime, setup


def test_the_first_pass_writes_only_the_record_and_the_rule() -> None:
    kube = setup()

    async def body() -> None:
        rt = await runtime(kube, Clock())
        before = len(kube.writes)
        again = await rt.reconciler.reconcile("n1")
        assert kube.writes[before:] == [("patch", "report/n1/status"), ("create", f"devicetaintrule/{RULE}")]
        assert again is not None and again < 1  # the Node follows at once, behind the storm's first passes
        assert STATE_LABEL not in kube.nodes["n1"]["metadata"].get("labels", {})
        await rt.reconciler.reconcile("n1")  # the Node's label and condition, and the GPU's drain
        assert kube.nodes["n1"]["metadata"]["labels"][STATE_LABEL] == "Degraded"
        conditions = kube.nodes["n1"].get("status", {}).get("conditions") or []
        assert any(c["type"] == "GPUHealthy" for c in conditions)
        assert ("patch", "pod/ml/on-gpu-3") in kube.writes
        await rt.events.flush()

    asyncio.run(body())


def test_a_node_quarantine_writes_its_taint_first_and_its_condition_next() -> None:
    kube = setup({"safety": {"maxUnhealthyGPUs": 4}, "devices": {"scope": "Node"}})

    async def body() -> None:
        rt = await runtime(kube, Clock())
        before = len(kube.writes)
        again = await rt.reconciler.reconcile("n1")
        assert kube.writes[before:] == [("patch", "report/n1/status"), ("patch", "node/n1")]
        assert TAINT_KEY in {t["key"] for t in kube.nodes["n1"]["spec"].get("taints") or []}
        assert again is not None and again < 1
        await rt.reconciler.reconcile("n1")
        conditions = kube.nodes["n1"].get("status", {}).get("conditions") or []
        assert [c["status"] for c in conditions if c["type"] == "GPUHealthy"] == ["False"]
        assert ("patch", "pod/ml/on-gpu-3") in kube.writes  # and the drain began
        await rt.events.flush()

    asyncio.run(body())
