"""RFC 3339 timestamps as Kubernetes writes them."""

from __future__ import annotations

import datetime as dt


def parse_time(text: object) -> dt.datetime | None:
    """Parse an RFC 3339 timestamp, in UTC; None for missing or malformed input (callers decide what
    that means). The one parser: the operator, the agent, the plugin and the workload helper use it."""
    if not text or not isinstance(text, str):
        return None
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    try:
        t = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)


def format_time(t: dt.datetime) -> str:
    """Second precision keeps status stable; micro precision where ordering matters is the caller's call."""
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_time_precise(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
