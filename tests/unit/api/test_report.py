"""GPUNodeHealth parsing: the agent's facts, and the reports the operator must refuse."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest

from gpuhealth.api.recovery import RecoveryAction
from gpuhealth.api.report import Device, MigDevice, PodHold, PodResources, ReportError, parse_report
from tests.unit.builders import NODE, T0, at, gpu, iso, report_obj, xid_event


def test_full_report_is_parsed() -> None:
    obj = report_obj(
        devices=[
            gpu(
                1,
                lost=False,
                ecc={"volatileUncorrected": 2, "aggregateUncorrected": 5, "volatileCorrected": 9},
                retiredPages={"pending": True, "doubleBitEcc": 1},
                remappedRows={"pending": True, "failure": True, "corrected": 3},
                temperature={"currentC": 71, "slowdownC": 87, "shutdownC": 92},
                clockEventReasons=0x40,
                clockEventsSince=iso(-30),
                recoveryAction="Reboot",
                powerW=350.5,
            ),
            gpu(0),
        ],
        xids=[xid_event(79, 5, 1), xid_event(13, -5, 0)],
        heartbeat=10,
    )
    r = parse_report(obj)
    assert r.node == NODE
    assert (r.heartbeat, r.observed) == (at(10), T0)
    assert r.nvml_available and r.nvml_error == ""
    assert r.resource_version == "42"
    assert [d.index for d in r.devices] == [0, 1]  # sorted by index
    d1 = r.device(1)
    assert d1 == Device(
        index=1,
        uuid="GPU-0001",
        model="NVIDIA H100 80GB HBM3",
        lost=False,
        ecc_volatile_uncorrected=2,
        ecc_aggregate_uncorrected=5,
        retired_pending=True,
        remap_pending=True,
        remap_failure=True,
        temperature_c=71,
        slowdown_c=87,
        clock_event_reasons=0x40,
        clock_events_since=at(-30),
        recovery_action=RecoveryAction("Reboot"),
    )
    assert d1.label == "GPU 1 (GPU-0001)"
    assert r.device(0) == Device(index=0, uuid="GPU-0000", model="NVIDIA H100 80GB HBM3")
    assert r.device(7) is None
    assert r.device(None) is None
    assert [(e.xid, e.gpu, e.time) for e in r.xids] == [(13, 0, at(-5)), (79, 1, at(5))]  # oldest first


def test_minimal_report_defaults() -> None:
    r = parse_report({"metadata": {"name": "n1"}, "spec": {"nodeName": "n1"}})
    assert r.node == "n1"
    assert r.heartbeat is None and r.observed is None
    assert r.devices == () and r.xids == ()
    assert not r.nvml_available  # no nvml section and no devices: nothing was read
    assert dict(r.status) == {}


def test_node_name_defaults_to_the_object_name() -> None:
    obj = report_obj()
    del obj["spec"]["nodeName"]
    assert parse_report(obj).node == NODE


def test_nvml_section_absent_but_devices_present_means_available() -> None:
    obj = report_obj()
    del obj["spec"]["nvml"]
    assert parse_report(obj).nvml_available


def test_nvml_unavailable_carries_the_error() -> None:
    r = parse_report(report_obj(devices=[], nvml={"available": False, "error": "NVML_ERROR_DRIVER_NOT_LOADED"}))
    assert not r.nvml_available
    assert r.nvml_error == "NVML_ERROR_DRIVER_NOT_LOADED"


def test_status_is_carried_through() -> None:
    obj = report_obj()
    obj["status"] = {"state": "Quarantined", "pending": {"temp/0": iso(0)}}
    assert parse_report(obj).status["state"] == "Quarantined"


def test_xid_without_gpu_and_with_uuid() -> None:
    ev = {"xid": 79, "time": iso(1), "uuid": "GPU-abc"}
    r = parse_report(report_obj(xids=[ev]))
    assert (r.xids[0].gpu, r.xids[0].uuid) == (None, "GPU-abc")


def test_timestamps_with_offsets_and_fractions_are_utc_aware() -> None:
    ev = {"xid": 31, "time": "2025-01-01T13:00:00.250+01:00"}
    r = parse_report(report_obj(xids=[ev], heartbeatTime="2025-01-01T12:00:00"))
    assert r.xids[0].time == T0 + dt.timedelta(milliseconds=250)
    assert r.heartbeat == T0 and r.heartbeat.tzinfo is not None


def test_malformed_heartbeat_is_treated_as_missing() -> None:
    assert parse_report(report_obj(heartbeatTime="yesterday")).heartbeat is None


# --- MIG ----------------------------------------------------------------------------------------

MIGS = [
    {"index": 2, "uuid": "MIG-b", "gpuInstanceId": 5, "computeInstanceId": 1, "profile": "1g.10gb"},
    {"index": 0, "uuid": "MIG-a", "gpuInstanceId": 1, "computeInstanceId": 0, "profile": "3g.40gb"},
    {"index": 1, "uuid": "MIG-c", "gpuInstanceId": 5, "computeInstanceId": 0},
    {"index": 3},
]


def test_mig_devices_and_xid_instances_are_parsed() -> None:
    xid = {**xid_event(31, 1, 2), "gpuInstanceId": 5, "computeInstanceId": 1}
    r = parse_report(report_obj(devices=[gpu(2, migMode="Enabled", migDevices=MIGS), gpu(0)], xids=[xid]))
    d2 = r.device(2)
    assert d2 is not None
    assert d2.mig_devices == (
        MigDevice(0, "MIG-a", 1, 0, "3g.40gb"),
        MigDevice(1, "MIG-c", 5, 0, ""),
        MigDevice(2, "MIG-b", 5, 1, "1g.10gb"),
        MigDevice(3),
    )
    assert r.device(0) is not None and r.device(0).mig_devices == ()  # type: ignore[union-attr]
    (event,) = r.xids
    assert (event.gpu, event.gpu_instance, event.compute_instance) == (2, 5, 1)
    assert parse_report(report_obj(xids=[xid_event(31, 1, 0)])).xids[0].gpu_instance is None


def test_report_names_the_mig_device_an_xid_hit() -> None:
    r = parse_report(report_obj(devices=[gpu(2, migMode="Enabled", migDevices=MIGS), gpu(0)]))
    assert r.mig_device(2, 5, 1) == MigDevice(2, "MIG-b", 5, 1, "1g.10gb")
    assert r.mig_device(2, 1, None) == MigDevice(0, "MIG-a", 1, 0, "3g.40gb")  # the GI's only device
    assert r.mig_device(2, 5, None) is None  # two compute instances in GI 5: ambiguous
    assert r.mig_device(2, 5, 7) is None
    assert r.mig_device(2, None, None) is None
    assert r.mig_device(0, 1, 0) is None  # a GPU without MIG devices
    assert r.mig_device(None, 1, 0) is None
    assert r.mig_device(9, 1, 0) is None


# --- refused reports ---------------------------------------------------------------------------


def _with(**spec: Any) -> dict[str, Any]:
    obj = report_obj()
    obj["spec"].update(spec)
    return obj


BAD: list[tuple[dict[str, Any], str]] = [
    (
        _with(nodeName="other-node"),
        r"spec\.nodeName: 'other-node' does not match the report's name 'gpu-node-1'",
    ),
    (_with(devices=[gpu(0), gpu(1), gpu(0)]), r"spec\.devices\[2\]\.index: duplicate GPU index 0"),
    (_with(devices=["GPU-0"]), r"spec\.devices\[0\]: must be an object"),
    (_with(devices=[{"index": "0"}]), r"spec\.devices\[0\]\.index: expected an integer"),
    (_with(devices=[{"index": True}]), r"spec\.devices\[0\]\.index: expected an integer"),
    (
        _with(devices=[gpu(0, ecc={"volatileUncorrected": 1.5})]),
        r"spec\.devices\[0\]\.ecc\.volatileUncorrected",
    ),
    (_with(devices=[gpu(0, clockEventReasons="0x40")]), r"spec\.devices\[0\]\.clockEventReasons"),
    (_with(devices=[gpu(0, migDevices={"index": 0})]), r"spec\.devices\[0\]\.migDevices: must be a list"),
    (_with(devices=[gpu(0, migDevices=["MIG-1"])]), r"spec\.devices\[0\]\.migDevices\[0\]: must be an object"),
    (_with(devices=[gpu(0, migDevices=[{"uuid": "MIG-1"}])]), r"spec\.devices\[0\]\.migDevices\[0\]\.index: missing"),
    (
        _with(devices=[gpu(0, migDevices=[{"index": 16}])]),
        r"spec\.devices\[0\]\.migDevices\[0\]\.index: expected 0\.\.15",
    ),
    (
        _with(devices=[gpu(0, migDevices=[{"index": 1}, {"index": 1}])]),
        r"spec\.devices\[0\]\.migDevices\[1\]\.index: duplicate MIG device index 1",
    ),
    (
        _with(devices=[gpu(0, migDevices=[{"index": 0, "gpuInstanceId": "2"}])]),
        r"spec\.devices\[0\]\.migDevices\[0\]\.gpuInstanceId",
    ),
    (
        _with(devices=[gpu(0, migDevices=[{"index": 0, "computeInstanceId": -1}])]),
        r"spec\.devices\[0\]\.migDevices\[0\]\.computeInstanceId",
    ),
    (_with(devices=[gpu(0, migDevices=[{"index": 0, "profile": 3}])]), r"spec\.devices\[0\]\.migDevices\[0\]\.profile"),
    (_with(devices=[gpu(0, migDevices=[{"index": 0, "uuid": 7}])]), r"spec\.devices\[0\]\.migDevices\[0\]\.uuid"),
    (
        _with(xidEvents=[{"xid": 31, "time": iso(0), "gpuInstanceId": True}]),
        r"spec\.xidEvents\[0\]\.gpuInstanceId",
    ),
    (
        _with(xidEvents=[{"xid": 31, "time": iso(0), "computeInstanceId": 1.5}]),
        r"spec\.xidEvents\[0\]\.computeInstanceId",
    ),
    (_with(devices=[gpu(0, recoveryAction=2)]), r"spec\.devices\[0\]\.recoveryAction: expected a string"),
    (_with(xidEvents=[xid_event(79, 0), {"xid": 79, "time": "not a time"}]), r"spec\.xidEvents\[1\]\.time"),
    (_with(xidEvents=[{"xid": 79}]), r"spec\.xidEvents\[0\]\.time: missing"),
    (_with(xidEvents=["79"]), r"spec\.xidEvents\[0\]\.time"),
    (_with(xidEvents=[{"xid": 0, "time": iso(0)}]), r"spec\.xidEvents\[0\]\.xid: 0 is outside 1\.\.1023"),
    (
        _with(xidEvents=[{"xid": 1024, "time": iso(0)}]),
        r"spec\.xidEvents\[0\]\.xid: 1024 is outside 1\.\.1023",
    ),
    (_with(xidEvents=[{"xid": -79, "time": iso(0)}]), r"spec\.xidEvents\[0\]\.xid"),
    (_with(xidEvents=[{"xid": "79", "time": iso(0)}]), r"spec\.xidEvents\[0\]\.xid: expected an integer"),
    ({"metadata": {"name": NODE}, "spec": ["nodeName"]}, r"spec: must be an object"),
    (
        _with(devices=[gpu(0), gpu(1)], xidEvents=[{"xid": 79, "gpu": 12, "time": iso(0)}]),
        r"spec\.xidEvents\[0\]\.gpu: GPU 12 is not among the report's devices",
    ),
]


@pytest.mark.parametrize(("obj", "message"), BAD, ids=[m.split(":")[0].replace("\\", "") for _, m in BAD])
def test_untrustworthy_report_raises_report_error(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(ReportError, match=message):
        parse_report(obj)


@pytest.mark.parametrize("code", [1, 1023])
def test_xid_range_bounds_are_inclusive(code: int) -> None:
    assert parse_report(_with(xidEvents=[{"xid": code, "time": iso(0)}])).xids[0].xid == code


def test_report_error_is_a_value_error() -> None:
    assert issubclass(ReportError, ValueError)


# ---- the fabric between GPUs (api/report_fabric.py) ------------------------------------------------


def _fabric_report(device: dict[str, object], nics: list[dict[str, object]] | None = None) -> dict[str, object]:
    spec: dict[str, object] = {"nodeName": "n1", "devices": [{"index": 0, **device}]}
    if nics is not None:
        spec["nics"] = nics
    return {"metadata": {"name": "n1"}, "spec": spec}


def test_fabric_facts_parse_into_typed_values() -> None:
    report = parse_report(
        _fabric_report(
            {
                "clockEventReasons": 0x88,
                "nvlink": {"links": 18, "active": 17, "speedMBps": 26562, "peers": [3, 1, 2]},
                "fabric": {
                    "state": "Completed",
                    "status": 0,
                    "clusterUuid": "1b9e1a6c-3e57-4f2a-9d0e-6b3f2a1c4d5e",
                    "cliqueId": 7,
                    "healthSummary": "Unhealthy",
                    "degradedBandwidth": False,
                    "routeUnhealthy": True,
                    "incorrectConfiguration": "None",
                },
                "pcie": {"width": 8, "maxWidth": 16, "generation": 5, "maxGeneration": 5},
                "clocks": {"throttleWindowS": 300, "hwPowerBrakePercent": 40},
            },
            [
                {
                    "device": "mlx5_0",
                    "port": 1,
                    "state": "DOWN",
                    "symbolErrorsPerMin": 0.5,
                    "saturated": ["symbol_error"],
                }
            ],
        )
    )
    d = report.devices[0]
    assert d.nvlink is not None and d.nvlink.inactive == 1 and d.nvlink.peers == (1, 2, 3)
    assert d.fabric is not None and d.fabric.faults == ("routeUnhealthy",)
    assert d.fabric.clique == "1b9e1a6c-3e57-4f2a-9d0e-6b3f2a1c4d5e.7" and not d.fabric.probe_failed
    assert d.pcie is not None and d.pcie.downtrained
    assert d.clocks is not None and d.clocks.hw_power_brake_pct == 40
    assert d.clock_reasons == ("HwSlowdown", "HwPowerBrakeSlowdown")
    assert report.nics[0].down and report.nics[0].saturated == ("symbol_error",)


def test_a_mask_of_false_sub_fields_parses_to_no_fault() -> None:
    fab = {"state": "Completed", "status": 0, "degradedBandwidth": False, "routeRecovery": False}
    report = parse_report(_fabric_report({"fabric": {**fab, "routeUnhealthy": False, "accessTimeoutRecovery": False}}))
    assert report.devices[0].fabric is not None and report.devices[0].fabric.faults == ()


@pytest.mark.parametrize(
    ("device", "nics", "message"),
    [
        ({"nvlink": {"links": 40}}, None, "spec.devices[0].nvlink.links: expected 0..36"),
        ({"nvlink": {"peers": "all"}}, None, "spec.devices[0].nvlink.peers: must be a list"),
        ({"fabric": {"state": "Done"}}, None, "spec.devices[0].fabric.state: 'Done' is not one of"),
        ({"fabric": {"routeUnhealthy": 1}}, None, "spec.devices[0].fabric.routeUnhealthy: expected a boolean"),
        ({"clocks": {"hwThermalPercent": 140}}, None, "spec.devices[0].clocks.hwThermalPercent: expected 0..100"),
        ({}, [{"device": "mlx5_0"}], "spec.nics[0]: device and port are required"),
        ({}, [{"device": "mlx5_0", "port": 1, "symbolErrorsPerMin": -1}], "spec.nics[0].symbolErrorsPerMin"),
    ],
)
def test_malformed_fabric_facts_are_refused_naming_the_field(
    device: dict[str, object], nics: list[dict[str, object]] | None, message: str
) -> None:
    with pytest.raises(ReportError, match=re.escape(message)):
        parse_report(_fabric_report(device, nics))


# -- the pods holding each GPU (the kubelet's pod-resources API) -----------------------------------

_HOLD = {"namespace": "ml", "name": "train-0", "container": "main", "resource": "nvidia.com/gpu"}


def test_the_pods_holding_each_gpu_and_mig_device_are_parsed() -> None:
    mig_hold = {**_HOLD, "name": "infer-0", "resource": "nvidia.com/mig-1g.10gb"}
    r = parse_report(
        report_obj(
            devices=[
                gpu(0, pods=[{**_HOLD, "name": "train-1"}, _HOLD, _HOLD]),  # time-slicing: one container twice
                gpu(
                    1,
                    migMode="Enabled",
                    migDevices=[
                        {"index": 1, "uuid": "MIG-b", "pods": [mig_hold]},
                        {"index": 0, "uuid": "MIG-a", "pods": [mig_hold, {**mig_hold, "container": "side"}]},
                    ],
                ),
                gpu(2),
            ],
            podResources={"available": True},
        )
    )
    assert r.pod_resources == PodResources(True, "")
    hold = PodHold("ml", "train-0", "main", "nvidia.com/gpu")
    assert r.devices[0].pods == (hold, PodHold("ml", "train-1", "main", "nvidia.com/gpu"))
    assert r.devices[1].pods == () and r.devices[1].mig_devices[0].pods[1].container == "side"
    assert r.holders(0) == r.devices[0].pods
    # A GPU's holders: its own and its MIG devices', each once, sorted.
    assert r.holders(1) == (
        PodHold("ml", "infer-0", "main", "nvidia.com/mig-1g.10gb"),
        PodHold("ml", "infer-0", "side", "nvidia.com/mig-1g.10gb"),
    )
    assert r.holders(2) == () and r.holders(9) == ()


def test_pod_resources_absent_unavailable_and_available() -> None:
    assert parse_report(report_obj()).pod_resources is None  # the agent does not read the socket
    down = parse_report(report_obj(podResources={"available": False, "error": "connection refused"}))
    assert down.pod_resources == PodResources(False, "connection refused")
    assert parse_report(report_obj(podResources={"available": True})).pod_resources == PodResources(True)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"podResources": "yes"}, "spec.podResources: must be an object"),
        ({"podResources": {}}, "spec.podResources.available: expected a boolean"),
        ({"podResources": {"available": "true"}}, "spec.podResources.available: expected a boolean"),
        ({"podResources": {"available": False, "error": 3}}, "spec.podResources.error: expected a string"),
        ({"devices": [gpu(0, pods={"a": 1})]}, "spec.devices[0].pods: must be a list"),
        ({"devices": [gpu(0, pods=["ml/train-0"])]}, "spec.devices[0].pods[0]: must be an object"),
        ({"devices": [gpu(0, pods=[{**_HOLD, "namespace": None}])]}, "spec.devices[0].pods[0].namespace: expected"),
        ({"devices": [gpu(0, pods=[{**_HOLD, "resource": ""}])]}, "spec.devices[0].pods[0].resource: expected"),
        (
            {"devices": [gpu(0, migDevices=[{"index": 0, "pods": [{"name": "x"}]}])]},
            "spec.devices[0].migDevices[0].pods[0].namespace: expected",
        ),
    ],
)
def test_malformed_pod_resources_are_refused_naming_the_field(spec: dict[str, Any], field: str) -> None:
    body = report_obj(**spec) if "devices" not in spec else report_obj(devices=spec["devices"])
    with pytest.raises(ReportError, match=re.escape(field)):
        parse_report(body)
