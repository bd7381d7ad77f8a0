"""The seam between the agent's logic and where GPU facts come from.

The real implementation is :class:`gpuhealth.agent.nvml_source.NvmlSource`; tests of the
publishing and change rules can substitute anything with the same shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gpuhealth.agent.model import DeviceFacts, NvmlStatus, XidEvent


@dataclass(frozen=True)
class SourceEvents:
    """What one bounded event wait produced.

    ``resample`` asks the sampler to read counters now instead of at the next interval (an
    ECC event means the counters just moved).
    """

    xids: tuple[XidEvent, ...] = ()
    resample: bool = False


@dataclass(frozen=True)
class DeviceSample:
    status: NvmlStatus
    devices: tuple[DeviceFacts, ...] = field(default=())


class DeviceSource(Protocol):
    """A source of per-GPU facts and XID events.

    ``sample`` is called by the sampler thread and ``wait_events`` by the event thread, so
    implementations must tolerate the two running concurrently. ``wait_events`` must return
    within roughly ``timeout_s`` so the agent can stop; ``close`` is called only after the
    event thread has stopped.
    """

    def sample(self) -> DeviceSample: ...

    def wait_events(self, timeout_s: float) -> SourceEvents: ...

    def close(self) -> None: ...
