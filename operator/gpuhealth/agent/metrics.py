"""Prometheus metrics of the agent, on a private registry.

A private registry (not the process-global default) lets several agents live in one process,
as the tests run them, without duplicate-registration errors.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from gpuhealth.agent.model import DeviceFacts, NvmlStatus, Snapshot
from gpuhealth.api import fabric
from gpuhealth.api.report_fabric import NIC_COUNTERS, NicPort

_GPU = ("gpu", "uuid")
_PORT = ("device", "port")
# The fabric probe state gauge is NVML's number for it (the report carries its name).
_FABRIC_STATE_CODES = {name: code for code, name in fabric.FABRIC_STATES.items()}


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.nvml_available = Gauge("gpuhealth_agent_nvml_available", "1 when NVML answered.", registry=r)
        self.nvml_unresponsive = Gauge(
            "gpuhealth_agent_nvml_unresponsive",
            "1 while an NVML call has not returned for longer than the agent's bound (its sample age).",
            registry=r,
        )
        self.gpus = Gauge("gpuhealth_agent_gpus", "GPUs discovered (lost ones included).", registry=r)
        self.temperature = Gauge("gpuhealth_agent_gpu_temperature_celsius", "GPU core temperature.", _GPU, registry=r)
        self.temperature_threshold = Gauge(
            "gpuhealth_agent_gpu_temperature_threshold_celsius",
            "Driver temperature thresholds.",
            (*_GPU, "threshold"),
            registry=r,
        )
        self.ecc = Gauge(
            "gpuhealth_agent_gpu_ecc_errors",
            "ECC error counters as NVML reports them (volatile resets with the driver).",
            (*_GPU, "counter", "type"),
            registry=r,
        )
        self.retired_pages = Gauge(
            "gpuhealth_agent_gpu_retired_pages", "Retired memory pages.", (*_GPU, "cause"), registry=r
        )
        self.retired_pages_pending = Gauge(
            "gpuhealth_agent_gpu_retired_pages_pending",
            "1 while a page retirement awaits reset.",
            _GPU,
            registry=r,
        )
        self.remapped_rows = Gauge(
            "gpuhealth_agent_gpu_remapped_rows", "Remapped memory rows.", (*_GPU, "kind"), registry=r
        )
        self.remap_pending = Gauge(
            "gpuhealth_agent_gpu_row_remap_pending", "1 while a row remap awaits reset.", _GPU, registry=r
        )
        self.remap_failure = Gauge(
            "gpuhealth_agent_gpu_row_remap_failure", "1 when row remapping has failed.", _GPU, registry=r
        )
        self.clock_event_reasons = Gauge(
            "gpuhealth_agent_gpu_clock_event_reasons", "NVML clock-event reason bitmask.", _GPU, registry=r
        )
        self.power = Gauge("gpuhealth_agent_gpu_power_watts", "Board power draw.", _GPU, registry=r)
        self.lost = Gauge("gpuhealth_agent_gpu_lost", "1 when NVML says the GPU is lost.", _GPU, registry=r)
        self.xid_events = Counter(
            "gpuhealth_agent_xid_events", "XID events seen.", ("gpu", "xid", "source"), registry=r
        )
        self.writes = Counter("gpuhealth_agent_report_writes", "Report writes to the API.", ("kind",), registry=r)
        self.publish_errors = Counter("gpuhealth_agent_publish_errors", "Failed report write attempts.", registry=r)
        self.last_write = Gauge(
            "gpuhealth_agent_last_write_timestamp_seconds", "When the report was last written.", registry=r
        )
        self.sample_duration = Gauge(
            "gpuhealth_agent_sample_duration_seconds", "How long the last sample took.", registry=r
        )
        self.dcgm_errors = Counter("gpuhealth_agent_dcgm_scrape_errors", "Failed DCGM exporter scrapes.", registry=r)
        # The fabric between GPUs (live values; the report keeps only what changed meaningfully).
        self.nvlink_links = Gauge(
            "gpuhealth_agent_gpu_nvlink_links", "NVLinks the GPU has, by state.", (*_GPU, "state"), registry=r
        )
        self.nvlink_errors = Gauge(
            "gpuhealth_agent_gpu_nvlink_errors",
            "NVLink error counters summed over the links (replay, recovery, crc; Blackwell recovery_*).",
            (*_GPU, "counter"),
            registry=r,
        )
        self.fabric_state = Gauge(
            "gpuhealth_agent_gpu_fabric_state",
            "GPU fabric probe state (0 not supported, 1 not started, 2 in progress, 3 completed).",
            _GPU,
            registry=r,
        )
        self.fabric_fault = Gauge(
            "gpuhealth_agent_gpu_fabric_fault",
            "1 while a fabric health sub-field says so (degradedBandwidth, routeUnhealthy, ...).",
            (*_GPU, "field"),
            registry=r,
        )
        self.pcie_link = Gauge(
            "gpuhealth_agent_gpu_pcie_link",
            "PCIe link width and generation, now and max.",
            (*_GPU, "kind"),
            registry=r,
        )
        self.pcie_replays = Gauge("gpuhealth_agent_gpu_pcie_replays", "PCIe replay counter.", _GPU, registry=r)
        self.throttle = Gauge(
            "gpuhealth_agent_gpu_throttle_percent",
            "Share of the last window the GPU was throttled, by cause.",
            (*_GPU, "cause"),
            registry=r,
        )
        self.nic_up = Gauge(
            "gpuhealth_agent_nic_port_up", "1 while the port is ACTIVE (and its netdev up).", _PORT, registry=r
        )
        self.nic_increase = Gauge(
            "gpuhealth_agent_nic_counter_increase",
            "Increase since the agent started of the NIC counters fatal on increase.",
            (*_PORT, "counter"),
            registry=r,
        )
        self.nic_rate = Gauge(
            "gpuhealth_agent_nic_errors_per_minute", "NIC error rates over the window.", (*_PORT, "counter"), registry=r
        )
        self.journal_errors = Counter(
            "gpuhealth_agent_journal_errors",
            "XID journal problems: op=read (torn or invalid lines skipped), op=write (unwritable state dir).",
            ("op",),
            registry=r,
        )

    def observe(self, snapshot: Snapshot) -> None:
        """Mirror one sample into the gauges (live values, unlike the deduplicated report)."""
        self._observe_status(snapshot.nvml)
        self.gpus.set(len(snapshot.devices))
        for d in snapshot.devices:
            gpu = (str(d.index), d.uuid or "")
            self.lost.labels(*gpu).set(1 if d.lost else 0)
            if d.temperature is not None:
                if d.temperature.current_c is not None:
                    self.temperature.labels(*gpu).set(d.temperature.current_c)
                for name, value in (
                    ("slowdown", d.temperature.slowdown_c),
                    ("shutdown", d.temperature.shutdown_c),
                ):
                    if value is not None:
                        self.temperature_threshold.labels(*gpu, name).set(value)
            if d.ecc is not None:
                for counter, kind, value in (
                    ("volatile", "uncorrected", d.ecc.volatile_uncorrected),
                    ("volatile", "corrected", d.ecc.volatile_corrected),
                    ("aggregate", "uncorrected", d.ecc.aggregate_uncorrected),
                    ("aggregate", "corrected", d.ecc.aggregate_corrected),
                ):
                    if value is not None:
                        self.ecc.labels(*gpu, counter, kind).set(value)
            if d.retired_pages is not None:
                for cause, value in (
                    ("single_bit_ecc", d.retired_pages.single_bit_ecc),
                    ("double_bit_ecc", d.retired_pages.double_bit_ecc),
                ):
                    if value is not None:
                        self.retired_pages.labels(*gpu, cause).set(value)
                if d.retired_pages.pending is not None:
                    self.retired_pages_pending.labels(*gpu).set(int(d.retired_pages.pending))
            if d.remapped_rows is not None:
                for kind, value in (
                    ("corrected", d.remapped_rows.corrected),
                    ("uncorrected", d.remapped_rows.uncorrected),
                ):
                    if value is not None:
                        self.remapped_rows.labels(*gpu, kind).set(value)
                if d.remapped_rows.pending is not None:
                    self.remap_pending.labels(*gpu).set(int(d.remapped_rows.pending))
                if d.remapped_rows.failure is not None:
                    self.remap_failure.labels(*gpu).set(int(d.remapped_rows.failure))
            if d.clock_event_reasons is not None:
                self.clock_event_reasons.labels(*gpu).set(d.clock_event_reasons)
            if d.power_w is not None:
                self.power.labels(*gpu).set(d.power_w)
            self._observe_fabric(gpu, d)
        for nic in snapshot.nics:
            self._observe_nic(nic)

    def _observe_fabric(self, gpu: tuple[str, str], d: DeviceFacts) -> None:
        if d.nvlink is not None:
            n = d.nvlink
            if n.active is not None and n.inactive is not None:
                self.nvlink_links.labels(*gpu, "active").set(n.active)
                self.nvlink_links.labels(*gpu, "inactive").set(n.inactive)
            for counter, value in (
                ("replay", n.replay_errors),
                ("recovery", n.recovery_errors),
                ("crc", n.crc_errors),
                ("recovery_successful", n.recovery_successful),
                ("recovery_failed", n.recovery_failed),
            ):
                if value is not None:
                    self.nvlink_errors.labels(*gpu, counter).set(value)
        if d.fabric is not None:
            if d.fabric.state is not None:
                self.fabric_state.labels(*gpu).set(_FABRIC_STATE_CODES[d.fabric.state])
            if d.fabric.health_mask is not None:
                faults = set(d.fabric.faults)
                for f in (*fabric.BOOLEAN_FIELDS, fabric.INCORRECT_CONFIGURATION):
                    self.fabric_fault.labels(*gpu, f.report).set(1 if f.report in faults else 0)
        if d.pcie is not None:
            for kind, value in (
                ("width", d.pcie.width),
                ("max_width", d.pcie.max_width),
                ("generation", d.pcie.generation),
                ("max_generation", d.pcie.max_generation),
            ):
                if value is not None:
                    self.pcie_link.labels(*gpu, kind).set(value)
            if d.pcie.replays is not None:
                self.pcie_replays.labels(*gpu).set(d.pcie.replays)
        if d.clocks is not None:
            for cause, pct in (
                ("sw_thermal", d.clocks.sw_thermal_pct),
                ("hw_thermal", d.clocks.hw_thermal_pct),
                ("hw_power_brake", d.clocks.hw_power_brake_pct),
            ):
                if pct is not None:
                    self.throttle.labels(*gpu, cause).set(pct)

    def _observe_nic(self, n: NicPort) -> None:
        port = (n.device, str(n.port))
        self.nic_up.labels(*port).set(0 if n.down else 1)
        for c in NIC_COUNTERS:  # api/report_fabric.py: the increase of a fatal one, else its rate
            value = getattr(n, c.attr)
            if value is not None:
                (self.nic_increase if c.fatal else self.nic_rate).labels(*port, c.name).set(value)

    def _observe_status(self, status: NvmlStatus) -> None:
        self.nvml_available.set(1 if status.available else 0)
