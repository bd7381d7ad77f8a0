"""The Kueue calls of ``Kube`` (``kueue.x-k8s.io/v1beta2``): Workloads and AdmissionChecks watched,
gpuhealth's entry in a Workload's ``status.admissionChecks`` and its AdmissionCheck's ``Active``
condition written by server-side apply, ResourceFlavors read. One request per call.

Kept apart from ``client.py`` only for size; ``Kube`` inherits them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from kubernetes import client

from gpuhealth.api.names import COMPONENT, KUEUE_GROUP, KUEUE_VERSION
from gpuhealth.kube.errors import is_not_found
from gpuhealth.kube.paging import PAGE, pages
from gpuhealth.kube.watches import watch_events

APPLY = "application/apply-patch+yaml"


class KueuePort(Protocol):
    """The Kueue part of ``KubePort``."""

    def kueue_served(self) -> bool: ...
    def kueue_allowed(self) -> bool: ...
    def list_workloads_rv(
        self, transform: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], str]: ...
    def watch_workloads(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]: ...
    def list_admission_checks_rv(
        self, transform: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], str]: ...
    def watch_admission_checks(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]: ...
    def apply_workload_status(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]: ...
    def apply_admission_check_status(self, name: str, body: Mapping[str, Any]) -> None: ...
    def get_resource_flavor(self, name: str) -> dict[str, Any]: ...


class KueueCalls:
    api: client.ApiClient

    def _custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def kueue_served(self) -> bool:
        """Whether the API server serves Kueue's v1beta2 API (discovery; no RBAC needed)."""
        try:
            self._custom().get_api_resources(KUEUE_GROUP, KUEUE_VERSION, _preload_content=False)
        except client.ApiException as e:
            if is_not_found(e):
                return False
            raise
        return True

    def kueue_allowed(self) -> bool:
        """Whether this identity may watch Workloads and write their status (SelfSubjectAccessReview,
        which every authenticated user may ask), so ``auto`` never starts into a wall of 403s."""
        auth = client.AuthorizationV1Api(self.api)
        for verb, sub in (("watch", ""), ("patch", "status")):
            review = {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {
                    "resourceAttributes": {
                        "group": KUEUE_GROUP,
                        "resource": "workloads",
                        "verb": verb,
                        **({"subresource": sub} if sub else {}),
                    }
                },
            }
            resp = auth.create_self_subject_access_review(review, _preload_content=False)
            if not (json.loads(resp.data).get("status") or {}).get("allowed"):
                return False
        return True

    def _list_kueue_rv(
        self, plural: str, transform: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        rv = ""

        def fetch(cont: str | None) -> dict[str, Any]:
            kw: dict[str, Any] = {"limit": PAGE, "_preload_content": False}
            if cont:
                kw["_continue"] = cont
            resp = self._custom().list_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, **kw)
            return json.loads(resp.data)  # type: ignore[no-any-return]

        for page in pages(fetch):
            items.extend(transform(o) for o in page.get("items") or [])
            rv = str((page.get("metadata") or {}).get("resourceVersion") or "")
        return items, rv

    def _watch_kueue(self, plural: str, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        resp = self._custom().list_cluster_custom_object(
            KUEUE_GROUP,
            KUEUE_VERSION,
            plural,
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_s,
            _preload_content=False,
            _request_timeout=(10, timeout_s + 30),
        )
        yield from watch_events(resp)

    def list_workloads_rv(
        self, transform: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], str]:
        """Workloads of every namespace (Kueue offers no server-side filter on admission), slimmed page
        by page, and the list's resourceVersion to watch from."""
        return self._list_kueue_rv("workloads", transform)

    def watch_workloads(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        return self._watch_kueue("workloads", resource_version, timeout_s)

    def list_admission_checks_rv(
        self, transform: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], str]:
        return self._list_kueue_rv("admissionchecks", transform)

    def watch_admission_checks(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        return self._watch_kueue("admissionchecks", resource_version, timeout_s)

    def apply_workload_status(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of ``body`` (our admission check entry) to the Workload's status."""
        resp = self._custom().patch_namespaced_custom_object_status(
            KUEUE_GROUP,
            KUEUE_VERSION,
            namespace,
            "workloads",
            name,
            body,
            field_manager=COMPONENT,
            force=True,
            _content_type=APPLY,
            _preload_content=False,
        )
        return json.loads(resp.data)  # type: ignore[no-any-return]

    def apply_admission_check_status(self, name: str, body: Mapping[str, Any]) -> None:
        """Server-side apply of the AdmissionCheck's ``Active`` condition (Kueue admits nothing through an
        inactive check)."""
        self._custom().patch_cluster_custom_object_status(
            KUEUE_GROUP,
            KUEUE_VERSION,
            "admissionchecks",
            name,
            body,
            field_manager=COMPONENT,
            force=True,
            _content_type=APPLY,
            _preload_content=False,
        )

    def get_resource_flavor(self, name: str) -> dict[str, Any]:
        resp = self._custom().get_cluster_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, "resourceflavors", name, _preload_content=False
        )
        return json.loads(resp.data)  # type: ignore[no-any-return]
