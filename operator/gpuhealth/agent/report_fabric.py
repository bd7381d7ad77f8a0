"""The fabric's part of the GPUNodeHealth ``spec``: a GPU's ``nvlink``, ``fabric``, ``pcie`` and ``clocks``,
and the node's ``nics``; and which of their changes are new facts.

Both follow the fields' declarations (``api/report_fabric.py``, ``api/wire.py``): each field is written
by its key and schema, unknown values left out. Counters that tick on healthy hardware (NVLink replay/CRC
errors, link recoveries that succeeded, PCIe replays) are telemetry: written along when the report is
written anyway, never a reason to write it. What counts: a link going down, a peer lost, the fabric's
state or health, a PCIe link that trained narrower or slower, a throttle duty cycle moving by a tenth,
a NIC port's state, any increase of a counter that is fatal on increase, a rate crossing into another
bucket. That keeps a thousand agents from writing every sample.
"""

from __future__ import annotations

from typing import Any

from gpuhealth.agent.model import DeviceFacts
from gpuhealth.api.report_fabric import DEVICE_PARTS, NicPort
from gpuhealth.api.wire import dump, significant

_MAX_NICS = 32


def device_fabric_spec(device: DeviceFacts) -> dict[str, Any]:
    """The fabric objects of one ``spec.devices[]`` entry (those the GPU answered)."""
    out: dict[str, Any] = {}
    for key, _ in DEVICE_PARTS:
        value = getattr(device, key)
        if value is not None and (written := dump(value)):
            out[key] = written
    return out


def nics_spec(nics: tuple[NicPort, ...]) -> list[dict[str, Any]]:
    return [dump(n) for n in sorted(nics, key=lambda n: (n.device, n.port))[:_MAX_NICS]]


# ---- what counts as a change -------------------------------------------------------------------------


def significant_fabric(device: DeviceFacts) -> tuple[Any, ...]:
    """What of ``device``'s fabric objects is a fact, for comparing two samples (None: not answered)."""
    return tuple(None if (v := getattr(device, attr)) is None else significant(v) for attr, _ in DEVICE_PARTS)


def nics_changed(prev: tuple[NicPort, ...], cur: tuple[NicPort, ...]) -> bool:
    return {(n.device, n.port): significant(n) for n in prev} != {(n.device, n.port): significant(n) for n in cur}
