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


def pods_holding(
    devices: Iterable[DeviceRef], claims: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]] = ()
) -> set[str]:
    """Keys (``namespace/name``) of the pods that hold any of ``devices``."""
    wanted = set(devices)
    holding: set[str] = set()  # claim keys
    out: set[str] = set()
    for claim in claims:
        if not claim_devices(claim) & wanted:
            continue
        holding.add(_claim_key(claim))
        ns = (claim.get("metadata") or {}).get("namespace", "")
        for ref in (claim.get("status") or {}).get("reservedFor") or []:
            if ref.get("resource") == "pods" and not ref.get("apiGroup") and ref.get("name"):
                out.add(f"{ns}/{ref['name']}")
    for pod in pods:
        m = pod.get("metadata") or {}
        ns = m.get("namespace", "")
        if any(f"{ns}/{c}" in holding for c in pod_claim_names(pod)):
            out.add(f"{ns}/{m.get('name', '')}")
    return out
