"""MIG devices of one GPU, read through NVML: which instances exist and how they are identified.

The report lists them so the operator can tell which MIG slice an XID hit (NVML attributes XIDs
by GPU and compute instance ID) and so a changed layout is a changed fact. Only called while the
GPU's MIG mode is Enabled.

Rules: an empty slot (``NotFound``) is skipped; an attribute NVML cannot give is omitted, never
guessed; ``GpuIsLost`` and ``NotSupported`` of the listing itself propagate, so the sampler marks
the GPU lost or records ``migDevices`` as unsupported.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import TypeVar

import pynvml

from gpuhealth.agent.nvml_calls import nvml_text
from gpuhealth.agent.nvml_port import Handle, Nvml
from gpuhealth.api.report import MigDevice

log = logging.getLogger("gpuhealth.agent.nvml_source")

MAX_MIG_DEVICES = 16  # the report's bound (CRD maxItems, index 0..15)
_PROFILE = re.compile(r"\bMIG\s+(\S{1,32})\s*$")
_PROFILE_SHAPE = re.compile(r"^(?:\d+c\.)?\d+g\.\d+gb(?:\+\w+)*$", re.IGNORECASE)

T = TypeVar("T")


def mig_profile(name: str) -> str | None:
    """The profile in a MIG device's NVML name ("NVIDIA H100 80GB HBM3 MIG 3g.40gb" -> "3g.40gb")."""
    match = _PROFILE.search(name)
    if match is None or not _PROFILE_SHAPE.match(match.group(1)):
        return None
    return match.group(1)


def _attribute(fn: Callable[[], T], what: str, parent: int, index: int) -> T | None:
    try:
        return fn()
    except pynvml.NVMLError_GpuIsLost:
        raise
    except pynvml.NVMLError as exc:
        log.debug("GPU %d MIG device %d: %s: %s", parent, index, what, exc)
        return None


def _read_one(nvml: Nvml, mig: Handle, parent: int, index: int) -> MigDevice:
    uuid = _attribute(lambda: nvml_text(nvml.nvmlDeviceGetUUID(mig)), "uuid", parent, index)
    gi = _attribute(lambda: int(nvml.nvmlDeviceGetGpuInstanceId(mig)), "GPU instance", parent, index)
    ci = _attribute(lambda: int(nvml.nvmlDeviceGetComputeInstanceId(mig)), "compute instance", parent, index)
    name = _attribute(lambda: nvml_text(nvml.nvmlDeviceGetName(mig)), "name", parent, index)
    return MigDevice(
        index=index,
        uuid=uuid if uuid and len(uuid) <= 128 else "",
        gpu_instance=gi if gi is not None and gi >= 0 else None,
        compute_instance=ci if ci is not None and ci >= 0 else None,
        profile=(mig_profile(name) if name else None) or "",
    )


def read_mig_devices(nvml: Nvml, handle: Handle, parent: int) -> tuple[MigDevice, ...]:
    """Every MIG device NVML lists under the GPU ``handle`` (index ``parent``), by MIG index."""
    count = min(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)), MAX_MIG_DEVICES)
    out: list[MigDevice] = []
    for index in range(max(0, count)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        except pynvml.NVMLError_NotFound:
            continue  # an empty slot
        except pynvml.NVMLError_GpuIsLost:
            raise
        except pynvml.NVMLError as exc:
            log.debug("GPU %d MIG device %d: handle: %s", parent, index, exc)
            continue
        out.append(_read_one(nvml, mig, parent, index))
    return tuple(out)
