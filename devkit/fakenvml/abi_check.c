/*
 * Compiled (syntax only) by tests/unit/agent/test_fakenvml_abi.py: NVIDIA's nvml.h and the fake's
 * own copy of its types (fakenvml_types.h, every name prefixed "own_") in one translation unit,
 * with an assertion for every size, field offset and constant the copy holds. A copy that drifts
 * from NVIDIA's header does not compile.
 */
#include <stddef.h>

#include <nvml.h>

#define FAKENVML_OWN(name) own_##name
#include "fakenvml_types.h"

#define SAME_SIZE(t) _Static_assert(sizeof(own_##t) == sizeof(t), "size of " #t)
#define SAME_FIELD(t, f)                                                                   \
    _Static_assert(offsetof(own_##t, f) == offsetof(t, f), "offset of " #t "." #f);        \
    _Static_assert(sizeof(((own_##t *)0)->f) == sizeof(((t *)0)->f), "size of " #t "." #f)
#define SAME_VALUE(c) _Static_assert((long long)own_##c == (long long)(c), "value of " #c)

SAME_SIZE(nvmlReturn_t);
SAME_SIZE(nvmlEnableState_t);
SAME_SIZE(nvmlMemoryErrorType_t);
SAME_SIZE(nvmlEccCounterType_t);
SAME_SIZE(nvmlPageRetirementCause_t);
SAME_SIZE(nvmlTemperatureSensors_t);
SAME_SIZE(nvmlTemperatureThresholds_t);
SAME_SIZE(nvmlValueType_t);
SAME_SIZE(nvmlDevice_t);
SAME_SIZE(nvmlEventSet_t);
SAME_SIZE(nvmlNvLinkCapability_t);
SAME_SIZE(nvmlIntNvLinkDeviceType_t);
SAME_SIZE(nvmlNvLinkErrorCounter_t);
SAME_SIZE(nvmlGpuP2PStatus_t);
SAME_SIZE(nvmlGpuP2PCapsIndex_t);
SAME_SIZE(nvmlGpuFabricState_t);
SAME_SIZE(nvmlGpuFabricInfoV_t);

SAME_SIZE(nvmlGpuFabricInfo_v3_t);
SAME_FIELD(nvmlGpuFabricInfo_v3_t, version);
SAME_FIELD(nvmlGpuFabricInfo_v3_t, clusterUuid);
SAME_FIELD(nvmlGpuFabricInfo_v3_t, status);
SAME_FIELD(nvmlGpuFabricInfo_v3_t, cliqueId);
SAME_FIELD(nvmlGpuFabricInfo_v3_t, state);
SAME_FIELD(nvmlGpuFabricInfo_v3_t, healthMask);
SAME_FIELD(nvmlGpuFabricInfo_v3_t, healthSummary);
/* The fake builds the version word from its own struct: it must be NVIDIA's. */
_Static_assert((unsigned int)(sizeof(own_nvmlGpuFabricInfo_v3_t) | (3U << 24U)) == nvmlGpuFabricInfo_v3,
               "nvmlGpuFabricInfo_v3");

SAME_SIZE(nvmlGpuFabricInfo_t);
SAME_FIELD(nvmlGpuFabricInfo_t, clusterUuid);
SAME_FIELD(nvmlGpuFabricInfo_t, status);
SAME_FIELD(nvmlGpuFabricInfo_t, cliqueId);
SAME_FIELD(nvmlGpuFabricInfo_t, state);

SAME_SIZE(nvmlGpuFabricInfo_v2_t);
SAME_FIELD(nvmlGpuFabricInfo_v2_t, version);
SAME_FIELD(nvmlGpuFabricInfo_v2_t, clusterUuid);
SAME_FIELD(nvmlGpuFabricInfo_v2_t, status);
SAME_FIELD(nvmlGpuFabricInfo_v2_t, cliqueId);
SAME_FIELD(nvmlGpuFabricInfo_v2_t, state);
SAME_FIELD(nvmlGpuFabricInfo_v2_t, healthMask);
_Static_assert((unsigned int)(sizeof(own_nvmlGpuFabricInfo_v2_t) | (2U << 24U)) == nvmlGpuFabricInfo_v2,
               "nvmlGpuFabricInfo_v2");

SAME_SIZE(nvmlMemory_t);
SAME_FIELD(nvmlMemory_t, total);
SAME_FIELD(nvmlMemory_t, free);
SAME_FIELD(nvmlMemory_t, used);
SAME_SIZE(nvmlGpuTopologyLevel_t);
SAME_VALUE(NVML_TOPOLOGY_INTERNAL);
SAME_VALUE(NVML_TOPOLOGY_NODE);
SAME_VALUE(NVML_TOPOLOGY_SYSTEM);

SAME_SIZE(nvmlPciInfo_t);
SAME_FIELD(nvmlPciInfo_t, busIdLegacy);
SAME_FIELD(nvmlPciInfo_t, domain);
SAME_FIELD(nvmlPciInfo_t, bus);
SAME_FIELD(nvmlPciInfo_t, device);
SAME_FIELD(nvmlPciInfo_t, pciDeviceId);
SAME_FIELD(nvmlPciInfo_t, pciSubSystemId);
SAME_FIELD(nvmlPciInfo_t, busId);

SAME_SIZE(nvmlEventData_t);
SAME_FIELD(nvmlEventData_t, device);
SAME_FIELD(nvmlEventData_t, eventType);
SAME_FIELD(nvmlEventData_t, eventData);
SAME_FIELD(nvmlEventData_t, gpuInstanceId);
SAME_FIELD(nvmlEventData_t, computeInstanceId);

SAME_SIZE(nvmlValue_t);
SAME_FIELD(nvmlValue_t, dVal);
SAME_FIELD(nvmlValue_t, siVal);
SAME_FIELD(nvmlValue_t, uiVal);
SAME_FIELD(nvmlValue_t, ulVal);
SAME_FIELD(nvmlValue_t, ullVal);
SAME_FIELD(nvmlValue_t, sllVal);
SAME_FIELD(nvmlValue_t, usVal);

SAME_SIZE(nvmlFieldValue_t);
SAME_FIELD(nvmlFieldValue_t, fieldId);
SAME_FIELD(nvmlFieldValue_t, scopeId);
SAME_FIELD(nvmlFieldValue_t, timestamp);
SAME_FIELD(nvmlFieldValue_t, latencyUsec);
SAME_FIELD(nvmlFieldValue_t, valueType);
SAME_FIELD(nvmlFieldValue_t, nvmlReturn);
SAME_FIELD(nvmlFieldValue_t, value);

SAME_VALUE(NVML_SUCCESS);
SAME_VALUE(NVML_ERROR_UNINITIALIZED);
SAME_VALUE(NVML_ERROR_INVALID_ARGUMENT);
SAME_VALUE(NVML_ERROR_NOT_SUPPORTED);
SAME_VALUE(NVML_ERROR_NOT_FOUND);
SAME_VALUE(NVML_ERROR_INSUFFICIENT_SIZE);
SAME_VALUE(NVML_ERROR_TIMEOUT);
SAME_VALUE(NVML_ERROR_FUNCTION_NOT_FOUND);
SAME_VALUE(NVML_ERROR_CORRUPTED_INFOROM);
SAME_VALUE(NVML_ERROR_GPU_IS_LOST);
SAME_VALUE(NVML_ERROR_UNKNOWN);
SAME_VALUE(NVML_FEATURE_DISABLED);
SAME_VALUE(NVML_FEATURE_ENABLED);
SAME_VALUE(NVML_MEMORY_ERROR_TYPE_CORRECTED);
SAME_VALUE(NVML_MEMORY_ERROR_TYPE_UNCORRECTED);
SAME_VALUE(NVML_VOLATILE_ECC);
SAME_VALUE(NVML_AGGREGATE_ECC);
SAME_VALUE(NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS);
SAME_VALUE(NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR);
SAME_VALUE(NVML_TEMPERATURE_GPU);
SAME_VALUE(NVML_TEMPERATURE_THRESHOLD_SHUTDOWN);
SAME_VALUE(NVML_TEMPERATURE_THRESHOLD_SLOWDOWN);
SAME_VALUE(NVML_VALUE_TYPE_DOUBLE);
SAME_VALUE(NVML_VALUE_TYPE_UNSIGNED_INT);
SAME_VALUE(NVML_VALUE_TYPE_UNSIGNED_LONG);
SAME_VALUE(NVML_VALUE_TYPE_UNSIGNED_LONG_LONG);
SAME_VALUE(NVML_VALUE_TYPE_SIGNED_LONG_LONG);
SAME_VALUE(NVML_DEVICE_MIG_DISABLE);
SAME_VALUE(NVML_DEVICE_MIG_ENABLE);
SAME_VALUE(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION);
SAME_VALUE(nvmlEventTypeSingleBitEccError);
SAME_VALUE(nvmlEventTypeDoubleBitEccError);
SAME_VALUE(nvmlEventTypeXidCriticalError);
SAME_VALUE(nvmlEventTypeGpuUnavailableError);
SAME_VALUE(nvmlEventTypeGpuRecoveryAction);

SAME_VALUE(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
SAME_VALUE(NVML_NVLINK_CAP_P2P_SUPPORTED);
SAME_VALUE(NVML_NVLINK_CAP_SYSMEM_ACCESS);
SAME_VALUE(NVML_NVLINK_CAP_P2P_ATOMICS);
SAME_VALUE(NVML_NVLINK_CAP_SYSMEM_ATOMICS);
SAME_VALUE(NVML_NVLINK_CAP_SLI_BRIDGE);
SAME_VALUE(NVML_NVLINK_CAP_VALID);
SAME_VALUE(NVML_NVLINK_CAP_COUNT);
SAME_VALUE(NVML_NVLINK_DEVICE_TYPE_GPU);
SAME_VALUE(NVML_NVLINK_DEVICE_TYPE_IBMNPU);
SAME_VALUE(NVML_NVLINK_DEVICE_TYPE_SWITCH);
SAME_VALUE(NVML_NVLINK_DEVICE_TYPE_UNKNOWN);
SAME_VALUE(NVML_NVLINK_ERROR_DL_REPLAY);
SAME_VALUE(NVML_NVLINK_ERROR_DL_RECOVERY);
SAME_VALUE(NVML_NVLINK_ERROR_DL_CRC_FLIT);
SAME_VALUE(NVML_NVLINK_ERROR_DL_CRC_DATA);
SAME_VALUE(NVML_NVLINK_ERROR_DL_ECC_DATA);
SAME_VALUE(NVML_NVLINK_ERROR_COUNT);
SAME_VALUE(NVML_P2P_STATUS_OK);
SAME_VALUE(NVML_P2P_STATUS_NOT_SUPPORTED);
SAME_VALUE(NVML_P2P_STATUS_UNKNOWN);
SAME_VALUE(NVML_P2P_CAPS_INDEX_READ);
SAME_VALUE(NVML_P2P_CAPS_INDEX_NVLINK);
SAME_VALUE(NVML_P2P_CAPS_INDEX_UNKNOWN);
SAME_VALUE(NVML_FI_DEV_NVLINK_GET_SPEED);
SAME_VALUE(NVML_FI_DEV_NVLINK_GET_VERSION);
SAME_VALUE(NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS);
SAME_VALUE(NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS);
SAME_VALUE(NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS);
SAME_VALUE(NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN);
SAME_VALUE(NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN);
SAME_VALUE(NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN);
SAME_VALUE(NVML_GPU_FABRIC_UUID_LEN);
