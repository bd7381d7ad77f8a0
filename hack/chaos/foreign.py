"""What another writer put on the Nodes, from its own log, and whether it is still there (pure).

The foreign writer logs every write it made: the Node's resourceVersion its PUT produced and the
taints and cordon it wants from then on. A Node read at resourceVersion R must carry what the
writer's last write at or before R left (later writes may not be in that read yet); while a write
is in flight, only what both the state before and the state after it hold. The record is
never rebuilt from the live Node, so a foreign taint gpuhealth dropped stays expected and is
reported, instead of becoming the new baseline. (resourceVersions of one Node are etcd revisions:
integers that grow; a chaos check against a real etcd may compare them.)
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ForeignWrite:
    rv: int
    taints: frozenset[str]
    cordon: bool


@dataclass
class ForeignLog:
    writes: dict[str, list[ForeignWrite]] = field(default_factory=dict)
    pending: dict[str, ForeignWrite] = field(default_factory=dict)  # sent, no answer yet
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def begin(self, node: str, taints: frozenset[str], cordon: bool) -> None:
        """A write is about to be sent: until it is answered, a read may or may not include it."""
        with self._lock:
            self.pending[node] = ForeignWrite(-1, frozenset(taints), cordon)

    def abort(self, node: str) -> None:
        with self._lock:
            self.pending.pop(node, None)

    def record(self, node: str, rv: int, taints: frozenset[str], cordon: bool) -> None:
        with self._lock:
            self.pending.pop(node, None)
            self.writes.setdefault(node, []).append(ForeignWrite(rv, frozenset(taints), cordon))

    def latest(self, node: str) -> ForeignWrite | None:
        with self._lock:
            log = self.writes.get(node) or []
            return log[-1] if log else None

    def as_of(self, node: str, rv: int) -> ForeignWrite | None:
        """The writer's state after its last write that a read at ``rv`` must include."""
        with self._lock:
            found = None
            for w in self.writes.get(node) or []:
                if w.rv <= rv:
                    found = w
            inflight = self.pending.get(node)
            if found is not None and inflight is not None:
                found = ForeignWrite(found.rv, found.taints & inflight.taints, found.cordon and inflight.cordon)
            return found

    def nodes(self) -> list[str]:
        with self._lock:
            return sorted(self.writes)

    def count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self.writes.values())


def resource_version(obj: Mapping[str, Any]) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


def foreign_problems(log: ForeignLog, name: str, node: Mapping[str, Any]) -> list[str]:
    """Foreign taints or cordon the writer's log says must be on this read of the Node, but are not."""
    want = log.as_of(name, resource_version(node))
    if want is None:
        return []
    spec = node.get("spec") or {}
    keys = {t.get("key") for t in spec.get("taints") or []}
    rv = resource_version(node)
    out = [
        f"{name}: foreign taint {k} was lifted (writer's log at rv {want.rv}, Node at rv {rv})"
        for k in sorted(want.taints - keys)
    ]
    if want.cordon and not spec.get("unschedulable"):
        out.append(
            f"{name}: a cordon placed by someone else was lifted (writer's log at rv {want.rv}, Node at rv {rv})"
        )
    return out
