"""The fleet grouped above the node for `kubectl gpuhealth status`: each NVLink domain and each rack
with its nodes, how many are out of service or degraded, and why. Pure: it reads the fleet's rows.

A domain leaves and returns as one (``evaluation/domains.py``), and a rack's power brake is one
finding: on-call reads them here as one line each instead of N node rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuhealth.api.names import State


class Row(Protocol):
    """What grouping reads of a fleet row (``cli/fleet.py`` ``Row``)."""

    @property
    def domain(self) -> str: ...
    @property
    def rack(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def out_of_service(self) -> bool: ...


@dataclass
class Group:
    kind: str  # "Domain" or "Rack"
    value: str
    nodes: int = 0
    out: int = 0
    degraded: int = 0
    reasons: dict[str, int] = field(default_factory=dict)  # reason -> nodes not Healthy for it

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.value,
            "nodes": self.nodes,
            "outOfService": self.out,
            "degraded": self.degraded,
            "reasons": dict(self.reasons),
        }

    def line(self) -> str:
        why = ", ".join(f"{r} {n}" for r, n in sorted(self.reasons.items()))
        return (
            f"{self.kind} {self.value}: {self.nodes} node{'s' if self.nodes != 1 else ''}, {self.out} out of service, "
            f"{self.degraded} degraded" + (f" ({why})" if why else "")
        )


def groups(rows: Iterable[Row]) -> list[Group]:
    """Every domain and rack the rows name, domains first, each sorted by name."""
    found: dict[tuple[str, str], Group] = {}
    for r in rows:
        for kind, value in (("Domain", r.domain), ("Rack", r.rack)):
            if not value:
                continue
            g = found.setdefault((kind, value), Group(kind, value))
            g.nodes += 1
            g.out += r.out_of_service
            g.degraded += r.state == State.DEGRADED
            if r.state not in ("", State.HEALTHY) and r.reason:
                g.reasons[r.reason] = g.reasons.get(r.reason, 0) + 1
    return [found[k] for k in sorted(found)]


def footer(rows: Iterable[Row]) -> list[str]:
    """One line per NVLink domain and rack (none when no node carries either label)."""
    return [g.line() for g in groups(rows)]
