"""Protection first for GPUs, as for nodes: a device fault's first pass writes the record and the
DeviceTaintRule and nothing else, so that in a storm of device faults every rule is written before any
worker spends requests on a Node's state label and condition (they repeat what the record says) or on
a drain; the next pass converges the Node, and the pass after starts the drain. Through the
in-memory Kube port; the storm's rate is measured by `make bench` (device storm)."""

from __future__ import annotations

import asyncio

from gpuhealth.api.names import STATE_LABEL
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


def test_a_node_quarantine_is_still_written_with_its_record() -> None:
    kube = setup({"safety": {"maxUnhealthyGPUs": 4}, "devices": {"scope": "Node"}})

    async def body() -> None:
        rt = await runtime(kube, Clock())
        await rt.reconciler.reconcile("n1")
        assert ("patch", "node/n1") in kube.writes  # no rule: the node's taint goes with its first pass
        await rt.events.flush()

    asyncio.run(body())
