"""Every scenario by name, the known product bugs, and run_scenario (scenario + invariants + cleanup)."""

from __future__ import annotations

import time
import traceback
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devkit.cluster import LocalCluster
from hack.chaos import invariants as inv
from hack.chaos.scenarios.agent_death import agent_death
from hack.chaos.scenarios.approval_kills import approval_kills
from hack.chaos.scenarios.bad_input import bad_input
from hack.chaos.scenarios.burnin_kills import burnin_kills
from hack.chaos.scenarios.conflicting_writers import conflicting_writers
from hack.chaos.scenarios.context import FAULT_CLASSES, Ctx
from hack.chaos.scenarios.control_plane_crashes import control_plane_crashes
from hack.chaos.scenarios.device_kills import device_kills
from hack.chaos.scenarios.domain_kills import domain_kills
from hack.chaos.scenarios.fault_storm import fault_storm
from hack.chaos.scenarios.ladder_kills import ladder_kills
from hack.chaos.scenarios.operator_kills import operator_kills
from hack.chaos.scenarios.partition_kills import partition_kills
from hack.chaos.scenarios.peering import peering
from hack.chaos.scenarios.rack_kills import rack_kills
from hack.chaos.scenarios.throttling import throttling
from hack.chaos.scenarios.validation_kills import validation_kills

# -----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    fn: Callable[[Ctx], None]
    cluster: str  # "main" or "throttled"
    allow_lifts: bool = False


SCENARIOS = [
    Scenario("operator_kills", operator_kills, "main"),
    Scenario("conflicting_writers", conflicting_writers, "main"),
    Scenario("agent_death", agent_death, "main"),
    Scenario("bad_input", bad_input, "main"),
    Scenario("peering", peering, "main"),
    Scenario("fault_storm", fault_storm, "main"),
    Scenario("device_kills", device_kills, "main"),
    Scenario("partition_kills", partition_kills, "main"),
    Scenario("ladder_kills", ladder_kills, "main"),
    Scenario("domain_kills", domain_kills, "main"),
    Scenario("rack_kills", rack_kills, "main"),
    Scenario("validation_kills", validation_kills, "main"),
    Scenario("burnin_kills", burnin_kills, "main"),
    Scenario("approval_kills", approval_kills, "main"),
    Scenario("control_plane_crashes", control_plane_crashes, "main"),  # last on its cluster
    Scenario("throttling", throttling, "throttled"),
]
BY_NAME = {s.name: s for s in SCENARIOS}

# Violations that reproduce product bugs already reported, not yet fixed: scenario ->
# [((substrings of its violations), the bug)]. They are reported apart and do not fail a run; a known
# bug that no longer reproduces does (so its mark goes once it is fixed), unless it is listed in
# TIMING_DEPENDENT (it needs a fault to land in a narrow window). In make test each gets an xfail test.
# None open: the last one, an XID lost when the agent was killed between NVML's delivery and its
# report write, is fixed by the agent's local XID journal (operator/gpuhealth/agent/journal.py).
KNOWN_VIOLATIONS: dict[str, list[tuple[tuple[str, ...], str]]] = {}
# Bugs that reproduce only when a fault lands in a narrow window.
TIMING_DEPENDENT: set[str] = set()


def split_known(name: str, violations: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(unexpected, known, known bugs that did not reproduce) for one scenario's violations. A bug that
    reproduces only when a fault lands in a narrow window (TIMING_DEPENDENT) may legitimately not show."""
    bugs = KNOWN_VIOLATIONS.get(name, [])
    pats = [p for patterns, _ in bugs for p in patterns]
    unexpected = [v for v in violations if not any(p in v for p in pats)]
    known = [v for v in violations if any(p in v for p in pats)]
    gone = [
        bug
        for patterns, bug in bugs
        if bug not in TIMING_DEPENDENT and not any(p in v for p in patterns for v in violations)
    ]
    return unexpected, known, gone


def fault_classes(by_kind: dict[str, int]) -> dict[str, int]:
    """Injected faults grouped as the report shows them apart (context.FAULT_CLASSES)."""
    out = dict.fromkeys(sorted(set(FAULT_CLASSES.values())), 0)
    for kind, n in by_kind.items():
        out[FAULT_CLASSES[kind]] += n
    return out


def _get_policy(ctx: Ctx, name: str) -> dict[str, Any]:
    try:
        return ctx.kube.get_policy(name)
    except Exception:
        return {}


def run_scenario(name: str, cluster: LocalCluster, workdir: Path, quick: bool, seed: int) -> dict[str, Any]:
    """Run one scenario and every invariant after it; always cleans up what it created."""
    sc = BY_NAME[name]
    ctx = Ctx(name, cluster, workdir / name, quick=quick, seed=seed, allow_lifts=sc.allow_lifts)
    t0 = time.monotonic()
    sampler = inv.Sampler(ctx).start()
    try:
        try:
            sc.fn(ctx)
        except Exception as e:
            ctx.violate(f"scenario aborted: {e!r}")
            ctx.note(traceback.format_exc(limit=4)[-1500:])
        ctx.stop_background()
        ctx.violations += inv.check_all(ctx)
        ctx.stats["policy_finalizers"] = sorted(
            {f for p in ctx.policies for f in (_get_policy(ctx, p).get("metadata") or {}).get("finalizers") or []}
        )
        ctx.violations += sampler.stop()
        if sampler.max_out:
            ctx.stats["max_tainted_sampled"] = sampler.max_out
        ctx.stats["samples"] = sampler.samples
        for op in ctx.operators:
            if op.popen is not None and op.popen.poll() is None:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=5).close()
                except Exception as e:
                    ctx.violate(f"operator metrics endpoint down at the end: {e}")
    finally:
        sampler.stop()
        ctx.cleanup()
    unexpected, known, gone = split_known(name, ctx.violations)
    result: dict[str, Any] = {
        "runs": 1,  # one independent episode: fresh nodes, policy and operator
        "cycles": ctx.cycles,  # repetitions within it (rounds, storms, crashes), not independent runs
        "faults": fault_classes(ctx.faults),
        "faults_by_kind": dict(sorted(ctx.faults.items())),
        "violations": unexpected,
        "seconds": round(time.monotonic() - t0, 1),
        "notes": ctx.notes,
        "stats": ctx.stats,
        "seed": seed,
    }
    if name in KNOWN_VIOLATIONS:
        result["known_violations"] = known
        result["known_bugs"] = [bug for _, bug in KNOWN_VIOLATIONS[name]]
        result["known_bugs_not_reproduced"] = gone
    return result
