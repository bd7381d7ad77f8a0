"""The merge patches of a GPU's repair record and of its repairs kept by UUID
(``actions/ladder_patches.py``): a patch makes the stored entry exactly the new record, and the
repairs get only the attempts a move adds, bounded per GPU and per node, the oldest GPUs dropped first."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

from gpuhealth.actions.ladder_patches import entry_patch, repairs_patch
from gpuhealth.api.devices import DeviceRecord
from gpuhealth.api.remediation import StepKind
from gpuhealth.api.remediation_status import MAX_REPAIR_GPUS, MAX_REPAIRS, Attempt, LadderRecord, Phase, Repair, Result
from gpuhealth.api.validation import Outcome, Validation

T = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
DEV = DeviceRecord(index=3, uuid="GPU-3")


def test_the_record_patch_replaces_a_finished_validation_whole() -> None:
    """A merge patch merges nested objects: a fresh validation must not keep the last one's Job."""
    t = dt.datetime(2026, 12, 3, 14, 0, tzinfo=dt.UTC)
    old = LadderRecord(
        3,
        StepKind.GPU_RESET,
        1,
        Phase.READY,
        since=t,
        validation=Validation(2, Outcome.FAILED, "ns/v1", True, t, t, "f"),
    )
    new = LadderRecord(3, StepKind.GPU_RESET, 2, Phase.VALIDATING, since=t, validation=Validation(2))

    def merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
        out = dict(target)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            elif isinstance(v, dict) and isinstance(out.get(k), dict):
                out[k] = merge(out[k], v)
            else:
                out[k] = v
        return out

    patch = entry_patch(new, old.to_status())
    assert patch is not None
    assert merge(old.to_status(), patch) == new.to_status()


def attempt(s: int, result: Result = Result.SUCCEEDED) -> Attempt:
    return Attempt(StepKind.GPU_RESET, 1, T + dt.timedelta(seconds=s), T + dt.timedelta(seconds=s + 1), result)


def test_only_the_attempts_a_move_adds_are_appended_with_reason_and_index() -> None:
    old = LadderRecord(3, StepKind.GPU_RESET, phase=Phase.RUNNING, reason="EccUncorrected", history=(attempt(0),))
    new = replace(old, phase=Phase.SUCCEEDED, history=(attempt(0), attempt(10)))
    repairs: dict[str, tuple[Repair, ...]] = {"GPU-3": (Repair(attempt(0), "EccUncorrected", 3),)}
    patch = repairs_patch(repairs, DEV, old, new)
    assert patch == {
        "GPU-3": [
            Repair(attempt(0), "EccUncorrected", 3).to_status(),
            Repair(attempt(10), "EccUncorrected", 3).to_status(),
        ]
    }
    assert len(repairs["GPU-3"]) == 2
    assert repairs_patch(repairs, DEV, new, new) is None  # nothing added: nothing written
    assert repairs_patch(repairs, replace(DEV, uuid=""), old, new) is None  # no UUID: no key to keep it by
    assert repairs_patch(repairs, DEV, old, None) is None
    # After a reboot that renumbered the GPUs, the attempt is the GPU's the ladder was for (its UUID).
    moved = repairs_patch({}, DEV, old, replace(new, uuid="GPU-A"))
    assert moved is not None and list(moved) == ["GPU-A"]


def test_bounded_per_gpu_and_the_gpus_repaired_longest_ago_go_first() -> None:
    repairs: dict[str, tuple[Repair, ...]] = {
        f"GPU-old-{i}": (Repair(attempt(i), "X", i % 8),) for i in range(MAX_REPAIR_GPUS)
    }
    repairs["GPU-3"] = tuple(Repair(attempt(100 + i), "X", 3) for i in range(MAX_REPAIRS))
    new = LadderRecord(3, StepKind.GPU_RESET, phase=Phase.SUCCEEDED, reason="X", history=(attempt(500),))
    patch = repairs_patch(repairs, DEV, None, new)
    assert patch is not None
    assert len(patch["GPU-3"]) == MAX_REPAIRS and patch["GPU-3"][-1]["finishedAt"] == "2026-01-01T12:08:21Z"
    assert patch["GPU-old-0"] is None and "GPU-old-0" not in repairs  # the oldest GPU is dropped
    assert len(repairs) == MAX_REPAIR_GPUS and "GPU-old-1" in repairs
