"""Prometheus metrics of the agent, on a private registry.

A private registry (not the process-global default) lets several agents live in one process,
as the tests run them, without duplicate-registration errors.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from gpuhealth.agent.model import NvmlStatus, Snapshot

_GPU = ("gpu", "uuid")


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

    def _observe_status(self, status: NvmlStatus) -> None:
        self.nvml_available.set(1 if status.available else 0)
