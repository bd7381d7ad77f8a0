"""Which DRA device is this GPU? Pure mapping from ResourceSlices to ``(driver, pool, device)``.

A DRA driver publishes a node's GPUs as ``resource.k8s.io/v1`` ResourceSlices. NVIDIA's driver (and
the model gpuhealth follows): driver ``gpu.nvidia.com``, pool = the node's name, one device per GPU
named ``gpu-N``, attributes ``uuid`` (the NVML UUID), ``index`` (the NVML index), ``productName``.
A DeviceTaintRule selects one device by exactly that triple, so this is all gpuhealth needs to take
one GPU out of allocation.

A GPU is matched by UUID first (indices can be renumbered across reboots and differ from what a
container sees), by index only where the slice publishes no UUID. A GPU that no slice publishes
(a device-plugin cluster, or a driver that has not published yet) has no device: the caller falls
back to node scope and says why, in the words :func:`find_device` returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuhealth.api.devices import DeviceRef as DeviceRef


@dataclass(frozen=True)
class SlimDevice:
    name: str
    uuid: str = ""
    index: int | None = None


@dataclass(frozen=True)
class SlimSlice:
    """The few fields of a ResourceSlice that the mapping reads (the reflector keeps only these)."""

    name: str
    driver: str
    pool: str
    node: str = ""
    generation: int = 0
    devices: tuple[SlimDevice, ...] = ()


def _attribute(attrs: Mapping[str, Any], driver: str, name: str) -> Any:
    """An attribute's value; names may be qualified with the driver's domain (``gpu.nvidia.com/uuid``)."""
    for key in (name, f"{driver}/{name}"):
        raw = attrs.get(key)
        if isinstance(raw, Mapping):
            for kind in ("string", "int", "version", "bool"):
                if kind in raw:
                    return raw[kind]
    return None


def slim_slice(obj: Mapping[str, Any]) -> SlimSlice:
    """A ResourceSlice object (as the API returns it) reduced to what :func:`find_device` reads."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    driver = str(spec.get("driver") or "")
    pool = spec.get("pool") or {}
    devices = []
    for d in spec.get("devices") or []:
        attrs = d.get("attributes") or {}
        uuid = _attribute(attrs, driver, "uuid")
        index = _attribute(attrs, driver, "index")
        devices.append(
            SlimDevice(
                name=str(d.get("name") or ""),
                uuid=str(uuid) if isinstance(uuid, str) else "",
                index=index if isinstance(index, int) and not isinstance(index, bool) else None,
            )
        )
    return SlimSlice(
        name=str(meta.get("name") or ""),
        driver=driver,
        pool=str(pool.get("name") or ""),
        node=str(spec.get("nodeName") or ""),
        generation=int(pool.get("generation") or 0),
        devices=tuple(devices),
    )


@dataclass(frozen=True)
class DeviceMatch:
    """The device a GPU is, or None with the reason in words (for the Event and the status)."""

    ref: DeviceRef | None
    reason: str = ""


def node_slices(slices: Iterable[SlimSlice], node: str, drivers: Sequence[str]) -> list[SlimSlice]:
    """The current slices that publish ``node``'s devices for ``drivers`` (older pool generations dropped)."""
    mine = [s for s in slices if s.driver in drivers and (s.pool == node or s.node == node)]
    newest: dict[tuple[str, str], int] = {}
    for s in mine:
        newest[(s.driver, s.pool)] = max(newest.get((s.driver, s.pool), 0), s.generation)
    return sorted((s for s in mine if s.generation == newest[(s.driver, s.pool)]), key=lambda s: (s.driver, s.name))


def find_device(
    slices: Iterable[SlimSlice], node: str, drivers: Sequence[str], index: int | None, uuid: str
) -> DeviceMatch:
    """The DRA device that is GPU ``index`` / ``uuid`` of ``node``: UUID first, index second."""
    candidates = node_slices(slices, node, drivers)
    what = f"GPU {index}" if index is not None else "the GPU"
    what += f" ({uuid})" if uuid else ""
    if not candidates:
        return DeviceMatch(
            None,
            f"no DRA ResourceSlice of {', '.join(drivers)} publishes the GPUs of node {node} "
            "(device plugin only?): the whole node is quarantined instead",
        )
    pairs = [(s, d) for s in candidates for d in s.devices]
    found = [(s, d) for s, d in pairs if uuid and d.uuid == uuid]
    if not found and index is not None:
        # By index only where the slice cannot contradict us by UUID.
        found = [(s, d) for s, d in pairs if d.index == index and (not d.uuid or not uuid)]
    if len(found) == 1:
        s, d = found[0]
        return DeviceMatch(DeviceRef(s.driver, s.pool, d.name))
    if not found:
        return DeviceMatch(
            None,
            f"{what} is not among the {len(pairs)} devices the ResourceSlices of node {node} publish: "
            "the whole node is quarantined instead",
        )
    names = ", ".join(str(DeviceRef(s.driver, s.pool, d.name)) for s, d in found)
    return DeviceMatch(None, f"{what} matches several DRA devices ({names}): the whole node is quarantined instead")
