"""The pod watch (an ObjectWatch) and the reflector protocol: resume after a dropped watch, list
again on 410, slim every pod, count it all in the one watch metric family.

The source here is a scripted stand-in; the real list and watch run in the integration tests
(every drain and restart-loop test goes through it).
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from gpuhealth.controller import metrics
from gpuhealth.controller.intake.objectwatch import ObjectWatch
from gpuhealth.controller.intake.reflector import Gone, WatchError


def pod(uid: str, rv: str, node: str = "n1") -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": "ns", "resourceVersion": rv, "managedFields": ["big"]},
        "spec": {"nodeName": node, "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


def slim(p: Mapping[str, Any]) -> dict[str, Any]:
    return {"metadata": {"uid": p["metadata"]["uid"]}, "spec": {"nodeName": p["spec"]["nodeName"]}}


class Script:
    """Answers lists and watches from queued scripts, recording what was asked."""

    def __init__(self, lists: list[Any], watches: list[Any]) -> None:
        """``lists``: (items, resourceVersion) for a paged list, with a third, the stream's events
        after the list, for a streamed one."""
        self.lists = lists
        self.watches = watches
        self.calls: list[tuple[str, str]] = []
        self.done = threading.Event()

    def list_pods_rv(self, transform: Any) -> tuple[list[dict[str, Any]], str, Any]:
        self.calls.append(("list", ""))
        items, rv, *rest = self.lists.pop(0)
        return [transform(p) for p in items], rv, (iter(rest[0]) if rest else None)

    def watch_pods(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        self.calls.append(("watch", resource_version))
        if not self.watches:
            self.done.set()
            threading.Event().wait(0.05)
            return
        step = self.watches.pop(0)
        if isinstance(step, Exception):
            raise step
        yield from step


def pod_watch(
    script: Script, on_event: Any = lambda *_: None, on_replace: Any = lambda _: None, rv: str = "10"
) -> ObjectWatch:
    return ObjectWatch("pods", script.list_pods_rv, script.watch_pods, slim, on_event, on_replace, resource_version=rv)


async def run_until_done(w: ObjectWatch, script: Script) -> None:
    """Start the watch on the running loop, let it play the script out, and stop it."""
    w.start(asyncio.get_running_loop())
    while not script.done.is_set():
        await asyncio.sleep(0.01)
    w.stop()
    await asyncio.sleep(0.05)


def sample(family: str) -> float:
    return metrics.REGISTRY.get_sample_value(f"gpuhealth_watch_{family}_total", {"watch": "pods"}) or 0.0


def test_follow_slims_tracks_versions_and_skips_bookmarks() -> None:
    w = pod_watch(Script([], []))
    events = [
        {"type": "ADDED", "object": pod("a", "11")},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}},
        {"type": "DELETED", "object": pod("a", "16")},
    ]
    got = list(w.follow(events))
    assert got == [("ADDED", slim(pod("a", "11"))), ("DELETED", slim(pod("a", "16")))]
    assert "managedFields" not in got[0][1]["metadata"]
    assert w.resource_version == "16"


def test_follow_raises_gone_on_410_and_other_errors_distinctly() -> None:
    w = pod_watch(Script([], []))
    with pytest.raises(Gone):
        list(w.follow([{"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}]))
    with pytest.raises(WatchError, match="500"):
        list(w.follow([{"type": "ERROR", "object": {"code": 500, "message": "boom"}}]))


def test_run_resumes_from_last_version_then_relists_after_gone() -> None:
    script = Script(
        lists=[([pod("b", "30")], "30")],
        watches=[
            [{"type": "ADDED", "object": pod("a", "11")}],  # ends: the server's timeout
            ConnectionResetError("dropped"),  # resumed from 11 after a short delay
            [{"type": "ERROR", "object": {"code": 410, "message": "too old"}}],
            [{"type": "MODIFIED", "object": pod("b", "31")}],
        ],
    )
    events: list[tuple[str, str]] = []
    replaced: list[list[str]] = []
    before = {f: sample(f) for f in ("events", "errors", "relists")}

    async def main() -> None:
        w = pod_watch(
            script,
            lambda kind, p: events.append((kind, p["metadata"]["uid"])),
            lambda pods: replaced.append([p["metadata"]["uid"] for p in pods]),
        )
        await run_until_done(w, script)

    asyncio.run(main())
    assert script.calls[:5] == [("watch", "10"), ("watch", "11"), ("watch", "11"), ("list", ""), ("watch", "30")]
    assert events == [("ADDED", "a"), ("MODIFIED", "b")]
    assert replaced == [["b"]]
    # One family for every watch: two events, two failures (the dropped connection, the 410), one list.
    assert {f: sample(f) - before[f] for f in before} == {"events": 2, "errors": 1, "relists": 1}


def test_a_relist_is_applied_in_turns_of_the_loop_and_the_watch_waits_for_it() -> None:
    # After 410 Gone, a list of 3,000 pods; then one event from the new version.
    script = Script(
        lists=[([pod(f"p{i}", "20") for i in range(3000)], "20")],
        watches=[
            [{"type": "ERROR", "object": {"code": 410, "message": "too old"}}],
            [{"type": "MODIFIED", "object": pod("p7", "21")}],
        ],
    )
    log: list[str] = []

    def replace(items: list[dict[str, Any]]) -> Iterator[None]:
        for k, _ in enumerate(items, 1):
            if k % 1000 == 0:
                log.append(f"replaced {k}")
                yield

    async def ticker() -> None:
        while True:
            log.append("tick")
            await asyncio.sleep(0)

    async def main() -> None:
        w = pod_watch(script, lambda kind, o: log.append(f"{kind} {o['metadata']['uid']}"), replace)
        tick = asyncio.create_task(ticker())
        await run_until_done(w, script)
        tick.cancel()

    asyncio.run(main())
    steps = [e for e in log if e != "tick"]
    assert steps == ["replaced 1000", "replaced 2000", "replaced 3000", "MODIFIED p7"]
    # Other work of the loop ran between the replace's steps: it never held the loop for the whole list.
    first, last = log.index("replaced 1000"), log.index("replaced 3000")
    assert "tick" in log[first:last]


def test_a_relist_whose_replace_fails_lists_again() -> None:
    script = Script(
        lists=[([pod("p1", "20")], "20"), ([pod("p1", "30")], "30")],
        watches=[[{"type": "ERROR", "object": {"code": 410, "message": "too old"}}]],
    )
    calls: list[int] = []

    def replace(items: list[dict[str, Any]]) -> Iterator[None]:
        calls.append(len(items))
        if len(calls) == 1:
            raise RuntimeError("a bug in the replace")
        yield

    async def main() -> None:
        w = pod_watch(script, on_replace=replace)
        await run_until_done(w, script)

    asyncio.run(main())
    assert calls == [1, 1]
    assert script.calls[:4] == [("watch", "10"), ("list", ""), ("list", ""), ("watch", "30")]


def test_a_streamed_list_is_watched_on_from_its_own_stream_then_from_the_last_version_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The list came as a stream; what changed after it follows on that stream, with no second request.
    # When the server ends that stream (its timeout), a watch opens from the last version read.
    after = [{"type": "MODIFIED", "object": pod("a", "21")}, {"type": "DELETED", "object": pod("a", "22")}]
    script = Script(
        lists=[([pod("a", "20")], "20", after)],
        watches=[[{"type": "ADDED", "object": pod("b", "23")}]],
    )
    events: list[tuple[str, str]] = []

    async def main() -> list[dict[str, Any]]:
        w = pod_watch(script, lambda kind, p: events.append((kind, p["metadata"]["uid"])), rv="")
        first = w.list()  # the runtime's start-up list
        await run_until_done(w, script)
        return first

    caplog.set_level(logging.INFO, "gpuhealth.controller.intake.objectwatch")
    first = asyncio.run(main())
    assert [p["metadata"]["uid"] for p in first] == ["a"]
    assert events == [("MODIFIED", "a"), ("DELETED", "a"), ("ADDED", "b")]
    assert script.calls[:2] == [("list", ""), ("watch", "22")]  # no watch from "20": the stream went on
    # One line per list, saying how it came (the bench's restart line reads it).
    assert any(re.fullmatch(r"pods-watch: listed 1 in \d+\.\ds, streamed", r.getMessage()) for r in caplog.records)


def test_a_stream_nobody_reads_on_from_is_closed() -> None:
    closed: list[str] = []

    def stream(name: str) -> Iterator[dict[str, Any]]:
        try:
            yield {"type": "MODIFIED", "object": pod("a", "21")}
        finally:
            closed.append(name)

    def started(s: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        next(s, None)  # a generator is only closed once it has begun: as watch_events' is, at the bookmark
        return s

    first, second = (started(stream(n)) for n in ("first", "second"))
    script = Script(lists=[([pod("a", "20")], "20", first), ([pod("a", "30")], "30", second)], watches=[])
    w = pod_watch(script, rv="")
    w.list()
    w.list()  # listed again (say, a start-up list retried): the first list's stream is closed
    assert closed == ["first"]
    w.stop()  # stopped before it started: the second is closed too
    assert closed == ["first", "second"]
