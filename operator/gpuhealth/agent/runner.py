"""Wires the agent together: sampler, XID event thread, publisher and metrics server.

Threads and what they own:

* sampler: reads every source each ``interval_s`` (sooner after an ECC/XID event) and puts
  the merged :class:`Snapshot` in a one-slot mailbox (its first sample too, so a first NVML call
  that hangs cannot keep the agent from saying so);
* NVML watchdog: never touches NVML; declares a sample that runs past ``nvml_hang_after_s`` a hang
  (``watchdog.py``);
* XID events: blocks in ``nvmlEventSetWait`` (bounded) and enqueues, never touching the API;
* publisher: the only thread that talks to Kubernetes (see ``publisher.py``);
* metrics server: optional HTTP thread.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from importlib import metadata
from typing import Any

from gpuhealth.agent.dcgm_source import DcgmSource, merge_dcgm
from gpuhealth.agent.events import EventWatcher, XidBuffer
from gpuhealth.agent.host import read_boot_time
from gpuhealth.agent.journal import XidJournal
from gpuhealth.agent.lease import LeaseTransport, NodeLease, micro_time
from gpuhealth.agent.metrics import AgentMetrics
from gpuhealth.agent.model import Snapshot, SourceName
from gpuhealth.agent.nic_source import NicSource
from gpuhealth.agent.nvml_source import NvmlSource
from gpuhealth.agent.pod_resources import DEFAULT_TIMEOUT_S as POD_RESOURCES_TIMEOUT_S
from gpuhealth.agent.pod_resources import (
    KubeletPodResources,
    PodResourcesLister,
    PodResourcesReader,
    assign_pods,
)
from gpuhealth.agent.publisher import LatestSnapshot, Publisher
from gpuhealth.agent.report import (
    DEFAULT_MAX_XID_EVENTS,
    DEFAULT_TEMPERATURE_BAND_C,
    AgentInfo,
    ReportBuilder,
    now_utc,
)
from gpuhealth.agent.server import MetricsServer
from gpuhealth.agent.source import DeviceSource
from gpuhealth.agent.transport import NullTransport, ReportTransport
from gpuhealth.agent.watchdog import HangMarker, NvmlWatchdog
from gpuhealth.api.names import LEASE_NVML_UNRESPONSIVE_ANNOTATION, LEASE_SAMPLED_AT_ANNOTATION

log = logging.getLogger(__name__)

# The least default bound of an NVML hang: a sample slowed by a loaded node is not a wedged GPU.
MIN_HANG_AFTER_S = 10.0


def agent_version() -> str:
    try:
        return metadata.version("gpuhealth")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


@dataclass(frozen=True)
class AgentConfig:
    node_name: str
    interval_s: float = 10.0
    heartbeat_interval_s: float = 30.0
    event_timeout_s: float = 1.0
    nvml_library: str | None = None
    dcgm_url: str | None = None
    dcgm_timeout_s: float = 3.0
    metrics_port: int = 9401  # 0 disables the HTTP server
    metrics_bind: str = "0.0.0.0"
    max_xid_events: int = DEFAULT_MAX_XID_EVENTS
    temperature_band_c: int = DEFAULT_TEMPERATURE_BAND_C
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    boot_time: datetime | None = None  # None: read from /proc/stat
    # Namespace of the node Lease renewed as the heartbeat; None: heartbeat by patching the report.
    lease_namespace: str | None = None
    # Directory of the local XID journal (journal.py) and NVML hang marker (watchdog.py); None: neither.
    state_dir: str | None = None
    # A sample running longer than this is an NVML hang (watchdog.py); None: three sampling intervals
    # (NVSentinel's watchdog bound), at least MIN_HANG_AFTER_S.
    nvml_hang_after_s: float | None = None

    @property
    def hang_after_s(self) -> float:
        if self.nvml_hang_after_s is not None:
            return self.nvml_hang_after_s
        return max(3 * self.interval_s, MIN_HANG_AFTER_S)

    # Where sysfs is, for NIC health (nic_source.py); None: NICs are not watched.
    sysfs_root: str | None = None
    # NICs (InfiniBand device names) never reported: management NICs.
    nic_exclude: tuple[str, ...] = ()
    # The kubelet's pod-resources socket, read each sample for the pods holding each GPU
    # (pod_resources.py); None: not read, and the report has no spec.podResources.
    pod_resources_socket: str | None = None
    pod_resources_timeout_s: float = POD_RESOURCES_TIMEOUT_S


class Agent:
    """One node's agent; ``start()`` spawns the threads, ``stop()`` joins them.

    ``source`` defaults to the real NVML (honouring ``nvml_library`` /
    ``GPUHEALTH_NVML_LIBRARY``); ``transport`` is where reports go (``KubeTransport`` in
    production, a fake in unit tests); ``lease_transport`` with ``config.lease_namespace`` turns
    the heartbeat into a node Lease renewal.
    """

    def __init__(
        self,
        config: AgentConfig,
        transport: ReportTransport,
        *,
        source: DeviceSource | None = None,
        dcgm: DcgmSource | None = None,
        metrics: AgentMetrics | None = None,
        lease_transport: LeaseTransport | None = None,
        pod_resources: PodResourcesLister | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics if metrics is not None else AgentMetrics()
        self.source: DeviceSource = source if source is not None else NvmlSource(config.nvml_library)
        if dcgm is None and config.dcgm_url:
            dcgm = DcgmSource(config.dcgm_url, config.node_name, config.dcgm_timeout_s)
        self.dcgm = dcgm
        self.nics = NicSource(config.sysfs_root, config.nic_exclude) if config.sysfs_root else None
        if pod_resources is None and config.pod_resources_socket:
            pod_resources = KubeletPodResources(config.pod_resources_socket, config.pod_resources_timeout_s)
        self.pods = PodResourcesReader(pod_resources) if pod_resources is not None else None
        sources: tuple[SourceName, ...] = ("nvml", "dcgm") if dcgm is not None else ("nvml",)
        self.sources = sources
        boot = config.boot_time if config.boot_time is not None else read_boot_time()
        self.builder = ReportBuilder(
            config.node_name,
            AgentInfo(version=agent_version(), sources=sources, boot_time=boot),
            max_xid_events=config.max_xid_events,
            temperature_band_c=config.temperature_band_c,
        )
        self.latest = LatestSnapshot()
        self.xids = XidBuffer(on_put=self._wake_publisher)
        lease = (
            NodeLease(
                lease_transport,
                config.lease_namespace,
                config.node_name,
                config.heartbeat_interval_s,
                vouches=self._vouches,
            )
            if lease_transport is not None and config.lease_namespace
            else None
        )
        self.publisher = Publisher(
            transport,
            self.builder,
            self.latest,
            self.xids,
            heartbeat_interval_s=config.heartbeat_interval_s,
            initial_backoff_s=config.initial_backoff_s,
            max_backoff_s=config.max_backoff_s,
            metrics=self.metrics,
            lease=lease,
        )
        self.events = EventWatcher(
            self.source, self.xids, timeout_s=config.event_timeout_s, on_resample=self.request_sample
        )
        self.watchdog = NvmlWatchdog(
            after_s=config.hang_after_s,
            latest=self.latest,
            wake=self._wake_publisher,
            marker=HangMarker(config.state_dir, boot),
            sources=sources,
            metrics=self.metrics,
        )
        self._first_sample = threading.Event()
        self._server: MetricsServer | None = None
        self._stop = threading.Event()
        self._resample = threading.Event()
        self._sampler: threading.Thread | None = None
        self._last_sample = time.monotonic()

    def _wake_publisher(self) -> None:
        self.publisher.wake()

    def _vouches(self) -> dict[str, str | None]:
        """What a Lease renewal says about the facts: the newest sample's time, and a hanging NVML call."""
        snapshot = self.latest.get()
        hang = snapshot.nvml.hang if snapshot is not None else None
        sampled = self.watchdog.last_sample or (hang.last_sample if hang is not None else None)
        return {
            LEASE_SAMPLED_AT_ANNOTATION: micro_time(sampled) if sampled is not None else None,
            LEASE_NVML_UNRESPONSIVE_ANNOTATION: f"{hang.call} since {micro_time(hang.since)}" if hang else None,
        }

    def open_journal(self) -> None:
        """Load this boot's journaled XIDs for the publisher to adopt, then journal every new one.

        Runs before the first sample and the event registration, so no XID is handed on unjournaled.
        """
        if not self.config.state_dir or self.xids.journal is not None:
            return
        boot = self.builder.agent.boot_time
        if boot is None:
            log.warning("host boot time unknown: the XID journal in %s stays off", self.config.state_dir)
            return
        journal = XidJournal(self.config.state_dir, boot, self.config.max_xid_events, self.metrics)
        self.publisher.replay = journal.load()
        if journal.enabled:
            self.xids.journal = journal

    # ---- sampling ------------------------------------------------------------------------

    def sample_once(self) -> Snapshot:
        """Read every source once, feed DCGM XIDs to the buffer, update metrics."""
        started = time.monotonic()
        device_sample = self.source.sample()
        devices = device_sample.devices
        if self.dcgm is not None:
            dcgm = self.dcgm.sample()
            if dcgm.error is not None:
                self.metrics.dcgm_errors.inc()
            elif device_sample.status.available:
                devices = merge_dcgm(devices, dcgm.devices)
            for event, baseline in dcgm.xids:
                self.xids.put(event, baseline=baseline)
        nics = self.nics.sample(d.pci_bus_id for d in devices if d.pci_bus_id) if self.nics is not None else ()
        pod_status = None
        if self.pods is not None:
            reading = self.pods.read()  # never raises: a failure is reported as available: false
            pod_status = reading.status
            devices = assign_pods(devices, reading.allocations)
        snapshot = Snapshot(
            time=now_utc(),
            nvml=device_sample.status,
            devices=devices,
            sources=self.sources,
            nics=nics,
            pod_resources=pod_status,
        )
        self.metrics.observe(snapshot)
        self.metrics.sample_duration.set(time.monotonic() - started)
        return snapshot

    def request_sample(self) -> None:
        """Sample soon (called by the event thread after XID/ECC events)."""
        self._resample.set()

    def _watched_sample(self) -> None:
        """One sample under the watchdog's eye; its snapshot becomes the latest (``NvmlWatchdog.end``)."""
        self.watchdog.begin()
        snapshot: Snapshot | None = None
        try:
            snapshot = self.sample_once()
        finally:
            self.watchdog.end(snapshot)
            self._last_sample = time.monotonic()

    def _sample_loop(self) -> None:
        # The first sample (it initialises NVML), then one per interval or sooner on request.
        try:
            self._watched_sample()
        except Exception:
            log.exception("first sample failed; the sampler keeps trying")
        self._first_sample.set()
        min_gap = min(1.0, self.config.interval_s)
        started = time.monotonic()
        while not self._stop.is_set():
            self._resample.wait(max(0.0, started + self.config.interval_s - time.monotonic()))
            self._resample.clear()
            # Bound how often events can force a sample (an SBE storm must not spin us).
            if self._stop.wait(max(0.0, started + min_gap - time.monotonic())):
                break
            started = time.monotonic()
            try:
                self._watched_sample()
                self.publisher.wake()
            except Exception:
                log.exception("sampling failed")

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start serving; returns once NVML is initialised and XID events are registered, or once NVML
        is found unresponsive.

        Order matters: the first sample initialises NVML, the event watcher registers before
        the publisher can write, so a report on the server implies XIDs are being watched. The one
        exception is a hang: a first sample that has not returned within the watchdog's bound is
        reported then (with the original time if this boot's previous run left a marker,
        ``watchdog.py``), and the event watcher registers once NVML answers (until then the liveness
        probe fails, as it should).
        """
        if self.config.metrics_port:
            self._server = MetricsServer(self.metrics, self.health, self.config.metrics_port, self.config.metrics_bind)
            self._server.start()
        self.open_journal()
        self.watchdog.restore()
        self._last_sample = time.monotonic()
        self._sampler = threading.Thread(target=self._sample_loop, name="gpuhealth-sampler", daemon=True)
        self._sampler.start()
        self.watchdog.start()
        # The first sample gets the watchdog's bound; past it, the hang (or the one restored) is told.
        if not self._first_sample.wait(self.watchdog.after_s + self.watchdog.check_s):
            threading.Thread(target=self._events_after_first_sample, name="gpuhealth-events-start", daemon=True).start()
        else:
            self.events.start()
        self.publisher.start()
        log.info(
            "agent started for node %s (interval %.1fs, heartbeat %.1fs, sources %s)",
            self.config.node_name,
            self.config.interval_s,
            self.config.heartbeat_interval_s,
            ",".join(self.sources),
        )

    def _events_after_first_sample(self) -> None:
        """Register for XID events once the first sample returned (NVML answers again)."""
        while not self._first_sample.wait(1.0):
            if self._stop.is_set():
                return
        if not self._stop.is_set():
            self.events.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._resample.set()
        self.watchdog.stop()
        self.events.stop()
        if self._sampler is not None:
            self._sampler.join(0.0 if self.watchdog.hang is not None else timeout_s)  # a hung call never returns
        self.publisher.stop(timeout_s)
        if self._server is not None:
            self._server.stop()
        if self.events.alive:
            log.warning("not closing NVML: the event thread is still inside nvmlEventSetWait")
        elif self._sampler is not None and self._sampler.is_alive():
            log.warning("not closing NVML: the sampler is still inside an NVML call")
        else:
            self.source.close()
        self.close_pods()

    def close_pods(self) -> None:
        """Close the kubelet's pod-resources channel, if the agent reads it."""
        if self.pods is not None:
            self.pods.close()

    def run_once(self) -> str | None:
        """Restore, sample once and write the report once (``--once`` without ``--dry-run``)."""
        self.publisher.give_up_after_s = max(30.0, 4 * self.config.max_backoff_s)
        try:
            self.open_journal()
            self.publisher.restore()
            self.latest.set(self.sample_once())
            return self.publisher.publish(force=True)
        finally:
            self.source.close()
            self.close_pods()

    def run(self, stop: threading.Event) -> None:
        """Start, block until ``stop`` is set, then stop (what ``main`` does)."""
        self.start()
        try:
            stop.wait()
        finally:
            self.stop()

    def health(self) -> tuple[bool, str]:
        """Liveness: every loop turned recently. The API being down is not a reason to restart."""
        now = time.monotonic()
        problems: list[str] = []
        sample_budget = max(3 * self.config.interval_s, 30.0)
        hang = self.watchdog.hang
        if self._sampler is None or not self._sampler.is_alive():
            problems.append("sampler thread not running")
        elif hang is not None:
            problems.append(f"NVML unresponsive: {hang.call} since {micro_time(hang.since)}")
        elif now - self._last_sample > sample_budget:
            problems.append(f"no sample for {now - self._last_sample:.0f}s")
        if not self.events.alive:
            problems.append("XID event thread not running")
        elif now - self.events.last_loop > max(3 * self.config.event_timeout_s, 30.0):
            problems.append("XID event thread stuck")
        if not self.publisher.alive:
            problems.append("publisher thread not running")
        return (not problems, "; ".join(problems) or "ok")


def collect_once(config: AgentConfig, *, source: DeviceSource | None = None) -> dict[str, Any]:
    """Discover and sample once and return the report ``spec`` (``--once --dry-run``)."""

    agent = Agent(config, NullTransport(), source=source)
    try:
        snapshot = agent.sample_once()
        for event, baseline in agent.xids.drain():
            agent.builder.add_xid(event, baseline=baseline)
        return agent.builder.render(snapshot, now_utc())
    finally:
        agent.source.close()
        agent.close_pods()
