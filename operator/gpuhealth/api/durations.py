"""Go-style durations ("90s", "1h30m", "250ms") as the CRDs spell them."""

from __future__ import annotations

import re

_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_FULL = re.compile(r"^(?:[0-9]+(?:\.[0-9]+)?(?:ms|s|m|h))+$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_SECONDS = 10 * 366 * 86400.0  # beyond any sane policy, and far inside datetime.timedelta's range


def parse_duration(text: str) -> float:
    """Seconds in ``text``; raises ValueError on anything the CRD pattern would refuse."""
    if not isinstance(text, str) or not _FULL.fullmatch(text):
        raise ValueError(f"invalid duration {text!r} (expected e.g. 30s, 5m, 1h30m)")
    seconds = sum(float(n) * _UNIT[u] for n, u in _PART.findall(text))
    if seconds > MAX_SECONDS:
        raise ValueError(f"duration {text!r} is longer than 10 years")
    return seconds


def format_duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{int(seconds * 1000)}ms"
    s = int(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    out = (f"{h}h" if h else "") + (f"{m}m" if m else "") + (f"{sec}s" if sec or not (h or m) else "")
    return out
