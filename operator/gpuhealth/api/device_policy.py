"""A policy's per-device quarantine settings: ``spec.devices`` and the ``scope`` of each rule whose
findings can be confined to one GPU (``spec.rules.<rule>.scope``, an XID override's ``scope``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuhealth.api.names import DEFAULT_DRA_DRIVER, Scope
from gpuhealth.api.policy_fields import PolicyError, get, integer, scope, section

# Rules whose findings can be confined to one GPU, by their name under spec.rules (the scope
# override is spec.rules.<name>.scope). Restart loops, GPU count and agent silence are node facts.
DEVICE_RULES = (
    "applicationRepeat",
    "ecc",
    "rowRemapFailure",
    "pendingRemap",
    "thermal",
    "gpuLost",
    "powerBrake",
    "hwSlowdown",
    "nvlink",
    "pcie",
    "fabric",
)
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


_DRIVER = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def parse_devices(spec: Mapping[str, Any], xid_scopes: Mapping[int, Scope] | None = None) -> DeviceSettings:
    """spec.devices plus the ``scope`` of each rule that can be confined to one GPU."""
    devices = section(spec, "devices", "spec")
    rules = section(spec, "rules", "spec")
    rule_scopes: dict[str, Scope] = {}
    for rule in DEVICE_RULES:
        rule_section = (
            section(section(rules, "xid", "spec.rules"), rule, "spec.rules.xid")
            if rule == "applicationRepeat"
            else section(rules, rule, "spec.rules")
        )
        if rule_section.get("scope") is not None:
            where = "spec.rules.xid.applicationRepeat" if rule == "applicationRepeat" else f"spec.rules.{rule}"
            rule_scopes[rule] = scope(rule_section.get("scope"), f"{where}.scope")
    on_flapping = str(get(devices, "", "onFlapping", "AwaitingRepair"))
    if on_flapping not in FLAPPING_CHOICES:
        raise PolicyError(f"spec.devices.onFlapping: invalid {on_flapping!r} (AwaitingRepair or Node)")
    drivers = get(devices, "", "drivers", [DEFAULT_DRA_DRIVER])
    if not isinstance(drivers, list) or not drivers:
        raise PolicyError("spec.devices.drivers: must be a non-empty list of DRA driver names")
    for i, d in enumerate(drivers):
        if not isinstance(d, str) or len(d) > 63 or not _DRIVER.fullmatch(d):
            raise PolicyError(f"spec.devices.drivers[{i}]: invalid DRA driver name {d!r}")
    return DeviceSettings(
        scope=scope(get(devices, "", "scope", "Device"), "spec.devices.scope"),
        rule_scopes=rule_scopes,
        xid_scopes=dict(xid_scopes or {}),
        max_bad_gpus_per_node=integer(
            get(devices, "", "maxBadGPUsPerNode", 1), "spec.devices.maxBadGPUsPerNode", 1, 64
        ),
        on_flapping=on_flapping,
        drivers=tuple(drivers),
    )
