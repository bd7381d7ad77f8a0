"""The shared audit-log reader (devkit/audit.py): the bench's figures and the chaos suite's
invariants are only as true as the requests it finds, so it must read the rotated files before the
live one, in order, and return exactly the chosen users' completed requests."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from devkit.audit import AuditEntry, audit_events, audit_files, read_audit


def _event(user: str, name: str, at: str, *, stage: str = "ResponseComplete", code: int = 200) -> dict[str, Any]:
    return {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "stage": stage,
        "user": {"username": user},
        "verb": "patch",
        "objectRef": {"resource": "nodes", "name": name},
        "responseStatus": {"code": code},
        "requestReceivedTimestamp": at,
    }


def _write(path: Path, events: list[dict[str, Any]], tail: str = "") -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in events) + tail)


def test_rotated_files_are_read_before_the_live_one_oldest_first(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    # The API server's backup names (lumberjack): <stem>-<time><suffix>; written out of order here
    # so that the order comes from the names, not from the directory listing.
    _write(tmp_path / "audit-2026-12-01T12-00-05.000.log", [_event("op", "n2", "2026-12-01T12:00:02.000000Z")])
    _write(tmp_path / "audit-2026-12-01T12-00-01.000.log", [_event("op", "n1", "2026-12-01T12:00:01.000000Z")])
    _write(log, [_event("op", "n3", "2026-12-01T12:00:06.000000Z")])
    (tmp_path / "audit-policy.json").write_text("{}")  # LocalCluster's policy file lies beside the log

    assert [p.name for p in audit_files(log)] == [
        "audit-2026-12-01T12-00-01.000.log",
        "audit-2026-12-01T12-00-05.000.log",
        "audit.log",
    ]
    assert [e["objectRef"]["name"] for e in audit_events(log, ["op"])] == ["n1", "n2", "n3"]
    assert [e.name for e in read_audit(log, "op")] == ["n1", "n2", "n3"]


def test_a_rotation_with_no_live_file_yet_and_no_log_at_all(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    assert audit_files(log) == []
    assert list(audit_events(log, ["op"])) == []
    _write(tmp_path / "audit-2026-12-01T12-00-01.000.log", [_event("op", "n1", "2026-12-01T12:00:01.000000Z")])
    assert [e["objectRef"]["name"] for e in audit_events(log, ["op"])] == ["n1"]


def test_only_the_chosen_users_completed_requests(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    _write(
        log,
        [
            _event("op", "mine", "2026-12-01T12:00:01.000000Z"),
            _event("op", "started", "2026-12-01T12:00:01.000000Z", stage="ResponseStarted"),
            _event("op-b", "second replica", "2026-12-01T12:00:02.000000Z"),
            # Its name contains "op": the text prefilter lets it through, the username check does not.
            _event("op-other", "other", "2026-12-01T12:00:03.000000Z"),
            _event("agent", "agent", "2026-12-01T12:00:04.000000Z"),
        ],
        tail='{"stage": "ResponseComplete", "user": {"username": "op"}, "verb": "pat',  # cut short by a kill
    )
    assert [e["objectRef"]["name"] for e in audit_events(log, ["op"])] == ["mine"]
    assert [e["objectRef"]["name"] for e in audit_events(log, ["op", "op-b"])] == ["mine", "second replica"]
    assert [e["objectRef"]["name"] for e in audit_events(log, [])] == []


def test_since_keeps_what_was_received_at_or_after_it(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    early = _event("op", "early", "2026-12-01T12:00:00.999999Z")
    timeless = _event("op", "timeless", "")
    _write(log, [early, _event("op", "on time", "2026-12-01T12:00:01.000000Z"), timeless])
    since = dt.datetime(2026, 12, 1, 12, 0, 1, tzinfo=dt.UTC)
    assert [e["objectRef"]["name"] for e in audit_events(log, ["op"], since)] == ["on time"]
    assert len(list(audit_events(log, ["op"]))) == 3  # without since, nothing is judged by its time


def test_read_audit_reduces_an_event_to_the_figures_fields(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    evict = _event("op", "p", "2026-12-01T12:00:01.500000Z", code=429)
    evict.update(verb="create", objectRef={"resource": "pods", "subresource": "eviction", "name": "p"})
    _write(log, [evict, _event("op", "timeless", "not a time")])
    at = dt.datetime(2026, 12, 1, 12, 0, 1, 500000, tzinfo=dt.UTC).timestamp()
    assert list(read_audit(log, "op")) == [
        AuditEntry(at=at, verb="create", resource="pods", subresource="eviction", name="p", code=429)
    ]
    assert next(read_audit(log, "op")).write
