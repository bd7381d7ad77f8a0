"""The operator's only door to the Kubernetes API (plain dicts in, plain dicts out).

Every call here is one request; callers own retries and conflict handling. Objects are returned as
JSON dicts, not the client's model classes, which are slow to build for thousands of Nodes.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from gpuhealth.api.names import (
    COMPONENT,
    DRA_GROUP,
    DRA_VERSION,
    GROUP,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    POLICY_PLURAL,
    REPORT_PLURAL,
    VERSION,
)
from gpuhealth.api.timeutil import format_time_precise
from gpuhealth.kube.errors import is_conflict, is_not_found, retryable, status_of
from gpuhealth.kube.jobs import JobCalls
from gpuhealth.kube.kueue import KueueCalls, KueuePort
from gpuhealth.kube.paging import PAGE, pages

log = logging.getLogger(__name__)
__all__ = ["Kube", "KubePort", "is_conflict", "is_not_found", "retryable", "status_of"]

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
SCHEDULED = "spec.nodeName!="  # only pods placed on a node


def _same(body: dict[str, Any]) -> dict[str, Any]:
    return body


class KubePort(KueuePort, Protocol):
    """What the controller asks of the API; ``Kube`` below, or an in-memory fake in unit tests."""

    def get_node(self, name: str) -> dict[str, Any]: ...
    def list_nodes(
        self, label_selector: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = ...
    ) -> list[dict[str, Any]]: ...
    def list_nodes_rv(
        self, label_selector: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = ...
    ) -> tuple[list[dict[str, Any]], str]: ...
    def watch_nodes(self, label_selector: str, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]: ...
    def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]: ...
    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> None: ...
    def list_pods_rv(
        self, transform: Callable[[dict[str, Any]], dict[str, Any]] = ...
    ) -> tuple[list[dict[str, Any]], str]: ...
    def watch_pods(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]: ...
    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]: ...
    def evict_pod(self, namespace: str, name: str, uid: str | None) -> None: ...
    def force_delete_pod(self, namespace: str, name: str, uid: str | None) -> None: ...
    def list_custom(
        self, plural: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = ...
    ) -> list[dict[str, Any]]: ...
    def list_custom_rv(
        self, plural: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = ...
    ) -> tuple[list[dict[str, Any]], str]: ...
    def watch_custom(self, plural: str, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]: ...
    def list_leases_rv(
        self, namespace: str, label_selector: str, transform: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], str]: ...
    def watch_leases(
        self, namespace: str, label_selector: str, resource_version: str, timeout_s: int
    ) -> Iterator[dict[str, Any]]: ...
    def get_report(self, name: str) -> dict[str, Any]: ...
    def create_report(self, body: Mapping[str, Any]) -> dict[str, Any]: ...
    def patch_report_status(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]: ...
    def delete_report(self, name: str, uid: str | None) -> None: ...
    def patch_policy_status(self, name: str, patch: Mapping[str, Any]) -> None: ...
    def list_resource_slices_rv(self, transform: Callable[[dict[str, Any]], Any]) -> tuple[list[Any], str]: ...
    def watch_resource_slices(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]: ...
    def list_resource_claims(self) -> list[dict[str, Any]]: ...
    def list_device_taint_rules(self) -> list[dict[str, Any]]: ...
    def create_device_taint_rule(self, body: Mapping[str, Any]) -> dict[str, Any]: ...
    def delete_device_taint_rule(self, name: str, uid: str | None = None) -> None: ...
    def get_job(self, namespace: str, name: str) -> dict[str, Any]: ...
    def create_job(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...
    def delete_job(self, namespace: str, name: str) -> None: ...
    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]: ...
    def post_event(
        self,
        kind: str,
        name: str,
        uid: str,
        type_: str,
        reason: str,
        message: str,
        api_version: str = "v1",
        at: dt.datetime | None = None,
        namespace: str = "",
    ) -> None: ...


def _watch_args(resource_version: str, timeout_s: int) -> dict[str, Any]:
    """A watch from ``resource_version`` with bookmarks, ended by the server at ``timeout_s``."""
    return {
        "watch": True,
        "resource_version": resource_version,
        "allow_watch_bookmarks": True,
        "timeout_seconds": timeout_s,
        "_preload_content": False,
        "_request_timeout": (10, timeout_s + 30),
    }


def _list_rv(
    fetch: Callable[[str | None], Mapping[str, Any]], transform: Callable[[dict[str, Any]], dict[str, Any]]
) -> tuple[list[dict[str, Any]], str]:
    """Every item of a paged list through ``transform``, and the resourceVersion of the list."""
    items: list[dict[str, Any]] = []
    rv = ""
    for page in pages(fetch):
        items.extend(transform(o) for o in page.get("items") or [])
        rv = str((page.get("metadata") or {}).get("resourceVersion") or "")
    return items, rv


def _events(resp: Any) -> Iterator[dict[str, Any]]:
    """Raw watch events (parsed JSON, one per line); the connection goes back to the pool at the end."""
    try:
        for line in iter_resp_lines(resp):
            yield json.loads(line)
    finally:
        resp.close()
        resp.release_conn()


class Kube(JobCalls, KueueCalls):
    def __init__(self, api: client.ApiClient, event_namespace: str = "default") -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.coordination = client.CoordinationV1Api(api)
        self.event_namespace = event_namespace
        self.instance = f"{COMPONENT}-{uuid.uuid4().hex[:8]}"

    @staticmethod
    def _json(resp: Any) -> Any:
        return json.loads(resp.data)

    # -- nodes -----------------------------------------------------------------------------------

    def get_node(self, name: str) -> dict[str, Any]:
        return self._json(self.core.read_node(name, _preload_content=False))  # type: ignore[no-any-return]

    def list_nodes(
        self, label_selector: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = _same
    ) -> list[dict[str, Any]]:
        """Nodes page by page; ``transform`` (a slimmer) cuts each before the next page is read."""
        return self.list_nodes_rv(label_selector, transform)[0]

    def list_nodes_rv(
        self, label_selector: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = _same
    ) -> tuple[list[dict[str, Any]], str]:
        """As ``list_nodes``, with the list's resourceVersion to watch from."""

        def fetch(cont: str | None) -> dict[str, Any]:
            return self._json(self.core.list_node(label_selector=label_selector, **_page_args(cont)))  # type: ignore[no-any-return]

        return _list_rv(fetch, transform)

    def watch_nodes(self, label_selector: str, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        """Raw watch events (parsed JSON, one per line) for the selected Nodes, from ``resource_version``."""
        resp = self.core.list_node(label_selector=label_selector, **_watch_args(resource_version, timeout_s))
        yield from _events(resp)

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return self._json(  # type: ignore[no-any-return]
            self.core.patch_node(name, patch, _content_type=MERGE, _preload_content=False)
        )

    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> None:
        self.core.patch_node_status(name, patch, _content_type=STRATEGIC, _preload_content=False)

    # -- pods ------------------------------------------------------------------------------------

    def list_pods_rv(
        self, transform: Callable[[dict[str, Any]], dict[str, Any]] = lambda p: p
    ) -> tuple[list[dict[str, Any]], str]:
        """Scheduled pods, page by page (``transform`` slims each one before the next page is read),
        and the list's resourceVersion to watch from."""

        def fetch(cont: str | None) -> dict[str, Any]:
            kw = _page_args(cont)
            return self._json(self.core.list_pod_for_all_namespaces(field_selector=SCHEDULED, **kw))  # type: ignore[no-any-return]

        return _list_rv(fetch, transform)

    def watch_pods(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        """Raw watch events (parsed JSON, one per line) for scheduled pods, from ``resource_version``."""
        resp = self.core.list_pod_for_all_namespaces(
            field_selector=SCHEDULED,
            **_watch_args(resource_version, timeout_s),
        )
        yield from _events(resp)

    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return self._json(  # type: ignore[no-any-return]
            self.core.patch_namespaced_pod(name, namespace, patch, _content_type=MERGE, _preload_content=False)
        )

    def evict_pod(self, namespace: str, name: str, uid: str | None) -> None:
        """Eviction API only, so PodDisruptionBudgets hold; the pod's own grace period applies."""
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if uid:
            body["deleteOptions"] = {"preconditions": {"uid": uid}}
        self.core.create_namespaced_pod_eviction(name, namespace, body, _preload_content=False)

    def force_delete_pod(self, namespace: str, name: str, uid: str | None) -> None:
        body: dict[str, Any] = {"gracePeriodSeconds": 0}
        if uid:
            body["preconditions"] = {"uid": uid}
        self.core.delete_namespaced_pod(name, namespace, body=body, grace_period_seconds=0, _preload_content=False)

    # -- node Leases (the agents' heartbeats) ------------------------------------------------------

    def list_leases_rv(
        self, namespace: str, label_selector: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = lambda o: o
    ) -> tuple[list[dict[str, Any]], str]:
        """The agents' Leases in ``namespace`` (selected server-side), slimmed page by page, and the
        list's resourceVersion to watch from."""

        def fetch(cont: str | None) -> dict[str, Any]:
            kw = _page_args(cont)
            return self._json(  # type: ignore[no-any-return]
                self.coordination.list_namespaced_lease(namespace, label_selector=label_selector, **kw)
            )

        return _list_rv(fetch, transform)

    def watch_leases(
        self, namespace: str, label_selector: str, resource_version: str, timeout_s: int
    ) -> Iterator[dict[str, Any]]:
        """Raw watch events (parsed JSON, one per line) for the agents' Leases, from ``resource_version``."""
        resp = self.coordination.list_namespaced_lease(
            namespace,
            label_selector=label_selector,
            **_watch_args(resource_version, timeout_s),
        )
        yield from _events(resp)

    # -- our CRDs --------------------------------------------------------------------------------

    def list_custom(
        self, plural: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = _same
    ) -> list[dict[str, Any]]:
        """Our objects page by page, each cut by ``transform`` as its page arrives."""
        return self.list_custom_rv(plural, transform)[0]

    def list_custom_rv(
        self, plural: str, transform: Callable[[dict[str, Any]], dict[str, Any]] = _same
    ) -> tuple[list[dict[str, Any]], str]:
        """As ``list_custom``, with the list's resourceVersion to watch from."""

        def fetch(cont: str | None) -> dict[str, Any]:
            kw = _page_args(cont)
            return self._json(self.custom.list_cluster_custom_object(GROUP, VERSION, plural, **kw))  # type: ignore[no-any-return]

        return _list_rv(fetch, transform)

    def watch_custom(self, plural: str, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        """Raw watch events (parsed JSON, one per line) for our objects, from ``resource_version``."""
        resp = self.custom.list_cluster_custom_object(
            GROUP, VERSION, plural, **_watch_args(resource_version, timeout_s)
        )
        yield from _events(resp)

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

    # -- DRA (resource.k8s.io/v1) ---------------------------------------------------------------

    def _list_dra(
        self, plural: str, transform: Callable[[dict[str, Any]], Any] = lambda o: o, **kw: Any
    ) -> tuple[list[Any], str]:
        """Every object of a cluster-wide DRA list, page by page, and the list's resourceVersion."""
        items: list[Any] = []
        cont = None
        while True:
            args: dict[str, Any] = {"limit": 500, "_preload_content": False, **kw}
            if cont:
                args["_continue"] = cont
            data = self._json(self.custom.list_cluster_custom_object(DRA_GROUP, DRA_VERSION, plural, **args))
            items.extend(transform(o) for o in data.get("items") or [])
            meta = data.get("metadata") or {}
            cont = meta.get("continue")
            if not cont:
                return items, str(meta.get("resourceVersion") or "")

    def list_resource_slices_rv(self, transform: Callable[[dict[str, Any]], Any]) -> tuple[list[Any], str]:
        """ResourceSlices (each slimmed by ``transform`` as it is read) and the resourceVersion to watch from."""
        return self._list_dra("resourceslices", transform)

    def watch_resource_slices(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        """Raw watch events (parsed JSON, one per line) for ResourceSlices, from ``resource_version``."""
        resp = self.custom.list_cluster_custom_object(
            DRA_GROUP,
            DRA_VERSION,
            "resourceslices",
            **_watch_args(resource_version, timeout_s),
        )
        yield from _events(resp)

    def list_resource_claims(self) -> list[dict[str, Any]]:
        """ResourceClaims of every namespace: which pods hold which devices (status.allocation, reservedFor)."""
        return self._list_dra("resourceclaims")[0]

    def list_device_taint_rules(self) -> list[dict[str, Any]]:
        """gpuhealth's own DeviceTaintRules (by label): nobody else's is ever read for change."""
        return self._list_dra("devicetaintrules", label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}")[0]

    def create_device_taint_rule(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create one rule; 409 if its (deterministic) name exists, which callers treat as done."""
        return self._json(  # type: ignore[no-any-return]
            self.custom.create_cluster_custom_object(
                DRA_GROUP, DRA_VERSION, "devicetaintrules", body, _preload_content=False
            )
        )

    def delete_device_taint_rule(self, name: str, uid: str | None = None) -> None:
        """Delete one rule, only the object that was read (uid precondition) when ``uid`` is given."""
        body: dict[str, Any] = {"preconditions": {"uid": uid}} if uid else {}
        self.custom.delete_cluster_custom_object(
            DRA_GROUP, DRA_VERSION, "devicetaintrules", name, body=body, _preload_content=False
        )

    # -- events ----------------------------------------------------------------------------------

    def post_event(
        self,
        kind: str,
        name: str,
        uid: str,
        type_: str,
        reason: str,
        message: str,
        api_version: str = "v1",
        at: dt.datetime | None = None,
        namespace: str = "",
    ) -> None:
        """A core/v1 Event; for Nodes the uid is the node name, as kubelet does, so `describe` finds it.
        A namespaced object's Event (``namespace``: a Kueue Workload's) goes into its own namespace.

        ``at`` is when it happened (Events are posted in the background, a moment later). The name is
        derived from the Event itself, so a retry after a lost response (the first POST did land)
        finds it already there instead of posting the same announcement twice.
        """
        now = at or dt.datetime.now(dt.UTC)
        ns = namespace or self.event_namespace
        digest = hashlib.sha256(f"{kind}/{name}/{reason}/{message}/{self.instance}".encode()).hexdigest()[:8]
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{name}.{now.strftime('%Y%m%d%H%M%S%f')}{digest}",
                "namespace": ns,
            },
            "involvedObject": {
                "kind": kind,
                "name": name,
                "uid": uid,
                "apiVersion": api_version,
                **({"namespace": namespace} if namespace else {}),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
            "action": reason,
            "firstTimestamp": format_time_precise(now)[:19] + "Z",
            "lastTimestamp": format_time_precise(now)[:19] + "Z",
            "eventTime": format_time_precise(now),
            "count": 1,
        }
        try:
            self.core.create_namespaced_event(ns, body, _preload_content=False)
        except Exception as e:
            if not is_conflict(e):
                raise  # 409: this very Event was posted by an earlier try whose response was lost


def _page_args(cont: str | None) -> dict[str, Any]:
    kw: dict[str, Any] = {"limit": PAGE, "_preload_content": False}
    if cont:
        kw["_continue"] = cont
    return kw
