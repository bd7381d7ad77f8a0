"""NVML's GPU recovery action, declared once: what each value means and what gpuhealth does about it.

The driver tells what a faulted GPU needs in ``nvmlDeviceGpuRecoveryAction_t``: the agent reads it
from field ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` (230) and XID 154 prints it. Every reader goes
through :data:`RECOVERY` (one row per value): the agent names the NVML value with it, the report's
parser turns the report's spelling into a :class:`RecoveryAction`, assess takes the verdict from it,
scope the scope, the ladder its first step and whether the GPU's NVLink peers must be idle first,
and the CRD's enum is generated from it (``hack/gen_crds.py``).

What NVIDIA says each value means (``nvml.h`` of NVML 13, the ``nvidia-nvml-dev`` wheel the fake
NVML is compiled against, also https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceEnumvs.html;
and NVIDIA's "Error Recovery and Response Flags",
https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/error-recovery-and-response-flags.html):

* 0 NONE: "no recovery action is needed"; a new process may use the GPU.
* 1 GPU_RESET: terminate the GPU's processes and reset it with ``nvidia-smi -r``: the ``GPUReset``
  step, confined to that GPU.
* 2 NODE_REBOOT: the fault "may have left the OS in an inconsistent state": reboot the OS.
* 3 DRAIN_P2P: terminate every process doing peer-to-peer traffic (and disable UVM persistence),
  then read the field again, which then names another action. P2P runs between this GPU and its
  peers. With the peers known (``spec.devices[].nvlink.peers``) and ``spec.remediation`` on, the
  finding is the GPU's and evaluation/peers.py drains the peers with it, then waits for the agent's
  next reading and follows the action it names; a reading still ``DrainP2P`` after
  ``REREAD_TIMEOUT_S`` gets the row's conservative step, ``NodeReboot``. Without the peers the drain
  is the node's (the row's ``Node`` scope) and the step ``NodeReboot`` (which also quiesces them).
* 4 DRAIN_AND_RESET: "Drain P2P and Reset Gpu": the peers must be idle, then the GPU is reset. The
  reset is this GPU's (Device scope) and its ladder starts at ``GPUReset``. The agent reports each
  GPU's NVLink peers (``spec.devices[].nvlink.peers``): with them known, evaluation/peers.py holds
  the peers out with the GPU (drained, one breaker decision for the group) and the reset starts
  only once they are idle, as NVIDIA documents for NVSwitch systems. With the peers not known
  (``peers: None``) gpuhealth cannot idle them, so the ladder skips ``GPUReset`` and starts at
  ``NodeReboot`` (``api/remediation.py`` ``steps_for``; the remediator says so in an Event).
* 5 RECOVER_IMEX_DOMAIN: "Recover IMEX Domain", nothing more. The IMEX domain is the multi-node
  NVLink domain every node with the same ``nvidia.com/gpu.clique`` label shares (up to 18 nodes of a
  GB200 NVL72 rack), so the scope is ``Domain``: evaluation/domains.py takes every member out as one
  decision. NVIDIA gives no procedure, so the conservative step is ``NodeReboot`` (it restarts each
  node's IMEX daemon).
* 6 BUS_RESET: "Reset the GPU's PCIe bus": a reset of that GPU's link, not of the host; confined to
  the GPU, and its ladder is the reset ladder (``GPUReset``, then ``NodeReboot`` if that did not clear
  it): ``nvidia-smi -r`` is NVIDIA's GPU-level reset path, and a reboot stays the fallback.
* 7 SYSTEM_REBOOT: "Reboot the system": ``NodeReboot``.

Pure, and free of the rest of gpuhealth but ``api/names.py``, so the agent can use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from gpuhealth.api.names import Action, Scope, StepKind


class RecoveryAction(StrEnum):
    """The report's spelling of each NVML recovery action (``spec.devices[].recoveryAction``); the member
    names are NVML's (``NVML_GPU_RECOVERY_ACTION_<name>``)."""

    NONE = "None"
    GPU_RESET = "Reset"
    NODE_REBOOT = "Reboot"
    DRAIN_P2P = "DrainP2P"
    DRAIN_AND_RESET = "DrainAndReset"
    RECOVER_IMEX_DOMAIN = "RecoverImexDomain"
    BUS_RESET = "BusReset"
    SYSTEM_REBOOT = "SystemReboot"

    @property
    def row(self) -> Recovery:
        return RECOVERY[self]

    @classmethod
    def from_nvml(cls, value: int) -> RecoveryAction | None:
        """The action of an ``nvmlDeviceGpuRecoveryAction_t`` value; None for one newer than this table
        (unknown: omitted from the report, never guessed)."""
        return _BY_NVML.get(value)

    @classmethod
    def parse(cls, text: str) -> RecoveryAction | None:
        """The action a string names, in any spelling NVIDIA or the report uses; None if it names none.

        Accepts the report's spellings, the driver's wording in the XID 154 message ("Drain and
        Reset", "GPU Reset Required", "Node Reboot Required"), NVML's names
        ("NVML_GPU_RECOVERY_ACTION_BUS_RESET") and values ("0".."7", "0x2").
        """
        try:
            return cls(text)
        except ValueError:
            pass
        key = re.sub(r"[^a-z0-9]", "", text.strip().lower()).removeprefix("nvmlgpurecoveryaction")
        if re.fullmatch(r"0x[0-9a-f]+", key):
            key = str(int(key, 16))
        if key.isdigit():
            return cls.from_nvml(int(key))
        return _ALIASES.get(key)


@dataclass(frozen=True, slots=True)
class Recovery:
    """One NVML recovery action and what gpuhealth does about it (see the module docstring for why)."""

    action: RecoveryAction
    nvml: int  # nvmlDeviceGpuRecoveryAction_t (its name: NVML_GPU_RECOVERY_ACTION_<action.name>)
    verdict: Action  # the verdict of an XID 154 that carries it
    scope: Scope  # the built-in scope of that finding
    first_step: StepKind | None  # where the default ladder starts; None: no ladder
    drain_peers: bool  # the GPU's NVLink peers must be idle before it is reset (unknown peers: GPUReset skipped)
    means: str  # NVIDIA's words, shortened


_A, _DEV, _NODE, _DOM = RecoveryAction, Scope.DEVICE, Scope.NODE, Scope.DOMAIN
_RESET, _REBOOT = StepKind.GPU_RESET, StepKind.NODE_REBOOT
_OBSERVE, _DRAIN = Action.OBSERVE, Action.DRAIN
# Every recovery action, in NVML's order (why each row says what it says: the module docstring).
# fmt: off
RECOVERY: dict[RecoveryAction, Recovery] = {r.action: r for r in (
    #        action                  NVML verdict    scope  first    peers  NVIDIA's meaning
    Recovery(_A.NONE,                0,   _OBSERVE,  _NODE, None,    False, "no action needed"),
    Recovery(_A.GPU_RESET,           1,   _DRAIN,    _DEV,  _RESET,  False, "reset the GPU"),
    Recovery(_A.NODE_REBOOT,         2,   _DRAIN,    _NODE, _REBOOT, False, "reboot the node"),
    Recovery(_A.DRAIN_P2P,           3,   _DRAIN,    _NODE, _REBOOT, True,  "drain P2P traffic, then read it again"),
    Recovery(_A.DRAIN_AND_RESET,     4,   _DRAIN,    _DEV,  _RESET,  True,  "drain P2P traffic, then reset the GPU"),
    Recovery(_A.RECOVER_IMEX_DOMAIN, 5,   _DRAIN,    _DOM,  _REBOOT, False, "recover the IMEX domain"),
    Recovery(_A.BUS_RESET,           6,   _DRAIN,    _DEV,  _RESET,  False, "reset the GPU's PCIe bus"),
    Recovery(_A.SYSTEM_REBOOT,       7,   _DRAIN,    _NODE, _REBOOT, False, "reboot the system"),
)}
# fmt: on

_BY_NVML = {r.nvml: r.action for r in RECOVERY.values()}

# The driver's words in the XID 154 message and other spellings of the same actions.
_ALIASES: dict[str, RecoveryAction] = {
    **{a.name.replace("_", "").lower(): a for a in RecoveryAction},
    **{a.value.lower(): a for a in RecoveryAction},
    "gpuresetrequired": RecoveryAction.GPU_RESET,
    "noderebootrequired": RecoveryAction.NODE_REBOOT,
    "recoverimexdomainrequired": RecoveryAction.RECOVER_IMEX_DOMAIN,
    "imexdomainrecovery": RecoveryAction.RECOVER_IMEX_DOMAIN,
    "busresetrequired": RecoveryAction.BUS_RESET,
    "pciebusreset": RecoveryAction.BUS_RESET,
    "gpubusreset": RecoveryAction.BUS_RESET,
    "systemrebootrequired": RecoveryAction.SYSTEM_REBOOT,
}
