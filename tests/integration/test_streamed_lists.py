"""Every watch's list is streamed by the control plane (v1.37) and the watch reads on from that stream:
the GPU Nodes, the reports (our CRD, whose stream the client cannot ask for itself: ``Kube._custom_stream``)
and the agents' Leases, as the pods (``test_podwatch.py``).

What each checks is what the operator promises, whatever the API server's load: the list holds what a
paged list holds; the server keeps streaming lists (a stream is never refused, so the client never
turns streaming off); and a change made after the list arrives on the watch that follows it, with no
relist. Where the list came as a stream, that change arrives on the same stream, with no watch request
of its own. A loaded API server may end a stream before its closing bookmark (it closes a watcher that
falls behind: seen on a busy 2-core machine after 53 objects); the list is then taken page by page that
once, and exactly one watch opens, from that list's resourceVersion. Both paths are the product's; the
unit tests (``tests/unit/kube/``) pin each one down without a server."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from devkit.cluster import LocalCluster
from devkit.k8s import Kube, ensure_namespace, healthy_spec, wait_for
from gpuhealth.api.names import AGENT_LEASE_SELECTOR, GPU_NODE_SELECTOR, GROUP, REPORT_PLURAL, VERSION
from gpuhealth.controller.intake.objectwatch import ObjectWatch
from gpuhealth.kube.client import Kube as OperatorKube
from gpuhealth.kube.credentials import api_client
from gpuhealth.kube.watches import close_stream
from tests.integration.conftest import make_nodes


def slim(o: Any) -> dict[str, Any]:
    meta = o.get("metadata") or {}
    return {"metadata": {k: meta.get(k) for k in ("name", "labels", "resourceVersion")}}


class Mirror:
    """Names and labels by name, fed on an event loop of its own."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def on_event(self, kind: str, o: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.objects.pop(o["metadata"]["name"], None)
        else:
            self.objects[o["metadata"]["name"]] = o

    def on_replace(self, items: list[dict[str, Any]]) -> None:
        raise AssertionError("no relist expected")

    def label(self, name: str, key: str) -> str | None:
        return ((self.objects.get(name) or {}).get("metadata", {}).get("labels") or {}).get(key)


@pytest.fixture
def source(cluster: LocalCluster) -> OperatorKube:
    return OperatorKube(api_client(str(cluster.kubeconfig)))


def read_on(
    kind: str,
    source: OperatorKube,
    lister: Callable[[Any], tuple[list[dict[str, Any]], str, Any]],
    watch: Callable[[str, int], Iterator[dict[str, Any]]],
    paged: list[str],
    name: str,
    change: Callable[[], object],
) -> None:
    """List through ``lister`` (as the watch does), check it holds ``paged``'s names, then make
    ``change`` (a label ``streamed=yes`` on ``name``) and wait for it: on the list's own stream where
    the list was streamed, else on one watch (``watch``, the operator's own call) from its version."""
    mirror = Mirror()
    opened: list[str] = []

    def watcher(rv: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        opened.append(rv)
        return watch(rv, timeout_s)

    w = ObjectWatch(kind, lister, watcher, slim, mirror.on_event, mirror.on_replace)
    for o in w.list():
        mirror.on_event("ADDED", o)
    streamed, listed_rv = w._rest is not None, w.resource_version
    assert source.stream_lists  # never refused: a stream cut short falls back for that one list only
    assert listed_rv  # either way the list has a version to read on from
    assert set(paged) <= set(mirror.objects)
    w.start(mirror.loop)
    try:
        change()
        wait_for(lambda: mirror.label(name, "streamed") == "yes", what=f"{name}'s change on the watch after the list")
        # Streamed: no watch request of its own. Cut short: one watch, from the paged list's version.
        assert opened == ([] if streamed else [listed_rv])
    finally:
        w.stop()
        mirror.loop.call_soon_threadsafe(mirror.loop.stop)


def label(kube: Kube, plural: str, name: str, namespace: str = "") -> Callable[[], object]:
    patch = {"metadata": {"labels": {"streamed": "yes"}}}
    if plural == "nodes":
        return lambda: kube.core.patch_node(name, patch)
    if plural == "leases":
        return lambda: client.CoordinationV1Api(kube.api).patch_namespaced_lease(name, namespace, patch)
    return lambda: kube.custom.patch_cluster_custom_object(
        GROUP, VERSION, plural, name, patch, _content_type="application/merge-patch+json"
    )


def test_the_nodes_list_is_whole_and_read_on(
    cluster: LocalCluster, kube: Kube, source: OperatorKube, group: str
) -> None:
    nodes = make_nodes(cluster, group, 2)
    read_on(
        "nodes",
        source,
        lambda s: source.list_nodes_rv(GPU_NODE_SELECTOR, s),
        lambda rv, t: source.watch_nodes(GPU_NODE_SELECTOR, rv, t),
        [n["metadata"]["name"] for n in source.list_nodes(GPU_NODE_SELECTOR, slim)],
        nodes[0],
        label(kube, "nodes", nodes[0]),
    )
    assert set(nodes) <= {n["metadata"]["name"] for n in source.list_nodes(GPU_NODE_SELECTOR, slim)}


def test_the_reports_list_is_whole_and_read_on(
    cluster: LocalCluster, kube: Kube, source: OperatorKube, group: str
) -> None:
    nodes = make_nodes(cluster, group, 2)
    for n in nodes:
        kube.put_report(n, healthy_spec())
    paged = [r["metadata"]["name"] for r in source.list_custom(REPORT_PLURAL, slim)]
    assert set(nodes) <= set(paged)
    read_on(
        "reports",
        source,
        lambda s: source.list_custom_rv(REPORT_PLURAL, s),
        lambda rv, t: source.watch_custom(REPORT_PLURAL, rv, t),
        paged,
        nodes[1],
        label(kube, REPORT_PLURAL, nodes[1]),
    )


def test_the_agents_leases_list_is_whole_and_read_on(kube: Kube, source: OperatorKube, group: str) -> None:
    ns = ensure_namespace(kube, f"ls-{group}"[:60])
    key, value = AGENT_LEASE_SELECTOR.split("=")
    leases = client.CoordinationV1Api(kube.api)
    for name in ("a", "b"):
        body = {"metadata": {"name": name, "labels": {key: value}}, "spec": {"holderIdentity": name}}
        leases.create_namespaced_lease(ns, body)
    leases.create_namespaced_lease(ns, {"metadata": {"name": "not-an-agent"}, "spec": {}})
    items, _, rest = source.list_leases_rv(ns, AGENT_LEASE_SELECTOR, slim)
    close_stream(rest)
    assert {o["metadata"]["name"] for o in items} == {"a", "b"}  # the selector is the server's
    read_on(
        "leases",
        source,
        lambda s: source.list_leases_rv(ns, AGENT_LEASE_SELECTOR, s),
        lambda rv, t: source.watch_leases(ns, AGENT_LEASE_SELECTOR, rv, t),
        ["a", "b"],
        "a",
        label(kube, "leases", "a", ns),
    )
