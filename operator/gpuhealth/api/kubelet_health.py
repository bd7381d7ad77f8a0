"""The kubelet's own view of a container's devices: ``allocatedResourcesStatus`` in pod status.

KEP-4680 (feature gate ``ResourceHealthStatus``, beta and on by default in Kubernetes 1.37) has the
kubelet write, per container, the health of every device allocated to it:
``status.containerStatuses[].allocatedResourcesStatus[]`` is ``{name, resources[]}``, ``name`` the
resource (``nvidia.com/gpu``, or ``claim:<claim>/<request>`` for DRA) and each of ``resources[]``
``{resourceID, health, message}`` (k8s.io/api core/v1 ``ResourceStatus``, ``ResourceHealth``).
``health`` is ``Healthy``, ``Unhealthy`` or ``Unknown``; ``message`` only with the gate
``ResourceHealthStatusMessage`` and a DRA driver that gives one.

``resourceID`` is the device plugin's device ID (NVIDIA's plugin: the GPU's or MIG device's UUID, with
``::<n>`` appended for a time-sliced or MPS replica) or a DRA device's ``<driver>/<pool>/<device>``.
A status without the field (the gate off, a kubelet before it, a container not started) is "not
reported", which is not "healthy".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
UNKNOWN = "Unknown"
# A device plugin's replica suffix: NVIDIA's plugin names a time-sliced or MPS share ``<uuid>::<n>``.
REPLICA_SEPARATOR = "::"
# Worst first: what one line says about several devices of one GPU held by one container.
_SEVERITY = {UNHEALTHY: 0, UNKNOWN: 1, HEALTHY: 2}

# The container statuses that can hold a device: the app containers and the init containers (a
# sidecar, an init container with restartPolicy Always, runs beside them).
_STATUS_LISTS = ("containerStatuses", "initContainerStatuses")


def device_uuid(device_id: str) -> str:
    """A device plugin's device ID without a replica's ``::<n>``: the GPU's or MIG device's UUID."""
    return device_id.split(REPLICA_SEPARATOR, 1)[0]


@dataclass(frozen=True, order=True)
class DeviceHealth:
    """One device the kubelet reports for one container: ``resource`` is the ``ResourceStatus`` name,
    ``resource_id`` its ``resourceID`` as written, ``health`` its health (absent: ``Unknown``)."""

    container: str
    resource: str
    resource_id: str
    health: str
    message: str = ""

    @property
    def device(self) -> str:
        """The device it names: the resource ID without a replica's suffix."""
        return device_uuid(self.resource_id)


def allocated_resources_status(pod: Mapping[str, Any], container: str | None = None) -> tuple[DeviceHealth, ...] | None:
    """Every device the kubelet reports healthy or not for ``container`` of ``pod`` (every container
    when None), or None where no such container status carries ``allocatedResourcesStatus``."""
    status = pod.get("status") or {}
    found: list[DeviceHealth] = []
    reported = False
    for key in _STATUS_LISTS:
        for cs in status.get(key) or []:
            if not isinstance(cs, Mapping) or (container is not None and cs.get("name") != container):
                continue
            entries = cs.get("allocatedResourcesStatus")
            if not isinstance(entries, list):
                continue
            reported = True
            found += _entries(str(cs.get("name") or ""), entries)
    return tuple(sorted(found)) if reported else None


def _entries(container: str, entries: Iterable[Any]) -> list[DeviceHealth]:
    out = []
    for e in entries:
        if not isinstance(e, Mapping):
            continue
        for r in e.get("resources") or []:
            if isinstance(r, Mapping) and r.get("resourceID"):
                out.append(
                    DeviceHealth(
                        container=container,
                        resource=str(e.get("name") or ""),
                        resource_id=str(r["resourceID"]),
                        health=str(r.get("health") or UNKNOWN),
                        message=str(r.get("message") or ""),
                    )
                )
    return out


def worst(healths: Iterable[str]) -> str | None:
    """The worst of several healths (Unhealthy, then Unknown, then any other word, then Healthy);
    None for none."""
    return min(healths, key=lambda h: _SEVERITY.get(h, 1.5), default=None)
