"""The recovery-action table (``api/recovery.py``): one row per NVML value, and every spelling of
an action NVIDIA or the report uses parses to it; anything else is unknown, never guessed."""

from __future__ import annotations

import pytest

from gpuhealth.api.names import Scope, StepKind
from gpuhealth.api.recovery import RECOVERY, RecoveryAction


def test_one_row_per_action_in_nvml_order() -> None:
    assert list(RECOVERY) == list(RecoveryAction)
    assert [r.nvml for r in RECOVERY.values()] == list(range(len(RecoveryAction)))
    assert all(RECOVERY[a].action is a and a.row is RECOVERY[a] for a in RecoveryAction)


def test_a_peer_draining_action_starts_with_a_reset_only_when_it_is_the_gpus() -> None:
    """A reset with the peers drained first is one GPU's repair (Device scope, evaluation/peers.py);
    DrainP2P is the node's and names no reset."""
    resets = [r.action for r in RECOVERY.values() if r.drain_peers and r.first_step == StepKind.GPU_RESET]
    assert resets == [RecoveryAction.DRAIN_AND_RESET]
    assert all(RECOVERY[a].scope == Scope.DEVICE for a in resets)


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("None", RecoveryAction.NONE),
        ("DrainP2P", RecoveryAction.DRAIN_P2P),
        ("DrainAndReset", RecoveryAction.DRAIN_AND_RESET),
        ("Reset", RecoveryAction.GPU_RESET),
        ("Reboot", RecoveryAction.NODE_REBOOT),
        ("RecoverImexDomain", RecoveryAction.RECOVER_IMEX_DOMAIN),
        ("BusReset", RecoveryAction.BUS_RESET),
        ("SystemReboot", RecoveryAction.SYSTEM_REBOOT),
        # the driver's wording in the XID 154 message, NVML's names and values
        ("Drain P2P", RecoveryAction.DRAIN_P2P),
        ("Drain and Reset", RecoveryAction.DRAIN_AND_RESET),
        ("GPU Reset Required", RecoveryAction.GPU_RESET),
        ("Node Reboot Required", RecoveryAction.NODE_REBOOT),
        ("System Reboot Required", RecoveryAction.SYSTEM_REBOOT),
        ("none", RecoveryAction.NONE),
        ("0x0", RecoveryAction.NONE),
        ("0", RecoveryAction.NONE),
        ("1", RecoveryAction.GPU_RESET),
        ("0x2", RecoveryAction.NODE_REBOOT),
        ("3", RecoveryAction.DRAIN_P2P),
        ("4", RecoveryAction.DRAIN_AND_RESET),
        ("5", RecoveryAction.RECOVER_IMEX_DOMAIN),
        ("0x6", RecoveryAction.BUS_RESET),
        ("7", RecoveryAction.SYSTEM_REBOOT),
        ("NVML_GPU_RECOVERY_ACTION_BUS_RESET", RecoveryAction.BUS_RESET),
        ("NVML_GPU_RECOVERY_ACTION_NONE", RecoveryAction.NONE),
    ],
)
def test_every_spelling_parses(text: str, action: RecoveryAction) -> None:
    assert RecoveryAction.parse(text) is action


@pytest.mark.parametrize("text", ["", "Explode", "0x9", "8", "DrainSomething"])
def test_unknown_spellings_are_unknown(text: str) -> None:
    assert RecoveryAction.parse(text) is None


def test_nvml_values_beyond_the_table_are_unknown() -> None:
    assert RecoveryAction.from_nvml(8) is None and RecoveryAction.from_nvml(-1) is None
