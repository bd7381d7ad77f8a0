"""The field readers of a GPUHealthPolicy: each reads one field, applies its default, and raises
:class:`PolicyError` naming the field's path when the value is one the operator refuses.

Shared by the policy's parts (``policy``, ``selector``, ``device_policy``), so that every field is
refused with the same words whichever part reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuhealth.api.durations import parse_duration
from gpuhealth.api.names import SETTABLE_SCOPES, Action, Scope


class PolicyError(ValueError):
    """A policy the operator refuses to act on; the message names the field."""


def get(d: Mapping[str, Any], path: str, key: str, default: Any) -> Any:
    """``d[key]``, or ``default`` when absent or null (a policy not yet defaulted by the server)."""
    v = d.get(key, default) if isinstance(d, Mapping) else default
    return default if v is None else v


def section(d: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    """The object at ``d[key]`` (empty when absent), refused when it is not an object."""
    v = d.get(key) if isinstance(d, Mapping) else None
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise PolicyError(f"{path}.{key}: must be an object")
    return v


def action(v: Any, path: str, allowed: frozenset[Action] | None = None) -> Action:
    try:
        a = Action(v)
    except ValueError:
        raise PolicyError(f"{path}: unknown action {v!r}") from None
    if allowed is not None and a not in allowed:
        raise PolicyError(f"{path}: action {v!r} not allowed here")
    return a


def duration(v: Any, path: str) -> float:
    try:
        return parse_duration(v)
    except ValueError as e:
        raise PolicyError(f"{path}: {e}") from None


def integer(v: Any, path: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise PolicyError(f"{path}: must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def boolean(v: Any, path: str) -> bool:
    """A true/false field: anything else (the string ``"false"`` included, which ``bool()`` reads as
    true) is refused."""
    if not isinstance(v, bool):
        raise PolicyError(f"{path}: must be true or false, got {v!r}")
    return v


def scope(v: Any, path: str) -> Scope:
    try:
        s = Scope(v)
    except ValueError:
        s = None
    if s not in SETTABLE_SCOPES:
        raise PolicyError(f"{path}: unknown scope {v!r} (Device or Node)")
    return s
