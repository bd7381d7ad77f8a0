"""Restart loops per device: failing pods that all hold one MIG device cost that device, on one GPU
that GPU, anywhere else (or unknown) the node. Slices as NVIDIA's DRA driver publishes them, claims
as the API returns them."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from devkit import dra_shapes as S
from gpuhealth.actions.placement import place
from gpuhealth.actions.pod_sites import pod_sites
from gpuhealth.actions.slices import slim_slice
from gpuhealth.api.names import Scope
from gpuhealth.evaluation.assess import NodeView, assess
from gpuhealth.evaluation.findings import Instance
from gpuhealth.evaluation.restarts import Site, restart_loop_finding, shared_site
from tests.unit.builders import NODE, at, gpu, make_policy, make_report
from tests.unit.evaluation.test_restarts import pod

MIG2 = ("gpu-2-mig-3g40gb-9-0", "gpu-2-mig-3g40gb-9-4")
POLICY = make_policy()


def uuid(i: int) -> str:
    return f"GPU-{i:04d}"


def mig_uuid(start: int) -> str:
    return S.mig_uuid(uuid(2), "3g.40gb", start)


def slices() -> list[Any]:
    """Four GPUs, GPU 2 MIG-enabled with two 3g.40gb devices."""
    mig = (("3g.40gb", 0), ("3g.40gb", 4))
    return [
        slim_slice(s)
        for s in S.static_slices(NODE, [S.Gpu(i, uuid(i), mig if i == 2 else ()) for i in range(4)]).slices
    ]


def report(listed: bool = True) -> Any:
    devices = [gpu(i) for i in range(4)]
    devices[2]["migMode"] = "Enabled"
    if listed:
        devices[2]["migDevices"] = [
            {"index": i, "uuid": mig_uuid(st), "gpuInstanceId": i + 1, "computeInstanceId": 0, "profile": "3g.40gb"}
            for i, st in enumerate((0, 4))
        ]
    return make_report(devices=devices)


def claim(pod_name: str, device: str) -> dict[str, Any]:
    result = {"request": "gpu", "driver": S.DRIVER, "pool": NODE, "device": device}
    return {
        "metadata": {"name": f"{pod_name}-gpu-x7k2p", "namespace": "default"},
        "status": {
            "allocation": {"devices": {"results": [result]}},
            "reservedFor": [{"resource": "pods", "name": pod_name, "uid": f"uid-{pod_name}"}],
        },
    }


def loop(devices: dict[str, str], listed: bool = True) -> tuple[Any, Any]:
    """Two workloads (a, b) failing here and running fine elsewhere, their pods on ``devices``
    (pod -> device; a pod not in it holds no DRA device): the finding, and its sites."""
    here = [pod("a-1", rs="a", restarts=5, finished=-30), pod("b-1", rs="b", restarts=4, finished=-10)]
    fine = [pod("a-2", node="other", rs="a"), pod("b-2", node="other", rs="b")]
    workloads = {"default/ReplicaSet=a": [here[0], fine[0]], "default/ReplicaSet=b": [here[1], fine[1]]}
    claims = [claim(p, d) for p, d in devices.items()]
    sites = pod_sites(NODE, slices(), (S.DRIVER,), report(listed), claims, here)
    return restart_loop_finding(POLICY, NODE, here, workloads, at(0), sites), sites


def test_both_workloads_on_one_mig_device_name_that_instance() -> None:
    f, sites = loop({"a-1": MIG2[0], "b-1": MIG2[0]})
    assert sites["default/a-1"] == frozenset({Site(2, uuid(2), f"{S.DRIVER}/{NODE}/{MIG2[0]}", f.instance)})
    assert (f.gpu, f.uuid) == (2, uuid(2))
    assert f.instance == Instance(1, 0, mig_uuid(0), "3g.40gb")
    assert "2 workloads keep failing on its MIG device GI 1 CI 0 (3g.40gb," in f.detail


def test_several_instances_of_one_gpu_name_the_gpu_and_other_gpus_or_no_claim_the_node() -> None:
    f, _ = loop({"a-1": MIG2[0], "b-1": MIG2[1]})
    assert (f.gpu, f.instance) == (2, None) and "keep failing on this GPU" in f.detail
    f, _ = loop({"a-1": MIG2[0], "b-1": "gpu-1"})
    assert (f.gpu, f.instance) == (None, None) and "keep failing on this node" in f.detail
    f, _ = loop({"a-1": MIG2[0]})  # b-1 holds no DRA device (device plugin, CPU): unknown
    assert f.gpu is None
    f, _ = loop({"a-1": "gpu-1", "b-1": "gpu-1"})  # a shared claim on one full GPU
    assert (f.gpu, f.instance) == (1, None)


def test_an_instance_the_agent_does_not_list_widens_to_its_gpu() -> None:
    f, _ = loop({"a-1": MIG2[0], "b-1": MIG2[0]}, listed=False)
    assert (f.gpu, f.instance) == (2, None)


def test_a_device_of_another_node_is_no_site() -> None:
    here = [pod("a-1", rs="a")]
    other = {**claim("a-1", MIG2[0])}
    other["status"]["allocation"]["devices"]["results"][0]["pool"] = "other-node"
    assert pod_sites(NODE, slices(), (S.DRIVER,), report(), [other], here) == {}


def test_the_instance_finding_is_device_scope_and_places_on_that_mig_device_only() -> None:
    f, _ = loop({"a-1": MIG2[1], "b-1": MIG2[1]})
    a = assess(POLICY, report(), NodeView(NODE, {}, 4), at(0), {}, None, (f,))
    (scoped,) = [x for x in a.findings if x.signal == f.signal]
    assert scoped.scope == Scope.DEVICE
    placed = place(a.findings, NODE, slices(), (S.DRIVER,), {i: uuid(i) for i in range(4)})
    assert {u: r.device for u, r in placed.instances.items()} == {mig_uuid(4): MIG2[1]}
    node, _ = loop({"a-1": MIG2[0], "b-1": "gpu-1"})
    a = assess(POLICY, report(), NodeView(NODE, {}, 4), at(0), {}, None, (node,))
    assert [x.scope for x in a.findings if x.signal == f.signal] == [Scope.NODE]
    off = make_policy({"devices": {"scope": "Node"}})
    a = assess(off, report(), NodeView(NODE, {}, 4), at(0), {}, None, (f,))
    assert [x.scope for x in a.findings if x.signal == f.signal] == [Scope.NODE]


SITES = [
    Site(g, uuid(g), f"d/{g}/{i}", Instance(i + 1, 0, f"MIG-{g}-{i}") if i < 2 else None)
    for g in range(3)
    for i in range(3)
]


@given(st.dictionaries(st.sampled_from(["p", "q", "r"]), st.frozensets(st.sampled_from(SITES), max_size=3), min_size=1))
def test_shared_site_is_never_wider_than_the_evidence(held: dict[str, frozenset[Site]]) -> None:
    pods = sorted(held)
    got = shared_site(pods, held)
    union = frozenset().union(*held.values())
    if any(not held[p] for p in pods) or len({s.gpu for s in union}) != 1:
        assert got is None
        return
    assert got is not None and {s.gpu for s in union} == {got.gpu}
    if got.instance is not None:
        assert union == {got}, "an instance only when every pod holds exactly that one MIG device"
    else:
        assert len(union) > 1 or next(iter(union)).instance is None
    assert shared_site([*pods, "unknown"], held) is None
