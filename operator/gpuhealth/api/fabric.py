"""The fabric between GPUs as NVML encodes it: decoders of GPU fabric info, the fabric health mask and
clock-event reasons, shared by the agent (which writes the decoded facts) and their readers (the
report parser, ``kubectl gpuhealth describe``).

Values are NVIDIA's (``nvml.h`` of NVML API 13, ``NVML_GPU_FABRIC_*`` and ``nvmlClocksEventReason*``);
``tests/unit/api/test_fabric_decode.py`` reads each one from the header, so this copy cannot drift.
Pure functions only: no pynvml here (the operator does not load NVML).

The one rule that matters downstream: a non-zero health mask is not a fault. Each sub-field is a
small number (``(mask >> shift) & width``): for the boolean ones 0 means "not supported", 1 "true"
(the fault) and 2 "false"; ``INCORRECT_CONFIGURATION`` is 1 for "correct" and 2 and up name what is
wrong. A healthy GB200 reports a mask full of "false" sub-fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, get_args

# ---- fabric probe state and health summary (NVML_GPU_FABRIC_STATE_*, NVML_GPU_FABRIC_HEALTH_SUMMARY_*) ----

FabricState = Literal["NotSupported", "NotStarted", "InProgress", "Completed"]
FABRIC_STATES: Final[dict[int, FabricState]] = {
    0: "NotSupported",  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
    1: "NotStarted",  # NVML_GPU_FABRIC_STATE_NOT_STARTED: normal on GB200/GB300 (rack-level NVSwitch)
    2: "InProgress",  # NVML_GPU_FABRIC_STATE_IN_PROGRESS
    3: "Completed",  # NVML_GPU_FABRIC_STATE_COMPLETED: only now is the probe's status meaningful
}
STATE_COMPLETED: Final = 3

HealthSummary = Literal["NotSupported", "Healthy", "Unhealthy", "LimitedCapacity"]
HEALTH_SUMMARIES: Final[dict[int, HealthSummary]] = {
    0: "NotSupported",  # NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED
    1: "Healthy",  # NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
    2: "Unhealthy",  # NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY
    3: "LimitedCapacity",  # NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY
}

# ---- the health mask (NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_* / _WIDTH_*) ----------------------------------


@dataclass(frozen=True)
class MaskField:
    """One sub-field of the health mask: where it sits, how wide it is, and its report name."""

    nvml: str  # the suffix of NVML's SHIFT/WIDTH macros
    shift: int
    width: int
    report: str  # the key under spec.devices[].fabric


# Boolean sub-fields: 0 not supported, 1 true (a fault), 2 false.
DEGRADED_BW: Final = MaskField("DEGRADED_BW", 0, 0x3, "degradedBandwidth")
ROUTE_RECOVERY: Final = MaskField("ROUTE_RECOVERY", 2, 0x3, "routeRecovery")
ROUTE_UNHEALTHY: Final = MaskField("ROUTE_UNHEALTHY", 4, 0x3, "routeUnhealthy")
ACCESS_TIMEOUT_RECOVERY: Final = MaskField("ACCESS_TIMEOUT_RECOVERY", 6, 0x3, "accessTimeoutRecovery")
BOOLEAN_FIELDS: Final = (DEGRADED_BW, ROUTE_RECOVERY, ROUTE_UNHEALTHY, ACCESS_TIMEOUT_RECOVERY)
# 1 correct, 2.. what is wrong (a fault).
INCORRECT_CONFIGURATION: Final = MaskField("INCORRECT_CONFIGURATION", 8, 0xF, "incorrectConfiguration")
# Informational: 1 a partition is assigned, 2 none is.
PARTITION_ASSIGNED: Final = MaskField("PARTITION_ASSIGNED", 12, 0x3, "partitionAssigned")
MASK_FIELDS: Final = (*BOOLEAN_FIELDS, INCORRECT_CONFIGURATION, PARTITION_ASSIGNED)

MASK_NOT_SUPPORTED: Final = 0
MASK_TRUE: Final = 1
MASK_FALSE: Final = 2

# NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_*; 0 (not supported) has no name.
IncorrectConfiguration = Literal[
    "None",
    "IncorrectSysGuid",
    "IncorrectChassisSerialNumber",
    "NoPartition",
    "InsufficientNvlinks",
    "IncompatibleGpuFirmware",
    "InvalidLocation",
    "GpuStateInvalid",
    "Unknown",
]
INCORRECT_CONFIGURATIONS: Final[dict[int, IncorrectConfiguration]] = {
    1: "None",  # _NONE: the configuration is correct
    2: "IncorrectSysGuid",  # _INCORRECT_SYSGUID
    3: "IncorrectChassisSerialNumber",  # _INCORRECT_CHASSIS_SN
    4: "NoPartition",  # _NO_PARTITION
    5: "InsufficientNvlinks",  # _INSUFFICIENT_NVLINKS
    6: "IncompatibleGpuFirmware",  # _INCOMPATIBLE_GPU_FW
    7: "InvalidLocation",  # _INVALID_LOCATION
    8: "GpuStateInvalid",  # _GPU_STATE_INVALID
}
# A value newer than this table is still a fault (>= 2), named so.
UNKNOWN_CONFIGURATION: Final[IncorrectConfiguration] = "Unknown"
# Every spelling of spec.devices[].fabric.incorrectConfiguration (the CRD's enum is generated from it).
INCORRECT_CONFIGURATION_VALUES: Final[tuple[str, ...]] = get_args(IncorrectConfiguration)


def mask_value(mask: int, field: MaskField) -> int:
    """NVML_GPU_FABRIC_HEALTH_GET(mask, field)."""
    return (mask >> field.shift) & field.width


def _tristate(value: int) -> bool | None:
    """A boolean sub-field: True (1), False (2), None (0: not supported, or a value NVML does not define)."""
    return True if value == MASK_TRUE else False if value == MASK_FALSE else None


@dataclass(frozen=True)
class FabricHealth:
    """The health mask decoded, one attribute per sub-field; None = not supported."""

    degraded_bandwidth: bool | None = None
    route_recovery: bool | None = None
    route_unhealthy: bool | None = None
    access_timeout_recovery: bool | None = None
    incorrect_configuration: IncorrectConfiguration | None = None
    partition_assigned: bool | None = None

    @property
    def faults(self) -> tuple[str, ...]:
        """The sub-fields that say something is wrong, by report name (empty: nothing is)."""
        out = [f.report for f in BOOLEAN_FIELDS if getattr(self, _ATTR[f.report]) is True]
        if self.incorrect_configuration not in (None, "None"):
            out.append(INCORRECT_CONFIGURATION.report)
        return tuple(out)


_ATTR: Final = {
    "degradedBandwidth": "degraded_bandwidth",
    "routeRecovery": "route_recovery",
    "routeUnhealthy": "route_unhealthy",
    "accessTimeoutRecovery": "access_timeout_recovery",
    "incorrectConfiguration": "incorrect_configuration",
    "partitionAssigned": "partition_assigned",
}


def decode_health_mask(mask: int) -> FabricHealth:
    """Each sub-field of ``healthMask`` on its own; the mask as a whole means nothing."""
    config = mask_value(mask, INCORRECT_CONFIGURATION)
    return FabricHealth(
        degraded_bandwidth=_tristate(mask_value(mask, DEGRADED_BW)),
        route_recovery=_tristate(mask_value(mask, ROUTE_RECOVERY)),
        route_unhealthy=_tristate(mask_value(mask, ROUTE_UNHEALTHY)),
        access_timeout_recovery=_tristate(mask_value(mask, ACCESS_TIMEOUT_RECOVERY)),
        incorrect_configuration=None
        if config == MASK_NOT_SUPPORTED
        else INCORRECT_CONFIGURATIONS.get(config, UNKNOWN_CONFIGURATION),
        partition_assigned=_tristate(mask_value(mask, PARTITION_ASSIGNED)),
    )


def health_fields(health: FabricHealth) -> dict[str, bool | str]:
    """The decoded sub-fields as the report spells them (spec.devices[].fabric); unsupported ones left out."""
    out: dict[str, bool | str] = {}
    for f in MASK_FIELDS:
        value = getattr(health, _ATTR[f.report])
        if value is not None:
            out[f.report] = value
    return out


def fabric_state(value: int) -> FabricState | None:
    """The probe state's name; None for a value NVML does not define."""
    return FABRIC_STATES.get(value)


def health_summary(value: int) -> HealthSummary | None:
    return HEALTH_SUMMARIES.get(value)


def cluster_uuid(raw: bytes) -> str:
    """NVML's 16 raw bytes as a canonical 8-4-4-4-12 UUID (the form GPU Feature Discovery uses in the
    ``nvidia.com/gpu.clique`` label ``<clusterUuid>.<cliqueId>``)."""
    h = bytes(raw[:16]).ljust(16, b"\0").hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


# ---- clock-event reasons (nvmlClocksEventReason*) ----------------------------------------------------

ClockReason = Literal[
    "GpuIdle",
    "ApplicationsClocksSetting",
    "SwPowerCap",
    "HwSlowdown",
    "SyncBoost",
    "SwThermalSlowdown",
    "HwThermalSlowdown",
    "HwPowerBrakeSlowdown",
    "DisplayClockSetting",
]
CLOCK_REASONS: Final[dict[int, ClockReason]] = {
    0x1: "GpuIdle",
    0x2: "ApplicationsClocksSetting",
    0x4: "SwPowerCap",
    # The cause is not given: heat, an external power brake or fast-trigger protection. Not thermal
    # by itself; 0x40 says heat, 0x80 says power brake.
    0x8: "HwSlowdown",
    0x10: "SyncBoost",
    0x20: "SwThermalSlowdown",
    0x40: "HwThermalSlowdown",
    # Usually a rack's power shelf asserting the brake: a reboot does not fix it.
    0x80: "HwPowerBrakeSlowdown",
    0x100: "DisplayClockSetting",
}
GPU_IDLE: Final = 0x1
HW_SLOWDOWN: Final = 0x8
SW_THERMAL: Final = 0x20
HW_THERMAL: Final = 0x40
HW_POWER_BRAKE: Final = 0x80
# The bits that mean the hardware is protecting itself: only a change of these is a new fact to the agent
# (idle, power cap, sync boost and app clocks flip with every workload change).
SIGNIFICANT_CLOCK_EVENT_REASONS: Final = HW_SLOWDOWN | SW_THERMAL | HW_THERMAL | HW_POWER_BRAKE


def clock_reasons(mask: int) -> tuple[str, ...]:
    """The reasons set in ``mask``, lowest bit first; a bit NVML names after this table as ``0x...``."""
    out: list[str] = []
    bit = 1
    while bit <= mask:
        if mask & bit:
            out.append(CLOCK_REASONS.get(bit, f"0x{bit:x}"))
        bit <<= 1
    return tuple(out)


# ---- field ids (NVML_FI_DEV_*) ----------------------------------------------------------------------

FI_NVLINK_GET_SPEED: Final = 164  # NVML_FI_DEV_NVLINK_GET_SPEED (MBps), per link in scopeId
FI_NVLINK_GET_VERSION: Final = 166  # NVML_FI_DEV_NVLINK_GET_VERSION
# Blackwell: link-recovery events replace the DL replay/recovery/CRC counters (161-163 unsupported there).
FI_NVLINK_RECOVERY_SUCCESSFUL: Final = 213  # NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS
FI_NVLINK_RECOVERY_FAILED: Final = 214  # NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS
FI_NVLINK_RECOVERY_TOTAL: Final = 215  # NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS
# Nanoseconds spent throttled since the driver loaded: deltas over time give a duty cycle.
FI_THROTTLE_SW_THERMAL_NS: Final = 269  # NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN
FI_THROTTLE_HW_THERMAL_NS: Final = 270  # NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN
FI_THROTTLE_HW_POWER_BRAKE_NS: Final = 271  # NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN

NVLINK_MAX_LINKS: Final = 36  # NVML_NVLINK_MAX_LINKS
NVLINK_CAP_VALID: Final = 5  # NVML_NVLINK_CAP_VALID: the link exists on this GPU
# nvmlIntNvLinkDeviceType_t: what a link reaches (nvmlDeviceGetNvLinkRemoteDeviceType).
NVLINK_DEVICE_TYPES: Final[dict[int, str]] = {
    0x00: "GPU",  # NVML_NVLINK_DEVICE_TYPE_GPU: another GPU, directly
    0x01: "IBMNPU",  # NVML_NVLINK_DEVICE_TYPE_IBMNPU: a POWER CPU's NVLink
    0x02: "Switch",  # NVML_NVLINK_DEVICE_TYPE_SWITCH: an NVSwitch (HGX boards, NVL racks)
    0xFF: "Unknown",  # NVML_NVLINK_DEVICE_TYPE_UNKNOWN, and a value newer than this table
}
P2P_CAPS_INDEX_NVLINK: Final = 2  # NVML_P2P_CAPS_INDEX_NVLINK
P2P_STATUS_OK: Final = 0  # NVML_P2P_STATUS_OK
# nvmlNvLinkErrorCounter_t: the data-link counters before Blackwell.
NVLINK_ERROR_DL_REPLAY: Final = 0
NVLINK_ERROR_DL_RECOVERY: Final = 1
NVLINK_ERROR_DL_CRC_FLIT: Final = 2
NVLINK_ERROR_DL_CRC_DATA: Final = 3
NVLINK_ERROR_DL_ECC_DATA: Final = 4
