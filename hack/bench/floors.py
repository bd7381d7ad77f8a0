"""The no-logic floors of `make bench` (issue #52): for each path the bench judges, a client that does
exactly the writes (or lists) gpuhealth must do for it, with no logic, as fast as the API server lets
it, in the same run, at the operator's concurrency, timed the way gpuhealth's figure is. Each figure is
then judged by its ratio to its floor (``hack/bench/targets.py``: <= 1.5x), so a miss says how much of
the time is gpuhealth's and how much the shared machine's.

A floor hears of its fault as a controller does, through a watch (``Ears``: the bench's report watch
serves the report that carries it, and the floor's writes start then, not when the publish returns),
so a floor pays the watch hop gpuhealth pays before its first write; the drain's and the start-up's,
which time no fault, need none. The floors timed one sample at a time take their samples among the
phase's own faults, so both meet the API server in the same state: detection's (hack/bench/detection.py)
and the device path's, MIG fault's and domain storm's (``SampledFloor``).

- detection (``floor_ms``, hack/bench/detection.py): one floor node's XID heard, then the report's
  status write and the Node's taint + cordon patch (``NodeQuarantine``); to the taint seen;
- node storm (``storm``): the storm's count of floor nodes faulted at once through the agent's publisher,
  then per node, once heard, the same two writes, 16 at a time (the operator's workers); to the last
  floor taint seen by the independent Node watch;
- device path (``device``, one at a time) and device storm (``device_storm``): a device fault published
  on a floor node and heard, then the report's status write and the DeviceTaintRule's create; to the
  rule seen by the independent rule watch;
- MIG fleet (``mig``, one at a time, and ``mig_storm``): the same on floor nodes whose agents report MIG
  GPUs, a rule for each of the GPU's seven MIG devices created together; to the GPU's last rule seen;
- domain storm (``domain``): a fault published on one member of an 18-node domain of floor nodes, then
  every member's status write and taint, 16 at a time; to the last member's taint;
- first start-up (``startup``): the operator's start-up lists, then per governed node the first writes a
  never-evaluated fleet needs (a status write of its report, a status write of its Node), 16 at a time,
  on the governed fleet itself before the operator starts (bench-only fields, nothing gpuhealth reads);
- warm restart (``restart``): the lists a restarted operator waits for, all at once;
- drain storm (``drain``): the same pod mix on as many floor nodes (hack/bench/drain_workload.py: pods
  that acknowledge a checkpoint, pods that finish on SIGTERM, gang ranks, a Deployment under a PDB of
  maxUnavailable 1, in a namespace of its own), the nodes' faults published, then per pod the checkpoint
  request and, once acknowledged (the bench plays the pods, as in the storm), the Eviction; a pod that
  finishes on SIGTERM evicted at once; an Eviction the PDB refuses (429) asked again at once; 16 at a
  time. Evictions per second (first to last, as gpuhealth's) and the seconds to the last eviction.

The floor nodes carry the ``bench-floor`` label, outside every policy (hack/bench/cluster.py), so the
operator never acts on them; every floor is undone before the run goes on. The pure parts (the burst,
the clients' writes) are unit-tested in tests/unit/bench/test_floors.py.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from kubernetes import client

from devkit import dra
from gpuhealth.api.names import AGENT_LEASE_SELECTOR
from gpuhealth.kube.client import SCHEDULED
from hack.bench.details import floor_line_part
from hack.bench.drain_workload import REQUESTED
from hack.bench.fleet import SimNode
from hack.bench.support import (
    DEVICE_TAINT_RULES,
    DRA_GROUP,
    DRA_VERSION,
    FLOOR_TAINT,
    GPU_SELECTOR,
    GROUP,
    MERGE,
    REPORTS,
    VERSION,
    latency_summary,
    log,
)
from hack.bench.watch import Carries, NodeWatch, ReportWatch, RuleWatch, last_rule

# Seen: when each item's outcome was seen (epoch seconds) by the bench's independent watch, waited
# for up to a timeout; the items missing from it were not seen in time.
WaitSeen = Callable[[Sequence[str], float], Mapping[str, float]]
FLOOR_CONDITION = "BenchFloor"
FLOOR_FIELD = "benchFloor"  # a status field of the report nobody reads (its status keeps unknown fields)


def _stamp() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def carries_xid(obj: dict[str, Any]) -> bool:
    """A report with an XID in it that no floor has quarantined yet: a node fault just published (the
    floors' undo reboots the node, its report clean again, before it clears the floor's status)."""
    status = obj.get("status") or {}
    return bool((obj.get("spec") or {}).get("xidEvents")) and status.get("reason") != "BenchFloor"


def carries_ecc(gpu: int) -> Carries:
    """A report whose GPU ``gpu`` has an uncorrected ECC error that no floor has taken out yet (the undo
    clears the fault before the floor's status, so no older write of the report matches)."""

    def carries(obj: dict[str, Any]) -> bool:
        if (obj.get("status") or {}).get(FLOOR_FIELD):
            return False
        for d in (obj.get("spec") or {}).get("devices") or []:
            if isinstance(d, dict) and d.get("index") == gpu:
                return bool(((d.get("ecc") or {}).get("volatileUncorrected") or 0) > 0)
        return False

    return carries


class Ears:
    """Where a floor hears of its faults: the bench's report watch, as a controller hears of them through
    its own. A floor's writes start when the watch serves the report that ``carries`` the fault, not when
    the publish returns, so every floor pays the watch hop gpuhealth pays before its first write."""

    def __init__(self, watch: ReportWatch, carries: Carries) -> None:
        self.watch, self.carries = watch, carries

    def hear(self, node: str, then: Callable[[], None]) -> None:
        self.watch.hear(node, self.carries, then)

    def deaf(self, nodes: Sequence[str]) -> None:
        for n in nodes:
            self.watch.deaf(n)


def burst(
    items: Sequence[str],
    write: Callable[[str], None],
    concurrency: int,
    timeout_s: float,
    wait_seen: WaitSeen | None = None,
    inject: Callable[[str], object] | None = None,
    inject_pool: ThreadPoolExecutor | None = None,
    started: float | None = None,
    ears: Ears | None = None,
) -> dict[str, Any]:
    """Every item's writes at once, ``concurrency`` at a time, timed from the start to the last item
    seen (by ``wait_seen``; without one, to its writes returning).

    ``inject``: what starts each item (its fault published through the agent's publisher, on
    ``inject_pool`` as the bench's own faults are); its writes follow when ``ears`` hear the fault in
    the report watch, as a controller's follow its watch (without ears, the moment ``inject`` returns).
    A write that fails is counted and its item never seen: the
    floor then times out, which makes every ratio on it unmeasured, not met. ``started``: the clock's
    origin where the path began before the burst (a domain's one fault).
    """
    t0 = started if started is not None else time.time()
    lock = threading.Lock()
    done_at: dict[str, float] = {}
    errors: list[str] = []
    workers = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="bench-floor")
    futures: list[Future[None]] = []

    def write_one(item: str) -> None:
        try:
            write(item)
        except Exception as e:
            with lock:
                errors.append(f"{item}: {type(e).__name__}: {e}"[:200])
            return
        with lock:
            done_at[item] = time.time()

    def heard(item: str) -> None:
        """The watch served the item's fault (on its thread): the item's writes go to a worker."""
        try:
            f = workers.submit(write_one, item)
        except RuntimeError:  # the burst is over (timed out) and its workers gone
            return
        with lock:
            futures.append(f)

    def start(item: str) -> None:
        if ears is not None:
            ears.hear(item, functools.partial(heard, item))
        if inject is not None:
            try:
                inject(item)
            except Exception as e:
                with lock:
                    errors.append(f"{item}: inject {type(e).__name__}: {e}"[:200])
                return
        if ears is None:
            with lock:
                futures.append(workers.submit(write_one, item))

    try:
        if inject is not None and inject_pool is not None:
            for f in [inject_pool.submit(start, i) for i in items]:
                f.result()
        else:
            for i in items:
                start(i)
        if wait_seen is not None:
            seen = dict(wait_seen(items, timeout_s))
        else:
            deadline = t0 + timeout_s
            for f in list(futures):
                try:
                    f.result(timeout=max(0.0, deadline - time.time()))
                except TimeoutError:
                    break
            with lock:
                seen = dict(done_at)
    finally:
        if ears is not None:
            ears.deaf(items)
        workers.shutdown(wait=False, cancel_futures=True)
    return _outcome(items, concurrency, t0, seen, errors)


def _outcome(
    items: Sequence[str], concurrency: int, t0: float, seen: Mapping[str, float], errors: Sequence[str]
) -> dict[str, Any]:
    """A burst's result: timed from ``t0`` to the last item seen, timed out unless every item was."""
    seen = {i: t for i, t in seen.items() if i in set(items)}
    complete = bool(items) and len(seen) == len(items)
    seconds = max(seen.values()) - t0 if complete else None
    return {
        "items": len(items),
        "concurrency": concurrency,
        "seconds": round(seconds, 3) if seconds is not None else None,
        "per_s": round(len(items) / seconds, 1) if seconds else None,
        "seen": len(seen),
        "errors": len(errors),
        "error_examples": list(errors[:3]),
        "timed_out": not complete,
    }


def unheard(items: Sequence[str], concurrency: int) -> dict[str, Any]:
    """A burst whose fault the watch never served: timed out, nothing written."""
    return _outcome(items, concurrency, 0.0, {}, ["the fault never came through the report watch"])


def sample_due(i: int, faults: int, samples: int, taken: int) -> bool:
    """Whether a floor sample is due after a phase's fault ``i`` of ``faults``, ``taken`` of ``samples``
    taken: one after every ``faults // samples`` faults, so the samples spread evenly over the phase."""
    every = max(1, faults // max(1, samples))
    return i % every == every - 1 and taken < samples


class SampledFloor:
    """A latency floor taken one sample at a time, each undone before the next (:meth:`sample`, a
    subclass's), whose samples a phase takes among its own faults (:meth:`spread`, as detection's are),
    so that both meet the API server in the same state: a phase that follows a busy one (the fact
    traffic) and a floor taken after it on a quiet server made a ratio of the server's two moods, not of
    gpuhealth's work (at 10,000 nodes, 32e1751: the device path's 12.34x). A sample that times out or
    fails counts as the timeout (and says why), and the phase goes on."""

    def __init__(self, samples: int, timeout_s: float, what: str) -> None:
        self.samples, self.timeout_s, self.what = samples, timeout_s, what
        self.ms: list[float] = []
        self.timeouts = 0
        self.errors: list[str] = []
        self.taken = 0

    def sample(self, k: int) -> dict[str, Any]:
        """Sample ``k`` (from 0): one burst's result, its writes undone before it returns."""
        raise NotImplementedError

    def once(self) -> None:
        k = self.taken
        self.taken += 1
        try:
            r = self.sample(k)
        except Exception as e:
            self.timeouts += 1
            self.errors.append(f"sample {k}: {type(e).__name__}: {e}"[:200])
            log(f"  floor: {self.what} sample {k} failed: {type(e).__name__}: {e}")
            return
        if r["timed_out"]:
            self.timeouts += 1
            self.errors.extend(r["error_examples"])
        else:
            self.ms.append(r["seconds"] * 1000)

    def spread(self, i: int, faults: int, pause_s: float = 0.2) -> None:
        """After the phase's fault ``i`` of ``faults``: a sample where one is due, so that the samples
        spread evenly over the phase (then ``pause_s``, as between its faults)."""
        if sample_due(i, faults, self.samples, self.taken):
            self.once()
            time.sleep(pause_s)

    def single(self) -> dict[str, Any]:
        """The floor: the samples still due taken now, then their latency summary (a timed-out sample
        counts as the timeout, and is counted)."""
        while self.taken < self.samples:
            self.once()
            time.sleep(0.2)
        r = latency_summary(self.ms, self.timeouts, self.timeout_s * 1000)
        if self.errors:
            r["error_examples"] = self.errors[:3]
        return r


class NodeQuarantine:
    """What gpuhealth writes to take a node out, with no decision: the report's status (its record),
    then the Node's taint and cordon in one patch (``controller/act/node_reconciler.py``: the condition
    and the drain wait for the node's next pass). On floor nodes, with the floor's own taint."""

    def __init__(self, core: client.CoreV1Api, custom: client.CustomObjectsApi) -> None:
        self.core, self.custom = core, custom

    def write(self, node: str) -> None:
        self.custom.patch_cluster_custom_object_status(
            GROUP,
            VERSION,
            REPORTS,
            node,
            {"status": {"state": "Quarantined", "reason": "BenchFloor", "since": _stamp()}},
        )
        self.core.patch_node(
            node,
            {
                "spec": {
                    "taints": [{"key": FLOOR_TAINT, "value": "floor", "effect": "NoSchedule"}],
                    "unschedulable": True,
                }
            },
            _content_type=MERGE,
            _preload_content=False,
        )

    def undo(self, node: str) -> None:
        self.core.patch_node(
            node, {"spec": {"taints": None, "unschedulable": None}}, _content_type=MERGE, _preload_content=False
        )
        self.custom.patch_cluster_custom_object_status(
            GROUP, VERSION, REPORTS, node, {"status": {"state": None, "reason": None, "since": None}}
        )


def floor_rule_name(node: str, device: str) -> str:
    return f"bench-floor-{node}-{device}"


class Calls:
    """The operator's concurrency for a floor whose item takes several calls at once: at most
    ``concurrency`` API calls in flight over every writer, and an item's calls run together (a MIG GPU's
    rules, which ``controller/act/device_rules.py`` creates with one gather)."""

    def __init__(self, concurrency: int) -> None:
        self.slots = threading.BoundedSemaphore(max(1, concurrency))
        self.pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="bench-floor-call")

    def one(self, call: Callable[[], object]) -> None:
        with self.slots:
            call()

    def together(self, calls: Sequence[Callable[[], object]]) -> None:
        """Every call at once (within the limit); returns when all did, raising the first failure."""
        if len(calls) == 1:
            self.one(calls[0])
            return
        for f in [self.pool.submit(self.one, c) for c in calls]:
            f.result()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class DeviceRule:
    """What gpuhealth writes to take one GPU out, with no decision: the report's status (the GPU's
    verdict), then a DeviceTaintRule's create for each of its DRA devices (``actions/devicetaints.py``'s
    shape, without gpuhealth's labels so that its orphan sweep leaves it alone; pool = node, as the DRA
    driver publishes): a whole GPU's one, or a MIG GPU's one per MIG device (``devices``), created
    together through ``calls``."""

    def __init__(
        self,
        custom: client.CustomObjectsApi,
        device: str,
        devices: Callable[[str], Sequence[str]] | None = None,
        calls: Calls | None = None,
    ) -> None:
        self.custom, self.device, self.devices, self.calls = custom, device, devices, calls

    def devices_of(self, node: str) -> list[str]:
        """The DRA devices the GPU is on ``node``: itself, or its MIG devices."""
        return list(self.devices(node)) if self.devices is not None else [self.device]

    def _run(self, calls: Sequence[Callable[[], object]]) -> None:
        if self.calls is not None:
            self.calls.together(calls)
        else:
            for c in calls:
                c()

    def write(self, node: str) -> None:
        status = {"status": {FLOOR_FIELD: {"device": self.device, "state": "Quarantined", "since": _stamp()}}}
        self._run([lambda: self.custom.patch_cluster_custom_object_status(GROUP, VERSION, REPORTS, node, status)])
        self._run([functools.partial(self._create, node, d) for d in self.devices_of(node)])

    def _create(self, node: str, device: str) -> None:
        self.custom.create_cluster_custom_object(
            DRA_GROUP,
            DRA_VERSION,
            DEVICE_TAINT_RULES,
            {
                "apiVersion": f"{DRA_GROUP}/{DRA_VERSION}",
                "kind": "DeviceTaintRule",
                "metadata": {"name": floor_rule_name(node, device)},
                "spec": {
                    "deviceSelector": {"driver": dra.DRIVER, "pool": node, "device": device},
                    "taint": {"key": FLOOR_TAINT, "value": "EccUncorrected", "effect": "NoSchedule"},
                },
            },
        )

    def undo(self, node: str) -> None:
        for device in self.devices_of(node):
            try:
                self.custom.delete_cluster_custom_object(
                    DRA_GROUP, DRA_VERSION, DEVICE_TAINT_RULES, floor_rule_name(node, device)
                )
            except client.ApiException as e:
                if e.status != 404:
                    raise
        self.custom.patch_cluster_custom_object_status(GROUP, VERSION, REPORTS, node, {"status": {FLOOR_FIELD: None}})


class FirstWrites:
    """The first writes a never-evaluated node needs (``hack/bench/startup_writes.py``): its report's
    status, then its Node's status (the condition, the state label riding on it), each a round trip.
    Written before the operator starts, on the governed fleet, into fields gpuhealth never reads (the
    report's status keeps unknown fields; a Node condition of the bench's own type), so the start-up it
    precedes still finds every node unevaluated."""

    def __init__(self, core: client.CoreV1Api, custom: client.CustomObjectsApi) -> None:
        self.core, self.custom = core, custom

    def write(self, node: str) -> None:
        now = _stamp()
        self.custom.patch_cluster_custom_object_status(
            GROUP, VERSION, REPORTS, node, {"status": {FLOOR_FIELD: {"state": "Healthy", "since": now}}}
        )
        self.core.patch_node_status(
            node,
            {
                "status": {
                    "conditions": [
                        {
                            "type": FLOOR_CONDITION,
                            "status": "True",
                            "reason": "Healthy",
                            "message": "the bench's no-logic start-up floor",
                            "lastTransitionTime": now[:19] + "Z",
                            "lastHeartbeatTime": now[:19] + "Z",
                        }
                    ]
                }
            },
            _preload_content=False,
        )


class Lists:
    """The lists an operator waits for at start-up (``controller/intake/objectwatch.py``): the GPU Nodes,
    the reports, the policies, the agents' Leases, the pods on nodes, the ResourceSlices and the
    DeviceTaintRules; paged as a client without streaming lists pages them, each parsed, all at once
    (the operator's watches list at once too)."""

    PAGE = 500

    def __init__(
        self,
        core: client.CoreV1Api,
        custom: client.CustomObjectsApi,
        leases: client.CoordinationV1Api,
        lease_namespace: str,
    ) -> None:
        self.core, self.custom, self.leases, self.lease_namespace = core, custom, leases, lease_namespace

    def calls(self) -> dict[str, Callable[..., Any]]:
        """Each list by name: a function of the paging keywords (limit, _continue)."""
        c, k = self.custom, self.core
        return {
            "nodes": lambda **kw: k.list_node(label_selector=GPU_SELECTOR, **kw),
            "reports": lambda **kw: c.list_cluster_custom_object(GROUP, VERSION, REPORTS, **kw),
            "policies": lambda **kw: c.list_cluster_custom_object(GROUP, VERSION, "gpuhealthpolicies", **kw),
            "leases": lambda **kw: self.leases.list_namespaced_lease(
                self.lease_namespace, label_selector=AGENT_LEASE_SELECTOR, **kw
            ),
            "pods": lambda **kw: k.list_pod_for_all_namespaces(field_selector=SCHEDULED, **kw),
            "resourceslices": lambda **kw: c.list_cluster_custom_object(DRA_GROUP, DRA_VERSION, "resourceslices", **kw),
            "devicetaintrules": lambda **kw: c.list_cluster_custom_object(
                DRA_GROUP, DRA_VERSION, DEVICE_TAINT_RULES, **kw
            ),
        }

    def list_all(self, name: str) -> int:
        """One list, every page of it; the objects it returned."""
        fn, token, count = self.calls()[name], None, 0
        while True:
            kw: dict[str, Any] = {"limit": self.PAGE, "_preload_content": False}
            if token:
                kw["_continue"] = token
            page = json.loads(fn(**kw).data)
            count += len(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return count

    def measure(self, timeout_s: float) -> dict[str, Any]:
        """Every list at once: the seconds to the last one's last page (``seconds``), and each list's own."""
        names = list(self.calls())
        each: dict[str, dict[str, Any]] = {}
        errors: list[str] = []
        t0 = time.time()
        pool = ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="bench-floor-list")

        def one(name: str) -> tuple[int, float]:
            n = self.list_all(name)
            return n, time.time()

        try:
            futures = {n: pool.submit(one, n) for n in names}
            for n, f in futures.items():
                try:
                    objects, end = f.result(timeout=max(0.0, t0 + timeout_s - time.time()))
                except Exception as e:
                    errors.append(f"{n}: {type(e).__name__}: {e}"[:200])
                    continue
                each[n] = {"objects": objects, "seconds": round(end - t0, 3)}
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        complete = len(each) == len(names)
        return {
            "items": len(names),
            "concurrency": len(names),
            "seconds": round(max(e["seconds"] for e in each.values()), 3) if complete else None,
            "seen": len(each),
            "errors": len(errors),
            "error_examples": errors[:3],
            "timed_out": not complete,
            "lists": each,
        }


def combine(lists: Mapping[str, Any], writes: Mapping[str, Any]) -> dict[str, Any]:
    """The start-up floor: the lists, then the first writes; timed out where either did."""
    timed_out = bool(lists.get("timed_out") or writes.get("timed_out"))
    seconds = None if timed_out else round(float(lists["seconds"]) + float(writes["seconds"]), 3)
    return {"seconds": seconds, "timed_out": timed_out, "lists": dict(lists), "writes": dict(writes)}


def log_floor(name: str, f: Mapping[str, Any]) -> None:
    log(f"  floor: {floor_line_part(name, f)}")


# -- the floors of each path, as the phases take them (floor nodes outside every policy) --------------


def taint_seen(node_watch: NodeWatch, key: str = FLOOR_TAINT) -> WaitSeen:
    """When the independent Node watch first saw ``key`` on each node."""

    def wait(items: Sequence[str], timeout_s: float) -> dict[str, float]:
        node_watch.wait_all(items, key, timeout_s)
        with node_watch.cond:
            return {n: node_watch.seen_at[(n, key)] for n in items if (n, key) in node_watch.seen_at}

    return wait


def rule_seen(rule_watch: RuleWatch, devices: Callable[[str], Sequence[str]]) -> WaitSeen:
    """When the independent rule watch had seen a DeviceTaintRule for every one of ``devices`` of each
    node (pool): the last of them, as gpuhealth's MIG figure is timed to its GPU's last rule."""

    def wait(items: Sequence[str], timeout_s: float) -> dict[str, float]:
        rule_watch.wait_all([(n, d) for n in items for d in devices(n)], timeout_s)
        with rule_watch.cond:
            spans = {n: last_rule(rule_watch.seen_at, [(n, d) for d in devices(n)]) for n in items}
        return {n: span[1] for n, span in spans.items() if span is not None}

    return wait


def _untaint(nodes: Sequence[str], writer: NodeQuarantine, sims: Mapping[str, SimNode], node_watch: NodeWatch) -> None:
    """Back to clean: each node's report clean (a reboot), then the floor's taint, cordon and status gone
    (in that order, so that no write of the report the watch may still serve carries the old fault
    without the floor's status: ``carries_xid`` would hear it as the next fault)."""
    for n in nodes:
        sims[n].reboot()
        writer.undo(n)
    node_watch.wait_all(nodes, FLOOR_TAINT, timeout=60, present=False)


def storm_floor(
    nodes: Sequence[str],
    sims: Mapping[str, SimNode],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    node_watch: NodeWatch,
    report_watch: ReportWatch,
    pool: ThreadPoolExecutor,
    concurrency: int,
    timeout_s: float = 180.0,
) -> dict[str, Any]:
    """The node storm's floor: ``nodes`` faulted at once, each quarantined with no logic once its fault
    is heard."""
    writer = NodeQuarantine(core, custom)
    r = burst(
        nodes,
        writer.write,
        concurrency,
        timeout_s,
        wait_seen=taint_seen(node_watch),
        inject=lambda n: sims[n].fault(),
        inject_pool=pool,
        ears=Ears(report_watch, carries_xid),
    )
    _untaint(nodes, writer, sims, node_watch)
    log_floor("node storm", r)
    return r


class GpuFloor(SampledFloor):
    """The device path's floor (one GPU fault at a time, on the floor nodes in turn) and the device
    storm's (``storm`` floor nodes' GPU at once): a device fault published and heard, then its rule;
    with ``devices`` (node -> the GPU's MIG devices: the MIG fleet's floors), a rule for each, to the
    last. Its one-at-a-time samples are taken among the phase's faults (``SampledFloor``)."""

    def __init__(
        self,
        nodes: Sequence[str],
        samples: int,
        device: int,
        sims: Mapping[str, SimNode],
        custom: client.CustomObjectsApi,
        rule_watch: RuleWatch,
        report_watch: ReportWatch,
        concurrency: int,
        timeout_s: float,
        devices: Callable[[str], Sequence[str]] | None = None,
        what: str = "device",
    ) -> None:
        super().__init__(samples, timeout_s, what)
        self.nodes, self.device, self.sims = nodes, device, sims
        self.rule_watch, self.concurrency = rule_watch, concurrency
        self.calls = Calls(concurrency) if devices is not None else None
        self.writer = DeviceRule(custom, f"gpu-{device}", devices, self.calls)
        self.seen = rule_seen(rule_watch, self.writer.devices_of)
        self.ears = Ears(report_watch, carries_ecc(device))

    def _burst(self, group: Sequence[str], timeout_s: float, pool: ThreadPoolExecutor | None = None) -> dict[str, Any]:
        return burst(
            group,
            self.writer.write,
            self.concurrency,
            timeout_s,
            wait_seen=self.seen,
            inject=lambda n: self.sims[n].device_fault(self.device),
            inject_pool=pool,
            ears=self.ears,
        )

    def _undo(self, group: Sequence[str]) -> None:
        # The fault cleared first, then the floor's rules and status (see ``carries_ecc``).
        for n in group:
            self.sims[n].device_clear()
            self.writer.undo(n)
        self.rule_watch.wait_all([(n, d) for n in group for d in self.writer.devices_of(n)], timeout=60, present=False)

    def sample(self, k: int) -> dict[str, Any]:
        node = self.nodes[k % len(self.nodes)]
        r = self._burst([node], self.timeout_s)
        self._undo([node])
        return r

    def single(self) -> dict[str, Any]:
        r = super().single()
        log_floor(f"{self.what} path", r)
        return r

    def storm(self, count: int, pool: ThreadPoolExecutor) -> dict[str, Any]:
        """The storm's floor: ``count`` floor nodes' GPU faulted at once, to the last rule seen."""
        group = list(self.nodes[:count])
        many = self._burst(group, 180.0, pool)
        self._undo(group)
        log_floor(f"{self.what} storm", many)
        return many

    def close(self) -> None:
        if self.calls is not None:
            self.calls.close()


class DomainFloor(SampledFloor):
    """The domain storm's floor: one member's fault published and heard, then every member of the domain
    quarantined with no logic (as gpuhealth takes the domain out as one decision); to the last member's
    taint. The same ``members`` (floor nodes) each sample, untainted and rebooted between them; the
    samples are taken among the domain faults (``SampledFloor``)."""

    def __init__(
        self,
        members: Sequence[str],
        samples: int,
        sims: Mapping[str, SimNode],
        core: client.CoreV1Api,
        custom: client.CustomObjectsApi,
        node_watch: NodeWatch,
        report_watch: ReportWatch,
        concurrency: int,
        timeout_s: float,
    ) -> None:
        super().__init__(samples, timeout_s, "domain storm")
        self.members, self.sims, self.node_watch, self.report_watch = list(members), sims, node_watch, report_watch
        self.concurrency = concurrency
        self.writer = NodeQuarantine(core, custom)

    def sample(self, k: int) -> dict[str, Any]:
        group = self.members
        heard = threading.Event()
        t0 = time.time()
        self.report_watch.hear(group[0], carries_xid, heard.set)
        try:
            self.sims[group[0]].fault()
            if not heard.wait(self.timeout_s):
                self.report_watch.deaf(group[0])
                return unheard(group, self.concurrency)
            return burst(
                group,
                self.writer.write,
                self.concurrency,
                self.timeout_s,
                wait_seen=taint_seen(self.node_watch),
                started=t0,
            )
        finally:
            _untaint(group, self.writer, self.sims, self.node_watch)

    def single(self) -> dict[str, Any]:
        r = super().single()
        r["domain_size"] = len(self.members)
        log_floor("domain storm", r)
        return r


def startup_floor(
    governed: Sequence[str],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    lease_namespace: str,
    concurrency: int,
    timeout_s: float = 900.0,
) -> dict[str, Any]:
    """The first start-up's floor, before the operator starts: its lists, then every governed node's
    first writes, ``concurrency`` at a time."""
    lists = Lists(core, custom, client.CoordinationV1Api(core.api_client), lease_namespace).measure(timeout_s)
    writes = burst(governed, FirstWrites(core, custom).write, concurrency, timeout_s)
    r = combine(lists, writes)
    log_floor("first start-up", r)
    return r


def restart_floor(
    core: client.CoreV1Api, custom: client.CustomObjectsApi, lease_namespace: str, timeout_s: float = 600.0
) -> dict[str, Any]:
    """The warm restart's floor: the lists a restarted operator waits for, all at once."""
    r = Lists(core, custom, client.CoordinationV1Api(core.api_client), lease_namespace).measure(timeout_s)
    log_floor("warm restart", r)
    return r


# -- the drain storm's floor ---------------------------------------------------------------------------

FLOOR_DRAIN_NAMESPACE = "bench-drain-floor"
FLOOR_PDB_LABEL = "bench-pdb-floor"


class PodDrain:
    """What gpuhealth writes to drain pods, with no decision (``controller/drain``, ``kube/client.py``):
    the checkpoint request annotation on a pod that takes one, and the Eviction (the Eviction API, so
    PDBs hold); an Eviction the PDB refuses (429) is asked again at once, every ``retry_s``, for up to
    ``give_up_s``. ``evict`` returns when the Eviction that went through was sent (the audit log's
    received time, which gpuhealth's rate is read from)."""

    def __init__(self, core: client.CoreV1Api, namespace: str, retry_s: float = 0.05, give_up_s: float = 300.0) -> None:
        self.core, self.namespace, self.retry_s, self.give_up_s = core, namespace, retry_s, give_up_s
        self.refused = 0

    def request(self, pod: str) -> None:
        self.core.patch_namespaced_pod(
            pod, self.namespace, {"metadata": {"annotations": {REQUESTED: _stamp()}}}, _preload_content=False
        )

    def evict(self, pod: str) -> float:
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": self.namespace}}
        deadline = time.time() + self.give_up_s
        while True:
            sent = time.time()
            try:
                self.core.create_namespaced_pod_eviction(pod, self.namespace, body, _preload_content=False)
                return sent
            except client.ApiException as e:
                if e.status == 404:  # gone already
                    return sent
                if e.status != 429 or time.time() > deadline:
                    raise
                self.refused += 1
            time.sleep(self.retry_s)


def eviction_rate(sent: Sequence[float]) -> float | None:
    """Evictions per second, first to last ((n - 1) / span), as gpuhealth's drain storm is read."""
    times = sorted(sent)
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    return round((len(times) - 1) / span, 1) if span > 0 else None


def drain_pods(
    pods: Sequence[tuple[str, bool]],
    drainer: PodDrain,
    concurrency: int,
    timeout_s: float,
    started: float,
    acked: Callable[[Callable[[str], object]], None],
) -> dict[str, Any]:
    """Drain ``pods`` ((name, takes a checkpoint request)), ``concurrency`` calls at a time: a
    checkpointing pod's request first, its Eviction the moment its acknowledgement is in (``acked``
    registers the callback that says so); the rest evicted at once. Timed from ``started``."""
    lock = threading.Condition()
    sent: dict[str, float] = {}
    errors: list[str] = []
    workers = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="bench-floor-drain")
    wanted = {name for name, _ in pods}

    def evict(pod: str) -> None:
        try:
            at = drainer.evict(pod)
        except Exception as e:
            with lock:
                errors.append(f"{pod}: {type(e).__name__}: {e}"[:200])
                lock.notify_all()
            return
        with lock:
            sent[pod] = at
            lock.notify_all()

    def request(pod: str) -> None:
        try:
            drainer.request(pod)
        except Exception as e:
            with lock:
                errors.append(f"{pod}: request {type(e).__name__}: {e}"[:200])
                lock.notify_all()

    acked(lambda pod: workers.submit(evict, pod) if pod in wanted else None)
    try:
        for name, checkpoint in pods:
            workers.submit(request if checkpoint else evict, name)
        with lock:
            lock.wait_for(lambda: len(sent) + len(errors) >= len(pods), max(0.0, started + timeout_s - time.time()))
            done = dict(sent)
            failed = list(errors)
    finally:
        workers.shutdown(wait=False, cancel_futures=True)
    complete = bool(pods) and len(done) == len(pods)
    return {
        "pods": len(pods),
        "checkpoint_requests": sum(1 for _, c in pods if c),
        "concurrency": concurrency,
        "evictions": len(done),
        "evictions_per_s": eviction_rate(list(done.values())) if complete else None,
        "seconds": round(max(done.values()) - started, 2) if complete else None,
        "refused_429": drainer.refused,
        "errors": len(failed),
        "error_examples": failed[:3],
        "timed_out": not complete,
    }


def guarded(name: str, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A floor whose measurement failed (its setup, the API server refusing) is a floor that timed out:
    every ratio on it unmeasured, and the run goes on to gpuhealth's next figure."""
    try:
        return measure()
    except Exception as e:
        log(f"  floor: {name} failed: {type(e).__name__}: {e}")
        return {"timed_out": True, "samples": 0, "error": f"{type(e).__name__}: {e}"[:300]}
