"""Bad-input cases name whole field paths; the report counts faults by class and knows every kind."""

from __future__ import annotations

import pytest

from hack.chaos.scenarios import registry
from hack.chaos.scenarios.bad_input_cases import bad_policies, bad_reports
from hack.chaos.scenarios.context import FAULT_CLASSES
from hack.chaos.scenarios.registry import fault_classes, split_known


@pytest.mark.parametrize(("what", "path"), [(w, p) for w, _, p in bad_policies() + bad_reports("n")])
def test_every_bad_input_case_expects_a_whole_field_path(what: str, path: str) -> None:
    assert path == "spec" or path.startswith("spec."), what


def test_faults_are_counted_apart_by_class() -> None:
    counts = fault_classes({"operator_kill": 3, "etcd_crash": 1, "foreign_write": 200, "bad_input": 80, "gpu": 6})
    assert counts["process"] == 4
    assert counts["foreign_writes"] == 200
    assert counts["hostile_objects"] == 80
    assert counts["gpu_faults"] == 6
    assert set(counts) == set(FAULT_CLASSES.values())


def test_a_known_bug_is_split_off_and_its_absence_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    bug = "a report whose heartbeatTime is ahead keeps its node Healthy"
    monkeypatch.setattr(registry, "KNOWN_VIOLATIONS", {"agent_death": [(("ahead of this clock",), bug)]})
    bug_line = (
        "agent_death-x-5: expected Unknown (agent silent), is Healthy; its heartbeatTime is 3599s ahead of this clock"
    )
    unexpected, known, gone = split_known("agent_death", [bug_line, "something else"])
    assert unexpected == ["something else"] and known == [bug_line] and gone == []
    assert split_known("agent_death", [])[2] == [bug]  # the bug stopped reproducing: its mark must go
