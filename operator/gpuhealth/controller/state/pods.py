"""The pod cache: slim pods indexed by node, gang and workload, for drains and restart-loop detection.

Pods are most of a cluster's objects (80,000 at 10,000 nodes), so they are kept slim (``slim.py``),
each key string once, and grouped as they arrive rather than on every reconcile. The start-up lists
them after the fleet (``controller/process/runtime.py``): until that list is in, ``pending`` says
the cache is incomplete and a pass may only take out (``evaluation/startup.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from typing import Any

from gpuhealth.controller.intake.slim import same_but_version, slim_pod
from gpuhealth.drain import pods as P
from gpuhealth.kube.versions import newer

Group = dict[str, dict[str, dict[str, Any]]]  # key -> uid -> slim pod


class Lists(Mapping[str, list[dict[str, Any]]]):
    """A read-only view of pods grouped by a key, as lists, built per key only when asked.

    Copying every group on each reconcile cost time proportional to all pods in the cluster.
    """

    def __init__(self, groups: Mapping[str, Mapping[str, dict[str, Any]]]) -> None:
        self._groups = groups

    def __getitem__(self, key: str) -> list[dict[str, Any]]:
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

    def put(self, body: Mapping[str, Any], deleted: bool = False) -> tuple[str, str] | None:
        """Index a pod by node, gang and workload; returns (its node, its previous node), or None where
        no pass needs to see it: no uid, or a new copy that differs from the cached one only in its
        resourceVersion (most pod updates change what the slim copy drops: at 1,000 pod events/s the
        passes they queued were most of the operator's CPU, docs/scaling.md)."""
        uid = body["metadata"].get("uid")
        if not uid:
            return None
        old = self._index.pop(uid, None)
        cached = self._by_node.get(old[0], {}).get(uid) if old is not None else None
        if old is not None:
            self._by_node.get(old[0], {}).pop(uid, None)
            if old[1]:
                self._by_gang.get(old[1], {}).pop(uid, None)
            self._by_workload.get(old[2], {}).pop(uid, None)
        node = str((body.get("spec") or {}).get("nodeName") or "")
        if not deleted:
            pod = slim_pod(body)
            # A pod's deletion is never undone: an older copy of the pod (a watch event that was in
            # flight when a newer copy reached the cache) must not make it look alive again.
            gone = ((cached or {}).get("metadata") or {}).get("deletionTimestamp")
            if gone and not pod["metadata"].get("deletionTimestamp"):
                pod["metadata"]["deletionTimestamp"] = gone
            gang, workload = P.gang_key(pod), P.workload_key(pod)
            # One copy of each key for all the pods of a gang or workload, not one per pod.
            gang, workload = sys.intern(gang) if gang else gang, sys.intern(workload)
            self._index[uid] = (node, gang, workload)
            self._by_node.setdefault(node, {})[uid] = pod
            if gang:
                self._by_gang.setdefault(gang, {})[uid] = pod
            self._by_workload.setdefault(workload, {})[uid] = pod
            if old is not None and old[0] == node and same_but_version(cached, pod):
                return None
        return node, old[0] if old else ""

    # -- reads -----------------------------------------------------------------------------------

    def on(self, node: str) -> list[dict[str, Any]]:
        """The pods bound to ``node``."""
        return list(self._by_node.get(node, {}).values())

    def nodes(self) -> list[tuple[str, str]]:
        """(uid, node) of every cached pod: what a fresh full list is compared with."""
        return [(uid, node) for uid, (node, _, _) in self._index.items()]

    def gangs(self) -> Lists:
        return Lists(self._by_gang)

    def workloads(self) -> Lists:
        return Lists(self._by_workload)
