"""What a pass may do before the start-up pod list is in: take out, never lift.

At 10,000 nodes the pods are the longest list of a start-up (80,000 of them, listed after the
Nodes and reports: ``controller/process/runtime.py``), and a restarted operator waiting for them is
blind to a new fault for minutes (docs/bench.md, warm restart). Two things need the pods: drains,
and the restart-loop finding (pods failing on the node). A verdict computed without the pods can
only miss that one finding, so it can be wrong only by keeping less out than it should. Where the
node holds nothing out yet (no quarantine, no GPU held out), acting on such a verdict can only take
out: the node or a GPU the facts already condemn. Anything else (a record that holds something
out, which a missing finding could release; a release an SRE asked for; a drain) waits for the
list, which passes every node again with the pods.

A node gpuhealth has never evaluated is the exception that makes a first start-up fast: nothing of
gpuhealth's is on it yet (``never_evaluated``), so its first verdict, whatever it is, lifts nothing,
and it is written at once. At 10,000 nodes those are 20,000 writes (the report's status, and the
Node's condition with its state label in one patch: ``actions/nodes.py``, ``node_writes``) that
would otherwise all wait behind the pod list, and meanwhile the
sweeper and every Lease renewal re-queued each unevaluated node for a pass that could write nothing,
several times each during one run's pod list (docs/scaling.md, the start-up writes). The pod list's pass
then corrects a first verdict a restart loop changes, as it would any verdict.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuhealth.api.devices import DeviceRecord
from gpuhealth.api.names import GROUP, QUARANTINE_ANNOTATION
from gpuhealth.api.status import Record, StoredStatus


def acts_before_pods(
    prior: Record,
    devices: Iterable[DeviceRecord],
    new_quarantine: bool,
    new_device_quarantines: Iterable[int],
    commands: bool,
    first: bool = False,
) -> bool:
    """Whether a pass made without the pods may write: ``prior`` is the node's record and ``devices``
    its GPUs' records as persisted; ``new_quarantine`` and ``new_device_quarantines`` what this pass
    decided; ``commands`` whether an SRE asked for a release on the Node; ``first`` whether the node
    was never evaluated (``never_evaluated``)."""
    holds = prior.out_of_service or any(d.out_of_service for d in devices)
    takes = new_quarantine or any(True for _ in new_device_quarantines)
    return (takes or first) and not holds and not commands


def never_evaluated(status: StoredStatus, node: Mapping[str, Any], rules: int) -> bool:
    """Whether gpuhealth has left nothing on a node yet: no status on its report (``status``, as
    written), none of gpuhealth's taints and not its ownership annotation on the Node, and none of its
    DeviceTaintRules for the node's GPUs (``rules``, how many it knows). A report whose status was lost
    while its Node stayed quarantined is not such a node: its taint is there to lift."""
    if status.written or rules:
        return False
    meta = node.get("metadata") or {}
    if QUARANTINE_ANNOTATION in (meta.get("annotations") or {}):
        return False
    taints = (node.get("spec") or {}).get("taints") or []
    return not any(str(t.get("key", "")).startswith(f"{GROUP}/") for t in taints)
