"""Typed view of a GPUHealthPolicy.

The API server applies the CRD's defaults and refuses invalid objects; this parser applies the same
defaults again so that pure logic and tests never depend on a server having defaulted the object,
and raises PolicyError with the offending field for anything the schema could not catch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuhealth.api.durations import parse_duration
from gpuhealth.api.names import DEFAULT_DRA_DRIVER, Action, Mode, Scope
from gpuhealth.api.remediation import RemediationError, RemediationSettings, parse_remediation


class PolicyError(ValueError):
    """A policy the operator refuses to act on; the message names the field."""


@dataclass(frozen=True)
class LabelSelector:
    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        for k, v in self.match_labels.items():
            if labels.get(k) != v:
                return False
        for key, op, values in self.match_expressions:
            present = key in labels
            if op == "In" and (not present or labels[key] not in values):
                return False
            if op == "NotIn" and present and labels[key] in values:
                return False
            if op == "Exists" and not present:
                return False
            if op == "DoesNotExist" and present:
                return False
        return True


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


# Rules whose findings can be confined to one GPU, by their name under spec.rules (the scope
# override is spec.rules.<name>.scope). Restart loops, GPU count and agent silence are node facts.
DEVICE_RULES = ("applicationRepeat", "ecc", "rowRemapFailure", "pendingRemap", "thermal", "gpuLost")
FLAPPING_CHOICES = ("AwaitingRepair", "Node")


@dataclass(frozen=True)
class DeviceSettings:
    """Per-device quarantine (spec.devices and the ``scope`` of each rule).

    ``scope`` is the fleet switch: ``Node`` quarantines whole nodes for every fault (the behaviour
    before per-device quarantine); ``Device`` (the default) lets faults confined to one GPU take out
    only that GPU, on nodes whose GPUs a DRA ResourceSlice publishes. Nodes without DRA fall back
    to node scope either way, so the default changes nothing on a device-plugin cluster.
    """

    scope: Scope = Scope.DEVICE
    rule_scopes: Mapping[str, Scope] = field(default_factory=dict)
    xid_scopes: Mapping[int, Scope] = field(default_factory=dict)
    # More GPUs than this out on one node and the node is quarantined instead: two GPUs failing on
    # one baseboard point at a shared cause (power, cooling, NVLink), and such a node can no longer
    # run a full-node job anyway.
    max_bad_gpus_per_node: int = 1
    # What a GPU that flaps (spec.safety.flapping) gets: held for repair on its own, or its node.
    on_flapping: str = "AwaitingRepair"
    drivers: tuple[str, ...] = (DEFAULT_DRA_DRIVER,)

    @property
    def enabled(self) -> bool:
        return self.scope == Scope.DEVICE


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
    gpu_lost_action: Action = Action.DRAIN
    gpu_count_expected: int | None = None
    gpu_count_action: Action = Action.CORDON
    silence_after_s: float = 120.0
    silence_action: Action = Action.OBSERVE
    taint_effect: str = "NoSchedule"
    cordon: bool = True
    drain: DrainSettings = field(default_factory=DrainSettings)
    max_unhealthy: int | str = "10%"
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

    def breaker_limit(self, total_nodes: int) -> int:
        """Most nodes this policy may hold out of service at once."""
        return breaker_limit(self.max_unhealthy, total_nodes)


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


def _get(d: Mapping[str, Any], path: str, key: str, default: Any) -> Any:
    v = d.get(key, default) if isinstance(d, Mapping) else default
    return default if v is None else v


def _section(d: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    v = d.get(key) if isinstance(d, Mapping) else None
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise PolicyError(f"{path}.{key}: must be an object")
    return v


def _action(v: Any, path: str, allowed: frozenset[Action] | None = None) -> Action:
    try:
        a = Action(v)
    except ValueError:
        raise PolicyError(f"{path}: unknown action {v!r}") from None
    if allowed is not None and a not in allowed:
        raise PolicyError(f"{path}: action {v!r} not allowed here")
    return a


def _dur(v: Any, path: str) -> float:
    try:
        return parse_duration(v)
    except ValueError as e:
        raise PolicyError(f"{path}: {e}") from None


def _int(v: Any, path: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise PolicyError(f"{path}: must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def _scope(v: Any, path: str) -> Scope:
    try:
        return Scope(v)
    except ValueError:
        raise PolicyError(f"{path}: unknown scope {v!r} (Device or Node)") from None


_DRIVER = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def parse_devices(spec: Mapping[str, Any], xid_scopes: Mapping[int, Scope] | None = None) -> DeviceSettings:
    """spec.devices plus the ``scope`` of each rule that can be confined to one GPU."""
    devices = _section(spec, "devices", "spec")
    rules = _section(spec, "rules", "spec")
    rule_scopes: dict[str, Scope] = {}
    for rule in DEVICE_RULES:
        section = (
            _section(_section(rules, "xid", "spec.rules"), rule, "spec.rules.xid")
            if rule == "applicationRepeat"
            else _section(rules, rule, "spec.rules")
        )
        if section.get("scope") is not None:
            where = "spec.rules.xid.applicationRepeat" if rule == "applicationRepeat" else f"spec.rules.{rule}"
            rule_scopes[rule] = _scope(section.get("scope"), f"{where}.scope")
    on_flapping = str(_get(devices, "", "onFlapping", "AwaitingRepair"))
    if on_flapping not in FLAPPING_CHOICES:
        raise PolicyError(f"spec.devices.onFlapping: invalid {on_flapping!r} (AwaitingRepair or Node)")
    drivers = _get(devices, "", "drivers", [DEFAULT_DRA_DRIVER])
    if not isinstance(drivers, list) or not drivers:
        raise PolicyError("spec.devices.drivers: must be a non-empty list of DRA driver names")
    for i, d in enumerate(drivers):
        if not isinstance(d, str) or len(d) > 63 or not _DRIVER.fullmatch(d):
            raise PolicyError(f"spec.devices.drivers[{i}]: invalid DRA driver name {d!r}")
    return DeviceSettings(
        scope=_scope(_get(devices, "", "scope", "Device"), "spec.devices.scope"),
        rule_scopes=rule_scopes,
        xid_scopes=dict(xid_scopes or {}),
        max_bad_gpus_per_node=_int(_get(devices, "", "maxBadGPUsPerNode", 1), "spec.devices.maxBadGPUsPerNode", 1, 64),
        on_flapping=on_flapping,
        drivers=tuple(drivers),
    )


def parse_selector(raw: Any, path: str = "spec.nodeSelector") -> LabelSelector:
    if not raw:
        return LabelSelector()
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{path}: must be a label selector")
    labels = raw.get("matchLabels") or {}
    exprs = []
    for i, e in enumerate(raw.get("matchExpressions") or []):
        op = e.get("operator")
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise PolicyError(f"{path}.matchExpressions[{i}].operator: invalid {op!r}")
        exprs.append((str(e.get("key")), op, tuple(e.get("values") or ())))
    return LabelSelector(dict(labels), tuple(exprs))


def parse_policy(obj: Mapping[str, Any]) -> Policy:
    """Policy from a GPUHealthPolicy object (as the API returns it)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    name = str(meta.get("name", ""))
    rules = _section(spec, "rules", "spec")
    xid = _section(rules, "xid", "spec.rules")
    repeat = _section(xid, "applicationRepeat", "spec.rules.xid")
    overrides: dict[int, Action] = {}
    xid_scopes: dict[int, Scope] = {}
    seen: set[int] = set()
    for i, o in enumerate(xid.get("overrides") or []):
        p = f"spec.rules.xid.overrides[{i}]"
        code = _int(o.get("code"), f"{p}.code", 1, 1023)
        if code in seen:
            raise PolicyError(f"{p}.code: duplicate XID {code}")
        seen.add(code)
        if o.get("action") is None and o.get("scope") is None:
            raise PolicyError(f"{p}: an override sets action, scope or both")
        if o.get("action") is not None:
            overrides[code] = _action(o.get("action"), f"{p}.action")
        if o.get("scope") is not None:
            xid_scopes[code] = _scope(o.get("scope"), f"{p}.scope")
    ecc = _section(rules, "ecc", "spec.rules")
    thermal = _section(rules, "thermal", "spec.rules")
    count = _section(rules, "gpuCount", "spec.rules")
    silence = _section(rules, "agentSilence", "spec.rules")
    actions = _section(spec, "actions", "spec")
    drain = _section(actions, "drain", "spec.actions")
    safety = _section(spec, "safety", "spec")
    flapping = _section(safety, "flapping", "spec.safety")
    loop = _section(spec, "restartLoop", "spec")
    cost = _section(spec, "cost", "spec")

    try:
        mode = Mode(_get(spec, "spec", "mode", "Enforce"))
    except ValueError:
        raise PolicyError(f"spec.mode: unknown mode {spec.get('mode')!r}") from None
    effect = _get(actions, "spec.actions", "taintEffect", "NoSchedule")
    if effect not in ("NoSchedule", "NoExecute"):
        raise PolicyError(f"spec.actions.taintEffect: invalid {effect!r}")
    max_unhealthy = _get(safety, "spec.safety", "maxUnhealthy", "10%")
    breaker_limit(max_unhealthy, 100)  # validates
    max_unhealthy_gpus = _get(safety, "spec.safety", "maxUnhealthyGPUs", None)
    if max_unhealthy_gpus is not None:
        breaker_limit(max_unhealthy_gpus, 100, "spec.safety.maxUnhealthyGPUs")  # validates
    expected = count.get("expected")
    hourly = cost.get("gpuHourly")
    policy = Policy(
        name=name,
        generation=int(meta.get("generation") or 0),
        selector=parse_selector(spec.get("nodeSelector")),
        mode=mode,
        priority=_int(_get(spec, "spec", "priority", 0), "spec.priority", -1000, 1000),
        xid_overrides=overrides,
        app_repeat_count=_int(_get(repeat, "", "count", 3), "spec.rules.xid.applicationRepeat.count", 2, 1000),
        app_repeat_window_s=_dur(_get(repeat, "", "window", "10m"), "spec.rules.xid.applicationRepeat.window"),
        app_repeat_action=_action(
            _get(repeat, "", "action", "drain"),
            "spec.rules.xid.applicationRepeat.action",
            frozenset({Action.OBSERVE, Action.CORDON, Action.DRAIN, Action.REPAIR}),
        ),
        ecc_threshold=_int(_get(ecc, "", "uncorrectedThreshold", 1), "spec.rules.ecc.uncorrectedThreshold", 1, 10**6),
        ecc_action=_action(_get(ecc, "", "action", "drain"), "spec.rules.ecc.action"),
        row_remap_failure_action=_action(
            _get(_section(rules, "rowRemapFailure", "spec.rules"), "", "action", "repair"),
            "spec.rules.rowRemapFailure.action",
        ),
        pending_remap_action=_action(
            _get(_section(rules, "pendingRemap", "spec.rules"), "", "action", "drain"),
            "spec.rules.pendingRemap.action",
        ),
        thermal_threshold_c=_int(
            _get(thermal, "", "temperatureThresholdC", 90),
            "spec.rules.thermal.temperatureThresholdC",
            30,
            150,
        ),
        thermal_slowdown=bool(_get(thermal, "", "slowdown", True)),
        thermal_sustained_s=_dur(_get(thermal, "", "sustainedFor", "5m"), "spec.rules.thermal.sustainedFor"),
        thermal_action=_action(_get(thermal, "", "action", "cordon"), "spec.rules.thermal.action"),
        gpu_lost_action=_action(
            _get(_section(rules, "gpuLost", "spec.rules"), "", "action", "drain"), "spec.rules.gpuLost.action"
        ),
        gpu_count_expected=None if expected is None else _int(expected, "spec.rules.gpuCount.expected", 1, 64),
        gpu_count_action=_action(_get(count, "", "action", "cordon"), "spec.rules.gpuCount.action"),
        silence_after_s=_dur(_get(silence, "", "after", "2m"), "spec.rules.agentSilence.after"),
        silence_action=_action(
            _get(silence, "", "action", "observe"),
            "spec.rules.agentSilence.action",
            frozenset({Action.OBSERVE, Action.CORDON}),
        ),
        taint_effect=effect,
        cordon=bool(_get(actions, "", "cordon", True)),
        drain=DrainSettings(
            checkpoint_mode=str(_get(drain, "", "checkpointMode", "FromPod")),
            checkpoint_timeout_s=_dur(
                _get(drain, "", "checkpointTimeout", "10m"), "spec.actions.drain.checkpointTimeout"
            ),
            on_checkpoint_timeout=str(_get(drain, "", "onCheckpointTimeout", "Evict")),
            max_wait_s=_dur(_get(drain, "", "maxWait", "1h"), "spec.actions.drain.maxWait"),
            allow_force_delete=bool(_get(drain, "", "allowForceDelete", False)),
            force_delete_after_s=_dur(_get(drain, "", "forceDeleteAfter", "2h"), "spec.actions.drain.forceDeleteAfter"),
            gang_survives_rank_loss=bool(_get(drain, "", "gangSurvivesRankLoss", False)),
            system_namespaces=tuple(_get(drain, "", "systemNamespaces", ["kube-system", "gpuhealth-system"])),
        ),
        max_unhealthy=max_unhealthy,
        max_concurrent_drains=_int(
            _get(safety, "", "maxConcurrentDrains", 1), "spec.safety.maxConcurrentDrains", 1, 1000
        ),
        probation_s=_dur(_get(safety, "", "probation", "10m"), "spec.safety.probation"),
        flapping_max=_int(_get(flapping, "", "maxQuarantines", 3), "spec.safety.flapping.maxQuarantines", 1, 100),
        flapping_window_s=_dur(_get(flapping, "", "window", "24h"), "spec.safety.flapping.window"),
        restart_loop_enabled=bool(_get(loop, "", "enabled", True)),
        restart_loop_window_s=_dur(_get(loop, "", "window", "15m"), "spec.restartLoop.window"),
        restart_loop_min_workloads=_int(_get(loop, "", "minWorkloads", 2), "spec.restartLoop.minWorkloads", 2, 100),
        restart_loop_min_restarts=_int(_get(loop, "", "minRestarts", 3), "spec.restartLoop.minRestarts", 1, 1000),
        restart_loop_action=_action(
            _get(loop, "", "action", "cordon"),
            "spec.restartLoop.action",
            frozenset({Action.OBSERVE, Action.CORDON, Action.DRAIN}),
        ),
        gpu_hourly_cost=None if hourly is None else float(hourly),
        currency=str(_get(cost, "", "currency", "USD")),
        devices=parse_devices(spec, xid_scopes),
        max_unhealthy_gpus=max_unhealthy_gpus,
        remediation=_remediation(spec),
    )
    if policy.flapping_window_s <= policy.probation_s:
        raise PolicyError("spec.safety.flapping.window: must be longer than spec.safety.probation")
    return policy


def _remediation(spec: Mapping[str, Any]) -> RemediationSettings:
    try:
        return parse_remediation(spec)
    except RemediationError as e:
        raise PolicyError(str(e)) from None


def select_policy(policies: list[Policy], labels: Mapping[str, str]) -> tuple[Policy | None, list[Policy]]:
    """The governing policy for a node and the other matching ones it overrides.

    Deterministic: highest priority first, then the lexically smallest name.
    """
    matching = sorted((p for p in policies if p.selector.matches(labels)), key=lambda p: (-p.priority, p.name))
    if not matching:
        return None, []
    return matching[0], matching[1:]
