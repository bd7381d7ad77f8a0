"""The API server's audit log, as the bench and the chaos suite read it.

LocalCluster (``audit_users``) has the API server log the requests of chosen identities at Metadata
level, one JSON event per line, so a run can count what the operator or an agent really asked of
the API (its writes, their order, their answers) instead of trusting the process's own account.

One reader for all of them, because the log has traps that each copy had to get right on its own:
the API server rotates it (``audit-<time>.log`` beside ``audit.log``, at 100 MB by default, which a
10,000-node bench passes), so reading only the live file silently loses the oldest requests; a line
can be cut short when the API server is killed (the chaos suite kills it); and each request is
logged at several stages, of which only ``ResponseComplete`` carries the answer.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def audit_files(path: Path) -> list[Path]:
    """The audit log and its rotated predecessors, oldest first, so requests are read in order.

    The API server renames the full file to ``<stem>-<time><suffix>`` (``audit-2026-12-01T12-00-00.000.log``)
    and starts a new one at ``path``; the time in the name sorts as text."""
    rotated = sorted(path.parent.glob(f"{path.stem}-*{path.suffix}"))
    return [*rotated, *([path] if path.exists() else [])]


def received(event: dict[str, Any]) -> dt.datetime | None:
    """When the API server received the request (aware, UTC); None if the event has no valid time."""
    return _stamp(event, "requestReceivedTimestamp")


def completed(event: dict[str, Any]) -> dt.datetime | None:
    """When the API server logged the event's stage: for ``ResponseComplete``, when the answer was sent."""
    return _stamp(event, "stageTimestamp")


def _stamp(event: dict[str, Any], key: str) -> dt.datetime | None:
    raw = event.get(key)
    if not isinstance(raw, str):
        return None
    try:
        t = dt.datetime.fromisoformat(raw)
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def audit_events(path: Path, users: Iterable[str], since: dt.datetime | None = None) -> Iterator[dict[str, Any]]:
    """The completed requests (stage ``ResponseComplete``) of ``users``, as the API server logged them,
    oldest first across the rotated files; with ``since``, only those received at or after it.

    A generator, because a large bench's log is gigabytes: a line that does not name one of the users
    is skipped before it is parsed, and nothing is kept that the caller does not keep."""
    wanted = frozenset(users)
    for part in audit_files(path):
        with open(part, errors="replace") as f:
            for line in f:
                if not any(u in line for u in wanted):
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a line cut short by an API server restart
                if event.get("stage") != "ResponseComplete" or (event.get("user") or {}).get("username") not in wanted:
                    continue
                if since is not None:
                    t = received(event)
                    if t is None or t < since:
                        continue
                yield event


@dataclass(frozen=True)
class AuditEntry:
    """One completed request, reduced to what the bench's figures are computed from (epoch seconds,
    so it compares with time.time() and the samplers' clocks)."""

    at: float
    verb: str
    resource: str
    subresource: str
    name: str
    code: int
    # When the answer was complete (epoch seconds), None where the log has no such stamp (``completed``
    # reads it with the received time in its place). The span from ``at`` is the request's time inside
    # the API server, queueing and etcd included.
    done: float | None = None
    # A list request that carries a continue token: a later page of a list, not a list of its own.
    continued: bool = False

    @property
    def completed(self) -> float:
        """When the answer was complete; the received time where the log has none (an instant)."""
        return self.done if self.done is not None else self.at

    @property
    def write(self) -> bool:
        return self.verb in WRITE_VERBS


def read_audit(path: Path, user: str) -> Iterator[AuditEntry]:
    """One user's completed requests (``audit_events``), as AuditEntry; an event without a valid
    received time cannot be placed on the timeline and is left out."""
    for event in audit_events(path, [user]):
        entry = audit_entry(event)
        if entry is not None:
            yield entry


def audit_entry(event: dict[str, Any]) -> AuditEntry | None:
    """One logged request as AuditEntry; None without a valid received time."""
    t = received(event)
    if t is None:
        return None
    ref = event.get("objectRef") or {}
    return AuditEntry(
        at=t.timestamp(),
        verb=str(event.get("verb") or ""),
        resource=str(ref.get("resource") or ""),
        subresource=str(ref.get("subresource") or ""),
        name=str(ref.get("name") or ""),
        code=int((event.get("responseStatus") or {}).get("code") or 0),
        done=(c.timestamp() if (c := completed(event)) is not None else None),
        continued="continue=" in str(event.get("requestURI") or ""),
    )
