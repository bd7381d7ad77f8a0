"""`describe`'s kubelet view: each held-out GPU's pods, with the kubelet's health of that GPU
(``allocatedResourcesStatus``) beside gpuhealth's verdict; a gone or forbidden pod is a row, not a crash."""

from __future__ import annotations

import argparse
import io
import json
from typing import Any

from gpuhealth.cli import main as cli
from gpuhealth.cli.describe_text import render_describe
from gpuhealth.cli.errors import ApiError
from gpuhealth.cli.kubeletview import GONE, NOT_REPORTED, PodLookup, held_out_holders, kubelet_view, pods_to_read
from gpuhealth.cli.nodeview import describe_node
from tests.unit.cli.objects import NOW, ago, node, report

GPU = "nvidia.com/gpu"
DRA = "gpu.nvidia.com/a/gpu-1-mig-3g40gb-9-0"


def hold(ns: str, name: str, resource: str = GPU) -> dict[str, str]:
    return {"namespace": ns, "name": name, "container": "main", "resource": resource}


def spec() -> dict[str, Any]:
    """GPU 0 (in service) held by ml/fine; GPU 2 by four pods; GPU 3's two MIG devices by one pod each."""
    return {
        "podResources": {"available": True},
        "devices": [
            {"index": 0, "uuid": "GPU-0", "pods": [hold("ml", "fine")]},
            {"index": 1, "uuid": "GPU-1"},
            {
                "index": 2,
                "uuid": "GPU-2",
                "pods": [
                    hold("ml", "trainer-0"),
                    hold("ml", "trainer-1"),
                    hold("ml", "gone"),
                    hold("team-x", "secret"),
                ],
            },
            {
                "index": 3,
                "uuid": "GPU-3",
                "migMode": "Enabled",
                "migDevices": [
                    {"index": 0, "uuid": "MIG-3a", "pods": [hold("ml", "mig-a", "nvidia.com/mig-3g.40gb")]},
                    {"index": 1, "uuid": "MIG-3b", "pods": [hold("ml", "mig-b", "nvidia.com/mig-3g.40gb")]},
                ],
            },
        ],
    }


RECORDS = [
    {"index": 0, "uuid": "GPU-0", "state": "InService"},
    {
        "index": 2,
        "uuid": "GPU-2",
        "state": "Draining",
        "reason": "EccUncorrected",
        "since": ago(60),
        "keptOffBy": "NodeTaint",
    },
    {
        "index": 3,
        "uuid": "GPU-3",
        "state": "Quarantined",
        "reason": "RepeatedAppXID",
        "since": ago(60),
        "instances": ["MIG-3a"],
        "keptOffBy": "NodeTaint",
    },
]


def rep() -> dict[str, Any]:
    return report("a", "Degraded", spec=spec(), devices=RECORDS, inServiceGPUs=7)


def pod(ns: str, name: str, *statuses: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name}, "status": {"containerStatuses": list(statuses)}}


def health(container: str, resource: str, *ids: tuple[str, str]) -> dict[str, Any]:
    return {
        "name": container,
        "allocatedResourcesStatus": [
            {"name": resource, "resources": [{"resourceID": i, "health": h} for i, h in ids]},
        ],
    }


PODS: dict[tuple[str, str], dict[str, Any]] = {
    # a time-sliced replica of GPU 2 (NVIDIA's plugin: <uuid>::<n>)
    ("ml", "trainer-0"): pod("ml", "trainer-0", health("main", GPU, ("GPU-2::1", "Unhealthy"))),
    # a kubelet without the feature gate: no allocatedResourcesStatus at all
    ("ml", "trainer-1"): pod("ml", "trainer-1", {"name": "main", "ready": True}),
    ("ml", "mig-a"): pod("ml", "mig-a", health("main", "nvidia.com/mig-3g.40gb", ("MIG-3a", "Healthy"))),
    ("ml", "fine"): pod("ml", "fine", health("main", GPU, ("GPU-0", "Healthy"))),
}


def lookups() -> dict[tuple[str, str], PodLookup]:
    out = {k: PodLookup(pod=v) for k, v in PODS.items()}
    out[("ml", "gone")] = PodLookup()
    out[("team-x", "secret")] = PodLookup(error='Forbidden (403): pods "secret" is forbidden')
    return out


def by_pod(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{r['namespace']}/{r['name']}": r for r in rows}


def test_each_held_out_gpus_pods_with_the_kubelets_health_beside_gpuhealths_verdict() -> None:
    held = held_out_holders(rep())
    assert [g["gpu"] for g in held] == [2, 3]  # GPU 0 is in service: its pod is not read
    # GPU 3 has only instance MIG-3a held out: only that instance's pod, matched by its MIG UUID.
    assert pods_to_read(held) == [
        ("ml", "gone"),
        ("ml", "mig-a"),
        ("ml", "trainer-0"),
        ("ml", "trainer-1"),
        ("team-x", "secret"),
    ]
    rows = by_pod(kubelet_view(held, lookups()))
    t0 = rows["ml/trainer-0"]
    assert t0["gpu"] == 2 and t0["gpuhealth"] == {"state": "Draining", "reason": "EccUncorrected"}
    assert t0["kubelet"]["health"] == "Unhealthy" and t0["kubelet"]["resourceIds"] == ["GPU-2::1"]
    assert t0["container"] == "main" and t0["resource"] == GPU
    assert rows["ml/trainer-1"]["kubelet"] == {"health": None, "note": NOT_REPORTED}
    assert rows["ml/gone"]["kubelet"] == {"health": None, "note": GONE}
    assert rows["team-x/secret"]["kubelet"]["note"].startswith("cannot read the pod: Forbidden (403)")
    assert rows["ml/mig-a"]["kubelet"]["health"] == "Healthy" and rows["ml/mig-a"]["gpu"] == 3
    assert "ml/mig-b" not in rows and "ml/fine" not in rows


def test_a_device_the_kubelet_reports_for_another_gpu_is_not_this_gpus_health() -> None:
    held = held_out_holders(rep())
    other = {
        **lookups(),
        ("ml", "trainer-0"): PodLookup(pod=pod("ml", "trainer-0", health("main", GPU, ("GPU-5", "Unhealthy")))),
    }
    row = by_pod(kubelet_view(held, other))["ml/trainer-0"]
    assert row["kubelet"]["health"] is None and row["kubelet"]["note"].startswith(NOT_REPORTED)
    assert "other devices" in row["kubelet"]["note"]


def test_a_dra_gpus_held_out_instance_pods_from_the_mig_layout_match_by_dra_device() -> None:
    record = {"index": 1, "uuid": "GPU-1", "state": "Quarantined", "reason": "XID", "devices": [DRA]}
    layout = [
        {
            "gpu": 1,
            "instances": [{"heldOut": True, "pods": ["team-a/tenant-a"]}, {"heldOut": False, "pods": ["team-b/b"]}],
        }
    ]
    held = held_out_holders(
        report("a", "Degraded", spec={"devices": [{"index": 1, "uuid": "GPU-1"}]}, devices=[record]), layout
    )
    assert held[0]["pods"] == [{"namespace": "team-a", "name": "tenant-a", "container": None, "resource": None}]
    tenant = pod("team-a", "tenant-a", health("c", "claim:gpu/req", (DRA, "Unhealthy")))
    (row,) = kubelet_view(held, {("team-a", "tenant-a"): PodLookup(pod=tenant)})
    assert row["kubelet"]["health"] == "Unhealthy" and row["kubelet"]["containers"] == ["c"]


def test_describe_text_shows_the_section_only_when_a_held_out_gpu_has_pods() -> None:
    model = describe_node("a", node("a"), rep(), None, [], NOW)
    model["kubeletHealth"] = kubelet_view(held_out_holders(rep()), lookups())
    text = render_describe(model)
    section = text[text.index("Pods on held-out GPUs") :]
    line = next(ln for ln in section.splitlines() if "ml/trainer-0" in ln)
    assert line.split()[:3] == ["2", "Draining", "(EccUncorrected)"] and line.split()[-2:] == ["main", "Unhealthy"]
    assert next(ln for ln in section.splitlines() if "ml/trainer-1" in ln).endswith(NOT_REPORTED)
    assert next(ln for ln in section.splitlines() if "ml/gone" in ln).endswith(GONE)
    assert "Healthy: the device plugin has not seen this fault" in section  # ml/mig-a
    model["kubeletHealth"] = []
    assert "Pods on held-out GPUs" not in render_describe(model)


class FakeClient:
    """The reads `describe` makes, pods by name; team-x's pods are forbidden."""

    def __init__(self) -> None:
        self.pods_read: list[tuple[str, str]] = []

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.pods_read.append((namespace, name))
        if namespace == "team-x":
            raise ApiError(f'get pod/{name} -n {namespace}: Forbidden (403): pods "{name}" is forbidden', 403)
        return PODS.get((namespace, name))

    def __getattr__(self, name: str) -> Any:
        values: dict[str, Any] = {
            "get_node": node("a"),
            "get_report": rep(),
            "get_policy": None,
            "node_events": [],
            "get_lease": None,
            "node_resource_slices": [],
            "node_pods": [],
            "namespace_resource_claims": [],
        }
        return lambda *args: values[name]


def _describe(client: FakeClient, *extra: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()

    def factory(_: argparse.Namespace) -> Any:
        return client

    code = cli.run(["describe", "a", *extra], out=out, err=err, clock=lambda: NOW, client_factory=factory)
    return code, out.getvalue(), err.getvalue()


def test_describe_reads_each_holding_pod_once_and_a_forbidden_or_gone_pod_is_a_row() -> None:
    client = FakeClient()
    code, out, err = _describe(client)
    assert code == 0, err
    assert sorted(client.pods_read) == [
        ("ml", "gone"),
        ("ml", "mig-a"),
        ("ml", "trainer-0"),
        ("ml", "trainer-1"),
        ("team-x", "secret"),
    ]
    line = next(ln for ln in out.splitlines() if "ml/trainer-0" in ln)
    assert "Draining (EccUncorrected)" in line and line.endswith("Unhealthy")
    assert "cannot read the pod: get pod/secret -n team-x: Forbidden (403)" in out
    code, out, _ = _describe(FakeClient(), "-o", "json")
    rows = by_pod(json.loads(out)["kubeletHealth"])
    assert code == 0 and rows["ml/trainer-0"]["kubelet"]["health"] == "Unhealthy"
    assert rows["ml/gone"]["kubelet"]["note"] == GONE
