"""The domain storm's pure parts (hack/bench/domain.py, hack/bench/domain_report.py): the fleet in whole
domains, the clique fault the simulated agent publishes is the one the operator's own correlation reads
as the domain's (and the healed sample is none), the taint span, the phase's arguments, and how its
targets are judged, summarised and filed."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from kubernetes import client

from gpuhealth.agent.report import AgentInfo, ReportBuilder, now_utc
from gpuhealth.evaluation import domains
from hack.bench import docs
from hack.bench.cli import parse_args, parse_phases
from hack.bench.domain import (
    SICK_GPU,
    batches,
    clique,
    domains_of,
    fabric_snapshot,
    quiet_summary,
    remove_pods,
    taint_span,
)
from hack.bench.domain_report import DOMAIN_BEGIN, DOMAIN_END, domain_line, domain_targets_for, render_domain
from hack.bench.mig import mig_layout
from hack.bench.report import evaluate, summary_md, tally
from hack.bench.support import TAINT, cpu_quiet

NODE = "gpu-node-0042"


def test_the_fleet_is_cut_into_whole_domains_in_order() -> None:
    nodes = [f"n{i}" for i in range(40)]
    got = domains_of(nodes, 18)
    assert [len(d) for d in got] == [18, 18] and got[0][0] == "n0" and got[1][-1] == "n35"
    assert domains_of(nodes[:17], 18) == []
    assert clique(3).endswith(".3") and clique(3).split(".")[0] == clique(4).split(".")[0]  # one NVLink cluster


def _spec(sick: int | None) -> dict[str, Any]:
    builder = ReportBuilder(NODE, AgentInfo(version="0", sources=("simulated",), boot_time=now_utc()))
    return {"spec": builder.render(fabric_snapshot(42, 7, sick), now_utc())}


def test_the_published_clique_fault_is_the_domains_fault_to_the_operator_and_the_healed_sample_none() -> None:
    sick = _spec(SICK_GPU)
    faults = domains.imex_faults(NODE, sick)
    assert [(f.node, f.gpu, f.cause) for f in faults] == [(NODE, SICK_GPU, domains.ROUTE_UNHEALTHY)]
    fabric = sick["spec"]["devices"][SICK_GPU]["fabric"]
    assert fabric["routeUnhealthy"] is True and fabric["cliqueId"] == 7 and fabric["state"] == "Completed"
    # The other GPUs: a non-zero mask of "false" sub-fields, which is no fault.
    other = sick["spec"]["devices"][0]["fabric"]
    assert other["healthMask"] != 0 and other["routeUnhealthy"] is False
    assert domains.imex_faults(NODE, _spec(None)) == ()
    assert domains.correlation_facts(sick) == (True, False)


def test_a_mig_nodes_clique_fault_keeps_its_mig_devices_in_the_report() -> None:
    builder = ReportBuilder(NODE, AgentInfo(version="0", sources=("simulated",), boot_time=now_utc()))
    spec = builder.render(fabric_snapshot(42, 7, SICK_GPU, mig_layout(42)), now_utc())
    gpu = spec["devices"][SICK_GPU]
    assert gpu["migMode"] == "Enabled" and len(gpu["migDevices"]) == 7 and gpu["fabric"]["routeUnhealthy"] is True
    assert domains.imex_faults(NODE, {"spec": spec})[0].gpu == SICK_GPU


def test_the_span_is_first_and_last_member_taint_and_none_while_one_is_missing() -> None:
    members = ["a", "b", "c"]
    seen = {("a", TAINT): 10.0, ("b", TAINT): 10.4, ("c", TAINT): 10.2, ("c", "other"): 9.0}
    assert taint_span(seen, members) == (10.0, 10.4)
    del seen[("b", TAINT)]
    assert taint_span(seen, members) is None
    assert taint_span(seen, []) is None


def test_domain_is_a_phase_of_its_own_sized_by_its_domains() -> None:
    assert parse_phases("domain") == ["domain"]
    assert parse_phases("drain,domain,core") == ["core", "domain", "drain"]
    assert "domain" not in parse_phases("all")
    quick = parse_args(["--quick", "--phases", "domain"])
    assert (quick.nodes, quick.domain_faults, quick.domain_size) == (100, 4, 18)
    full = parse_args(["--phases", "domain"])
    assert (full.nodes, full.domain_faults) == (1000, 20)
    with pytest.raises(SystemExit):
        parse_args(["--nodes", "100", "--pods", "100", "--phases", "domain", "--domain-faults", "6"])  # 108 > 100
    with pytest.raises(SystemExit):
        parse_args(["--phases", "domain", "--domain-faults", "0"])


def _domain_run(p99: float = 600.0, whole: int = 20, outside: int = 0, timeouts: int = 0) -> dict[str, Any]:
    res: dict[str, Any] = {
        "nodes": 1000,
        "quick": False,
        "machine": "2 cores",
        "config": {"phases": ["domain"]},
        "phases": [["domain storm", 60.0, 1.2]],
        "domain_storm": {
            "shape": {"nodes": 990, "domains": 55, "domain_size": 18, "faulted": 20},
            "fault_to_last_taint_ms": {
                "p50": 300.0,
                "p90": p99,
                "p99": p99,
                "max": p99,
                "samples": 20,
                "timeouts": timeouts,
                "first_taint_p50": 120.0,
                "spread_p50": 180.0,
            },
            "domains_whole": whole,
            "tainted_outside": outside,
            "tainted_outside_examples": [],
            "label_failures": 0,
            "pods_removed": True,
            "recovery_s": 12.5,
        },
    }
    res["targets"] = evaluate(res)
    return res


def test_the_domain_targets_are_judged_and_a_miss_stays_a_miss() -> None:
    res = _domain_run()
    assert tally(res["targets"], 1000, domain_targets_for) == (2, 2, 0)
    assert res["targets"]["domain_whole"]["value"] == "20/20, 0"
    assert not _domain_run(p99=1200.0)["targets"]["domain_p99"]["pass"]
    assert not _domain_run(timeouts=1)["targets"]["domain_p99"]["pass"]
    assert not _domain_run(whole=19)["targets"]["domain_whole"]["pass"]
    assert not _domain_run(outside=3)["targets"]["domain_whole"]["pass"]
    filed = sorted(Path(docs.RESULTS).glob("bench-1000-*.json"))[0]
    old = json.loads(filed.read_text(encoding="utf-8"))
    assert tally(evaluate(old), old["nodes"], domain_targets_for) == (0, 0, 2)  # filed before: not measured


def test_a_domain_only_run_has_a_summary_of_its_own() -> None:
    md = summary_md(_domain_run())
    assert "phases domain" in md and "## Domain storm (`--phases domain`)" in md and "never blind" not in md
    assert (
        "| Clique fault to the last member's taint of its NVLink domain, p99 | 600.0 ms "
        "| - | no floor measured | unmeasured | <= 1000 ms | pass |" in md
    )
    assert "990 nodes labelled into 55 NVLink domains of 18" in md and "after 12.5 s" in md


def test_a_filed_domain_run_feeds_only_the_domain_block(tmp_path: Path) -> None:
    run = _domain_run(p99=1500.0)
    run.update({"date": "2026-12-31T00:00Z", "commit": "abcdef0", "load": "1.0-2.0"})
    path = tmp_path / "bench-1000-2026-12-31-abcdef0.json"
    path.write_text(json.dumps(run), encoding="utf-8")
    assert not docs.core_run(run)
    block = docs.blocks(tmp_path)[docs.DOCS[1]][-2]  # before the one-commit block
    assert block == render_domain((str(path), run))
    assert block.startswith(DOMAIN_BEGIN) and block.endswith(DOMAIN_END) and "**1 of 2 targets met**" in block
    assert "| 1,500.0 ms | - | no floor measured | unmeasured | <= 1000 ms | **missed** |" in block
    quiet = copy.deepcopy(run)
    del quiet["domain_storm"]
    path.write_text(json.dumps(quiet), encoding="utf-8")
    assert (
        "No run of the domain storm is filed yet." in docs.blocks(tmp_path)[docs.DOCS[1]][-2]
    )  # before the one-commit block


def test_the_domain_block_holds_the_newest_run_of_each_fleet_size(tmp_path: Path) -> None:
    small, large, older = _domain_run(), _domain_run(p99=1500.0), _domain_run(p99=900.0)
    large["nodes"], older["nodes"] = 10000, 10000
    for run, name in (
        (older, "bench-10000-2026-12-30-0000000"),
        (small, "bench-1000-2026-12-31-abcdef0"),
        (large, "bench-10000-2026-12-31-abcdef0"),
    ):
        run.update({"date": name[-18:-8], "commit": name[-7:], "load": "1.0-2.0"})
        (tmp_path / f"{name}-domain.json").write_text(json.dumps(run), encoding="utf-8")
    block = docs.blocks(tmp_path)[docs.DOCS[1]][-2]  # before the one-commit block
    assert block.count("Latest filed run of the domain storm") == 2
    assert block.index(": 1,000 nodes;") < block.index(": 10,000 nodes;")
    assert "| 1,500.0 ms |" in block and "| 900.0 ms |" not in block  # the newest 10,000-node run only


def test_the_faults_wait_for_an_operator_quiet_after_the_labels_and_the_line_says_how_long() -> None:
    # (time, CPU seconds) every 0.5 s: a core and a half busy for 10 s, then 5% of one.
    busy = [(t * 0.5, t * 0.5 * 1.5) for t in range(21)]
    idle = [(10 + t * 0.5, 15 + t * 0.5 * 0.05) for t in range(1, 21)]
    samples = busy + idle
    assert not cpu_quiet(samples, 10.0, 5.0, 0.2)
    assert cpu_quiet(samples, 20.0, 5.0, 0.2)
    assert not cpu_quiet(samples[:1], 0.5, 5.0, 0.2)  # too few samples to say: not quiet
    run = _domain_run()
    assert "The faults began" not in domain_line(run)  # filed before the wait
    run["domain_storm"]["operator_quiet_after_labels_s"] = 42.5
    assert "The faults began once the operator was quiet after the labels (42.5 s after them)." in domain_line(run)
    run["domain_storm"]["operator_quiet_after_labels_s"] = None
    assert "(it never was within 600 s)" in domain_line(run)
    assert "Each later fault" not in domain_line(run)  # a run from before the faults waited between them
    run["domain_storm"]["operator_quiet_between_faults_s"] = quiet_summary([5.5, 6.0, None, 5.0])
    assert "Each later fault waited for the operator to be quiet again after the domain before it " in domain_line(run)
    assert "(p50 5.5 s, max 6.0 s, 1 never quiet within 600 s)." in domain_line(run)
    assert "pods were not all gone" not in domain_line(run)
    run["domain_storm"]["pods_removed"] = False
    assert "The faulted domains' pods were not all gone when the faults began" in domain_line(run)


def test_the_faulted_domains_pods_are_deleted_at_once_in_batches() -> None:
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    class Api:
        def __getattr__(self, name: str) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                calls.append((name, args, kwargs))
                return SimpleNamespace(items=[])

            return call

    nodes = [f"gpu-node-{i:04d}" for i in range(120)]
    assert remove_pods(cast(client.CoreV1Api, Api()), cast(client.AppsV1Api, Api()), nodes)
    deletes = [c for c in calls if c[0] == "delete_collection_namespaced_pod"]
    assert len(deletes) == 3 and all(c[2]["grace_period_seconds"] == 0 for c in deletes)
    assert deletes[0][2]["label_selector"].startswith("app in (train-gpu-node-0000,")
    assert sum(c[0] == "delete_namespaced_replica_set" for c in calls) == 120
    assert batches(["a", "b", "c"], 2) == [["a", "b"], ["c"]]
