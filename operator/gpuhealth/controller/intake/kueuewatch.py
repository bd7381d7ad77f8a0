"""Slim list-then-watch of Kueue's Workloads and AdmissionChecks, and the cache the admission room reads.

Kueue offers no server-side filter on a Workload's admission or checks, so every Workload is watched;
each is cut, as soon as it is parsed, to what the admission room reads: its owner (the Job), the
conditions that say where it stands, the admission (flavors, GPU usage, topology) and the check
states. AdmissionChecks are few; only gpuhealth's (by ``spec.controllerName``) are kept. The
protocol (list, watch with bookmarks, resume, list again on 410 Gone) is ``reflector.py``'s.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuhealth.api.names import ADMISSION_CHECK_CONTROLLER
from gpuhealth.drain import kueue as K
from gpuhealth.kube.versions import older

CONDITIONS = ("QuotaReserved", "Admitted", "Evicted", "Finished")


def slim_workload(body: Mapping[str, Any], resources: Collection[str] = K.GPU_RESOURCES) -> dict[str, Any]:
    """The Workload cut to what the room reads; of its usage, only the quota names that count GPUs."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    slim_meta: dict[str, Any] = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta}
    refs = [
        {k: r.get(k) for k in ("kind", "name", "uid", "controller")}
        for r in meta.get("ownerReferences") or []
        if r.get("controller")
    ]
    if refs:
        slim_meta["ownerReferences"] = refs
    slim_status: dict[str, Any] = {
        "conditions": [
            {k: c.get(k) for k in ("type", "status", "reason")}
            for c in status.get("conditions") or []
            if c.get("type") in CONDITIONS
        ],
        "admissionChecks": [
            {k: c.get(k) for k in ("name", "state", "retryCount")} for c in status.get("admissionChecks") or []
        ],
    }
    if adm := status.get("admission"):
        slim_status["admission"] = {
            "clusterQueue": adm.get("clusterQueue"),
            "podSetAssignments": [
                {
                    "name": a.get("name"),
                    "flavors": a.get("flavors") or {},
                    "count": a.get("count"),
                    "resourceUsage": {r: q for r, q in (a.get("resourceUsage") or {}).items() if r in resources},
                    **({"topologyAssignment": a["topologyAssignment"]} if a.get("topologyAssignment") else {}),
                }
                for a in adm.get("podSetAssignments") or []
            ],
        }
    return {"metadata": slim_meta, "status": slim_status}


def slim_check(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    active = [c for c in (body.get("status") or {}).get("conditions") or [] if c.get("type") == "Active"]
    return {
        "metadata": {k: meta.get(k) for k in ("name", "uid", "resourceVersion", "generation")},
        "spec": {"controllerName": (body.get("spec") or {}).get("controllerName")},
        "status": {"conditions": [{k: c.get(k) for k in ("type", "status", "observedGeneration")} for c in active]},
    }


@dataclass
class KueueCache:
    """Workloads by ``namespace/name``, their owners' keys, and gpuhealth's AdmissionChecks by name."""

    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    by_owner: dict[str, str] = field(default_factory=dict)
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)

    def put_workload(self, wl: dict[str, Any]) -> str:
        key = K.key(wl)
        self.drop_workload(key)
        self.workloads[key] = wl
        if owner := K.workload_owner(wl):
            self.by_owner[owner] = key
        return key

    def refresh_workload(self, wl: dict[str, Any]) -> None:
        """Cache our own write's answer, unless the watch has brought a newer Workload meanwhile (Kueue
        admitting it, say): the answer resumes the writing task only after what the loop had queued."""
        old = self.workloads.get(K.key(wl))
        rv, cached = (wl.get("metadata") or {}).get("resourceVersion"), ((old or {}).get("metadata") or {})
        if old is not None and older(rv, cached.get("resourceVersion")):
            return
        self.put_workload(wl)

    def drop_workload(self, key: str) -> None:
        old = self.workloads.pop(key, None)
        if old is not None and (owner := K.workload_owner(old)) and self.by_owner.get(owner) == key:
            del self.by_owner[owner]

    def put_check(self, check: dict[str, Any]) -> bool:
        """Keep it if it is gpuhealth's; True if it is."""
        name = check["metadata"]["name"]
        if check["spec"].get("controllerName") != ADMISSION_CHECK_CONTROLLER:
            self.checks.pop(name, None)
            return False
        self.checks[name] = check
        return True

    def workload_of(self, pod: Mapping[str, Any]) -> dict[str, Any] | None:
        """The Workload a pod runs for: named on the pod by Kueue, else found by the pod's owner."""
        named, owner = K.pod_refs(pod)
        if named and named in self.workloads:
            return self.workloads[named]
        if owner and owner in self.by_owner:
            return self.workloads.get(self.by_owner[owner])
        return None
