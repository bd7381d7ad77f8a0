"""Issue #52: the no-logic floors (hack/bench/floors.py) and the ratio judgement (hack/bench/targets.py).

The floor clients are checked for exactly the writes they make, on a recording stand-in for the
Kubernetes client (the real API is what a `make bench` run measures them against); the burst that
times them on real threads, with writes that take time; the judgement and its rendering on result
files with and without floors, the filed ones included.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any, cast

import pytest
from kubernetes import client

from hack.bench import docs, scaling_docs
from hack.bench.cli import parse_args
from hack.bench.details import floors_line
from hack.bench.detection import Floor
from hack.bench.drain_workload import REQUESTED
from hack.bench.fleet import SimNode
from hack.bench.floors import (
    FLOOR_CONDITION,
    FLOOR_FIELD,
    Calls,
    DeviceRule,
    DomainFloor,
    Ears,
    FirstWrites,
    GpuFloor,
    Lists,
    NodeQuarantine,
    PodDrain,
    SampledFloor,
    burst,
    carries_ecc,
    carries_xid,
    combine,
    drain_pods,
    eviction_rate,
    floor_rule_name,
    guarded,
    rule_seen,
)
from hack.bench.report import all_met, evaluate, summary_md, tally
from hack.bench.support import FLOOR_TAINT, GROUP, REPORTS, VERSION
from hack.bench.targets import (
    FLOOR_TIMED_OUT,
    NO_FLOOR,
    RATIO_MET,
    RATIO_MISSED,
    RATIO_UNMEASURED,
    judge_ratio,
    ratio_sentence,
    resilience_targets_for,
    targets_for,
)
from hack.bench.watch import NodeWatch, ReportWatch, RuleWatch
from tests.unit.bench.test_domain import _domain_run
from tests.unit.bench.test_helpers import FILED, _with_new_figures

# -- the ratio judgement ------------------------------------------------------------------------------


def test_a_latency_within_one_and_a_half_times_its_floor_is_met_and_beyond_it_missed() -> None:
    assert judge_ratio(60.0, 40.0) == {"floor": 40.0, "ratio": 1.5, "status": RATIO_MET}
    assert judge_ratio(61.0, 40.0)["status"] == RATIO_MISSED
    assert judge_ratio(61.0, 40.0)["ratio"] == 1.52


def test_a_throughput_is_judged_by_the_floors_rate_over_gpuhealths() -> None:
    assert judge_ratio(20.0, 25.0, higher=True) == {"floor": 25.0, "ratio": 1.25, "status": RATIO_MET}
    assert judge_ratio(10.0, 25.0, higher=True)["status"] == RATIO_MISSED  # 2.5x slower than the API server allows


def test_a_floor_that_timed_out_or_is_missing_is_unmeasured_never_met() -> None:
    assert judge_ratio(50.0, None) == {"floor": None, "ratio": None, "status": RATIO_UNMEASURED, "why": FLOOR_TIMED_OUT}
    from hack.bench.targets import _MISSING

    assert judge_ratio(50.0, _MISSING)["status"] == RATIO_UNMEASURED
    assert judge_ratio(50.0, _MISSING)["why"] == NO_FLOOR


def test_a_figure_gpuhealth_never_reached_beside_a_measured_floor_is_a_miss() -> None:
    assert judge_ratio(None, 25.0, higher=True)["status"] == RATIO_MISSED
    assert judge_ratio(0.0, 25.0, higher=True)["status"] == RATIO_MISSED


def _with_floors() -> dict[str, Any]:
    """A 1,000-node run with every core floor measured: detection p50 60 ms (floor 50), p99 900 (floor
    400: p50 met, p99 missed), the storm at 20 nodes/s (floor 25), the device path and storm."""
    res = _with_new_figures()
    res["detect_to_taint_ms"].update({"p50": 60.0, "p99": 900.0, "timeouts": 0})
    res["floor_ms"] = {"p50": 50.0, "p90": 100.0, "p99": 400.0, "samples": 100, "timeouts": 0}
    res["storm"]["nodes_per_s"] = 20.0
    res["floors"] = {
        "storm": {"items": 100, "concurrency": 16, "seconds": 4.0, "per_s": 25.0, "seen": 100, "timed_out": False},
        "device": {"p50": 50.0, "p90": 55.0, "p99": 600.0, "max": 600.0, "samples": 10, "timeouts": 0},
        "device_storm": {"items": 20, "concurrency": 16, "seconds": None, "per_s": None, "seen": 12, "timed_out": True},
    }
    res["targets"] = evaluate(res)
    return res


def test_p50_met_while_p99_missed() -> None:
    t = _with_floors()["targets"]
    assert t["detect_p50"]["ratio"] == {"floor": 50.0, "ratio": 1.2, "status": RATIO_MET}
    assert t["detect_p99"]["ratio"] == {"floor": 400.0, "ratio": 2.25, "status": RATIO_MISSED}
    # The absolute targets are judged as before, beside the ratios.
    assert t["detect_p50"]["pass"] is True and t["detect_p99"]["pass"] is True
    assert t["storm_rate"]["ratio"] == {"floor": 25.0, "ratio": 1.25, "status": RATIO_MET}


def test_a_floor_with_a_timeout_makes_both_its_ratios_unmeasured() -> None:
    res = _with_floors()
    res["floors"]["device"]["timeouts"] = 1
    t = evaluate(res)
    for key in ("device_p50", "device_p99"):
        assert t[key]["ratio"]["status"] == RATIO_UNMEASURED and t[key]["ratio"]["why"] == FLOOR_TIMED_OUT
    # A storm floor that did not see every rule is a floor that timed out too.
    assert t["device_storm_rate"]["ratio"]["status"] == RATIO_UNMEASURED


def test_an_unmeasured_ratio_is_neither_met_nor_missed_and_a_missed_one_fails_the_run() -> None:
    res = _with_floors()
    assert all_met(res["targets"]) is False  # detection p99 is 2.25x its floor
    res["floor_ms"]["p99"] = 800.0
    res["targets"] = evaluate(res)
    assert res["targets"]["detect_p99"]["ratio"]["status"] == RATIO_MET
    # The device storm's floor timed out: unmeasured, so it does not fail the run.
    assert res["targets"]["device_storm_rate"]["ratio"]["status"] == RATIO_UNMEASURED
    assert all_met(res["targets"]) is True


def test_an_old_result_file_without_floors_is_unmeasured_where_it_has_none() -> None:
    old = json.loads(FILED.read_text(encoding="utf-8"))
    assert "floors" not in old
    fresh = evaluate(old)
    assert fresh["storm_rate"]["ratio"] == {"floor": None, "ratio": None, "status": RATIO_UNMEASURED, "why": NO_FLOOR}
    assert fresh["device_p50"].get("measured") is False  # the run predates the device figures
    # Detection's floor was measured in the same run from the first filed run on: its ratio stands.
    assert fresh["detect_p50"]["ratio"]["status"] in (RATIO_MET, RATIO_MISSED)
    assert fresh["detect_p50"]["ratio"]["floor"] == old["floor_ms"]["p50"]


# -- rendering ---------------------------------------------------------------------------------------


def test_a_run_with_floors_renders_each_figure_beside_its_floor_and_ratio() -> None:
    res = _with_floors()
    block = docs.render(FILED, res)
    assert "| figure | result | floor | ratio to floor (<= 1.5x) | | absolute target | |" in block
    assert "| Detection to taint, p50 | 60.0 ms | 50.0 ms | 1.20x | met | <= 200 ms | met |" in block
    assert "| Detection to taint, p99 | 900.0 ms | 400.0 ms | 2.25x | **missed** | <= 1000 ms | met |" in block
    assert "| Storm at 100% breaker | 20.0 nodes/s | 25.0 nodes/s | 1.25x | met | >= 20 nodes/s | met |" in block
    assert (
        "| Device storm (GPUs on distinct nodes at once) | 25.0 rules/s | - | floor timed out | unmeasured "
        "| >= 20 rules/s | met |" in block
    )
    # A figure with no floor path keeps its absolute target alone.
    assert "| Operator peak RSS | " in block and "| - | - | - | <= 250 MB |" in block
    # The start-up's floor was not measured in this run: unmeasured, as the device storm's that timed out.
    assert "Ratios to the no-logic floor (<= 1.5x): **4 of 5 met**, 2 unmeasured." in block
    md = summary_md(res)
    assert "| Detection to taint, p99 | 900.0 ms | 400.0 ms | 2.25x | **MISS** | <= 1000 ms | pass |" in md
    assert "node storm 100 in 4.0 s (25.0/s, 16 at a time)" in md
    assert "device storm timed out (12 of 20 seen)" in md


def test_a_result_file_without_floors_renders_no_floor_measured() -> None:
    old = json.loads(FILED.read_text(encoding="utf-8"))
    block = docs.render(FILED, old)
    assert "| Storm at 100% breaker | " in block
    storm = next(line for line in block.splitlines() if line.startswith("| Storm at 100% breaker"))
    assert "| - | no floor measured | unmeasured |" in storm
    assert floors_line(old) == "No-logic floors of the other paths: no floor measured in this run."


def test_the_resilience_floors_are_judged_and_rendered() -> None:
    targets = {t.key: t for t in resilience_targets_for(1000)}
    assert targets["drain_rate"].floor is not None and targets["drain_rate"].higher
    assert targets["restart_evaluated"].floor is not None and not targets["restart_evaluated"].higher
    res: dict[str, Any] = {
        "nodes": 1000,
        "warm_restart": {"startup_evaluated_s": 6.0, "restart_to_first_taint_s": 9.0, "startup_writes": 0},
        "floors": {"restart": {"seconds": 3.0, "timed_out": False}},
        "targets": {},
    }
    res["targets"] = evaluate(res)
    assert res["targets"]["restart_evaluated"]["ratio"] == {"floor": 3.0, "ratio": 2.0, "status": RATIO_MISSED}
    assert res["targets"]["restart_taint"]["ratio"]["ratio"] == 3.0
    assert res["targets"]["drain_rate"].get("measured") is False  # no drain storm in this run
    assert ratio_sentence(res, resilience_targets_for(1000)) == (
        "Ratios to the no-logic floor (<= 1.5x): **0 of 2 met**, 2 unmeasured."
    )


def test_the_10k_start_up_is_judged_against_its_floor() -> None:
    startup = next(t for t in targets_for(10000) if t.key == "startup")
    assert startup.floor is not None
    res = {"floors": {"startup": combine({"seconds": 20.0}, {"seconds": 100.0})}}
    assert startup.floor(res) == 120.0
    assert startup.floor({"floors": {"startup": combine({"seconds": 20.0}, {"timed_out": True})}}) is None


# -- the burst that times a floor ------------------------------------------------------------------------


class _InFlight:
    """A call that takes ``seconds``, counting how many run at once (the most in ``max``) and what ran."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.lock = seconds, threading.Lock()
        self.now = self.max = 0
        self.done: list[str] = []

    def __call__(self, item: str = "") -> None:
        with self.lock:
            self.now += 1
            self.max = max(self.max, self.now)
        time.sleep(self.seconds)
        with self.lock:
            self.now -= 1
            self.done.append(item)


def test_a_burst_writes_every_item_at_most_concurrency_at_once() -> None:
    write = _InFlight(0.02)
    items = [f"n{i}" for i in range(40)]
    r = burst(items, write, concurrency=4, timeout_s=10.0)
    assert sorted(write.done) == sorted(items)
    assert write.max == 4
    assert r["items"] == 40 and r["seen"] == 40 and not r["timed_out"] and r["errors"] == 0
    # 40 writes of 20 ms, 4 at a time: at least 10 rounds.
    assert r["seconds"] >= 0.2 and r["per_s"] == pytest.approx(40 / r["seconds"], rel=0.01)


def test_a_burst_injects_each_item_before_its_writes_and_times_to_the_last_seen() -> None:
    order: list[str] = []
    lock = threading.Lock()

    def inject(item: str) -> None:
        with lock:
            order.append(f"fault {item}")

    def write(item: str) -> None:
        with lock:
            order.append(f"write {item}")

    t0 = time.time()

    def seen(items: Sequence[str], timeout_s: float) -> Mapping[str, float]:
        # The watch sees each write once made; it saw the last one 2 s after the start.
        deadline = time.time() + timeout_s
        while sum(1 for o in order if o.startswith("write")) < len(items) and time.time() < deadline:
            time.sleep(0.005)
        return {i: t0 + 2.0 for i in items}

    r = burst(["a", "b"], write, 2, 5.0, wait_seen=seen, inject=inject, started=t0)
    assert order.index("fault a") < order.index("write a") and order.index("fault b") < order.index("write b")
    assert r["seconds"] == 2.0 and r["per_s"] == 1.0


def test_a_burst_whose_write_fails_or_is_not_seen_times_out() -> None:
    def write(item: str) -> None:
        if item == "bad":
            raise client.ApiException(status=500, reason="etcd timeout")

    r = burst(["good", "bad"], write, 2, 1.0)
    assert r["timed_out"] and r["seconds"] is None and r["per_s"] is None
    assert r["errors"] == 1 and "bad" in r["error_examples"][0]
    partial = burst(["a", "b"], lambda i: None, 2, 0.1, wait_seen=lambda items, t: {"a": time.time()})
    assert partial["timed_out"] and partial["seen"] == 1


def _report(
    name: str, xids: int = 0, ecc_gpu: int | None = None, status: dict[str, Any] | None = None
) -> dict[str, Any]:
    devices = [{"index": i, "ecc": {"volatileUncorrected": 1 if i == ecc_gpu else 0}} for i in range(8)]
    spec = {"xidEvents": [{"xid": 79, "gpu": 3}] * xids, "devices": devices}
    return {"metadata": {"name": name}, "spec": spec, "status": status or {}}


def test_a_floor_hears_a_node_fault_only_in_a_report_no_floor_has_quarantined() -> None:
    assert carries_xid(_report("n", xids=1))
    assert not carries_xid(_report("n"))  # the reboot's clean report
    # The floor's own status write, and an older write still carrying the fault once the floor took it.
    assert not carries_xid(_report("n", xids=1, status={"state": "Quarantined", "reason": "BenchFloor"}))


def test_a_floor_hears_a_device_fault_only_on_its_gpu_and_before_its_own_status() -> None:
    carries = carries_ecc(3)
    assert carries(_report("n", ecc_gpu=3))
    assert not carries(_report("n", ecc_gpu=5)) and not carries(_report("n"))
    assert not carries(_report("n", ecc_gpu=3, status={FLOOR_FIELD: {"device": "gpu-3"}}))


def test_a_burst_with_ears_writes_each_item_only_once_the_watch_serves_its_fault() -> None:
    watch = ReportWatch(client.ApiClient())  # never started: the test serves its events
    order: list[str] = []
    lock = threading.Lock()

    def inject(item: str) -> None:
        with lock:
            order.append(f"fault {item}")
        # A write of the report without the fault first (heard nothing), then the fault, a little later.
        watch._event("MODIFIED", _report(item))
        threading.Timer(0.05, lambda: watch._event("MODIFIED", _report(item, xids=1))).start()

    def write(item: str) -> None:
        with lock:
            order.append(f"write {item}")

    def seen(items: Sequence[str], timeout_s: float) -> Mapping[str, float]:
        deadline = time.time() + timeout_s
        while sum(1 for o in order if o.startswith("write")) < len(items) and time.time() < deadline:
            time.sleep(0.005)
        return {i: time.time() for i in items if f"write {i}" in order}

    t0 = time.time()
    r = burst(["a", "b"], write, 2, 5.0, wait_seen=seen, inject=inject, ears=Ears(watch, carries_xid))
    assert not r["timed_out"] and r["seen"] == 2
    assert r["seconds"] >= 0.05 - (time.time() - t0 - r["seconds"])  # not before the fault came through
    assert order[:2] == ["fault a", "fault b"] and sorted(order[2:]) == ["write a", "write b"]
    assert watch.ears == {}  # each item heard once
    # A fault the watch missed and a relist brought is heard too.
    relisted: list[str] = []
    watch.hear("d", carries_xid, lambda: relisted.append("d"))
    watch._sync([_report("c"), _report("d", xids=1)])
    assert relisted == ["d"] and watch.ears == {}
    # A fault that never comes through the watch: nothing written, the burst timed out, its ear dropped.
    quiet = burst(["c"], write, 1, 0.2, wait_seen=seen, inject=lambda i: None, ears=Ears(watch, carries_xid))
    assert quiet["timed_out"] and "write c" not in order and watch.ears == {}


class _FloorNode:
    """A floor node's simulated agent: its fault reaches the watch a little after the publish returns."""

    def __init__(self, watch: ReportWatch) -> None:
        self.watch, self.log = watch, list[str]()

    def fault(self) -> None:
        self.log.append("fault")
        threading.Timer(0.05, lambda: self.watch._event("MODIFIED", _report("floor-0", xids=1))).start()

    def reboot(self) -> None:
        self.log.append("reboot")


class _TaintSeen:
    """The Node watch: the floor taint is seen once the floor's Node patch is made."""

    def __init__(self, core: _Api) -> None:
        self.core = core

    def wait_all(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def wait_taint(self, name: str, key: str, timeout: float) -> float | None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any(c[0] == "patch_node" and c[1][1]["spec"]["taints"] for c in self.core.calls):
                return time.time()
            time.sleep(0.005)
        return None


def test_the_detection_floor_makes_gpuhealths_two_writes_once_the_watch_serves_the_fault() -> None:
    watch = ReportWatch(client.ApiClient())  # never started: the node's fault feeds it
    core, custom = _Api(), _Api()
    node = _FloorNode(watch)
    floor = Floor(
        ["floor-0"],
        cast(Mapping[str, SimNode], {"floor-0": node}),
        cast(NodeWatch, _TaintSeen(core)),
        watch,
        cast(client.CoreV1Api, core),
        cast(client.CustomObjectsApi, custom),
    )
    ms = floor.once()
    assert ms is not None and ms >= 50  # not before the fault came through the watch
    # The report's status, then the Node's taint and cordon; then undone after the node's reboot.
    assert [c[0] for c in custom.calls] == ["patch_cluster_custom_object_status"] * 2
    assert custom.calls[0][1][4]["status"]["reason"] == "BenchFloor"
    assert core.calls[0][1][1]["spec"]["unschedulable"] is True
    assert node.log == ["fault", "reboot"] and watch.ears == {} and floor.taken == 1


class _Scripted(SampledFloor):
    """A floor whose samples' results are scripted: a result dict, or an exception to raise."""

    def __init__(self, results: list[Any], samples: int) -> None:
        super().__init__(samples, timeout_s=10.0, what="scripted")
        self.results, self.asked = results, list[int]()

    def sample(self, k: int) -> dict[str, Any]:
        self.asked.append(k)
        r = self.results.pop(0)
        if isinstance(r, Exception):
            raise r
        return cast(dict[str, Any], r)


def test_a_sampled_floor_counts_a_timed_out_or_failed_sample_as_the_timeout() -> None:
    ok = {"timed_out": False, "seconds": 0.05}
    late = {"timed_out": True, "seconds": None, "error_examples": ["the fault never came through the report watch"]}
    f = _Scripted([ok, late, RuntimeError("the API server refused")], samples=3)
    s = f.single()
    assert f.asked == [0, 1, 2]
    assert s["samples"] == 3 and s["timeouts"] == 2 and s["p50"] == 10_000.0 and min(f.ms) == 50.0
    assert "never came" in s["error_examples"][0] and "refused" in s["error_examples"][1]


def test_a_sampled_floors_samples_spread_evenly_over_the_phases_faults() -> None:
    f = _Scripted([{"timed_out": False, "seconds": 0.01}] * 4, samples=4)
    taken = []
    for i in range(20):  # one sample after every fifth fault
        f.spread(i, 20, pause_s=0)
        taken.append(f.taken)
    assert taken == [0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 4]
    assert f.single()["samples"] == 4 and f.asked == [0, 1, 2, 3]  # none left to take
    g = _Scripted([{"timed_out": False, "seconds": 0.01}] * 3, samples=3)
    for i in range(3):  # as many samples as faults: one after each (the domain storm's)
        g.spread(i, 3, pause_s=0)
        assert g.taken == i + 1


# -- each floor's client: exactly the writes gpuhealth must do -------------------------------------------


class _Api:
    """Records every call a floor client makes, by method name; lists answer from ``pages``."""

    def __init__(self, pages: Mapping[str, list[dict[str, Any]]] | None = None) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.pages = {k: list(v) for k, v in (pages or {}).items()}
        self.api_client = None
        self.missing: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            if name.startswith("delete") and args[-1] in self.missing:
                raise client.ApiException(status=404, reason="NotFound")
            if name.startswith("list"):
                key = args[-1] if args and isinstance(args[-1], str) else name
                page = self.pages[key].pop(0)
                return SimpleNamespace(data=json.dumps(page).encode())
            return {}

        return call


class _RefusingCore(_Api):
    def patch_node(self, *args: Any, **kwargs: Any) -> None:
        raise client.ApiException(status=500, reason="etcdserver: request timed out")


def test_a_detection_floor_write_that_fails_times_its_sample_out_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("hack.bench.detection.FAULT_TIMEOUT_S", 0.3)
    watch = ReportWatch(client.ApiClient())
    core = _RefusingCore()
    floor = Floor(
        ["floor-0"],
        cast(Mapping[str, SimNode], {"floor-0": _FloorNode(watch)}),
        cast(NodeWatch, _TaintSeen(core)),
        watch,
        cast(client.CoreV1Api, core),
        cast(client.CustomObjectsApi, _Api()),
    )
    assert floor.once() is None  # the taint never came
    assert floor.errors and "etcdserver: request timed out" in floor.errors[0]


class _GpuFloorNode:
    """A floor node's simulated agent for the device floor: its ECC fault reaches the report watch a
    little after the publish returns; ``fail_clear`` makes its GPU reset fail (a broken sample)."""

    def __init__(self, name: str, watch: ReportWatch, log: list[str], fail_clear: bool = False) -> None:
        self.name, self.watch, self.log, self.fail_clear = name, watch, log, fail_clear

    def device_fault(self, gpu: int) -> None:
        self.log.append(f"fault {self.name}")
        threading.Timer(0.02, lambda: self.watch._event("MODIFIED", _report(self.name, ecc_gpu=gpu))).start()

    def device_clear(self) -> None:
        self.log.append(f"clear {self.name}")
        if self.fail_clear:
            raise RuntimeError("the publisher is down")


class _RuleApi(_Api):
    """The recording API, whose rule creates and deletes the rule watch then serves."""

    def __init__(self, rules: RuleWatch) -> None:
        super().__init__()
        self.rules = rules

    def create_cluster_custom_object(self, *args: Any) -> dict[str, Any]:
        self.calls.append(("create_cluster_custom_object", args, {}))
        self.rules._event("ADDED", args[3])
        return {}

    def delete_cluster_custom_object(self, *args: Any) -> dict[str, Any]:
        self.calls.append(("delete_cluster_custom_object", args, {}))
        pool, _, device = args[3].removeprefix("bench-floor-").rpartition("-gpu-")
        body = {"metadata": {"name": args[3]}, "spec": {"deviceSelector": {"pool": pool, "device": f"gpu-{device}"}}}
        self.rules._event("DELETED", body)
        return {}


def _gpu_floor(names: Sequence[str], samples: int, fail_clear: bool = False) -> tuple[GpuFloor, list[str], _RuleApi]:
    reports, rules = ReportWatch(client.ApiClient()), RuleWatch(client.ApiClient())  # never started
    log: list[str] = []
    sims = {n: _GpuFloorNode(n, reports, log, fail_clear) for n in names}
    custom = _RuleApi(rules)
    floor = GpuFloor(
        names,
        samples,
        3,
        cast(Mapping[str, SimNode], sims),
        cast(client.CustomObjectsApi, custom),
        rules,
        reports,
        concurrency=16,
        timeout_s=2.0,
    )
    return floor, log, custom


def test_the_device_floors_samples_spread_over_the_phases_faults_on_the_floor_nodes_in_turn() -> None:
    floor, log, custom = _gpu_floor(["floor-0", "floor-1"], samples=3)
    taken_after = []
    for i in range(10):  # the phase's ten faults: a sample after every third
        floor.spread(i, 10, pause_s=0)
        taken_after.append(floor.taken)
    assert taken_after == [0, 0, 1, 1, 1, 2, 2, 2, 3, 3]
    # Each sample is one fault heard, its status and rule written, then undone (fault cleared first).
    assert log == ["fault floor-0", "clear floor-0", "fault floor-1", "clear floor-1", "fault floor-0", "clear floor-0"]
    creates = [c for c in custom.calls if c[0] == "create_cluster_custom_object"]
    assert [c[1][3]["spec"]["deviceSelector"]["pool"] for c in creates] == ["floor-0", "floor-1", "floor-0"]
    single = floor.single()  # none left to take
    assert floor.taken == 3 and single["samples"] == 3 and single["timeouts"] == 0
    assert single["p50"] >= 20  # not before the fault came through the watch
    floor.close()


def test_a_device_floor_sample_that_fails_counts_as_the_timeout_and_the_rest_are_taken_at_the_end() -> None:
    floor, log, _ = _gpu_floor(["floor-0"], samples=2, fail_clear=True)
    assert log == [] and floor.taken == 0
    floor.spread(0, 2, pause_s=0)  # the phase's first fault: its sample's undo fails, the phase goes on
    assert floor.taken == 1 and floor.timeouts == 1 and "RuntimeError" in floor.errors[0]
    single = floor.single()  # the phase had fewer faults than samples: the rest are taken now
    assert floor.taken == 2 and single["samples"] == 2 and single["timeouts"] == 2
    assert single["p50"] == 2000.0 and "error_examples" in single


class _NodeApi(_Api):
    """The recording API, whose Node patches the Node watch then serves (the floor's taint on and off)."""

    def __init__(self, nodes: NodeWatch) -> None:
        super().__init__()
        self.nodes = nodes

    def patch_node(self, name: str, body: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("patch_node", (name, body), kwargs))
        self.nodes._event("MODIFIED", {"metadata": {"name": name}, "spec": {"taints": body["spec"]["taints"]}})
        return {}


def test_the_domain_floor_hears_one_members_fault_then_quarantines_every_member_and_undoes_it() -> None:
    reports, nodes = ReportWatch(client.ApiClient()), NodeWatch(client.ApiClient())  # never started
    members = [f"floor-{i}" for i in range(4)]
    core, custom = _NodeApi(nodes), _Api()
    first = _FloorNode(reports)  # its fault reaches the report watch as floor-0's report
    sims = {n: first if n == "floor-0" else _FloorNode(reports) for n in members}
    floor = DomainFloor(
        members,
        2,
        cast(Mapping[str, SimNode], sims),
        cast(client.CoreV1Api, core),
        cast(client.CustomObjectsApi, custom),
        nodes,
        reports,
        concurrency=16,
        timeout_s=2.0,
    )
    floor.spread(0, 2, pause_s=0)  # after the phase's first domain fault: one sample
    assert floor.taken == 1 and floor.timeouts == 0 and floor.ms[0] >= 50  # not before the fault was heard
    tainted = [c[1][0] for c in core.calls if c[1][1]["spec"]["taints"]]
    assert sorted(tainted) == members  # every member, once heard
    assert all((n, FLOOR_TAINT) not in nodes.seen_at for n in members)  # undone: untainted, rebooted
    assert first.log == ["fault", "reboot"] and reports.ears == {}
    r = floor.single()  # the second sample, taken now
    assert r["samples"] == 2 and r["timeouts"] == 0 and r["domain_size"] == 4


def test_the_node_floor_writes_the_status_then_taint_and_cordon_in_one_patch() -> None:
    core, custom = _Api(), _Api()
    q = NodeQuarantine(cast(client.CoreV1Api, core), cast(client.CustomObjectsApi, custom))
    q.write("floor-node-3")
    ((verb, args, _),) = custom.calls
    assert verb == "patch_cluster_custom_object_status" and args[:4] == (GROUP, VERSION, REPORTS, "floor-node-3")
    assert args[4]["status"]["state"] == "Quarantined"
    ((verb, args, kwargs),) = core.calls
    assert verb == "patch_node" and args[0] == "floor-node-3"
    assert args[1] == {
        "spec": {"taints": [{"key": FLOOR_TAINT, "value": "floor", "effect": "NoSchedule"}], "unschedulable": True}
    }
    assert kwargs["_content_type"] == "application/merge-patch+json"
    q.undo("floor-node-3")
    assert core.calls[-1][1][1] == {"spec": {"taints": None, "unschedulable": None}}
    assert custom.calls[-1][1][4] == {"status": {"state": None, "reason": None, "since": None}}


def test_the_device_floor_writes_the_status_then_creates_one_rule_for_the_gpu() -> None:
    custom = _Api()
    d = DeviceRule(cast(client.CustomObjectsApi, custom), "gpu-3")
    d.write("floor-node-7")
    (status, create) = custom.calls
    assert status[0] == "patch_cluster_custom_object_status" and status[1][3] == "floor-node-7"
    assert create[0] == "create_cluster_custom_object" and create[1][2] == "devicetaintrules"
    body = create[1][3]
    assert body["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": "floor-node-7", "device": "gpu-3"}
    assert body["metadata"] == {"name": "bench-floor-floor-node-7-gpu-3"}  # no gpuhealth label: not its rule
    custom.missing.add(floor_rule_name("floor-node-7", "gpu-3"))
    d.undo("floor-node-7")  # a rule already gone is fine
    assert custom.calls[-1][1][4] == {"status": {FLOOR_FIELD: None}}


def test_the_mig_floor_writes_the_status_then_a_rule_for_each_of_the_gpus_mig_devices() -> None:
    custom = _Api()
    mig = [f"gpu-3-mig-1g10gb-19-{s}" for s in range(7)]
    calls = Calls(16)
    d = DeviceRule(cast(client.CustomObjectsApi, custom), "gpu-3", lambda node: mig, calls)
    try:
        d.write("floor-node-7")
    finally:
        calls.close()
    status, *creates = custom.calls
    assert status[0] == "patch_cluster_custom_object_status" and status[1][3] == "floor-node-7"
    assert status[1][4]["status"][FLOOR_FIELD]["device"] == "gpu-3"
    assert {c[0] for c in creates} == {"create_cluster_custom_object"}
    assert sorted(c[1][3]["spec"]["deviceSelector"]["device"] for c in creates) == mig
    assert {c[1][3]["spec"]["deviceSelector"]["pool"] for c in creates} == {"floor-node-7"}
    assert sorted(c[1][3]["metadata"]["name"] for c in creates) == [floor_rule_name("floor-node-7", m) for m in mig]
    custom.missing.add(floor_rule_name("floor-node-7", mig[2]))
    d.undo("floor-node-7")
    deletes = [c[1][3] for c in custom.calls if c[0] == "delete_cluster_custom_object"]
    assert deletes == [floor_rule_name("floor-node-7", m) for m in mig]
    assert custom.calls[-1][1][4] == {"status": {FLOOR_FIELD: None}}


def test_the_mig_floors_calls_stay_within_the_operators_concurrency_and_run_together() -> None:
    together = threading.Barrier(4, timeout=10.0)  # passes only when a GPU's four calls are in flight at once
    call = _InFlight(0.01)
    calls = Calls(4)
    try:
        calls.together([together.wait] * 4)
        burst([f"n{i}" for i in range(8)], lambda n: calls.together([call] * 7), 4, 10.0)
    finally:
        calls.close()
    assert len(call.done) == 56 and call.max <= 4
    with pytest.raises(client.ApiException):
        c = Calls(2)
        try:
            c.together([lambda: None, lambda: (_ for _ in ()).throw(client.ApiException(status=500))])
        finally:
            c.close()


def test_a_gpu_is_seen_at_its_last_rule_and_not_while_one_is_missing() -> None:
    class Watch:
        cond = threading.Condition()
        seen_at = {("a", "m0"): 10.0, ("a", "m1"): 12.5, ("b", "m0"): 11.0}

        def wait_all(self, devices: Sequence[tuple[str, str]], timeout: float) -> bool:
            return all(d in self.seen_at for d in devices)

    wait = rule_seen(cast(Any, Watch()), lambda node: ["m0", "m1"])
    assert wait(["a", "b"], 1.0) == {"a": 12.5}


def test_a_mig_run_has_floor_nodes_for_its_storm() -> None:
    assert parse_args(["--phases", "mig", "--mig-storm", "150", "--nodes", "2000", "--pods", "100"]).floor_nodes == 150
    assert parse_args(["--mig-storm", "150"]).floor_nodes == 100  # no mig phase: its storm takes no floor nodes


def test_the_start_up_floor_writes_what_a_first_pass_does_into_fields_gpuhealth_never_reads() -> None:
    core, custom = _Api(), _Api()
    FirstWrites(cast(client.CoreV1Api, core), cast(client.CustomObjectsApi, custom)).write("node-0001")
    ((verb, args, _),) = custom.calls
    assert verb == "patch_cluster_custom_object_status"
    # No "state": the operator's start-up after it still finds the node never decided (api/status.py).
    assert set(args[4]["status"]) == {FLOOR_FIELD}
    ((verb, args, _),) = core.calls
    assert verb == "patch_node_status" and args[0] == "node-0001"
    assert [c["type"] for c in args[1]["status"]["conditions"]] == [FLOOR_CONDITION]


def test_the_list_floor_pages_through_every_list_and_counts_what_it_read() -> None:
    api = _Api(
        {
            "gpunodehealths": [{"items": [{}] * 500, "metadata": {"continue": "t1"}}, {"items": [{}] * 20}],
            "list_node": [{"items": [{}] * 3}],
        }
    )
    lists = Lists(
        cast(client.CoreV1Api, api),
        cast(client.CustomObjectsApi, api),
        cast(client.CoordinationV1Api, api),
        "gpuhealth",
    )
    assert lists.list_all("reports") == 520
    pages = [kw for verb, args, kw in api.calls if args and args[-1] == "gpunodehealths"]
    assert [p.get("_continue") for p in pages] == [None, "t1"] and all(p["limit"] == 500 for p in pages)
    assert lists.list_all("nodes") == 3
    # A list that fails is a floor that timed out.
    r = lists.measure(timeout_s=5.0)
    assert r["timed_out"] and r["seconds"] is None and r["errors"] >= 1


def test_the_start_up_floor_is_its_lists_then_its_writes() -> None:
    r = combine({"seconds": 2.5, "timed_out": False}, {"seconds": 10.0, "timed_out": False})
    assert r["seconds"] == 12.5 and not r["timed_out"]


# -- the run's shape ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "nodes"),
    [([], 100), (["--quick"], 20), (["--storm", "30", "--device-storm", "40"], 40), (["--floor-nodes", "5"], 5)],
)
def test_each_floor_has_as_many_floor_nodes_as_its_path_takes_at_once(argv: list[str], nodes: int) -> None:
    assert parse_args(argv).floor_nodes == nodes


# -- the drain storm's floor --------------------------------------------------------------------------


def test_the_drain_floor_asks_a_checkpointing_pod_then_evicts_it_and_asks_again_while_the_pdb_refuses() -> None:
    core = _Api()
    refusals = {"pdb-app-1": 2}

    def eviction(name: str, namespace: str, body: dict[str, Any], **kw: Any) -> None:
        core.calls.append(("create_namespaced_pod_eviction", (name, namespace, body), kw))
        if refusals.get(name):
            refusals[name] -= 1
            raise client.ApiException(status=429, reason="TooManyRequests")
        if name == "gone":
            raise client.ApiException(status=404, reason="NotFound")
        if name == "broken":
            raise client.ApiException(status=500, reason="Internal")

    setattr(core, "create_namespaced_pod_eviction", eviction)  # noqa: B010  (the recorder answers every other call)
    d = PodDrain(cast(client.CoreV1Api, core), "bench-drain-floor", retry_s=0.0)
    d.request("ckpt-a")
    ((verb, args, _),) = core.calls
    assert verb == "patch_namespaced_pod" and args[:2] == ("ckpt-a", "bench-drain-floor")
    assert list(args[2]["metadata"]["annotations"]) == [REQUESTED]
    d.evict("pdb-app-1")
    evictions = [c for c in core.calls if c[0] == "create_namespaced_pod_eviction"]
    assert len(evictions) == 3 and d.refused == 2  # refused twice by the PDB, then through
    assert evictions[0][1][2] == {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "pdb-app-1", "namespace": "bench-drain-floor"},
    }
    d.evict("gone")  # evicted already: nothing to ask again
    with pytest.raises(client.ApiException):
        d.evict("broken")


class _Pods:
    """The drain floor's pods: each checkpointing pod acknowledges its request on a thread of its own."""

    def __init__(self, ack: bool = True) -> None:
        self.ack = ack
        self.lock = threading.Lock()
        self.log: list[str] = []
        self.on_ack: list[Any] = []
        self.refused = 0

    def request(self, pod: str) -> None:
        with self.lock:
            self.log.append(f"request {pod}")
        if self.ack:
            threading.Thread(target=lambda: [h(pod) for h in self.on_ack]).start()

    def evict(self, pod: str) -> float:
        with self.lock:
            self.log.append(f"evict {pod}")
        return time.time()


def test_the_drain_floor_evicts_each_checkpointing_pod_only_after_its_acknowledgement() -> None:
    pods = _Pods()
    mix = [("ckpt-0", True), ("term-1", False), ("ckpt-2", True), ("pdb-app-x", False)]
    t0 = time.time()
    r = drain_pods(mix, cast(PodDrain, pods), 2, 10.0, t0, pods.on_ack.append)
    assert sorted(pods.log) == sorted([*(f"evict {n}" for n, _ in mix), "request ckpt-0", "request ckpt-2"])
    for name in ("ckpt-0", "ckpt-2"):
        assert pods.log.index(f"request {name}") < pods.log.index(f"evict {name}")
    assert r["evictions"] == 4 and r["checkpoint_requests"] == 2 and not r["timed_out"]
    assert r["seconds"] is not None and r["evictions_per_s"] is not None


def test_a_drain_floor_whose_pods_never_acknowledge_times_out() -> None:
    pods = _Pods(ack=False)
    r = drain_pods([("ckpt-0", True), ("term-1", False)], cast(PodDrain, pods), 2, 0.3, time.time(), pods.on_ack.append)
    assert r["timed_out"] and r["evictions"] == 1 and r["evictions_per_s"] is None and r["seconds"] is None


def test_the_drain_floors_rate_is_read_first_to_last_as_gpuhealths() -> None:
    assert eviction_rate([10.0, 10.5, 11.0, 12.0]) == 1.5  # 3 gaps over 2 s
    assert eviction_rate([10.0]) is None


def test_a_floor_that_fails_is_a_floor_that_timed_out() -> None:
    def boom() -> dict[str, Any]:
        raise client.ApiException(status=503, reason="ServiceUnavailable")

    failed = guarded("node storm", boom)
    assert failed["timed_out"] is True and "503" in failed["error"]
    storm = next(t for t in targets_for(1000) if t.key == "storm_rate")
    detect = next(t for t in targets_for(1000) if t.key == "detect_p50")
    assert storm.floor is not None and storm.floor({"floors": {"storm": failed}}) is None
    assert detect.floor is not None and detect.floor({"floor_ms": failed}) is None  # no samples: timed out


def test_a_run_with_the_drain_storm_has_floor_nodes_for_it_and_a_spare() -> None:
    args = parse_args(["--phases", "drain", "--nodes", "1000"])
    assert args.drain_nodes == 100 and args.floor_nodes == 101


def test_the_scaling_table_says_how_each_size_stands_against_its_floors() -> None:
    assert scaling_docs.ratios(_with_floors()) == (
        "4 of 5 within 1.5x (2 without a floor measured); over it: Detection to taint, p99 (2.25x)."
    )
    old = json.loads(FILED.read_text(encoding="utf-8"))
    assert scaling_docs.ratios({**old, "floor_ms": {**old["floor_ms"], "timeouts": 3}}) == "no floor measured."


def test_a_run_without_the_core_phases_lists_its_floors_too() -> None:
    res = _domain_run()
    res["floors"] = {"domain": {"p50": 800.0, "p90": 900.0, "p99": 1200.0, "max": 1200.0, "samples": 4, "timeouts": 0}}
    res["targets"] = evaluate(res)
    md = summary_md(res)
    assert "| 600.0 ms | 1,200.0 ms | 0.50x | pass | <= 1000 ms | pass |" in md
    assert "NVLink domain, p50 | 300.0 ms | 800.0 ms | 0.38x | pass | - | - |" in md
    assert "Ratios to the no-logic floor (<= 1.5x): **2 of 2 met**." in md
    assert "No-logic floors, same run and API server" in md and "domain storm p50 800.0 ms" in md


def test_a_figure_with_no_absolute_target_is_judged_by_its_floor_alone() -> None:
    res = _with_floors()
    res["operator"]["startup_s"] = 45.0
    res["floors"]["startup"] = combine({"seconds": 5.0, "timed_out": False}, {"seconds": 25.0, "timed_out": False})
    before = tally(res["targets"], res["nodes"])
    res["targets"] = evaluate(res)
    assert tally(res["targets"], res["nodes"]) == before  # no absolute target: not in the absolute count
    assert res["targets"]["startup"]["ratio"] == {"floor": 30.0, "ratio": 1.5, "status": RATIO_MET}
    block = docs.render(FILED, res)
    assert "| Operator start-up to every node evaluated | 45.0 s | 30.0 s | 1.50x | met | - | - |" in block
    res["floors"]["startup"]["seconds"] = 20.0
    res["targets"] = evaluate(res)
    assert res["targets"]["startup"]["ratio"]["status"] == RATIO_MISSED and not all_met(res["targets"])
