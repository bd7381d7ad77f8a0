"""The bench figures in docs/development.md and docs/bench.md are the rendering of the committed result files."""

from __future__ import annotations

from pathlib import Path

import pytest

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
