"""The bench figures in docs/development.md and docs/bench.md are the rendering of the committed result files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devkit.filing import free_name
from hack.bench import docs


def test_readme_and_bench_doc_match_the_filed_results() -> None:
    assert docs.filed_runs(), "no full bench run filed under results/bench/"
    assert docs.stale() == [], "run: python -m hack.bench.docs"


def test_a_figure_typed_by_hand_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    readme, bench = tmp_path / "README.md", tmp_path / "bench.md"
    for src, dst in zip(docs.DOCS, (readme, bench), strict=True):
        dst.write_text(src.read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(docs, "DOCS", (readme, bench))
    assert docs.stale() == []
    readme.write_text(
        readme.read_text(encoding="utf-8").replace("Latest filed full run: 1", "Latest filed full run: 2", 1),
        encoding="utf-8",
    )
    assert docs.stale() == [readme]


def test_an_ab_row_names_the_ratios_each_run_missed() -> None:
    """The floors move with the host as the figures do: each row says which paths came within 1.5x of
    their floor, and a run with no floor judged says so with '-'."""
    run = json.loads(next(iter(sorted(docs.RESULTS.glob("ab-1000-*-eb443b3.json")))).read_text(encoding="utf-8"))
    assert docs.ab_ratios(run) == "5 of 7 (detect_p50, detect_p99)"
    storm = run["targets"]["storm_rate"]
    run["targets"]["storm_rate"] = {**storm, "ratio": {**storm["ratio"], "ratio": 2.0, "status": "missed"}}
    assert docs.ab_ratios(run) == "4 of 7 (detect_p50, detect_p99, storm_rate)"
    # A run filed before the other floors: only detection's, which its results always held, is judged.
    old = json.loads(next(iter(sorted(docs.RESULTS.glob("bench-1000-*7a099bb.json")))).read_text(encoding="utf-8"))
    assert docs.ab_ratios(old) == "0 of 2 (detect_p50, detect_p99)"
    for key in ("detect_p50", "detect_p99"):
        old["targets"][key] = {**old["targets"][key], "ratio": {"status": "unmeasured"}}
    assert docs.ab_ratios(old) == "-"


def test_an_ab_row_names_the_targets_each_run_missed() -> None:
    """Two runs at two commits on one host: the row says which targets each met and which it missed, so a
    miss that belongs to the host shows up in both."""
    run = json.loads(next(iter(sorted(docs.RESULTS.glob("bench-1000-*7a099bb.json")))).read_text(encoding="utf-8"))
    assert docs.ab_targets(run) == "15 of 17 (traffic_p50, traffic_p99)"
    run["targets"]["storm_rate"] = {**run["targets"]["storm_rate"], "pass": False}
    assert docs.ab_targets(run) == "14 of 17 (storm_rate, traffic_p50, traffic_p99)"


def test_runs_of_one_commit_are_filed_side_by_side(tmp_path: Path) -> None:
    """Issue #52's runs of every phase at one commit: the domain and MIG runs get their phases in the
    name, and a second run of the same name lands beside the first, never over it."""
    assert docs.phase_tag({"config": {"phases": ["core", "restart", "failover", "drain"]}}) == ""
    assert docs.phase_tag({"config": {"phases": ["domain"]}}) == "-domain"
    assert docs.phase_tag({"config": {"phases": ["mig", "restart"]}}) == "-mig-restart"
    assert docs.phase_tag({"config": {}}) == ""
    assert free_name(tmp_path, "bench-1000-x") == tmp_path / "bench-1000-x.json"
    (tmp_path / "bench-1000-x.json").write_text("{}")
    assert free_name(tmp_path, "bench-1000-x") == tmp_path / "bench-1000-x-2.json"
    (tmp_path / "bench-1000-x-2.json").write_text("{}")
    assert free_name(tmp_path, "bench-1000-x") == tmp_path / "bench-1000-x-3.json"
