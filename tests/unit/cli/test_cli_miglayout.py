"""`describe`'s MIG layout: instances, profiles, IDs, held-out devices and the pods on each, from
slices shaped as NVIDIA's DRA driver publishes them, claims and pods shaped as the API returns them."""

from __future__ import annotations

import argparse
import io
from pathlib import Path
from typing import Any

from devkit import dra_shapes as S
from gpuhealth.cli import main as cli
from gpuhealth.cli.describe_text import render_describe
from gpuhealth.cli.errors import ApiError
from gpuhealth.cli.miglayout import PLUGIN_NOTE, layout_lines, mig_layout, wanted
from tests.unit.cli.objects import NOW, ago, node, report

NODE = "gpu-node-0042"
DRIVER = S.DRIVER
MIG2 = ("gpu-2-mig-3g40gb-9-0", "gpu-2-mig-3g40gb-9-4")


def uuid(i: int) -> str:
    return f"GPU-0000000{i}-aaaa-bbbb-cccc-00000000000{i}"


def mig_uuid(start: int) -> str:
    return S.mig_uuid(uuid(2), "3g.40gb", start)


def static_slices() -> list[dict[str, Any]]:
    mig = (("3g.40gb", 0), ("3g.40gb", 4))
    return S.static_slices(NODE, [S.Gpu(i, uuid(i), mig if i == 2 else ()) for i in range(4)]).slices


def spec(mig_gpu: int | None = 2) -> dict[str, Any]:
    devices: list[dict[str, Any]] = [{"index": i, "uuid": uuid(i)} for i in range(4)]
    if mig_gpu is not None:
        devices[mig_gpu]["migMode"] = "Enabled"
        devices[mig_gpu]["migDevices"] = [
            {"index": i, "uuid": mig_uuid(st), "gpuInstanceId": i + 1, "computeInstanceId": 0, "profile": "3g.40gb"}
            for i, st in enumerate((0, 4))
        ]
    return {"devices": devices}


def held(*devices: str) -> dict[str, Any]:
    """GPU 2's record with ``devices`` held out on their own (RepeatedAppXID on one instance)."""
    return {
        "index": 2,
        "uuid": uuid(2),
        "state": "Quarantined",
        "reason": "RepeatedAppXID",
        "since": ago(60),
        "devices": [f"{DRIVER}/{NODE}/{d}" for d in devices],
        "partitions": [f"{DRIVER}/{NODE}/{d}" for d in devices],
        "taintRules": [f"gpuhealth-{NODE}-{d}" for d in devices],
        "instances": [mig_uuid(0)],
    }


def claim(ns: str, pod: str, device: str, reserved: bool = True) -> dict[str, Any]:
    status: dict[str, Any] = {
        "allocation": {
            "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In"}]}]},
        }
    }
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}]
    return {"metadata": {"name": f"{pod}-gpu-x7k2p", "namespace": ns}, "status": status}


def pod(ns: str, name: str, claim_name: str | None = None, limits: dict[str, str] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Running"}
    if claim_name:
        status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    return {
        "metadata": {"name": name, "namespace": ns},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "resources": {"limits": limits or {}}}]},
        "status": status,
    }


def layout(rep: dict[str, Any], slices: list[dict[str, Any]], claims: list[Any], pods: list[Any]) -> list[Any]:
    return mig_layout(NODE, rep, slices, claims, pods, (DRIVER,))


def test_static_mig_instances_carry_profile_ids_uuid_hold_and_their_own_pods() -> None:
    rep = report(NODE, "Degraded", spec=spec(), devices=[held(MIG2[0])])
    claims = [claim("team-a", "tenant-a", MIG2[0]), claim("team-b", "tenant-b", MIG2[1], reserved=False)]
    pods = [pod("team-b", "tenant-b", "tenant-b-gpu-x7k2p")]  # B's claim not yet reserved: its pod names it
    (gpu,) = layout(rep, static_slices(), claims, pods)
    assert (gpu["gpu"], gpu["via"], gpu["migMode"]) == (2, "dra", "Enabled")
    a, b = gpu["instances"]
    assert a == {
        "device": MIG2[0],
        "profile": "3g.40gb",
        "gpuInstanceId": 1,
        "computeInstanceId": 0,
        "migUuid": mig_uuid(0),
        "heldOut": True,
        "taintRule": f"gpuhealth-{NODE}-{MIG2[0]}",
        "pods": ["team-a/tenant-a"],
    }
    assert (b["device"], b["gpuInstanceId"], b["heldOut"], b["taintRule"], b["pods"]) == (
        MIG2[1],
        2,
        False,
        None,
        ["team-b/tenant-b"],
    )


def test_the_whole_gpu_held_out_marks_every_instance_and_in_service_marks_none() -> None:
    whole = {**held(*MIG2), "instances": []}
    (gpu,) = layout(report(NODE, "Degraded", spec=spec(), devices=[whole]), static_slices(), [], [])
    assert [i["heldOut"] for i in gpu["instances"]] == [True, True]
    back = {**whole, "state": "InService"}
    (gpu,) = layout(report(NODE, "Healthy", spec=spec(), devices=[back]), static_slices(), [], [])
    assert [i["heldOut"] for i in gpu["instances"]] == [False, False]


def test_a_node_without_mig_has_no_layout_and_is_not_worth_listing_claims_for() -> None:
    plain = S.static_slices(NODE, [S.Gpu(i, uuid(i)) for i in range(4)]).slices
    rep = report(NODE, "Healthy", spec=spec(None))
    assert not wanted(rep, plain) and layout(rep, plain, [], []) == []
    assert wanted(rep, static_slices()) and wanted(report(NODE, "Healthy", spec=spec()), [])
    assert layout_lines([]) == []


def test_device_plugin_mig_lists_the_reported_instances_and_the_nodes_mig_pods_without_a_device() -> None:
    rep = report(NODE, "Healthy", spec=spec())
    pods = [pod("ml", "infer-0", limits={"nvidia.com/mig-3g.40gb": "1"}), pod("ml", "cpu-only")]
    (gpu,) = layout(rep, [], [], pods)
    assert gpu["via"] == "device-plugin" and gpu["note"] == PLUGIN_NOTE
    assert [(i["device"], i["gpuInstanceId"], i["migUuid"]) for i in gpu["instances"]] == [
        (None, 1, mig_uuid(0)),
        (None, 2, mig_uuid(4)),
    ]
    assert gpu["pluginPods"] == ["ml/infer-0 (nvidia.com/mig-3g.40gb)"]
    text = "\n".join(layout_lines([gpu]))
    assert "pods cannot be told apart per instance" in text and "ml/infer-0" in text


def test_a_mig_gpu_the_slices_publish_whole_is_dra_and_says_the_slices_lag() -> None:
    plain = S.static_slices(NODE, [S.Gpu(i, uuid(i)) for i in range(4)]).slices
    (gpu,) = layout(report(NODE, "Healthy", spec=spec()), plain, [], [])
    assert gpu["via"] == "dra" and "publish no MIG device of this GPU" in gpu["note"]
    assert [i["device"] for i in gpu["instances"]] == [None, None]  # the reported instances, without a device


def test_partitionable_gpu_shows_only_allocated_placements_and_counts_the_rest() -> None:
    slices = S.partitionable_slices(NODE, [S.Gpu(i, uuid(i)) for i in range(2)]).slices
    placement = "gpu-1-mig-3g40gb-9-4"
    rep = report(NODE, "Healthy", spec={"devices": [{"index": i, "uuid": uuid(i)} for i in range(2)]})
    gpus = layout(rep, slices, [claim("ml", "slice-0", placement)], [])
    assert [g["gpu"] for g in gpus] == [0, 1]
    idle, used = gpus
    assert idle["instances"] == [] and idle["freePlacements"] == 14
    ((row,),) = [used["instances"]]
    assert (row["device"], row["profile"], row["migUuid"], row["pods"]) == (placement, "3g.40gb", None, ["ml/slice-0"])
    assert used["freePlacements"] == 13
    text = "\n".join(layout_lines(gpus))
    assert "(no instance allocated or reported)" in text and "13 more placements published, none allocated" in text


def test_describe_renders_the_pod_on_its_instance_and_the_held_one_marked() -> None:
    rep = report(NODE, "Degraded", spec=spec(), devices=[held(MIG2[0])])
    claims = [claim("team-a", "tenant-a", MIG2[0]), claim("team-b", "tenant-b", MIG2[1])]
    gpus = layout(rep, static_slices(), claims, [])
    text = render_describe(
        {"node": NODE, "nodeExists": True, "hasReport": True, "generatedAt": NOW.isoformat(), "migLayout": gpus}
    )
    assert f"GPU 2 ({uuid(2)}): MIG Enabled, DRA devices" in text
    row_a = next(ln for ln in text.splitlines() if ln.strip().startswith(MIG2[0]))
    row_b = next(ln for ln in text.splitlines() if ln.strip().startswith(MIG2[1]))
    assert f"HELD OUT (gpuhealth-{NODE}-{MIG2[0]})" in row_a and row_a.endswith("team-a/tenant-a")
    assert "HELD OUT" not in row_b and row_b.endswith("team-b/tenant-b")
    assert row_a.split()[1:4] == ["3g.40gb", "1", "0"] and mig_uuid(0) in row_a


class FakeClient:
    """The reads `describe` makes; ``forbidden`` names the lists the user may not make."""

    def __init__(self, rep: dict[str, Any], forbidden: tuple[str, ...] = ()) -> None:
        self.rep, self.forbidden, self.calls = rep, forbidden, []  # type: ignore[var-annotated]
        self.namespaces: list[str] = []

    def __getattr__(self, name: str) -> Any:
        values = {
            "get_node": node(NODE),
            "get_report": self.rep,
            "get_policy": None,
            "node_events": [],
            "get_lease": None,
            "node_resource_slices": static_slices(),
            "node_pods": [pod("team-a", "tenant-a"), pod("team-c", "plain")],
        }
        claims = {"team-a": [claim("team-a", "tenant-a", MIG2[0])], "team-b": [claim("team-b", "elsewhere", MIG2[1])]}

        def call(*args: Any) -> Any:
            self.calls.append(name)
            if name in self.forbidden:
                raise ApiError(f"{name}: Forbidden (403): no", 403)
            if name == "namespace_resource_claims":
                self.namespaces.append(args[0])
                return claims.get(args[0], [])
            return values[name]

        return call


def _describe(client: FakeClient, *extra: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()

    def factory(_: argparse.Namespace) -> Any:
        return client

    code = cli.run(["describe", NODE, *extra], out=out, err=err, clock=lambda: NOW, client_factory=factory)
    return code, out.getvalue()


def test_describe_command_reads_claims_only_for_a_mig_node_and_survives_a_forbidden_list() -> None:
    mig = FakeClient(report(NODE, "Healthy", spec=spec()))
    code, out = _describe(mig)
    assert code == 0 and "team-a/tenant-a" in out
    # Only the namespaces the node's pods run in: team-b's claim (no pod of it here) is never read.
    assert mig.namespaces == ["team-a", "team-c"] and "team-b" not in out
    plain = FakeClient(report(NODE, "Healthy", spec=spec(None)), forbidden=("node_resource_slices",))
    code, out = _describe(plain)
    assert code == 0 and "incomplete: node_resource_slices: Forbidden (403)" in out
    assert "namespace_resource_claims" not in plain.calls
    denied = FakeClient(report(NODE, "Healthy", spec=spec()), forbidden=("namespace_resource_claims",))
    code, out = _describe(denied, "-o", "json")
    assert code == 0 and '"migLayoutErrors"' in out and '"gpuInstanceId": 1' in out


def example() -> str:
    """The runbook's example: GPU 2's instance A held out by a repeated application XID, a pod on each."""
    rep = report(NODE, "Degraded", spec=spec(), devices=[held(MIG2[0])])
    claims = [claim("team-a", "tenant-a", MIG2[0]), claim("team-b", "tenant-b", MIG2[1])]
    return "\n".join(layout_lines(layout(rep, static_slices(), claims, []))[1:])


def test_the_runbooks_example_is_this_fixtures_output() -> None:
    runbook = (Path(__file__).resolve().parents[3] / "docs" / "runbook.md").read_text(encoding="utf-8")
    assert f"```text\n{example()}\n```" in runbook
