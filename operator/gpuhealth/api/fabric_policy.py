"""A policy's rules on the fabric between GPUs: ``spec.rules.nvlink``, ``spec.rules.pcie``,
``spec.rules.fabric`` and ``spec.rules.nic``, read from the facts ``api/report_fabric.py`` types.

Two kinds of verdict, kept apart because they are answered apart:

- *degraded* (slow, not broken): a GPU with an NVLink down, a PCIe link trained narrower (or, busy,
  slower) than it can be, a fabric health sub-field saying degraded bandwidth or a recovery, a NIC
  throwing errors above a rate. Such GPUs compute correctly at a fraction of their speed; like the
  power brake (``api/slow_policy.py``) the default is ``cordon`` at the finding's scope, running work
  untouched, and ``moveRunningWork: AtNextCheckpoint`` may move it at its own next checkpoint. They
  count against ``safety.maxSlow``, never the budget meant for dead GPUs.
- *broken*: the fabric probe failed or the GPU's fabric configuration is wrong (``fabric.brokenAction``),
  a NIC port down or one of the counters fatal on any increase rising (``nic.action``): drain.

The NIC thresholds are NVSentinel's nic-health-monitor defaults as the repository's design notes record
them (``docs/devices.md``, "The fabric's verdicts"): fatal on a port down or any increase of
``link_downed``, ``local_link_integrity_errors``, ``excessive_buffer_overrun_errors`` or
``rnr_nak_retry_err``; ``symbol_error`` above 120 an hour fatal and above 10 a second degraded;
``link_error_recovery`` above 5 a minute and ``port_rcv_errors`` above 10 a second degraded. The PCIe
replay counter stays telemetry: no source the design notes cite gives a threshold for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuhealth.api.names import Action
from gpuhealth.api.policy_fields import PolicyError, action, get, integer, section
from gpuhealth.api.slow_policy import MOVE_CHOICES, SLOW_ACTIONS

# NVSentinel's nic-health-monitor defaults (see the module docstring).
SYMBOL_ERRORS_FATAL_PER_HOUR = 120
SYMBOL_ERRORS_DEGRADED_PER_SECOND = 10
LINK_ERROR_RECOVERY_PER_MINUTE = 5
PORT_RCV_ERRORS_PER_SECOND = 10
RATE_MAX = 10**9  # the largest threshold the schema takes (a counter rate, not a budget)


@dataclass(frozen=True)
class Degraded:
    """What a degraded (slow, not broken) finding of a fabric rule asks for."""

    action: Action = Action.CORDON
    at_next_checkpoint: bool = False  # moveRunningWork: AtNextCheckpoint (as api/slow_policy.py's)

    @property
    def finding_action(self) -> Action:
        """A drain when running work moves at its next checkpoint, else the rule's action."""
        return Action.DRAIN if self.at_next_checkpoint and self.action.quarantines else self.action


@dataclass(frozen=True)
class NvLinkRule:
    enabled: bool = True
    degraded: Degraded = field(default_factory=Degraded)


@dataclass(frozen=True)
class PcieRule:
    enabled: bool = True
    # Judge the generation too (only while the GPU is busy: an idle GPU drops its link to save power).
    generation: bool = True
    degraded: Degraded = field(default_factory=Degraded)


@dataclass(frozen=True)
class FabricRule:
    enabled: bool = True
    degraded: Degraded = field(default_factory=Degraded)
    broken_action: Action = Action.DRAIN  # a failed probe or an incorrect configuration


@dataclass(frozen=True)
class NicRule:
    enabled: bool = True
    action: Action = Action.DRAIN  # a port down or a counter fatal on any increase: the node out
    degraded: Degraded = field(default_factory=Degraded)
    symbol_errors_fatal_per_hour: int = SYMBOL_ERRORS_FATAL_PER_HOUR
    symbol_errors_degraded_per_second: int = SYMBOL_ERRORS_DEGRADED_PER_SECOND
    link_error_recovery_per_minute: int = LINK_ERROR_RECOVERY_PER_MINUTE
    port_rcv_errors_per_second: int = PORT_RCV_ERRORS_PER_SECOND


@dataclass(frozen=True)
class FabricRules:
    nvlink: NvLinkRule = field(default_factory=NvLinkRule)
    pcie: PcieRule = field(default_factory=PcieRule)
    fabric: FabricRule = field(default_factory=FabricRule)
    nic: NicRule = field(default_factory=NicRule)


def _degraded(rule: Mapping[str, Any], where: str, key: str = "action") -> Degraded:
    move = get(rule, "", "moveRunningWork", MOVE_CHOICES[0])
    if move not in MOVE_CHOICES:
        raise PolicyError(f"{where}.moveRunningWork: invalid {move!r} (Never or AtNextCheckpoint)")
    return Degraded(
        action=action(get(rule, "", key, "cordon"), f"{where}.{key}", SLOW_ACTIONS),
        at_next_checkpoint=move == "AtNextCheckpoint",
    )


def _enabled(rule: Mapping[str, Any], where: str) -> bool:
    v = get(rule, "", "enabled", True)
    if not isinstance(v, bool):
        raise PolicyError(f"{where}.enabled: must be a boolean, got {v!r}")
    return v


def _rate(rule: Mapping[str, Any], where: str, key: str, default: int) -> int:
    return integer(get(rule, "", key, default), f"{where}.{key}", 1, RATE_MAX)


def parse_fabric_rules(rules: Mapping[str, Any]) -> FabricRules:
    """The four rules from ``spec.rules``, defaulted as the CRD defaults them; PolicyError names the field."""
    nvlink = section(rules, "nvlink", "spec.rules")
    pcie = section(rules, "pcie", "spec.rules")
    fab = section(rules, "fabric", "spec.rules")
    nic = section(rules, "nic", "spec.rules")
    judge_gen = get(pcie, "", "judgeGeneration", True)
    if not isinstance(judge_gen, bool):
        raise PolicyError(f"spec.rules.pcie.judgeGeneration: must be a boolean, got {judge_gen!r}")
    w = "spec.rules.nic"
    return FabricRules(
        nvlink=NvLinkRule(
            enabled=_enabled(nvlink, "spec.rules.nvlink"), degraded=_degraded(nvlink, "spec.rules.nvlink")
        ),
        pcie=PcieRule(
            enabled=_enabled(pcie, "spec.rules.pcie"),
            generation=judge_gen,
            degraded=_degraded(pcie, "spec.rules.pcie"),
        ),
        fabric=FabricRule(
            enabled=_enabled(fab, "spec.rules.fabric"),
            degraded=_degraded(fab, "spec.rules.fabric"),
            broken_action=action(get(fab, "", "brokenAction", "drain"), "spec.rules.fabric.brokenAction"),
        ),
        nic=NicRule(
            enabled=_enabled(nic, w),
            action=action(get(nic, "", "action", "drain"), f"{w}.action"),
            degraded=_degraded(nic, w, "degradedAction"),
            symbol_errors_fatal_per_hour=_rate(nic, w, "symbolErrorsFatalPerHour", SYMBOL_ERRORS_FATAL_PER_HOUR),
            symbol_errors_degraded_per_second=_rate(
                nic, w, "symbolErrorsDegradedPerSecond", SYMBOL_ERRORS_DEGRADED_PER_SECOND
            ),
            link_error_recovery_per_minute=_rate(nic, w, "linkErrorRecoveryPerMinute", LINK_ERROR_RECOVERY_PER_MINUTE),
            port_rcv_errors_per_second=_rate(nic, w, "portRcvErrorsPerSecond", PORT_RCV_ERRORS_PER_SECOND),
        ),
    )
