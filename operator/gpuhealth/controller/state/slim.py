"""Slim copies of watched objects: only the fields the operator reads, with shared strings.

Every cached Node, report and pod costs memory for as long as it exists, and a fleet holds tens of
thousands of them; a body as the watch decodes it has its own copy of every key and value (a real
Node's image list and managed fields, an agent report's power readings, PCI bus ids and DCGM
details are most of its size, and nothing here reads them). So each body is cut to what is read,
on the way into the cache, and dictionary keys and short repeated strings (label keys and values,
GPU models, states, reasons) are interned, so that ten thousand nodes share one copy of each.

What is read, and by whom:
- Node: labels (policy selection, GPU count), gpuhealth's own annotations (ownership, release),
  taints and ``unschedulable`` (``actions/nodes.py``), the GPU capacity (and the device plugin's
  ``nvidia.com/mig-*`` capacities) and allocatable ``nvidia.com/gpu`` (``actions/plugin_hold.py``), the ``GPUHealthy``
  condition, and name, uid and resourceVersion (write preconditions).
- GPUNodeHealth: what ``api/report.py`` ``parse_report`` reads of the spec, as the report
  contract's field table lists it (``api/report_fields.py`` READ; a malformed part is kept whole,
  so that it is refused exactly as it would be uncut), the whole status (the
  operator's own record), and name, uid, generation and resourceVersion (freshness, preconditions);
  of ``managedFields`` only the API server's time of the agent's last heartbeat write, as one
  derived ``metadata.writtenAt`` (``evaluation/freshness.py``: start-up freshness reads it).
- Pod: what drains, restart-loop detection and Kueue's mover read (``slim_pod``; of its labels and
  annotations the keys ``api/pods.py`` lists as read).
- Lease (the agents' heartbeats): name, uid, ``renewTime`` and the server's time of it.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, NoReturn

from gpuhealth.api import pods as P
from gpuhealth.api.names import CONDITION_TYPE, GPU_RESOURCE, GROUP
from gpuhealth.api.nodes import MIG_RESOURCE_PREFIX
from gpuhealth.api.report_fields import read_lists_under, read_objects_under, read_under
from gpuhealth.evaluation.freshness import LEASE_HEARTBEAT, REPORT_HEARTBEAT, written

_SHORT = 64  # strings up to this length are interned: keys, label values, states, models, times

# A pod's own metadata strings: kept as decoded (see ``slim_pod``); its namespace, labels, annotations
# and controller reference are read too, and shared.
_POD_OWN = ("name", "uid", "resourceVersion", "deletionTimestamp")
_OWN_PREFIX = f"{GROUP}/"

# Report spec fields, and per-device fields and sub-fields: what parse_report reads, from the report
# contract's one field table (a field it does not list as read is dropped, with its reason, there).
_SPEC_KEYS = read_under("spec")
_NVML_KEYS = read_under("spec.nvml") + tuple(read_objects_under("spec.nvml"))  # + unresponsive, whole
# The spec's other objects of scalars (podResources), each with what is read of it.
_SPEC_PARTS = {k: v for k, v in read_objects_under("spec").items() if k != "nvml"}
_DEVICE_KEYS = read_under("spec.devices[]")
_DEVICE_PARTS = read_objects_under("spec.devices[]")
# A device's lists of objects (its pods; its MIG devices are slimmed on their own, as MigEntry).
_DEVICE_LISTS = {k: v for k, v in read_lists_under("spec.devices[]").items() if k != "migDevices"}
_XID_KEYS = read_under("spec.xidEvents[]")
_NIC_KEYS = read_under("spec.nics[]")
# A GPU's MIG devices (what parse_report reads of each, and the DRA slice mapping after it): the
# scalars, then the lists of objects (the pods holding it).
_MIG_LISTS = read_lists_under("spec.devices[].migDevices[]")
_MIG_KEYS = read_under("spec.devices[].migDevices[]") + tuple(_MIG_LISTS)
_MIG_SLOTS = tuple(f"_{i}" for i in range(len(_MIG_KEYS)))  # MigEntry's: one per key, by position
_MIG_SLOT = dict(zip(_MIG_KEYS, _MIG_SLOTS, strict=True))
# Flags that parse_report reads as ``bool(x.get(key, False))``: an explicit False is the same as none.
_FALSE_IS_ABSENT = {"lost", "pending", "failure"}


def share(value: Any) -> Any:
    """A short string as the one shared copy of it; anything else unchanged."""
    if type(value) is str and len(value) <= _SHORT:
        return sys.intern(value)
    return value


class Leaf(dict[str, Any]):
    """A small read-only object of scalars, shared by every equal one that is alive.

    Read only, because one copy serves many cached objects; weakly held by the table, so a shape
    nobody uses any more (a deleted pod's) is forgotten, not kept as a history."""

    __slots__ = ("__weakref__",)

    def _refuse(self, *_: Any, **__: Any) -> NoReturn:
        raise TypeError("a shared cached object is read only")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        return leaf, (dict(self),)  # a copy (deepcopy, pickle) is the shared copy again: it is read only


_LEAVES: weakref.WeakValueDictionary[tuple[tuple[str, Any], ...], Leaf] = weakref.WeakValueDictionary()


def leaf(value: Mapping[str, Any]) -> Mapping[str, Any]:
    """The shared copy of a small object of scalars (most GPUs report the same ECC counters, most
    containers the same restart count, a node's pods the same ``nodeName``, a Job's pods the same
    owner); anything holding an unhashable value is returned as it is."""
    if isinstance(value, Leaf):
        return value
    try:
        key = tuple(value.items())
        hit = _LEAVES.get(key)
    except TypeError:  # an unhashable value: not a leaf
        return value
    if hit is None:
        hit = _LEAVES[key] = Leaf(value)
    return hit


_ABSENT: Any = object()


class SlimNode(dict[str, Any]):
    """A Node as ``slim_node`` cut it: slimming it again returns it as it is.

    The watches slim each object in their own thread as its line is parsed, and the store slims what
    it caches (it also takes a write's answer, or a re-read, whole). Unmarked, every watched Node and
    report was slimmed twice, the second time on the event loop: most of the loop's time for a
    watched report, and at 10,000 nodes most of the seconds between the reports' start-up list
    arriving and the first pass. No slots of its own, so it costs what a dict costs."""

    __slots__ = ()


class SlimReport(dict[str, Any]):
    """A GPUNodeHealth as ``slim_report`` cut it (see ``SlimNode``)."""

    __slots__ = ()


class MigEntry(Mapping[str, Any]):
    """One MIG device of a cached report (``spec.devices[].migDevices[]``): read only, its values in
    slots, one per key the report contract reads of it (``_MIG_KEYS``).

    A MIG node's report lists 56 of them and each names its own MIG UUID, so none can be shared: as
    dicts they were the largest part of what a MIG node's report costs (about 200 bytes each against
    about 70 here). It reads like the dict it replaces (``parse_report`` takes any ``Mapping``), and a
    key the agent did not send is absent, not None."""

    __slots__ = _MIG_SLOTS

    def __init__(self, m: Mapping[str, Any]) -> None:
        for k, slot in zip(_MIG_KEYS, _MIG_SLOTS, strict=True):
            if k not in m:
                value = _ABSENT
            elif k in _MIG_LISTS:
                value = _slim_items(m[k], _MIG_LISTS[k])
            else:
                value = compact(m[k])
            object.__setattr__(self, slot, value)

    def __getitem__(self, key: str) -> Any:
        slot = _MIG_SLOT.get(key)
        value = _ABSENT if slot is None else getattr(self, slot)
        if value is _ABSENT:
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[str]:
        return (k for k, slot in zip(_MIG_KEYS, _MIG_SLOTS, strict=True) if getattr(self, slot) is not _ABSENT)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise TypeError("a cached MIG device is read only")

    def __reduce__(self) -> tuple[type[MigEntry], tuple[dict[str, Any]]]:
        return MigEntry, (dict(self),)  # copy, deepcopy and pickle rebuild it from its items

    def __repr__(self) -> str:
        return f"MigEntry({dict(self)!r})"


class Fixed(Mapping[str, Any]):
    """A read-only object of a fixed set of keys (``KEYS``), its values in slots: what the pod cache
    holds for each pod instead of dicts (``cached_pod``).

    800,000 cached pods at 100,000 nodes (docs/scaling.md, the fleet probe): a dict costs 184 bytes
    with three keys and 272 with seven, these 56 and 96. It reads like the dict it replaces (every
    reader takes a ``Mapping``); a key the body did not have is absent, not None."""

    __slots__ = ()
    KEYS: ClassVar[tuple[str, ...]] = ()
    _SLOT: ClassVar[dict[str, Any]] = {}  # key -> its slot's descriptor: a pass reads pods a lot

    def __init_subclass__(cls) -> None:
        cls._SLOT = {k: cls.__dict__["_" + k] for k in cls.KEYS}

    def __init__(self, m: Mapping[str, Any]) -> None:
        for k in self.KEYS:
            object.__setattr__(self, "_" + k, m.get(k, _ABSENT))

    def __getitem__(self, key: str) -> Any:
        slot = self._SLOT.get(key)
        value = _ABSENT if slot is None else slot.__get__(self)
        if value is _ABSENT:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        slot = self._SLOT.get(key)
        value = _ABSENT if slot is None else slot.__get__(self)
        return default if value is _ABSENT else value

    def __contains__(self, key: object) -> bool:
        slot = self._SLOT.get(key) if isinstance(key, str) else None
        return slot is not None and slot.__get__(self) is not _ABSENT

    def __iter__(self) -> Iterator[str]:
        return (k for k in self.KEYS if getattr(self, "_" + k) is not _ABSENT)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise TypeError("a cached pod is read only")

    def __reduce__(self) -> tuple[type[Fixed], tuple[dict[str, Any]]]:
        return type(self), (dict(self),)  # copy, deepcopy and pickle rebuild it from its items

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self)!r})"


class PodMeta(Fixed):
    KEYS = (
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "deletionTimestamp",
        "labels",
        "annotations",
        "ownerReferences",
    )
    __slots__ = tuple("_" + k for k in KEYS)


class PodStatus(Fixed):
    KEYS = ("phase", "startTime", "containerStatuses", "resourceClaimStatuses", "extendedResourceClaimStatus")
    __slots__ = tuple("_" + k for k in KEYS)


class CachedPod(Fixed):
    KEYS = ("metadata", "spec", "status")
    __slots__ = tuple("_" + k for k in KEYS)


def compact(value: Any) -> Any:
    """A JSON tree rebuilt with interned keys and short strings (the same tree, shared parts)."""
    if isinstance(value, Leaf):
        return value  # already shared
    if isinstance(value, Mapping):
        return {sys.intern(str(k)): compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [compact(v) for v in value]
    return share(value)


def same_but_version(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """Whether two slim copies of one object say the same apart from their resourceVersion: a watch
    event that changed only what the slim copy leaves out (a pod's IP or conditions, a Node's other
    conditions' heartbeats) changes nothing a pass reads (docs/scaling.md, the fleet probe)."""
    if a is None or b is None:
        return False
    meta_a, meta_b = a.get("metadata") or {}, b.get("metadata") or {}
    if {k: v for k, v in a.items() if k != "metadata"} != {k: v for k, v in b.items() if k != "metadata"}:
        return False
    return {k: v for k, v in meta_a.items() if k != "resourceVersion"} == {
        k: v for k, v in meta_b.items() if k != "resourceVersion"
    }


def _pick(m: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: compact(m[k]) for k in keys if k in m}


def _pick_device(m: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """As ``_pick``, leaving out flags that are exactly False (most of a healthy GPU's sub-objects)."""
    return {k: compact(m[k]) for k in keys if k in m and not (k in _FALSE_IS_ABSENT and m[k] is False)}


def _slim_container(cs: Mapping[str, Any]) -> Mapping[str, Any]:
    """Restart count, exit codes and times, the waiting reason: what restart-loop detection reads."""
    out: dict[str, Any] = {"restartCount": cs.get("restartCount") or 0}
    for key in ("state", "lastState"):
        state = cs.get(key) or {}
        slim: dict[str, Any] = {}
        term = state.get("terminated")
        if term:
            slim["terminated"] = {f: share(term[f]) for f in ("exitCode", "finishedAt") if f in term}
        if state.get("waiting"):
            slim["waiting"] = {"reason": share(state["waiting"].get("reason"))}
        if slim:
            out[key] = slim
    return leaf(out)  # shared when it is only a restart count (a running container's usual state)


def _read_keys(m: Any, keys: tuple[str, ...]) -> Mapping[str, Any] | None:
    """The labels or annotations of ``keys`` (what is read of a pod, ``api/pods.py`` READ_*), one copy
    shared by every pod that has the same (a Job's ranks, once a rank's index is kept as presence
    only); None where the pod has none of them."""
    if not isinstance(m, Mapping):
        return None
    kept = {k: "" if k in P.PRESENCE_ONLY else share(m[k]) for k in keys if k in m}
    return leaf(kept) if kept else None


def slim_pod(body: Mapping[str, Any]) -> dict[str, Any]:
    """Only what drains, restart-loop detection and Kueue's mover read: keeps memory flat with many pods.

    Pods are most of what the operator holds at 100,000 nodes (800,000 of them, docs/scaling.md, the
    fleet probe), so beyond leaving out what nothing reads, each pod's own strings (name, uid,
    resourceVersion) are kept as decoded, not interned (no other object shares them: an entry in the
    interpreter's table of interned strings would only add to each), and its labels, annotations,
    controller reference, containers and ``nodeName`` are shared copies (``leaf``)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    slim_meta: dict[str, Any] = {k: meta[k] for k in _POD_OWN if k in meta}
    if "namespace" in meta:
        slim_meta["namespace"] = share(meta["namespace"])
    for key, read in (("labels", P.READ_LABELS), ("annotations", P.READ_ANNOTATIONS)):
        kept = _read_keys(meta.get(key), read)
        if kept is not None:
            slim_meta[key] = kept
    if meta.get("ownerReferences"):
        # Only the controller's kind and name are read (DaemonSet pods, gangs, Jobs: api/pods.py).
        refs = [r for r in meta["ownerReferences"] if isinstance(r, Mapping) and r.get("controller")]
        slim_meta["ownerReferences"] = tuple(
            leaf(compact({k: r[k] for k in ("kind", "name", "controller") if k in r})) for r in refs
        )
    slim_status = {k: share(status[k]) for k in ("phase", "startTime") if k in status}
    if "containerStatuses" in status:
        slim_status["containerStatuses"] = tuple(_slim_container(cs) for cs in status["containerStatuses"] or [])
    # The claims a pod uses: a device drain finds the pods that hold one GPU by them (drain/claims.py).
    for key in ("resourceClaimStatuses", "extendedResourceClaimStatus"):
        if status.get(key):
            slim_status[key] = compact(status[key])
    slim_spec: dict[str, Any] = {"nodeName": share(spec.get("nodeName"))}
    if spec.get("resourceClaims"):
        slim_spec["resourceClaims"] = [
            compact({k: c[k] for k in ("name", "resourceClaimName") if k in c}) for c in spec["resourceClaims"]
        ]
    spec_out = leaf(slim_spec) if "resourceClaims" not in slim_spec else slim_spec
    return {"metadata": slim_meta, "spec": spec_out, "status": slim_status}


def cached_pod(body: Mapping[str, Any], deleted_at: Any = None) -> CachedPod:
    """The pod as the pod cache holds it: ``slim_pod``'s copy in slots (``Fixed``); ``deleted_at``: the
    deletionTimestamp it keeps if the body has none (a deletion is never undone, ``state/pods.py``)."""
    slim = slim_pod(body)
    meta = slim["metadata"]
    if deleted_at and not meta.get("deletionTimestamp"):
        meta["deletionTimestamp"] = deleted_at
    return CachedPod({"metadata": PodMeta(meta), "spec": slim["spec"], "status": PodStatus(slim["status"])})


def slim_node(body: Mapping[str, Any]) -> dict[str, Any]:
    """What taints, cordons, the GPUHealthy condition, GPU counts and policy selection read."""
    if type(body) is SlimNode:
        return body
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    slim_meta = _pick(meta, ("name", "uid", "resourceVersion", "labels"))
    own = {k: v for k, v in (meta.get("annotations") or {}).items() if str(k).startswith(_OWN_PREFIX)}
    if own:
        slim_meta["annotations"] = compact(own)
    slim_status: dict[str, Any] = {}
    capacity = status.get("capacity") or {}
    # The GPU count, and the MIG devices NVIDIA's device plugin serves (api/nodes.py device_plugin_mig).
    kept = {k: share(v) for k, v in capacity.items() if k == GPU_RESOURCE or str(k).startswith(MIG_RESOURCE_PREFIX)}
    if kept:
        slim_status["capacity"] = compact(kept)
    # What the device plugin offers now: a GPU it holds Unhealthy leaves allocatable (api/nodes.py plugin_gpus).
    allocatable = (status.get("allocatable") or {}).get(GPU_RESOURCE)
    if allocatable is not None:
        slim_status["allocatable"] = compact({GPU_RESOURCE: share(allocatable)})
    ours = [c for c in status.get("conditions") or [] if isinstance(c, Mapping) and c.get("type") == CONDITION_TYPE]
    if ours:
        slim_status["conditions"] = compact(ours)
    return SlimNode(metadata=slim_meta, spec=_pick(spec, ("taints", "unschedulable")), status=slim_status)


def _frozen_lists(m: dict[str, Any]) -> dict[str, Any]:
    """Lists of scalars (a GPU's NVLink ``peers``) as tuples, so the object can be shared like any
    other leaf (``parse_report`` reads either); a list holding anything else stays, to be refused."""
    return {
        k: tuple(v) if isinstance(v, list) and all(isinstance(x, (int, str)) for x in v) else v for k, v in m.items()
    }


def _slim_items(items: Any, keys: tuple[str, ...]) -> Any:
    """A list of small objects (the pods holding a GPU) cut to ``keys``, each a shared leaf; anything
    else kept, to be read (and refused) as it stands."""
    if not isinstance(items, list):
        return compact(items)
    return [leaf(_pick(i, keys)) if isinstance(i, Mapping) else compact(i) for i in items]


def _slim_device(d: Any) -> Any:
    if not isinstance(d, Mapping):
        return d  # refused by parse_report as it stands
    out = _pick_device(d, _DEVICE_KEYS)
    for name, keys in _DEVICE_LISTS.items():
        if name in d:
            out[name] = _slim_items(d[name], keys)
    for part, keys in _DEVICE_PARTS.items():
        sub = d.get(part)
        if isinstance(sub, Mapping):
            picked = _pick_device(sub, keys)
            if picked:
                out[part] = leaf(_frozen_lists(picked))
        elif part in d:
            out[part] = compact(sub)  # not an object: kept, to be read (and refused) as before
    migs = d.get("migDevices")
    if isinstance(migs, list):
        # Compact copies, not shared leaves: each MIG device has a UUID of its own, so no two are equal
        # and the table of shared copies would only add its entry to each (its UUID string is still
        # the one the slice cache holds).
        out["migDevices"] = [MigEntry(m) if isinstance(m, Mapping) else m for m in migs]
    elif "migDevices" in d:
        out["migDevices"] = compact(migs)  # not a list: kept, to be refused as before
    return out


def _slim_spec(spec: Any) -> Any:
    if not isinstance(spec, Mapping):
        return spec  # refused by parse_report as it stands
    out = _pick(spec, _SPEC_KEYS)
    nvml = spec.get("nvml")
    if isinstance(nvml, Mapping) and nvml:
        # A non-empty nvml object with neither key still means "available" (parse_report's default).
        out["nvml"] = _pick(nvml, _NVML_KEYS) or {"available": True}
    elif "nvml" in spec:
        out["nvml"] = compact(nvml)
    for part, keys in _SPEC_PARTS.items():
        sub = spec.get(part)
        if isinstance(sub, Mapping):
            out[part] = leaf(_pick(sub, keys))
        elif part in spec:
            out[part] = compact(sub)  # not an object: kept, to be refused as before
    devices = spec.get("devices")
    if isinstance(devices, list):
        out["devices"] = [_slim_device(d) for d in devices]
    elif "devices" in spec:
        out["devices"] = compact(devices)
    xids = spec.get("xidEvents")
    if isinstance(xids, list):
        out["xidEvents"] = [_pick(e, _XID_KEYS) if isinstance(e, Mapping) else e for e in xids]
    elif "xidEvents" in spec:
        out["xidEvents"] = compact(xids)
    nics = spec.get("nics")
    if isinstance(nics, list):
        out["nics"] = [leaf(_frozen_lists(_pick(n, _NIC_KEYS))) if isinstance(n, Mapping) else n for n in nics]
    elif "nics" in spec:
        out["nics"] = compact(nics)
    return out


def slim_report(body: Mapping[str, Any]) -> dict[str, Any]:
    """What evaluation, freshness and the writers read of a GPUNodeHealth (see the module's doc)."""
    if type(body) is SlimReport:
        return body
    meta = body.get("metadata") or {}
    slim_meta = _pick(meta, ("name", "uid", "generation", "resourceVersion"))
    slim_meta.update(compact(written(meta, REPORT_HEARTBEAT)))  # the server's time of the last heartbeat write
    out = SlimReport(metadata=slim_meta)
    if "spec" in body:
        out["spec"] = _slim_spec(body["spec"])
    if "status" in body:
        out["status"] = compact(body["status"])
    return out


def slim_lease(body: Mapping[str, Any]) -> dict[str, Any]:
    """An agent's node Lease: name, uid, the renewal time and the API server's time of it (from
    ``managedFields``, for start-up freshness), all that freshness reads."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    slim_meta = {k: meta[k] for k in ("name", "uid", "resourceVersion") if k in meta}
    slim_meta.update(written(meta, LEASE_HEARTBEAT))
    return {"metadata": slim_meta, "spec": {LEASE_HEARTBEAT: spec.get(LEASE_HEARTBEAT)}}
