/*
 * The fake NVML's own copy of the NVML types and constants it uses, for builds without NVIDIA's
 * nvml.h (the nvidia-nvml-dev wheel of the test extra ships it;
 * devkit/fakenvml/build.py prefers it). Names, values and layouts are NVIDIA's: tests/unit/agent/test_fakenvml_abi.py compiles this
 * file beside nvml.h with every name prefixed (FAKENVML_OWN) and asserts that sizes, offsets and
 * values agree, so this copy cannot drift from the real header unnoticed.
 *
 * Constants are enumerators rather than macros so that the prefixing works on them too.
 */
#ifndef FAKENVML_OWN
#define FAKENVML_OWN(name) name
#endif
#define O_ FAKENVML_OWN

typedef enum {
    O_(NVML_SUCCESS) = 0,
    O_(NVML_ERROR_UNINITIALIZED) = 1,
    O_(NVML_ERROR_INVALID_ARGUMENT) = 2,
    O_(NVML_ERROR_NOT_SUPPORTED) = 3,
    O_(NVML_ERROR_NOT_FOUND) = 6,
    O_(NVML_ERROR_INSUFFICIENT_SIZE) = 7,
    O_(NVML_ERROR_TIMEOUT) = 10,
    O_(NVML_ERROR_FUNCTION_NOT_FOUND) = 13,
    O_(NVML_ERROR_CORRUPTED_INFOROM) = 14,
    O_(NVML_ERROR_GPU_IS_LOST) = 15,
    O_(NVML_ERROR_ARGUMENT_VERSION_MISMATCH) = 25,
    O_(NVML_ERROR_UNKNOWN) = 999,
} O_(nvmlReturn_t);

typedef enum { O_(NVML_FEATURE_DISABLED) = 0, O_(NVML_FEATURE_ENABLED) = 1 } O_(nvmlEnableState_t);
typedef enum { O_(NVML_MEMORY_ERROR_TYPE_CORRECTED) = 0, O_(NVML_MEMORY_ERROR_TYPE_UNCORRECTED) = 1 } O_(nvmlMemoryErrorType_t);
typedef enum { O_(NVML_VOLATILE_ECC) = 0, O_(NVML_AGGREGATE_ECC) = 1 } O_(nvmlEccCounterType_t);
typedef enum {
    O_(NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS) = 0,
    O_(NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR) = 1,
} O_(nvmlPageRetirementCause_t);
typedef enum { O_(NVML_TEMPERATURE_GPU) = 0 } O_(nvmlTemperatureSensors_t);
typedef enum {
    O_(NVML_TEMPERATURE_THRESHOLD_SHUTDOWN) = 0,
    O_(NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) = 1,
} O_(nvmlTemperatureThresholds_t);
typedef enum {
    O_(NVML_VALUE_TYPE_DOUBLE) = 0,
    O_(NVML_VALUE_TYPE_UNSIGNED_INT) = 1,
    O_(NVML_VALUE_TYPE_UNSIGNED_LONG) = 2,
    O_(NVML_VALUE_TYPE_UNSIGNED_LONG_LONG) = 3,
    O_(NVML_VALUE_TYPE_SIGNED_LONG_LONG) = 4,
} O_(nvmlValueType_t);

typedef enum {
    O_(NVML_NVLINK_CAP_P2P_SUPPORTED) = 0,
    O_(NVML_NVLINK_CAP_SYSMEM_ACCESS) = 1,
    O_(NVML_NVLINK_CAP_P2P_ATOMICS) = 2,
    O_(NVML_NVLINK_CAP_SYSMEM_ATOMICS) = 3,
    O_(NVML_NVLINK_CAP_SLI_BRIDGE) = 4,
    O_(NVML_NVLINK_CAP_VALID) = 5,
    O_(NVML_NVLINK_CAP_COUNT) = 6,
} O_(nvmlNvLinkCapability_t);
typedef enum {
    O_(NVML_NVLINK_DEVICE_TYPE_GPU) = 0x00,
    O_(NVML_NVLINK_DEVICE_TYPE_IBMNPU) = 0x01,
    O_(NVML_NVLINK_DEVICE_TYPE_SWITCH) = 0x02,
    O_(NVML_NVLINK_DEVICE_TYPE_UNKNOWN) = 0xFF,
} O_(nvmlIntNvLinkDeviceType_t);
typedef enum {
    O_(NVML_NVLINK_ERROR_DL_REPLAY) = 0,
    O_(NVML_NVLINK_ERROR_DL_RECOVERY) = 1,
    O_(NVML_NVLINK_ERROR_DL_CRC_FLIT) = 2,
    O_(NVML_NVLINK_ERROR_DL_CRC_DATA) = 3,
    O_(NVML_NVLINK_ERROR_DL_ECC_DATA) = 4,
    O_(NVML_NVLINK_ERROR_COUNT) = 5,
} O_(nvmlNvLinkErrorCounter_t);
typedef enum {
    O_(NVML_P2P_STATUS_OK) = 0,
    O_(NVML_P2P_STATUS_NOT_SUPPORTED) = 5,
    O_(NVML_P2P_STATUS_UNKNOWN) = 6,
} O_(nvmlGpuP2PStatus_t);
typedef enum {
    O_(NVML_P2P_CAPS_INDEX_READ) = 0,
    O_(NVML_P2P_CAPS_INDEX_NVLINK) = 2,
    O_(NVML_P2P_CAPS_INDEX_UNKNOWN) = 5,
} O_(nvmlGpuP2PCapsIndex_t);

typedef enum {
    O_(NVML_TOPOLOGY_INTERNAL) = 0,
    O_(NVML_TOPOLOGY_NODE) = 40,
    O_(NVML_TOPOLOGY_SYSTEM) = 50,
} O_(nvmlGpuTopologyLevel_t);

enum {
    O_(NVML_DEVICE_MIG_DISABLE) = 0,
    O_(NVML_DEVICE_MIG_ENABLE) = 1,
    O_(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) = 230,
    O_(NVML_FI_DEV_NVLINK_GET_SPEED) = 164,
    O_(NVML_FI_DEV_NVLINK_GET_VERSION) = 166,
    O_(NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS) = 213,
    O_(NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS) = 214,
    O_(NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS) = 215,
    O_(NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN) = 269,
    O_(NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN) = 270,
    O_(NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN) = 271,
    O_(NVML_GPU_FABRIC_UUID_LEN) = 16,
    O_(nvmlEventTypeSingleBitEccError) = 0x1,
    O_(nvmlEventTypeDoubleBitEccError) = 0x2,
    O_(nvmlEventTypeXidCriticalError) = 0x8,
    O_(nvmlEventTypeGpuUnavailableError) = 0x4000,
    O_(nvmlEventTypeGpuRecoveryAction) = 0x8000,
};

/* Opaque handles: NVML only declares the structs; the fake defines them. */
typedef struct nvmlDevice_st *O_(nvmlDevice_t);
typedef struct nvmlEventSet_st *O_(nvmlEventSet_t);

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} O_(nvmlPciInfo_t);

typedef struct {
    O_(nvmlDevice_t) device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} O_(nvmlEventData_t);

typedef union {
    double dVal;
    int siVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    unsigned short usVal;
} O_(nvmlValue_t);

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    O_(nvmlValueType_t) valueType;
    O_(nvmlReturn_t) nvmlReturn;
    O_(nvmlValue_t) value;
} O_(nvmlFieldValue_t);

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} O_(nvmlMemory_t);

typedef unsigned char O_(nvmlGpuFabricState_t);
/* GPU fabric info of the unversioned, deprecated nvmlDeviceGetGpuFabricInfo. */
typedef struct {
    unsigned char clusterUuid[16];
    O_(nvmlReturn_t) status;
    unsigned int cliqueId;
    O_(nvmlGpuFabricState_t) state;
} O_(nvmlGpuFabricInfo_t);
/* GPU fabric info v2 and v3 (nvmlDeviceGetGpuFabricInfoV); the version word is sizeof | v << 24. */
typedef struct {
    unsigned int version;
    unsigned char clusterUuid[16];
    O_(nvmlReturn_t) status;
    unsigned int cliqueId;
    O_(nvmlGpuFabricState_t) state;
    unsigned int healthMask;
} O_(nvmlGpuFabricInfo_v2_t);
typedef struct {
    unsigned int version;
    unsigned char clusterUuid[16];
    O_(nvmlReturn_t) status;
    unsigned int cliqueId;
    O_(nvmlGpuFabricState_t) state;
    unsigned int healthMask;
    unsigned char healthSummary;
} O_(nvmlGpuFabricInfo_v3_t);
typedef O_(nvmlGpuFabricInfo_v3_t) O_(nvmlGpuFabricInfoV_t);

#undef O_
