"""The repair ladder as on-call reads it: `describe` per GPU (text and JSON) and `status` per node and fleet."""

from __future__ import annotations

import json
from typing import Any

from gpuhealth.cli.describe_text import render_describe
from gpuhealth.cli.fleet import summarize
from gpuhealth.cli.nodeview import describe_node
from gpuhealth.cli.render import render_status
from tests.unit.cli.objects import NOW, ago, node, policy, report

REMEDIATION = {"enabled": True}

RESETTING: dict[str, Any] = {
    "step": "GPUReset",
    "attempt": 2,
    "phase": "Running",
    "reason": "EccUncorrected",
    "uuid": "GPU-3",
    "since": ago(900),
    "faultSince": ago(960),
    "startedAt": ago(120),
    "job": "gpuhealth-remediation/gpuhealth-reset-a-3-2-abc",
    "history": [
        {"step": "GPUReset", "attempt": 1, "result": "NotClean", "startedAt": ago(900), "finishedAt": ago(600)}
    ],
}
HANDED_OFF = {"step": "NodeReboot", "attempt": 1, "phase": "HandedOff", "reason": "GPULost", "startedAt": ago(60)}
EXHAUSTED = {
    "step": "Replace",
    "attempt": 1,
    "phase": "AwaitingRepair",
    "reason": "EccUncorrected",
    "history": [
        {"step": "GPUReset", "attempt": 1, "result": "Failed", "startedAt": ago(5000), "finishedAt": ago(4900)},
        {"step": "GPUReset", "attempt": 2, "result": "TimedOut", "startedAt": ago(4800), "finishedAt": ago(4200)},
        {"step": "NodeReboot", "attempt": 1, "result": "Relapsed", "startedAt": ago(4000), "finishedAt": ago(3000)},
    ],
}


def _describe(remediation: dict[str, Any]) -> dict[str, Any]:
    rep = report("a", "Degraded", remediation=remediation)
    return describe_node("a", node("a"), rep, policy(remediation=REMEDIATION), [], NOW)


def test_describe_json_has_each_gpus_ladder_with_its_attempts_and_history() -> None:
    m = _describe({"3": RESETTING, "bogus": {"step": "Nope"}})
    json.dumps(m)  # -o json prints it as is
    (lad,) = m["remediation"]
    assert lad["gpu"] == 3 and lad["step"] == "GPUReset" and lad["attempt"] == 2 and lad["attempts"] == 2
    assert lad["phase"] == "Running" and lad["standing"] == "inFlight"
    assert lad["job"] == RESETTING["job"] and lad["stepAgeSeconds"] == 120.0
    (h,) = lad["history"]
    assert h == {
        "step": "GPUReset",
        "attempt": 1,
        "result": "NotClean",
        "startedAt": ago(900),
        "finishedAt": ago(600),
        "durationSeconds": 300.0,
    }


def test_describe_text_shows_step_job_and_history_lines() -> None:
    text = render_describe(_describe({"3": RESETTING, "5": EXHAUSTED}))
    assert "Repair ladder (status.remediation):" in text
    assert "GPU 3 (GPU-3): EccUncorrected, step GPUReset 2/2 Running for 2m" in text
    assert "Job:" in text and RESETTING["job"] in text
    lines = text.splitlines()
    notclean = next(ln for ln in lines if "NotClean" in ln)
    assert notclean.split()[:3] == ["GPUReset", "1", "NotClean"] and notclean.rstrip().endswith("5m")
    assert "GPU 5: EccUncorrected, step Replace AwaitingRepair" in text
    assert any("NodeReboot 1" in ln and "Relapsed" in ln for ln in lines)


def test_describe_without_a_ladder_has_no_ladder_section() -> None:
    m = describe_node("a", node("a"), report("a", "Healthy"), None, [], NOW)
    assert m["remediation"] == []
    assert "Repair ladder" not in render_describe(m)


def test_status_shows_a_ladder_column_and_fleet_totals() -> None:
    reports = [
        report("a", "Degraded", remediation={"3": RESETTING}),
        report("b", "AwaitingRepair", remediation={"0": HANDED_OFF, "5": EXHAUSTED}),
        report("c", "Healthy"),
    ]
    fleet = summarize([node("a"), node("b"), node("c")], reports, [policy(remediation=REMEDIATION)], NOW)
    assert fleet.totals.ladders == {"inFlight": 1, "handedOff": 1, "awaitingApproval": 0, "exhausted": 1}
    text = render_status(fleet)
    header, *rows = text.splitlines()
    assert "LADDER" in header
    row = {ln.split()[0]: ln for ln in rows if ln.split() and ln.split()[0] in "abc"}
    assert row["a"].endswith("GPUReset 2/2 Running (GPU 3)")
    assert row["b"].endswith("Replace AwaitingRepair (GPU 5) +1")  # the most urgent first
    assert row["c"].endswith("-")
    assert (
        "Repair ladders: 1 GPU resets in flight, 1 handed off to the node remediator, 0 waiting for approval, "
        "1 exhausted" in text
    )
    out = fleet.to_json()
    assert out["totals"]["remediation"] == {"inFlight": 1, "handedOff": 1, "awaitingApproval": 0, "exhausted": 1}
    by_node = {n["node"]: n for n in out["nodes"]}
    assert by_node["a"]["remediation"][0]["step"] == "GPUReset"


def test_status_without_ladders_keeps_its_columns_and_footer() -> None:
    fleet = summarize([node("c")], [report("c", "Healthy")], [policy()], NOW)
    text = render_status(fleet)
    assert "LADDER" not in text and "Repair ladders" not in text


def test_describe_shows_each_gpus_last_failure_and_the_interval_before_it() -> None:
    devices = [
        {"index": 3, "state": "Quarantined", "lastFailures": [ago(3 * 86400), ago(600)]},
        {"index": 5, "state": "InService", "lastFailures": [ago(7200)]},
        {"index": 0, "state": "InService"},
    ]
    m = describe_node("a", node("a"), report("a", "Degraded", devices=devices), None, [], NOW)
    assert m["gpuFailures"] == [
        {"gpu": 3, "lastFailure": ago(600), "lastFailureAgeSeconds": 600.0, "previousIntervalSeconds": 258_600.0},
        {"gpu": 5, "lastFailure": ago(7200), "lastFailureAgeSeconds": 7200.0, "previousIntervalSeconds": None},
    ]
    text = render_describe(m)
    assert "GPU 3: last failure 10m ago, previous interval 2d23h" in text
    assert "GPU 5: last failure 120m ago, the first on record" in text


VALIDATING = {
    "step": "GPUReset",
    "attempt": 1,
    "phase": "AwaitingRepair",
    "reason": "EccUncorrected",
    "uuid": "GPU-4",
    "validation": {
        "level": 2,
        "result": "Failed",
        "job": "gpuhealth-remediation/gpuhealth-validate-a-4-1-abc",
        "startedAt": ago(200),
        "finishedAt": ago(80),
        "findings": "GPU 4 pcie Fail (DCGM error 46): PCIe link width x8",
    },
    "history": [{"step": "GPUReset", "attempt": 1, "result": "ValidationFailed"}],
}


def test_describe_shows_the_validation_level_result_and_findings() -> None:
    m = _describe({"4": VALIDATING})
    (lad,) = m["remediation"]
    v = lad["validation"]
    assert v["level"] == 2 and v["result"] == "Failed" and v["durationSeconds"] == 120.0
    assert "DCGM error 46" in v["findings"]
    text = render_describe(m)
    assert "Validated: level 2 Failed in 2m, Job gpuhealth-remediation/gpuhealth-validate-a-4-1-abc" in text
    assert "Findings:  GPU 4 pcie Fail (DCGM error 46)" in text
    assert "ValidationFailed" in text
    running = {
        **VALIDATING,
        "phase": "Validating",
        "validation": {"level": 2, "result": "Running", "startedAt": ago(30)},
    }
    m = _describe({"4": running})
    assert m["remediation"][0]["standing"] == "inFlight"
    assert "Validated: level 2 Running for 30s" in render_describe(m)
    assert _describe({"3": RESETTING})["remediation"][0]["validation"] is None


def test_status_and_describe_show_a_nodes_validation() -> None:
    nv = {
        "trigger": "BurnIn",
        "episode": "2026-01-01T00:00:00Z",
        "level": 2,
        "result": "Failed",
        "job": "gpuhealth-remediation/gpuhealth-validate-c-node-1234abcd",
        "startedAt": "2026-01-01T00:00:10Z",
        "finishedAt": "2026-01-01T00:02:10Z",
        "findings": "GPU 5 pcie Fail (DCGM error 46)",
        "held": True,
    }
    rep = report("c", "Healthy")
    rep["status"]["nodeValidation"] = nv
    fleet = summarize([node("c")], [rep], [policy()], NOW)
    text = render_status(fleet)
    assert "LADDER" in text and "BurnIn Failed (held)" in text
    assert fleet.to_json()["nodes"][0]["nodeValidation"]["findings"] == nv["findings"]
    model = describe_node("c", node("c"), rep, None, [], NOW)
    assert model["nodeValidation"]["durationSeconds"] == 120.0
    out = render_describe(model)
    assert "Node validation (status.nodeValidation):" in out and "DCGM error 46" in out
    assert "Validation:  BurnIn: level 2 Failed in 2m" in out
    assert "gpuhealth.dev/burn-in" in out


def test_a_burn_in_hold_reads_as_not_in_service() -> None:
    """A node held by its burn-in is Healthy (nothing wrong was known when it joined) yet serves no new
    work: status says so in its STATE cell and counts it held out of service; describe says so beside
    its state; the release the runbook asks for is not refused (tests/unit/cli/test_cli_changes.py)."""
    nv = {
        "trigger": "BurnIn",
        "episode": ago(7200),
        "level": 2,
        "result": "Failed",
        "finishedAt": ago(3600),
        "findings": "GPU 5 pcie Fail (DCGM error 46)",
        "held": True,
    }
    rep = report("c", "Healthy", since_s=7200, inServiceGPUs=0, nodeValidation=nv)
    fleet = summarize([node("c"), node("d")], [rep, report("d", "Healthy")], [policy()], NOW)
    text = render_status(fleet)
    row = next(line for line in text.splitlines() if line.startswith("c "))
    assert "Healthy (burn-in hold)" in row
    d_row = next(line for line in text.splitlines() if line.startswith("d "))
    assert "burn-in" not in d_row
    totals = fleet.to_json()["totals"]["outOfService"]
    assert (totals["nodes"], totals["gpus"]) == (1, 8)
    assert totals["gpuHoursByState"] == {"BurnIn": 16.0}
    assert fleet.to_json()["nodes"][0]["outOfService"] is True
    assert "Held out of service: 1 node, 8 GPUs, 16.0 GPU-hours (BurnIn 16.0)" in text
    out = render_describe(describe_node("c", node("c"), rep, None, [], NOW))
    state = next(line for line in out.splitlines() if line.startswith("State"))
    assert "Healthy" in state and "held by its burn-in" in state and "not in service" in state
    assert "0 in service" in out
    # Once it passed, the hold is gone: in service, nothing held out.
    passed = report("c", "Healthy", nodeValidation={**nv, "result": "Passed", "held": False})
    fleet = summarize([node("c")], [passed], [policy()], NOW)
    assert "burn-in hold" not in render_status(fleet) and fleet.totals.out_nodes == 0


def test_describe_says_a_repaired_gpu_stays_withheld_until_the_device_plugin_restarts() -> None:
    why = (
        "no pod of the device plugin (namespace gpu-operator, labels app=nvidia-device-plugin-daemonset) runs on node a"
    )
    blocked: dict[str, Any] = {
        "step": "GPUReset",
        "attempt": 1,
        "phase": "RestartingPlugin",
        "reason": "XID48",
        "message": "GPU 2: repaired, but the device plugin still withholds it (allocatable nvidia.com/gpu 7 of 8)",
        "plugin": {"startedAt": ago(90), "blocked": why},
    }
    m = _describe({"2": blocked})
    (lad,) = m["remediation"]
    assert lad["phase"] == "RestartingPlugin" and lad["plugin"]["blocked"] == why and lad["plugin"]["ageSeconds"] == 90
    text = render_describe(m)
    assert f"Plugin:    not restarted: {why}; the GPU stays withheld until the device plugin restarts" in text
    assert "step GPUReset 1/2 RestartingPlugin" in text and "allocatable nvidia.com/gpu 7 of 8" in text
    waiting: dict[str, Any] = {
        **blocked,
        "plugin": {"startedAt": ago(20), "pod": "gpu-operator/dp-a1", "uid": "u", "deleted": True},
    }
    text = render_describe(_describe({"2": waiting}))
    assert "Plugin:    gpu-operator/dp-a1 restarted 20s ago; the GPU returns once allocatable shows it" in text
    timed = {**waiting, "plugin": {**waiting["plugin"], "timedOut": True}}
    assert "allocatable still does not show the GPU (returnTimeout passed)" in render_describe(_describe({"2": timed}))
    assert _describe({"3": RESETTING})["remediation"][0]["plugin"] is None
