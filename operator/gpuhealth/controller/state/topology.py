"""A node's domain and rack as the operator's caches see them: the members, their facts and records,
handed to the pure correlation (``evaluation/domains.py``). Reads the store only; writes nothing.

Membership is read off the cached Nodes' labels (the slim Node keeps every label), so it follows a
relabelled node at its next watch event; every member of a domain is governed by the asking node's
policy for the breaker's count (a member another policy governs is left to that policy).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from gpuhealth.api.names import Signal, State
from gpuhealth.api.policy import Policy
from gpuhealth.api.status import Record
from gpuhealth.controller import metrics
from gpuhealth.controller.state.store import Store
from gpuhealth.evaluation import domains
from gpuhealth.evaluation.findings import Assessment, Finding


@dataclass(frozen=True)
class DomainView:
    """The asking node's NVLink domain: its members under the same policy, its finding (None while no
    GPU of the domain asks for its recovery) and whether the decision is already recorded."""

    key: str
    value: str
    members: tuple[str, ...]
    finding: Finding | None
    decided: bool


class Topology:
    def __init__(self, store: Store) -> None:
        self._store = store

    def _members(self, policy: Policy, key: str, value: str) -> tuple[str, ...]:
        return tuple(n for n in self._store.members(key, value) if self._store.governing(n)[0] is policy)

    def domain(self, name: str, policy: Policy, now: dt.datetime) -> DomainView | None:
        key = policy.topology.domain_label
        value = domains.labels_of(self._store.nodes.get(name)).get(key)
        if not value:
            return None
        nodes = self._members(policy, key, value) or (name,)
        faults = [f for n in nodes for f in domains.imex_faults(n, self._store.reports.get(n))]
        # Since the faulting agent's write was seen (the operator's clock): one time for every member.
        since = min((self._first_seen(n) or now for n in {f.node for f in faults}), default=now)
        finding = domains.domain_finding(key, value, nodes, faults, since)
        metrics.DOMAIN_FINDINGS.labels(policy.name, value).set(len(nodes) if finding else 0)
        return DomainView(key, value, nodes, finding, domains.domain_decided(self._store.records, nodes))

    def committed(self, policy: Policy) -> frozenset[str]:
        """The members of ``policy``'s decided NVLink domains not yet counted out: a member is out for
        its domain's episode (``domains.holds_domain``), so each of the others leaves at its next
        pass while the fault lasts, or may at a relapse while the episode does. The breaker counts
        them as out (``breaker.py``) from the first member's record until the last is back, so no
        other node or domain is admitted into their slots, by this operator or one restarted after
        a kill at any line. Costs the members of the domains out, not the fleet."""
        key = policy.topology.domain_label
        seen: set[str] = set()
        out: set[str] = set()
        for n in self._store.holding_domains(policy):
            value = domains.labels_of(self._store.nodes.get(n)).get(key)
            if not value or value in seen:
                continue
            seen.add(value)
            out.update(m for m in self._members(policy, key, value) if not self._store.counted_out(policy, m))
        return frozenset(out)

    def domain_return(
        self, name: str, policy: Policy, view: DomainView | None, prior: Record, now: dt.datetime
    ) -> domains.DomainReturn:
        """What ``name``, on probation for its domain, waits for before it returns: the other members
        still out for the domain, read from their written statuses (``domains.domain_return``)."""
        if view is None or prior.state != State.RECOVERING or prior.reason != Signal.IMEX_DOMAIN:
            return domains.DomainReturn()
        others = {n: self._store.status(n) for n in view.members if n != name}
        return domains.domain_return(name, prior, others, policy.probation_s, now)

    def _first_seen(self, node: str) -> dt.datetime | None:
        seen = self._store.report_seen(node)
        return None if seen is None else seen.at

    def rack(self, name: str, policy: Policy, a: Assessment, now: dt.datetime) -> Assessment:
        """``a`` with the node's power-brake findings replaced by its rack's one finding, when enough of
        the rack is under a brake or the rack's episode lasts (``domains.rack_episode``); the
        ``gpuhealth_rack_findings`` gauge follows the rack's count, to 0 once no node is braked."""
        key = policy.topology.rack_label
        value = domains.labels_of(self._store.nodes.get(name)).get(key)
        own = any(f.signal == Signal.POWER_BRAKE for f in a.findings)
        if not value or not (own or domains.rack_episode([self._store.status(name)])):
            return a  # neither braked itself nor leaving the rack's episode: nothing of the rack's to do
        nodes = self._members(policy, key, value) or (name,)
        braked = [n for n in nodes if domains.power_braked(self._store.reports.get(n), policy)]
        # Below minNodes the rack's episode may still be on (a node's written status carries its
        # finding): the brake lifting node by node leaves the last braked ones with the rack's finding.
        episode = len(braked) < policy.power_brake.rack.min_nodes and domains.rack_episode(
            self._store.status(n) for n in nodes
        )
        finding = domains.rack_finding(policy, key, value, braked, now, episode)
        # A node whose brake lifted passes here once more, so the gauge (and its alert) ends with the episode.
        metrics.RACK_FINDINGS.labels(policy.name, value, "RackPowerBrake").set(len(braked) if finding else 0)
        return domains.with_rack(a, finding) if own else a
