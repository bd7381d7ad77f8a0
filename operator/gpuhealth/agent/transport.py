"""How the agent's report reaches the API: the :class:`ReportTransport` port the publisher writes
through, its Kubernetes implementation, and a printer for ``--dry-run``.

Apart from the publisher because the publisher's concern is *when* to write (on change, heartbeats,
retries with back-off) and this module's is *how*: the report's identity (kind, name, field
manager) and the API's answers turned into the two outcomes the publisher acts on, gone
(:class:`NotFoundError`) and already there (:class:`AlreadyExistsError`). The node Lease
(``lease.py``) writes under the same field manager and raises the same two.
"""

from __future__ import annotations

import json
import threading
from typing import IO, Any, Protocol

from gpuhealth.api.names import GROUP, VERSION
from gpuhealth.api.names import REPORT_KIND as KIND
from gpuhealth.api.names import REPORT_PLURAL as PLURAL

MERGE_PATCH = "application/merge-patch+json"
FIELD_MANAGER = "gpuhealth-agent"


class NotFoundError(Exception):
    """The report object does not exist (HTTP 404)."""


class AlreadyExistsError(Exception):
    """Create found the report already there (HTTP 409 on create)."""


class ReportTransport(Protocol):
    """How the publisher reaches the API; a fake in unit tests, Kubernetes in production."""

    def get(self, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        ...

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create the object; raises AlreadyExistsError if it exists."""
        ...

    def patch(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Apply a JSON merge patch; raises NotFoundError if the object is gone."""
        ...


class KubeTransport:
    """:class:`ReportTransport` over ``kubernetes.client.CustomObjectsApi``."""

    def __init__(self, api_client: Any, request_timeout_s: tuple[float, float] = (5.0, 15.0)) -> None:
        from kubernetes import client

        self._api = client.CustomObjectsApi(api_client)
        self._api_exception = client.ApiException
        self._timeout = request_timeout_s

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            obj = self._api.get_cluster_custom_object(GROUP, VERSION, PLURAL, name, _request_timeout=self._timeout)
        except self._api_exception as exc:
            if exc.status == 404:
                return None
            raise
        return dict(obj)

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            obj = self._api.create_cluster_custom_object(
                GROUP, VERSION, PLURAL, body, field_manager=FIELD_MANAGER, _request_timeout=self._timeout
            )
        except self._api_exception as exc:
            if exc.status == 409:
                raise AlreadyExistsError(str(exc.reason)) from exc
            raise
        return dict(obj)

    def patch(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        try:
            obj = self._api.patch_cluster_custom_object(
                GROUP,
                VERSION,
                PLURAL,
                name,
                patch,
                field_manager=FIELD_MANAGER,
                _content_type=MERGE_PATCH,
                _request_timeout=self._timeout,
            )
        except self._api_exception as exc:
            if exc.status == 404:
                raise NotFoundError(name) from exc
            raise
        return dict(obj)


class PrintTransport:
    """Writes each create/patch as one JSON line to a stream (``--dry-run`` without ``--once``)."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def _emit(self, record: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._stream.write(json.dumps(record, sort_keys=True) + "\n")
            self._stream.flush()
        return record

    def get(self, name: str) -> dict[str, Any] | None:
        return None

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._emit({"op": "create", "body": body})

    def patch(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._emit({"op": "patch", "name": name, "patch": patch})


class NullTransport:
    """Writes nowhere: an agent that only samples (``--once --dry-run``, which prints the spec itself)."""

    def get(self, name: str) -> dict[str, Any] | None:
        return None

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        return body

    def patch(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return patch


def report_body(node_name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": node_name, "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER}},
        "spec": spec,
    }
