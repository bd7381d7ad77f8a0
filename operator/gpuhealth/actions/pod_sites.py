"""Which GPU, and which MIG instance of it, each pod of a node holds. Pure.

For the restart-loop rule (``evaluation/restarts.py``): a pod's devices come from its ResourceClaims
(``drain/claims.py``, the mapping the device drain uses), each device's GPU from the node's
ResourceSlices (``actions/gpudevices.py``, the mapping the DeviceTaintRules use), and a MIG
device's instance (GPU and compute instance IDs) from the agent's report, matched by MIG UUID. A
device of no reported GPU, or of a GPU whose slices contradict themselves, is no site: the pod
holding it counts as unknown, and the finding stays the node's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuhealth.actions.gpudevices import devices_of_gpu
from gpuhealth.actions.slices import SlimSlice, current_slices, of_node
from gpuhealth.api.devices import DeviceRef
from gpuhealth.api.report import Report
from gpuhealth.drain.claims import devices_by_pod
from gpuhealth.evaluation.findings import Instance
from gpuhealth.evaluation.restarts import Site


def device_sites(
    node: str, slices: Iterable[SlimSlice], drivers: Sequence[str], report: Report
) -> dict[DeviceRef, Site]:
    """Every DRA device of the node's reported GPUs -> its site."""
    slices = list(slices)
    mine = [s for s in current_slices(slices, drivers) if of_node(s, node)]
    published = {DeviceRef(s.driver, s.pool, d.name): d for s in mine for d in s.devices}
    reported = frozenset(d.uuid for d in report.devices if d.uuid)
    out: dict[DeviceRef, Site] = {}
    for gpu in report.devices:
        match = devices_of_gpu(mine, node, drivers, gpu.index, gpu.uuid, reported)
        if match.conflict:
            continue
        for ref in match.refs:
            instance = None
            dev = published.get(ref)
            if ref in match.partitions and dev is not None and dev.uuid:
                mig = next((m for m in gpu.mig_devices if m.uuid == dev.uuid), None)
                if mig is not None and mig.gpu_instance is not None:
                    instance = Instance(mig.gpu_instance, mig.compute_instance, mig.uuid, mig.profile or dev.profile)
            out[ref] = Site(gpu.index, gpu.uuid, str(ref), instance)
    return out


def pod_sites(
    node: str,
    slices: Iterable[SlimSlice],
    drivers: Sequence[str],
    report: Report,
    claims: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
) -> dict[str, frozenset[Site]]:
    """Each pod of ``pods`` that holds a device -> the sites of its devices; a pod holding a device
    that is no site (another node's, an unmapped GPU's) gets none, so it counts as unknown."""
    pods = list(pods)
    sites = device_sites(node, slices, drivers, report)
    out: dict[str, frozenset[Site]] = {}
    for key, refs in devices_by_pod(claims, pods).items():
        if all(r in sites for r in refs):
            out[key] = frozenset(sites[r] for r in refs)
    return out
