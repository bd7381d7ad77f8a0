"""The pods' streaming list: the initial events up to their bookmark, and page by page where the API
server will not stream. The stream's parsing is pure; the fallback is the adapter's choice, driven
here by a stand-in for the client's one call (the real stream is in tests/integration/test_podwatch.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from gpuhealth.kube.client import Kube
from gpuhealth.kube.watches import INITIAL_EVENTS_END, StreamIncomplete, stream_args, streamed_list


def pod(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv, "managedFields": ["big"]}}


def end(rv: str) -> dict[str, Any]:
    meta = {"resourceVersion": rv, "annotations": {INITIAL_EVENTS_END: "true"}}
    return {"type": "BOOKMARK", "object": {"metadata": meta}}


def names(o: dict[str, Any]) -> dict[str, Any]:
    """A slimmer: the name only."""
    return {"name": o["metadata"]["name"]}


def named(*n: str) -> list[dict[str, Any]]:
    return [{"name": x} for x in n]


def test_the_initial_events_up_to_their_bookmark_are_the_list_and_the_stream_goes_on_from_there() -> None:
    closed: list[bool] = []

    def events() -> Iterator[dict[str, Any]]:
        try:
            yield {"type": "ADDED", "object": pod("a", "5")}
            yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "6"}}}  # a progress bookmark
            yield {"type": "ADDED", "object": pod("b", "3")}
            yield end("9")
            yield {"type": "MODIFIED", "object": pod("a", "10")}  # the watch proper: not read here
        finally:
            closed.append(True)

    items, rv, rest = streamed_list(events(), names)
    assert (items, rv) == (named("a", "b"), "9")
    assert not closed  # open: the watch reads on from it
    assert [e["object"]["metadata"]["resourceVersion"] for e in rest] == ["10"]  # what changed after the list
    assert closed == [True]


def test_a_stream_that_fails_is_closed() -> None:
    closed: list[bool] = []

    def events() -> Iterator[dict[str, Any]]:
        try:
            yield {"type": "ADDED", "object": pod("a", "5")}
            yield {"type": "ERROR", "object": {"code": 500, "message": "boom"}}
        finally:
            closed.append(True)

    with pytest.raises(StreamIncomplete):
        streamed_list(events(), names)
    assert closed == [True]


def test_a_stream_without_its_bookmark_or_with_an_error_is_incomplete() -> None:
    with pytest.raises(StreamIncomplete, match="after 1 objects"):
        streamed_list([{"type": "ADDED", "object": pod("a", "5")}], names)
    with pytest.raises(StreamIncomplete, match="500"):
        streamed_list([{"type": "ERROR", "object": {"code": 500, "message": "boom"}}], names)


def test_the_request_asks_for_the_initial_events_as_of_now() -> None:
    args = stream_args()
    assert args["send_initial_events"] is True and args["resource_version_match"] == "NotOlderThan"
    assert "resource_version" not in args  # a consistent read of the state when asked
    assert args["allow_watch_bookmarks"] is True


class Lines:
    """An unparsed response: what ``watch_events`` reads line by line."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.data = b"".join(json.dumps(e).encode() + b"\n" for e in events)

    def stream(self, *_: Any, **__: Any) -> Iterator[bytes]:
        yield self.data

    def close(self) -> None: ...

    def release_conn(self) -> None: ...


class Page:
    def __init__(self, items: list[dict[str, Any]], rv: str) -> None:
        self.data = json.dumps({"metadata": {"resourceVersion": rv}, "items": items}).encode()


class Core:
    """``list_pod_for_all_namespaces`` as the API answers it: a stream, a refusal, or a page."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.calls: list[str] = []

    def list_pod_for_all_namespaces(self, **kw: Any) -> Any:
        if kw.get("watch"):
            self.calls.append("stream")
            if isinstance(self.stream, Exception):
                raise self.stream
            return Lines(self.stream)
        self.calls.append("page")
        return Page([pod("paged", "7")], "7")


def kube(core: Core) -> Kube:
    k = Kube(client.ApiClient())
    k.core = core
    return k


def test_pods_are_streamed_where_the_server_streams() -> None:
    k = kube(Core([{"type": "ADDED", "object": pod("a", "5")}, end("8"), {"type": "DELETED", "object": pod("a", "9")}]))
    items, rv, rest = k.list_pods_rv(names)
    assert (items, rv) == (named("a"), "8")
    assert rest is not None and [e["type"] for e in rest] == ["DELETED"]  # the same stream, read on
    assert k.core.calls == ["stream"]


def test_a_server_that_refuses_streaming_is_listed_page_by_page_from_then_on() -> None:
    core = Core(client.ApiException(status=422, reason="Unprocessable Entity"))
    k = kube(core)
    assert k.list_pods_rv(names) == (named("paged"), "7", None)
    assert k.list_pods_rv(names) == (named("paged"), "7", None)
    assert core.calls == ["stream", "page", "page"]


def test_a_stream_cut_short_is_listed_page_by_page_that_once() -> None:
    core = Core([{"type": "ADDED", "object": pod("a", "5")}])
    k = kube(core)
    assert k.list_pods_rv(names) == (named("paged"), "7", None)
    assert k.list_pods_rv(names) == (named("paged"), "7", None)
    assert core.calls == ["stream", "page", "stream", "page"]


def test_other_failures_are_the_callers_to_retry() -> None:
    core = Core(client.ApiException(status=503, reason="Service Unavailable"))
    with pytest.raises(client.ApiException):
        kube(core).list_pods_rv(names)
    assert core.calls == ["stream"]
