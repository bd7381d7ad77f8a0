"""Pure model of one XID for `kubectl gpuhealth explain`, from gpuhealth's copy of NVIDIA's catalog.

Needs no cluster. The argument may be written as on-call sees it: ``79``, ``XID79`` (the taint value),
``xid-79`` or ``Xid 79``.
"""

from __future__ import annotations

import re
from typing import Any

from gpuhealth.api.durations import format_duration
from gpuhealth.api.policy import Policy
from gpuhealth.api.recovery import RECOVERY
from gpuhealth.catalog import xid as catalog
from gpuhealth.cli.errors import Refused

ACTION_MEANING: dict[str, str] = {
    "ignore": "nothing: no state change, no Event",
    "observe": "state Degraded and a Warning Event; the Node is not changed",
    "cordon": "taint and cordon (state Quarantined); running work continues",
    "drain": "taint, cordon and drain (state Draining): checkpoint first, then evict",
    "repair": "like drain, then AwaitingRepair until a human runs `kubectl gpuhealth release`",
}
"""What each gpuhealth action does to a node (docs/api.md)."""

_CODE = re.compile(r"^(?:xid[\s_-]*)?([0-9]+)$", re.IGNORECASE)


def parse_code(text: str) -> int:
    """The XID code in ``text``; Refused (exit 2) for anything else."""
    m = _CODE.match(text.strip())
    code = int(m.group(1)) if m else 0
    if not 1 <= code <= catalog.MAX_XID:
        raise Refused(f"not an XID code: {text!r} (expected 1..{catalog.MAX_XID}, e.g. 79 or XID79)")
    return code


def _notes(entry: catalog.XidEntry) -> list[str]:
    notes = []
    if not entry.known:
        notes.append("This code is not in gpuhealth's catalog; gpuhealth observes it (state Degraded, Event).")
    if entry.legacy:
        notes.append("NVIDIA lists this code as unused on Ampere and newer GPUs.")
    if entry.inferred:
        notes.append("NVIDIA's catalog gives no immediate action for it; the one shown is gpuhealth's choice.")
    if entry.application_error:
        d = Policy(name="")
        notes.append(
            "Application error: one occurrence changes nothing. The same code repeated on one GPU "
            f"(spec.rules.xid.applicationRepeat: {d.app_repeat_count} times in {format_duration(d.app_repeat_window_s)}"
            f" by default) is a hardware signal: reason RepeatedAppXID, action {d.app_repeat_action} by default."
        )
    if entry.code == 154:
        mapping = ", ".join(f"{r.action} -> {r.verdict}" for r in RECOVERY.values())
        notes.append(f"gpuhealth acts on the recovery action the GPU reports: {mapping}.")
    if entry.code == 109:
        notes.append("NVIDIA's device plugin skips XID 109 by default; the catalog (and gpuhealth) reset the GPU.")
    if entry.code == 48:
        notes.append("With XID 63 or 64 on the same GPU it calls for drain-and-reset; alone, a GPU reset.")
    if entry.code == 45:
        notes.append("Usually a side effect of another XID or of a killed process: follow the XIDs around it.")
    notes.append(
        "A policy can override the action for this code: spec.rules.xid.overrides "
        f"[{{code: {entry.code}, action: ...}}]."
    )
    return notes


def explain(code: int) -> dict[str, Any]:
    entry = catalog.lookup(code)
    return {
        "code": entry.code,
        "name": entry.name,
        "mnemonic": entry.mnemonic,
        "known": entry.known,
        "description": entry.description,
        "immediateAction": entry.immediate_action,
        "immediateActionText": catalog.IMMEDIATE_ACTIONS[entry.immediate_action],
        "applicationError": entry.application_error,
        "defaultAction": entry.default_action,
        "defaultActionText": ACTION_MEANING[entry.default_action],
        "whatToDo": entry.what_to_do,
        "legacy": entry.legacy,
        "inferred": entry.inferred,
        "summary": catalog.describe(entry.code),
        "notes": _notes(entry),
    }
