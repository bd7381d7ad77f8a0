"""The operator's caches: slim copies of Nodes, reports and policies, the pods (``pods.py``), their
indexes, and the decision records. Nothing here talks to the API or decides; handlers feed it, the node reconciler
reads it and records what it wrote.

Watched objects are slimmed on the way in (``slim.py``): only what is read is kept, with shared
strings, so memory per node stays small.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuhealth.api.devices import DeviceState
from gpuhealth.api.names import GPU_RESOURCE, SLOW_SIGNALS, Signal
from gpuhealth.api.nodes import node_gpus
from gpuhealth.api.policy import Policy, PolicyError, parse_policy, select_policy
from gpuhealth.api.status import Record, StoredStatus
from gpuhealth.controller.state.pods import PodIndex
from gpuhealth.controller.state.slim import slim_node, slim_report
from gpuhealth.controller.state.tally import EMPTY, Share, Tallies, Tally
from gpuhealth.evaluation.domains import holds_domain
from gpuhealth.evaluation.freshness import REPORT_HEARTBEAT, Seen, latest, written_at
from gpuhealth.kube.versions import newer, older


def gpu_capacity(node: Mapping[str, Any]) -> int | None:
    cap = ((node.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE)
    try:
        return int(cap) if cap is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class PolicyUpdate:
    """What caching a policy's watch event changed (``Store.put_policy``)."""

    changed: bool  # added, deleted, its spec decides differently, or refused/accepted anew
    error: str | None = None  # the reason, where the policy is newly refused


class Store:
    """Caches and indexes. Methods that take a watched body return the node names it may affect.

    Every cache is private: read through read-only views and written only through methods, so
    that each write also updates the node's share of its policy's counts (``tally.py``) and no
    caller edits a cached object behind the indexes' back.
    """

    def __init__(self) -> None:
        self._nodes: dict[str, dict[str, Any]] = {}
        self._reports: dict[str, dict[str, Any]] = {}
        self._policies: dict[str, Policy] = {}
        self._policy_objs: dict[str, dict[str, Any]] = {}
        self._invalid_policies: dict[str, str] = {}
        self._records: dict[str, Record] = {}
        # name -> (the cached report, its status typed): one StoredStatus per version of a report
        self._statuses: dict[str, tuple[Mapping[str, Any], StoredStatus]] = {}
        self._written_rv: dict[str, str] = {}
        self._first_seen: dict[str, dt.datetime] = {}
        self._seen: dict[str, Seen] = {}  # when each agent last wrote its report's spec (our clock)
        self._renewed: dict[str, Seen] = {}  # when each agent's node Lease was last seen renewed
        self.pods = PodIndex()  # pods by node, gang and workload (``pods.py``)
        self._governing: dict[str, tuple[Policy | None, list[Policy]]] = {}
        self._tallies = Tallies()
        # label key -> value -> nodes: the NVLink domains and racks (``topology.py``), built for a key
        # the first time it is asked and kept as Nodes change, so a member's pass never walks the fleet.
        self._by_label: dict[str, dict[str, set[str]]] = {}

    @property
    def nodes(self) -> Mapping[str, dict[str, Any]]:
        return self._nodes

    @property
    def reports(self) -> Mapping[str, dict[str, Any]]:
        return self._reports

    @property
    def records(self) -> Mapping[str, Record]:
        return self._records

    def status(self, name: str) -> StoredStatus:
        """The status of ``name``'s cached report, typed (``api/status.py`` ``StoredStatus``): one per
        version of the report, each part parsed when first read, shared by every reader of that version
        (the node's pass, the sweeper, the tallies, its domain's and rack's members); empty without a
        report."""
        report = self._reports.get(name)
        if report is None:
            return StoredStatus.of(None)
        hit = self._statuses.get(name)
        if hit is None or hit[0] is not report:
            hit = (report, StoredStatus.of(report))
            self._statuses[name] = hit
        return hit[1]

    @property
    def policies(self) -> Mapping[str, Policy]:
        """The valid policies by name (a refused one is not here; its object is in ``policy_objs``)."""
        return self._policies

    @property
    def policy_objs(self) -> Mapping[str, dict[str, Any]]:
        """Every policy object as last watched, valid or not (its status is written from it)."""
        return self._policy_objs

    # -- nodes -----------------------------------------------------------------------------------

    def put_node(self, name: str, body: Mapping[str, Any]) -> None:
        """Cache a Node; which policy governs it is re-computed only when its labels change."""
        old = self._nodes.get(name)
        self._nodes[name] = slim_node(body)
        if old is None or (old.get("metadata") or {}).get("labels") != (body.get("metadata") or {}).get("labels"):
            self._governing.pop(name, None)
            self._index_labels(name, old, self._nodes[name])
        self._recount(name)

    def members(self, key: str, value: str) -> tuple[str, ...]:
        """The cached nodes whose label ``key`` is ``value``, sorted."""
        index = self._by_label.get(key)
        if index is None:
            index = self._by_label[key] = {}
            for n, obj in self._nodes.items():
                v = _labels(obj).get(key)
                if v:
                    index.setdefault(v, set()).add(n)
        return tuple(sorted(index.get(value, ())))

    def _index_labels(self, name: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        for key, index in self._by_label.items():
            before, after = _labels(old).get(key), _labels(new).get(key)
            if before == after:
                continue
            if before and before in index:
                index[before].discard(name)
                if not index[before]:
                    del index[before]
            if after:
                index.setdefault(after, set()).add(name)

    def reflect_node(self, name: str, body: Mapping[str, Any]) -> None:
        """Cache what one of our own Node writes (or a re-read) returned, so the next pass does not repeat
        it before the watch brings it; but never bring back a Node the watch has deleted meanwhile (or
        one of the same name since re-created): a write answered just before a deletion can resume after
        the DELETED event was applied, and a Node cached again then would be passed, and fail, forever,
        and its report never collected."""
        old = self._nodes.get(name)
        uid = (body.get("metadata") or {}).get("uid")
        if old is None or (uid and (old.get("metadata") or {}).get("uid") not in (None, uid)):
            return
        if _behind(body, old):
            return  # the watch brought a newer Node while the write was answered (see ``wrote``)
        self.put_node(name, body)

    def saw_node(self, name: str, now: dt.datetime) -> None:
        """Note when the operator first saw ``name`` (an agent gets its silence grace from then)."""
        self._first_seen.setdefault(name, now)

    def first_seen(self, name: str) -> dt.datetime | None:
        return self._first_seen.get(name)

    def forget_node(self, name: str) -> None:
        """A Node deleted: its cache, its record and its share go (its report stays until collected)."""
        self._index_labels(name, self._nodes.get(name), None)
        self._nodes.pop(name, None)
        self._records.pop(name, None)
        self._governing.pop(name, None)
        self._tallies.set(name, None)

    def governing(self, name: str) -> tuple[Policy | None, list[Policy]]:
        """The policy that governs a cached node (and those it overrides), memoized per node."""
        hit = self._governing.get(name)
        if hit is None:
            node = self._nodes.get(name)
            labels = ((node or {}).get("metadata") or {}).get("labels") or {}
            hit = select_policy(list(self._policies.values()), labels)
            if node is not None:
                self._governing[name] = hit
        return hit

    # -- per-policy counts -----------------------------------------------------------------------

    def tally(self, policy: Policy) -> Tally:
        """The counts of the nodes ``policy`` governs (read only). A superseded copy of a policy
        governs no node: the counts are empty for it, as a fresh recount would find."""
        if self._policies.get(policy.name) is not policy:
            return EMPTY
        return self._tallies.of(policy.name)

    def counted_out(self, policy: Policy, name: str) -> bool:
        """Whether ``name`` counts as out of service in ``policy``'s tally."""
        s = self._tallies.share(name)
        return s is not None and s.out and s.policy == policy.name and self._policies.get(policy.name) is policy

    def holding_domains(self, policy: Policy) -> frozenset[str]:
        """The nodes ``policy`` governs that are out of service for their NVLink domain's episode
        (``domains.holds_domain``); none for a superseded copy of a policy, as with ``tally``."""
        if self._policies.get(policy.name) is not policy:
            return frozenset()
        return self._tallies.holding_domains(policy.name)

    def _share(self, name: str) -> Share | None:
        node = self._nodes.get(name)
        if node is None:
            return None
        winner, others = self.governing(name)
        if winner is None:
            return None
        rec = self._records.get(name)
        state = rec.state if rec is not None else Record().state
        devices = self.status(name).devices.values()
        slow_node = rec is not None and rec.out_of_service and rec.reason in SLOW_SIGNALS
        return Share(
            policy=winner.name,
            overridden=tuple(o.name for o in others),
            state=str(state),
            out=rec is not None and rec.out_of_service,
            held=rec is not None and rec.held_by_breaker,
            gpus=self.gpus_of(name),
            gpus_out=self.gpus_out(name),
            gpus_held=sum(1 for d in devices if d.held_by_breaker and d.state == DeviceState.IN_SERVICE),
            node_gpus=node_gpus(node) or 0,
            domain=holds_domain(rec),
            slow=slow_node,
            gpus_slow=self.gpus_out(name)
            if slow_node
            else sum(1 for d in devices if d.state != DeviceState.IN_SERVICE and d.reason in SLOW_SIGNALS),
            device_states=tuple(sorted(Counter(str(d.state) for d in devices).items())) if devices else (),
            peers=sum(1 for d in devices if d.state != DeviceState.IN_SERVICE and d.reason == Signal.NVLINK_PEER),
        )

    def _recount(self, name: str) -> None:
        self._tallies.set(name, self._share(name))

    def _recount_all(self) -> None:
        self._tallies.reset(self._policies)
        for name in self._nodes:
            self._recount(name)

    # -- reports and records ---------------------------------------------------------------------

    def put_report(self, name: str, body: Mapping[str, Any]) -> None:
        """Cache a watched report. Our own writes update the record at once (``wrote``); adopt a
        watched status only if it is newer than our last write (another writer, e.g. a previous
        leader), never an older echo of it. Nor does the cached copy go back to an older version than
        one it holds: a watch running behind delivers the versions before our last write's answer after
        it, and a pass that read such an echo took a GPU's ladder for never started and created its reset
        Job a second time."""
        if _behind(body, self._reports.get(name)):
            return
        self._reports[name] = slim_report(body)
        status = self.status(name)
        if status.written and (
            name not in self._records or newer(body["metadata"].get("resourceVersion"), self._written_rv.get(name))
        ):
            self._records[name] = status.record
        self._recount(name)

    def reread_report(self, name: str, body: Mapping[str, Any]) -> None:
        """A report read fresh after a conflict: its status is the record, whoever wrote it. A report
        with no status yet (the agent's write won the race with a node's first decision) gives no
        record, as in ``put_report``: the node is still never evaluated, and a new node's burn-in
        (``node_validator.py``) still starts on the retry."""
        if _behind(body, self._reports.get(name)):
            return  # the watch brought a newer one meanwhile, and with it the record
        self._reports[name] = slim_report(body)
        status = self.status(name)
        if status.written:
            self._records[name] = status.record
        self._recount(name)

    def wrote(self, name: str, result: Mapping[str, Any]) -> None:
        """Reflect a status write of ours (the API's answer), unless the watch has brought a newer report
        meanwhile: the answer resumes the writing pass only after the loop has run what was queued
        before it, and an agent's next write (a new XID) can be among that. Cached over it, the older
        answer hid the fault from every later pass until the agent wrote again."""
        self._written_rv[name] = str(result["metadata"].get("resourceVersion", ""))
        if not _behind(result, self._reports.get(name)):
            self._reports[name] = slim_report(result)
        self._recount(name)

    def created(self, name: str, result: Mapping[str, Any]) -> None:
        """Reflect a report we created (a stub with no status yet), or the one found in its place."""
        if _behind(result, self._reports.get(name)):
            return
        self._reports[name] = slim_report(result)
        self._recount(name)

    def drop_report(self, name: str) -> None:
        """The report is gone (deleted, or collected with its Node)."""
        self._reports.pop(name, None)
        self._statuses.pop(name, None)
        self._seen.pop(name, None)
        self._recount(name)

    def set_record(self, name: str, record: Record) -> None:
        """The decision record of ``name``, as just written (or found unchanged)."""
        self._records[name] = record
        self._recount(name)

    def forget_records(self) -> None:
        """Another replica may have written meanwhile: re-read records before deciding again."""
        self._records.clear()
        self._written_rv.clear()
        self._recount_all()

    def freshest_first(self) -> list[str]:
        """The fleet in the order its agents last wrote their reports, newest first (the API server's
        time of the write, ``freshness.written_at``). A fault reported while the operator was down is
        among the newest writes, so a start-up passes it first rather than somewhere in a fleet-wide
        backlog (at 10,000 nodes, seconds of passes)."""

        def written(name: str) -> float:
            at = written_at(((self._reports.get(name) or {}).get("metadata") or {}), REPORT_HEARTBEAT)
            return at.timestamp() if at is not None else 0.0

        return sorted(self._nodes, key=written, reverse=True)

    def heard(self, name: str) -> Seen | None:
        """When the node's agent was last heard from: its report's last spec write or Lease renewal."""
        return latest(self._seen.get(name), self._renewed.get(name))

    def report_seen(self, name: str) -> Seen | None:
        """The agent's last report write, as the operator saw it (``evaluation/freshness.py``)."""
        return self._seen.get(name)

    def set_report_seen(self, name: str, seen: Seen | None) -> None:
        """Record the agent's last report write; ``None`` forgets it (no sign of life to count)."""
        if seen is None:
            self._seen.pop(name, None)
        else:
            self._seen[name] = seen

    def lease_seen(self, name: str) -> Seen | None:
        """The agent's last Lease renewal, as the operator saw it."""
        return self._renewed.get(name)

    def set_lease_seen(self, name: str, seen: Seen | None) -> None:
        """Record the agent's last Lease renewal; ``None`` forgets it (its Node is gone)."""
        if seen is None:
            self._renewed.pop(name, None)
        else:
            self._renewed[name] = seen

    # -- policies --------------------------------------------------------------------------------

    def put_policy(self, name: str, body: Mapping[str, Any] | None) -> PolicyUpdate:
        """Cache (or, with ``None``, forget) a policy: whether what it decides changed, and the error
        if it is newly refused. Only a change re-selects and re-counts every node (once per policy
        change, never per node event): the operator's own status writes come back as watch events
        too, and they change nothing a node pass reads."""
        before = self._decides(name)
        try:
            error = self._put_policy(name, body)
        finally:
            changed = self._decides(name) != before
            if changed:
                self._governing.clear()
                self._recount_all()
        return PolicyUpdate(changed=changed, error=error)

    def _decides(self, name: str) -> tuple[bool, Policy | None, str | None]:
        """What of a cached policy a node pass reads: that it exists, its parsed spec, its refusal."""
        return name in self._policy_objs, self._policies.get(name), self._invalid_policies.get(name)

    def _put_policy(self, name: str, body: Mapping[str, Any] | None) -> str | None:
        if body is None:
            self._policies.pop(name, None)
            self._policy_objs.pop(name, None)
            self._invalid_policies.pop(name, None)
            return None
        self._policy_objs[name] = dict(body)
        try:
            parsed = parse_policy(body)
            if self._policies.get(name) != parsed:  # an equal one stays: cached selections point at it
                self._policies[name] = parsed
            self._invalid_policies.pop(name, None)
        except PolicyError as e:
            self._policies.pop(name, None)
            if self._invalid_policies.get(name) != str(e):
                self._invalid_policies[name] = str(e)
                return str(e)
        return None

    # -- GPUs (the breaker's GPU budget) -----------------------------------------------------------

    def gpus_of(self, node: str) -> int:
        """The node's GPUs: as last reported, else its advertised capacity."""
        total = self.status(node).total_gpus
        if total is not None and total > 0:
            return total
        return gpu_capacity(self.nodes.get(node) or {}) or 0

    def gpus_out(self, node: str) -> int:
        """GPUs gpuhealth holds out on ``node``: all of them while the node is out, else those held one by one."""
        rec = self.records.get(node)
        if rec is not None and rec.out_of_service:
            return self.gpus_of(node)
        return sum(1 for d in self.status(node).devices.values() if d.state != DeviceState.IN_SERVICE)


def _behind(body: Mapping[str, Any], cached: Mapping[str, Any] | None) -> bool:
    """Whether a write's answer (or a read) is older than the copy the watch has cached meanwhile."""
    if cached is None:
        return False
    rv = (body.get("metadata") or {}).get("resourceVersion")
    return older(rv, (cached.get("metadata") or {}).get("resourceVersion"))


def _labels(node: Mapping[str, Any] | None) -> Mapping[str, str]:
    return ((node or {}).get("metadata") or {}).get("labels") or {}
