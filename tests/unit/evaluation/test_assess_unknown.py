"""assess() when the facts cannot be trusted: no report, a heartbeat older than the policy's agent
silence (or none), NVML unavailable. The assessment is unknown, says why, and still carries the
evidence it has."""

from __future__ import annotations

from gpuhealth.api.names import Action, Signal
from gpuhealth.api.report import parse_report
from tests.unit.builders import NODE, iso, make_policy, make_report, xid_event
from tests.unit.evaluation._assess_support import assess_at, signals


def test_no_report_is_unknown() -> None:
    a = assess_at(None)
    assert a.unknown
    assert "no GPUNodeHealth report" in a.unknown_reason
    assert a.findings == ()


def test_heartbeat_older_than_agent_silence_is_unknown() -> None:
    report = make_report(heartbeat=0)
    assert not assess_at(report, now_s=120).unknown  # exactly at the limit is still fresh
    a = assess_at(report, now_s=121)
    assert a.unknown
    assert a.unknown_reason == f"no heartbeat from the agent since {iso(0)} (limit 120s)"
    # The reason is the node's status message while it is Unknown: the same a minute later, so a
    # pass of a node whose agent stays silent writes nothing.
    assert assess_at(report, now_s=181).unknown_reason == a.unknown_reason


def test_agent_silence_after_comes_from_the_policy() -> None:
    policy = make_policy({"rules": {"agentSilence": {"after": "30s"}}})
    assert assess_at(make_report(heartbeat=0), policy, now_s=31).unknown


def test_missing_heartbeat_is_unknown() -> None:
    a = assess_at(make_report(heartbeat=None))
    assert a.unknown
    assert "never sent a heartbeat" in a.unknown_reason


def test_nvml_unavailable_is_unknown_and_not_a_count_mismatch() -> None:
    report = make_report(devices=[], nvml={"available": False, "error": "Driver Not Loaded"})
    a = assess_at(report)
    assert a.unknown
    assert "Driver Not Loaded" in a.unknown_reason
    assert signals(a) == []


def test_a_silent_agents_word_that_nvml_is_unavailable_is_stale_silence_is_the_reason() -> None:
    """NVML unavailable is the agent's word while it lives; silent, its word is as stale as its facts
    (as for a hang below). The operator's own stub (no heartbeat, no nvml, no devices: the agent never
    wrote) is the agent never heard from, not "the agent cannot read the GPUs": announced as that, the
    stub's first pass gave a node whose agent never reported a second Event for the same silence."""
    silent = make_report(heartbeat=0, devices=[], nvml={"available": False, "error": "Driver Not Loaded"})
    a = assess_at(silent, now_s=121)
    assert a.unknown and a.unknown_signal == Signal.AGENT_SILENT
    assert f"no heartbeat from the agent since {iso(0)}" in a.unknown_reason
    assert assess_at(silent, now_s=5).unknown_signal == Signal.NVML_UNAVAILABLE  # alive: its word counts
    stub = parse_report({"metadata": {"name": NODE}, "spec": {"nodeName": NODE}})
    a = assess_at(stub)
    assert a.unknown and a.unknown_signal == Signal.AGENT_SILENT
    assert "never sent a heartbeat" in a.unknown_reason


def test_unknown_still_reports_the_evidence_it_has() -> None:
    a = assess_at(make_report(heartbeat=0, xids=[xid_event(79, 1, 0)]), now_s=1000)
    assert a.unknown
    assert signals(a) == [(Signal.XID, Action.DRAIN, 0, 79)]


def test_fresh_report_has_no_unknown_reason() -> None:
    a = assess_at(make_report())
    assert not a.unknown and a.unknown_reason == ""
    assert (a.total_gpus, a.healthy_gpus, a.last_xid) == (8, 8, "")


HANG = {
    "call": "nvmlDeviceGetTotalEccErrors",
    "since": "2026-11-30T11:59:00Z",
    "lastSampleTime": "2026-11-30T11:58:50Z",
}


def test_an_unresponsive_nvml_is_its_own_reason_not_a_silent_agent() -> None:
    """The agent lives (fresh heartbeat) and says an NVML call hangs: Unknown for NVMLUnresponsive,
    naming the call and since when; under the default (observe) nothing is held out."""
    report = make_report(nvml={"available": True, "unresponsive": HANG})
    a = assess_at(report)
    assert a.unknown and a.unknown_signal == Signal.NVML_UNRESPONSIVE
    assert "nvmlDeviceGetTotalEccErrors has not returned since 2026-11-30T11:59:00Z" in a.unknown_reason
    assert "newest GPU facts from 2026-11-30T11:58:50Z" in a.unknown_reason
    assert all(f.signal != Signal.NVML_UNRESPONSIVE for f in a.findings)
    # Also when the restarted agent has no facts at all (its nvmlInit hangs too).
    bare = make_report(devices=[], nvml={"available": False, "error": "NVML unresponsive", "unresponsive": HANG})
    assert assess_at(bare).unknown_signal == Signal.NVML_UNRESPONSIVE
    # A silent agent's word about NVML is as stale as its facts: silence is the reason then.
    assert assess_at(
        make_report(heartbeat=0, nvml={"available": True, "unresponsive": HANG}), now_s=121
    ).unknown_signal == (Signal.AGENT_SILENT)


def test_the_policy_can_cordon_or_drain_a_node_whose_nvml_hangs() -> None:
    report = make_report(nvml={"available": True, "unresponsive": HANG})
    for action in ("cordon", "drain"):
        policy = make_policy({"rules": {"nvmlUnresponsive": {"action": action}}})
        a = assess_at(report, policy)
        (f,) = [f for f in a.findings if f.signal == Signal.NVML_UNRESPONSIVE]
        assert f.action == Action(action) and f.gpu is None and str(f.scope) == "Node"
    assert make_policy({}).nvml_unresponsive_action == Action.OBSERVE
