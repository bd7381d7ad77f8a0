"""Place device-scoped findings on DRA devices; a GPU without them falls back to node scope. Pure.

The scope a policy gives a finding is what it *may* take out. Whether one GPU can actually be taken
out depends on the cluster: only devices some ResourceSlice publishes can be tainted, and a GPU is
all of its devices (its full device and every MIG device or placement, ``actions/gpudevices.py``).
This step turns every device-scoped finding whose GPU has no devices (or slices that contradict
themselves, or a rule name someone else holds) into a node-scope one and says why, in words, for
the Event and the status.

A finding confined to one MIG instance (``Finding.instance``) holds out that MIG device alone when
its DRA device can be told apart: the one device publishing the instance's MIG UUID
(``device_by_uuid``), and it is one of the GPU's partitions. Static MIG publishes the MIG UUID as
the device's ``uuid``; a partitionable placement has one only once prepared. Otherwise the finding
widens to its whole GPU (every device of it), and its detail says why, ending in "the whole GPU is
held out instead".

A GPU that no slice publishes can still be held out alone on a **device-plugin node** (``PluginNode``):
NVIDIA's device plugin serves its GPUs (``nvidia.com/gpu`` capacity, or its MIG resources) and the
agent read the kubelet's pod-resources API, so the report names the pods holding each GPU. The
finding stays device scope and the GPU is listed in ``Placement.plugin``: only those pods are
drained, and the device plugin's own withholding or gpuhealth's node taint keeps new work off it
(``actions/plugin_hold.py``). Without the pod-resources API it falls back to node scope, and the
reason says why.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpuhealth.actions.devicetaints import rule_name
from gpuhealth.actions.gpudevices import GpuDevices, device_by_uuid, devices_of_gpu
from gpuhealth.actions.slices import SlimSlice
from gpuhealth.api.devices import DeviceRef
from gpuhealth.api.names import Scope
from gpuhealth.api.report import PodResources
from gpuhealth.evaluation.assess import Finding
from gpuhealth.evaluation.findings import Instance


@dataclass(frozen=True)
class Placement:
    findings: tuple[Finding, ...]  # all of them; those that cannot be placed are now Node scope
    refs: Mapping[int, GpuDevices]  # GPU index -> its DRA devices, for the GPUs that stay device scope
    fallbacks: Mapping[int, str]  # GPU index -> why it falls back to node scope, in words
    # MIG UUID -> its DRA device, for the instance findings that hold out one MIG device alone
    instances: Mapping[str, DeviceRef] = field(default_factory=dict)
    # GPUs no slice publishes, held out alone on a device-plugin node (their pods from the report)
    plugin: frozenset[int] = frozenset()


@dataclass(frozen=True)
class PluginNode:
    """A node whose GPUs a device plugin serves (``nvidia.com/gpu`` capacity, or NVIDIA's MIG
    resources ``mig``), with what its agent read of the kubelet's pod-resources API (the report's
    ``spec.podResources``; None: the agent does not report it)."""

    pod_resources: PodResources | None
    mig: tuple[str, ...] = ()

    @property
    def readable(self) -> bool:
        """The report names the pods holding each GPU (and each MIG device)."""
        return self.pod_resources is not None and self.pod_resources.available

    def why_not(self, index: int, uuid: str, node: str, drivers: Sequence[str]) -> str:
        """Why a GPU of this node cannot be held out alone: its pods are not known."""
        what = f"GPU {index}" + (f" ({uuid})" if uuid else "")
        if self.pod_resources is None:
            cause = "the agent does not report which pods hold each GPU (no spec.podResources in its report)"
        else:
            cause = "the agent cannot read the kubelet's pod-resources socket: " + (
                self.pod_resources.error or "no reason given"
            )
        return (
            f"no DRA ResourceSlice of {', '.join(drivers)} publishes the GPUs of node {node} (device plugin only) "
            f"and {cause}; the pods holding {what} cannot be told apart, the whole node is quarantined instead"
        )


def device_plugin_mig_reason(index: int, uuid: str, node: str, resources: Sequence[str]) -> str:
    """Why a GPU of a node that serves MIG through NVIDIA's device plugin cannot be held out alone."""
    what = f"GPU {index}" + (f" ({uuid})" if uuid else "")
    return (
        f"node {node} is partitioned with MIG and published through the device plugin ({', '.join(resources)}), "
        f"not through DRA ResourceSlices: there is no per-device API to hold out {what} and its MIG devices, "
        "the whole node is quarantined instead"
    )


def place(
    findings: Iterable[Finding],
    node: str,
    slices: Iterable[SlimSlice],
    drivers: Sequence[str],
    uuids: Mapping[int, str],
    taken: Collection[str] = frozenset(),
    plugin_mig: Sequence[str] = (),
    plugin: PluginNode | None = None,
) -> Placement:
    """Findings with their scope corrected for what the cluster publishes, and each GPU's devices.

    ``taken``: rule names someone else's DeviceTaintRule already holds. gpuhealth's rule for such a
    device can never be created (its name is a function of the device), so that GPU cannot be held
    out on its own and falls back to node scope too. ``plugin_mig``: the MIG resources the node
    serves through NVIDIA's device plugin (``nvidia.com/mig-3g.40gb``), named in the reason.
    ``plugin``: the node is served by a device plugin (see the module docstring); None: it is not."""
    slices = list(slices)
    reported = frozenset(u for u in uuids.values() if u)
    refs: dict[int, GpuDevices] = {}
    fallbacks: dict[int, str] = {}
    instances: dict[str, DeviceRef] = {}
    via_plugin: set[int] = set()
    out: list[Finding] = []
    for f in findings:
        index = f.gpu if f.gpu is not None else next((i for i, u in uuids.items() if f.uuid and u == f.uuid), None)
        if f.scope != Scope.DEVICE:
            out.append(f)
            continue
        if index is None:
            out.append(replace(f, scope=Scope.NODE))  # a GPU that cannot be told apart: the node's
            continue
        if index not in refs and index not in fallbacks:
            uuid = f.uuid or uuids.get(index, "")
            match = devices_of_gpu(slices, node, drivers, index, uuid, reported)
            held = [rule_name(r) for r in match.refs if rule_name(r) in taken]
            if held:
                fallbacks[index] = (
                    f"a DeviceTaintRule gpuhealth does not own holds the name {held[0]} of its rule "
                    f"for a device of GPU {index}: the whole node is quarantined instead"
                )
            elif match.refs:
                refs[index] = match
            elif match.unpublished and plugin is not None and plugin.readable:
                via_plugin.add(index)
            elif plugin_mig and not match.conflict:
                fallbacks[index] = device_plugin_mig_reason(index, uuid, node, plugin_mig)
            elif match.unpublished and plugin is not None:
                fallbacks[index] = plugin.why_not(index, uuid, node, drivers)
            else:
                fallbacks[index] = match.reason
        if index in via_plugin:
            if f.instance is None:
                out.append(f)
            else:  # the plugin has no API to withhold one MIG device: the GPU is held out as a whole
                why = f"node {node} serves its MIG devices through the device plugin, not DRA ResourceSlices"
                out.append(replace(f, instance=None, detail=f"{f.detail} ({why}: the whole GPU is held out instead)"))
        elif index not in refs:
            out.append(replace(f, scope=Scope.NODE))
        elif f.instance is not None:
            ref, why = _instance_device(f.instance, index, node, slices, drivers, refs[index])
            if ref is not None:
                instances[f.instance.uuid] = ref
                out.append(f)
            else:
                out.append(replace(f, instance=None, detail=f"{f.detail} ({why}: the whole GPU is held out instead)"))
        else:
            out.append(f)
    return Placement(tuple(out), refs, fallbacks, instances, frozenset(via_plugin))


def _instance_device(
    instance: Instance, index: int, node: str, slices: Sequence[SlimSlice], drivers: Sequence[str], gpu: GpuDevices
) -> tuple[DeviceRef | None, str]:
    """The one DRA device of a MIG instance of GPU ``index``, or None and why it cannot be told apart.

    (A rule name someone else holds needs no check here: it made the whole GPU fall back already.)"""
    if not instance.uuid:
        ids = instance.words().removeprefix("MIG device ")
        return None, f"the agent lists no MIG device with a UUID for {ids} of GPU {index}"
    match = device_by_uuid(slices, node, drivers, instance.uuid)
    if match.ref is None:
        return None, match.reason.removesuffix(": the whole node is quarantined instead")
    if match.ref not in gpu.partitions:
        return None, f"the DRA device {match.ref} publishing {instance.uuid} is not one of GPU {index}'s MIG devices"
    return match.ref, ""
