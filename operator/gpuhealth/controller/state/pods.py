"""The pod cache: slim pods indexed by node, gang and workload, for drains and restart-loop detection.

Pods are most of a cluster's objects (80,000 at 10,000 nodes), so they are kept slim and read only, in
slots (``slim.py`` ``cached_pod``), each key string once, and grouped as they arrive rather than on
every reconcile; a gang's group is its workload's too, and an emptied group is dropped. The start-up lists
them after the fleet (``controller/process/runtime.py``): until that list is in, ``pending`` says
the cache is incomplete and a pass may only take out (``evaluation/startup.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from gpuhealth.api import pods as P
from gpuhealth.controller.state.slim import cached_pod, same_but_version
from gpuhealth.kube.versions import newer

Pod = Mapping[str, Any]  # a cached pod (``slim.cached_pod``: read only)
Group = dict[str, dict[str, Pod]]  # key -> uid -> cached pod


class PodChange(NamedTuple):
    """What a pod event changed that a pass may read: the node it is bound to, the node it was bound to
    before ("" if none), and the gangs it is (or was) a member of, whose drains wait on it."""

    node: str
    previous: str
    gangs: tuple[str, ...]


def _drop(groups: Group, key: str, uid: str) -> None:
    """Take a pod out of its group, and the group out once empty (a finished Job's key is not kept)."""
    group = groups.get(key)
    if group is not None:
        group.pop(uid, None)
        if not group:
            del groups[key]


class Lists(Mapping[str, list[Pod]]):
    """A read-only view of pods grouped by a key, as lists, built per key only when asked.

    Copying every group on each reconcile cost time proportional to all pods in the cluster.
    """

    def __init__(self, groups: Mapping[str, Mapping[str, Pod]]) -> None:
        self._groups = groups

    def __getitem__(self, key: str) -> list[Pod]:
        return list(self._groups[key].values())

    def __iter__(self) -> Iterator[str]:
        return iter(self._groups)

    def __len__(self) -> int:
        return len(self._groups)


class PodIndex:
    def __init__(self) -> None:
        self._by_node: Group = {}
        self._by_gang: Group = {}
        self._by_workload: Group = {}
        self._index: dict[str, tuple[str, str | None, str]] = {}  # uid -> (node, gang, workload)
        self._pending = False

    # -- the start-up list -----------------------------------------------------------------------

    def expect(self) -> None:
        """The pods are being listed: ``pending`` until ``listed`` (an index filled by its callers, as
        the unit tests do, holds every pod it was given)."""
        self._pending = True

    def listed(self) -> None:
        self._pending = False

    @property
    def pending(self) -> bool:
        return self._pending

    # -- writes ----------------------------------------------------------------------------------

    def refresh(self, body: Mapping[str, Any]) -> None:
        """Cache our own write's response, unless the watch already brought a newer copy of the pod.

        The response can reach the cache after the watch event of a later change (a checkpoint
        request answered within milliseconds): written back, it would hide that change, and the drain
        would wait for an acknowledgement it already has.
        """
        meta = body["metadata"]
        old = self._index.get(meta.get("uid") or "")
        cached = self._by_node.get(old[0], {}).get(meta.get("uid")) if old is not None else None
        if cached is not None and not newer(meta.get("resourceVersion"), cached["metadata"].get("resourceVersion")):
            return
        self.put(body)

    def put(self, body: Mapping[str, Any], deleted: bool = False) -> PodChange | None:
        """Index a pod by node, gang and workload; returns what changed (``PodChange``), or None where
        no pass needs to see it: no uid, or a new copy that differs from the cached one only in its
        resourceVersion (most pod updates change what the slim copy drops: at 1,000 pod events/s the
        passes they queued were most of the operator's CPU, docs/scaling.md)."""
        uid = body["metadata"].get("uid")
        if not uid:
            return None
        old = self._index.pop(uid, None)
        cached = self._by_node.get(old[0], {}).get(uid) if old is not None else None
        if old is not None:
            _drop(self._by_node, old[0], uid)
            if old[1]:
                _drop(self._by_gang, old[1], uid)
            _drop(self._by_workload, old[2], uid)
        node = str((body.get("spec") or {}).get("nodeName") or "")
        gangs: tuple[str, ...] = (old[1],) if old is not None and old[1] else ()
        if not deleted:
            # A pod's deletion is never undone: an older copy of the pod (a watch event that was in
            # flight when a newer copy reached the cache) must not make it look alive again.
            pod = cached_pod(body, deleted_at=((cached or {}).get("metadata") or {}).get("deletionTimestamp"))
            gang, workload = P.gang_key(pod), P.workload_key(pod)
            # One copy of each key for all the pods of a gang or workload, not one per pod.
            gang, workload = sys.intern(gang) if gang else gang, sys.intern(workload)
            self._index[uid] = (node, gang, workload)
            self._by_node.setdefault(node, {})[uid] = pod
            # A gang is its pods' workload (``workload_key``): one group serves both indexes, not a
            # second entry per pod. Anything else that names the same key gets a group of its own.
            if gang:
                group = self._by_gang.setdefault(gang, {})
                group[uid] = pod
            if not gang or self._by_workload.setdefault(workload, group) is not group:
                mine = self._by_workload.get(workload)
                if mine is None or mine is self._by_gang.get(workload):
                    mine = self._by_workload[workload] = dict(mine or {})
                mine[uid] = pod
            if old is not None and old[0] == node and same_but_version(cached, pod):
                return None
            if gang and gang not in gangs:
                gangs = (*gangs, gang)
        return PodChange(node, old[0] if old else "", gangs)

    # -- reads -----------------------------------------------------------------------------------

    def on(self, node: str) -> list[Pod]:
        """The pods bound to ``node``."""
        return list(self._by_node.get(node, {}).values())

    def hosting(self, gang: str, among: set[str]) -> set[str]:
        """The nodes of ``among`` that hold a member of ``gang``: from whichever is smaller, the gang's
        members or the candidate nodes' pods (a gang of thousands of pods, a handful of drains)."""
        members = self._by_gang.get(gang)
        if not members or not among:
            return set()
        if len(members) <= len(among):
            return {n for uid in members if (n := self._index[uid][0]) in among}
        return {n for n in among if any(uid in members for uid in self._by_node.get(n, ()))}

    def nodes(self) -> list[tuple[str, str]]:
        """(uid, node) of every cached pod: what a fresh full list is compared with."""
        return [(uid, node) for uid, (node, _, _) in self._index.items()]

    def gangs(self) -> Lists:
        return Lists(self._by_gang)

    def workloads(self) -> Lists:
        return Lists(self._by_workload)
