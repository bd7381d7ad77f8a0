"""The store's typed status (``Store.status``): one ``StoredStatus`` per version of a cached report,
shared by every reader of that version, a new one once the watch or a write brings another version,
and none kept for a report that is gone."""

from __future__ import annotations

from typing import Any

from gpuhealth.api.devices import DeviceRecord, DeviceState, devices_to_status
from gpuhealth.controller.state.store import Store


def _report(rv: str, status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "a", "resourceVersion": rv}, "spec": {"nodeName": "a"}, "status": status}


def _devices(*states: DeviceState) -> list[dict[str, Any]]:
    return devices_to_status(DeviceRecord(index=i, state=s) for i, s in enumerate(states))


def test_one_typed_status_per_version_of_the_report() -> None:
    store = Store()
    store.put_report("a", _report("1", {"policy": "p", "totalGPUs": 2, "devices": _devices(DeviceState.QUARANTINED)}))
    first = store.status("a")
    assert store.status("a") is first  # every reader of this version shares one parse
    assert first.policy == "p" and first.devices[0].state == DeviceState.QUARANTINED
    assert store.gpus_out("a") == 1 and store.gpus_of("a") == 2

    store.put_report("a", _report("2", {"policy": "p", "totalGPUs": 2, "devices": _devices(DeviceState.IN_SERVICE)}))
    second = store.status("a")
    assert second is not first and second.devices[0].state == DeviceState.IN_SERVICE
    assert store.gpus_out("a") == 0

    store.wrote("a", _report("3", {"policy": "q"}))
    assert store.status("a").policy == "q"  # our own write's answer is the version read next


def test_no_report_reads_as_an_empty_status() -> None:
    store = Store()
    store.put_report("a", _report("1", {"state": "Quarantined"}))
    store.drop_report("a")
    s = store.status("a")
    assert not s.decided and s.devices == {} and s.policy is None


def test_a_watched_echo_older_than_our_write_does_not_take_its_place() -> None:
    """The watch, behind, brings versions 1 and 2 after our write's answer (version 3) was cached: the
    store keeps version 3. Taking version 1 back (a fresh-clone run of the one-status-write branch) made
    the next pass read a GPU's ladder as never started and create its reset Job a second time."""
    store = Store()
    store.put_report("a", _report("1", {"policy": "p", "remediation": {}}))
    store.wrote("a", _report("3", {"policy": "p", "remediation": {"3": {"phase": "Running"}}}))
    store.put_report("a", _report("1", {"policy": "p", "remediation": {}}))
    store.put_report("a", _report("2", {"policy": "p", "remediation": {"3": {"phase": "Pending"}}}))
    assert store.status("a").ladder_entries == {"3": {"phase": "Running"}}
    store.put_report("a", _report("4", {"policy": "p", "remediation": {"3": {"phase": "Verifying"}}}))
    assert store.status("a").ladder_entries == {"3": {"phase": "Verifying"}}  # a newer version is taken
