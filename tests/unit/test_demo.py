"""`make demo`'s pure parts: the MIG node's two views agree, and the pass/fail check names misses."""

from __future__ import annotations

from typing import Any

from hack.demo import mig, run

from tests.support import dra_shapes as S

NODE = "gpu-node-0003"


def test_the_mig_nodes_fake_nvml_and_its_slices_publish_the_same_mig_devices() -> None:
    nvml = {}
    for line in mig.scenario(NODE):
        words = line.split()
        if words[2] == "mig_device":
            nvml[words[-1]] = int(words[1])  # MIG UUID -> GPU index
    published = S.static_slices(NODE, mig.gpus(NODE))
    slices = {
        d["attributes"]["uuid"]["string"]: int(d["name"].split("-")[1])
        for s in published.slices
        for d in s["spec"]["devices"]
    }
    assert nvml == slices and len(nvml) == 16
    assert all(d["attributes"]["type"]["string"] == "mig" for s in published.slices for d in s["spec"]["devices"])
    assert mig.device_names(mig.BAD_GPU) == ["gpu-5-mig-3g40gb-9-0", "gpu-5-mig-3g40gb-9-4"]


def good() -> dict[str, Any]:
    return {
        "quarantined_nodes": ["x"],
        "devices_quarantined": [{"node": "h", "gpu": 2}, {"node": "m", "gpu": mig.BAD_GPU}],
        "gpus_kept_in_service": 14,
        "ignored_faults": [{"node": "a"}],
        "checkpoints_requested": 8,
        "checkpoints_acknowledged": 8,
        "rescheduled_pods": 4,
        "partitions_held_out": [{"device": d} for d in mig.device_names(mig.BAD_GPU)],
        "partitions_kept_in_service": 14,
        "gpus_reset": [{"node": "r", "gpu": 1}],
        "reset_ladder": {"history": [{"step": "GPUReset", "result": "Succeeded"}]},
    }


def test_check_passes_a_complete_run_and_names_each_missing_story() -> None:
    assert run.check(good(), "x", "h", "m", "r", 1) == []
    bad = good() | {"gpus_reset": [], "partitions_held_out": [], "reset_ladder": {}}
    misses = run.check(bad, "x", "h", "m", "r", 1)
    assert len(misses) == 3
    assert "reset Jobs" in misses[1] and "MIG devices held out" in misses[0] and "ladder history" in misses[2]
