"""The cache feeders: what each watch event (and each policy event from Kopf) does to the store and
the work queue. No I/O and no decisions: they keep the caches current and queue the nodes an event
may affect, the ones whose verdict can change ahead of the rest (an agent's new facts, a release an
SRE asked for). The runtime builds one :class:`Feeders` and hands its methods to the watches.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from gpuhealth.api.devices import DeviceState
from gpuhealth.api.names import (
    API_VERSION,
    APPROVE_ANNOTATION,
    APPROVE_GPU_ANNOTATION,
    APPROVER_ANNOTATION_PREFIX,
    POLICY_KIND,
    REJECT_ANNOTATION,
    REJECT_GPU_ANNOTATION,
    RELEASE_ANNOTATION,
    RELEASE_GPU_ANNOTATION,
    State,
)
from gpuhealth.api.pods import shows_failure
from gpuhealth.controller import metrics
from gpuhealth.controller.intake.workqueue import WorkQueue
from gpuhealth.controller.state.breaker import Breaker
from gpuhealth.controller.state.slim import same_but_version
from gpuhealth.controller.state.store import Store
from gpuhealth.evaluation import domains, freshness
from gpuhealth.kube.events import EventSink

log = logging.getLogger(__name__)

REPLACE_BATCH = 1000  # pods of a relist applied between turns of the event loop

# What an SRE asks of a Node (kubectl gpuhealth release, approve, reject): a change queues a pass.
COMMANDS = (
    RELEASE_ANNOTATION,
    RELEASE_GPU_ANNOTATION,
    APPROVE_ANNOTATION,
    APPROVE_GPU_ANNOTATION,
    REJECT_ANNOTATION,
    REJECT_GPU_ANNOTATION,
)


def _commands(node: Mapping[str, Any] | None) -> tuple[Any, ...]:
    annotations = ((node or {}).get("metadata") or {}).get("annotations") or {}
    # and each approval that names its approver (gpuhealth.dev/approver.<slot>, approver-gpu-<i>.<slot>)
    named = tuple(sorted((k, str(v)) for k, v in annotations.items() if str(k).startswith(APPROVER_ANNOTATION_PREFIX)))
    return (*(annotations.get(k) for k in COMMANDS), named)


def _replace(
    fresh: list[dict[str, Any]], cached: Mapping[str, Any], feed: Callable[[str, Mapping[str, Any]], None]
) -> None:
    """Feed a fresh full list as events: a DELETED for each cached name missing from it, then each item."""
    names = {o["metadata"]["name"] for o in fresh}
    for name in [n for n in cached if n not in names]:
        feed("DELETED", {"metadata": {"name": name}})
    for o in fresh:
        feed("MODIFIED", o)


class Feeders:
    def __init__(
        self,
        *,
        store: Store,
        queue: WorkQueue,
        breaker: Breaker,
        suspect_gone: Callable[[str], None],
        events: EventSink,
        clock: Callable[[], dt.datetime],
    ) -> None:
        self.store = store
        self.queue = queue
        self.breaker = breaker
        self.suspect_gone = suspect_gone  # the report collector's: a deleted Node's report may go
        self.events = events
        self.clock = clock

    def on_node(self, event: str | None, body: Mapping[str, Any], enqueue: bool = True) -> None:
        name = body["metadata"]["name"]
        if event == "DELETED":
            self.store.forget_node(name)
            self.store.set_lease_seen(name, None)
            self.suspect_gone(name)
            if enqueue:
                self.queue.add(name)  # the worker deletes its report if the Node is really gone
            return
        # A release an SRE just asked for goes ahead of the fleet's backlog, as an agent's new facts do.
        before = self.store.nodes.get(name)
        asked = _commands(body) != _commands(before)
        self.store.put_node(name, body)
        self.store.saw_node(name, self.clock())
        # The kubelet's periodic status update changes only what the slim copy drops: no pass for it
        # (a third of a core at 100,000 nodes, docs/scaling.md).
        if enqueue and not same_but_version(before, self.store.nodes.get(name)):
            self.queue.add(name, urgent=asked)

    def on_report(self, event: str | None, body: Mapping[str, Any], enqueue: bool = True) -> None:
        name = body["metadata"]["name"]
        news = False
        before = domains.correlation_facts(self.store.reports.get(name))
        if event == "DELETED":
            self.store.drop_report(name)
        else:
            news = self._heard(name, body, live=enqueue)
            self.store.put_report(name, body)
        if enqueue:
            self.queue.add(name, urgent=news)  # the agent's new facts go ahead of the fleet's backlog
            if domains.correlation_facts(self.store.reports.get(name)) != before:
                self._neighbours(name)

    def _neighbours(self, name: str) -> None:
        """A domain's or a rack's fact changed on ``name``: every node of its NVLink domain and rack may
        decide differently now (evaluation/domains.py), and is queued ahead of the backlog with it."""
        policy, _ = self.store.governing(name)
        if policy is None:
            return
        labels = domains.labels_of(self.store.nodes.get(name))
        for key in (policy.topology.domain_label, policy.topology.rack_label):
            if labels.get(key):
                for n in self.store.members(key, labels[key]):
                    self.queue.add(n, urgent=True)

    def _heard(self, name: str, body: Mapping[str, Any], live: bool) -> bool:
        """Note a sign of life from the agent (a new spec write), by our clock, with its clock skew (the
        node's pass records and announces a skew episode: ``freshness.skew_episode``).

        Returns whether it was one (not our own status write echoed, nor the same object again)."""
        prior = self.store.report_seen(name)
        seen = freshness.observe(prior, body, self.clock(), live)
        self.store.set_report_seen(name, seen)
        return seen is not None and seen is not prior

    def on_lease(self, event: str | None, lease: Mapping[str, Any], live: bool = True) -> None:
        """An agent's node Lease renewed: a sign of life, by our clock. It costs no reconcile and no
        write, except where a sign of life can change the verdict (Unknown, or no verdict yet)."""
        name = str((lease.get("metadata") or {}).get("name") or "")
        if not name or event == "DELETED":
            return  # the last renewal still happened; the agent recreates its Lease on the next beat
        prior = self.store.lease_seen(name)
        seen = freshness.observe_lease(prior, lease, self.clock(), live)
        if seen is None or seen is prior:
            return
        self.store.set_lease_seen(name, seen)
        if not live:
            return
        metrics.LEASE_RENEWALS.inc()
        rec = self.store.records.get(name)
        if name in self.store.nodes and (rec is None or rec.state == State.UNKNOWN):
            metrics.LEASE_RECONCILES.inc()
            self.queue.add(name)

    def replace_leases(self, leases: list[dict[str, Any]]) -> None:
        """A fresh full list (the watch expired): renewals missed meanwhile count from the server's time of
        them (``freshness.observe_lease``), not from the agent's renewTime."""
        for lease in leases:
            self.on_lease("MODIFIED", lease, live=False)

    def on_pod(self, event: str | None, body: Mapping[str, Any], enqueue: bool = True) -> None:
        """Pods by node, gang and workload: what drains and restart-loop detection need.

        Queues the pod's node (and the node it left), unless settled and the pod quiet, and the draining
        nodes that hold a member of its gang: a drain plans each gang whole (``drain/plan.py``), so a
        member's change on another node (acknowledged, evicted, gone) moves it. Not every draining node
        on every pod event: at 1,000 pod events/s those passes held the workers from the next fault's
        (docs/scaling.md, the fleet probe); a running drain still passes itself every second."""
        change = self.store.pods.put(body, deleted=event == "DELETED")
        if change is None or not enqueue:
            return
        quiet = not shows_failure(body)
        for n in {change.node, change.previous}:
            if n in self.store.nodes and not (quiet and self._settled(n)):
                self.queue.add(n)
        draining = self.breaker.drains() if change.gangs else set()
        for gang in change.gangs:
            for n in self.store.pods.hosting(gang, draining):
                self.queue.add(n)

    def _settled(self, name: str) -> bool:
        """Whether a pass of ``name`` reads its pods only for restart loops: Healthy, every GPU in
        service, no drain. Then a pod that shows no failure (``api/pods.py`` ``shows_failure``) changes nothing
        a pass decides: at 1,000 pod events/s the passes such pods queued were most of the operator's
        CPU (docs/scaling.md, the fleet probe)."""
        rec = self.store.records.get(name)
        if rec is None or rec.state != State.HEALTHY or name in self.breaker.drains():
            return False
        status = self.store.status(name)
        return not status.unreadable and all(d.state == DeviceState.IN_SERVICE for d in status.devices.values())

    def replace_nodes(self, nodes: list[dict[str, Any]]) -> None:
        """A fresh full list (the watch expired): Nodes missing from it were deleted meanwhile."""
        _replace(nodes, self.store.nodes, self.on_node)

    def replace_reports(self, reports: list[dict[str, Any]]) -> None:
        """A fresh full list (the watch expired): reports missing from it were deleted meanwhile, and an
        agent's write missed meanwhile counts from the server's time of it (``freshness.observe``)."""
        _replace(reports, self.store.reports, self.on_report)

    def replace_pods(self, pods: list[dict[str, Any]]) -> Iterator[None]:
        """A fresh full list (the watch expired): pods missing from it are gone. A step every
        ``REPLACE_BATCH`` pods: the pod watch's reflector lets the loop run between them (reflector.py)."""
        fresh = {p["metadata"].get("uid") for p in pods}
        for k, (uid, node) in enumerate(self.store.pods.nodes(), 1):
            if uid not in fresh:
                self.on_pod("DELETED", {"metadata": {"uid": uid}, "spec": {"nodeName": node}})
            if k % REPLACE_BATCH == 0:
                yield
        for k, p in enumerate(pods, 1):
            self.on_pod("MODIFIED", p)
            if k % REPLACE_BATCH == 0:
                yield

    def on_policy(self, event: str | None, body: Mapping[str, Any], enqueue: bool = True) -> None:
        name = body["metadata"]["name"]
        before = (self.store.policy_objs.get(name) or {}).get("metadata") or {}
        update = self.store.put_policy(name, None if event == "DELETED" else body)
        if enqueue:  # (the start-up list is summed up in one line by the runtime)
            _log_policy_change(name, event, before, body)
        if update.error is not None:
            metrics.INVALID_INPUT.labels("GPUHealthPolicy").inc()
            log.warning("policy %s refused: %s", name, update.error)
            uid = body["metadata"].get("uid", name)
            self.events(
                POLICY_KIND,
                name,
                uid,
                "Warning",
                "InvalidPolicy",
                f"The operator will not act on this policy: {update.error}",
                API_VERSION,
            )
        # Every node again only when the policy decides differently: its status (written by the
        # operator every tick the counts move) comes back as an event too, and re-passing the whole
        # fleet on it delayed every new fault behind a thousand passes each tick (docs/bench.md).
        if enqueue and update.changed:
            for n in self.store.nodes:
                self.queue.add(n)


def _log_policy_change(name: str, event: str | None, before: Mapping[str, Any], body: Mapping[str, Any]) -> None:
    """When the operator learned of a policy's spec (added, changed, deleted): its own status writes
    echo back as events too, and are not news."""
    generation = (body.get("metadata") or {}).get("generation")
    if event == "DELETED":
        log.info("policy %s deleted", name)
    elif not before:
        log.info("policy %s added (generation %s)", name, generation)
    elif before.get("generation") != generation:
        log.info("policy %s changed (generation %s)", name, generation)
