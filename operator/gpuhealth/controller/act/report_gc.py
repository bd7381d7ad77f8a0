"""Deletes the GPUNodeHealth report of a Node that no longer exists.

Kubernetes' garbage collector cannot do it: the agent writes no ownerReference (it would need to
read its Node to learn the uid, a permission agents do not get). So the acting operator does it,
from the work queue, when a node it was tracking leaves its cache or a report has no node:

- a label-selected watch also says DELETED when a Node merely loses the GPU label, so the Node is
  read first and only a 404 counts as gone;
- the delete carries the report's uid as a precondition, so a report a new Node of the same name
  (and its agent) has written since is never deleted by mistake; 404 and 409 both mean "nothing
  of ours to delete".

Found by the chaos soak: deleted Nodes left their reports behind forever.
"""

from __future__ import annotations

import logging

from gpuhealth.controller.state.store import Store
from gpuhealth.kube.aio import AsyncKube
from gpuhealth.kube.errors import is_conflict, is_not_found

log = logging.getLogger(__name__)


class ReportCollector:
    def __init__(self, *, kube: AsyncKube, store: Store) -> None:
        self.kube = kube
        self.store = store
        self._suspects: set[str] = set()

    def suspect(self, name: str) -> None:
        """``name`` left the Node cache: check it once (and only it; a report of a Node that is not a
        GPU node is otherwise never looked at, so its heartbeats cost no request)."""
        self._suspects.add(name)

    def suspect_orphans(self) -> list[str]:
        """After a full list: reports with no GPU Node in the cache become suspects (a Node deleted
        while no operator ran)."""
        names = [name for name in self.store.reports if name not in self.store.nodes]
        self._suspects.update(names)
        return names

    async def collect(self, name: str) -> bool:
        """Delete ``name``'s report if it is a suspect and its Node is gone; True if one was deleted."""
        if name not in self._suspects:
            return False
        report = self.store.reports.get(name)
        if report is None:
            self._suspects.discard(name)
            return False
        try:
            await self.kube.get_node(name)
            self._suspects.discard(name)
            return False  # the Node exists (it only lost the GPU label): its report stays
        except Exception as e:
            if not is_not_found(e):
                raise  # retried by the worker with growing delays
        uid = str((report.get("metadata") or {}).get("uid") or "") or None
        try:
            await self.kube.delete_report(name, uid)
        except Exception as e:
            if not (is_not_found(e) or is_conflict(e)):
                raise
            self._suspects.discard(name)
            return False
        self._suspects.discard(name)
        self.store.drop_report(name)
        log.info("deleted the report of node %s: the Node no longer exists", name)
        return True
