"""Detection to taint, the first core phase of `make bench`: an XID 79 published by the agent's own
publishing code on one node at a time, until the independent Node watch sees the gpuhealth taint.

Against it, the floor: the least any controller could do, with no logic: a floor node's fault heard
through the report watch, then the writes gpuhealth must make for it (the report's status, then the
Node's taint and cordon: hack/bench/floors.py ``NodeQuarantine``). Its samples are interleaved with
the faults, through the same API server and watches, so the ratio says how much of the latency is
gpuhealth's and how much the shared machine's; the traffic phase takes more of them under load
(``Floor.once``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kubernetes import client

from hack.bench.context import Bench
from hack.bench.fleet import SimNode
from hack.bench.floors import NodeQuarantine, carries_xid, sample_due
from hack.bench.support import FAULT_TIMEOUT_S, FLOOR_TAINT, TAINT, log, percentile
from hack.bench.watch import NodeWatch, ReportWatch


@dataclass(frozen=True)
class FaultNodes:
    """The governed nodes the core phases fault: detection, storm and breaker, in that order."""

    detect: list[str]
    storm: list[str]
    breaker: list[str]


def fault_nodes(governed: Sequence[str], faults: int, storm: int) -> FaultNodes:
    """The first ``faults`` nodes for detection, the next ``storm`` for the storm, and the ``storm``
    after those for the breaker (wrapping round to the first where the fleet is short)."""
    detect_nodes = list(governed[:faults])
    storm_nodes = list(governed[faults : faults + storm])
    rest = list(governed[faults + storm :])
    breaker_nodes = (rest + list(governed))[:storm]
    return FaultNodes(detect_nodes, storm_nodes, breaker_nodes)


class Floor:
    """The no-logic floor on the floor nodes, taken in turn; ``taken`` counts its samples."""

    def __init__(
        self,
        names: Sequence[str],
        sims: Mapping[str, SimNode],
        node_watch: NodeWatch,
        report_watch: ReportWatch,
        core: client.CoreV1Api,
        custom: client.CustomObjectsApi,
    ) -> None:
        self.names = names
        self.sims = sims
        self.node_watch = node_watch
        self.report_watch = report_watch
        self.writer = NodeQuarantine(core, custom)
        # The writes run off the watch's thread, as a controller's workers take them from its watch.
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-detect-floor")
        self.taken = 0
        self.errors: list[str] = []  # writes that failed: their samples time out, and the run says why

    def _heard(self, name: str) -> None:
        self.worker.submit(self._write, name)

    def _write(self, name: str) -> None:
        try:
            self.writer.write(name)
        except Exception as e:
            self.errors.append(f"{name}: {type(e).__name__}: {e}"[:200])
            log(f"  floor: the write for {name} failed: {type(e).__name__}: {e}")

    def once(self) -> float | None:
        """One no-logic floor sample (ms), None if its taint never came."""
        name = self.names[self.taken % len(self.names)]
        self.taken += 1
        self.node_watch.wait_all([name], FLOOR_TAINT, timeout=10, present=False)
        self.report_watch.hear(name, carries_xid, functools.partial(self._heard, name))
        t0 = time.time()
        self.sims[name].fault()
        t1 = self.node_watch.wait_taint(name, FLOOR_TAINT, timeout=FAULT_TIMEOUT_S)
        self.report_watch.deaf(name)
        # Back to clean for the next round: the node "reboots" (clean report), then the floor's writes undone.
        self.sims[name].reboot()
        try:
            self.writer.undo(name)
        except Exception as e:  # a sample is not worth the phase: the next use of the node waits for it clean
            self.errors.append(f"{name}: undo {type(e).__name__}: {e}"[:200])
        return None if t1 is None else (t1 - t0) * 1000


def measure_detection(b: Bench, detect_nodes: Sequence[str], floor_chain: Floor) -> None:
    """Single faults on ``detect_nodes`` and ``--floor-samples`` floor samples among them: the
    ``detect_to_taint_ms``, ``floor_ms`` and ``ratio_to_floor`` results."""
    args, res, series, sims, node_watch = b.args, b.res, b.series, b.sims, b.node_watch
    b.phase(f"detection to taint: {args.faults} single faults, floor: {args.floor_samples} samples")
    detect: list[float] = []
    publish_ms: list[float] = []
    floor: list[float] = []
    misses = {"detect": 0, "floor": 0}

    def measure_floor() -> None:
        ms = floor_chain.once()
        if ms is None:
            misses["floor"] += 1
        else:
            floor.append(ms)

    for i, name in enumerate(detect_nodes):
        t0 = time.time()
        sims[name].fault()
        publish_ms.append((time.time() - t0) * 1000)
        t1 = node_watch.wait_taint(name, TAINT, timeout=FAULT_TIMEOUT_S)
        if t1 is None:
            misses["detect"] += 1
        else:
            detect.append((t1 - t0) * 1000)
        time.sleep(0.2)
        if sample_due(i, args.faults, args.floor_samples, floor_chain.taken):
            measure_floor()
            time.sleep(0.2)
        if (i + 1) % 50 == 0:
            log(f"  {i + 1}/{len(detect_nodes)}: p50 so far {percentile(detect, 50):.0f} ms")
    while floor_chain.taken < args.floor_samples:
        measure_floor()
        time.sleep(0.2)
    # A fault whose taint did not come within the timeout counts as the timeout (a lower bound) in percentiles.
    detect_all = detect + [FAULT_TIMEOUT_S * 1000] * misses["detect"]
    floor_all = floor + [FAULT_TIMEOUT_S * 1000] * misses["floor"]
    p50 = percentile(detect_all, 50)
    floor_p50 = percentile(floor_all, 50)
    res["detect_to_taint_ms"] = {
        "p50": round(p50, 1),
        "p90": round(percentile(detect_all, 90), 1),
        "p99": round(percentile(detect_all, 99), 1),
        "max": round(max(detect_all, default=float("nan")), 1),
        "samples": len(detect_all),
        "timeouts": misses["detect"],
        "publish_p50": round(percentile(publish_ms, 50), 1),
    }
    res["floor_ms"] = {
        "p50": round(floor_p50, 1),
        "p90": round(percentile(floor_all, 90), 1),
        "p99": round(percentile(floor_all, 99), 1),
        "samples": len(floor_all),
        "timeouts": misses["floor"],
        **({"error_examples": floor_chain.errors[:3]} if floor_chain.errors else {}),
    }
    res["ratio_to_floor"] = round(p50 / floor_p50, 2) if floor else None
    series["detect_ms"], series["floor_ms"] = detect, floor
    log(f"  detect p50 {p50:.0f} ms p99 {res['detect_to_taint_ms']['p99']:.0f} ms; floor p50 {floor_p50:.0f} ms")
