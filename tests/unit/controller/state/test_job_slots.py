"""The one admission for gpuhealth's Jobs (``controller/state/job_slots.py``): each kind against its
own limit, records and reservations counted together, a GPU's validation and a node's from one count,
and no two workers taking the last place."""

from __future__ import annotations

import asyncio
from typing import Any

from gpuhealth.api.remediation import StepKind
from gpuhealth.api.remediation_status import LadderRecord, Phase
from gpuhealth.controller.state.job_slots import JobSlots, Slot
from gpuhealth.controller.state.store import Store
from tests.unit.builders import make_policy

POLICY = make_policy(
    {
        "remediation": {"enabled": True, "maxConcurrent": 2},
        "validation": {"enabled": True, "maxConcurrent": 1, "newNodes": {"enabled": True, "batchSize": 1}},
    },
    name="p",
)


def _report(name: str, status: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "gpuhealth.dev/v1alpha1",
        "kind": "GPUNodeHealth",
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": {"nodeName": name},
        "status": {"policy": "p", **status},
    }


def test_each_kind_admits_up_to_its_limit_and_names_the_field_when_full() -> None:
    slots = JobSlots(Store())
    assert asyncio.run(slots.admit(Slot.RESET, POLICY, "a", 0)) == ""
    assert asyncio.run(slots.admit(Slot.RESET, POLICY, "b", 3)) == ""
    assert asyncio.run(slots.admit(Slot.RESET, POLICY, "c", 1)) == (
        "spec.remediation.maxConcurrent (2) resets are in flight"
    )
    # A burn-in and a validation have limits of their own: the two resets take none of their places.
    assert asyncio.run(slots.admit(Slot.BURN_IN, POLICY, "d")) == ""
    assert asyncio.run(slots.admit(Slot.BURN_IN, POLICY, "e")) == (
        "spec.validation.newNodes.batchSize (1) burn-ins are running"
    )
    slots.end(Slot.RESET, "a", 0)
    assert asyncio.run(slots.admit(Slot.RESET, POLICY, "c", 1)) == ""
    assert slots.count(Slot.RESET, "p") == 2


def test_a_gpus_validation_and_a_nodes_take_places_from_one_count() -> None:
    slots = JobSlots(Store())
    assert asyncio.run(slots.admit(Slot.VALIDATION, POLICY, "a")) == ""  # a node's validation after a release
    assert asyncio.run(slots.admit(Slot.VALIDATION, POLICY, "b", 2)) == (
        "spec.validation.maxConcurrent (1) validations are running"
    )
    slots.end(Slot.VALIDATION, "a")
    assert asyncio.run(slots.admit(Slot.VALIDATION, POLICY, "b", 2)) == ""


def test_records_in_the_store_count_beside_reservations_and_other_policies_do_not() -> None:
    store = Store()
    running = LadderRecord(index=0, step=StepKind.GPU_RESET, phase=Phase.RUNNING).to_status()
    store.put_report("a", _report("a", {"remediation": {"0": running}}))
    store.put_report("x", {**_report("x", {"remediation": {"0": running}}), "status": {"policy": "other"}})
    slots = JobSlots(store)
    assert slots.count(Slot.RESET, "p") == 1
    assert asyncio.run(slots.admit(Slot.RESET, POLICY, "b", 0)) == ""
    assert asyncio.run(slots.admit(Slot.RESET, POLICY, "c", 0)) != "", "one record and one reservation fill 2"
    # The reservation ends once its record is written: from then on the record alone counts it.
    store.put_report("b", _report("b", {"remediation": {"0": running}}))
    slots.end(Slot.RESET, "b", 0)
    assert slots.count(Slot.RESET, "p") == 2


def test_workers_admitting_at_once_never_take_more_places_than_the_limit() -> None:
    slots = JobSlots(Store())

    async def many() -> list[str]:
        return list(await asyncio.gather(*(slots.admit(Slot.RESET, POLICY, f"n{i}", 0) for i in range(10))))

    answers = asyncio.run(many())
    assert answers.count("") == 2
    assert slots.count(Slot.RESET, "p") == 2


def test_ending_a_reservation_never_made_changes_nothing() -> None:
    slots = JobSlots(Store())
    assert asyncio.run(slots.admit(Slot.BURN_IN, POLICY, "a")) == ""
    slots.end(Slot.BURN_IN, "b")
    slots.end(Slot.VALIDATION, "a")
    assert slots.count(Slot.BURN_IN, "p") == 1
