"""Typed view of a GPUHealthPolicy: the policy, its drain settings and the breaker's arithmetic.

The API server applies the CRD's defaults and refuses invalid objects; this parser applies the same
defaults again so that pure logic and tests never depend on a server having defaulted the object,
and raises PolicyError with the offending field for anything the schema could not catch. Its parts
have modules of their own: the field readers (``policy_fields``), the node selector (``selector``),
the per-device settings (``device_policy``) and the repair ladder (``remediation``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuhealth.api.device_policy import DeviceSettings, parse_devices
from gpuhealth.api.fabric_policy import FabricRules, parse_fabric_rules
from gpuhealth.api.names import Action, Mode, Scope, Signal
from gpuhealth.api.policy_fields import PolicyError, action, boolean, duration, get, integer, scope, section
from gpuhealth.api.remediation import RemediationError, RemediationSettings, parse_remediation
from gpuhealth.api.selector import LabelSelector, parse_selector
from gpuhealth.api.slow_policy import (
    HW_SLOWDOWN_SUSTAINED,
    POWER_BRAKE_SUSTAINED,
    SlowRule,
    Topology,
    parse_slow_rule,
    parse_topology,
)
from gpuhealth.api.validation import ValidationError, ValidationSettings, parse_validation

# Read by many callers, which know a policy's error by this module's name.
__all__ = [
    "DrainSettings",
    "Policy",
    "PolicyError",
    "breaker_limit",
    "parse_policy",
    "select_policy",
]


# Closed vocabularies of the policy's string fields (the CRD's enums are generated from these).
TAINT_EFFECTS = ("NoSchedule", "NoExecute")
CHECKPOINT_MODES = ("FromPod", "annotation", "signal", "none")  # FromPod: each pod's own annotation
CHECKPOINT_TIMEOUT_CHOICES = ("Evict", "Wait")
# The actions a rule allows where not every action makes sense (every other rule allows all of Action).
APP_REPEAT_ACTIONS = frozenset({Action.OBSERVE, Action.CORDON, Action.DRAIN, Action.REPAIR})
SILENCE_ACTIONS = frozenset({Action.OBSERVE, Action.CORDON})
RESTART_LOOP_ACTIONS = frozenset({Action.OBSERVE, Action.CORDON, Action.DRAIN})
NVML_HANG_ACTIONS = frozenset({Action.OBSERVE, Action.CORDON, Action.DRAIN})


@dataclass(frozen=True)
class DrainSettings:
    checkpoint_mode: str = "FromPod"
    checkpoint_timeout_s: float = 600.0
    on_checkpoint_timeout: str = "Evict"
    max_wait_s: float = 3600.0
    allow_force_delete: bool = False
    force_delete_after_s: float = 7200.0
    gang_survives_rank_loss: bool = False
    system_namespaces: tuple[str, ...] = ("kube-system", "gpuhealth-system")

    def patient(self) -> DrainSettings:
        """These settings as a drain at the next checkpoint runs them (``moveRunningWork:
        AtNextCheckpoint``): ask, wait for the acknowledgement however long, never evict a pod without
        one (nor one that cannot checkpoint), never force-delete."""
        return replace(self, on_checkpoint_timeout="Wait", max_wait_s=math.inf, allow_force_delete=False)


@dataclass(frozen=True)
class Policy:
    name: str
    generation: int = 0
    selector: LabelSelector = field(default_factory=LabelSelector)
    mode: Mode = Mode.ENFORCE
    priority: int = 0
    xid_overrides: Mapping[int, Action] = field(default_factory=dict)
    app_repeat_count: int = 3
    app_repeat_window_s: float = 600.0
    app_repeat_action: Action = Action.DRAIN
    ecc_threshold: int = 1
    ecc_action: Action = Action.DRAIN
    row_remap_failure_action: Action = Action.REPAIR
    pending_remap_action: Action = Action.DRAIN
    thermal_threshold_c: int = 90
    thermal_slowdown: bool = True
    thermal_sustained_s: float = 300.0
    thermal_action: Action = Action.CORDON
    power_brake: SlowRule = field(default_factory=SlowRule)  # api/slow_policy.py: slow, not broken
    hw_slowdown: SlowRule = field(default_factory=lambda: SlowRule(sustained_s=300.0))
    topology: Topology = field(default_factory=Topology)  # the domain and rack labels
    fabric: FabricRules = field(default_factory=FabricRules)  # api/fabric_policy.py: nvlink, pcie, fabric, nic
    gpu_lost_action: Action = Action.DRAIN
    gpu_count_expected: int | None = None
    gpu_count_action: Action = Action.CORDON
    silence_after_s: float = 120.0
    silence_action: Action = Action.OBSERVE
    nvml_unresponsive_action: Action = Action.OBSERVE
    # spec.actions: the node quarantine's taint effect, and whether it also cordons. cordon False holds
    # the node with gpuhealth's taint alone (platforms that act on a cordon: docs/install.md)
    taint_effect: str = "NoSchedule"
    cordon: bool = True
    drain: DrainSettings = field(default_factory=DrainSettings)
    max_unhealthy: int | str = "10%"
    max_slow: int | str = "10%"  # the budget of nodes held out for a slow signal (SLOW_SIGNALS)
    max_concurrent_drains: int = 1
    probation_s: float = 600.0
    flapping_max: int = 3
    flapping_window_s: float = 86400.0
    restart_loop_enabled: bool = True
    restart_loop_window_s: float = 900.0
    restart_loop_min_workloads: int = 2
    restart_loop_min_restarts: int = 3
    restart_loop_action: Action = Action.CORDON
    gpu_hourly_cost: float | None = None
    currency: str = "USD"
    devices: DeviceSettings = field(default_factory=DeviceSettings)
    max_unhealthy_gpus: int | str | None = None  # unset: the node budget's worth of GPUs
    remediation: RemediationSettings = field(default_factory=RemediationSettings)  # api/remediation.py
    validation: ValidationSettings = field(default_factory=ValidationSettings)  # api/validation.py

    def gpu_breaker_limit(self, total_gpus: int, total_nodes: int) -> int:
        """Most GPUs this policy may hold out at once (a node quarantine counts all its GPUs).

        Unset, it is what ``maxUnhealthy`` allows in nodes, counted in GPUs (the limit in nodes times
        the policy's GPUs per node, rounded up): per-device quarantine may take out as much capacity
        as node quarantine could, never more. A fixed percent of GPUs would be spent by one node
        quarantine on a small fleet (10% of eight 8-GPU nodes is 7 GPUs, one node is 8) and hold
        every GPU quarantine back while the node budget still had room.
        """
        if self.max_unhealthy_gpus is not None:
            return breaker_limit(self.max_unhealthy_gpus, total_gpus, "spec.safety.maxUnhealthyGPUs")
        if total_nodes <= 0 or total_gpus <= 0:
            return 0
        per_node = -(-total_gpus // total_nodes)
        return min(total_gpus, self.breaker_limit(total_nodes) * per_node)

    def slow_gpu_breaker_limit(self, total_gpus: int, total_nodes: int) -> int:
        """Most GPUs this policy may hold out at once for a slow, not broken, signal: ``maxSlow`` in nodes
        counted in GPUs (as ``gpu_breaker_limit`` counts ``maxUnhealthy``). A slow GPU held out one by one
        spends this budget, never the one meant for dead GPUs."""
        if total_nodes <= 0 or total_gpus <= 0:
            return 0
        per_node = -(-total_gpus // total_nodes)
        return min(total_gpus, self.slow_breaker_limit(total_nodes) * per_node)

    def drain_for(self, reason: str) -> DrainSettings:
        """The drain settings of a node held out for ``reason``: patient for a slow rule whose running
        work moves at its next checkpoint, the policy's own otherwise."""
        fab = self.fabric
        patient = {
            str(Signal.POWER_BRAKE): self.power_brake.at_next_checkpoint,
            str(Signal.HW_SLOWDOWN): self.hw_slowdown.at_next_checkpoint,
            str(Signal.NVLINK_DEGRADED): fab.nvlink.degraded.at_next_checkpoint,
            str(Signal.PCIE_DOWNTRAINED): fab.pcie.degraded.at_next_checkpoint,
            str(Signal.FABRIC_DEGRADED): fab.fabric.degraded.at_next_checkpoint,
            str(Signal.NIC_DEGRADED): fab.nic.degraded.at_next_checkpoint,
        }.get(reason, False)
        return self.drain.patient() if patient else self.drain

    def breaker_limit(self, total_nodes: int) -> int:
        """Most nodes this policy may hold out of service at once."""
        return breaker_limit(self.max_unhealthy, total_nodes)

    def slow_breaker_limit(self, total_nodes: int) -> int:
        """Most nodes this policy may hold out at once for a slow, not broken, signal."""
        return breaker_limit(self.max_slow, total_nodes, "spec.safety.maxSlow")


_PERCENT = re.compile(r"^(100|[1-9]?[0-9])%$")


def breaker_limit(max_unhealthy: int | str, total_nodes: int, path: str = "spec.safety.maxUnhealthy") -> int:
    """Percent rounds up, so a small fleet with a non-zero percent can still quarantine one node.

    5% of 1000 is 50; 10% of 4 is 1; 0% is 0 (no quarantine at all).
    """
    if isinstance(max_unhealthy, int):
        return max(0, max_unhealthy)
    m = _PERCENT.fullmatch(str(max_unhealthy))
    if not m:
        raise PolicyError(f"{path}: invalid value {max_unhealthy!r}")
    return -(-(total_nodes * int(m.group(1))) // 100)


def parse_policy(obj: Mapping[str, Any]) -> Policy:
    """Policy from a GPUHealthPolicy object (as the API returns it)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    name = str(meta.get("name", ""))
    rules = section(spec, "rules", "spec")
    xid = section(rules, "xid", "spec.rules")
    repeat = section(xid, "applicationRepeat", "spec.rules.xid")
    overrides: dict[int, Action] = {}
    xid_scopes: dict[int, Scope] = {}
    seen: set[int] = set()
    for i, o in enumerate(xid.get("overrides") or []):
        p = f"spec.rules.xid.overrides[{i}]"
        code = integer(o.get("code"), f"{p}.code", 1, 1023)
        if code in seen:
            raise PolicyError(f"{p}.code: duplicate XID {code}")
        seen.add(code)
        if o.get("action") is None and o.get("scope") is None:
            raise PolicyError(f"{p}: an override sets action, scope or both")
        if o.get("action") is not None:
            overrides[code] = action(o.get("action"), f"{p}.action")
        if o.get("scope") is not None:
            xid_scopes[code] = scope(o.get("scope"), f"{p}.scope")
    ecc = section(rules, "ecc", "spec.rules")
    thermal = section(rules, "thermal", "spec.rules")
    count = section(rules, "gpuCount", "spec.rules")
    silence = section(rules, "agentSilence", "spec.rules")
    hang = section(rules, "nvmlUnresponsive", "spec.rules")
    actions = section(spec, "actions", "spec")
    drain = section(actions, "drain", "spec.actions")
    safety = section(spec, "safety", "spec")
    flapping = section(safety, "flapping", "spec.safety")
    loop = section(spec, "restartLoop", "spec")
    cost = section(spec, "cost", "spec")

    try:
        mode = Mode(get(spec, "spec", "mode", "Enforce"))
    except ValueError:
        raise PolicyError(f"spec.mode: unknown mode {spec.get('mode')!r}") from None
    effect = get(actions, "spec.actions", "taintEffect", "NoSchedule")
    if effect not in TAINT_EFFECTS:
        raise PolicyError(f"spec.actions.taintEffect: invalid {effect!r}")
    max_unhealthy = get(safety, "spec.safety", "maxUnhealthy", "10%")
    breaker_limit(max_unhealthy, 100)  # validates
    max_slow = get(safety, "spec.safety", "maxSlow", "10%")
    breaker_limit(max_slow, 100, "spec.safety.maxSlow")  # validates
    max_unhealthy_gpus = get(safety, "spec.safety", "maxUnhealthyGPUs", None)
    if max_unhealthy_gpus is not None:
        breaker_limit(max_unhealthy_gpus, 100, "spec.safety.maxUnhealthyGPUs")  # validates
    expected = count.get("expected")
    hourly = cost.get("gpuHourly")
    policy = Policy(
        name=name,
        generation=int(meta.get("generation") or 0),
        selector=parse_selector(spec.get("nodeSelector")),
        mode=mode,
        priority=integer(get(spec, "spec", "priority", 0), "spec.priority", -1000, 1000),
        xid_overrides=overrides,
        app_repeat_count=integer(get(repeat, "", "count", 3), "spec.rules.xid.applicationRepeat.count", 2, 1000),
        app_repeat_window_s=duration(get(repeat, "", "window", "10m"), "spec.rules.xid.applicationRepeat.window"),
        app_repeat_action=action(
            get(repeat, "", "action", "drain"),
            "spec.rules.xid.applicationRepeat.action",
            APP_REPEAT_ACTIONS,
        ),
        ecc_threshold=integer(get(ecc, "", "uncorrectedThreshold", 1), "spec.rules.ecc.uncorrectedThreshold", 1, 10**6),
        ecc_action=action(get(ecc, "", "action", "drain"), "spec.rules.ecc.action"),
        row_remap_failure_action=action(
            get(section(rules, "rowRemapFailure", "spec.rules"), "", "action", "repair"),
            "spec.rules.rowRemapFailure.action",
        ),
        pending_remap_action=action(
            get(section(rules, "pendingRemap", "spec.rules"), "", "action", "drain"),
            "spec.rules.pendingRemap.action",
        ),
        thermal_threshold_c=integer(
            get(thermal, "", "temperatureThresholdC", 90),
            "spec.rules.thermal.temperatureThresholdC",
            30,
            150,
        ),
        thermal_slowdown=bool(get(thermal, "", "slowdown", True)),
        thermal_sustained_s=duration(get(thermal, "", "sustainedFor", "5m"), "spec.rules.thermal.sustainedFor"),
        thermal_action=action(get(thermal, "", "action", "cordon"), "spec.rules.thermal.action"),
        power_brake=parse_slow_rule(rules, "powerBrake", POWER_BRAKE_SUSTAINED),
        hw_slowdown=parse_slow_rule(rules, "hwSlowdown", HW_SLOWDOWN_SUSTAINED),
        topology=parse_topology(spec),
        fabric=parse_fabric_rules(rules),
        gpu_lost_action=action(
            get(section(rules, "gpuLost", "spec.rules"), "", "action", "drain"), "spec.rules.gpuLost.action"
        ),
        gpu_count_expected=None if expected is None else integer(expected, "spec.rules.gpuCount.expected", 1, 64),
        gpu_count_action=action(get(count, "", "action", "cordon"), "spec.rules.gpuCount.action"),
        silence_after_s=duration(get(silence, "", "after", "2m"), "spec.rules.agentSilence.after"),
        silence_action=action(
            get(silence, "", "action", "observe"),
            "spec.rules.agentSilence.action",
            SILENCE_ACTIONS,
        ),
        nvml_unresponsive_action=action(
            get(hang, "", "action", "observe"),
            "spec.rules.nvmlUnresponsive.action",
            NVML_HANG_ACTIONS,
        ),
        taint_effect=effect,
        cordon=boolean(get(actions, "", "cordon", True), "spec.actions.cordon"),
        drain=DrainSettings(
            checkpoint_mode=str(get(drain, "", "checkpointMode", "FromPod")),
            checkpoint_timeout_s=duration(
                get(drain, "", "checkpointTimeout", "10m"), "spec.actions.drain.checkpointTimeout"
            ),
            on_checkpoint_timeout=str(get(drain, "", "onCheckpointTimeout", "Evict")),
            max_wait_s=duration(get(drain, "", "maxWait", "1h"), "spec.actions.drain.maxWait"),
            allow_force_delete=bool(get(drain, "", "allowForceDelete", False)),
            force_delete_after_s=duration(
                get(drain, "", "forceDeleteAfter", "2h"), "spec.actions.drain.forceDeleteAfter"
            ),
            gang_survives_rank_loss=bool(get(drain, "", "gangSurvivesRankLoss", False)),
            system_namespaces=tuple(get(drain, "", "systemNamespaces", ["kube-system", "gpuhealth-system"])),
        ),
        max_unhealthy=max_unhealthy,
        max_slow=max_slow,
        max_concurrent_drains=integer(
            get(safety, "", "maxConcurrentDrains", 1), "spec.safety.maxConcurrentDrains", 1, 1000
        ),
        probation_s=duration(get(safety, "", "probation", "10m"), "spec.safety.probation"),
        flapping_max=integer(get(flapping, "", "maxQuarantines", 3), "spec.safety.flapping.maxQuarantines", 1, 100),
        flapping_window_s=duration(get(flapping, "", "window", "24h"), "spec.safety.flapping.window"),
        restart_loop_enabled=bool(get(loop, "", "enabled", True)),
        restart_loop_window_s=duration(get(loop, "", "window", "15m"), "spec.restartLoop.window"),
        restart_loop_min_workloads=integer(get(loop, "", "minWorkloads", 2), "spec.restartLoop.minWorkloads", 2, 100),
        restart_loop_min_restarts=integer(get(loop, "", "minRestarts", 3), "spec.restartLoop.minRestarts", 1, 1000),
        restart_loop_action=action(
            get(loop, "", "action", "cordon"),
            "spec.restartLoop.action",
            RESTART_LOOP_ACTIONS,
        ),
        gpu_hourly_cost=None if hourly is None else float(hourly),
        currency=str(get(cost, "", "currency", "USD")),
        devices=parse_devices(spec, xid_scopes),
        max_unhealthy_gpus=max_unhealthy_gpus,
        remediation=_remediation(spec),
        validation=_validation(spec),
    )
    if policy.flapping_window_s <= policy.probation_s:
        raise PolicyError("spec.safety.flapping.window: must be longer than spec.safety.probation")
    return policy


def _remediation(spec: Mapping[str, Any]) -> RemediationSettings:
    try:
        return parse_remediation(spec)
    except RemediationError as e:
        raise PolicyError(str(e)) from None


def _validation(spec: Mapping[str, Any]) -> ValidationSettings:
    try:
        return parse_validation(spec)
    except ValidationError as e:
        raise PolicyError(str(e)) from None


def select_policy(policies: list[Policy], labels: Mapping[str, str]) -> tuple[Policy | None, list[Policy]]:
    """The governing policy for a node and the other matching ones it overrides.

    Deterministic: highest priority first, then the lexically smallest name.
    """
    matching = sorted((p for p in policies if p.selector.matches(labels)), key=lambda p: (-p.priority, p.name))
    if not matching:
        return None, []
    return matching[0], matching[1:]
