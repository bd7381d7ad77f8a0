"""Scope of a finding, steps 1 and 2 of the order ``controller/act/scoping.py`` runs (built-in, then
policy; then the NVLink domain and rack, NVLink peers, placement and escalation): does the fault take
out one GPU (``Device``) or the whole node (``Node``)? A finding that ``evaluation/domains.py``
correlated across nodes keeps its ``Domain`` or ``Rack`` scope here.

Pure. The built-in scope comes from the kind of evidence and, for XIDs, from NVIDIA's catalog
remedy: a fault whose remedy is a GPU reset is confined to that GPU; one whose remedy is a node
reboot, an NVLink / fabric fault, a lost GPU, a missing GPU or a silent agent is the node's. A
restart loop is the node's unless its failing pods all hold one GPU or one MIG device of it
(``evaluation/restarts.py`` then names that GPU): then it is that GPU's. The policy can override
the scope per rule (``spec.rules.<rule>.scope``) and per XID
(``spec.rules.xid.overrides[].scope``), and turn device scope off for the whole fleet
(``spec.devices.scope: Node``). A finding without a GPU is always node scope.
"""

from __future__ import annotations

from gpuhealth.api.names import SLOW_SIGNALS, Scope, Signal
from gpuhealth.api.policy import Policy
from gpuhealth.api.recovery import RecoveryAction
from gpuhealth.api.report import Report
from gpuhealth.catalog import xid as catalog
from gpuhealth.evaluation.findings import Assessment, Finding
from gpuhealth.evaluation.peers import p2p_drain

# The rule (its name under spec.rules) each GPU-confinable signal comes from, and its built-in scope.
RULE_OF: dict[Signal, str] = {
    Signal.APP_XID_REPEATED: "applicationRepeat",
    Signal.ECC: "ecc",
    Signal.ROW_REMAP_FAILURE: "rowRemapFailure",
    Signal.PENDING_REMAP: "pendingRemap",
    Signal.THERMAL: "thermal",
    Signal.GPU_LOST: "gpuLost",
    Signal.POWER_BRAKE: "powerBrake",
    Signal.HW_SLOWDOWN: "hwSlowdown",
    Signal.NVLINK_DEGRADED: "nvlink",
    Signal.PCIE_DOWNTRAINED: "pcie",
    Signal.FABRIC_DEGRADED: "fabric",
}
RULE_SCOPE: dict[str, Scope] = {
    "applicationRepeat": Scope.DEVICE,  # an application XID repeating on one GPU: that GPU's hardware
    "ecc": Scope.DEVICE,
    "rowRemapFailure": Scope.DEVICE,
    "pendingRemap": Scope.DEVICE,  # pending row remap or retired page: a reset of that GPU
    "thermal": Scope.DEVICE,  # heat or HW slowdown on one GPU (several hot GPUs escalate by count)
    "gpuLost": Scope.NODE,  # a GPU off the bus usually needs the node rebooted
    "powerBrake": Scope.DEVICE,  # slow, not broken: new work kept off that GPU (a NoSchedule rule)
    "hwSlowdown": Scope.DEVICE,
    # The fabric between GPUs (evaluation/fabric_rules.py): a slow link or fabric of one GPU is that GPU's.
    # FabricFault and the NIC findings name no GPU: always the node's.
    "nvlink": Scope.DEVICE,
    "pcie": Scope.DEVICE,
    "fabric": Scope.DEVICE,
}
# XID 154 carries the driver's own recovery action: its scope is that action's row in
# api/recovery.py (a reset of the GPU or of its PCIe bus is the GPU's; reboots and P2P drains are the
# node's; RecoverImexDomain is the node's whole multi-node NVLink domain, which evaluation/domains.py
# takes out as one), and an unknown one is the node's. DrainP2P with the GPU's NVLink peers known and
# spec.remediation on is the GPU's: evaluation/peers.py holds its peers out with it.
NVLINK_XIDS = frozenset({74})


def xid_scope(code: int, recovery_action: RecoveryAction | None = None) -> Scope:
    """Built-in scope of an XID: Device only when NVIDIA's remedy is a reset of that GPU."""
    if code in NVLINK_XIDS:
        return Scope.NODE
    if code == 154:
        return recovery_action.row.scope if recovery_action is not None else Scope.NODE
    return Scope.DEVICE if catalog.lookup(code).immediate_action == "RESET_GPU" else Scope.NODE


def scope_of(finding: Finding, policy: Policy, report: Report | None = None) -> Scope:
    """The scope ``finding`` has under ``policy`` (see the module docstring for the order)."""
    if finding.scope in (Scope.DOMAIN, Scope.RACK):
        return finding.scope  # correlated across nodes by evaluation/domains.py: no policy narrows it
    if finding.gpu is None and not finding.uuid:
        return Scope.NODE
    if not policy.devices.enabled:
        return Scope.NODE
    if finding.signal == Signal.XID and finding.code is not None:
        if finding.code in policy.devices.xid_scopes:
            return policy.devices.xid_scopes[finding.code]
        device = report.device(finding.gpu) if report is not None else None
        if finding.code == 154 and policy.remediation.enabled and p2p_drain(device):
            return Scope.DEVICE  # DrainP2P with its NVLink peers known: the GPU's, its peers held with it
        return xid_scope(finding.code, device.recovery_action if device else None)
    if finding.signal == Signal.RESTART_LOOP:
        return Scope.DEVICE  # named a GPU only where every failing pod holds it (restarts.py)
    rule = RULE_OF.get(finding.signal)
    if rule is None:
        return Scope.NODE
    return policy.devices.rule_scopes.get(rule, RULE_SCOPE[rule])


def device_findings(a: Assessment) -> tuple[Finding, ...]:
    """Quarantine-level findings confined to one GPU."""
    return tuple(f for f in a.findings if f.scope == Scope.DEVICE and f.action.quarantines)


def node_findings(a: Assessment) -> tuple[Finding, ...]:
    """Quarantine-level findings that take the whole node out (a domain's or rack's take each node)."""
    return tuple(f for f in a.findings if f.scope != Scope.DEVICE and f.action.quarantines)


def slow_only(a: Assessment) -> bool:
    """Whether everything that takes the node out is slow, not broken (``SLOW_SIGNALS``): it then
    leaves service under the breaker's budget for slow nodes (``spec.safety.maxSlow``)."""
    taking = node_findings(a)
    return bool(taking) and all(f.signal in SLOW_SIGNALS for f in taking)


def rule_of(finding: Finding) -> str:
    """The policy rule (its name under spec.rules) a finding comes from, for status and Events."""
    if finding.signal == Signal.XID:
        return "xid"
    return RULE_OF.get(finding.signal) or {
        Signal.GPU_COUNT: "gpuCount",
        Signal.AGENT_SILENT: "agentSilence",
        Signal.NVML_UNAVAILABLE: "agentSilence",
        Signal.NVML_UNRESPONSIVE: "nvmlUnresponsive",
        Signal.RESTART_LOOP: "restartLoop",
        Signal.IMEX_DOMAIN: "topology",
        Signal.RACK_POWER_BRAKE: "powerBrake",
        Signal.FABRIC_FAULT: "fabric",
        Signal.NIC_DOWN: "nic",
        Signal.NIC_DEGRADED: "nic",
    }.get(finding.signal, str(finding.signal))
