"""The per-GPU record gpuhealth keeps in GPUNodeHealth ``status.devices``.

One entry per GPU of the node: its index and UUID, its own state (a GPU can be held out of service
while its node stays in service), why, since when and under which rule, plus the history the
per-device state machine needs (quarantine times for flapping, probation start, drain progress).
It is the write-ahead record of a device quarantine, exactly as the node record is for a node: the
status is written before the DeviceTaintRule, so a restarted operator converges to it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuhealth.api.timeutil import format_time, parse_time


@dataclass(frozen=True, order=True)
class DeviceRef:
    """One DRA device: what a DeviceTaintRule's ``deviceSelector`` and a claim's result name."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"

    @staticmethod
    def parse(text: str) -> DeviceRef | None:
        """The inverse of ``str``: a driver and a device name hold no slash, a pool may."""
        driver, _, rest = text.partition("/")
        pool, _, device = rest.rpartition("/")
        return DeviceRef(driver, pool, device) if driver and pool and device else None


class DeviceState(StrEnum):
    IN_SERVICE = "InService"
    QUARANTINED = "Quarantined"  # tainted (DeviceTaintRule NoSchedule); pods on it keep running
    DRAINING = "Draining"  # tainted, and the pods that hold it are being drained
    AWAITING_REPAIR = "AwaitingRepair"  # tainted until a human releases it
    RECOVERING = "Recovering"  # still tainted, on probation


DEVICE_OUT_OF_SERVICE = frozenset(
    {DeviceState.QUARANTINED, DeviceState.DRAINING, DeviceState.AWAITING_REPAIR, DeviceState.RECOVERING}
)
MAX_DEVICE_HISTORY = 20

# How a GPU no DRA ResourceSlice publishes is kept from new pods on a device-plugin node
# (``DeviceRecord.kept_off_by``): the plugin already withholds it, or gpuhealth's NoSchedule taint
# ``gpuhealth.dev/gpu-out`` keeps new pods off the whole node.
KEPT_OFF_BY_PLUGIN = "DevicePlugin"
KEPT_OFF_BY_TAINT = "NodeTaint"
KEPT_OFF_BY = (KEPT_OFF_BY_PLUGIN, KEPT_OFF_BY_TAINT)  # ``keptOffBy``'s values (the CRD's enum)
KEPT_OFF_WORDS = {KEPT_OFF_BY_PLUGIN: "withheld by the device plugin", KEPT_OFF_BY_TAINT: "node tainted NoSchedule"}


@dataclass(frozen=True)
class DeviceRecord:
    """One GPU's verdict. ``rule`` names the policy rule that took it out (``ecc``, ``xid``, ...)."""

    index: int
    uuid: str = ""
    state: DeviceState = DeviceState.IN_SERVICE
    reason: str = ""
    message: str = ""
    since: dt.datetime | None = None
    rule: str = ""
    quarantines: tuple[dt.datetime, ...] = ()
    # The last two quarantines (previous, last), never pruned by the flapping window nor cleared by a
    # release: the time between failures (``gpuhealth_gpu_time_between_failures_seconds``).
    last_failures: tuple[dt.datetime, ...] = ()
    healthy_since: dt.datetime | None = None
    cleared_before: dt.datetime | None = None
    held_by_breaker: bool = False
    drain_action: str = ""
    drained: bool = False
    # Every DRA device ``driver/pool/device`` of the GPU held out (its full device first, then its
    # MIG devices or placements), and the names of their DeviceTaintRules: the write-ahead record,
    # written before any rule is created.
    devices: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()  # those of ``devices`` that are MIG devices or placements
    taint_rules: tuple[str, ...] = ()
    # The MIG UUIDs of the instances held out on their own (a fault confined to them); then
    # ``devices`` are just their MIG devices and the GPU serves on with its others. Empty: the whole
    # GPU is held out.
    instances: tuple[str, ...] = ()
    # Held out on a device-plugin node (no DRA device to taint): how new work is kept off it,
    # ``KEPT_OFF_BY_PLUGIN`` or ``KEPT_OFF_BY_TAINT``; only the pods the agent's report names as
    # holding it are drained. Empty on the DRA path and while the GPU is in service.
    kept_off_by: str = ""

    @property
    def out_of_service(self) -> bool:
        return self.state in DEVICE_OUT_OF_SERVICE

    @property
    def whole_gpu_out(self) -> bool:
        """Out of service as a whole; a GPU with only some of its MIG devices held out still serves."""
        return self.out_of_service and not self.instances

    @property
    def via_plugin(self) -> bool:
        """Held out on a device-plugin node: its pods are those the agent's report names."""
        return bool(self.kept_off_by)

    @property
    def device(self) -> str:
        """The GPU's first device (its full device where it has one): the previous version's field."""
        return self.devices[0] if self.devices else ""

    @property
    def taint_rule(self) -> str:
        return self.taint_rules[0] if self.taint_rules else ""

    def refs(self) -> tuple[DeviceRef, ...]:
        return tuple(r for r in (DeviceRef.parse(d) for d in self.devices) if r is not None)

    def to_status(self) -> dict[str, Any]:
        """The entry in ``status.devices``; absent facts are omitted so entries stay short."""
        out: dict[str, Any] = {"index": self.index, "state": str(self.state)}
        optional: dict[str, Any] = {
            "uuid": self.uuid,
            "reason": self.reason,
            "message": self.message,
            "since": format_time(self.since) if self.since else "",
            "rule": self.rule,
            "quarantines": [format_time(t) for t in self.quarantines],
            "lastFailures": [format_time(t) for t in self.last_failures],
            "healthySince": format_time(self.healthy_since) if self.healthy_since else "",
            "clearedBefore": format_time(self.cleared_before) if self.cleared_before else "",
            "heldByBreaker": self.held_by_breaker,
            "drainAction": self.drain_action,
            "drained": self.drained,
            "devices": list(self.devices),
            "partitions": list(self.partitions),
            "taintRules": list(self.taint_rules),
            "instances": list(self.instances),
            "keptOffBy": self.kept_off_by,
            # Also the first device and rule under the previous version's single fields, for its
            # readers (an operator rolled back, the plugin, dashboards); ``devices`` is the record.
            "device": self.device,
            "taintRule": self.taint_rule,
        }
        out.update({k: v for k, v in optional.items() if v})
        return out

    @staticmethod
    def from_status(entry: Mapping[str, Any]) -> DeviceRecord | None:
        """The record from a ``status.devices`` entry; None for an entry without a usable index."""
        index = entry.get("index")
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            return None
        try:
            state = DeviceState(str(entry.get("state") or DeviceState.IN_SERVICE))
        except ValueError:
            state = DeviceState.IN_SERVICE
        raw = entry.get("quarantines") or []
        quarantines = tuple(t for t in (parse_time(str(x)) for x in raw if x) if t) if isinstance(raw, list) else ()
        raw = entry.get("lastFailures") or []
        failures = tuple(t for t in (parse_time(str(x)) for x in raw if x) if t) if isinstance(raw, list) else ()
        return DeviceRecord(
            index=index,
            uuid=str(entry.get("uuid") or ""),
            state=state,
            reason=str(entry.get("reason") or ""),
            message=str(entry.get("message") or ""),
            since=parse_time(entry.get("since")),
            rule=str(entry.get("rule") or ""),
            quarantines=quarantines[-MAX_DEVICE_HISTORY:],
            last_failures=failures[-2:],
            healthy_since=parse_time(entry.get("healthySince")),
            cleared_before=parse_time(entry.get("clearedBefore")),
            held_by_breaker=bool(entry.get("heldByBreaker", False)),
            drain_action=str(entry.get("drainAction") or ""),
            drained=bool(entry.get("drained", False)),
            devices=_names(entry, "devices", "device"),
            partitions=_names(entry, "partitions", ""),
            taint_rules=_names(entry, "taintRules", "taintRule"),
            instances=_names(entry, "instances", ""),
            kept_off_by=str(entry.get("keptOffBy") or "") if entry.get("keptOffBy") in KEPT_OFF_WORDS else "",
        )


def _names(entry: Mapping[str, Any], many: str, one: str) -> tuple[str, ...]:
    """A list of names; a record written by the previous version has only the single field ``one``."""
    raw = entry.get(many)
    if isinstance(raw, list):
        return tuple(dict.fromkeys(str(x) for x in raw if isinstance(x, str) and x))
    single = entry.get(one) if one else None
    return (str(single),) if isinstance(single, str) and single else ()


def devices_to_status(records: Iterable[DeviceRecord]) -> list[dict[str, Any]]:
    """``status.devices``, ordered by index (a merge patch replaces the whole list)."""
    return [r.to_status() for r in sorted(records, key=lambda r: r.index)]


def devices_from_status(status: Mapping[str, Any] | None) -> dict[int, DeviceRecord]:
    """Records by GPU index from a GPUNodeHealth status; unreadable entries are dropped."""
    raw = (status or {}).get("devices") or []
    out: dict[int, DeviceRecord] = {}
    if not isinstance(raw, list):
        return out
    for entry in raw:
        if isinstance(entry, Mapping):
            rec = DeviceRecord.from_status(entry)
            if rec is not None:
                out[rec.index] = rec
    return out
