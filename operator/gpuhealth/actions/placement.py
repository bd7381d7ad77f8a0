"""Place device-scoped findings on DRA devices; a GPU without one falls back to node scope. Pure.

The scope a policy gives a finding is what it *may* take out. Whether one GPU can actually be taken
out depends on the cluster: only a device some ResourceSlice publishes can be tainted. This step
turns every device-scoped finding whose GPU has no device into a node-scope one and says why, in
words, for the Event and the status.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpuhealth.actions.devicetaints import rule_name
from gpuhealth.actions.slices import DeviceRef, SlimSlice, find_device
from gpuhealth.api.names import Scope
from gpuhealth.evaluation.assess import Finding


@dataclass(frozen=True)
class Placement:
    findings: tuple[Finding, ...]  # all of them; those that cannot be placed are now Node scope
    refs: Mapping[int, DeviceRef]  # GPU index -> its DRA device, for the GPUs that stay device scope
    fallbacks: Mapping[int, str]  # GPU index -> why it falls back to node scope, in words


def place(
    findings: Iterable[Finding],
    node: str,
    slices: Iterable[SlimSlice],
    drivers: Sequence[str],
    uuids: Mapping[int, str],
    taken: Collection[str] = frozenset(),
) -> Placement:
    """Findings with their scope corrected for what the cluster publishes, and each GPU's device.

    ``taken``: rule names someone else's DeviceTaintRule already holds. gpuhealth's rule for such a
    device can never be created (its name is a function of the device), so that GPU cannot be held
    out on its own and falls back to node scope too."""
    slices = list(slices)
    refs: dict[int, DeviceRef] = {}
    fallbacks: dict[int, str] = {}
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
            match = find_device(slices, node, drivers, index, f.uuid or uuids.get(index, ""))
            if match.ref is not None and rule_name(match.ref) in taken:
                fallbacks[index] = (
                    f"a DeviceTaintRule gpuhealth does not own holds the name {rule_name(match.ref)} of its rule "
                    f"for device {match.ref}: the whole node is quarantined instead"
                )
            elif match.ref is not None:
                refs[index] = match.ref
            else:
                fallbacks[index] = match.reason
        out.append(f if index in refs else replace(f, scope=Scope.NODE))
    return Placement(tuple(out), refs, fallbacks)
