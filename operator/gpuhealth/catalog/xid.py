"""NVIDIA XID catalog: what each XID means and what gpuhealth does about it.

The data lives in ``xid_catalog.json`` next to this module (NVIDIA's catalog for Ampere and newer
GPUs, codes 1-172, summarized in our own words) and is loaded once on first use.

Two action vocabularies are involved:

* ``immediate_action`` is NVIDIA's "resolution bucket (immediate action)", folded into the small
  closed set :data:`IMMEDIATE_ACTIONS`.
* ``default_action`` is gpuhealth's verdict for a single occurrence, one of :data:`DEFAULT_ACTIONS`.
  Application XIDs map to ``ignore`` here; escalating an application XID that repeats on one GPU
  (a hardware signal) is the job of the verdict logic, not of the catalog.

XID 154 carries the driver's recovery action; what gpuhealth does about each is declared once in
``api/recovery.py``, not here.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

__all__ = [
    "DEFAULT_ACTIONS",
    "IMMEDIATE_ACTIONS",
    "MAX_XID",
    "XidEntry",
    "all_entries",
    "default_action",
    "describe",
    "is_application_error",
    "lookup",
]

MAX_XID = 1023
"""Largest code :func:`lookup` accepts; codes not in the catalog up to here are "unknown"."""

IMMEDIATE_ACTIONS: dict[str, str] = {
    "IGNORE": "no action needed",
    "WATCH": "watch the error rate",
    "RESTART_APP": "restart the application",
    "RESTART_VM": "restart the VM that owns the GPU",
    "RESET_GPU": "reset the GPU",
    "REBOOT_NODE": "reboot the node",
    "CHECK_HARDWARE": "check the board's seating and power connections",
    "UPDATE_SOFTWARE": "update the driver and firmware",
    "CONTACT_SUPPORT": "contact support",
    "DECODE_MESSAGE": "decode the error bits in the message",
    "FOLLOW_RECOVERY_ACTION": "follow the recovery action in the message",
}
"""Closed set of immediate actions, each with the phrase :func:`describe` uses."""

DEFAULT_ACTIONS: tuple[str, ...] = ("ignore", "observe", "cordon", "drain", "repair")
"""gpuhealth verdict actions, mildest first."""


@dataclass(frozen=True, slots=True)
class XidEntry:
    """One XID code.

    ``legacy``: NVIDIA lists the code as unused on Ampere and newer GPUs.
    ``inferred``: NVIDIA's catalog gives no immediate action; the one here is gpuhealth's choice.
    ``known``: False for the synthetic entry returned for a code outside the catalog.
    """

    code: int
    name: str
    mnemonic: str
    description: str
    immediate_action: str
    application_error: bool
    default_action: str
    what_to_do: str
    legacy: bool = False
    inferred: bool = False
    known: bool = True


def _entry_from_json(raw: dict[str, Any]) -> XidEntry:
    entry = XidEntry(
        code=int(raw["code"]),
        name=str(raw["name"]),
        mnemonic=str(raw["mnemonic"]),
        description=str(raw["description"]),
        immediate_action=str(raw["immediate_action"]),
        application_error=bool(raw["application_error"]),
        default_action=str(raw["default_action"]),
        what_to_do=str(raw["what_to_do"]),
        legacy=bool(raw.get("legacy", False)),
        inferred=bool(raw.get("inferred", False)),
    )
    if not 1 <= entry.code <= MAX_XID:
        raise ValueError(f"xid catalog: code {entry.code} out of range")
    if entry.immediate_action not in IMMEDIATE_ACTIONS:
        raise ValueError(f"xid catalog: XID {entry.code}: bad immediate_action {entry.immediate_action!r}")
    if entry.default_action not in DEFAULT_ACTIONS:
        raise ValueError(f"xid catalog: XID {entry.code}: bad default_action {entry.default_action!r}")
    return entry


@functools.cache
def _catalog() -> dict[int, XidEntry]:
    text = resources.files("gpuhealth.catalog").joinpath("xid_catalog.json").read_text(encoding="utf-8")
    entries: dict[int, XidEntry] = {}
    for raw in json.loads(text)["entries"]:
        entry = _entry_from_json(raw)
        if entry.code in entries:
            raise ValueError(f"xid catalog: duplicate code {entry.code}")
        entries[entry.code] = entry
    return dict(sorted(entries.items()))


@functools.cache
def _unknown(code: int) -> XidEntry:
    return XidEntry(
        code=code,
        name=f"Unknown XID {code}",
        mnemonic="UNKNOWN",
        description="A code that is not in gpuhealth's copy of NVIDIA's XID catalog.",
        immediate_action="CONTACT_SUPPORT",
        application_error=False,
        default_action="observe",
        what_to_do="Keep the GPU in service, check NVIDIA's current XID catalog and update gpuhealth's copy.",
        known=False,
    )


def lookup(code: int) -> XidEntry:
    """Entry for ``code``; codes 1..1023 missing from the catalog get an "Unknown XID" entry.

    Raises ValueError for anything outside 1..1023 (including bools and non-integers).
    """
    if isinstance(code, bool) or not isinstance(code, int) or not 1 <= code <= MAX_XID:
        raise ValueError(f"XID code must be an integer in 1..{MAX_XID}, got {code!r}")
    return _catalog().get(code) or _unknown(code)


def all_entries() -> list[XidEntry]:
    """Every catalog entry, sorted by code (unknown codes are not included)."""
    return list(_catalog().values())


def is_application_error(code: int) -> bool:
    """True when the XID is typically caused by the application rather than the GPU."""
    return lookup(code).application_error


def default_action(code: int) -> str:
    """gpuhealth's verdict action for a single occurrence of ``code``."""
    return lookup(code).default_action


def describe(code: int) -> str:
    """One line for humans, e.g. ``XID 79 (GPU has fallen off the bus): reboot the node``."""
    entry = lookup(code)
    return f"XID {entry.code} ({entry.name}): {IMMEDIATE_ACTIONS[entry.immediate_action]}"


def remedy_of(reason: str) -> str | None:
    """NVIDIA's immediate action for a reason that names an XID (``XID48``), else None."""
    if reason.startswith("XID") and reason[3:].isdigit():
        return lookup(int(reason[3:])).immediate_action
    return None
