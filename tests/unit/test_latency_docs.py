"""The repair latencies in docs/remediation.md are the rendering of the filed runs (hack/latency.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hack import latency


def run(**over: Any) -> dict[str, Any]:
    rep: dict[str, Any] = {
        "date": "2026-12-03T16:30:00Z",
        "commit": "0123456789abcdef",
        "dirty": False,
        "tick_s": 5.0,
        "marks": {"fault": 0.0, "rule": 0.6, "pod_gone": 2.1, "reset_job": 31.0, "reset_done": 33.5},
        "events": {"DeviceQuarantined": 0.5},
    }
    rep.update(over)
    return rep


def test_remediation_doc_matches_the_filed_runs() -> None:
    assert latency.filed(), "no latency run filed under results/latency/"
    assert latency.stale() == [], "run: python -m hack.latency"


def test_a_figure_typed_by_hand_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = tmp_path / "remediation.md"
    doc.write_text(latency.DOC.read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(latency, "DOC", doc)
    assert latency.stale() == []
    text = doc.read_text(encoding="utf-8")
    doc.write_text(text.replace(" s |", " s (typed) |", 1), encoding="utf-8")
    assert latency.stale() == [doc]


def test_each_step_is_the_delay_after_the_one_before_and_a_missing_one_is_said(tmp_path: Path) -> None:
    block = latency.render([(tmp_path / "latency-a.json", run())])
    assert "| **the reset Job exists** | 28.9 s |" in block
    assert "| the reset Job's pod succeeded | 2.5 s |" in block
    assert "| **the validation Job exists** | not reached |" in block
    assert "`0123456` (2026-12-03, tick 5 s)" in block
    assert latency.delay(run(), "pod_gone", "reset_job") == 28.9


def test_only_a_run_at_a_clean_commit_is_filed(tmp_path: Path) -> None:
    path = tmp_path / "latency.json"
    path.write_text(json.dumps(run(dirty=True)), encoding="utf-8")
    with pytest.raises(ValueError):
        latency.file_report(path, tmp_path / "out")
    path.write_text(json.dumps(run()), encoding="utf-8")
    filed = latency.file_report(path, tmp_path / "out")
    assert filed.name == "latency-2026-12-03-0123456.json"
    assert latency.filed(tmp_path / "out")[0][1]["marks"]["reset_job"] == 31.0


def test_a_measurement_counts_from_the_fault_in_the_order_seen() -> None:
    rep = latency.measurement({"reset_job": 130.0, "fault": 100.0, "rule": 100.5}, 5.0, {"GPUReset": 129.9})
    assert list(rep["marks"]) == ["fault", "rule", "reset_job"]
    assert rep["marks"]["reset_job"] == 30.0 and rep["events"] == {"GPUReset": 29.9}
    assert rep["tick_s"] == 5.0 and rep["commit"]
