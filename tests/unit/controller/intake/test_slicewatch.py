"""The ResourceSlice reflector's protocol with a scripted source: slim, resume, relist on 410.

The real list and watch run in tests/integration/test_dra.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gpuhealth.actions.slices import DeviceRef
from gpuhealth.controller.intake.reflector import Gone, WatchError
from gpuhealth.controller.intake.slicewatch import SliceCache, SliceWatch
from tests.unit.actions.test_slices import slice_obj, uuid

DRIVERS = ("gpu.nvidia.com",)


def versioned(obj: dict[str, Any], rv: str) -> dict[str, Any]:
    obj["metadata"]["resourceVersion"] = rv
    return obj


class Script:
    def __init__(self, lists: list[tuple[list[dict[str, Any]], str]], watches: list[Any]) -> None:
        self.lists, self.watches = lists, watches
        self.calls: list[tuple[str, str]] = []
        self.done = threading.Event()

    def list_resource_slices_rv(self, transform: Any) -> tuple[list[Any], str]:
        self.calls.append(("list", ""))
        items, rv = self.lists.pop(0)
        return [transform(o) for o in items], rv

    def watch_resource_slices(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        self.calls.append(("watch", resource_version))
        if not self.watches:
            self.done.set()
            threading.Event().wait(0.05)
            return
        step = self.watches.pop(0)
        if isinstance(step, Exception):
            raise step
        yield from step


def test_follow_slims_and_raises_on_errors() -> None:
    w = SliceWatch(Script([], []), resource_version="1")
    got = list(w.follow([{"type": "ADDED", "object": versioned(slice_obj("n1", range(1)), "5")}]))
    assert got[0][0] == "ADDED" and got[0][1].devices[0].uuid == uuid(0) and w.resource_version == "5"
    with pytest.raises(Gone):
        list(w.follow([{"type": "ERROR", "object": {"code": 410}}]))
    with pytest.raises(WatchError):
        list(w.follow([{"type": "ERROR", "object": {"code": 500}}]))


def test_run_lists_watches_resumes_and_relists_after_gone() -> None:
    script = Script(
        lists=[([slice_obj("n1")], "10"), ([slice_obj("n3")], "30")],
        watches=[
            [{"type": "ADDED", "object": versioned(slice_obj("n2"), "11")}],
            ConnectionResetError("dropped"),
            [{"type": "DELETED", "object": versioned(slice_obj("n1"), "12")}],
            [{"type": "ERROR", "object": {"code": 410, "message": "too old"}}],
        ],
    )
    changed: list[str] = []
    w = SliceWatch(script, on_change=changed.append)
    w.start()
    assert script.done.wait(10)
    w.stop()
    assert script.calls[:6] == [
        ("list", ""),
        ("watch", "10"),
        ("watch", "11"),
        ("watch", "11"),
        ("watch", "12"),
        ("list", ""),
    ]
    assert changed[:3] == ["", "n2", "n1"]
    assert {s.pool for s in w.cache.slices()} == {"n3"}  # replaced on relist: n2 is gone with it
    assert w.cache.synced.is_set()
    assert w.cache.find("n3", DRIVERS, 2, uuid(2)).ref == DeviceRef("gpu.nvidia.com", "n3", "gpu-2")
    assert w.cache.find("n1", DRIVERS, 2, uuid(2)).ref is None


def test_cache_apply_and_delete() -> None:
    from gpuhealth.actions.slices import slim_slice

    c = SliceCache()
    c.apply("ADDED", slim_slice(slice_obj("n1")))
    assert c.find("n1", DRIVERS, 0, uuid(0)).ref is not None
    c.apply("DELETED", slim_slice(slice_obj("n1")))
    assert c.find("n1", DRIVERS, 0, uuid(0)).ref is None and not c.synced.is_set()
