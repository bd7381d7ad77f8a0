"""Whether an API server refusal names exactly one field path (pure).

A 422 from the API server is a Status whose ``details.causes[].field`` lists the offending paths,
and whose message repeats them as ``<path>: <reason>``. Matching a substring (``"count"``,
``"spec"``) passes for any message; this matches the whole path only.
"""

from __future__ import annotations

import json
import re
from typing import Any


def refused_fields(body: str) -> set[str]:
    """Every field path a Status body names: its causes, else the ``path: reason`` parts of its message."""
    try:
        status: Any = json.loads(body)
    except ValueError:
        status = None
    if isinstance(status, dict):
        causes = (status.get("details") or {}).get("causes") or []
        fields = {str(c["field"]) for c in causes if isinstance(c, dict) and c.get("field")}
        if fields:
            return fields
        body = str(status.get("message") or "")
    return set(re.findall(r"(?:^|[\[\s,])((?:spec|metadata|status)(?:[.\[][\w\[\].-]*)?):\s", body))


def names_field(body: str, path: str) -> bool:
    return path in refused_fields(body)
