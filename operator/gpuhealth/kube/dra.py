"""The DRA calls of ``Kube`` (``resource.k8s.io/v1``): ResourceSlices watched, ResourceClaims read,
gpuhealth's own DeviceTaintRules created and deleted. One request per call.

A concern of its own because per-device quarantine is the only user, and because DRA objects are
cluster-wide lists of the generic custom-object kind; ``Kube`` inherits them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from kubernetes import client

from gpuhealth.api.names import DRA_GROUP, DRA_VERSION, MANAGED_BY_LABEL, MANAGED_BY_VALUE
from gpuhealth.kube.deadline import drained
from gpuhealth.kube.paging import PAGE, SLICE_PAGE, list_rv, page_args
from gpuhealth.kube.watches import watch_args, watch_events


class DraPort(Protocol):
    """The DRA part of ``KubePort``."""

    def list_resource_slices_rv(self, transform: Callable[[dict[str, Any]], Any]) -> tuple[list[Any], str]: ...
    def watch_resource_slices(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]: ...
    def list_resource_claims(self) -> list[dict[str, Any]]: ...
    def list_device_taint_rules(self) -> list[dict[str, Any]]: ...
    def create_device_taint_rule(self, body: Mapping[str, Any]) -> dict[str, Any]: ...
    def delete_device_taint_rule(self, name: str, uid: str | None = None) -> None: ...


class DraCalls:
    custom: client.CustomObjectsApi

    def _list_dra(
        self, plural: str, transform: Callable[[dict[str, Any]], Any] = lambda o: o, limit: int = PAGE, **kw: Any
    ) -> tuple[list[Any], str]:
        """Every object of a cluster-wide DRA list, page by page, and the list's resourceVersion."""

        def fetch(cont: str | None) -> dict[str, Any]:
            resp = self.custom.list_cluster_custom_object(
                DRA_GROUP, DRA_VERSION, plural, **page_args(cont, limit), **kw
            )
            return json.loads(resp.data)  # type: ignore[no-any-return]

        return list_rv(fetch, transform)

    def list_resource_slices_rv(self, transform: Callable[[dict[str, Any]], Any]) -> tuple[list[Any], str]:
        """ResourceSlices (each slimmed by ``transform`` as it is read) and the resourceVersion to watch from."""
        return self._list_dra("resourceslices", transform, SLICE_PAGE)

    def watch_resource_slices(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        """Raw watch events (parsed JSON, one per line) for ResourceSlices, from ``resource_version``."""
        resp = self.custom.list_cluster_custom_object(
            DRA_GROUP,
            DRA_VERSION,
            "resourceslices",
            **watch_args(resource_version, timeout_s),
        )
        yield from watch_events(resp)

    def list_resource_claims(self) -> list[dict[str, Any]]:
        """ResourceClaims of every namespace: which pods hold which devices (status.allocation, reservedFor)."""
        return self._list_dra("resourceclaims")[0]

    def list_device_taint_rules(self) -> list[dict[str, Any]]:
        """gpuhealth's own DeviceTaintRules (by label): nobody else's is ever read for change."""
        return self._list_dra("devicetaintrules", label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}")[0]

    def create_device_taint_rule(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create one rule; 409 if its (deterministic) name exists, which callers treat as done."""
        resp = self.custom.create_cluster_custom_object(
            DRA_GROUP, DRA_VERSION, "devicetaintrules", body, _preload_content=False
        )
        return json.loads(resp.data)  # type: ignore[no-any-return]

    def delete_device_taint_rule(self, name: str, uid: str | None = None) -> None:
        """Delete one rule, only the object that was read (uid precondition) when ``uid`` is given."""
        body: dict[str, Any] = {"preconditions": {"uid": uid}} if uid else {}
        drained(
            self.custom.delete_cluster_custom_object(
                DRA_GROUP, DRA_VERSION, "devicetaintrules", name, body=body, _preload_content=False
            )
        )
