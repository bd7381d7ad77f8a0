"""Slim list-then-watch of what the operator caches: GPU Nodes, reports, scheduled Pods, the agents'
heartbeat Leases. One class; each watch is an instance with its own list and watch calls, built by
the four functions at the end.

A fleet is tens of thousands of these objects and the operator reads a handful of fields of each.
Watched through Kopf, each event's full body was wrapped, queued to a per-object worker and handed
over whole, and Kopf listed everything again after the runtime's own list: at 10,000 nodes most of
the operator's peak memory, and at 8,000 pods about 180 MB (docs/scaling.md, docs/bench.md). Here
each object is slimmed as soon as its line is parsed (``slim.py``) and only that is handed to the
runtime, on its event loop, in the order the API sent it. The runtime's own start-up list is the
watch's (``list``), so each kind is listed once and the watch continues from its resourceVersion.

What each watch selects, server-side: Nodes labelled ``nvidia.com/gpu.present=true``; every report;
Pods with ``spec.nodeName`` set; Leases in the agents' namespace labelled by the agents. A Lease
renewal is a sign of life and nothing else: the runtime folds it into the freshness record and
queues the node only where that can change the verdict, so steady heartbeats cost no reconcile.

Each list is streamed where the API server streams lists (``kube/watches.py``): the watch then reads
on from the same stream after the list's closing bookmark, instead of a second request from its
resourceVersion, which a loaded API server at 10,000 nodes had already let expire (docs/bench.md).

The protocol (list, watch with bookmarks, resume, list again on 410 Gone, growing retry delays)
and the metrics (``gpuhealth_watch_*_total{watch}``) are ``reflector.py``'s.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuhealth.api.names import AGENT_LEASE_SELECTOR, GPU_NODE_SELECTOR, REPORT_PLURAL
from gpuhealth.controller.intake.reflector import WATCH_TIMEOUT_S, LoopReflector
from gpuhealth.controller.state.slim import slim_lease, slim_node, slim_pod, slim_report
from gpuhealth.kube.client import KubePort
from gpuhealth.kube.watches import close_stream

log = logging.getLogger(__name__)

Slim = Callable[[Mapping[str, Any]], dict[str, Any]]
Events = Iterator[Mapping[str, Any]]
# A list, its resourceVersion, and the stream it came on where it was streamed (to watch on from).
Lister = Callable[[Slim], tuple[list[dict[str, Any]], str, Events | None]]
Watcher = Callable[[str, int], Iterator[dict[str, Any]]]

Items = list[dict[str, Any]]  # (a name of its own: `list` is a method of the watch below)
OnEvent = Callable[[str, dict[str, Any]], None]
OnReplace = Callable[[list[dict[str, Any]]], Iterator[None] | None]


@dataclass
class ObjectWatch(LoopReflector[dict[str, Any]]):
    """Feeds ``on_event(type, slim body)`` and ``on_replace(slim bodies)`` on ``loop``, from a thread.

    ``kind`` names the watch (its thread, and the metrics' ``watch`` label: one of
    ``metrics.WATCHES``); ``lister(slim)`` lists (each item slimmed) and returns the list's
    resourceVersion and, where the list was streamed, the stream to read on from;
    ``watcher(resource_version, timeout_s)`` yields the raw watch events from a version.
    """

    kind: str
    lister: Lister
    watcher: Watcher
    slim: Slim
    on_event: Callable[[str, dict[str, Any]], None]
    on_replace: OnReplace
    resource_version: str = ""
    stopping: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _rest: Events | None = None  # the last list's stream, not read on from yet

    # Reconnecting is one cheap request, and faults and drains arrive through these: retry soon
    # after an API comes back.
    RETRY_BASE_S, RETRY_MAX_S = 0.5, 5.0

    def __post_init__(self) -> None:
        self.NAME = f"{self.kind}-watch"
        self.WATCH = self.kind

    def list(self) -> list[dict[str, Any]]:
        """The initial (or a fresh) full list; the watch continues from its resourceVersion."""
        return self.full_list()

    def stop(self) -> None:
        super().stop()
        if self._thread is None:  # listed, never started: nobody will read on from the stream
            self._drop_rest()

    def _list(self) -> Items:
        self._drop_rest()
        started = time.monotonic()
        items, self.resource_version, self._rest = self.lister(self.slim)
        # One line per list (the first, and each after 410 Gone): how long a restarted operator waited
        # for each kind, and whether the server streamed it (docs/runbook.md, start-up).
        how = "streamed" if self._rest is not None else "paged"
        log.info("%s: listed %d in %.1fs, %s", self.NAME, len(items), time.monotonic() - started, how)
        return items

    def _watch(self) -> Iterable[Mapping[str, Any]]:
        """The list's own stream where it was streamed (once: when it ends, a watch opens from the last
        version read, as after any server-side timeout), else a watch from the resourceVersion."""
        rest, self._rest = self._rest, None
        if rest is not None:
            return rest
        return self.watcher(self.resource_version, WATCH_TIMEOUT_S)

    def _drop_rest(self) -> None:
        rest, self._rest = self._rest, None
        close_stream(rest)

    def _slim(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        return self.slim(obj)


# The four watches of the fleet. The sources' calls are looked up when a watch lists, not here.


def listed(items_rv: tuple[list[dict[str, Any]], str]) -> tuple[list[dict[str, Any]], str, Events | None]:
    """A list that came page by page (a source that does not stream, such as Kueue's): nothing to read
    on from."""
    return items_rv[0], items_rv[1], None


def node_watch(kube: KubePort, on_event: OnEvent, on_replace: OnReplace) -> ObjectWatch:
    """GPU Nodes, selected server-side."""
    return ObjectWatch(
        "nodes",
        lambda slim: kube.list_nodes_rv(GPU_NODE_SELECTOR, slim),
        lambda rv, timeout: kube.watch_nodes(GPU_NODE_SELECTOR, rv, timeout),
        slim_node,
        on_event,
        on_replace,
    )


def report_watch(kube: KubePort, on_event: OnEvent, on_replace: OnReplace) -> ObjectWatch:
    """The agents' reports (GPUNodeHealth)."""
    return ObjectWatch(
        "reports",
        lambda slim: kube.list_custom_rv(REPORT_PLURAL, slim),
        lambda rv, timeout: kube.watch_custom(REPORT_PLURAL, rv, timeout),
        slim_report,
        on_event,
        on_replace,
    )


def pod_watch(kube: KubePort, on_event: OnEvent, on_replace: OnReplace) -> ObjectWatch:
    """Scheduled Pods."""
    return ObjectWatch(
        "pods",
        lambda slim: kube.list_pods_rv(slim),
        lambda rv, timeout: kube.watch_pods(rv, timeout),
        slim_pod,
        on_event,
        on_replace,
    )


def lease_watch(kube: KubePort, namespace: str, on_event: OnEvent, on_replace: OnReplace) -> ObjectWatch:
    """The agents' heartbeat Leases in their namespace."""
    return ObjectWatch(
        "leases",
        lambda slim: kube.list_leases_rv(namespace, AGENT_LEASE_SELECTOR, slim),
        lambda rv, timeout: kube.watch_leases(namespace, AGENT_LEASE_SELECTOR, rv, timeout),
        slim_lease,
        on_event,
        on_replace,
    )
