"""The Kube port answering from memory, for the fleet probe: what the operator's passes read and write.

A fleet of 100,000 Nodes, reports and 800,000 pods cannot be held twice in one process (once here,
once in the operator's caches, which is what the probe measures), so the objects are not stored: each
is rendered from the fleet's generator (``fleet.py``) when asked, and only what the operator writes is
kept, per object, merged into it. Every write is recorded with its time (``time.perf_counter``) and
whether the Node it leaves carries gpuhealth's taint: the probe's detection latency ends at the first
such write of a fault's pass (a Node write that only labels, a verdict the breaker held, is not one).
No preconditions are checked (the port is never stale, nothing else writes): the cost measured is
the operator's own.
"""

from __future__ import annotations

import copy
import itertools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from devkit.gpunodes import status_write
from gpuhealth.agent.merge_patch import apply_merge_patch
from gpuhealth.api.names import TAINT_KEY
from hack.fleetprobe import fleet


@dataclass(frozen=True)
class Write:
    at: float  # time.perf_counter()
    verb: str
    name: str  # the node, report or pod's name
    tainted: bool = False  # a Node write whose result carries gpuhealth's taint


def _node_index(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def _pod_index(name: str) -> tuple[int, int]:
    """(node, slot) of ``train-JJJJJ-rank-R`` (``memprobe/fleet.py``: 4 nodes per Job, 8 ranks per node)."""
    job, rank = int(name.split("-")[1]), int(name.rsplit("-", 1)[1])
    return job * 4 + rank // fleet.PODS_PER_NODE, rank % fleet.PODS_PER_NODE


@dataclass
class MemKube:
    """The operator's ``KubePort`` over the generated fleet (``kube/client.py`` lists the calls)."""

    node: Callable[[int], dict[str, Any]] = fleet.settled_node
    report: Callable[[int], dict[str, Any]] = fleet.settled_report
    pod: Callable[[int, int], dict[str, Any]] = fleet.gpu_pod
    writes: list[Write] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)  # (reason, object name)
    _written: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # Above every resourceVersion the probe streams (``drive.py``): the operator adopts a write's answer
    # only if it is newer than what it holds.
    _rv: Any = field(default_factory=lambda: itertools.count(10**12))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _body(self, kind: str, name: str) -> dict[str, Any]:
        kept = self._written.get((kind, name))
        if kept is not None:
            return kept
        if kind == "node":
            return self.node(_node_index(name))
        if kind == "report":
            return self.report(_node_index(name))
        return self.pod(*_pod_index(name))

    def _write(self, verb: str, kind: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        with self._lock:
            at = time.perf_counter()
            body = {k: v for k, v in patch.items() if k != "metadata"}
            meta = {k: v for k, v in (patch.get("metadata") or {}).items() if k != "resourceVersion"}
            if meta:
                body["metadata"] = meta
            merged: dict[str, Any] = apply_merge_patch(copy.deepcopy(self._body(kind, name)), body)
            merged["metadata"]["resourceVersion"] = str(next(self._rv))
            self._written[kind, name] = merged
            tainted = kind == "node" and any(t.get("key") == TAINT_KEY for t in merged["spec"].get("taints") or [])
            self.writes.append(Write(at, verb, name, tainted))
            return merged

    def observe(self, kind: str, name: str, body: dict[str, Any]) -> None:
        """A watch event the probe delivered: the object as the API server now holds it (an agent's new
        report), so that the answer to the operator's next write of it carries the same spec."""
        with self._lock:
            self._written[kind, name] = body

    def forget(self) -> None:
        """Drop what was written (between phases): the fleet is as generated again."""
        with self._lock:
            self._written.clear()
            self.writes.clear()
            self.events.clear()

    # -- Nodes -------------------------------------------------------------------------------------

    def get_node(self, name: str) -> dict[str, Any]:
        return self._body("node", name)

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return self._write("patch_node", "node", name, patch)

    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """As the API server applies it (``devkit.gpunodes.status_write``)."""
        with self._lock:
            body = self._body("node", name)
        return self._write("patch_node_status", "node", name, status_write(body, patch))

    # -- reports -----------------------------------------------------------------------------------

    def get_report(self, name: str) -> dict[str, Any]:
        return self._body("report", name)

    def patch_report_status(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return self._write("patch_report_status", "report", name, patch)

    def create_report(self, body: Mapping[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        return self._write("create_report", "report", name, body)

    # -- pods (drains) -----------------------------------------------------------------------------

    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return self._write("patch_pod", "pod", name, patch)

    def evict_pod(self, namespace: str, name: str, uid: str | None, resource_version: str | None = None) -> None:
        self._write("evict_pod", "pod", name, {"metadata": {"deletionTimestamp": "2026-11-30T12:00:00Z"}})

    def force_delete_pod(self, namespace: str, name: str, uid: str | None) -> None:
        with self._lock:
            self.writes.append(Write(time.perf_counter(), "force_delete_pod", name))

    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        i = _node_index(node)
        return [self.pod(i, k) for k in range(fleet.PODS_PER_NODE)]

    # -- what the fleet has none of: DRA rules and claims, Jobs; policy status and Events ------------

    def list_device_taint_rules(self) -> list[dict[str, Any]]:
        return []

    def list_resource_claims(self) -> list[dict[str, Any]]:
        return []

    def patch_policy_status(self, name: str, patch: Mapping[str, Any]) -> None:
        with self._lock:
            self.writes.append(Write(time.perf_counter(), "patch_policy_status", name))

    def post_event(
        self, kind: str, name: str, uid: str, type_: str, reason: str, message: str, *_: Any, **__: Any
    ) -> None:
        with self._lock:
            self.events.append((reason, name))

    def __getattr__(self, name: str) -> Any:
        def refuse(*_: Any, **__: Any) -> Any:
            raise RuntimeError(f"fleetprobe: the operator called {name}, which the in-memory port does not serve")

        return refuse
