"""`kubectl gpuhealth describe` shows the fabric: NVLinks active/expected per GPU, peers, fabric state and
decoded health, PCIe now/max, throttle reasons split, and the node's NICs; from what the agent writes."""

from __future__ import annotations

from typing import Any

from gpuhealth.agent.model import (
    DeviceFacts,
    NvmlStatus,
    Snapshot,
)
from gpuhealth.agent.report import AgentInfo, ReportBuilder
from gpuhealth.api.names import Signal
from gpuhealth.api.report import parse_report
from gpuhealth.api.report_fabric import Clocks, Fabric, NicPort, NvLink, Pcie
from gpuhealth.api.timeutil import format_time
from gpuhealth.cli.describe_text import render_describe
from gpuhealth.cli.nodeview import describe_node
from gpuhealth.evaluation.fabric_rules import fabric_findings
from tests.unit.builders import make_policy
from tests.unit.cli.objects import NOW, node

_NOW = format_time(NOW)


def _report() -> dict[str, Any]:
    """A report as the agent renders it: GPU 0 healthy, GPU 1 with two links down, a degraded fabric,
    a PCIe link at x8 and a power brake; one IB port down."""
    healthy = DeviceFacts(
        index=0,
        uuid="GPU-0",
        model="NVIDIA GB200",
        clock_event_reasons=0x1,
        nvlink=NvLink(18, 18, (), 53125, 7, (1,)),
        fabric=Fabric.decoded(3, 0, "1b9e1a6c-3e57-4f2a-9d0e-6b3f2a1c4d5e", 7, 0x1AA, 1),
        pcie=Pcie(16, 16, 5, 5, 0),
    )
    sick = DeviceFacts(
        index=1,
        uuid="GPU-1",
        model="NVIDIA GB200",
        clock_event_reasons=0x88,
        nvlink=NvLink(18, 16, (4, 9), 53125, 7, (0,)),
        fabric=Fabric.decoded(3, 0, "1b9e1a6c-3e57-4f2a-9d0e-6b3f2a1c4d5e", 7, 0x1A9, 3),
        pcie=Pcie(8, 16, 5, 5, 3),
        clocks=Clocks(300, 0, 0, 40),
    )
    nics = (
        NicPort("mlx5_0", 1, "ACTIVE", "LinkUp", "InfiniBand", "", "", 0, 0, 0, 0, 0.0, 0.0, 0.0),
        NicPort("mlx5_1", 1, "DOWN", "Polling", "InfiniBand", "", "", 2, 0, 0, 0, None, 0.0, 0.0, ("symbol_error",)),
    )
    builder = ReportBuilder("gpu-a", AgentInfo("0.1.0", ("nvml",), None))
    spec = builder.render(Snapshot(NOW, NvmlStatus(True), (healthy, sick), nics=nics), NOW)
    return {"metadata": {"name": "gpu-a"}, "spec": spec, "status": {"state": "Healthy"}}


def test_describe_model_has_each_gpus_fabric_and_the_nics() -> None:
    model = describe_node("gpu-a", node("gpu-a"), _report(), None, [], NOW)
    gpus = model["fabric"]["devices"]
    assert gpus[1]["nvlink"]["active"] == 16 and gpus[1]["nvlinkExpected"] == 18
    assert gpus[1]["fabricFaults"] == ["degradedBandwidth"] and gpus[0]["fabricFaults"] == []
    assert gpus[1]["clockReasons"] == ["HwSlowdown", "HwPowerBrakeSlowdown"]
    assert [n["state"] for n in model["fabric"]["nics"]] == ["ACTIVE", "DOWN"]


def test_describe_text_shows_links_fabric_pcie_throttle_and_nics() -> None:
    text = render_describe(describe_node("gpu-a", node("gpu-a"), _report(), None, [], NOW))
    assert "Fabric (NVLink active/expected" in text
    gpu1 = next(line for line in text.splitlines() if line.strip().startswith("1 ") and "active" in line)
    assert "16/18 active (down: 4,9)" in gpu1
    assert "Completed clique 1b9e1a6c-3e57-4f2a-9d0e-6b3f2a1c4d5e.7 LimitedCapacity [degradedBandwidth]" in gpu1
    assert "x8/x16 gen5/5" in gpu1
    assert "HwSlowdown,HwPowerBrakeSlowdown (power brake 40% of 300s)" in gpu1
    gpu0 = next(line for line in text.splitlines() if line.strip().startswith("0 ") and "active" in line)
    assert "18/18 active" in gpu0 and "Healthy" in gpu0 and "[" not in gpu0
    nic = next(line for line in text.splitlines() if "mlx5_1/1" in line)
    assert "DOWN (Polling)" in nic and "2/0/0/0" in nic and "symbol_error" in nic


def test_describe_without_fabric_facts_adds_no_section() -> None:
    rep = _report()
    for d in rep["spec"]["devices"]:
        for k in ("nvlink", "fabric", "pcie", "clocks"):
            d.pop(k, None)
    rep["spec"].pop("nics")
    text = render_describe(describe_node("gpu-a", node("gpu-a"), rep, None, [], NOW))
    assert "Fabric (" not in text and "NICs (" not in text


def test_describe_expects_the_nvlinks_the_operator_expects_when_gpus_of_a_model_differ() -> None:
    """5 GPUs of a model at 12 links and 3 at 18, every link active: the operator holds the twelve-link
    GPUs out as NVLinkDegraded against the most links of their model (18); describe shows them as
    "12/18 active", never "12/12 active" (what it showed when it expected the most common count)."""
    devices = [
        {"index": i, "uuid": f"GPU-{i}", "model": "NVIDIA H100", "nvlink": {"links": n, "active": n}}
        for i, n in enumerate([12] * 5 + [18] * 3)
    ]
    rep = {"metadata": {"name": "gpu-a"}, "spec": {"nodeName": "gpu-a", "heartbeatTime": _NOW, "devices": devices}}
    held_out = {
        f.gpu
        for f in fabric_findings(make_policy(), parse_report(rep), {}, {}, NOW)
        if f.signal == Signal.NVLINK_DEGRADED
    }
    assert held_out == {0, 1, 2, 3, 4}
    model = describe_node("gpu-a", node("gpu-a"), rep, None, [], NOW)
    assert {g["index"]: g["nvlinkExpected"] for g in model["fabric"]["devices"]} == dict.fromkeys(range(8), 18)
    rows = {line.split()[0]: line for line in render_describe(model).splitlines() if "active" in line}
    assert all("12/18 active" in rows[str(i)] for i in held_out), rows
    assert all("18/18 active" in rows[str(i)] for i in (5, 6, 7)), rows
    assert not any("12/12" in line for line in rows.values())
