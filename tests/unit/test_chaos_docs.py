"""The chaos and soak figures in docs/development.md and docs/chaos.md are the rendering of the filed reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hack.chaos import docs as chaos_docs


def report(**over: Any) -> dict[str, Any]:
    rep: dict[str, Any] = {
        "scenarios": 1,
        "runs": 2,
        "cycles": 7,
        "faults": {"process": 5, "gpu_faults": 3},
        "invariant_violations": 0,
        "known_violations": 0,
        "quick": False,
        "seed": 42,
        "commit": "0123456789abcdef",
        "dirty": False,
        "date": "2026-11-30T19:00:00Z",
        "seconds": 600.0,
        "by_scenario": {"operator_kills": [{"runs": 2, "cycles": 7, "faults": {"process": 5}, "violations": []}]},
    }
    rep.update(over)
    return rep


def test_readme_and_chaos_doc_match_the_filed_reports() -> None:
    assert chaos_docs.filed_runs(), "no full chaos run filed under results/chaos/"
    assert chaos_docs.filed_soaks(), "no soak filed under results/chaos/"
    assert chaos_docs.stale() == [], "run: python -m hack.chaos.docs"


def test_a_figure_typed_by_hand_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    readme, doc = tmp_path / "README.md", tmp_path / "chaos.md"
    readme.write_text(chaos_docs.DEV_DOC.read_text(encoding="utf-8"), encoding="utf-8")
    doc.write_text(chaos_docs.CHAOS_DOC.read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(chaos_docs, "DEV_DOC", readme)
    monkeypatch.setattr(chaos_docs, "CHAOS_DOC", doc)
    assert chaos_docs.stale() == []
    text = readme.read_text(encoding="utf-8")
    readme.write_text(text.replace("invariant violation", "invariant violation (typed)", 1), encoding="utf-8")
    assert chaos_docs.stale() == [readme]


def test_violations_are_shown_not_hidden(tmp_path: Path) -> None:
    rep = report(
        invariant_violations=1,
        by_scenario={"peering": [{"runs": 1, "cycles": 1, "faults": {}, "violations": ["pod x evicted twice"]}]},
    )
    block = chaos_docs.render(tmp_path / "chaos-x.json", rep)
    assert "**1 invariant violation**" in block
    assert "| peering | 1 | 1 | 0 | 0 | 0 | 0 | **1** |" in block
    assert "- peering: pod x evicted twice" in block


def test_only_a_full_run_at_a_clean_commit_is_filed(tmp_path: Path) -> None:
    for bad in (report(dirty=True), report(quick=True)):
        path = tmp_path / "report.json"
        path.write_text(json.dumps(bad), encoding="utf-8")
        with pytest.raises(ValueError):
            chaos_docs.file_report(path, tmp_path / "out")
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report()), encoding="utf-8")
    filed = chaos_docs.file_report(path, tmp_path / "out")
    assert filed.name == "chaos-2026-11-30-0123456.json"
    assert chaos_docs.filed_runs(tmp_path / "out")[0][1]["seed"] == 42


def test_a_soak_renders_its_slopes(tmp_path: Path) -> None:
    soak = {
        "minutes": 30.0,
        "seed": 7,
        "commit": "abcdef0123",
        "date": "2026-11-30T20:00:00Z",
        "events": {"ecc_on": 10, "agent_kill": 3},
        "nodes_deleted": 4,
        "leftovers": [],
        "violations": [],
        "trends": {"rss_mb": {"mean": 80.5, "per_hour": 0.4, "per_hour_pct_of_mean": 0.5}},
    }
    block = chaos_docs.render_soak(tmp_path / "soak.json", soak)
    assert "30 minutes, seed 7" in block and "4 Nodes deleted, 0 left anything behind" in block
    assert "| rss_mb | 80.5 | 0.4 | 0.5 | n/a |" in block  # too few samples for quarters


def test_the_quarter_slopes_tell_a_settling_warm_up_from_a_leak() -> None:
    t = [float(i * 60) for i in range(20)]
    settling = [90.0 + min(i, 10) for i in range(20)]  # grows, then flat
    leak = [90.0 + i for i in range(20)]  # 1 MB a minute throughout
    assert chaos_docs.quarter_slopes(t, settling) == [60.0, 60.0, 0.0, 0.0]
    assert chaos_docs.quarter_slopes(t, leak) == [60.0, 60.0, 60.0, 60.0]
    assert chaos_docs.quarter_slopes(t[:8], leak[:8]) is None


def test_a_soak_with_a_heap_profile_shows_the_python_heap_and_where_it_grew(tmp_path: Path) -> None:
    soak = {
        "minutes": 30.0,
        "seed": 7,
        "commit": "abcdef0123",
        "date": "2026-11-30T20:00:00Z",
        "events": {},
        "nodes_deleted": 0,
        "leftovers": [],
        "violations": [],
        "trends": {},
        "heap": {
            "t": [float(i * 30) for i in range(12)],
            "python_heap_mb": [40.0 + i for i in range(12)],
            "trends": {"python_heap_mb": {"mean": 44.5, "per_hour": 120.0, "per_hour_pct_of_mean": 269.66}},
            "growth": [{"site": "/x/operator/gpuhealth/controller/store.py:12", "size_diff": 4096, "count_diff": 8}],
        },
    }
    block = chaos_docs.render_soak(tmp_path / "soak.json", soak)
    assert "| python_heap_mb (heap profile) | 44.5 | 120.0 | 269.66 | 120 → 120 → 120 → 120 |" in block
    assert "| `gpuhealth/controller/store.py:12` | 4096 | 8 |" in block
