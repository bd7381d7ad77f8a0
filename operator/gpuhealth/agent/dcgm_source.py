"""Facts from a local DCGM exporter's ``/metrics`` (optional second source).

The exporter is a Prometheus endpoint, so it is parsed with ``prometheus_client.parser``. Two
quirks shape this module: the host label was renamed ``Hostname`` -> ``hostname`` in newer
exporters, and ``DCGM_FI_DEV_XID_ERRORS`` is a gauge of the *last* XID per GPU, so a new XID
can only be detected as a change of that value (or of its ``err_code`` label).
"""

from __future__ import annotations

import logging
import math
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpuhealth.agent.model import (
    UTC,
    DeviceFacts,
    EccCounts,
    RemappedRows,
    RetiredPages,
    Temperature,
    XidEvent,
)
from gpuhealth.api.fabric import GPU_IDLE
from gpuhealth.api.report_fabric import Fabric, Pcie

log = logging.getLogger(__name__)

XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"

# metric name -> (fact group, field); the groups mirror DeviceFacts' nested dataclasses.
_FIELDS: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc", "volatile_uncorrected"),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc", "volatile_corrected"),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("ecc", "aggregate_uncorrected"),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("ecc", "aggregate_corrected"),
    "DCGM_FI_DEV_RETIRED_SBE": ("retired", "single_bit_ecc"),
    "DCGM_FI_DEV_RETIRED_DBE": ("retired", "double_bit_ecc"),
    "DCGM_FI_DEV_RETIRED_PENDING": ("retired", "pending"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("remap", "corrected"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("remap", "uncorrected"),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("remap", "pending"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("remap", "failure"),
    "DCGM_FI_DEV_GPU_TEMP": ("temp", "current_c"),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("device", "clock_event_reasons"),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("device", "clock_event_reasons"),
    "DCGM_FI_DEV_POWER_USAGE": ("device", "power_w"),
    # The fabric (DCGM fields 170, 173-175; PCIe 237/238): the same facts NVML gives, where the
    # exporter is configured to export them.
    "DCGM_FI_DEV_FABRIC_MANAGER_STATUS": ("fabric", "manager_status"),
    "DCGM_FI_DEV_FABRIC_CLIQUE_ID": ("fabric", "clique_id"),
    "DCGM_FI_DEV_FABRIC_HEALTH_MASK": ("fabric", "health_mask"),
    "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY": ("fabric", "health_summary"),
    "DCGM_FI_DEV_PCIE_LINK_GEN": ("pcie", "generation"),
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": ("pcie", "width"),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("pcie", "replays"),
}
# DCGM_FI_DEV_FABRIC_MANAGER_STATUS -> (NVML fabric state, probe status): 0 NotSupported, 1 NotStarted,
# 2 InProgress, 3 Success, 4 Failure (a completed probe with an error; DCGM gives no code, so NVML's
# "unknown error" 999); 5 Unrecognized and 6 NvmlTooOld say nothing about the fabric.
_MANAGER_STATUS: dict[int, tuple[int, int | None]] = {0: (0, None), 1: (1, None), 2: (2, None), 3: (3, 0), 4: (3, 999)}
_BOOL_FIELDS = {"pending", "failure"}


@dataclass
class DcgmGpu:
    """Everything the exporter said about one GPU in one scrape."""

    index: int
    uuid: str | None = None
    model: str | None = None
    pci_bus_id: str | None = None
    values: dict[tuple[str, str], float] = field(default_factory=dict)
    xid: int | None = None
    xid_signature: tuple[int, str] | None = None

    def facts(self) -> DeviceFacts:
        """The scrape as DeviceFacts; fields the exporter did not export stay None."""

        def group(name: str) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for (g, f), v in self.values.items():
                if g == name:
                    out[f] = bool(v) if f in _BOOL_FIELDS else int(v)
            return out

        device = group("device")
        ecc, retired, remap, temp = group("ecc"), group("retired"), group("remap"), group("temp")
        power = self.values.get(("device", "power_w"))
        fab, pcie = group("fabric"), group("pcie")
        state = _MANAGER_STATUS.get(fab.pop("manager_status", -1))
        fabric = (
            None
            if state is None
            else Fabric.decoded(state[0], state[1], None, **fab)
            if state[0]
            else Fabric.decoded(0)
        )
        return DeviceFacts(
            index=self.index,
            uuid=self.uuid,
            pci_bus_id=self.pci_bus_id,
            model=self.model,
            ecc=EccCounts(**ecc) if ecc else None,
            retired_pages=RetiredPages(**retired) if retired else None,
            remapped_rows=RemappedRows(**remap) if remap else None,
            temperature=Temperature(**temp) if temp else None,
            clock_event_reasons=device.get("clock_event_reasons"),
            power_w=power,
            fabric=fabric,
            pcie=Pcie(pcie.get("width"), None, pcie.get("generation"), None, pcie.get("replays")) if pcie else None,
        )


def _host_label(labels: Mapping[str, str]) -> str | None:
    return labels.get("Hostname") or labels.get("hostname")


def parse_dcgm_metrics(text: str, node_name: str | None = None) -> dict[int, DcgmGpu]:
    """Per-GPU values from exporter text, keyed by GPU index.

    When samples carry a host label and some match ``node_name``, only those are used (an
    exporter behind a shared endpoint may list several hosts). If none match but there is
    exactly one host, it is this node under another name (pod hostname) and is accepted.
    """
    rows: list[tuple[str, dict[str, str], float]] = []
    for family in text_string_to_metric_families(text):
        name = family.name
        if name not in _FIELDS and name != XID_METRIC and name + "_total" in _FIELDS:
            name += "_total"
        if name not in _FIELDS and name != XID_METRIC:
            continue
        for sample in family.samples:
            if sample.name.endswith(("_created", "_bucket", "_count", "_sum")):
                continue
            rows.append((name, dict(sample.labels), float(sample.value)))

    hosts = {h for _, labels, _ in rows if (h := _host_label(labels))}
    if node_name and node_name in hosts:
        rows = [r for r in rows if _host_label(r[1]) in (None, node_name)]
    elif len(hosts) > 1:
        log.warning("DCGM exporter lists hosts %s and none is %s; ignoring it", sorted(hosts), node_name)
        return {}

    gpus: dict[int, DcgmGpu] = {}
    for name, labels, value in rows:
        try:
            index = int(labels.get("gpu", ""))
        except ValueError:
            continue
        if math.isnan(value):
            continue
        gpu = gpus.setdefault(index, DcgmGpu(index=index))
        gpu.uuid = gpu.uuid or labels.get("UUID") or labels.get("uuid") or None
        gpu.model = gpu.model or labels.get("modelName") or None
        gpu.pci_bus_id = gpu.pci_bus_id or labels.get("pci_bus_id") or None
        if name == XID_METRIC:
            code_label = labels.get("err_code", "")
            try:
                code = int(code_label) if code_label else int(value)
            except ValueError:
                code = int(value)
            gpu.xid = code if code > 0 else None
            gpu.xid_signature = (int(value), code_label)
        else:
            gpu.values[_FIELDS[name]] = value
    return gpus


@dataclass(frozen=True)
class DcgmSample:
    devices: dict[int, DeviceFacts]
    # (event, baseline): baseline events are the first value seen and may predate this process.
    xids: tuple[tuple[XidEvent, bool], ...] = ()
    error: str | None = None


class XidChangeDetector:
    """Turns successive last-XID gauges into XID events."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[int, str]] = {}

    def update(self, gpus: Mapping[int, DcgmGpu], now: datetime) -> list[tuple[XidEvent, bool]]:
        events: list[tuple[XidEvent, bool]] = []
        for index, gpu in sorted(gpus.items()):
            if gpu.xid_signature is None:
                continue
            previous = self._seen.get(index)
            self._seen[index] = gpu.xid_signature
            if previous == gpu.xid_signature or gpu.xid is None:
                continue
            event = XidEvent(
                xid=gpu.xid,
                time=now,
                source="dcgm",
                gpu=index,
                uuid=gpu.uuid or "",
                detail="last XID reported by the DCGM exporter",
            )
            events.append((event, previous is None))
        return events


class DcgmSource:
    """Scrapes the exporter once per agent sample."""

    def __init__(self, url: str, node_name: str | None, timeout_s: float = 3.0) -> None:
        self.url = url
        self.node_name = node_name
        self.timeout_s = timeout_s
        self._detector = XidChangeDetector()
        self._last_error: str | None = None
        self._busy_gen: dict[int, int] = {}

    def fetch(self) -> str:
        request = urllib.request.Request(self.url, headers={"Accept": "text/plain"})
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            body: bytes = response.read()
        return body.decode("utf-8", errors="replace")

    def sample(self) -> DcgmSample:
        """One scrape; on failure no facts (stale DCGM values are worse than none)."""
        try:
            text = self.fetch()
            gpus = parse_dcgm_metrics(text, self.node_name)
        except (OSError, ValueError) as exc:
            error = f"DCGM exporter {self.url}: {exc}"
            if error != self._last_error:
                log.warning("%s", error)
            self._last_error = error
            return DcgmSample(devices={}, error=error)
        if self._last_error is not None:
            log.info("DCGM exporter %s reachable again", self.url)
        self._last_error = None
        xids = self._detector.update(gpus, datetime.now(UTC))
        return DcgmSample(devices={i: self._busy_generation(i, g.facts()) for i, g in gpus.items()}, xids=tuple(xids))

    def _busy_generation(self, index: int, facts: DeviceFacts) -> DeviceFacts:
        """The PCIe generation as last seen while the GPU was busy (an idle link drops it: no fact)."""
        pcie = facts.pcie
        if pcie is None:
            return facts
        reasons = facts.clock_event_reasons
        if pcie.generation is not None and reasons is not None and not reasons & GPU_IDLE:
            self._busy_gen[index] = pcie.generation
        gen = self._busy_gen.get(index)
        return facts.replace(pcie=Pcie(pcie.width, None, gen, None, pcie.replays))


def merge_dcgm(devices: tuple[DeviceFacts, ...], dcgm: Mapping[int, DeviceFacts]) -> tuple[DeviceFacts, ...]:
    """Fill facts NVML did not give with the exporter's, matching GPUs by UUID then index.

    NVML stays authoritative: a DCGM value never overrides one NVML reported.
    """
    by_uuid = {d.uuid: d for d in dcgm.values() if d.uuid}
    merged: list[DeviceFacts] = []
    for device in devices:
        other = by_uuid.get(device.uuid) if device.uuid else None
        if other is None:
            candidate = dcgm.get(device.index)
            if candidate is not None and (candidate.uuid is None or device.uuid is None):
                other = candidate
        if other is None or device.lost:
            merged.append(device)
            continue
        changes: dict[str, object] = {}
        for name in ("ecc", "retired_pages", "remapped_rows", "clock_event_reasons", "power_w", "fabric", "pcie"):
            if getattr(device, name) is None and getattr(other, name) is not None:
                changes[name] = getattr(other, name)
        if other.temperature is not None and other.temperature.current_c is not None:
            if device.temperature is None:
                changes["temperature"] = other.temperature
            elif device.temperature.current_c is None:
                changes["temperature"] = Temperature(
                    other.temperature.current_c, device.temperature.slowdown_c, device.temperature.shutdown_c
                )
        merged.append(device.replace(**changes) if changes else device)
    return tuple(merged)
