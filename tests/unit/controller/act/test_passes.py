"""A node's pass (controller/act/passes.py) holds one view of the node's status, ``found``: the
store's one parse of the version the pass began with. A write of the same pass does not change it;
the rooms keep what they write themselves (tests/unit/controller/act/test_status_writes.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from gpuhealth.api.status import Record
from gpuhealth.controller.act.passes import NodePass
from gpuhealth.controller.state.store import Store
from tests.unit.builders import at, clean, make_policy, report_obj


def _with_status(rv: str, status: dict[str, Any]) -> dict[str, Any]:
    body = report_obj(name="n1")
    body["metadata"]["resourceVersion"] = rv
    body["status"] = status
    return body


def test_a_pass_holds_the_status_it_began_with_and_no_second_view() -> None:
    store = Store()
    store.put_report("n1", _with_status("1", {"state": "Quarantined", "drain": {"phase": "Running"}}))
    p = NodePass(
        name="n1",
        policy=make_policy(),
        now=at(0),
        node={},
        report=None,
        found=store.status("n1"),
        prior=Record(),
        assessment=clean(),
    )
    assert p.found is store.status("n1"), "the store's one parse of that version"
    store.wrote("n1", _with_status("2", {"state": "Quarantined", "drain": {"phase": "Completed"}}))
    assert p.found.drain.get("phase") == "Running", "the decision's input stays what the pass found"
    assert {f.name for f in dataclasses.fields(NodePass)} & {"store", "stored"} == set()
    assert not hasattr(p, "stored")
