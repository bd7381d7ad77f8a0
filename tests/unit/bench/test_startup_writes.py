"""What the operator's start-up waited on (hack/bench/startup_writes.py): the in-flight sweep, Little's
law against the worker count, and the reading of a real audit log line's two timestamps."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from devkit.audit import AuditEntry, read_audit
from hack.bench.startup_writes import cpu_percent, first_pass_write, in_flight, main, startup_profile


def req(
    at: float, done: float | None, verb: str = "patch", resource: str = "nodes", sub: str = "", name: str = ""
) -> AuditEntry:
    return AuditEntry(at=at, verb=verb, resource=resource, subresource=sub, name=name or f"n{at}", code=200, done=done)


def test_in_flight_sums_to_the_window_and_counts_overlaps() -> None:
    # Two requests overlapping for one second inside a ten-second window.
    levels = in_flight([req(1.0, 3.0), req(2.0, 4.0)], 0.0, 10.0)
    assert levels == {0: 7.0, 1: 2.0, 2: 1.0}
    assert sum(levels.values()) == pytest.approx(10.0)


def test_in_flight_clips_to_the_window_and_ignores_requests_without_an_answer_time() -> None:
    levels = in_flight([req(-5.0, 2.0), req(9.0, 20.0), req(4.0, None)], 0.0, 10.0)
    assert levels == {1: 3.0, 0: 7.0}


def test_workers_always_in_the_server_read_as_bound_by_it() -> None:
    # Two workers, each sending its next request the instant the last one's answer is complete: 0.5 s each.
    entries = [req(w * 0.25 + i * 0.5, w * 0.25 + (i + 1) * 0.5) for w in range(2) for i in range(20)]
    p = startup_profile(entries, 0.5, 10.0, workers=2)
    assert p["in_flight_mean"] == pytest.approx(2.0)
    assert p["waiting_on_server_share"] == pytest.approx(1.0)
    assert p["all_workers_in_server_share"] == pytest.approx(1.0)
    assert p["server_ms"]["p50"] == pytest.approx(500.0)
    # Little's law holds on the figures as filed: rate x mean time = mean in flight.
    assert p["requests_per_s"] * p["server_ms"]["mean"] / 1000 == pytest.approx(p["in_flight_mean"], rel=0.06)


def test_a_slow_operator_shows_as_time_outside_the_server() -> None:
    # One worker, 0.1 s in the server then 0.9 s of its own: a tenth of its time waiting on the server.
    entries = [req(float(i), i + 0.1) for i in range(10)]
    p = startup_profile(entries, 0.0, 10.0, workers=1)
    assert p["waiting_on_server_share"] == pytest.approx(0.1)
    assert p["none_in_server_share"] == pytest.approx(0.9)


def test_watches_lists_and_events_are_not_the_passes() -> None:
    entries = [
        req(0.0, 10.0, verb="watch"),
        req(0.0, 9.0, verb="list", resource="pods"),
        req(1.0, 1.5, verb="create", resource="events"),
        req(2.0, 2.5, verb="patch", resource="gpunodehealths", sub="status"),
        req(3.0, 3.2, verb="get", resource="gpunodehealths"),
        req(4.0, 4.5, verb="patch", resource="nodes"),
        req(5.0, 5.5, verb="patch", resource="nodes", sub="status"),
    ]
    p = startup_profile(entries, 0.0, 10.0, workers=4)
    assert p["requests"] == 4 and p["writes"] == 3
    assert p["writes_by_kind"] == {"patch gpunodehealths/status": 1, "patch nodes": 1, "patch nodes/status": 1}
    assert first_pass_write(entries, 0.0) == 2.0
    assert first_pass_write(entries, 6.0) is None


def test_cpu_percent_over_the_window() -> None:
    samples = [(0.0, 0.0), (1.0, 0.5), (5.0, 2.5), (11.0, 9.0)]
    assert cpu_percent(samples, 1.0, 10.0) == pytest.approx(50.0)
    assert cpu_percent(samples, 6.0, 10.0) is None
    p = startup_profile([req(1.0, 2.0)], 0.0, 10.0, workers=1, cpu={"op": samples, "idle": []})
    assert p["cpu_percent"] == {"op": 50.0}


def test_the_audit_log_line_gives_both_times(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The shape kube-apiserver writes at Metadata level (stage ResponseComplete, microsecond stamps).
    line = {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "Metadata",
        "stage": "ResponseComplete",
        "verb": "patch",
        "user": {"username": "gpuhealth-operator"},
        "objectRef": {"resource": "nodes", "name": "gpu-node-1", "apiVersion": "v1"},
        "responseStatus": {"code": 200},
        "requestReceivedTimestamp": "2026-12-04T13:30:00.100000Z",
        "stageTimestamp": "2026-12-04T13:30:00.350000Z",
    }
    log = tmp_path / "audit.log"
    log.write_text(json.dumps(line) + "\n")
    page = {**line, "verb": "list", "requestURI": "/api/v1/nodes?continue=abc&limit=500"}
    log.write_text(json.dumps(line) + "\n" + json.dumps(page) + "\n")
    e, p = read_audit(log, "gpuhealth-operator")
    assert e.done is not None and e.done - e.at == pytest.approx(0.25)
    assert not e.continued and p.continued
    main([str(log), "--after", str(e.at - 1), "--until", str(e.at + 1), "--workers", "1"])
    out = json.loads(capsys.readouterr().out)
    assert out["writes"] == 1 and out["server_ms"]["p50"] == pytest.approx(250.0)


def test_the_detail_line_reads_the_profile_and_says_when_a_run_has_none() -> None:
    from hack.bench.details import startup_line

    assert startup_line({"operator": {"startup_s": 600}}) == "Start-up writes: not measured in this run."
    entries = [req(float(i), i + 0.5, sub="status" if i % 2 else "", name=f"node-{i // 2}") for i in range(10)]
    p = startup_profile(entries, 0.0, 10.0, workers=1, cpu={"kube-apiserver": [(0.0, 0.0), (10.0, 9.0)]})
    line = startup_line({"operator": {"startup_profile": p}})
    assert "10 writes on 5 Nodes (patch nodes 5, patch nodes/status 5), 1.0 writes/s" in line
    assert "p50 500.0 ms" in line and "50% of their time" in line and "kube-apiserver 90.0%" in line
    p["passes"] = {"total": 92049.0, "lease_requeues": 30609.0}
    assert "; 92,049 node passes by then (30,609 queued by Lease renewals)." in startup_line(
        {"operator": {"startup_profile": p}}
    )


def test_the_lists_a_restart_waits_for_by_resource() -> None:
    from hack.bench.details import restart_line
    from hack.bench.startup_writes import list_profile

    page2 = dataclasses.replace(req(2.5, 4.0, verb="list", resource="gpunodehealths"), continued=True)
    entries = [
        req(0.0, 2.0, verb="list", resource="gpunodehealths"),
        page2,  # its second page, 0.5 s of the operator's own after the first
        req(0.0, 0.4, verb="list", resource="nodes"),
        req(0.1, 0.2, verb="patch", resource="nodes"),  # not a list
        req(0.0, 0.3, verb="list", resource="gpuhealthpolicies"),
        req(4.0, 4.2, verb="list", resource="gpuhealthpolicies"),  # a list of its own, not a page
        req(9.0, 9.5, verb="list", resource="pods"),  # after the window
        # A watch (the pods' streamed list among them, watched on from: its end in the audit log is the
        # watch's, not the list's): not a list.
        req(0.5, 3.0, verb="watch", resource="pods"),
    ]
    lists = list_profile(entries, 0.0, 5.0)
    assert lists == {
        "gpunodehealths": {"lists": 1, "pages": 2, "server_s": 3.5, "span_s": 4.0},
        "gpuhealthpolicies": {"lists": 2, "pages": 2, "server_s": 0.5, "span_s": 0.3},
        "nodes": {"lists": 1, "pages": 1, "server_s": 0.4, "span_s": 0.4},
    }
    w = {
        "fault_published_after_s": 0.1,
        "restart_to_first_taint_s": 5.0,
        "lists": lists,
        "startup_watching_s": 4.2,
        "startup_writes": 0,
        "startup_window_s": 30.0,
    }
    line = restart_line({"warm_restart": w})
    # Only the lists that took a second or more, slowest first.
    assert "tainted 5.0 s after it (its lists until then, slowest first: gpunodehealths 2 pages, 3.5 s in" in line
    assert "nodes 1 pages" not in line
    assert "Warm restart:" in restart_line({"warm_restart": {**w, "lists": {}}})


def test_the_watches_lists_are_read_from_the_operators_log() -> None:
    from hack.bench.details import restart_line
    from hack.bench.restart import watch_lists

    log = (
        "2026-12-04 20:00:01,000 INFO gpuhealth.controller.intake.objectwatch: nodes-watch: listed 10025 in 6.2s, "
        "streamed\n"
        "2026-12-04 20:00:02,000 INFO gpuhealth.controller.intake.objectwatch: reports-watch: listed 10025 in 12.4s, "
        "streamed\n"
        "2026-12-04 20:00:03,000 INFO gpuhealth.controller.intake.objectwatch: leases-watch: listed 5 in 0.1s, paged\n"
        "2026-12-04 20:09:00,000 INFO gpuhealth.controller.intake.objectwatch: reports-watch: listed 10025 in 30.0s, "
        "streamed\n"  # a relist later on: the first list is the start-up's
    )
    lists = watch_lists(log)
    assert lists == {
        "nodes": {"objects": 10025, "s": 6.2, "how": "streamed"},
        "reports": {"objects": 10025, "s": 12.4, "how": "streamed"},
        "leases": {"objects": 5, "s": 0.1, "how": "paged"},
    }
    w = {
        "fault_published_after_s": 0.1,
        "restart_to_first_taint_s": 15.0,
        "lists": {},
        "watch_lists": lists,
        "startup_watching_s": 14.2,
        "startup_writes": 0,
        "startup_window_s": 30.0,
    }
    line = restart_line({"warm_restart": w})
    assert "slowest first: reports 10,025 streamed in 12.4 s; nodes 10,025 streamed in 6.2 s; leases 5 paged" in line
    # A run that read the audit's first request says how much of the quiet restart came before any list
    # (the floor's clock starts at its first list).
    assert "its first request" not in line
    line = restart_line({"warm_restart": {**w, "startup_first_request_s": 0.84}})
    assert ": its first request to the API server 0.84 s after it, `watching` 14.2 s after it" in line
