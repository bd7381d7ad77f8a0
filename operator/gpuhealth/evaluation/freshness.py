"""When the agent was last heard from, by the operator's clock, not the agent's.

An agent's `heartbeatTime` is written with the node's clock. A node whose clock runs ahead would
otherwise look fresh long after its agent died (a heartbeat ten minutes in the future stays "fresh"
for ten minutes plus the silence period), and one whose clock runs behind would look silent while
it reports. So freshness is judged by when the operator *saw the report's spec change*: the API
server bumps `metadata.generation` on every spec write and never on a status write, so a new
(uid, generation) is a sign of life that no clock on the node can fake.

For reports that were already there when the operator started, nobody saw the write: the agent's
heartbeat is taken, clamped to the operator's clock (a future heartbeat counts as "now", so silence
is still detected within the silence period after start-up).

Agents that renew a node Lease (``coordination.k8s.io``, the heartbeat that writes no report) are
judged the same way: a new ``renewTime`` seen on the Lease is a sign of life at the moment the
operator sees it (``observe_lease``), and a Lease already there at start-up counts from its
``renewTime``, clamped to the operator's clock. The later of the two signs (report, Lease) counts.

A live heartbeat far from the operator's clock is flagged as clock skew (an Event and a metric, once
per episode); it never changes a verdict.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuhealth.api.timeutil import parse_time

# A heartbeat is stamped just before its write; anything past this is the node's clock, not latency.
SKEW_TOLERANCE_S = 120.0


@dataclass(frozen=True, slots=True)
class Seen:
    """The last spec version of a report that the operator saw, and when (operator clock)."""

    key: tuple[str, int | str]  # (uid, generation) of a report, (uid, renewTime) of a Lease
    at: dt.datetime
    skewed: bool = False


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


def _key(body: Mapping[str, Any]) -> tuple[str, int] | None:
    meta = body.get("metadata") or {}
    gen = meta.get("generation")
    if not isinstance(gen, int):
        return None
    return (str(meta.get("uid") or ""), gen)


def observe(
    prior: Seen | None, body: Mapping[str, Any], now: dt.datetime, live: bool
) -> tuple[Seen | None, Skew | None]:
    """Fold one watched report into what was seen; returns the new record and a skew to announce.

    ``live`` is False for the start-up list (the write happened at an unknown time before).
    A skew is returned only when it starts (not again while it lasts).
    """
    key = _key(body)
    heartbeat = parse_time((body.get("spec") or {}).get("heartbeatTime"))
    if key is None or heartbeat is None:
        return None, None  # no heartbeat (e.g. the operator's own stub): nothing says the agent lives
    if prior is not None and prior.key == key:
        return prior, None  # a status write, or the same object listed again: no sign of life
    if not live:
        at = min(heartbeat, now)
        return Seen(key, at), None
    skew = (heartbeat - now).total_seconds()
    skewed = abs(skew) > SKEW_TOLERANCE_S
    announce = skewed and not (prior is not None and prior.skewed)
    return Seen(key, now, skewed), (Skew(skew, heartbeat) if announce else None)


def observe_lease(prior: Seen | None, lease: Mapping[str, Any], now: dt.datetime, live: bool) -> Seen | None:
    """Fold one watched Lease into when the agent was last heard from through it.

    Only a new ``renewTime`` counts (a label edited by someone else is no sign of life); the same
    Lease listed again after a dropped watch changes nothing.
    """
    meta = lease.get("metadata") or {}
    raw = (lease.get("spec") or {}).get("renewTime")
    renewed = parse_time(raw)
    if renewed is None:
        return prior
    key = (str(meta.get("uid") or ""), str(raw))
    if prior is not None and prior.key == key:
        return prior
    return Seen(key, now if live else min(renewed, now))


def latest(*seen: Seen | None) -> Seen | None:
    """The most recent of several signs of life (report, Lease)."""
    known = [s for s in seen if s is not None]
    return max(known, key=lambda s: s.at) if known else None


def heard_at(seen: Seen | None, heartbeat: dt.datetime | None) -> dt.datetime | None:
    """The time freshness is measured from: when the operator saw the last spec write.

    Without a record (no heartbeat, or a hand-built object with no generation), the agent's own
    heartbeat is used as is.
    """
    return seen.at if seen is not None else heartbeat
