"""Watch requests and their streams: one request per watch, its events parsed line by line.

Every watch here carries bookmarks and a server-side timeout, and reads the response unparsed
(``_preload_content=False``): the client's own watch helper builds model classes, which are slow for
thousands of objects, and the operator slims each plain dict as it arrives.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from kubernetes.watch.watch import iter_resp_lines


def watch_args(resource_version: str, timeout_s: int) -> dict[str, Any]:
    """A watch from ``resource_version`` with bookmarks, ended by the server at ``timeout_s``."""
    return {
        "watch": True,
        "resource_version": resource_version,
        "allow_watch_bookmarks": True,
        "timeout_seconds": timeout_s,
        "_preload_content": False,
        "_request_timeout": (10, timeout_s + 30),
    }


def watch_events(resp: Any) -> Iterator[dict[str, Any]]:
    """Raw watch events (parsed JSON, one per line); the connection goes back to the pool at the end."""
    try:
        for line in iter_resp_lines(resp):
            yield json.loads(line)
    finally:
        resp.close()
        resp.release_conn()
