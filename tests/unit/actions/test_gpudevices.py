"""A physical GPU is all of its DRA devices: property tests over the shapes NVIDIA's driver publishes.

The slices come from devkit/dra_shapes.py, the same builders the integration tests publish to
the real API server (which validates them) and its scheduler allocates.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from devkit import dra_shapes as S
from gpuhealth.actions.devicetaints import EmptySelector, build_rule, plan_rules, rule_name
from gpuhealth.actions.gpudevices import device_by_uuid, devices_of_gpu
from gpuhealth.actions.slices import SlimSlice, slim_slice
from gpuhealth.api.devices import DeviceRef

DRIVERS = (S.DRIVER,)
PROPS = settings(max_examples=120, deadline=None)
MIG_LAYOUTS = (
    (("3g.40gb", 0), ("3g.40gb", 4)),
    (("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4)),
    (("7g.80gb", 0),),
    (("4g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)),
)


def uuid(i: int) -> str:
    return f"GPU-{i:08d}-0000-0000-0000-000000000000"


@st.composite
def node_shape(draw: Any) -> tuple[str, list[S.Gpu], S.Published]:
    """One node: static (some GPUs MIG, some not, several slices) or partitionable, any driver version,
    GPU minors that need not be 0..N-1, and an older pool generation that must be ignored."""
    n = draw(st.integers(1, 4))
    minors = draw(st.lists(st.integers(0, 15), min_size=n, max_size=n, unique=True))
    version = draw(st.sampled_from(("v25.3", "v25.8", "current")))
    partitionable = draw(st.booleans())
    if partitionable:
        gpus = [S.Gpu(m, uuid(m)) for m in minors]
        profiles = draw(st.sets(st.sampled_from([p[0] for p in S.H100_PROFILES]), min_size=1))
        pub = S.partitionable_slices("n1", gpus, version, generation=2, profiles=sorted(profiles))
    else:
        gpus = [S.Gpu(m, uuid(m), draw(st.sampled_from(((), *MIG_LAYOUTS)))) for m in minors]
        pub = S.static_slices("n1", gpus, version, slices=draw(st.integers(1, 3)), generation=2)
    if draw(st.booleans()):  # the previous generation: the GPUs partitioned differently, then
        old = [S.Gpu(g.minor, g.uuid, () if g.mig else MIG_LAYOUTS[0]) for g in gpus]
        pub.slices += S.static_slices("n1", old, version, generation=1).slices
    return version, gpus, pub


def slim(pub: S.Published) -> list[SlimSlice]:
    return [slim_slice(s) for s in pub.slices]


def names(refs: tuple[DeviceRef, ...]) -> set[str]:
    return {r.device for r in refs}


@PROPS
@given(node_shape())
def test_each_gpu_is_exactly_the_devices_published_for_it(shape: tuple[str, list[S.Gpu], S.Published]) -> None:
    _, gpus, pub = shape
    slices = slim(pub)
    reported = {g.uuid for g in gpus}
    seen: set[str] = set()
    for g in gpus:
        m = devices_of_gpu(slices, "n1", DRIVERS, g.minor, g.uuid, reported)
        assert not m.conflict and m.reason == "" and m.complete
        assert names(m.refs) == pub.devices[g.uuid]
        assert not names(m.refs) & seen, "two GPUs share a device"
        seen |= names(m.refs)
        assert all(r.driver == S.DRIVER and r.pool == "n1" and r.device for r in m.refs)
        full = [r for r in m.refs if r not in m.partitions]
        assert full == ([] if g.mig else [DeviceRef(S.DRIVER, "n1", f"gpu-{g.minor}")])
        assert m.refs[: len(full)] == tuple(full), "the full device comes first"
        for r in m.refs:  # every rule names driver, pool and device
            sel = build_rule(r, "EccUncorrected", kind=m.kind(r))["spec"]["deviceSelector"]
            assert sel == {"driver": S.DRIVER, "pool": "n1", "device": r.device}
    assert seen == set().union(*pub.devices.values()), "every current device belongs to one GPU"


@PROPS
@given(node_shape(), st.integers(0, 3))
def test_the_index_is_not_a_uuid(shape: tuple[str, list[S.Gpu], S.Published], pick: int) -> None:
    """Without the agent's UUID only v25.3's ``index`` of a full device can tell a GPU; a MIG
    device's own index never does, and newer drivers' GPUs without a UUID fall back to node scope."""
    version, gpus, pub = shape
    g = gpus[pick % len(gpus)]
    m = devices_of_gpu(slim(pub), "n1", DRIVERS, g.minor, "")
    if version == "v25.3" and not g.mig:
        assert names(m.refs) == pub.devices[g.uuid]
    else:
        assert not m.refs or all(r.device.startswith(f"gpu-{g.minor}") for r in m.refs)
        if version != "v25.3":
            assert m.refs == () and "whole node" in m.reason


@PROPS
@given(node_shape())
def test_a_mig_uuid_finds_its_one_device(shape: tuple[str, list[S.Gpu], S.Published]) -> None:
    _, gpus, pub = shape
    slices = slim(pub)
    for g in gpus:
        for profile, start in g.mig:
            m = device_by_uuid(slices, "n1", DRIVERS, S.mig_uuid(g.uuid, profile, start))
            assert len(m.refs) == 1 and m.partitions == m.refs
            assert m.refs[0].device in pub.devices[g.uuid]


def static_node(*gpus: S.Gpu, node: str = "n1") -> list[SlimSlice]:
    return slim(S.static_slices(node, list(gpus)))


def test_static_mig_gpu_is_its_mig_devices() -> None:
    slices = static_node(S.Gpu(0, uuid(0)), S.Gpu(2, uuid(2), MIG_LAYOUTS[0]))
    m = devices_of_gpu(slices, "n1", DRIVERS, 2, uuid(2), {uuid(0), uuid(2)})
    assert names(m.refs) == {"gpu-2-mig-3g40gb-9-0", "gpu-2-mig-3g40gb-9-4"}
    assert m.partitions == m.refs and m.ref is not None and m.kind(m.ref) == "mig"


def test_partitionable_gpu_is_its_full_device_and_every_placement() -> None:
    pub = S.partitionable_slices("n1", [S.Gpu(0, uuid(0)), S.Gpu(1, uuid(1))])
    m = devices_of_gpu(slim(pub), "n1", DRIVERS, 0, uuid(0))
    assert m.ref == DeviceRef(S.DRIVER, "n1", "gpu-0") and m.kind(m.ref) == "gpu"
    assert {"gpu-0-mig-1g10gb-19-0", "gpu-0-mig-1g10gb-19-1", "gpu-0-mig-3g40gb-9-4"} <= names(m.partitions)
    assert len(m.refs) == 1 + 7 + 3 + 2 + 1 + 1 and not any(r.device.startswith("gpu-1") for r in m.refs)


def test_a_placement_without_parent_uuid_is_tied_by_the_counter_set_its_gpu_consumes() -> None:
    pub = S.partitionable_slices("n1", [S.Gpu(0, uuid(0)), S.Gpu(1, uuid(1))], profiles=["7g.80gb"])
    for s in pub.slices:
        for d in s["spec"].get("devices") or []:
            d["attributes"].pop("parentUUID", None)
    m = devices_of_gpu(slim(pub), "n1", DRIVERS, 1, uuid(1))
    assert names(m.refs) == {"gpu-1", "gpu-1-mig-7g80gb-0-0"}


def test_a_counter_set_is_tied_by_name_only_through_the_gpus_full_device() -> None:
    # The full device consumes nothing: its name gpu-1 (found by UUID) ties gpu-1-counter-set.
    pub = S.partitionable_slices("n1", [S.Gpu(1, uuid(1))], profiles=["7g.80gb"])
    for s in pub.slices:
        for d in s["spec"].get("devices") or []:
            d["attributes"].pop("parentUUID", None)
            if d["name"] == "gpu-1":
                d.pop("consumesCounters")
    assert names(devices_of_gpu(slim(pub), "n1", DRIVERS, 1, uuid(1)).refs) == {"gpu-1", "gpu-1-mig-7g80gb-0-0"}
    # No full device by UUID: the set's name alone ties nothing (placements without parentUUID stay out).
    for s in pub.slices:
        s["spec"]["devices"] = [d for d in s["spec"].get("devices") or [] if d["name"] != "gpu-1"] or None
        if s["spec"]["devices"] is None:
            del s["spec"]["devices"]
    m = devices_of_gpu(slim(pub), "n1", DRIVERS, 1, uuid(1))
    assert m.refs == () and "not among" in m.reason


def test_two_devices_with_one_uuid_give_node_scope_naming_the_conflict() -> None:
    pub = S.static_slices("n1", [S.Gpu(0, uuid(0)), S.Gpu(1, uuid(0))])
    m = devices_of_gpu(slim(pub), "n1", DRIVERS, 0, uuid(0))
    assert m.conflict and m.refs == () and "matches several DRA devices" in m.reason and "gpu-1" in m.reason


def test_a_parent_the_agent_does_not_report_gives_node_scope() -> None:
    slices = static_node(S.Gpu(0, uuid(0)), S.Gpu(2, uuid(2), MIG_LAYOUTS[0]))
    m = devices_of_gpu(slices, "n1", DRIVERS, 0, uuid(0), {uuid(0), uuid(1)})
    assert m.conflict and uuid(2) in m.reason and "does not report" in m.reason


def test_a_mig_parent_published_as_a_plain_gpu_of_another_pool_gives_node_scope() -> None:
    here = static_node(S.Gpu(2, uuid(2), MIG_LAYOUTS[0]))
    there = static_node(S.Gpu(5, uuid(2)), node="n2")
    m = devices_of_gpu(here + there, "n1", DRIVERS, 2, uuid(2))
    assert m.conflict and "plain GPU by another pool" in m.reason and "n2/gpu-5" in m.reason
    # A full GPU here and there is no MIG contradiction (and nothing is guessed either way).
    assert not devices_of_gpu(static_node(S.Gpu(2, uuid(2))) + there, "n1", DRIVERS, 2, uuid(2)).conflict


def test_a_counter_set_shared_with_another_gpus_device_gives_node_scope() -> None:
    pub = S.partitionable_slices("n1", [S.Gpu(0, uuid(0)), S.Gpu(1, uuid(1))], profiles=["7g.80gb"])
    for s in pub.slices:
        for d in s["spec"].get("devices") or []:
            if d["name"] == "gpu-1-mig-7g80gb-0-0":
                d["consumesCounters"][0]["counterSet"] = S.counter_set(0)
    m = devices_of_gpu(slim(pub), "n1", DRIVERS, 0, uuid(0))
    assert m.conflict and "gpu-1-mig-7g80gb-0-0" in m.reason and uuid(1) in m.reason


def test_only_the_newest_generation_counts_when_a_gpu_is_repartitioned() -> None:
    old = S.static_slices("n1", [S.Gpu(2, uuid(2), MIG_LAYOUTS[0])], generation=1)
    new = S.static_slices("n1", [S.Gpu(2, uuid(2), MIG_LAYOUTS[2])], generation=2)
    m = devices_of_gpu(slim(old) + slim(new), "n1", DRIVERS, 2, uuid(2))
    assert names(m.refs) == {"gpu-2-mig-7g80gb-0-0"}


def test_slim_keeps_only_what_the_mapping_reads() -> None:
    pub = S.partitionable_slices("n1", [S.Gpu(0, uuid(0))], profiles=["3g.40gb"])
    counters, devices = (slim_slice(s) for s in pub.slices)
    assert counters.shared_counters == ("gpu-0-counter-set",) and counters.devices == ()
    assert counters.slice_count == 2
    place = next(d for d in devices.devices if d.name == "gpu-0-mig-3g40gb-9-4")
    kept = (place.uuid, place.parent_uuid, place.type, place.profile, place.index)
    assert kept == ("", uuid(0), "mig", "3g.40gb", None)
    assert place.counter_sets == ("gpu-0-counter-set",)
    assert not hasattr(place, "__dict__"), "slots: no per-object dict"


def test_a_rule_never_has_an_empty_or_partial_selector() -> None:
    for ref in (DeviceRef("", "n1", "gpu-0"), DeviceRef(S.DRIVER, "", "gpu-0"), DeviceRef(S.DRIVER, "n1", "")):
        try:
            build_rule(ref, "EccUncorrected")
            raise AssertionError(f"a rule for {ref!r} was built")
        except EmptySelector:
            pass
    good = build_rule(DeviceRef(S.DRIVER, "n1", "gpu-0"), "EccUncorrected")
    bad = {**good, "spec": {**good["spec"], "deviceSelector": {}}}
    try:
        plan_rules([bad], [])
        raise AssertionError("the planner accepted an empty deviceSelector")
    except EmptySelector:
        pass
    assert plan_rules([good], []).create[0]["metadata"]["name"] == rule_name(DeviceRef(S.DRIVER, "n1", "gpu-0"))


def test_a_pool_missing_slices_of_its_newest_generation_is_incomplete() -> None:
    pub = S.static_slices("n1", [S.Gpu(2, uuid(2), MIG_LAYOUTS[1])], slices=2)
    m = devices_of_gpu(slim(pub)[:1], "n1", DRIVERS, 2, uuid(2))
    assert m.refs and not m.complete
    assert devices_of_gpu(slim(pub), "n1", DRIVERS, 2, uuid(2)).complete
