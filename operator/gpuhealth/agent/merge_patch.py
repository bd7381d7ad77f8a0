"""RFC 7386 JSON merge patches: the smallest patch from one report to the next, and applying one.

The agent sends only what changed (``merge_patch``); tests and the simulated fleet apply patches
the way the API server does (``apply_merge_patch``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

_MISSING = object()


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The RFC 7386 JSON merge patch that turns ``old`` into ``new``.

    Lists are replaced whole (that is what merge patch does with them); keys that vanished are
    set to null so the server drops them.
    """
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        before = old.get(key, _MISSING)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif before is _MISSING or not _same_json(before, value):
            patch[key] = value
    return patch


def _same_json(a: Any, b: Any) -> bool:
    # Python says 1 == True and 0 == 0.0; JSON (and the API server) does not.
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: what a server holds after applying ``patch`` to ``target`` (for fakes/tests)."""
    if not isinstance(patch, Mapping):
        return patch
    result: dict[str, Any] = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result
