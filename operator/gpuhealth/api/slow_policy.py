"""A policy's "slow, not broken" rules and the topology labels its scopes above the node read.

``spec.rules.powerBrake`` (clock reason 0x80, HW power brake) and ``spec.rules.hwSlowdown`` (0x8 alone:
the hardware slowed down and NVML does not say why) find GPUs that still compute correctly, only
slower. Their default is ``cordon`` at their scope: new work is kept off (a NoSchedule taint and a
cordon for the node, a NoSchedule DeviceTaintRule for one GPU) and running work is untouched. A power
brake seen on ``rack.minNodes`` nodes of one rack is the facility's (the rack's power shelf), so it
becomes one rack finding with ``rack.action`` instead of a repair per node.

``spec.topology`` names the Node labels that group nodes: the NVLink (IMEX) domain, which GPU Feature
Discovery writes as ``nvidia.com/gpu.clique=<clusterUuid>.<cliqueId>``, and the rack.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuhealth.api.names import Action
from gpuhealth.api.policy_fields import PolicyError, action, duration, get, integer, section

DOMAIN_LABEL = "nvidia.com/gpu.clique"
RACK_LABEL = "topology.kubernetes.io/rack"
# Actions a slow signal may ask for: a repair (a reboot, a reset) does not lift a power brake.
SLOW_ACTIONS = frozenset({Action.IGNORE, Action.OBSERVE, Action.CORDON, Action.DRAIN})
RACK_ACTIONS = frozenset({Action.IGNORE, Action.OBSERVE, Action.CORDON})
# NVSentinel acts on a power brake after 3 consecutive polls; the agent samples every 10 s by
# default (agent/runner.py), and the report says since when the reasons hold: a minute is 6 polls.
POWER_BRAKE_SUSTAINED = "1m"
HW_SLOWDOWN_SUSTAINED = "5m"  # as long as thermal.sustainedFor: the cause may be heat
RACK_MIN_NODES = 3


@dataclass(frozen=True)
class RackSettings:
    min_nodes: int = RACK_MIN_NODES  # nodes of one rack under a power brake that make it the rack's
    action: Action = Action.OBSERVE  # what each of those nodes gets instead of its own finding


MOVE_CHOICES = ("Never", "AtNextCheckpoint")


@dataclass(frozen=True)
class SlowRule:
    enabled: bool = True
    sustained_s: float = 60.0
    action: Action = Action.CORDON
    rack: RackSettings = field(default_factory=RackSettings)  # read for powerBrake only
    # ``AtNextCheckpoint``: running work moves too, but only at its own next checkpoint: each pod is
    # asked, the drain waits for its acknowledgement as long as it takes and never evicts a pod that
    # has not acknowledged (nor one that cannot checkpoint): slow is not broken, so nothing is forced.
    at_next_checkpoint: bool = False

    @property
    def finding_action(self) -> Action:
        """The action of the rule's findings: a drain when running work moves at its next checkpoint."""
        return Action.DRAIN if self.at_next_checkpoint and self.action.quarantines else self.action


@dataclass(frozen=True)
class Topology:
    domain_label: str = DOMAIN_LABEL
    rack_label: str = RACK_LABEL


def parse_slow_rule(rules: Mapping[str, Any], name: str, sustained: str) -> SlowRule:
    where = f"spec.rules.{name}"
    rule = section(rules, name, "spec.rules")
    rack = section(rule, "rack", where)
    move = get(rule, "", "moveRunningWork", "Never")
    if move not in MOVE_CHOICES:
        raise PolicyError(f"{where}.moveRunningWork: invalid {move!r} (Never or AtNextCheckpoint)")
    return SlowRule(
        at_next_checkpoint=move == "AtNextCheckpoint",
        enabled=bool(get(rule, "", "enabled", True)),
        sustained_s=duration(get(rule, "", "sustainedFor", sustained), f"{where}.sustainedFor"),
        action=action(get(rule, "", "action", "cordon"), f"{where}.action", SLOW_ACTIONS),
        rack=RackSettings(
            min_nodes=integer(get(rack, "", "minNodes", RACK_MIN_NODES), f"{where}.rack.minNodes", 2, 1000),
            action=action(get(rack, "", "action", "observe"), f"{where}.rack.action", RACK_ACTIONS),
        ),
    )


# A qualified label key: an optional DNS-subdomain prefix and a name (Kubernetes' own rule).
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


def parse_topology(spec: Mapping[str, Any]) -> Topology:
    topo = section(spec, "topology", "spec")
    out = {}
    for key, default in (("domainLabel", DOMAIN_LABEL), ("rackLabel", RACK_LABEL)):
        v = get(topo, "", key, default)
        if not isinstance(v, str) or len(v) > 316 or not _LABEL_KEY.fullmatch(v):
            raise PolicyError(f"spec.topology.{key}: invalid label key {v!r}")
        out[key] = v
    return Topology(domain_label=out["domainLabel"], rack_label=out["rackLabel"])
