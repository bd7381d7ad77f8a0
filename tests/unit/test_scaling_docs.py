"""docs/scaling.md's curve is the rendering of the filed bench runs, and its arithmetic is right."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hack import scaling_docs


def test_scaling_doc_matches_the_filed_results() -> None:
    assert scaling_docs.stale() == [], "run: python -m hack.scaling_docs"


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
    }


def test_each_size_is_its_newest_run_and_misses_are_named() -> None:
    runs = [run(1000, "2026-11-30", 240.0), run(10000, "2026-12-01", 500.0), run(1000, "2026-12-01", 230.0)]
    pts = scaling_docs.points(runs)
    assert [(r["nodes"], r["date"]) for _, r in pts] == [(1000, "2026-12-01"), (10000, "2026-12-01")]
    block = scaling_docs.render(runs)
    assert "Missed at 10,000 nodes: Operator peak RSS (500.0, target <= 400 MB)." in block
    assert "Missed at 1,000 nodes: nothing it measured." in block
