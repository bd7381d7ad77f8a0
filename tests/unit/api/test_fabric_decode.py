"""The fabric decoders against NVIDIA's own numbers: every constant ``api/fabric.py`` holds is read back
from ``nvml.h`` (the ``nvidia-nvml-dev`` wheel of the test extra), and the decoders are driven by
masks built from the header's values, not from the module's copy."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from devkit.fakenvml import build as fakenvml
from gpuhealth.api import fabric


@pytest.fixture(scope="module")
def nvml_h() -> dict[str, int]:
    """Every integer ``#define`` and enumerator of nvml.h, aliases resolved."""
    include = fakenvml.find_nvml_include()
    assert include is not None, "nvml.h not found: install the test extra (nvidia-nvml-dev)"
    text = Path(include, "nvml.h").read_text(errors="replace")
    raw: dict[str, str] = {}
    for name, value in re.findall(r"^\s*#define\s+(\w+)\s+(\(?[\w]+\)?)", text, re.M):
        raw.setdefault(name, value.strip("()"))
    for name, value in re.findall(r"^\s*(NVML_\w+)\s*=\s*(\w+)\s*,?", text, re.M):
        raw.setdefault(name, value)
    out: dict[str, int] = {}

    def resolve(name: str, depth: int = 0) -> int | None:
        value = raw.get(name)
        if value is None or depth > 8:
            return None
        m = re.fullmatch(r"(0x[0-9a-fA-F]+|\d+)[uUlL]*", value)
        if m:
            return int(m.group(1), 0)
        return resolve(value, depth + 1)

    for name in raw:
        v = resolve(name)
        if v is not None:
            out[name] = v
    return out


def test_fabric_states_and_summaries_are_nvidias(nvml_h: dict[str, int]) -> None:
    states = {
        "NotSupported": "NOT_SUPPORTED",
        "NotStarted": "NOT_STARTED",
        "InProgress": "IN_PROGRESS",
        "Completed": "COMPLETED",
    }
    assert {v: nvml_h[f"NVML_GPU_FABRIC_STATE_{states[n]}"] for v, n in fabric.FABRIC_STATES.items()} == {
        v: v for v in fabric.FABRIC_STATES
    }
    assert nvml_h["NVML_GPU_FABRIC_STATE_COMPLETED"] == fabric.STATE_COMPLETED
    summaries = {"NotSupported": "NOT_SUPPORTED", "Healthy": "HEALTHY", "Unhealthy": "UNHEALTHY"}
    summaries["LimitedCapacity"] = "LIMITED_CAPACITY"
    for value, name in fabric.HEALTH_SUMMARIES.items():
        assert nvml_h[f"NVML_GPU_FABRIC_HEALTH_SUMMARY_{summaries[name]}"] == value, name


@pytest.mark.parametrize("field", fabric.MASK_FIELDS, ids=lambda f: f.nvml)
def test_every_mask_sub_field_sits_where_nvml_h_puts_it(field: fabric.MaskField, nvml_h: dict[str, int]) -> None:
    assert nvml_h[f"NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_{field.nvml}"] == field.shift
    assert nvml_h[f"NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_{field.nvml}"] == field.width


@pytest.mark.parametrize("field", [*fabric.BOOLEAN_FIELDS, fabric.PARTITION_ASSIGNED], ids=lambda f: f.nvml)
def test_boolean_sub_fields_use_nvidias_true_false_and_not_supported(
    field: fabric.MaskField, nvml_h: dict[str, int]
) -> None:
    prefix = f"NVML_GPU_FABRIC_HEALTH_MASK_{field.nvml}"
    true, false, unsupported = (nvml_h[f"{prefix}_{s}"] for s in ("TRUE", "FALSE", "NOT_SUPPORTED"))
    assert (true, false, unsupported) == (fabric.MASK_TRUE, fabric.MASK_FALSE, fabric.MASK_NOT_SUPPORTED)
    shift = nvml_h[f"NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_{field.nvml}"]
    attr = fabric._ATTR[field.report]
    assert getattr(fabric.decode_health_mask(true << shift), attr) is True
    assert getattr(fabric.decode_health_mask(false << shift), attr) is False
    assert getattr(fabric.decode_health_mask(unsupported << shift), attr) is None


def test_incorrect_configuration_values_are_nvidias(nvml_h: dict[str, int]) -> None:
    names = {
        "None": "NONE",
        "IncorrectSysGuid": "INCORRECT_SYSGUID",
        "IncorrectChassisSerialNumber": "INCORRECT_CHASSIS_SN",
        "NoPartition": "NO_PARTITION",
        "InsufficientNvlinks": "INSUFFICIENT_NVLINKS",
        "IncompatibleGpuFirmware": "INCOMPATIBLE_GPU_FW",
        "InvalidLocation": "INVALID_LOCATION",
        "GpuStateInvalid": "GPU_STATE_INVALID",
    }
    shift = nvml_h["NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION"]
    for value, name in fabric.INCORRECT_CONFIGURATIONS.items():
        assert nvml_h[f"NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_{names[name]}"] == value, name
        health = fabric.decode_health_mask(value << shift)
        assert health.incorrect_configuration == name
        # 1 (NONE) is the correct configuration; 2 and up are faults.
        assert health.faults == (() if name == "None" else ("incorrectConfiguration",))
    unsupported = nvml_h["NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NOT_SUPPORTED"]
    assert fabric.decode_health_mask(unsupported << shift).incorrect_configuration is None
    # A value newer than the table is still a fault, named as unknown.
    assert fabric.decode_health_mask(0xE << shift).faults == ("incorrectConfiguration",)


def test_a_mask_of_false_sub_fields_is_no_fault(nvml_h: dict[str, int]) -> None:
    """EKS's agent learned it: a non-zero mask is not a fault. Every boolean 'false', a correct
    configuration and an assigned partition: a large mask, nothing wrong."""
    mask = 0
    for f in fabric.BOOLEAN_FIELDS:
        mask |= (
            nvml_h["NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE"]
            << nvml_h[f"NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_{f.nvml}"]
        )
    mask |= nvml_h["NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE"] << 8
    mask |= nvml_h["NVML_GPU_FABRIC_HEALTH_MASK_PARTITION_ASSIGNED_TRUE"] << 12
    assert mask != 0
    health = fabric.decode_health_mask(mask)
    assert health.faults == ()
    assert health.partition_assigned is True
    assert fabric.decode_health_mask(0x80).faults == ()  # ACCESS_TIMEOUT_RECOVERY false, alone
    assert fabric.health_fields(health) == {
        "degradedBandwidth": False,
        "routeRecovery": False,
        "routeUnhealthy": False,
        "accessTimeoutRecovery": False,
        "incorrectConfiguration": "None",
        "partitionAssigned": True,
    }


def test_route_unhealthy_true_is_a_fault_whatever_else_is_set(nvml_h: dict[str, int]) -> None:
    shift = nvml_h["NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY"]
    mask = (nvml_h["NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE"] << shift) | 0x2 | (0x1 << 8)
    health = fabric.decode_health_mask(mask)
    assert health.faults == ("routeUnhealthy",)
    assert health.degraded_bandwidth is False
    assert fabric.health_fields(fabric.decode_health_mask(0)) == {}


def test_clock_reasons_are_nvidias(nvml_h: dict[str, int]) -> None:
    for bit, name in fabric.CLOCK_REASONS.items():
        value = nvml_h.get(f"nvmlClocksEventReason{name}", nvml_h.get(f"nvmlClocksThrottleReason{name}"))
        assert value == bit, name
    assert nvml_h["nvmlClocksEventReasonGpuIdle"] == fabric.GPU_IDLE
    assert nvml_h["nvmlClocksThrottleReasonHwSlowdown"] == fabric.HW_SLOWDOWN
    assert nvml_h["nvmlClocksEventReasonSwThermalSlowdown"] == fabric.SW_THERMAL
    assert nvml_h["nvmlClocksThrottleReasonHwThermalSlowdown"] == fabric.HW_THERMAL
    assert nvml_h["nvmlClocksThrottleReasonHwPowerBrakeSlowdown"] == fabric.HW_POWER_BRAKE


def test_clock_reasons_split_one_name_per_bit() -> None:
    assert fabric.clock_reasons(0) == ()
    assert fabric.clock_reasons(0x1) == ("GpuIdle",)
    # 0x8 is a slowdown whose cause NVML does not give: never folded into thermal.
    assert fabric.clock_reasons(0x8) == ("HwSlowdown",)
    assert fabric.clock_reasons(0x80 | 0x40 | 0x4) == ("SwPowerCap", "HwThermalSlowdown", "HwPowerBrakeSlowdown")
    assert fabric.clock_reasons(0x1000) == ("0x1000",)


def test_field_ids_and_link_constants_are_nvidias(nvml_h: dict[str, int]) -> None:
    assert nvml_h["NVML_FI_DEV_NVLINK_GET_SPEED"] == fabric.FI_NVLINK_GET_SPEED
    assert nvml_h["NVML_FI_DEV_NVLINK_GET_VERSION"] == fabric.FI_NVLINK_GET_VERSION
    assert nvml_h["NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS"] == fabric.FI_NVLINK_RECOVERY_SUCCESSFUL
    assert nvml_h["NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS"] == fabric.FI_NVLINK_RECOVERY_FAILED
    assert nvml_h["NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS"] == fabric.FI_NVLINK_RECOVERY_TOTAL
    assert nvml_h["NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN"] == fabric.FI_THROTTLE_SW_THERMAL_NS
    assert nvml_h["NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN"] == fabric.FI_THROTTLE_HW_THERMAL_NS
    assert nvml_h["NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN"] == fabric.FI_THROTTLE_HW_POWER_BRAKE_NS
    assert nvml_h["NVML_NVLINK_MAX_LINKS"] == fabric.NVLINK_MAX_LINKS
    assert nvml_h["NVML_NVLINK_CAP_VALID"] == fabric.NVLINK_CAP_VALID
    assert nvml_h["NVML_P2P_CAPS_INDEX_NVLINK"] == fabric.P2P_CAPS_INDEX_NVLINK
    assert nvml_h["NVML_P2P_STATUS_OK"] == fabric.P2P_STATUS_OK
    for name in ("REPLAY", "RECOVERY", "CRC_FLIT", "CRC_DATA", "ECC_DATA"):
        assert getattr(fabric, f"NVLINK_ERROR_DL_{name}") == nvml_h[f"NVML_NVLINK_ERROR_DL_{name}"], name
    declared = {k.removeprefix("NVML_NVLINK_DEVICE_TYPE_"): v for k, v in nvml_h.items() if "NVLINK_DEVICE_TYPE_" in k}
    assert {name.upper(): value for value, name in fabric.NVLINK_DEVICE_TYPES.items()} == declared


def test_cluster_uuid_is_the_canonical_form() -> None:
    raw = bytes(range(16))
    assert fabric.cluster_uuid(raw) == "00010203-0405-0607-0809-0a0b0c0d0e0f"
