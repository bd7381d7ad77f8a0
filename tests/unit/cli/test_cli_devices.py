"""The on-call view of per-GPU quarantine: GPU-hours priced per GPU, `release --gpu`, describe."""

from __future__ import annotations

import pytest

from gpuhealth.cli.changes import plan_release_gpu
from gpuhealth.cli.describe_text import render_describe
from gpuhealth.cli.errors import Refused
from gpuhealth.cli.fleet import summarize
from tests.unit.cli.objects import NOW, ago, node, policy, report

HELD = {
    "index": 3,
    "uuid": "GPU-3",
    "state": "Quarantined",
    "reason": "EccUncorrected",
    "since": ago(7200),
    "taintRule": "gpuhealth-a-gpu-3",
}


def test_a_gpu_held_out_alone_costs_its_own_gpu_hours_and_not_the_node() -> None:
    rep = report("a", "Degraded", inServiceGPUs=7, devices=[HELD, {"index": 0, "state": "InService"}])
    fleet = summarize([node("a")], [rep], [policy(cost={"gpuHourly": 2.0})], NOW)
    (row,) = fleet.rows
    assert row.in_service_gpus == 7 and row.gpus_held == 1
    assert row.device_gpu_hours == pytest.approx(2.0) and row.device_cost == pytest.approx(4.0)
    assert fleet.totals.out_gpus == 1 and fleet.totals.out_gpu_hours_by_state == {"Device": pytest.approx(2.0)}


def test_release_gpu_annotates_the_node_only_for_a_gpu_awaiting_repair() -> None:
    waiting = report("a", "Degraded", devices=[{**HELD, "state": "AwaitingRepair"}])
    plan = plan_release_gpu("a", waiting, 3)
    assert plan.patch == {"metadata": {"annotations": {"gpuhealth.dev/release-gpu": "3"}}}
    assert "gpuhealth-a-gpu-3" in " ".join(plan.lines)
    with pytest.raises(Refused, match="not AwaitingRepair"):
        plan_release_gpu("a", report("a", "Degraded", devices=[HELD]), 3)
    with pytest.raises(Refused, match="no gpuhealth record"):
        plan_release_gpu("a", waiting, 5)
    assert plan_release_gpu("a", report("a", "Degraded", devices=[HELD]), 3, force=True).patch


def test_describe_lists_each_gpu_held_out_with_its_rule() -> None:
    text = render_describe(
        {
            "node": "a",
            "nodeExists": True,
            "hasReport": True,
            "state": "Degraded",
            "generatedAt": NOW.isoformat(),
            "gpus": {"healthy": 7, "total": 8, "inService": 7},
            "gpuVerdicts": [HELD, {"index": 0, "state": "InService"}],
        }
    )
    assert "7 in service" in text
    line = next(ln for ln in text.splitlines() if "gpuhealth-a-gpu-3" in ln)
    assert "Quarantined" in line and "EccUncorrected" in line and line.split()[0] == "3"


MIG_HELD = {
    **HELD,
    "index": 2,
    "taintRule": "gpuhealth-a-gpu-2-mig-3g40gb-9-0",
    "taintRules": ["gpuhealth-a-gpu-2-mig-3g40gb-9-0", "gpuhealth-a-gpu-2-mig-3g40gb-9-4"],
}


def test_describe_and_release_of_a_mig_gpu_count_all_its_rules() -> None:
    text = render_describe(
        {
            "node": "a",
            "nodeExists": True,
            "hasReport": True,
            "state": "Degraded",
            "generatedAt": NOW.isoformat(),
            "gpus": {"healthy": 7, "total": 8, "inService": 7},
            "gpuVerdicts": [MIG_HELD],
        }
    )
    line = next(ln for ln in text.splitlines() if "gpuhealth-a-gpu-2-mig-3g40gb-9-0" in ln)
    assert "(+1 more)" in line and line.split()[0] == "2"
    plan = plan_release_gpu("a", report("a", "Degraded", devices=[{**MIG_HELD, "state": "AwaitingRepair"}]), 2)
    assert "gpuhealth-a-gpu-2-mig-3g40gb-9-0 and its 1 other rules" in " ".join(plan.lines)


PLUGIN_HELD = {"index": 2, "uuid": "GPU-2", "state": "Draining", "reason": "EccUncorrected", "since": ago(60)}


@pytest.mark.parametrize(
    ("kept", "words"), [("NodeTaint", "node tainted NoSchedule"), ("DevicePlugin", "withheld by the device plugin")]
)
def test_describe_says_how_a_gpu_on_a_device_plugin_node_is_held_out_and_that_the_others_keep_their_work(
    kept: str, words: str
) -> None:
    from gpuhealth.cli.nodeview import describe_node

    rep = report("a", "Degraded", inServiceGPUs=7, devices=[{**PLUGIN_HELD, "keptOffBy": kept}])
    taint = {"key": "gpuhealth.dev/gpu-out", "value": "gpu-2", "effect": "NoSchedule"}
    tainted = node("a", other_taints=[taint] if kept == "NodeTaint" else [])
    text = render_describe(describe_node("a", tainted, rep, None, [], NOW))
    line = next(ln for ln in text.splitlines() if ln.split()[:2] == ["2", "Draining"])
    assert f"- ({words})" in line
    assert "GPU 2 held out through the device plugin" in text and "its other GPUs keep their work" in text
    gpu_out = [ln for ln in text.splitlines() if "GPU-out taint" in ln]
    assert [("gpuhealth.dev/gpu-out=gpu-2:NoSchedule" in ln) for ln in gpu_out] == (
        [True] if kept == "NodeTaint" else []
    )
    assert not any("Other taints" in ln for ln in text.splitlines())


def test_release_of_a_gpu_on_a_device_plugin_node_names_the_node_taint_not_a_rule() -> None:
    waiting = report("a", "Degraded", devices=[{**PLUGIN_HELD, "state": "AwaitingRepair", "keptOffBy": "NodeTaint"}])
    lines = " ".join(plan_release_gpu("a", waiting, 2).lines)
    assert "gpuhealth.dev/gpu-out" in lines and "DeviceTaintRule" not in lines
