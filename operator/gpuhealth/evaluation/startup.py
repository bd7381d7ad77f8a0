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
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuhealth.api.devices import DeviceRecord
from gpuhealth.api.status import Record


def acts_before_pods(
    prior: Record,
    devices: Iterable[DeviceRecord],
    new_quarantine: bool,
    new_device_quarantines: Iterable[int],
    commands: bool,
) -> bool:
    """Whether a pass made without the pods may write: ``prior`` is the node's record and ``devices``
    its GPUs' records as persisted; ``new_quarantine`` and ``new_device_quarantines`` what this pass
    decided; ``commands`` whether an SRE asked for a release on the Node."""
    holds = prior.out_of_service or any(d.out_of_service for d in devices)
    takes = new_quarantine or any(True for _ in new_device_quarantines)
    return takes and not holds and not commands
