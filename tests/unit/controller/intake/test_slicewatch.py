"""The ResourceSlice reflector's protocol with a scripted source: slim, resume, relist on 410.

The real list and watch run in tests/integration/test_dra.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given

from devkit import dra_shapes as S
from gpuhealth.actions.gpudevices import device_by_uuid, devices_of_gpu
from gpuhealth.actions.slices import DeviceRef, slim_slice
from gpuhealth.controller.intake.reflector import Gone, WatchError
from gpuhealth.controller.intake.slicewatch import SliceCache, SliceWatch
from tests.unit.actions.test_gpudevices import DRIVERS, MIG_LAYOUTS, PROPS, node_shape
from tests.unit.actions.test_gpudevices import uuid as gpu_uuid
from tests.unit.actions.test_slices import slice_obj, uuid


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


# -- the cache's per-node lookup ------------------------------------------------------------------


def _fleet_cache(here: list[Any], others: int = 3) -> tuple[SliceCache, list[Any]]:
    """``here``'s slices beside other nodes' (one of them publishing GPU 2's UUID as a plain GPU)."""
    slices = [slim_slice(s) for s in here]
    for i in range(others):
        gpus = [S.Gpu(0, f"GPU-other-{i}"), S.Gpu(5, gpu_uuid(2) if i == 0 else f"GPU-other-{i}-5")]
        slices += [slim_slice(s) for s in S.static_slices(f"m{i}", gpus).slices]
    cache = SliceCache()
    cache.replace(slices)
    return cache, slices


@PROPS
@given(node_shape())
def test_a_nodes_lookup_answers_as_the_whole_fleets_slices_would(shape: Any) -> None:
    """The per-node index reads only the pools that matter, and gives exactly the full list's answer:
    every GPU's devices, a MIG UUID's one device, and the contradictions that need other pools."""
    _, gpus, pub = shape
    cache, everything = _fleet_cache(pub.slices)
    reported = {g.uuid for g in gpus} | {gpu_uuid(2)}
    for g in gpus:
        whole = devices_of_gpu(everything, "n1", DRIVERS, None, g.uuid, reported)
        assert cache.find("n1", DRIVERS, None, g.uuid, reported) == whole
    for d in (d for s in cache.for_node("n1") for d in s.devices if d.uuid.startswith("MIG-")):
        assert cache.by_uuid("n1", DRIVERS, d.uuid) == device_by_uuid(everything, "n1", DRIVERS, d.uuid)
    assert all(s.pool != "m1" for s in cache.for_node("n1", [g.uuid for g in gpus]))


def test_a_parent_published_as_a_plain_gpu_elsewhere_is_still_seen_through_the_index() -> None:
    here = S.static_slices("n1", [S.Gpu(2, gpu_uuid(2), MIG_LAYOUTS[0])]).slices
    cache, _ = _fleet_cache(here)
    m = cache.find("n1", DRIVERS, 2, gpu_uuid(2))
    assert m.conflict and "plain GPU by another pool" in m.reason and "m0/gpu-5" in m.reason


def test_the_index_follows_updates_and_deletes() -> None:
    cache, _ = _fleet_cache(S.static_slices("n1", [S.Gpu(2, gpu_uuid(2), MIG_LAYOUTS[0])]).slices)
    assert {s.pool for s in cache.for_node("n1", [gpu_uuid(2)])} == {"n1", "m0"}
    (m0,) = [s for s in cache.slices() if s.pool == "m0"]
    cache.apply("DELETED", m0)
    assert {s.pool for s in cache.for_node("n1", [gpu_uuid(2)])} == {"n1"}
    assert not cache.find("n1", DRIVERS, 2, gpu_uuid(2)).conflict
    # The node re-partitioned: a new generation's slice replaces the old by name, the index with it.
    (old,) = cache.for_node("n1")
    new = slim_slice(S.static_slices("n1", [S.Gpu(2, gpu_uuid(2), MIG_LAYOUTS[2])]).slices[0])
    cache.apply("MODIFIED", new)
    assert cache.for_node("n1") == [new] and old.name == new.name
    assert {r.device for r in cache.find("n1", DRIVERS, 2, gpu_uuid(2)).refs} == {"gpu-2-mig-7g80gb-0-0"}


def test_a_slice_leaving_a_pool_takes_its_own_index_entries_with_it() -> None:
    """Partitionable GPUs are one slice each in one pool: a slice deleted while the pool lives on must
    not leave its GPU's UUID indexed (node churn would otherwise grow the index for ever)."""
    pub = S.partitionable_slices("n1", [S.Gpu(0, gpu_uuid(0)), S.Gpu(1, gpu_uuid(1))], profiles=["7g.80gb"])
    cache = SliceCache()
    slim = [slim_slice(s) for s in pub.slices]
    cache.replace(slim)
    assert {gpu_uuid(0), gpu_uuid(1)} <= set(cache._of_uuid)
    gpu1 = next(s for s in slim if any(d.uuid == gpu_uuid(1) for d in s.devices))
    cache.apply("DELETED", gpu1)
    assert gpu_uuid(1) not in cache._of_uuid and gpu_uuid(0) in cache._of_uuid
    assert gpu1 not in cache.for_node("n1") and len(cache.for_node("n1")) == len(slim) - 1
    for s in list(cache.slices()):
        cache.apply("DELETED", s)
    assert not cache._of_uuid and not cache._of_node and not cache._pools
