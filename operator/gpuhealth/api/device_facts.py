"""A GPU's scalar facts (``spec.devices[].<key>``), each declared once.

One :class:`Fact` says everything about one fact: its report key, its JSON schema, its description
and unit, whether the operator reads it (or why not), how ``kubectl gpuhealth describe`` shows it, and,
for a fact whose true value is a fault, the finding it makes. Everything else takes it from here:

* ``hack/gen_crds.py`` writes its schema into ``crds/gpunodehealths.yaml`` (``{{ device_facts() }}``);
* ``api/report_fields.py`` lists it in READ or DROPPED, and ``api/report.py`` ``parse_report`` reads
  the READ ones into :class:`~gpuhealth.api.report.Device` by type (:meth:`Fact.parse`);
* ``agent/report.py`` ``device_spec`` writes each of ``agent/model.py`` ``DeviceFacts`` by type
  (:meth:`Fact.dump`);
* ``cli/nodeview.py`` and ``cli/describe_text.py`` show the facts with a ``label`` (a column of the
  Devices table) or ``describe`` (``describe -o json``);
* ``evaluation/assess.py`` makes each :class:`Fault` fact's finding when the GPU reports it true (the
  action is the declaration's: a fact whose action a policy should choose needs a rule of its own in
  ``api/policy.py``);
* the agent reads each :class:`GpuFacts` field through ``agent/nvml_calls.py`` ``GPU_FACT_READS`` (the
  NVML call itself is declared in ``agent/nvml_port.py``), as often as that says.

The facts that existed before this table keep their own typed attributes on both sides (the
operator's :class:`~gpuhealth.api.report.Device` reads ``uuid`` as ``""`` and ``clockEventReasons``
as 0 when absent, the agent's ``DeviceFacts`` keeps None for "not known"). A new fact needs no such
pair: it is a field of :class:`GpuFacts`, which both ``DeviceFacts`` and ``Device`` extend, with None
for "not known" on both. Structured facts are objects of their own, one type each, their fields declared
as these are (``api/wire.py``): the fabric's (``nvlink``, ``fabric``, ``pcie``, ``clocks``) in
``api/report_fabric.py``, ``ecc``, ``retiredPages``, ``remappedRows`` and ``temperature`` in
``api/report.py``; the lists of objects (``migDevices``, ``pods``) are still hand-written in
``api/crds/gpunodehealths.yaml.in``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuhealth.api.names import Action, Signal
from gpuhealth.api.recovery import RecoveryAction
from gpuhealth.api.report_fabric import FieldError
from gpuhealth.api.timeutil import parse_time

MIG_ENABLED = "Enabled"  # spec.devices[].migMode and eccMode
MIG_DISABLED = "Disabled"
MODE_UNSUPPORTED = "Unsupported"
MODES = (MIG_ENABLED, MIG_DISABLED, MODE_UNSUPPORTED)


@dataclass(frozen=True)
class Fault:
    """The finding a boolean fact makes while the GPU reports it true (``evaluation/assess.py``)."""

    signal: Signal
    action: Action
    detail: str


@dataclass(frozen=True)
class Fact:
    """One scalar fact of a GPU as the report carries it."""

    key: str  # spec.devices[].<key>; the Python attribute is its snake_case (attr)
    schema: Mapping[str, Any]  # its JSON schema as the CRD declares it: type, bounds, enum, format
    description: str = ""
    unit: str = ""  # W, C, ...: the CRD's description and the CLI's cells say it
    dropped: str = ""  # why the operator does not read it ("" : it does, as api/report.py Device.<attr>)
    label: str = ""  # its column in `kubectl gpuhealth describe`'s Devices table ("" : none)
    flag: tuple[str, str] = ("", "")  # a boolean's cell when true, when false ("LOST", "no")
    describe: bool = False  # in `describe -o json`'s devices[] without a column of its own
    default: Any = None  # what the CLI shows when the report omits it
    sampled: bool = True  # read off the GPU (DeviceFacts.<attr>); False: agent/report.py derives it
    decode: Callable[[str], Any] | None = None  # a string's typed value (api/recovery.py RecoveryAction.parse)
    fault: Fault | None = None  # a boolean fact whose true value is a finding of its own

    @functools.cached_property
    def attr(self) -> str:
        """The attribute on ``DeviceFacts`` and ``Device``: ``pciBusId`` -> ``pci_bus_id``. Kept once
        worked out: every pass reads it for every fact of every GPU, and the regular expression was a
        seventh of a start-up pass's CPU at 10,000 nodes (py-spy, docs/scaling.md)."""
        return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", self.key).lower()

    @property
    def read(self) -> bool:
        return not self.dropped

    @property
    def shown(self) -> bool:
        """Whether ``kubectl gpuhealth describe`` shows it (``-o json``, and a column when labelled)."""
        return self.describe or bool(self.label)

    def parse(self, value: Any, where: str) -> Any:
        """The typed value of the report's ``value`` (None when absent); raises FieldError when its type is wrong."""
        if value is None:
            return None
        kind = self.schema["type"]
        if kind == "boolean" and isinstance(value, bool):
            return value
        if kind == "integer" and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind == "number" and isinstance(value, int | float) and not isinstance(value, bool):
            return value
        if kind == "string" and isinstance(value, str):
            if self.schema.get("format") == "date-time":
                return parse_time(value)
            return self.decode(value) if self.decode is not None else value
        raise FieldError(f"{where}: expected {'an' if kind == 'integer' else 'a'} {kind}, got {value!r}")

    def dump(self, value: Any) -> Any:
        """The report's value of a sampled ``value``: None (omitted) when unknown or an empty string, a
        string cut to the schema's maxLength, a number to one decimal of its unit."""
        if value is None or value == "":
            return None
        if isinstance(value, enum.Enum):
            return str(value.value)
        if isinstance(value, str):
            limit = self.schema.get("maxLength")
            return value if limit is None or len(value) <= limit else value[: limit - 1] + "…"
        if isinstance(value, float):
            return round(value, 1)
        return value


def fact(declared: Fact) -> Any:
    """A :class:`GpuFacts` field declared by ``declared`` (None: not known)."""
    return field(default=None, metadata={"fact": declared})


@dataclass(frozen=True, kw_only=True)
class GpuFacts:
    """The facts added since this table: each one field here, on the agent's ``DeviceFacts`` and the
    operator's ``Device`` alike (both extend this class). None means "not known"."""

    inforom_corrupt: bool | None = fact(
        Fact(
            "inforomCorrupt",
            {"type": "boolean"},
            "nvmlDeviceValidateInforom: true when NVML answers NVML_ERROR_CORRUPTED_INFOROM (the InfoROM's "
            "checksums do not match; flash it), false when it is valid, absent when not supported.",
            label="INFOROM",
            flag=("CORRUPT", "ok"),
            fault=Fault(
                Signal.INFOROM_CORRUPT,
                Action.OBSERVE,
                "InfoROM corrupt (NVML_ERROR_CORRUPTED_INFOROM): flash the InfoROM (DCGM_FR_CORRUPT_INFOROM)",
            ),
        )
    )


_SCALARS: tuple[Fact, ...] = (
    Fact("uuid", {"type": "string", "maxLength": 128}, describe=True),
    Fact("pciBusId", {"type": "string", "maxLength": 64}, dropped="for humans", describe=True),
    Fact("model", {"type": "string", "maxLength": 128}, describe=True),
    Fact("migMode", {"type": "string", "enum": MODES}),  # read for the MIG layout of describe (cli/miglayout.py)
    Fact("eccMode", {"type": "string", "enum": MODES}, dropped="for humans"),
    Fact(
        "lost",
        {"type": "boolean"},
        "NVML answered GPU_IS_LOST, or the GPU disappeared.",
        label="LOST",
        flag=("LOST", "no"),
        default=False,
    ),
    Fact(
        "clockEventReasons",
        {"type": "integer", "minimum": 0},
        "NVML clock-event bitmask (0x8 HW slowdown, 0x20 SW thermal, 0x40 HW thermal, 0x80 HW power brake).",
        describe=True,
    ),
    Fact(
        "clockEventsSince",
        {"type": "string", "format": "date-time"},
        "When clockEventReasons last changed.",
        sampled=False,
    ),
    Fact(
        "powerW",
        {"type": "number", "minimum": 0},
        "The GPU's power draw (nvmlDeviceGetPowerUsage), to 0.1 W.",
        unit="W",
        dropped="follows the workload; /metrics has it live",
    ),
    Fact(
        "recoveryAction",
        {"type": "string", "enum": tuple(str(a) for a in RecoveryAction)},
        "NVML's GPU recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): Reset (the GPU), BusReset (the GPU's "
        "PCIe bus), DrainAndReset, DrainP2P, Reboot (the node), SystemReboot (the whole system), "
        "RecoverImexDomain (the node's NVLink/IMEX domain).",
        describe=True,
        decode=RecoveryAction.parse,  # a value newer than api/recovery.py is unknown (None), never guessed
    ),
)

DEVICE_FACTS: tuple[Fact, ...] = (
    *_SCALARS,
    *(f.metadata["fact"] for f in dataclasses.fields(GpuFacts)),
)
FAULT_FACTS: tuple[Fact, ...] = tuple(f for f in DEVICE_FACTS if f.fault is not None)
