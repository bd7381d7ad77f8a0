"""ResourceSlices shaped exactly as NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu)
publishes them, as plain dicts: the full-GPU, static-MIG and partitionable (DynamicMIG) shapes of
driver v25.3 (int ``index`` and ``minor`` attributes, numeric MIG names ``gpu-%d-mig-%d-%d-%d``),
v25.8 (no index, numeric MIG names) and the current driver (no index, MIG names with the profile).

Pure (no API client): the unit tests map them and the integration tests publish the same shapes to
the real API server, which validates them, and its scheduler allocates them.

- Full GPU: device ``gpu-<minor>``, ``type=gpu``, ``uuid``, ``productName``, ``brand``,
  ``architecture``, version attributes, PCI attributes under ``resource.kubernetes.io/``.
- Static MIG: a MIG-enabled GPU is *not* published as a full device; each MIG device is
  ``gpu-<minor>-mig-<profile without dots>-<giProfileId>-<placementStart>`` with ``type=mig``,
  ``uuid`` (``MIG-...``), ``parentUUID``, ``profile``. All devices of a node in one pool (the node's
  name); the pool may span several slices.
- Partitionable: per GPU one slice with only ``sharedCounters`` (``gpu-<minor>-counter-set``) and
  one with ``gpu-<minor>`` and every possible placement, each consuming from that set; placements
  carry ``parentUUID`` but no ``uuid`` (they are not prepared).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

DRIVER = "gpu.nvidia.com"
G, V = "resource.k8s.io", "v1"
GiB = 1024**3
# H100 80GB: (profile, GI profile id, memory slices, multiprocessors, memory GiB, placement starts)
H100_PROFILES: tuple[tuple[str, int, int, int, int, tuple[int, ...]], ...] = (
    ("1g.10gb", 19, 1, 16, 10, (0, 1, 2, 3, 4, 5, 6)),
    ("2g.20gb", 14, 2, 32, 20, (0, 2, 4)),
    ("3g.40gb", 9, 4, 60, 40, (0, 4)),
    ("4g.40gb", 5, 4, 64, 40, (0,)),
    ("7g.80gb", 0, 8, 132, 80, (0,)),
)
_BY_PROFILE = {p[0]: p for p in H100_PROFILES}
MEMORY_SLICES = 8


@dataclass(frozen=True)
class Gpu:
    minor: int
    uuid: str
    mig: tuple[tuple[str, int], ...] = ()  # static MIG: (profile, placement start) per MIG device


@dataclass
class Published:
    """The slices of one node, and what each GPU (by UUID) is published as."""

    slices: list[dict[str, Any]] = field(default_factory=list)
    devices: dict[str, set[str]] = field(default_factory=dict)  # GPU UUID -> its device names


def _s(v: str) -> dict[str, str]:
    return {"string": v}


def _ver(v: str) -> dict[str, str]:
    return {"version": v}


def mig_uuid(gpu_uuid: str, profile: str, start: int) -> str:
    h = hashlib.sha256(f"{gpu_uuid}/{profile}/{start}".encode()).hexdigest()
    return f"MIG-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _common(minor: int, version: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "productName": _s("NVIDIA H100 80GB HBM3"),
        "brand": _s("Nvidia"),
        "architecture": _s("Hopper"),
        "cudaComputeCapability": _ver("9.0.0"),
        "driverVersion": _ver("570.133.20"),
        "cudaDriverVersion": _ver("12.8.0"),
        "resource.kubernetes.io/pciBusID": _s(f"0000:{0x18 + minor * 0x10:02x}:00.0"),
        "resource.kubernetes.io/pcieRoot": _s(f"pci0000:{minor * 0x10:02x}"),
    }
    if version == "v25.3":
        attrs["minor"] = {"int": minor}
    return attrs


def gpu_device(g: Gpu, version: str = "v25.8", index: int | None = None) -> dict[str, Any]:
    attrs = {"type": _s("gpu"), "uuid": _s(g.uuid), **_common(g.minor, version)}
    if version == "v25.3":
        attrs["index"] = {"int": g.minor if index is None else index}
    return {"name": f"gpu-{g.minor}", "attributes": attrs, "capacity": {"memory": {"value": "80Gi"}}}


def mig_name(minor: int, profile: str, start: int, version: str) -> str:
    _, gi, size, *_ = _BY_PROFILE[profile]
    if version in ("v25.3", "v25.8"):
        return f"gpu-{minor}-mig-{gi}-{start}-{size}"
    return f"gpu-{minor}-mig-{profile.replace('.', '')}-{gi}-{start}"


def _mig_capacity(profile: str, start: int) -> dict[str, Any]:
    _, _, size, sms, mem, _ = _BY_PROFILE[profile]
    cap: dict[str, Any] = {"memory": {"value": f"{mem}Gi"}, "multiprocessors": {"value": str(sms)}}
    for i in range(start, start + size):
        cap[f"memorySlice{i}"] = {"value": "1"}
    return cap


def mig_device(
    g: Gpu, profile: str, start: int, version: str = "current", prepared: bool = True, mig_index: int | None = None
) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "type": _s("mig"),
        "parentUUID": _s(g.uuid),
        "profile": _s(profile),
        **_common(g.minor, version),
    }
    if prepared:
        attrs["uuid"] = _s(mig_uuid(g.uuid, profile, start))
    if version == "v25.3" and mig_index is not None:
        attrs["index"] = {"int": mig_index}  # a MIG index: never to be taken for a GPU's
    return {
        "name": mig_name(g.minor, profile, start, version),
        "attributes": attrs,
        "capacity": _mig_capacity(profile, start),
    }


def _slice(node: str, name: str, generation: int, count: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{G}/{V}",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
            **spec,
        },
    }


def static_slices(
    node: str, gpus: Sequence[Gpu], version: str = "current", slices: int = 1, generation: int = 1
) -> Published:
    """A node with full GPUs and static MIG GPUs (a MIG-enabled GPU has no full device), its
    devices spread over ``slices`` slices of one pool."""
    out = Published()
    devices: list[dict[str, Any]] = []
    for g in gpus:
        if g.mig:
            mine = [mig_device(g, p, st, version, mig_index=i) for i, (p, st) in enumerate(g.mig)]
        else:
            mine = [gpu_device(g, version)]
        out.devices[g.uuid] = {d["name"] for d in mine}
        devices += mine
    n = max(1, min(slices, len(devices)))
    for i in range(n):
        part = devices[i::n]
        out.slices.append(_slice(node, f"{node}-{DRIVER}-g{generation}-{i}", generation, n, devices=part))
    return out


def counter_set(minor: int) -> str:
    return f"gpu-{minor}-counter-set"


def _consumes(minor: int, memory: str, sms: int, first: int, size: int) -> list[dict[str, Any]]:
    counters: dict[str, Any] = {"memory": {"value": memory}, "multiprocessors": {"value": str(sms)}}
    for i in range(first, first + size):
        counters[f"memory-slice-{i}"] = {"value": "1"}
    return [{"counterSet": counter_set(minor), "counters": counters}]


def partitionable_slices(
    node: str, gpus: Sequence[Gpu], version: str = "current", generation: int = 1, profiles: Sequence[str] = ()
) -> Published:
    """DynamicMIG: per GPU a slice with only its counter set and a slice with ``gpu-<minor>`` and
    every placement of ``profiles`` (all H100 profiles by default), each consuming from the set."""
    out = Published()
    chosen = [p for p in H100_PROFILES if not profiles or p[0] in profiles]
    count = 2 * len(gpus)
    for g in gpus:
        counters: dict[str, Any] = {"memory": {"value": "80Gi"}, "multiprocessors": {"value": "132"}}
        for i in range(MEMORY_SLICES):
            counters[f"memory-slice-{i}"] = {"value": "1"}
        out.slices.append(
            _slice(
                node,
                f"{node}-{DRIVER}-g{generation}-counters-{g.minor}",
                generation,
                count,
                sharedCounters=[{"name": counter_set(g.minor), "counters": counters}],
            )
        )
        full = gpu_device(g, version)
        full["consumesCounters"] = _consumes(g.minor, "80Gi", 132, 0, MEMORY_SLICES)
        devices = [full]
        for profile, _, size, sms, mem, starts in chosen:
            for st in starts:
                d = mig_device(g, profile, st, version, prepared=False)
                d["consumesCounters"] = _consumes(g.minor, f"{mem}Gi", sms, st, size)
                devices.append(d)
        out.devices[g.uuid] = {d["name"] for d in devices}
        out.slices.append(
            _slice(node, f"{node}-{DRIVER}-g{generation}-devices-{g.minor}", generation, count, devices=devices)
        )
    return out
