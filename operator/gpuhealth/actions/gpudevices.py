"""Which DRA devices are this physical GPU? Pure mapping from slim ResourceSlices.

A DeviceTaintRule selects one device by ``(driver, pool, device)``. To keep the scheduler off a bad
GPU, every device through which it can be allocated must be held out:

- its full device: the device whose ``uuid`` is the GPU's UUID (NVIDIA's ``gpu-<minor>``);
- its partitions: every device whose ``parentUUID`` is the GPU's UUID (static MIG devices, and
  DynamicMIG placements, which carry ``parentUUID`` but no ``uuid`` until they are prepared);
- every device that consumes one of the GPU's counter sets (partitionable devices, KEP-4815): the
  counter sets consumed by the GPU's full device or by its partitions, and the set named
  ``gpu-<minor>-counter-set`` where ``gpu-<minor>`` is the GPU's full device by UUID. A counter set
  is never tied to a GPU by its name alone.

A GPU is matched by UUID first; by index (driver v25.3's ``index`` attribute) only where the slice
publishes no UUID or the agent reported none, and never a MIG device by index. Only the newest
generation of a pool counts.

Slices that contradict themselves or the agent give no devices but a conflict, in words, for the
Event: two devices with the GPU's UUID, a MIG device of this node whose parent the agent does not
report, a MIG device whose parent is also published as a plain GPU by another pool, a counter set
of this GPU consumed by another GPU's device. gpuhealth never writes a rule on a guess: the caller
falls back to node scope.

:func:`device_by_uuid` finds the one device with a given UUID (a MIG device's ``MIG-...``): how a
fault confined to one MIG instance holds out that MIG device alone (``actions/placement.py``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from gpuhealth.actions.slices import SlimDevice, SlimSlice, current_slices, of_node
from gpuhealth.api.devices import DeviceRef

_FULL_NAME = re.compile(r"^gpu-(\d+)$")
_PARTITION_TYPES = frozenset({"mig"})


@dataclass(frozen=True)
class GpuDevices:
    """The DRA devices of one GPU (its full device first), or none with the reason in words."""

    refs: tuple[DeviceRef, ...] = ()
    partitions: tuple[DeviceRef, ...] = ()  # the refs that are MIG devices or placements
    reason: str = ""
    conflict: bool = False  # the slices contradict themselves or the agent
    unpublished: bool = False  # no slice of these drivers publishes any GPU of the node (device plugin only?)
    # Every pool the devices come from has all its slices (``resourceSliceCount``) of its newest
    # generation: a pool being republished may not show all of a GPU's devices yet.
    complete: bool = True

    @property
    def ref(self) -> DeviceRef | None:
        """The GPU's first device (its full device where there is one)."""
        return self.refs[0] if self.refs else None

    def kind(self, ref: DeviceRef) -> str:
        return "mig" if ref in self.partitions else "gpu"


def _what(index: int | None, uuid: str) -> str:
    what = f"GPU {index}" if index is not None else "the GPU"
    return what + (f" ({uuid})" if uuid else "")


def _node_scope(what: str) -> str:
    return f"{what}: the whole node is quarantined instead"


def _no_slice(node: str, drivers: Sequence[str]) -> GpuDevices:
    return GpuDevices(
        reason=f"no DRA ResourceSlice of {', '.join(drivers)} publishes the GPUs of node {node} "
        "(device plugin only?): the whole node is quarantined instead",
        unpublished=True,
    )


def _conflict(what: str, why: str) -> GpuDevices:
    return GpuDevices(
        reason=_node_scope(f"the ResourceSlices contradict themselves or the agent for {what}: {why}"), conflict=True
    )


def is_partition(d: SlimDevice) -> bool:
    """A MIG device or partitionable placement (it names a parent GPU, or its type says so), not a GPU."""
    return bool(d.parent_uuid) or d.type in _PARTITION_TYPES


def _ref(s: SlimSlice, d: SlimDevice) -> DeviceRef:
    return DeviceRef(s.driver, s.pool, d.name)


Pair = tuple[SlimSlice, SlimDevice]


def _full_device(pairs: list[Pair], index: int | None, uuid: str) -> list[Pair]:
    """The full device(s) of the GPU: by UUID; by index only where no UUID can contradict it."""
    found = [(s, d) for s, d in pairs if uuid and d.uuid == uuid and not is_partition(d)]
    if not found and index is not None:
        found = [(s, d) for s, d in pairs if d.index == index and not is_partition(d) and (not d.uuid or not uuid)]
    return found


def devices_of_gpu(
    slices: Iterable[SlimSlice],
    node: str,
    drivers: Sequence[str],
    index: int | None,
    uuid: str,
    reported: Collection[str] = (),
) -> GpuDevices:
    """Every DRA device of GPU ``index`` / ``uuid`` on ``node`` (see the module docstring).

    ``reported``: the UUIDs the node's agent reports; a MIG device of this node whose parent is
    not among them is a contradiction (when the agent reports any)."""
    current = current_slices(slices, drivers)
    mine = [s for s in current if of_node(s, node)]
    what = _what(index, uuid)
    if not mine:
        return _no_slice(node, drivers)
    pairs: list[Pair] = [(s, d) for s in mine for d in s.devices]
    # Shared counter sets live in their own slices (without devices); they count for their pool.
    pools = {(s.driver, s.pool) for s in mine}
    counter_slices = [s for s in current if (s.driver, s.pool) in pools]
    shared = {(s.driver, s.pool, c) for s in counter_slices for c in s.shared_counters}
    full = _full_device(pairs, index, uuid)
    if len(full) > 1:
        names = ", ".join(str(_ref(s, d)) for s, d in full)
        return _conflict(what, f"it matches several DRA devices ({names})")
    gpu_uuid = uuid or (full[0][1].uuid if full else "")
    if reported:
        strays = sorted({d.parent_uuid for _, d in pairs if d.parent_uuid and d.parent_uuid not in reported})
        if strays:
            return _conflict(
                what, f"MIG devices of node {node} name parent GPUs the agent does not report ({', '.join(strays)})"
            )
    parts = [(s, d) for s, d in pairs if gpu_uuid and d.parent_uuid == gpu_uuid]
    if parts and not full and gpu_uuid:
        elsewhere = sorted(
            str(_ref(s, d))
            for s in current
            if not of_node(s, node)
            for d in s.devices
            if d.uuid == gpu_uuid and not is_partition(d)
        )
        if elsewhere:
            return _conflict(
                what,
                f"its MIG devices' parent is also published as a plain GPU by another pool ({', '.join(elsewhere)})",
            )
    uuids = [d.uuid for _, d in parts if d.uuid]
    if len(set(uuids)) < len(uuids):
        return _conflict(what, "two of its MIG devices publish one UUID")
    sets = {(s.driver, s.pool, c) for s, d in full + parts for c in d.counter_sets}
    for s, d in full:
        m = _FULL_NAME.match(d.name)
        named = (s.driver, s.pool, f"gpu-{m.group(1)}-counter-set") if m else None
        if named and not d.counter_sets and named in shared:
            sets.add(named)
    chosen = {(s.driver, s.pool, d.name) for s, d in full + parts}
    for s, d in pairs:
        if (s.driver, s.pool, d.name) in chosen or not any((s.driver, s.pool, c) in sets for c in d.counter_sets):
            continue
        other = d.parent_uuid or (d.uuid if not is_partition(d) else "")
        if other and other != gpu_uuid:
            return _conflict(what, f"device {_ref(s, d)} of another GPU ({other}) consumes one of its counter sets")
        parts.append((s, d))
        chosen.add((s.driver, s.pool, d.name))
    if not full and not parts:
        return GpuDevices(
            reason=_node_scope(
                f"{what} is not among the {len(pairs)} devices the ResourceSlices of node {node} publish"
            )
        )
    partitions = tuple(sorted(_ref(s, d) for s, d in parts))
    used = {(s.driver, s.pool) for s, _ in full + parts}
    complete = all(
        sum(1 for s in counter_slices if (s.driver, s.pool) == key)
        >= max(s.slice_count for s in counter_slices if (s.driver, s.pool) == key)
        for key in used
    )
    return GpuDevices(tuple(_ref(s, d) for s, d in full) + partitions, partitions, complete=complete)


def device_by_uuid(slices: Iterable[SlimSlice], node: str, drivers: Sequence[str], uuid: str) -> GpuDevices:
    """The one device of ``node`` whose ``uuid`` is ``uuid`` (a MIG device's ``MIG-...``, or a full GPU's).

    For a fault confined to one MIG instance: hold out just that device. Two devices
    with the UUID, or none, give no device and the reason."""
    mine = [s for s in current_slices(slices, drivers) if of_node(s, node)]
    if not mine:
        return _no_slice(node, drivers)
    found = [(s, d) for s in mine for d in s.devices if uuid and d.uuid == uuid]
    if len(found) > 1:
        return _conflict(uuid, f"several DRA devices publish it ({', '.join(str(_ref(s, d)) for s, d in found)})")
    if not found:
        return GpuDevices(reason=_node_scope(f"no DRA device of node {node} publishes {uuid}"))
    s, d = found[0]
    ref = _ref(s, d)
    return GpuDevices((ref,), (ref,) if is_partition(d) else ())


# (find_device: the name the single-device mapping had.)
find_device = devices_of_gpu
