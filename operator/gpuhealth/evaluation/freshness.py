"""When the agent was last heard from, by the operator's clock (or the API server's), not the agent's.

An agent's `heartbeatTime` is written with the node's clock. A node whose clock runs ahead would
otherwise look fresh long after its agent died (a heartbeat ten minutes in the future stays "fresh"
for ten minutes plus the silence period), and one whose clock runs behind would look silent while
it reports. So freshness is judged by when the operator *saw the report's spec change*: the API
server bumps `metadata.generation` on every spec write and never on a status write, so a new
(uid, generation) is a sign of life that no clock on the node can fake.

For reports that were already there when the operator started (or listed again after a pause),
nobody saw the write, and what the operator saw before a restart or failover was only in its
memory. The object itself still says when it was written, by the API server's clock: the server
stamps `metadata.managedFields[].time` whenever a manager's write changes a field, so the entry of
the main resource (no `subresource`: not a status write) that owns `spec.heartbeatTime` carries the
server's time of the agent's last heartbeat write (``written_at``). That time, clamped to the
operator's clock, is the sign of life at start-up, whatever the heartbeat says: a heartbeat in 2099
cannot make a silent node fresh after a restart, and one an hour behind does not make a live agent
look silent. Only where that evidence is missing (managedFields cleared) is the heartbeat itself
taken, clamped to the operator's clock, and one further ahead of it than ``SKEW_TOLERANCE_S`` is
implausible: no sign of life at all (``Seen.at`` None, so the node is Unknown, never Healthy).

Agents that renew a node Lease (``coordination.k8s.io``, the heartbeat that writes no report) are
judged the same way: a new ``renewTime`` seen on the Lease is a sign of life at the moment the
operator sees it (``observe_lease``), and a Lease already there at start-up counts from the server's
time on the managedFields entry that owns ``spec.renewTime`` (else from its ``renewTime``, clamped,
and not at all if implausibly far ahead). The later of the two signs (report, Lease) counts.

"The moment the operator sees it" holds only while the watch keeps up. A loaded API server delivers
events seconds late, and a watch resumed after a cut stream, or relisted after 410 Gone, brings the
writes made while it was away; taken as heard on arrival, an agent's last heartbeat woke a node
silent since (Unknown, "Healthy", then ``AgentSilent`` a second time for one silence). So a write the
watch brings counts from the server's time of it when that is more than ``LATE_S`` behind the
operator's clock (``_arrived``): the write was made then, whenever it arrived.

The slim caches keep only that one derived time (``WRITTEN_AT`` in the object's metadata), not the
managedFields themselves (``written``).

A heartbeat far from the operator's clock (or, for a report listed at start-up, from the server's
time of its write) is clock skew; it never changes a verdict. Each ``Seen`` carries the skew of the
write it records, and ``skew_episode`` turns it into the episode the report's status keeps
(``status.clockSkew``: the offset and since when): the node's pass writes that record first and
announces the episode (an Event and a metric) only with the write that started it. A skew present
before the operator started is therefore announced by its first pass, and a restarted operator finds
the episode in the status and stays quiet; a write within the tolerance ends it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from gpuhealth.api.status import ClockSkewRecord
from gpuhealth.api.timeutil import format_time, parse_time

# A heartbeat is stamped just before its write; anything past this is the node's clock, not latency.
SKEW_TOLERANCE_S = 120.0
# How far the API server's time of a write may trail the operator's clock when its watch event arrives
# before the event is taken to have come late (``_arrived``): the server's times are whole seconds,
# rounded down, and the two clocks may differ a little.
LATE_S = 2.0
_SECOND = dt.timedelta(seconds=1)

# Where a slim cached object keeps the server's time of its last heartbeat write (see ``written``).
WRITTEN_AT = "writtenAt"
REPORT_HEARTBEAT = "heartbeatTime"  # the report's spec field that an agent's every write stamps
LEASE_HEARTBEAT = "renewTime"  # the Lease's spec field that every renewal stamps
_NEVER = dt.datetime.min.replace(tzinfo=dt.UTC)


@dataclass(frozen=True)
class Skew:
    """A heartbeat that disagrees with the operator's clock by more than the tolerance."""

    seconds: float  # positive: the agent's clock is ahead
    heartbeat: dt.datetime

    def describe(self) -> str:
        direction = "ahead of" if self.seconds > 0 else "behind"
        return (
            f"The agent's clock is {abs(int(self.seconds))}s {direction} the operator's (heartbeatTime "
            f"{self.heartbeat.isoformat()}); freshness is judged by when the operator sees the report change"
        )


@dataclass(frozen=True, slots=True)
class Seen:
    """The last spec version of a report that the operator saw, and when (operator clock).

    ``at`` is None for a version that carries no plausible time of life (listed at start-up with a
    heartbeat far in the future and no server-side time): the agent counts as not heard from.
    ``skew`` is that write's clock skew, None within the tolerance."""

    key: tuple[str, int | str]  # (uid, generation) of a report, (uid, renewTime) of a Lease
    at: dt.datetime | None
    skew: Skew | None = None

    @property
    def skewed(self) -> bool:
        return self.skew is not None


def written_at(meta: Mapping[str, Any], field: str) -> dt.datetime | None:
    """The API server's time of the last write that changed ``spec.<field>``, from ``managedFields``.

    The server stamps an entry's ``time`` with its own clock whenever that manager's write changes
    a field, and a field belongs to the manager that last changed it; so among the entries of the
    main resource (a status write has ``subresource: status``) the ones that own ``spec.<field>``
    say when it was last written, whatever the field manager is called. A slim cached copy carries
    the time itself (``WRITTEN_AT``). None where there is no such entry.
    """
    if WRITTEN_AT in meta:
        return parse_time(meta[WRITTEN_AT])
    best: dt.datetime | None = None
    for entry in meta.get("managedFields") or ():
        if not isinstance(entry, Mapping) or entry.get("subresource"):
            continue
        spec = (entry.get("fieldsV1") or {}).get("f:spec")
        if not isinstance(spec, Mapping) or f"f:{field}" not in spec:
            continue
        t = parse_time(entry.get("time"))
        if t is not None and (best is None or t > best):
            best = t
    return best


def written(meta: Mapping[str, Any], field: str) -> dict[str, str]:
    """What a slim copy of ``meta`` keeps for ``written_at``: the one time, not the managedFields."""
    t = written_at(meta, field)
    return {} if t is None else {WRITTEN_AT: t.strftime("%Y-%m-%dT%H:%M:%SZ")}


def _skew(heartbeat: dt.datetime, reference: dt.datetime) -> Skew | None:
    seconds = (heartbeat - reference).total_seconds()
    return Skew(seconds, heartbeat) if abs(seconds) > SKEW_TOLERANCE_S else None


def _listed(
    heartbeat: dt.datetime, server: dt.datetime | None, now: dt.datetime
) -> tuple[dt.datetime | None, Skew | None]:
    """When an agent listed at start-up was last heard from, and its clock's skew then.

    The server's time of the write when the object has it (clamped to our clock); else the heartbeat,
    clamped, unless it is further ahead than any latency explains: then nothing plausible is known
    (and the skew is measured against our clock, the only one left).
    """
    if server is not None:
        return min(server, now), _skew(heartbeat, server)
    if (heartbeat - now).total_seconds() > SKEW_TOLERANCE_S:
        return None, _skew(heartbeat, now)
    return min(heartbeat, now), None


def _arrived(server: dt.datetime | None, now: dt.datetime) -> dt.datetime:
    """When a write that a watch event (or a relist) brings now was made: now, unless the API server's
    time of it says it was made well before (a lagging watch, a stream resumed after a cut, a relist
    after 410 Gone); then that time, rounded up to the end of the second it names, so never earlier
    than the write itself. Without the server's time (managedFields cleared), now."""
    if server is None:
        return now
    made = server + _SECOND
    return made if (now - made).total_seconds() > LATE_S else now


def _key(body: Mapping[str, Any]) -> tuple[str, int] | None:
    meta = body.get("metadata") or {}
    gen = meta.get("generation")
    if not isinstance(gen, int):
        return None
    return (str(meta.get("uid") or ""), gen)


def observe(prior: Seen | None, body: Mapping[str, Any], now: dt.datetime, live: bool) -> Seen | None:
    """Fold one watched report into what was seen: the new record (``prior`` itself when it is no news).

    ``live`` is False for the start-up list (the write happened at an unknown time before; the
    server's time of it is taken, see the module's doc). A live write counts from now, or from the
    server's time of it where the event came late (``_arrived``). The record carries the write's skew,
    from a list as from a live write: whether to announce it is ``skew_episode``'s to say.
    """
    key = _key(body)
    heartbeat = parse_time((body.get("spec") or {}).get(REPORT_HEARTBEAT))
    if key is None or heartbeat is None:
        return None  # no heartbeat (e.g. the operator's own stub): nothing says the agent lives
    if prior is not None and prior.key == key:
        return prior  # a status write, or the same object listed again: no sign of life
    server = written_at(body.get("metadata") or {}, REPORT_HEARTBEAT)
    if not live:
        at, skew = _listed(heartbeat, server, now)
        return Seen(key, at, skew)
    at = _arrived(server, now)
    return Seen(key, at, _skew(heartbeat, at))


def skew_episode(
    seen: Seen | None, recorded: Mapping[str, Any] | None, now: dt.datetime
) -> tuple[ClockSkewRecord | None, Skew | None]:
    """The clock-skew episode the report's status should hold (``status.clockSkew``), and the skew to
    announce: only when an episode starts, that is when the status holds none yet.

    The status is where a restarted operator finds an episode it (or its predecessor) announced, so
    an episode is told once whenever it is first seen, at start-up too, and never twice. Without a
    record of the agent's writes (``seen`` None: a stub, or no heartbeat) the status stands as it is.
    The offset is kept while it stays within the tolerance of the recorded one (no status write per
    report write), and updated quietly when it moves further.
    """
    if seen is None:
        return (cast(ClockSkewRecord, dict(recorded)) if recorded else None), None
    if seen.skew is None:
        return None, None
    offset = round(seen.skew.seconds)
    if not recorded:
        return ClockSkewRecord(offsetSeconds=offset, since=format_time(now)), seen.skew
    before = recorded.get("offsetSeconds")
    if isinstance(before, int) and abs(before - offset) <= SKEW_TOLERANCE_S:
        offset = before
    return ClockSkewRecord(offsetSeconds=offset, since=str(recorded.get("since") or format_time(now))), None


def observe_lease(prior: Seen | None, lease: Mapping[str, Any], now: dt.datetime, live: bool) -> Seen | None:
    """Fold one watched Lease into when the agent was last heard from through it.

    Only a new ``renewTime`` counts (a label edited by someone else is no sign of life); the same
    Lease listed again after a dropped watch changes nothing. Listed (``live`` False), a renewal
    counts from the server's time of it, as a listed report does; watched, from now, unless the event
    came late (``_arrived``).
    """
    meta = lease.get("metadata") or {}
    raw = (lease.get("spec") or {}).get(LEASE_HEARTBEAT)
    renewed = parse_time(raw)
    if renewed is None:
        return prior
    key = (str(meta.get("uid") or ""), str(raw))
    if prior is not None and prior.key == key:
        return prior
    server = written_at(meta, LEASE_HEARTBEAT)
    if live:
        return Seen(key, _arrived(server, now))
    at, _ = _listed(renewed, server, now)
    return Seen(key, at)


def latest(*seen: Seen | None) -> Seen | None:
    """The most recent of several signs of life (report, Lease); one with no time is the oldest."""
    known = [s for s in seen if s is not None]
    return max(known, key=lambda s: s.at or _NEVER) if known else None


def heard_at(seen: Seen | None, heartbeat: dt.datetime | None) -> dt.datetime | None:
    """The time freshness is measured from: when the operator saw the last spec write.

    Without a record (no heartbeat, or a hand-built object with no generation), the agent's own
    heartbeat is used as is. A record with no plausible time gives None: never heard, so silent.
    """
    return seen.at if seen is not None else heartbeat
