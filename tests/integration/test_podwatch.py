"""The operator's pod reflector against the real API server: list, watch, resume, converge."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from devkit.cluster import LocalCluster
from devkit.k8s import Kube, ensure_namespace, wait_for
from gpuhealth.controller.intake.objectwatch import ObjectWatch
from gpuhealth.kube.client import Kube as OperatorKube
from gpuhealth.kube.credentials import api_client
from gpuhealth.kube.watches import close_stream
from tests.integration.conftest import make_nodes


def slim(p: Any) -> dict[str, Any]:
    meta = p.get("metadata") or {}
    return {
        "metadata": {k: meta.get(k) for k in ("uid", "name", "namespace", "labels")},
        "spec": {"nodeName": (p.get("spec") or {}).get("nodeName")},
        "status": {"phase": (p.get("status") or {}).get("phase")},
    }


class Mirror:
    """What a reconciler would hold: pods by uid, fed on an event loop running in a thread."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[str, str]] = []
        self.relists = 0
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def on_event(self, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        self.events.append((kind, pod["metadata"]["name"]))
        if kind == "DELETED":
            self.pods.pop(uid, None)
        else:
            self.pods[uid] = pod

    def on_replace(self, pods: list[dict[str, Any]]) -> None:
        self.relists += 1
        self.pods = {p["metadata"]["uid"]: p for p in pods}

    def names(self, ns: str) -> dict[str, str | None]:
        pods = list(self.pods.values())
        return {p["metadata"]["name"]: p["status"]["phase"] for p in pods if p["metadata"]["namespace"] == ns}


@pytest.fixture
def mirror() -> Iterator[Mirror]:
    m = Mirror()
    yield m
    m.loop.call_soon_threadsafe(m.loop.stop)


def bare_pod(name: str, node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": "podwatch"}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
    }


def test_reflector_follows_a_pods_life_and_only_scheduled_pods(
    cluster: LocalCluster, kube: Kube, mirror: Mirror, group: str
) -> None:
    (node,) = make_nodes(cluster, group, 1)
    ns = ensure_namespace(kube, f"pw-{group}"[:60])
    source = OperatorKube(api_client(str(cluster.kubeconfig)))
    w = ObjectWatch("pods", source.list_pods_rv, source.watch_pods, slim, mirror.on_event, mirror.on_replace)
    for p in w.list():
        mirror.on_event("ADDED", p)
    w.start(mirror.loop)
    try:
        kube.core.create_namespaced_pod(ns, bare_pod("a", node))
        kube.core.create_namespaced_pod(
            ns,
            {
                "metadata": {"name": "unscheduled"},
                "spec": {"nodeSelector": {"no-such-label": "x"}, "containers": [{"name": "c", "image": "x"}]},
            },
        )
        wait_for(lambda: mirror.names(ns).get("a") == "Running", what="pod a running, seen through the watch")
        kube.core.delete_namespaced_pod("a", ns, grace_period_seconds=0)
        wait_for(lambda: "a" not in mirror.names(ns), what="pod a gone")
        # The field selector is server-side: a pod no scheduler placed never reaches the operator.
        assert "unscheduled" not in mirror.names(ns)
        assert ("ADDED", "a") in mirror.events and ("DELETED", "a") in mirror.events
    finally:
        w.stop()
        kube.core.delete_namespaced_pod("unscheduled", ns, grace_period_seconds=0)


def test_reflector_started_from_an_ancient_version_converges_to_a_fresh_list(
    cluster: LocalCluster, kube: Kube, mirror: Mirror, group: str
) -> None:
    """Whether the API replays history from version 1 or answers 410 Gone (then a relist), the
    mirror ends up holding exactly what a fresh list holds."""
    (node,) = make_nodes(cluster, group, 1)
    ns = ensure_namespace(kube, f"pw-{group}"[:60])
    for i in range(3):
        kube.core.create_namespaced_pod(ns, bare_pod(f"p{i}", node))
    source = OperatorKube(api_client(str(cluster.kubeconfig)))
    w = ObjectWatch(
        "pods", source.list_pods_rv, source.watch_pods, slim, mirror.on_event, mirror.on_replace, resource_version="1"
    )
    w.start(mirror.loop)
    try:
        wait_for(lambda: len(mirror.names(ns)) == 3, timeout=60, what="the three pods mirrored")
        kube.core.delete_namespaced_pod("p0", ns, grace_period_seconds=0)
        wait_for(lambda: set(mirror.names(ns)) == {"p1", "p2"}, what="deletion mirrored")

        def same_as_fresh_list() -> bool:
            fresh = {p["metadata"]["uid"] for p in source.list_pods_rv(slim)[0]}
            return set(mirror.pods) == fresh

        wait_for(same_as_fresh_list, what="mirror equals a fresh list")
    finally:
        w.stop()


def test_the_pod_list_is_whole_and_the_watch_reads_on_from_it(
    cluster: LocalCluster, kube: Kube, mirror: Mirror, group: str
) -> None:
    """The control plane (v1.37) streams lists: the pods arrive as the watch's initial events, the list's
    resourceVersion is its closing bookmark's, and the same stream then follows what changes next, with
    no second watch request (whose version a loaded API server may already have let expire).

    A loaded API server may end a stream before its bookmark (it closes a watcher that falls behind):
    that list is then taken page by page, streaming stays on, and exactly one watch opens from the paged
    list's version. Either way the list is whole and what changes next arrives with no relist
    (``test_streamed_lists.py`` says the same of the other watches)."""
    (node,) = make_nodes(cluster, group, 1)
    ns = ensure_namespace(kube, f"pw-{group}"[:60])
    created = [kube.core.create_namespaced_pod(ns, bare_pod(f"s{i}", node)) for i in range(3)]
    source = OperatorKube(api_client(str(cluster.kubeconfig)))
    items, rv, rest = source.list_pods_rv(slim)
    assert source.stream_lists  # not refused: a stream cut short falls back for that one list only
    close_stream(rest)
    assert {p["metadata"]["name"] for p in items if p["metadata"]["namespace"] == ns} == {"s0", "s1", "s2"}
    assert int(rv) >= int(created[-1].metadata.resource_version)  # the state as of the request, at least
    opened: list[str] = []

    def watch_pods(resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        opened.append(resource_version)
        return source.watch_pods(resource_version, timeout_s)

    w = ObjectWatch("pods", source.list_pods_rv, watch_pods, slim, mirror.on_event, mirror.on_replace)
    for p in w.list():
        mirror.on_event("ADDED", p)
    streamed, listed_rv = w._rest is not None, w.resource_version
    assert source.stream_lists
    w.start(mirror.loop)
    try:
        kube.core.delete_namespaced_pod("s0", ns, grace_period_seconds=0)
        wait_for(lambda: set(mirror.names(ns)) == {"s1", "s2"}, what="the deletion seen after the list")
        assert mirror.relists == 0  # no 410, no relist
        # Streamed: no watch of its own, the stream went on. Cut short: one watch, from the list's version.
        assert opened == ([] if streamed else [listed_rv])
    finally:
        w.stop()
