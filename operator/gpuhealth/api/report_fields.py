"""The report contract's field table: every field of a GPUNodeHealth ``spec`` that
``crds/gpunodehealths.yaml`` declares, either read by ``api/report.py`` ``parse_report`` (and so
kept by the operator's slim cache) or dropped, with the reason nobody reads it.

One table, so that a field cannot be added in one place and forgotten in another: the slim cache
(``controller/state/slim.py``) derives the fields it keeps of each report from :data:`READ`, and
``tests/unit/test_contracts.py`` holds the table to the CRD (every declared field is in exactly one
of the two lists), to the parser (dropping a READ field changes what ``parse_report`` returns,
dropping a DROPPED one never does) and to the cache (it keeps exactly the READ fields). A field
added to the CRD fails the build until it is listed here.

A device's scalar facts are declared in ``api/device_facts.py`` (each with whether it is read, or
why not), the fabric's objects and the NIC ports field by field in ``api/report_fabric.py``; both are
listed here from there.

Paths are spelled as the tests' schema walker spells them: dotted, a list's items as ``[]``.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuhealth.api.device_facts import DEVICE_FACTS
from gpuhealth.api.report import DEVICE_OBJECTS
from gpuhealth.api.report_fabric import DEVICE_PARTS, NicPort
from gpuhealth.api.wire import dropped_paths, read_paths

READ: tuple[str, ...] = (
    "spec.nodeName",  # must be the report's name (a report about another node is refused)
    "spec.heartbeatTime",
    "spec.observedTime",
    "spec.nvml.available",
    "spec.nvml.error",
    "spec.nvml.unresponsive.call",
    "spec.nvml.unresponsive.since",
    "spec.nvml.unresponsive.lastSampleTime",
    "spec.podResources.available",
    "spec.podResources.error",
    "spec.devices[].index",
    *(f"spec.devices[].{f.key}" for f in DEVICE_FACTS if f.read),  # the scalar facts: api/device_facts.py
    # A GPU's objects (ecc, retiredPages, ...): each field's declaration says (api/report.py).
    *(p for key, _, cls in DEVICE_OBJECTS for p in read_paths(f"spec.devices[].{key}", cls)),
    "spec.devices[].migDevices[].index",
    "spec.devices[].migDevices[].uuid",
    "spec.devices[].migDevices[].gpuInstanceId",
    "spec.devices[].migDevices[].computeInstanceId",
    "spec.devices[].migDevices[].profile",
    "spec.devices[].migDevices[].pods[].namespace",
    "spec.devices[].migDevices[].pods[].name",
    "spec.devices[].migDevices[].pods[].container",
    "spec.devices[].migDevices[].pods[].resource",
    "spec.devices[].pods[].namespace",
    "spec.devices[].pods[].name",
    "spec.devices[].pods[].container",
    "spec.devices[].pods[].resource",
    # The fabric's objects and the NIC ports: each field's declaration says (api/report_fabric.py).
    *(p for name, cls in DEVICE_PARTS for p in read_paths(f"spec.devices[].{name}", cls)),
    "spec.xidEvents[].xid",
    "spec.xidEvents[].time",
    "spec.xidEvents[].gpu",
    "spec.xidEvents[].uuid",
    "spec.xidEvents[].gpuInstanceId",
    "spec.xidEvents[].computeInstanceId",
    *read_paths("spec.nics[]", NicPort),
)

# Declared, written by the agent, read by nobody in the operator: the slim cache drops them, which
# is most of a report's size (a fleet's cache holds one report per node).
DROPPED: Mapping[str, str] = {
    "spec.agent.version": "for humans (kubectl gpuhealth describe)",
    "spec.agent.sources[]": "for humans; each XID carries its own source",
    "spec.agent.bootTime": "the agent's own XID history boundary",
    "spec.nvml.driverVersion": "for humans",
    "spec.nvml.cudaVersion": "for humans",
    **{f"spec.devices[].{f.key}": f.dropped for f in DEVICE_FACTS if not f.read},
    **{p: why for key, _, cls in DEVICE_OBJECTS for p, why in dropped_paths(f"spec.devices[].{key}", cls).items()},
    "spec.devices[].unsupported[]": "queries NVML refused: recorded, not faults",
    **{p: why for name, cls in DEVICE_PARTS for p, why in dropped_paths(f"spec.devices[].{name}", cls).items()},
    **dropped_paths("spec.nics[]", NicPort),
    "spec.xidEvents[].source": "for humans",
    "spec.xidEvents[].detail": "for humans",
}


def read_under(prefix: str) -> tuple[str, ...]:
    """The READ fields directly under ``prefix`` (``spec.devices[]``), by name, in table order; a list of
    scalars (``peers[]``) by its key."""
    start = prefix + "."
    return tuple(
        p.removeprefix(start).removesuffix("[]")
        for p in READ
        if p.startswith(start) and "." not in p.removeprefix(start)
    )


def read_objects_under(prefix: str) -> dict[str, tuple[str, ...]]:
    """The objects (not lists) directly under ``prefix`` that hold READ fields, each with its
    fields: a device's ``ecc``, ``retiredPages``, ... ."""
    start = prefix + "."
    names: dict[str, None] = {}
    for p in READ:
        rest = p.removeprefix(start)
        if p.startswith(start) and "." in rest and not rest.split(".", 1)[0].endswith("[]"):
            names[rest.split(".", 1)[0]] = None
    return {name: read_under(f"{prefix}.{name}") for name in names}


def read_lists_under(prefix: str) -> dict[str, tuple[str, ...]]:
    """The lists of objects directly under ``prefix`` whose items hold READ fields of their own (scalars
    only, not lists nested deeper), each with those fields: a device's ``pods``, a MIG device's ``pods``."""
    start = prefix + "."
    names: dict[str, None] = {}
    for p in READ:
        rest = p.removeprefix(start)
        if p.startswith(start) and "." in rest and rest.split(".", 1)[0].endswith("[]"):
            names[rest.split(".", 1)[0].removesuffix("[]")] = None
    return {name: read_under(f"{prefix}.{name}[]") for name in names}
