"""ResourceSlices reduced to what the GPU mapping reads, and the current slices of a node. Pure.

A DRA driver publishes a node's GPUs as ``resource.k8s.io/v1`` ResourceSlices. NVIDIA's driver
(kubernetes-sigs/dra-driver-nvidia-gpu, the model gpuhealth follows): driver ``gpu.nvidia.com``,
pool = the node's name, a full GPU as device ``gpu-<minor>`` (attributes ``type=gpu``, ``uuid``;
driver v25.3 also ``index`` and ``minor``, gone from v25.8 on), a MIG device as
``gpu-<minor>-mig-...`` (``type=mig``, ``parentUUID`` = its GPU's UUID, ``uuid`` once it exists,
``profile``). With partitionable devices (DynamicMIG) a slice carries only ``sharedCounters`` (one
counter set per GPU) and every device ``consumesCounters`` from its GPU's set.

The slim copy keeps per device only its name, ``uuid``, ``parentUUID``, ``type``, ``profile``,
``index`` and the names of the counter sets it consumes; per slice its driver, pool, node,
generation, slice count and the names of the counter sets it shares. Which devices are one GPU is
``actions/gpudevices.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuhealth.api.devices import DeviceRef as DeviceRef


@dataclass(frozen=True, slots=True)
class SlimDevice:
    name: str
    uuid: str = ""
    index: int | None = None
    parent_uuid: str = ""  # a MIG device's (or placement's) GPU
    type: str = ""  # "gpu", "mig", ... as the driver publishes it ("" if it does not)
    profile: str = ""  # a MIG profile, "3g.40gb"
    counter_sets: tuple[str, ...] = ()  # the counter sets it consumes (partitionable devices)


@dataclass(frozen=True, slots=True)
class SlimSlice:
    """The few fields of a ResourceSlice that the mapping reads (the reflector keeps only these)."""

    name: str
    driver: str
    pool: str
    node: str = ""
    generation: int = 0
    devices: tuple[SlimDevice, ...] = ()
    shared_counters: tuple[str, ...] = ()  # names of the counter sets this slice shares
    slice_count: int = 1  # the pool's resourceSliceCount


def _attribute(attrs: Mapping[str, Any], driver: str, name: str) -> Any:
    """An attribute's value; names may be qualified with the driver's domain (``gpu.nvidia.com/uuid``)."""
    for key in (name, f"{driver}/{name}"):
        raw = attrs.get(key)
        if isinstance(raw, Mapping):
            for kind in ("string", "int", "version", "bool"):
                if kind in raw:
                    return raw[kind]
    return None


def _text(v: Any) -> str:
    """A string attribute, interned: device names, types, profiles and counter-set names repeat on
    every node (``gpu-0-mig-1g10gb-19-0``), and a GPU's UUID on each of its placements."""
    return sys.intern(v) if isinstance(v, str) else ""


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _slim_device(d: Mapping[str, Any], driver: str) -> SlimDevice:
    attrs = d.get("attributes") or {}
    index = _attribute(attrs, driver, "index")
    consumed = tuple(
        sorted(
            {
                _text(str(c.get("counterSet")))
                for c in d.get("consumesCounters") or []
                if isinstance(c, Mapping) and c.get("counterSet")
            }
        )
    )
    return SlimDevice(
        name=_text(str(d.get("name") or "")),
        uuid=_text(_attribute(attrs, driver, "uuid")),
        index=index if isinstance(index, int) and not isinstance(index, bool) else None,
        parent_uuid=_text(_attribute(attrs, driver, "parentUUID")),
        type=_text(_attribute(attrs, driver, "type")),
        profile=_text(_attribute(attrs, driver, "profile")),
        counter_sets=consumed,
    )


def slim_slice(obj: Mapping[str, Any]) -> SlimSlice:
    """A ResourceSlice object (as the API returns it) reduced to what the mapping reads."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    driver = str(spec.get("driver") or "")
    pool = spec.get("pool") or {}
    shared = tuple(
        sorted(
            {str(c.get("name")) for c in spec.get("sharedCounters") or [] if isinstance(c, Mapping) and c.get("name")}
        )
    )
    return SlimSlice(
        name=str(meta.get("name") or ""),
        driver=driver,
        pool=str(pool.get("name") or ""),
        node=str(spec.get("nodeName") or ""),
        generation=_int(pool.get("generation")),
        devices=tuple(_slim_device(d, driver) for d in spec.get("devices") or [] if isinstance(d, Mapping)),
        shared_counters=shared,
        slice_count=_int(pool.get("resourceSliceCount")) or 1,
    )


def current_slices(slices: Iterable[SlimSlice], drivers: Sequence[str]) -> list[SlimSlice]:
    """The slices of ``drivers`` in the newest generation of their pool (older generations dropped)."""
    mine = [s for s in slices if s.driver in drivers]
    newest: dict[tuple[str, str], int] = {}
    for s in mine:
        newest[(s.driver, s.pool)] = max(newest.get((s.driver, s.pool), 0), s.generation)
    return sorted((s for s in mine if s.generation == newest[(s.driver, s.pool)]), key=lambda s: (s.driver, s.name))


def of_node(s: SlimSlice, node: str) -> bool:
    return s.pool == node or s.node == node
