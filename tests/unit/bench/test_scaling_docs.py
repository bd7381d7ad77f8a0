"""docs/scaling.md's curve is the rendering of the filed bench runs, and its arithmetic is right."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hack.bench import docs, scaling_docs


def test_scaling_doc_matches_the_filed_results() -> None:
    assert scaling_docs.stale() == [], "run: python -m hack.bench.scaling_docs"


def test_a_figure_typed_by_hand_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = tmp_path / "scaling.md"
    doc.write_text(scaling_docs.DOC.read_text(encoding="utf-8").replace("| 1,000 |", "| 1,001 |", 1), encoding="utf-8")
    monkeypatch.setattr(scaling_docs, "DOC", doc)
    assert scaling_docs.stale() == [doc]


def test_the_slope_is_a_least_squares_fit_in_kb_per_node() -> None:
    assert scaling_docs.slope_kb_per_node([(1000, 200.0)]) is None
    assert scaling_docs.slope_kb_per_node([(1000, 200.0), (3000, 240.0), (10000, 380.0)]) == pytest.approx(
        20.0, rel=0.02
    )


def run(nodes: int, date: str, rss: float) -> tuple[Path, dict[str, Any]]:
    return Path(f"bench-{nodes}-{date}.json"), {
        "nodes": nodes,
        "date": date,
        "commit": "abc1234",
        "targets": {"operator_rss": {"pass": rss <= 250, "value": rss, "label": "Operator peak RSS"}},
        "operator": {"peak_rss_mb": rss},
        "storm": {"nodes_per_s": 20.0},
    }


def test_each_size_is_its_newest_run_and_misses_are_named() -> None:
    runs = [run(1000, "2026-11-30", 240.0), run(10000, "2026-12-01", 500.0), run(1000, "2026-12-01", 230.0)]
    pts = scaling_docs.points(runs)
    assert [(r["nodes"], r["date"]) for _, r in pts] == [(1000, "2026-12-01"), (10000, "2026-12-01")]
    block = scaling_docs.render(runs)
    assert "Missed at 10,000 nodes: Operator peak RSS (500.0, target <= 400 MB)." in block
    assert "Missed at 1,000 nodes: nothing it measured." in block


def test_a_run_of_only_the_resilience_phases_does_not_displace_the_newest_full_run() -> None:
    """``--phases restart,failover,drain`` measures no storm, detection or footprint: the curve keeps
    the newest full run of that size (the run feeds docs/bench.md's resilience block instead)."""
    full = run(1000, "2026-12-01", 230.0)
    phases_only = (Path("bench-1000-2026-12-02.json"), {"nodes": 1000, "date": "2026-12-02", "drain_storm": {}})
    assert scaling_docs.points([full, phases_only]) == [full]


def test_the_resilience_phases_get_a_row_per_size_from_their_newest_run() -> None:
    """docs/scaling.md shows the issue #26 phases at each fleet size, each held to its size's targets."""

    def phases(nodes: int, date: str, rate: float, double: int, restart_s: float) -> tuple[Path, dict[str, Any]]:
        res: dict[str, Any] = {
            "nodes": nodes,
            "date": date,
            "commit": "def5678",
            "drain_storm": {"evictions_per_s": rate, "double_actions": double},
            "failover": {"p50_s": 20.0},
            "warm_restart": {"restart_to_first_taint_s": restart_s, "startup_writes": 0},
        }
        res["targets"] = {
            "drain_rate": {"pass": rate >= 50, "value": rate},
            "drain_double": {"pass": double == 0, "value": double},
            "failover_p50": {"pass": True, "value": 20.0},
            "restart_taint": {"pass": restart_s <= 30, "value": restart_s},
        }
        return Path(f"bench-{nodes}-{date}.json"), res

    old, new, big = (
        phases(1000, "2026-12-01", 40.0, 0, 4.0),
        phases(1000, "2026-12-02", 55.0, 0, 4.0),
        phases(10000, "2026-12-02", 17.6, 2, 124.6),
    )
    assert docs.resilience_points([old, big, new]) == [new, big]
    block = scaling_docs.render([run(1000, "2026-11-30", 240.0), old, big, new])
    assert (
        "| 1,000 | `def5678`, 2026-12-02 (`bench-1000-2026-12-02.json`) | 55.0 | 0 | 20.0 | 4.0 | 0 | 4 of 4 |" in block
    )
    assert (
        "| 10,000 | `def5678`, 2026-12-02 (`bench-10000-2026-12-02.json`) | 17.6 | 2 | 20.0 | 124.6 | 0 | 1 of 4 |"
        in block
    )
    assert "bench-1000-2026-12-01.json" not in block  # the older run of that size is not shown


def test_a_stopped_run_renders_what_its_log_got_through(tmp_path: Path) -> None:
    (tmp_path / "stopped-10000-x.log").write_text(
        "[03:14:39] == control plane ==\n"
        "[03:17:48]    (control plane took 3 min 9 s; 3.2 min in)\n"
        "[03:41:59]   'watching ... GPU nodes' after 131.22s; all 10000 nodes Healthy after 645.49s\n"
        "[03:51:39]   50/200: p50 so far 4793 ms\n"
        "[04:34:09]   detect p50 661 ms p99 2377 ms; floor p50 372 ms\n"
        "[04:35:09]   10/20: end-to-end p50 so far 56 ms\n"
        "[04:36:10]   agent-node-0001 not back to Healthy and untainted within 60s after its release\n",
        encoding="utf-8",
    )
    stop = {
        "nodes": 10000,
        "pods": 80000,
        "commit": "abc1234",
        "date": "2026-12-01T03:52:28Z",
        "cpus": 2,
        "memory_gb": 23.5,
        "log": "stopped-10000-x.log",
        "what": "a 10k run stopped by hand",
        "lease_age_s": {"p10": 32.1, "p50": 251.1, "p90": 431.2, "max": 475.8},
        "leases": 10025,
        "load_average": [5.0, 5.7, 5.4],
        "node_states": {"Unknown": 8673, "Healthy": 1281},
        "processes": {"gpuhealth-operator": {"rss_mb": 1236, "cpu_s": 358.4, "age_s": 1275}},
    }
    lines = scaling_docs.render_stopped(tmp_path / "stopped-10000-x.json", stop)
    text = "\n".join(lines)
    assert "| control plane | 3 min 9 s |" in text
    assert "all 10,000 nodes evaluated after 645.49 s" in text
    assert "Detection to taint (200 faults): p50 661 ms, p99 2377 ms; the no-logic floor p50 372 ms." in text
    assert "End to end when stopped: p50 56 ms after 10 of 20 XIDs." in text
    assert "within 60 s: 1 (the end-to-end phase" in text
    assert "Healthy 1,281, Unknown 8,673" in text and "gpuhealth-operator 1,236 MB RSS" in text


def test_a_stopped_runs_figures_for_the_plot_come_from_its_log_and_state() -> None:
    runs = scaling_docs.stopped_runs(docs.RESULTS)
    assert runs, "the stopped 10,000-node runs are filed under results/bench/"
    figures = [scaling_docs.stopped_figures(p, s) for p, s in runs]
    assert all(f["nodes"] == 10000 and f["startup_s"] > 0 and f["rss_mb"] > 0 for f in figures)
    assert all(f["detect_p50"] > 0 for f in figures)
