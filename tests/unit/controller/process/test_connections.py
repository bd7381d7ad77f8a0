"""The operator's client pool holds a connection for every thread that may use one at once
(``runtime.connections``): a smaller pool discards connections and opens new ones under a drain storm."""

from __future__ import annotations

from gpuhealth.controller.act.events import EVENT_THREADS
from gpuhealth.controller.process.runtime import WATCH_STREAMS, Runtime, connections
from tests.unit.fake_kube import FakeKube

KUEUE_STREAMS = 2  # Workloads and AdmissionChecks (controller/intake/kueuewatch.py)


def test_the_pool_covers_workers_drains_events_and_every_watch() -> None:
    rt = Runtime(FakeKube(), workers=16, drain_concurrency=32, lease_namespace="gpuhealth")
    watches = [name for name in vars(rt) if name.endswith("_watch") and getattr(rt, name) is not None]
    assert sorted(watches) == ["lease_watch", "node_watch", "pod_watch", "report_watch", "slice_watch"]
    assert len(watches) + KUEUE_STREAMS <= WATCH_STREAMS
    assert connections(16, 32) == 16 + 32 + EVENT_THREADS + WATCH_STREAMS
    assert connections(4, 8) < connections(16, 32)  # follows --workers and --drain-concurrency
    rt.pool.shutdown()
    rt.drain_pool.shutdown()
