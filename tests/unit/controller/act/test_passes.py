"""A node's pass (controller/act/passes.py): ``found`` is the status as the pass began, ``stored`` the
store's copy at the moment it is read. The first typed pass handed every room the status as the pass
began; a room running after the same pass's writes then resumed from before them (a fresh-clone test
saw a GPU's reset Job created twice and an approval lost)."""

from __future__ import annotations

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


def _pass(store: Store) -> NodePass:
    found = store.status("n1")  # as the node reconciler finds it
    return NodePass(
        name="n1",
        policy=make_policy(),
        now=at(0),
        node={},
        report=None,
        found=found,
        store=store,
        prior=Record(),
        assessment=clean(),
    )


def test_stored_is_the_stores_copy_after_a_write_of_the_same_pass_and_found_is_not() -> None:
    store = Store()
    store.put_report("n1", _with_status("1", {"state": "Quarantined", "drain": {"phase": "Running"}}))
    p = _pass(store)
    assert p.stored is p.found, "nothing written yet: the store's one parse of the version the pass found"
    store.wrote("n1", _with_status("2", {"state": "Quarantined", "drain": {"phase": "Completed"}}))
    assert p.stored.drain.get("phase") == "Completed", "a room after the write resumes from it"
    assert p.found.drain.get("phase") == "Running", "the decision's input stays what the pass found"
    assert p.stored is p.stored, "parsed once per version"
    store.wrote("n1", _with_status("3", {"state": "Quarantined"}))
    assert not p.stored.drain
