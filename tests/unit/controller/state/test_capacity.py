"""GPUs out of service per policy and state: the number behind the dashboard's capacity panel.

The counting itself is the tallies' (tests/unit/controller/state/test_tally.py recounts them from scratch
after every change); this is the export."""

from __future__ import annotations

from gpuhealth.controller import metrics
from gpuhealth.controller.state.capacity import export_counts


def _sample(policy: str, state: str) -> float | None:
    return metrics.REGISTRY.get_sample_value("gpuhealth_gpus_out_of_service", {"policy": policy, "state": state})


def test_export_sets_the_gauge_zeros_included() -> None:
    export_counts({("train-x", "AwaitingRepair"): 12, ("train-x", "Quarantined"): 0})
    assert _sample("train-x", "AwaitingRepair") == 12
    assert _sample("train-x", "Quarantined") == 0  # a series at once, before anything is out
    export_counts({("train-x", "AwaitingRepair"): 4})
    assert _sample("train-x", "AwaitingRepair") == 4
