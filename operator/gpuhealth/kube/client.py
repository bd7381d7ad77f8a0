"""The operator's only door to the Kubernetes API (plain dicts in, plain dicts out).

Every call here is one request; callers own retries and conflict handling. Objects are returned as
JSON dicts, not the client's model classes, which are slow to build for thousands of Nodes. Here:
Nodes, Pods, the agents' Leases and gpuhealth's own CRDs; ``Kube`` inherits the calls of the other
concerns (``jobs``, ``kueue``, ``dra``, ``events``), and ``KubePort`` their ports.
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from kubernetes import client

from gpuhealth.api.names import COMPONENT, GROUP, POLICY_PLURAL, REPORT_PLURAL, VERSION
from gpuhealth.kube.deadline import drained
from gpuhealth.kube.dra import DraCalls, DraPort
from gpuhealth.kube.errors import is_conflict, is_not_found, retryable, status_of
from gpuhealth.kube.events import EventCalls, EventPort
from gpuhealth.kube.jobs import JobCalls
from gpuhealth.kube.kueue import KueueCalls, KueuePort
from gpuhealth.kube.paging import list_rv, page_args
from gpuhealth.kube.watches import StreamIncomplete, stream_args, streamed_list, watch_args, watch_events

log = logging.getLogger(__name__)
__all__ = ["Kube", "KubePort", "is_conflict", "is_not_found", "retryable", "status_of"]

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
SCHEDULED = "spec.nodeName!="  # only pods placed on a node


def _same(body: dict[str, Any]) -> dict[str, Any]:
    return body


class KubePort(KueuePort, DraPort, EventPort, Protocol):
    """What the controller asks of the API; ``Kube`` below, or an in-memory fake in unit tests."""

    def get_node(self, name: str) -> dict[str, Any]: ...
    def list_nodes(
        self, label_selector: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = ...
    ) -> list[dict[str, Any]]: ...
    def list_nodes_rv(
        self, label_selector: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = ...
    ) -> tuple[list[dict[str, Any]], str, Iterator[Mapping[str, Any]] | None]: ...
    def watch_nodes(self, label_selector: str, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]: ...
    def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]: ...
    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]: ...
    def list_pods_rv(
        self, transform: Callable[[dict[str, Any]], dict[str, Any]] = ...
    ) -> tuple[list[dict[str, Any]], str, Iterator[Mapping[str, Any]] | None]: ...
    def watch_pods(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]: ...
    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]: ...
    def evict_pod(self, namespace: str, name: str, uid: str | None, resource_version: str | None = None) -> None: ...
    def force_delete_pod(self, namespace: str, name: str, uid: str | None) -> None: ...
    def list_custom(
        self, plural: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = ...
    ) -> list[dict[str, Any]]: ...
    def list_custom_rv(
        self, plural: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = ...
    ) -> tuple[list[dict[str, Any]], str, Iterator[Mapping[str, Any]] | None]: ...
    def watch_custom(self, plural: str, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]: ...
    def list_leases_rv(
        self, namespace: str, label_selector: str, transform: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], str, Iterator[Mapping[str, Any]] | None]: ...
    def watch_leases(
        self, namespace: str, label_selector: str, resource_version: str, timeout_s: int
    ) -> Iterator[dict[str, Any]]: ...
    def get_report(self, name: str) -> dict[str, Any]: ...
    def create_report(self, body: Mapping[str, Any]) -> dict[str, Any]: ...
    def patch_report_status(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]: ...
    def delete_report(self, name: str, uid: str | None) -> None: ...
    def patch_policy_status(self, name: str, patch: Mapping[str, Any]) -> None: ...
    def get_job(self, namespace: str, name: str) -> dict[str, Any]: ...
    def create_job(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...
    def delete_job(self, namespace: str, name: str) -> None: ...
    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]: ...
    def delete_pod(self, namespace: str, name: str, uid: str) -> None: ...


class Kube(JobCalls, KueueCalls, DraCalls, EventCalls):
    def __init__(self, api: client.ApiClient, event_namespace: str = "default") -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.coordination = client.CoordinationV1Api(api)
        self.event_namespace = event_namespace
        self.instance = f"{COMPONENT}-{uuid.uuid4().hex[:8]}"
        self.stream_lists = True  # until the API server refuses a streaming list (``_listed``)

    @staticmethod
    def _json(resp: Any) -> Any:
        return json.loads(resp.data)

    def _listed(
        self,
        what: str,
        stream: Callable[[], Any],
        page: Callable[[str | None], dict[str, Any]],
        transform: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> tuple[list[dict[str, Any]], str, Iterator[Mapping[str, Any]] | None]:
        """A watch's list: the objects (``transform`` slims each one as it arrives), the list's
        resourceVersion, and, where the list was streamed (``stream()`` opens it), the stream itself to
        watch on from (raw events after the list; whoever takes it reads it or closes it); ``None``
        where it was listed page by page (``page(continue)``; a watch then opens from the version).

        Streamed, the API server sends while the operator reads, instead of the two taking turns page
        by page; and the watch needs no second request from a version that may have expired meanwhile
        (``watches.py``). A server that refuses the stream (400 or 422: before v1.27, or WatchList
        turned off) is listed page by page from then on; a stream cut short is listed page by page
        that once."""
        if self.stream_lists:
            try:
                return streamed_list(watch_events(stream()), transform)
            except StreamIncomplete as e:
                log.warning("streaming list of %s incomplete (%s); listing page by page", what, e)
            except client.ApiException as e:
                if status_of(e) not in (400, 422):
                    raise
                self.stream_lists = False
                log.info("the API server refuses streaming lists (%s): lists are taken page by page", status_of(e))
        items, rv = list_rv(page, transform)
        return items, rv, None

    # -- nodes -----------------------------------------------------------------------------------

    def get_node(self, name: str) -> dict[str, Any]:
        return self._json(self.core.read_node(name, _preload_content=False))  # type: ignore[no-any-return]

    def list_nodes(
        self, label_selector: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = _same
    ) -> list[dict[str, Any]]:
        """Nodes page by page; ``transform`` (a slimmer) cuts each before the next page is read."""
        return list_rv(functools.partial(self._node_page, label_selector), transform)[0]

    def _node_page(self, label_selector: str, cont: str | None) -> dict[str, Any]:
        return self._json(self.core.list_node(label_selector=label_selector, **page_args(cont)))  # type: ignore[no-any-return]

    def list_nodes_rv(
        self, label_selector: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = _same
    ) -> tuple[list[dict[str, Any]], str, Iterator[Mapping[str, Any]] | None]:
        """The Node watch's list (``_listed``: streamed where the server streams lists)."""
        return self._listed(
            "nodes",
            lambda: self.core.list_node(label_selector=label_selector, **stream_args()),
            functools.partial(self._node_page, label_selector),
            transform,
        )

    def watch_nodes(self, label_selector: str, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        """Raw watch events (parsed JSON, one per line) for the selected Nodes, from ``resource_version``."""
        resp = self.core.list_node(label_selector=label_selector, **watch_args(resource_version, timeout_s))
        yield from watch_events(resp)

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return self._json(  # type: ignore[no-any-return]
            self.core.patch_node(name, patch, _content_type=MERGE, _preload_content=False)
        )

    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A strategic merge patch through ``nodes/status``. The status subresource resets only the
        Node's spec, so the patch may carry metadata (labels, annotations, the resourceVersion
        precondition) with the status: the operator's first verdict is one write (``actions/nodes.py``,
        ``node_writes``). The answer is the Node, for the cache."""
        return self._json(  # type: ignore[no-any-return]
            self.core.patch_node_status(name, patch, _content_type=STRATEGIC, _preload_content=False)
        )

    # -- pods ------------------------------------------------------------------------------------

    def list_pods_rv(
        self, transform: Callable[[dict[str, Any]], dict[str, Any]] = lambda p: p
    ) -> tuple[list[dict[str, Any]], str, Iterator[Mapping[str, Any]] | None]:
        """Scheduled pods, for their watch (``_listed``). The fleet's longest list: paged, at 10,000
        nodes, it outlived the API server's watch window and its watch began with 410 Gone."""

        def page(cont: str | None) -> dict[str, Any]:
            return self._json(self.core.list_pod_for_all_namespaces(field_selector=SCHEDULED, **page_args(cont)))  # type: ignore[no-any-return]

        return self._listed(
            "pods",
            lambda: self.core.list_pod_for_all_namespaces(field_selector=SCHEDULED, **stream_args()),
            page,
            transform,
        )

    def watch_pods(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        """Raw watch events (parsed JSON, one per line) for scheduled pods, from ``resource_version``."""
        resp = self.core.list_pod_for_all_namespaces(
            field_selector=SCHEDULED,
            **watch_args(resource_version, timeout_s),
        )
        yield from watch_events(resp)

    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return self._json(  # type: ignore[no-any-return]
            self.core.patch_namespaced_pod(name, namespace, patch, _content_type=MERGE, _preload_content=False)
        )

    def evict_pod(self, namespace: str, name: str, uid: str | None, resource_version: str | None = None) -> None:
        """Eviction API only, so PodDisruptionBudgets hold; the pod's own grace period applies.

        ``resource_version``: the pod as the eviction was planned from it. A pod changed since (among
        others: evicted by a second replica that acted for a moment beside this one, since Kopf
        peering is not a lock) answers 409 instead of a second eviction."""
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        if preconditions:
            body["deleteOptions"] = {"preconditions": preconditions}
        drained(self.core.create_namespaced_pod_eviction(name, namespace, body, _preload_content=False))

    def force_delete_pod(self, namespace: str, name: str, uid: str | None) -> None:
        body: dict[str, Any] = {"gracePeriodSeconds": 0}
        if uid:
            body["preconditions"] = {"uid": uid}
        drained(
            self.core.delete_namespaced_pod(name, namespace, body=body, grace_period_seconds=0, _preload_content=False)
        )

    # -- node Leases (the agents' heartbeats) ------------------------------------------------------

    def list_leases_rv(
        self, namespace: str, label_selector: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = lambda o: o
    ) -> tuple[list[dict[str, Any]], str, Iterator[Mapping[str, Any]] | None]:
        """The agents' Leases in ``namespace`` (selected server-side), for their watch (``_listed``)."""

        def page(cont: str | None) -> dict[str, Any]:
            return self._json(  # type: ignore[no-any-return]
                self.coordination.list_namespaced_lease(namespace, label_selector=label_selector, **page_args(cont))
            )

        return self._listed(
            "leases",
            lambda: self.coordination.list_namespaced_lease(namespace, label_selector=label_selector, **stream_args()),
            page,
            transform,
        )

    def watch_leases(
        self, namespace: str, label_selector: str, resource_version: str, timeout_s: int
    ) -> Iterator[dict[str, Any]]:
        """Raw watch events (parsed JSON, one per line) for the agents' Leases, from ``resource_version``."""
        resp = self.coordination.list_namespaced_lease(
            namespace,
            label_selector=label_selector,
            **watch_args(resource_version, timeout_s),
        )
        yield from watch_events(resp)

    # -- our CRDs --------------------------------------------------------------------------------

    def list_custom(
        self, plural: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = _same
    ) -> list[dict[str, Any]]:
        """Our objects page by page, each cut by ``transform`` as its page arrives."""
        return list_rv(functools.partial(self._custom_page, plural), transform)[0]

    def _custom_page(self, plural: str, cont: str | None) -> dict[str, Any]:
        return self._json(self.custom.list_cluster_custom_object(GROUP, VERSION, plural, **page_args(cont)))  # type: ignore[no-any-return]

    def list_custom_rv(
        self, plural: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = _same
    ) -> tuple[list[dict[str, Any]], str, Iterator[Mapping[str, Any]] | None]:
        """The watch's list of our objects (``_listed``: streamed where the server streams lists)."""
        return self._listed(
            plural,
            functools.partial(self._custom_stream, plural),
            functools.partial(self._custom_page, plural),
            transform,
        )

    def _custom_stream(self, plural: str) -> Any:
        """A streaming list of our objects. The client's CustomObjectsApi has no ``sendInitialEvents``,
        so the request is built as it builds its own list of them, with the stream's parameters."""
        args = stream_args()
        query = [
            ("watch", "true"),
            ("sendInitialEvents", "true"),
            ("resourceVersionMatch", args["resource_version_match"]),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(args["timeout_seconds"])),
        ]
        request = self.api.param_serialize(
            "GET",
            "/apis/{group}/{version}/{plural}",
            path_params={"group": GROUP, "version": VERSION, "plural": plural},
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(*request, _request_timeout=args["_request_timeout"])
        if not 200 <= resp.status <= 299:
            resp.read()
            raise client.ApiException.from_response(http_resp=resp, body=None, data=None)
        return resp.response

    def watch_custom(self, plural: str, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        """Raw watch events (parsed JSON, one per line) for our objects, from ``resource_version``."""
        resp = self.custom.list_cluster_custom_object(GROUP, VERSION, plural, **watch_args(resource_version, timeout_s))
        yield from watch_events(resp)

    def get_report(self, name: str) -> dict[str, Any]:
        return self.custom.get_cluster_custom_object(GROUP, VERSION, REPORT_PLURAL, name)  # type: ignore[no-any-return]

    def create_report(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.custom.create_cluster_custom_object(GROUP, VERSION, REPORT_PLURAL, body)  # type: ignore[no-any-return]

    def patch_report_status(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return self.custom.patch_cluster_custom_object_status(  # type: ignore[no-any-return]
            GROUP, VERSION, REPORT_PLURAL, name, patch, _content_type=MERGE
        )

    def delete_report(self, name: str, uid: str | None) -> None:
        """Delete a report; with ``uid``, only that very object (409 if the name now holds another)."""
        body: dict[str, Any] = {"preconditions": {"uid": uid}} if uid else {}
        self.custom.delete_cluster_custom_object(GROUP, VERSION, REPORT_PLURAL, name, body=body)

    def patch_policy_status(self, name: str, patch: Mapping[str, Any]) -> None:
        self.custom.patch_cluster_custom_object_status(GROUP, VERSION, POLICY_PLURAL, name, patch, _content_type=MERGE)
