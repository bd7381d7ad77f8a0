"""Per-policy counts kept up to date as nodes, reports, records and policies change.

The breaker asks, for every node about to leave service and under its policy's lock, how many
nodes and GPUs the policy governs and how many are out; the policy status asks the same per state.
Walking the fleet for each question made the cost of one fault grow with the fleet. Instead every
cached node carries its ``Share`` (which policy governs it and what it adds to that policy's
counts); the store replaces a node's share whenever something it is computed from changes, and
the ``Tally`` of each policy is the sum of its nodes' shares, adjusted by the difference only. A
policy change re-selects every node once.

Pure bookkeeping: no clock, no API, no decision.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Share:
    """What one node adds to the counts of the policy that governs it."""

    policy: str
    overridden: tuple[str, ...]  # matching policies of lower priority: the node counts as their overlap
    state: str  # the record's state (Healthy without a record)
    out: bool  # it has a record and the record is out of service
    held: bool  # the breaker holds its quarantine back
    gpus: int  # its GPUs: as last reported, else its advertised capacity
    gpus_out: int  # GPUs gpuhealth holds out: all while the node is out, else those held one by one
    gpus_held: int  # GPUs whose own quarantine the GPU budget holds back
    node_gpus: int  # its GPU count label, else capacity (the capacity gauge's count)
    slow: bool = False  # out of service for a slow, not broken, signal (api/names.py SLOW_SIGNALS)
    # GPUs held out for a slow signal: all of ``gpus_out`` while the node is out for one, else those
    # held out one by one for one (they spend maxSlow in GPUs, not maxUnhealthyGPUs)
    gpus_slow: int = 0
    # out of service for its NVLink domain's episode (``domains.holds_domain``): the domain's other
    # members follow it, and the breaker keeps their slots (``Tallies.holding_domains``)
    domain: bool = False
    # its GPUs with a record, by their own state (``gpuhealth_devices``), and of those the ones held out
    # only as the NVLink peer of a GPU under repair (``gpuhealth_peer_holds``)
    device_states: tuple[tuple[str, int], ...] = ()
    peers: int = 0


@dataclass(slots=True)
class Tally:
    """The sum of the shares of the nodes one policy governs."""

    nodes: int = 0
    out: int = 0
    held: int = 0
    gpus: int = 0
    gpus_out: int = 0
    gpus_held: int = 0
    slow: int = 0  # of ``out``: held out for a slow signal, counted against maxSlow instead
    gpus_slow: int = 0  # of ``gpus_out``: held out for a slow signal (degraded capacity, apart from broken)
    counts: dict[str, int] = field(default_factory=dict)  # state -> nodes
    gpus_by_state: dict[str, int] = field(default_factory=dict)  # state -> node_gpus, out-of-service states
    overlaps: dict[str, int] = field(default_factory=dict)  # higher-priority policy -> nodes it took
    devices: dict[str, int] = field(default_factory=dict)  # GPU state -> GPUs with a record in it
    peer_holds: int = 0  # GPUs held out only as an NVLink peer

    def add(self, s: Share, sign: int) -> None:
        self.nodes += sign
        self.out += sign * s.out
        self.held += sign * s.held
        self.gpus += sign * s.gpus
        self.gpus_out += sign * s.gpus_out
        self.gpus_held += sign * s.gpus_held
        self.slow += sign * s.slow
        self.gpus_slow += sign * s.gpus_slow
        _bump(self.counts, s.state, sign)
        for state, n in s.device_states:
            _bump(self.devices, state, sign * n)
        self.peer_holds += sign * s.peers
        if s.out:
            _bump(self.gpus_by_state, s.state, sign * s.node_gpus)


def _bump(counts: dict[str, int], key: str, by: int) -> None:
    """Add ``by`` to ``counts[key]``; a count back at zero leaves the map, as if never counted."""
    n = counts.get(key, 0) + by
    if n:
        counts[key] = n
    else:
        counts.pop(key, None)


EMPTY = Tally()


class Tallies:
    """Every node's share and every policy's tally."""

    def __init__(self) -> None:
        self._shares: dict[str, Share] = {}
        self._tallies: dict[str, Tally] = {}
        self._domains: dict[str, set[str]] = {}  # policy -> nodes whose share is ``domain``

    def reset(self, policies: Iterable[str]) -> None:
        """Start again from no node (a policy changed: every node is re-selected)."""
        self._shares.clear()
        self._tallies = {p: Tally() for p in policies}
        self._domains.clear()

    def share(self, node: str) -> Share | None:
        return self._shares.get(node)

    def of(self, policy: str) -> Tally:
        """The policy's tally; a policy governing no node (or unknown) has the empty one. Read only."""
        return self._tallies.get(policy, EMPTY)

    def holding_domains(self, policy: str) -> frozenset[str]:
        """The nodes of ``policy`` out of service for their NVLink domain's episode (few: each is out)."""
        return frozenset(self._domains.get(policy, ()))

    def set(self, node: str, share: Share | None) -> None:
        """Replace the node's share (``None``: it counts for no policy)."""
        old = self._shares.pop(node, None)
        if old is not None:
            self._apply(old, -1)
            if old.domain:
                self._domains[old.policy].discard(node)
        if share is not None:
            self._shares[node] = share
            self._apply(share, 1)
            if share.domain:
                self._domains.setdefault(share.policy, set()).add(node)

    def _apply(self, s: Share, sign: int) -> None:
        self._tallies.setdefault(s.policy, Tally()).add(s, sign)
        for o in s.overridden:
            _bump(self._tallies.setdefault(o, Tally()).overlaps, s.policy, sign)
