"""The foreign-marks invariant checks a Node read against the foreign writer's own log."""

from __future__ import annotations

from typing import Any

from hack.chaos.foreign import ForeignLog, foreign_problems


def node(rv: int, taints: list[str], unschedulable: bool = False) -> dict[str, Any]:
    return {
        "metadata": {"resourceVersion": str(rv)},
        "spec": {"taints": [{"key": k, "effect": "NoSchedule"} for k in taints], "unschedulable": unschedulable},
    }


def test_a_dropped_foreign_taint_fires_even_after_later_reads() -> None:
    log = ForeignLog()
    log.record("n", 10, frozenset({"example.com/a"}), False)
    assert foreign_problems(log, "n", node(10, ["example.com/a"])) == []
    # gpuhealth (rv 12) wrote the Node without it: the writer's log still wants it.
    [problem] = foreign_problems(log, "n", node(12, ["gpuhealth.dev/unhealthy"]))
    assert "foreign taint example.com/a was lifted" in problem
    assert foreign_problems(log, "n", node(40, []))  # and it stays expected: no new baseline


def test_a_lifted_foreign_cordon_fires() -> None:
    log = ForeignLog()
    log.record("n", 5, frozenset(), True)
    assert foreign_problems(log, "n", node(6, [], unschedulable=True)) == []
    [problem] = foreign_problems(log, "n", node(7, [], unschedulable=False))
    assert "cordon placed by someone else was lifted" in problem


def test_a_read_older_than_the_write_is_not_held_to_it() -> None:
    log = ForeignLog()
    log.record("n", 5, frozenset(), False)
    log.record("n", 9, frozenset({"example.com/b"}), True)
    assert foreign_problems(log, "n", node(8, [])) == []  # read before the write at rv 9 landed
    assert len(foreign_problems(log, "n", node(9, []))) == 2


def test_the_writer_removing_its_own_taint_is_clean() -> None:
    log = ForeignLog()
    log.record("n", 5, frozenset({"example.com/a"}), True)
    log.record("n", 7, frozenset(), False)
    assert foreign_problems(log, "n", node(8, [])) == []
    assert foreign_problems(log, "other", node(8, [])) == []  # nothing written there


def test_a_write_in_flight_may_or_may_not_be_in_a_read() -> None:
    log = ForeignLog()
    log.record("n", 5, frozenset({"example.com/a"}), True)
    log.begin("n", frozenset(), False)  # removing its taint and cordon: sent, not answered
    assert foreign_problems(log, "n", node(9, [])) == []
    log.record("n", 8, frozenset(), False)
    assert foreign_problems(log, "n", node(9, [])) == []
    log.begin("n", frozenset({"example.com/b"}), False)  # adding: not required until answered
    assert foreign_problems(log, "n", node(9, [])) == []
    log.abort("n")  # refused (409)
    assert foreign_problems(log, "n", node(9, [])) == []
