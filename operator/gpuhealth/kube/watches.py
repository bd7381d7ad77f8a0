"""Watch requests and their streams: one request per watch, its events parsed line by line.

Every watch here carries bookmarks and a server-side timeout, and reads the response unparsed
(``_preload_content=False``): the client's own watch helper builds model classes, which are slow for
thousands of objects, and the operator slims each plain dict as it arrives.

A streaming list (``stream_args`` / ``streamed_list``) is a watch that begins with the collection's
current state (``sendInitialEvents``, Kubernetes' WatchList, on by default from v1.34) and marks its
end with a bookmark: a list whose resourceVersion is as fresh as its last object. A paged list of
80,000 pods took about 130 s at 10,000 nodes, and the watch from its resourceVersion, by then older
than the API server's watch window, got 410 Gone at once and listed again (docs/bench.md). The same
stream then goes on as the watch: a second request, opened from the bookmark's resourceVersion,
still found it expired on a loaded API server at 10,000 nodes (two standbys of the c46e5c4 run).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
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


# The bookmark that ends a streaming list's initial events (the WatchList protocol's annotation).
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
STREAM_TIMEOUT_S = 600  # the server ends the stream here; an unfinished list is then listed page by page


class StreamIncomplete(Exception):
    """The stream ended, or failed, before its initial events did: this list is taken page by page."""


def stream_args(timeout_s: int = STREAM_TIMEOUT_S) -> dict[str, Any]:
    """A watch that starts with every current object and a bookmark after the last (no resourceVersion:
    the state as of the request, read consistently)."""
    return {
        "watch": True,
        "send_initial_events": True,
        "resource_version_match": "NotOlderThan",
        "allow_watch_bookmarks": True,
        "timeout_seconds": timeout_s,
        "_preload_content": False,
        "_request_timeout": (10, timeout_s + 30),
    }


def streamed_list(
    events: Iterable[Mapping[str, Any]], transform: Callable[[dict[str, Any]], Any]
) -> tuple[list[Any], str, Iterator[Mapping[str, Any]]]:
    """A streaming list's initial objects through ``transform`` (each slimmed as it arrives), the
    resourceVersion of its closing bookmark, and the same stream, open, to read on from: what changes
    after the list, with no second request. Whoever takes the stream reads it to its end or closes it.

    Raises ``StreamIncomplete`` when it ends without that bookmark or sends an ERROR event (the stream
    is closed then)."""
    items: list[Any] = []
    stream = iter(events)
    try:
        for ev in stream:
            kind = ev.get("type")
            obj = ev.get("object") or {}
            if kind == "ADDED":
                items.append(transform(obj))
            elif kind == "BOOKMARK":
                meta = obj.get("metadata") or {}
                if (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
                    return items, str(meta.get("resourceVersion") or ""), stream
            elif kind == "ERROR":
                raise StreamIncomplete(f"watch error {obj.get('code')}: {obj.get('message')}")
        raise StreamIncomplete(f"the stream ended after {len(items)} objects, before its initial-events bookmark")
    except BaseException:
        close_stream(stream)
        raise


def close_stream(stream: Iterable[Any] | None) -> None:
    """Close a stream nobody will read on (its connection goes back to the pool); plain iterables have
    nothing to close."""
    close = getattr(stream, "close", None)
    if close is not None:
        close()
