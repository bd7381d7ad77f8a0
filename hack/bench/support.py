"""Building blocks of `make bench` (see hack/bench/run.py): names, API clients, process samplers, the
operator's log, the audit-log rates and counts (the log itself is read by devkit/audit.py,
shared with the chaos suite), the statistics the figures are computed with and the clock that
times the phases.

The simulated fleet is in ``fleet``, the independent watches in ``watch``.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil
from kubernetes import client, config

from devkit.audit import AuditEntry

GROUP, VERSION, REPORTS = "gpuhealth.dev", "v1alpha1", "gpunodehealths"
TAINT = "gpuhealth.dev/unhealthy"
FLOOR_TAINT = "bench.gpuhealth.dev/floor"
GPU_SELECTOR = "nvidia.com/gpu.present=true"
DRA_GROUP, DRA_VERSION, DEVICE_TAINT_RULES = "resource.k8s.io", "v1", "devicetaintrules"
MERGE = "application/merge-patch+json"
_T = TypeVar("_T")
BENCH_USER_AGENT = "gpuhealth-bench"
FAULT_TIMEOUT_S = 10.0  # how long one single fault may wait for its taint (or its DeviceTaintRule)


def api_client(kubeconfig: Path, pool: int = 16) -> client.ApiClient:
    """An ApiClient whose connection pool is large enough for ``pool`` concurrent threads."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = pool
    api = client.ApiClient(cfg)
    # The bench's own writes (the floors', the simulated agents') are then told apart from the
    # operator's in a Node's managedFields (``watch.last_writer``): both are Python clients.
    api.user_agent = BENCH_USER_AGENT
    return api


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def publish_all(pool: ThreadPoolExecutor, fn: Callable[[_T], object], sims: Sequence[_T]) -> int:
    """Run ``fn(sim)`` for every node on the pool; the number that failed."""
    futures = [pool.submit(fn, s) for s in sims]
    failed = 0
    for f in futures:
        try:
            f.result()
        except Exception as e:
            failed += 1
            if failed <= 3:
                log(f"  publish failed: {e}")
    return failed


# -- process sampling and logs -----------------------------------------------------------------------


@dataclass
class ProcSampler:
    """RSS of one process every ``period`` seconds, on a thread."""

    pid: int
    period: float = 0.25
    samples: list[tuple[float, int]] = field(default_factory=list)
    cpu_samples: list[tuple[float, float]] = field(default_factory=list)
    # Bytes the process read and wrote through system calls (sockets and files: /proc/PID/io rchar + wchar).
    io_samples: list[tuple[float, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> ProcSampler:
        self.proc = psutil.Process(self.pid)
        threading.Thread(target=self._run, name=f"bench-rss-{self.pid}", daemon=True).start()
        return self

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                now = time.time()
                self.samples.append((now, self.proc.memory_info().rss))
                self.cpu_samples.append((now, self.cpu_s()))
                io = self.proc.io_counters()
                self.io_samples.append((now, int(io.read_chars + io.write_chars)))
            except psutil.Error:
                return
            self.stop.wait(self.period)

    def cpu_s(self) -> float:
        t = self.proc.cpu_times()
        return float(t.user + t.system)

    def io_rate(self, start: float, end: float) -> float | None:
        """Bytes per second read and written between two instants (the samples nearest inside them)."""
        return sample_rate(self.io_samples, start, end)

    @property
    def peak_rss(self) -> int:
        return max((r for _, r in self.samples), default=0)


def sample_rate(samples: Sequence[tuple[float, float]], start: float, end: float) -> float | None:
    """How fast a counter sampled as (time, value) grew between two instants, per second, from its
    samples nearest inside them; None where fewer than two fall inside."""
    inside = [(t, v) for t, v in samples if start <= t <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def cpu_quiet(samples: Sequence[tuple[float, float]], now: float, window_s: float, below_cores: float) -> bool:
    """Whether a process sampled as (time, CPU seconds) used less than ``below_cores`` of a core over the
    ``window_s`` before ``now``; False where the window holds too few samples to say."""
    rate = sample_rate(samples, now - window_s, now)
    return rate is not None and rate < below_cores


def wait_quiet(
    sampler: ProcSampler, window_s: float = 5.0, below_cores: float = 0.2, timeout_s: float = 600.0
) -> float | None:
    """Wait until the sampled process has been quiet for ``window_s`` (its backlog worked off: a
    10,000-node fleet's relabelling is ten thousand passes); the seconds it took, None if it never was
    within ``timeout_s``. An idle operator at 10,000 nodes uses about 7% of a core (its Lease watch)."""
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        time.sleep(0.5)
        if cpu_quiet(list(sampler.cpu_samples), time.time(), window_s, below_cores):
            return round(time.time() - t0, 1)
    return None


_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def find_log_line(path: Path, pattern: str, timeout: float, offset: int = 0) -> tuple[float, str] | None:
    """Wait for a line matching ``pattern`` (from byte ``offset`` on); its logged time (epoch seconds) and the line."""
    rx = re.compile(pattern)
    deadline = time.monotonic() + timeout
    pos = offset
    buf = ""
    while time.monotonic() < deadline:
        with open(path, errors="replace") as f:
            f.seek(pos)
            chunk = f.read()
            pos = f.tell()
        buf += chunk
        *lines, buf = buf.split("\n")
        for line in lines:
            if rx.search(line):
                m = _LOG_TIME.match(line)
                when = time.time()
                if m:
                    when = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                return when, line
        time.sleep(0.05)
    return None


# -- the audit log's figures (devkit/audit.py reads it) ---------------------------------------


def api_rates(entries: Iterable[AuditEntry], start: float, end: float) -> dict[str, float | None]:
    """One identity's API requests and writes per second between two instants, from its audit entries."""
    inside = [e for e in entries if start <= e.at < end]
    span = end - start
    if span <= 0:
        return {"requests_per_s": None, "writes_per_s": None}
    return {
        "requests_per_s": round(len(inside) / span, 3),
        "writes_per_s": round(sum(e.write for e in inside) / span, 3),
    }


def describe(entries: Iterable[AuditEntry]) -> dict[str, int]:
    """Counts by 'verb resource[/subresource]', for the report."""
    out: dict[str, int] = {}
    for e in entries:
        key = f"{e.verb} {e.resource}{'/' + e.subresource if e.subresource else ''}"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, -(-len(s) * q // 100) - 1))
    return s[int(k)]


def latency_summary(samples_ms: list[float], timeouts: int, timeout_ms: float) -> dict[str, Any]:
    """p50/p90/p99/max of one-at-a-time latencies; a timed-out sample counts as the timeout (a lower bound)."""
    values = samples_ms + [timeout_ms] * timeouts
    return {
        "p50": round(percentile(values, 50), 1),
        "p90": round(percentile(values, 90), 1),
        "p99": round(percentile(values, 99), 1),
        "max": round(max(values, default=float("nan")), 1),
        "samples": len(values),
        "timeouts": timeouts,
    }


def steady_writes_per_hour(write_times: list[float], startup_s: float = 5.0) -> tuple[float | None, int]:
    """Writes per hour once started, and how many start-up writes were left out.

    An agent's start is a burst (the report created, its Lease patched: 404, then created); what it
    costs while nothing changes is the rate after that: (writes - 1) / (last - first) of the rest.
    """
    times = sorted(write_times)
    if not times:
        return None, 0
    startup = [t for t in times if t < times[0] + startup_s]
    steady = times[len(startup) :]
    span = steady[-1] - steady[0] if steady else 0.0
    return ((len(steady) - 1) / span * 3600 if span > 0 else None), len(startup)


def rate(mark_from: tuple[float, int], mark_to: tuple[float, int]) -> float | None:
    """Events per second between two (time, count) marks; None over an empty window."""
    span = mark_to[0] - mark_from[0]
    return (mark_to[1] - mark_from[1]) / span if span > 0 else None


def phase_elapsed(start_s: float, end_s: float) -> str:
    """How long a phase took, for the progress line a long run prints: "42 s" or "12 min 5 s"."""
    took = max(0.0, end_s - start_s)
    minutes, seconds = divmod(round(took), 60)
    return f"{minutes} min {seconds} s" if minutes else f"{took:.0f} s"


class PhaseClock:
    """The run's phases as they start: (name, seconds into the run, 1-minute load average), the list
    results.json keeps under ``phases``. Calling it starts a phase and logs how long the last one took.
    """

    def __init__(self) -> None:
        self.t0 = time.time()
        self.phases: list[tuple[str, float, float]] = []

    def __call__(self, name: str) -> None:
        # The 1-minute load average says how busy the machine was (other work may share it).
        now = round(time.time() - self.t0, 2)
        if self.phases:
            last, since = self.phases[-1][0].split(":")[0], self.phases[-1][1]
            log(f"   ({last} took {phase_elapsed(since, now)}; {now / 60:.1f} min in)")
        self.phases.append((name, now, os.getloadavg()[0]))
        log(f"== {name} (load average {os.getloadavg()[0]:.1f}) ==")

    def end(self) -> float:
        """Log the last phase's time and the whole run's; the seconds since the run started."""
        end = round(time.time() - self.t0, 2)
        last = self.phases[-1][0].split(":")[0]
        log(f"   ({last} took {phase_elapsed(self.phases[-1][1], end)}; whole run {phase_elapsed(0, end)})")
        return end
