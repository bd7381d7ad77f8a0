"""The fleet probe's harness (``hack/fleetprobe``): one small probe in a process of its own, checked for
structure and sanity (not timing: the full probe runs on request, docs/bench.md), the extrapolation and
the docs block, which must say what the newest filed result says."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from hack import fleetprobe
from hack.fleetprobe import fleet
from hack.fleetprobe.drive import KINDS

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def small() -> dict[str, Any]:
    # 400 nodes: the policy's breaker (maxUnhealthy 10%: 40 nodes) has room for the load phase's 20 faults
    # and the storm's 4, so each is a taint (at 200 the breaker held the storm's: a label, no taint).
    return fleetprobe.probe_alone(400, load_s=1.0, per_event=100)


def test_a_small_probe_measures_a_settled_fleet_through_the_operators_intake(small: dict[str, Any]) -> None:
    assert small["nodes"] == 400 and small["pods"] == 400 * fleet.PODS_PER_NODE
    mem = small["memory"]
    assert 1_000 < mem["bytes_per_node"] < 200_000 and 100 < mem["bytes_per_pod"] < 20_000
    # Settled: every node passed once, and a healthy fleet the operator has evaluated needs no write.
    assert small["settle"]["passes"] >= 400 and small["settle"]["writes"] == 0, small["settle"]["written"]
    assert small["settle"]["full_collection_ms"] > 0
    assert set(small["per_event"]) == set(KINDS)
    for kind, v in small["per_event"].items():
        assert v["events"] == 100 and v["intake_us"] > 0, kind
    # A Lease renewal of a Healthy node costs no pass; an agent's new facts always do.
    assert small["per_event"]["lease_renewal"]["passes_per_event"] == 0
    assert small["per_event"]["report_change"]["passes_per_event"] >= 1
    # Every fault of the load phase and of the storm ends in its Node's taint on the in-memory port.
    for phase in ("load", "storm"):
        got = small[phase]
        assert got["faults"] >= 1 and got["tainted"] == got["faults"], phase
        assert 0 < got["detection_ms"]["p50"] <= got["detection_ms"]["p99"], phase
        assert got["writes"]["patch_node"] >= got["faults"], phase
    assert small["load"]["events"] > 0 and small["load"]["core_share"] > 0
    # Each fault of the load phase is passed at least once, and the passes are counted.
    assert small["load"]["passes"] >= small["load"]["faults"]


def test_extrapolation_and_verdicts_follow_the_results(small: dict[str, Any]) -> None:
    bigger = {**small, "nodes": 800, "pods": 6400}
    x = fleetprobe.extrapolate([small, bigger])
    assert x["nodes"] == 100_000 and x["pods"] == 800_000
    assert x["bytes_per_node"] == pytest.approx(small["memory"]["bytes_per_node"], rel=0.01)
    assert set(x["core_share_by_kind"]) == set(KINDS)
    assert math.isclose(x["core_share"], sum(x["core_share_by_kind"].values()), abs_tol=0.01)
    data = {"results": [small, bigger], "extrapolated": x}
    assert [t["met"] for t in fleetprobe.verdicts(data)] == [
        x["held_gb"] <= 2.0,
        x["pod_core_share"] <= 0.5,
        small["load"]["detection_ms"]["p99"] <= 100.0,
    ]


def test_render_states_the_result_between_the_markers(small: dict[str, Any], tmp_path: Path) -> None:
    data: dict[str, Any] = {
        "commit": "abc1234",
        "date": "2026-12-03T00:00:00Z",
        "machine": {"python": "3.11.7", "nproc": 2, "load_average": [7.5, 8.0, 6.0]},
        "results": [small, {**small, "nodes": 800, "pods": 6400}],
    }
    data["extrapolated"] = fleetprobe.extrapolate(data["results"])
    data["targets"] = fleetprobe.verdicts(data)
    block = fleetprobe.render(data, "results/bench/fleetprobe-x.json")
    assert block.startswith(fleetprobe.BEGIN) and block.endswith(fleetprobe.END)
    assert "`abc1234`" in block and "load average 7.50, 8.00, 6.00" in block
    assert "| 400 | 3,200 |" in block and "| lease renewal |" in block and "load: node passes" in block
    assert all(f"| {what} |" in block for what, _ in fleetprobe.limits(data))
    doc = tmp_path / "scaling.md"
    doc.write_text(f"before\n{fleetprobe.BEGIN}\nold\n{fleetprobe.END}\nafter\n")
    fleetprobe.write_doc(block, doc)
    assert doc.read_text() == f"before\n{block}\nafter\n"


def test_docs_block_is_rendered_from_the_newest_filed_result() -> None:
    filed = sorted((REPO / "results" / "bench").glob("fleetprobe-*.json"))
    assert filed, "no filed fleet probe result under results/bench/"

    newest = max(filed, key=lambda f: json.loads(f.read_text())["date"])  # by when it ran: names sort by commit
    block = fleetprobe.render(json.loads(newest.read_text()), str(newest.relative_to(REPO)))
    assert block in (REPO / "docs" / "scaling.md").read_text(), (
        f"docs/scaling.md's fleet probe block drifted from {newest.name}: "
        f"python -m hack.fleetprobe --render {newest.relative_to(REPO)}"
    )
