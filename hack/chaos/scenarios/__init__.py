"""Chaos scenarios: plain functions of a context (context.py), run against a real local control plane.

One module per scenario; registry.py names them all, lists the known product bugs and runs one
scenario with every invariant after it (``run_scenario``). hack/chaos/run.py (``make chaos``) and
tests/integration/test_chaos_short.py both go through it, with full or quick counts.

Each scenario gets its own nodes (label ``chaos-group=<group>``), its own policy and its own operator
process(es), so several scenarios can share one control plane one after another. The operator runs
under its own token (user ``gpuhealth-chaos-operator``, ``-b`` for a second replica) and the API
server audits its requests, so hack/chaos/invariants.py can count what it really did.
"""

from hack.chaos.scenarios.cluster import start_cluster
from hack.chaos.scenarios.context import Ctx
from hack.chaos.scenarios.registry import (
    BY_NAME,
    KNOWN_VIOLATIONS,
    SCENARIOS,
    TIMING_DEPENDENT,
    Scenario,
    run_scenario,
    split_known,
)

__all__ = [
    "BY_NAME",
    "KNOWN_VIOLATIONS",
    "SCENARIOS",
    "TIMING_DEPENDENT",
    "Ctx",
    "Scenario",
    "run_scenario",
    "split_known",
    "start_cluster",
]
