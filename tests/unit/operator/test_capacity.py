"""GPUs out of service per policy and state: the number behind the dashboard's capacity panel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuhealth.api.names import State
from gpuhealth.controller import metrics
from gpuhealth.controller.capacity import export_gpus_out_of_service, gpus_out_of_service


@dataclass(frozen=True)
class _Rec:
    state: State


@dataclass(frozen=True)
class _Pol:
    name: str


def _node(labels: dict[str, str] | None = None, capacity: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"labels": labels or {}}, "status": {"capacity": capacity or {}}}


NODES = {
    "a": _node({"nvidia.com/gpu.count": "8"}),
    "b": _node(capacity={"nvidia.com/gpu": "4"}),
    "c": _node({"nvidia.com/gpu.count": "8"}),
    "d": _node({"nvidia.com/gpu.count": "8"}),
    "e": _node(),
}
RECORDS = {
    "a": _Rec(State.AWAITING_REPAIR),
    "b": _Rec(State.AWAITING_REPAIR),
    "c": _Rec(State.HEALTHY),
    "d": _Rec(State.DRAINING),
    "e": _Rec(State.QUARANTINED),
}
GOVERNS = {"a": "train", "b": "train", "c": "train", "d": "infer", "e": "infer"}


def governing(name: str) -> tuple[_Pol | None, list[_Pol]]:
    return (_Pol(GOVERNS[name]) if name in GOVERNS else None), []


def test_counts_gpus_of_out_of_service_nodes_by_policy_and_state() -> None:
    got = gpus_out_of_service(["train", "infer"], NODES, RECORDS, governing)
    assert got[("train", "AwaitingRepair")] == 12  # label 8 + capacity 4
    assert got[("infer", "Draining")] == 8
    assert got[("infer", "Quarantined")] == 0  # a node that states no GPU count adds none
    assert got[("train", "Quarantined")] == 0  # zeros exported, so the panel has a series at once
    assert all(state != "Healthy" for _, state in got)


def test_ungoverned_and_unrecorded_nodes_do_not_count() -> None:
    nodes = {**NODES, "x": _node({"nvidia.com/gpu.count": "8"})}
    records = {**RECORDS, "x": _Rec(State.AWAITING_REPAIR)}
    got = gpus_out_of_service(["train"], nodes, records, lambda n: (None, []) if n == "x" else governing(n))
    assert got[("train", "AwaitingRepair")] == 12
    assert gpus_out_of_service(["train"], NODES, {}, governing)[("train", "AwaitingRepair")] == 0


def test_export_sets_the_gauge() -> None:
    export_gpus_out_of_service(["train-x"], {"a": NODES["a"]}, RECORDS, lambda n: (_Pol("train-x"), []))
    value = metrics.REGISTRY.get_sample_value(
        "gpuhealth_gpus_out_of_service", {"policy": "train-x", "state": "AwaitingRepair"}
    )
    assert value == 8
