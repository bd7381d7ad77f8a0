"""RFC 3339 timestamps as Kubernetes writes them."""

from __future__ import annotations

import datetime as dt


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def parse_time(text: str | None) -> dt.datetime | None:
    """Parse an RFC 3339 timestamp; None for missing or malformed input (callers decide what that means)."""
    if not text or not isinstance(text, str):
        return None
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def format_time(t: dt.datetime) -> str:
    """Second precision keeps status stable; micro precision where ordering matters is the caller's call."""
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_time_precise(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
