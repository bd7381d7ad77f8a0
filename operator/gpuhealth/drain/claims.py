"""Which pods hold a DRA device: from ResourceClaims and pods, pure.

A pod holds a device when a ResourceClaim allocated to it lists the device among
``status.allocation.devices.results[] {driver, pool, device}``. The claim names its consumers in
``status.reservedFor[]`` (resource ``pods``, name, uid); a pod names its claims in
``status.resourceClaimStatuses[]`` (claims generated from a ResourceClaimTemplate),
``spec.resourceClaims[].resourceClaimName`` (a shared claim) and
``status.extendedResourceClaimStatus`` (a pod that asked for an extended resource such as
``nvidia.com/gpu`` served through a DeviceClass's ``extendedResourceName``). Either side is enough:
reservedFor can lag a pod that is just starting, and a pod's status can lag its claim.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuhealth.api.devices import DeviceRef


def claim_devices(claim: Mapping[str, Any]) -> set[DeviceRef]:
    """The devices allocated to ``claim``."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return {
        DeviceRef(str(r.get("driver") or ""), str(r.get("pool") or ""), str(r.get("device") or ""))
        for r in results
        if isinstance(r, Mapping)
    }


def _claim_key(claim: Mapping[str, Any]) -> str:
    m = claim.get("metadata") or {}
    return f"{m.get('namespace', '')}/{m.get('name', '')}"


def pod_claim_names(pod: Mapping[str, Any]) -> set[str]:
    """Names of the ResourceClaims (in the pod's namespace) that ``pod`` uses."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    names = {
        str(c.get("resourceClaimName")) for c in status.get("resourceClaimStatuses") or [] if c.get("resourceClaimName")
    }
    names |= {str(c.get("resourceClaimName")) for c in spec.get("resourceClaims") or [] if c.get("resourceClaimName")}
    ext = status.get("extendedResourceClaimStatus") or {}
    if ext.get("resourceClaimName"):
        names.add(str(ext["resourceClaimName"]))
    return names


def devices_by_pod(
    claims: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]] = ()
) -> dict[str, set[DeviceRef]]:
    """Each pod (``namespace/name``) that holds a device -> the devices its claims were allocated."""
    named: dict[str, set[str]] = {}  # claim key -> the pods that name it
    for pod in pods:
        m = pod.get("metadata") or {}
        ns = m.get("namespace", "")
        for c in pod_claim_names(pod):
            named.setdefault(f"{ns}/{c}", set()).add(f"{ns}/{m.get('name', '')}")
    out: dict[str, set[DeviceRef]] = {}
    for claim in claims:
        devices = claim_devices(claim)
        if not devices:
            continue
        ns = (claim.get("metadata") or {}).get("namespace", "")
        holders = set(named.get(_claim_key(claim), ()))
        for ref in (claim.get("status") or {}).get("reservedFor") or []:
            if ref.get("resource") == "pods" and not ref.get("apiGroup") and ref.get("name"):
                holders.add(f"{ns}/{ref['name']}")
        for key in holders:
            out.setdefault(key, set()).update(devices)
    return out


def pods_holding(
    devices: Iterable[DeviceRef], claims: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]] = ()
) -> set[str]:
    """Keys (``namespace/name``) of the pods that hold any of ``devices``."""
    wanted = set(devices)
    return {key for key, held in devices_by_pod(claims, pods).items() if held & wanted}
