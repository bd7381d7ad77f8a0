"""Names shared by the agent, the operator, the CLI, the manifests and the docs (see docs/api.md)."""

from __future__ import annotations

from enum import StrEnum

GROUP = "gpuhealth.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

POLICY_KIND = "GPUHealthPolicy"
POLICY_PLURAL = "gpuhealthpolicies"
REPORT_KIND = "GPUNodeHealth"
REPORT_PLURAL = "gpunodehealths"

TAINT_KEY = f"{GROUP}/unhealthy"
STATE_LABEL = f"{GROUP}/state"
CONDITION_TYPE = "GPUHealthy"
# Written on the Node in the same patch as the taint/cordon, so ownership is atomic with the action.
QUARANTINE_ANNOTATION = f"{GROUP}/quarantine"
# A human (or `kubectl gpuhealth release`) sets this on the Node to return an AwaitingRepair node.
RELEASE_ANNOTATION = f"{GROUP}/release"
RELEASE_GPU_ANNOTATION = f"{GROUP}/release-gpu"  # GPU indices, comma-separated: release those GPUs only
# New-node burn-in (spec.validation.newNodes, api/validation.py): gpuhealth's own NoSchedule taint holds a
# joining node until its validation passes; the label asks for a burn-in of a node that already has a
# verdict ("requested"), and gpuhealth answers it ("accepted") when it takes the request.
BURN_IN_TAINT_KEY = f"{GROUP}/burn-in"
# Per-GPU quarantine on a device-plugin node (docs/devices.md, "What a device-plugin-only cluster gets"):
# gpuhealth's own NoSchedule taint keeps new pods off a node while one of its GPUs is held out and the
# device plugin does not withhold it; lifted when no GPU of the node is held out any more.
GPU_OUT_TAINT_KEY = f"{GROUP}/gpu-out"
BURN_IN_LABEL = f"{GROUP}/burn-in"
BURN_IN_REQUESTED = "requested"
BURN_IN_ACCEPTED = "accepted"
# Under spec.remediation.approval: Manual, a human (or `kubectl gpuhealth approve|reject`, or an external
# system) sets these on the Node: the steps waiting in PendingApproval on the node, or on the GPUs named
# (indices, comma-separated), run (approve) or go to AwaitingRepair (reject). Removed once acted on.
APPROVE_ANNOTATION = f"{GROUP}/approve"
APPROVE_GPU_ANNOTATION = f"{GROUP}/approve-gpu"
REJECT_ANNOTATION = f"{GROUP}/reject"
REJECT_GPU_ANNOTATION = f"{GROUP}/reject-gpu"
# An approval that records who gave it (`kubectl gpuhealth approve` writes these; approval: TwoPerson
# counts only these): gpuhealth.dev/approver.<slot> (every waiting step of the node) or
# gpuhealth.dev/approver-gpu-<index>.<slot>, whose VALUE is the approver's user name as the API server
# knows it. The shipped admission policy (manifests/base/approver-admission-policy.yaml) refuses a write
# of one whose value is not the requesting user. The slot (the CLI derives it from the user name) only
# keeps two people's approvals apart: a key cannot hold a user name (no ':' or '@').
APPROVER_ANNOTATION_PREFIX = f"{GROUP}/approver"

# The checkpoint handshake on a pod (see docs/workloads.md).
CHECKPOINT_MODE = f"{GROUP}/checkpoint"
CHECKPOINT_REQUESTED = f"{GROUP}/checkpoint-requested"
CHECKPOINT_COMPLETED = f"{GROUP}/checkpoint-completed"

GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
GPU_NODE_SELECTOR = f"{GPU_PRESENT_LABEL}=true"  # the Nodes gpuhealth watches (label selector)
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_RESOURCE = "nvidia.com/gpu"

COMPONENT = "gpuhealth-operator"


class State(StrEnum):
    HEALTHY = "Healthy"
    DEGRADED = "Degraded"
    QUARANTINED = "Quarantined"
    DRAINING = "Draining"
    AWAITING_REPAIR = "AwaitingRepair"
    RECOVERING = "Recovering"
    UNKNOWN = "Unknown"


# States in which the node is held out of service by gpuhealth: they count against the breaker.
OUT_OF_SERVICE = frozenset({State.QUARANTINED, State.DRAINING, State.AWAITING_REPAIR, State.RECOVERING})


class Action(StrEnum):
    """What a signal asks for, in increasing severity."""

    IGNORE = "ignore"
    OBSERVE = "observe"
    CORDON = "cordon"
    DRAIN = "drain"
    REPAIR = "repair"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]

    @property
    def quarantines(self) -> bool:
        return self.severity >= _SEVERITY[Action.CORDON]


_SEVERITY = {Action.IGNORE: 0, Action.OBSERVE: 1, Action.CORDON: 2, Action.DRAIN: 3, Action.REPAIR: 4}


class Mode(StrEnum):
    ENFORCE = "Enforce"
    DRY_RUN = "DryRun"
    PAUSED = "Paused"


class Signal(StrEnum):
    """Kinds of evidence; each is also a `reason` (taint value, condition reason)."""

    XID = "XID"
    APP_XID_REPEATED = "RepeatedAppXID"
    ECC = "EccUncorrected"
    ROW_REMAP_FAILURE = "RowRemapFailure"
    PENDING_REMAP = "PendingRemap"
    THERMAL = "Thermal"
    POWER_BRAKE = "PowerBrake"  # clock reason 0x80: slow, not broken (usually the rack's power shelf)
    HW_SLOWDOWN = "HWSlowdown"  # clock reason 0x8 alone: slow, not broken, cause not given
    IMEX_DOMAIN = "ImexDomain"  # a GPU of the node's NVLink domain asks for the domain's recovery
    RACK_POWER_BRAKE = "RackPowerBrake"  # a power brake on several nodes of one rack: the facility's
    # The fabric between GPUs (evaluation/fabric_rules.py, rules nvlink / pcie / fabric / nic):
    NVLINK_DEGRADED = "NVLinkDegraded"  # fewer active NVLinks than the GPU has, or failed link recoveries
    PCIE_DOWNTRAINED = "PCIeDowntrained"  # the GPU's PCIe link narrower (or, busy, slower) than it can be
    FABRIC_DEGRADED = "FabricDegraded"  # a fabric health sub-field says degraded bandwidth or a recovery
    FABRIC_FAULT = "FabricFault"  # the fabric probe failed, or the GPU's fabric configuration is wrong
    NIC_DOWN = "NICDown"  # an InfiniBand / RoCE port down, or a counter fatal on any increase rose
    NIC_DEGRADED = "NICDegraded"  # a NIC error rate above its threshold (slow, not broken)
    GPU_LOST = "GPULost"
    INFOROM_CORRUPT = "InfoROMCorrupt"  # NVML_ERROR_CORRUPTED_INFOROM (api/device_facts.py): observed, flash it
    GPU_COUNT = "GPUCountMismatch"
    NVML_UNAVAILABLE = "NVMLUnavailable"
    AGENT_SILENT = "AgentSilent"
    NVML_UNRESPONSIVE = "NVMLUnresponsive"  # an NVML call the agent made has not returned (a wedged GPU)
    RESTART_LOOP = "RestartLoop"
    FLAPPING = "Flapping"
    DEVICE_QUARANTINED = "DeviceQuarantined"  # the node serves on while some of its GPUs are held out
    NODE_REBOOT_REQUESTED = "NodeRebootRequested"  # a GPU's repair ladder hands the node to its remediator
    NVLINK_PEER = "NVLinkPeer"  # held out while an NVLink peer is repaired (evaluation/peers.py): not faulty


# "Slow, not broken": the GPUs compute correctly, only slower. Nodes held out for these count against
# a breaker budget of their own (spec.safety.maxSlow), apart from the broken ones (maxUnhealthy), so a
# fleet-wide slowdown neither idles the fleet nor spends the budget meant for dead GPUs.
SLOW_SIGNALS = frozenset(
    {
        Signal.POWER_BRAKE,
        Signal.HW_SLOWDOWN,
        Signal.RACK_POWER_BRAKE,
        Signal.NVLINK_DEGRADED,
        Signal.PCIE_DOWNTRAINED,
        Signal.FABRIC_DEGRADED,
        Signal.NIC_DEGRADED,
    }
)


class StepKind(StrEnum):
    """A step of the repair ladder (``api/remediation.py``)."""

    GPU_RESET = "GPUReset"  # nvidia-smi -r on that GPU, in a Job pinned to its node
    NODE_REBOOT = "NodeReboot"  # handed to the node remediator (AwaitingRepair, NodeRebootRequested)
    REPLACE = "Replace"  # a human: the GPU waits in AwaitingRepair with the ladder's history


class Scope(StrEnum):
    """How much a finding takes out of service.

    ``Device``: the fault is confined to one GPU; only that GPU is held out (through a DRA
    DeviceTaintRule), where a ResourceSlice publishes it. ``Node``: the whole node is quarantined.
    """

    DEVICE = "Device"
    NODE = "Node"
    # Above the node, never set by a policy: the operator correlates these across nodes.
    DOMAIN = "Domain"  # every node of one NVLink (IMEX) domain, by its clique label (api/slow_policy.py)
    RACK = "Rack"  # every node of one rack, by its topology label


# The scopes a policy may set on a rule or an XID (the others come from correlation across nodes).
SETTABLE_SCOPES = frozenset({Scope.DEVICE, Scope.NODE})


# Key of the DeviceTaintRule taint gpuhealth writes on a bad GPU (the same key as the Node taint).
DEVICE_TAINT_KEY = TAINT_KEY
# Label on every DeviceTaintRule gpuhealth creates; a rule without it is never changed or deleted.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "gpuhealth"
# The node (pool) and GPU index a DeviceTaintRule of gpuhealth's is about, for humans and cleanup.
DEVICE_NODE_LABEL = f"{GROUP}/node"
DEVICE_GPU_LABEL = f"{GROUP}/gpu"
DEVICE_KIND_LABEL = f"{GROUP}/device-kind"  # "gpu" (a full GPU) or "mig" (a MIG device or placement)
DRA_GROUP = "resource.k8s.io"
DRA_VERSION = "v1"
DEFAULT_DRA_DRIVER = "gpu.nvidia.com"

# The agents' node Leases (their heartbeat): labelled by the agent, so the operator's watch selects
# them server-side; one per node, named after it, in the namespace the agents run in.
AGENT_MANAGER = "gpuhealth-agent"
AGENT_LEASE_SELECTOR = f"{MANAGED_BY_LABEL}={AGENT_MANAGER}"
# What a renewal vouches for (agent/lease.py): when the newest NVML sample was taken, and, while an
# NVML call hangs, which one and since when ("<call> since <time>"; agent/watchdog.py).
LEASE_SAMPLED_AT_ANNOTATION = f"{GROUP}/sampled-at"
LEASE_NVML_UNRESPONSIVE_ANNOTATION = f"{GROUP}/nvml-unresponsive"

# Kueue (optional): gpuhealth as an AdmissionCheck controller (docs/workloads.md, "Kueue").
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"  # the storage version Kueue v0.17 serves (v1beta1 is served too)
KUEUE_API_VERSION = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
ADMISSION_CHECK_CONTROLLER = "gpuhealth.dev/healthy-capacity"  # AdmissionCheck spec.controllerName
