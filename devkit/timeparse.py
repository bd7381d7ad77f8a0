"""RFC 3339 times as the API server and the agents write them (pure)."""

from __future__ import annotations

import datetime as dt


def parse_time(s: str | None) -> dt.datetime | None:
    if not s:
        return None
    try:
        t = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
