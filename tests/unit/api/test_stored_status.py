"""A node's status parsed once per pass (``api/status.py`` ``StoredStatus``): each part the rooms
resume from, read with the part's own typed reader."""

from __future__ import annotations

import datetime as dt

from gpuhealth.api.devices import DeviceRecord, DeviceState, devices_to_status
from gpuhealth.api.names import State
from gpuhealth.api.remediation import StepKind
from gpuhealth.api.remediation_status import LadderRecord, Phase
from gpuhealth.api.status import Record, StoredStatus, evidence_entry, node_status
from gpuhealth.api.timeutil import format_time
from gpuhealth.api.validation import NodeValidation, Trigger, Validation

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_every_part_is_read_once_with_its_reader() -> None:
    rec = Record(state=State.QUARANTINED, reason="XidCritical", since=T0)
    gpu = DeviceRecord(index=3, state=DeviceState.DRAINING, since=T0)
    ladder = LadderRecord(index=3, step=StepKind.GPU_RESET, phase=Phase.RUNNING)
    nv = NodeValidation(Trigger.RELEASE, T0, Validation(level=2))
    status = {
        **rec.to_status(),
        "devices": devices_to_status([gpu]),
        "drain": {"phase": "Running", "startedAt": format_time(T0)},
        "deviceDrains": {"3": {"phase": "Completed", "startedAt": format_time(T0)}},
        "remediation": {"3": ladder.to_status()},
        "nodeValidation": nv.to_status(),
        "pending": {"Temperature": format_time(T0)},
        "clockSkew": {"offsetSeconds": 90, "since": format_time(T0)},
    }
    s = StoredStatus.read(status)
    assert s.written is status and s.decided
    assert s.record == Record.from_status(status)
    assert s.devices[3].state == DeviceState.DRAINING
    assert s.drain == {"phase": "Running", "startedAt": format_time(T0)}
    assert s.device_drains[3]["phase"] == "Completed"
    assert s.ladders[3].phase == Phase.RUNNING and s.ladder_entries["3"] == ladder.to_status()
    assert s.node_validation == nv
    assert s.pending == {"Temperature": format_time(T0)}
    assert s.clock_skew == {"offsetSeconds": 90, "since": format_time(T0)}


def test_an_empty_status_reads_as_nothing_recorded() -> None:
    s = StoredStatus.read(None)
    assert not s.decided and s.record == Record()
    assert (s.devices, s.drain, s.device_drains, s.ladders, s.repairs, s.pending) == ({}, {}, {}, {}, {}, {})
    assert s.node_validation is None and s.clock_skew is None


def test_what_node_status_writes_reads_back_as_written() -> None:
    """The node's summary the plugin shows (policy, counts, last XID, evidence, clock skew) is what
    ``node_status`` wrote: each evidence item round-trips to the entry ``evidence_entry`` made."""
    entries = [
        evidence_entry("xid", "XidCritical", "drain", "XID 79 on GPU 3", 3, "GPU-3", 79, T0),
        evidence_entry("thermal", "Temperature", "observe", "hot"),
    ]
    body = node_status(
        Record(state=State.DRAINING, reason="XidCritical", since=T0),
        policy="p",
        overridden=["q"],
        dry_run=True,
        total_gpus=8,
        healthy_gpus=7,
        last_xid="79",
        evidence=entries,
        pending={},
        in_service_gpus=6,
        clock_skew={"offsetSeconds": -90, "since": format_time(T0)},
    )
    s = StoredStatus.read(body)
    assert (s.state, s.policy, s.overridden_policies, s.dry_run) == (State.DRAINING, "p", ("q",), True)
    assert (s.total_gpus, s.healthy_gpus, s.in_service_gpus, s.last_xid) == (8, 7, 6, "79")
    assert [e.to_status() for e in s.evidence] == entries and s.evidence[0].code == 79
    assert s.skew_seconds == -90


def test_a_status_without_a_verdict_has_no_state_and_no_summary() -> None:
    s = StoredStatus.of({"metadata": {"name": "n"}, "spec": {}})
    assert s.state is None and s.policy is None and s.total_gpus is None and s.last_xid is None
    assert s.evidence == () and s.skew_seconds is None and not s.dry_run
