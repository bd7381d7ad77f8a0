"""The agent's heartbeat: a `coordination.k8s.io/v1` Lease per node, renewed on schedule.

Kubernetes solved the same problem for kubelets (KEP-589, node Leases): a heartbeat that rewrote
the whole Node status cost etcd and every watcher of Nodes a full object each time. gpuhealth's
report is the same shape (8 GPUs of counters, XIDs), so the agent renews a tiny Lease named after
its node instead, and writes the GPUNodeHealth spec only when a fact changes. The operator watches
the Leases separately and treats a renewal as a sign of life, by its own clock.

A renewal is one JSON merge patch (``renewTime``, ``holderIdentity``, ``leaseDurationSeconds`` and
the label the operator's watch selects on). A renewal says that the agent lives, not that its facts
are fresh, so it also says how old they are: the annotation ``gpuhealth.dev/sampled-at`` carries the
time of the newest completed NVML sample, and while an NVML call hangs (``watchdog.py``)
``gpuhealth.dev/nvml-unresponsive`` names it and since when; that change is renewed at once.

A missing Lease is created; a create that finds it there (another agent start raced us) patches it.
Every step is idempotent, so a restarted agent simply renews again. Failures are raised to the
publisher, which retries them like report writes.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import IO, Any, Protocol

from gpuhealth.agent.transport import FIELD_MANAGER, MERGE_PATCH, AlreadyExistsError, NotFoundError
from gpuhealth.api.names import (
    AGENT_MANAGER,
    LEASE_NVML_UNRESPONSIVE_ANNOTATION,
    MANAGED_BY_LABEL,
)

LEASE_API_VERSION = "coordination.k8s.io/v1"
# The operator's Lease watch selects on this label, server-side.
MANAGED_BY = {MANAGED_BY_LABEL: AGENT_MANAGER}


class LeaseTransport(Protocol):
    """How a renewal reaches the API: Kubernetes in production, a fake or a printer otherwise."""

    def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """Merge-patch the Lease; raises NotFoundError if it does not exist."""
        ...

    def create(self, body: dict[str, Any]) -> None:
        """Create the Lease; raises AlreadyExistsError if it exists."""
        ...


def micro_time(t: datetime) -> str:
    """Kubernetes MicroTime (RFC 3339 with microseconds, UTC, ``Z``)."""
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_duration_s(heartbeat_interval_s: float) -> int:
    """How long one renewal vouches for the holder: four intervals, as the kubelet's 40 s per 10 s."""
    return max(1, math.ceil(4 * heartbeat_interval_s))


class NodeLease:
    """Renews one node's Lease: patch, create when missing, patch again when a create raced."""

    def __init__(
        self,
        transport: LeaseTransport,
        namespace: str,
        node: str,
        heartbeat_interval_s: float,
        vouches: Callable[[], Mapping[str, str | None]] | None = None,
    ) -> None:
        self.transport = transport
        self.namespace = namespace
        self.node = node
        self.duration_s = lease_duration_s(heartbeat_interval_s)
        # The annotations a renewal carries about the facts (None removes one); see the module's doc.
        self.vouches = vouches or dict
        self._sent_hang: str | None = None

    def renewal(self, now: datetime) -> dict[str, Any]:
        """The merge patch of one renewal (also what a create carries, with the identity added)."""
        spec = {"holderIdentity": self.node, "leaseDurationSeconds": self.duration_s, "renewTime": micro_time(now)}
        meta: dict[str, Any] = {"labels": dict(MANAGED_BY)}
        annotations = dict(self.vouches())
        if annotations:
            meta["annotations"] = annotations
        return {"metadata": meta, "spec": spec}

    def changed(self) -> bool:
        """Whether what a renewal says about NVML changed since the last one sent (renew now, not on
        schedule: a Lease must not vouch for facts that stopped being refreshed)."""
        return self.vouches().get(LEASE_NVML_UNRESPONSIVE_ANNOTATION) != self._sent_hang

    def renew(self, now: datetime) -> str:
        """Renew once; returns "renew" or "create" (what was sent last)."""
        patch = self.renewal(now)
        hang = (patch["metadata"].get("annotations") or {}).get(LEASE_NVML_UNRESPONSIVE_ANNOTATION)
        kind = self._send(patch)
        self._sent_hang = hang
        return kind

    def _send(self, patch: dict[str, Any]) -> str:
        try:
            self.transport.patch(self.namespace, self.node, patch)
            return "renew"
        except NotFoundError:
            pass
        meta = dict(patch["metadata"])
        if meta.get("annotations"):
            meta["annotations"] = {k: v for k, v in meta["annotations"].items() if v is not None}
        body = {
            "apiVersion": LEASE_API_VERSION,
            "kind": "Lease",
            "metadata": {"name": self.node, "namespace": self.namespace, **meta},
            "spec": {**patch["spec"], "acquireTime": patch["spec"]["renewTime"]},
        }
        try:
            self.transport.create(body)
            return "create"
        except AlreadyExistsError:
            self.transport.patch(self.namespace, self.node, patch)
            return "renew"


class KubeLeaseTransport:
    """:class:`LeaseTransport` over ``kubernetes.client.CoordinationV1Api`` (responses not decoded)."""

    def __init__(self, api_client: Any, request_timeout_s: tuple[float, float] = (5.0, 15.0)) -> None:
        from kubernetes import client

        self._api = client.CoordinationV1Api(api_client)
        self._api_exception = client.ApiException
        self._timeout = request_timeout_s

    def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        try:
            self._api.patch_namespaced_lease(
                name,
                namespace,
                patch,
                field_manager=FIELD_MANAGER,
                _content_type=MERGE_PATCH,
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        except self._api_exception as exc:
            if exc.status == 404:
                raise NotFoundError(name) from exc
            raise

    def create(self, body: dict[str, Any]) -> None:
        try:
            self._api.create_namespaced_lease(
                body["metadata"]["namespace"],
                body,
                field_manager=FIELD_MANAGER,
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        except self._api_exception as exc:
            if exc.status == 409:
                raise AlreadyExistsError(str(exc.reason)) from exc
            raise


class PrintLeaseTransport:
    """Writes each renewal as one JSON line (``--dry-run`` without ``--once``)."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        with self._lock:
            record = {"op": "renew-lease", "namespace": namespace, "name": name, "patch": patch}
            self._stream.write(json.dumps(record, sort_keys=True) + "\n")
            self._stream.flush()

    def create(self, body: dict[str, Any]) -> None:  # pragma: no cover - patch never raises NotFound here
        self.patch(body["metadata"]["namespace"], body["metadata"]["name"], body)
