"""The chaos suite with short counts, on real control planes (the full one is `make chaos`).

Each test runs one scenario of hack/chaos/scenarios/ (about 1/5 of `make chaos`'s counts) and
every invariant of hack/chaos/invariants.py after it. Violations that reproduce an already
reported product bug are split off: the scenario's test still fails on anything else, and a
strict xfail test per bug turns red the moment the bug is fixed (then drop its mark).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit.cluster import LocalCluster
from hack.chaos.scenarios import KNOWN_VIOLATIONS, TIMING_DEPENDENT, run_scenario, start_cluster

SEED = 4242
_results: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="module")
def chaos_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chaos")


@pytest.fixture(scope="module")
def main_cluster(chaos_workdir: Path) -> Iterator[LocalCluster]:
    cluster = start_cluster(chaos_workdir / "main-cluster")
    try:
        yield cluster
    finally:
        cluster.stop()


def run(name: str, cluster: LocalCluster, workdir: Path) -> dict[str, Any]:
    if name not in _results:
        _results[name] = run_scenario(name, cluster, workdir, quick=True, seed=SEED + len(_results))
        (workdir / f"{name}.json").write_text(json.dumps(_results[name], indent=2))  # for a failure's post-mortem
    return _results[name]


def throttled(workdir: Path) -> dict[str, Any]:
    """The throttling scenario on its own throttled control plane, stopped right after (2 cores)."""
    if "throttling" not in _results:
        cluster = start_cluster(workdir / "throttled-cluster", throttled=True)
        try:
            run("throttling", cluster, workdir)
        finally:
            cluster.stop()
    return _results["throttling"]


def assert_clean(result: dict[str, Any], min_cycles: int) -> None:
    assert not result["violations"], "invariant violations:\n" + "\n".join(result["violations"])
    assert result["cycles"] >= min_cycles, result["notes"]


def _known_for(result: dict[str, Any], bug: str, scenario: str) -> list[str]:
    """The violations that reproduce one known bug."""
    pats = next(patterns for patterns, desc in KNOWN_VIOLATIONS[scenario] if desc == bug)
    return [v for v in result.get("known_violations", []) if any(p in v for p in pats)]


# The throttled control plane first, so it is gone before the main one starts (2 cores).
def test_throttled_storm_completes_without_busy_loop(chaos_workdir: Path) -> None:
    r = throttled(chaos_workdir)
    assert_clean(r, 1)
    assert r["stats"]["requests_per_node"] < 50


def test_operator_sigkilled_at_random_instants(main_cluster: LocalCluster, chaos_workdir: Path) -> None:
    r = run("operator_kills", main_cluster, chaos_workdir)
    assert_clean(r, 1)
    assert r["stats"]["operator_kills"] >= 1
    assert r["stats"]["pods_evicted"] >= 1, "the order invariant had no eviction to judge"


def test_conflicting_writers_lose_nothing(main_cluster: LocalCluster, chaos_workdir: Path) -> None:
    r = run("conflicting_writers", main_cluster, chaos_workdir)
    assert_clean(r, 2)
    assert r["stats"]["foreign_writes"] > 0


def test_dead_agent_unknown_and_never_back_on_stale_data(main_cluster: LocalCluster, chaos_workdir: Path) -> None:
    assert_clean(run("agent_death", main_cluster, chaos_workdir), 1)


def test_bad_input_refused_or_handled(main_cluster: LocalCluster, chaos_workdir: Path) -> None:
    r = run("bad_input", main_cluster, chaos_workdir)
    assert_clean(r, 1)
    assert r["stats"]["refused"] >= 50


def test_peering_no_standby_acts_and_handover(main_cluster: LocalCluster, chaos_workdir: Path) -> None:
    r = run("peering", main_cluster, chaos_workdir)
    assert_clean(r, 1)
    assert sum(1 for n in r["stats"]["writes_while_both_ran"].values() if n) <= 1, "only one replica may write"


def test_fault_storm_breaker_opens_and_closes(main_cluster: LocalCluster, chaos_workdir: Path) -> None:
    assert_clean(run("fault_storm", main_cluster, chaos_workdir), 1)


def test_device_drain_sigkilled_one_rule_per_bad_gpu(main_cluster: LocalCluster, chaos_workdir: Path) -> None:
    r = run("device_kills", main_cluster, chaos_workdir)
    assert_clean(r, 2)
    assert r["stats"]["targeted_kills"] >= 2, r["stats"]["kills_by_moment"]
    assert r["stats"]["pods_evicted"] >= 2 and r["stats"]["checkpoints_requested"] >= 2
    assert r["stats"]["foreign_rule_writes"] > 0


def test_partitioned_gpu_held_out_whole_across_sigkills(main_cluster: LocalCluster, chaos_workdir: Path) -> None:
    r = run("partition_kills", main_cluster, chaos_workdir)
    assert_clean(r, 2)
    assert r["stats"]["targeted_kills"] >= 3, r["stats"]["kills_by_moment"]
    assert r["stats"]["pods_evicted"] >= 2 and r["stats"]["checkpoints_requested"] >= 2
    assert r["stats"]["devices_held_out_at_end"] >= 2


# The decisions above one GPU's quarantine (hack/chaos/decisions.py), each SIGKILLed at its own moments
# and with one kube-apiserver crash: about 40-60 s each on 2 shared cores.
def test_nvlink_domain_never_half_out_across_kills(main_cluster: LocalCluster, chaos_workdir: Path) -> None:
    r = run("domain_kills", main_cluster, chaos_workdir)
    assert_clean(r, 1)
    assert r["stats"]["targeted_kills"] >= 1, r["stats"]["kills_by_moment"]


def test_rack_node_never_held_alone_while_the_rack_brakes(main_cluster: LocalCluster, chaos_workdir: Path) -> None:
    r = run("rack_kills", main_cluster, chaos_workdir)
    assert_clean(r, 1)
    assert r["stats"]["targeted_kills"] >= 1, r["stats"]["kills_by_moment"]
    assert r["stats"]["samples_in_an_episode"] >= 10


def test_node_validation_one_job_never_returned_unvalidated(main_cluster: LocalCluster, chaos_workdir: Path) -> None:
    r = run("validation_kills", main_cluster, chaos_workdir)
    assert_clean(r, 1)
    assert r["stats"]["targeted_kills"] >= 2, r["stats"]["kills_by_moment"]
    assert r["stats"]["validation_job_creates"]["jobs"] >= 2


def test_burn_in_one_job_per_node_within_the_batch(main_cluster: LocalCluster, chaos_workdir: Path) -> None:
    r = run("burnin_kills", main_cluster, chaos_workdir)
    assert_clean(r, 1)
    assert r["stats"]["targeted_kills"] >= 1, r["stats"]["kills_by_moment"]
    assert r["stats"]["validation_job_creates"]["jobs"] >= 3


def test_an_approved_step_runs_exactly_once(main_cluster: LocalCluster, chaos_workdir: Path) -> None:
    r = run("approval_kills", main_cluster, chaos_workdir)
    assert_clean(r, 1)
    assert r["stats"]["targeted_kills"] >= 2, r["stats"]["kills_by_moment"]
    assert r["stats"]["approvals_given"] >= 4 and r["stats"]["step_job_creates"]["created"] >= 4


# Last on the main control plane: it SIGKILLs kube-apiserver and etcd.
def test_apiserver_and_etcd_crashes_mid_drain(main_cluster: LocalCluster, chaos_workdir: Path) -> None:
    r = run("control_plane_crashes", main_cluster, chaos_workdir)
    assert_clean(r, 2)
    assert r["faults"]["process"] >= 2
    assert max(r["stats"]["operator_recovery_s"]) <= 30


# One test per known, already reported product bug (KNOWN_VIOLATIONS): strict xfail where the bug
# reproduces every time, so it turns red once the bug is fixed and the mark must go; not strict where it
# needs a fault to land in a narrow window (TIMING_DEPENDENT).
KNOWN = [
    pytest.param(
        scenario,
        bug,
        marks=pytest.mark.xfail(strict=bug not in TIMING_DEPENDENT, reason=bug),
        id=f"{scenario}-{i}",
    )
    for scenario, bugs in KNOWN_VIOLATIONS.items()
    for i, (_, bug) in enumerate(bugs)
]

if KNOWN:

    @pytest.mark.parametrize(("scenario", "bug"), KNOWN)
    def test_known_bug_still_reproduces(
        scenario: str, bug: str, main_cluster: LocalCluster, chaos_workdir: Path
    ) -> None:
        r = throttled(chaos_workdir) if scenario == "throttling" else run(scenario, main_cluster, chaos_workdir)
        assert not _known_for(r, bug, scenario)
