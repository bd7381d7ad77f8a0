"""The merge patches of a GPU's repair record (``status.remediation["<index>"]``) and of its repairs
kept by UUID (``status.repairs``), planned from the records as typed (``api/remediation_status.py``).

Pure: the remediator writes them, the write-ahead record first (``controller/act/remediator.py``).
A merge patch merges nested objects, so each patch names what the new record dropped as ``null``:
otherwise a fresh ``validation`` would keep the last one's Job name.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from gpuhealth.api.devices import DeviceRecord
from gpuhealth.api.remediation_status import MAX_REPAIR_GPUS, MAX_REPAIRS, LadderRecord, Repair


def exactly(new: dict[str, Any], old: Mapping[str, Any] | None) -> dict[str, Any]:
    """``new`` as a merge patch over ``old``: keys it dropped -> None, at every level."""
    for k, v in (old or {}).items():
        if k not in new:
            new[k] = None
        elif isinstance(new[k], dict) and isinstance(v, Mapping):
            new[k] = exactly(new[k], v)
    return new


def entry_patch(new: LadderRecord | None, old: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The merge-patch value that makes the stored entry ``old`` exactly ``new`` (None: removed)."""
    if new is None:
        return None
    return exactly(new.to_status(), old)


def repairs_patch(
    repairs: dict[str, tuple[Repair, ...]] | None, dev: DeviceRecord, old: LadderRecord | None, new: LadderRecord | None
) -> dict[str, Any] | None:
    """The merge patch of ``status.repairs`` for the attempts ``new`` adds to ``old``'s history (kept by
    the GPU's UUID, bounded: ``MAX_REPAIRS`` per GPU, ``MAX_REPAIR_GPUS`` GPUs, those repaired longest
    ago dropped first); updates ``repairs`` to match. None: nothing to add."""
    uuid = (new.uuid if new is not None else "") or dev.uuid  # the GPU the ladder is for, whatever its index now
    if repairs is None or new is None or not uuid:
        return None
    before = set(old.history) if old is not None else set()
    added = [Repair(a, new.reason, new.index) for a in new.history if a not in before]
    if not added:
        return None
    kept = (*repairs.get(uuid, ()), *added)[-MAX_REPAIRS:]
    repairs[uuid] = kept
    patch: dict[str, Any] = {uuid: [r.to_status() for r in kept]}
    epoch = dt.datetime.min.replace(tzinfo=dt.UTC)
    others = sorted((u for u in repairs if u != uuid), key=lambda u: repairs[u][-1].attempt.finished or epoch)
    for u in others[: max(0, len(repairs) - MAX_REPAIR_GPUS)]:
        patch[u] = None
        del repairs[u]
    return patch
