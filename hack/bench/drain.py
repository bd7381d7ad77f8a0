"""The drain storm phase of `make bench` (``--phases drain``, issue #26): many nodes with a mix of
workload pods (hack/bench/drain_workload.py) faulted at once, drains all allowed at once; the bench plays
the checkpointing pods' side of the handshake and judges the operator by the audit log.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client

from devkit.audit import audit_events
from devkit.k8s import wait_for
from devkit.podorder import pod_writes
from hack.bench.cpu import CpuWindow, run_processes, stack_summaries
from hack.bench.drain_fleet import VerdictSampler, verdict_swings, writes_elsewhere
from hack.bench.drain_workload import (
    COMPLETED,
    DRAIN_NAMESPACE,
    DRAIN_XID,
    PDB_APP,
    PDB_REPLICAS,
    REQUESTED,
    WorkloadPod,
    double_actions,
    drain_mix,
    eviction_figures,
    min_ready,
    pdb_objects,
    pod_manifest,
)
from hack.bench.fleet import SimNode
from hack.bench.floors import FLOOR_DRAIN_NAMESPACE, FLOOR_PDB_LABEL, PodDrain, drain_pods, log_floor
from hack.bench.resilience import ResilienceContext
from hack.bench.support import GROUP, MERGE, VERSION, log, percentile, publish_all
from hack.bench.watch import _raw_watch


class PodWatch:
    """The drain storm's workload, played by the bench: each checkpointing pod acknowledges a request
    the moment it sees one (as hack/demo/common.py act_as_trainer does, with no save delay; retried on failure),
    and the PDB Deployment's Ready pods are counted after every event."""

    def __init__(
        self,
        api: client.ApiClient,
        ack_api: client.ApiClient,
        pool: ThreadPoolExecutor,
        namespace: str = DRAIN_NAMESPACE,
        on_acked: Callable[[str], object] | None = None,
    ) -> None:
        self.namespace = namespace
        self.on_acked = on_acked  # told each pod's name once its acknowledgement is written (the drain floor)
        self.core = client.CoreV1Api(api)
        self.ack_core = client.CoreV1Api(ack_api)
        self.pool = pool
        self.stop = threading.Event()
        self.synced = threading.Event()
        self.lock = threading.Lock()
        self.requested: dict[str, float] = {}
        self.acked: dict[str, float] = {}
        self.ack_failures = 0
        self.pdb_ready: dict[str, bool] = {}
        self.ready_samples: list[tuple[float, int]] = []

    def start(self) -> PodWatch:
        threading.Thread(target=self._run, name="bench-drain-pods", daemon=True).start()
        if not self.synced.wait(60):
            raise RuntimeError("drain pod watch did not sync in 60s")
        return self

    def _run(self) -> None:
        _raw_watch(
            lambda **kw: self.core.list_namespaced_pod(self.namespace, **kw),
            self._sync,
            self._event,
            self.stop,
        )

    def _sync(self, items: list[dict[str, Any]]) -> None:
        for o in items:
            self._event("ADDED", o)
        self.synced.set()

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        name, now = meta["name"], time.time()
        ann = meta.get("annotations") or {}
        if (meta.get("labels") or {}).get("app") == PDB_APP:
            ready = (
                kind != "DELETED"
                and not meta.get("deletionTimestamp")
                and any(
                    c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (obj.get("status") or {}).get("conditions") or []
                )
            )
            with self.lock:
                self.pdb_ready[name] = ready
                self.ready_samples.append((now, sum(self.pdb_ready.values())))
        asked = ann.get(REQUESTED)
        if kind == "DELETED" or not asked or ann.get(COMPLETED, "") >= asked:
            return
        # Every request is answered, a repeated one too (as the gpuhealth.workload sidecar does); the
        # audit log says whether gpuhealth asked a pod twice.
        key = f"{name}@{asked}"
        with self.lock:
            if key in self.requested:
                return
            self.requested[key] = now
        self.pool.submit(self._ack, name, key)

    def _ack(self, name: str, key: str) -> None:
        for attempt in range(5):
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() % 1 * 1e6):06d}Z"
            try:
                self.ack_core.patch_namespaced_pod(
                    name, self.namespace, {"metadata": {"annotations": {COMPLETED: stamp}}}, _preload_content=False
                )
            except Exception:
                with self.lock:
                    self.ack_failures += 1
                time.sleep(0.5 * (attempt + 1))
                continue
            with self.lock:
                self.acked[key] = time.time()
            if self.on_acked is not None:
                self.on_acked(name)
            return

    def ready_now(self) -> int:
        with self.lock:
            return sum(self.pdb_ready.values())


def running(core: client.CoreV1Api, namespace: str = DRAIN_NAMESPACE) -> tuple[int, int]:
    """(pods Running, pods) in the drain namespace."""
    items = json.loads(core.list_namespaced_pod(namespace, _preload_content=False).data)["items"]
    return sum(1 for p in items if (p.get("status") or {}).get("phase") == "Running"), len(items)


def measure_drain(
    ctx: ResilienceContext, nodes_n: int, per_node: int, sim_kubeconfig_api: client.ApiClient, timeout_s: float = 900.0
) -> dict[str, Any]:
    """The drain storm: ``nodes_n`` nodes with ``per_node`` workload pods each, faulted at once."""
    core, custom = client.CoreV1Api(ctx.admin), client.CustomObjectsApi(ctx.admin)
    nodes = ctx.take(nodes_n)
    spare = ctx.take(1)[0]  # where the PDB Deployment's replacements go
    mix = drain_mix(nodes, per_node)
    pdb_nodes = nodes[:PDB_REPLICAS]
    ctx.phase(
        f"drain storm: {len(nodes)} nodes x {per_node} pods ({len(mix)} bare, {PDB_REPLICAS} under a PDB) fault at once"
    )
    # The bench's own 1-GPU pods are bound to their node by their ReplicaSet's template: evicted, they would
    # come straight back and no drain would ever finish. The drained nodes (and the spare) run only the mix.
    apps = client.AppsV1Api(ctx.admin)
    for n in [*nodes, spare]:
        try:
            apps.delete_namespaced_replica_set(f"train-{n}", "bench", propagation_policy="Background")
        except client.ApiException as e:
            if e.status != 404:
                raise
    owned = f"app in ({','.join(f'train-{n}' for n in [*nodes, spare])})"

    # Their pods are deleted here, not left to the garbage collector: at 10,000 nodes its queue, behind the
    # earlier phases' 80,000 pods, held them past a fixed 120 s (the run at 168fb85 stopped there). They have
    # no grace period, so a delete is immediate. Each poll deletes what is left again: a ReplicaSet
    # controller that had not yet seen its ReplicaSet go may have made one more pod.
    def gone() -> bool:
        page = core.list_namespaced_pod("bench", label_selector=owned, limit=1, _preload_content=False)
        if not json.loads(page.data)["items"]:
            return True
        core.delete_collection_namespaced_pod("bench", label_selector=owned, grace_period_seconds=0)
        return False

    wait_for(gone, timeout=300, interval=1.0, what="the bench's pods off the drained nodes")
    ctx.cluster.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DRAIN_NAMESPACE}}])
    wait_for(lambda: core.read_namespaced_service_account("default", DRAIN_NAMESPACE), what="namespace ready")
    for n in pdb_nodes:
        core.patch_node(n, {"metadata": {"labels": {"bench-pdb": "true"}}}, _content_type=MERGE)

    def create(p: WorkloadPod) -> None:
        try:
            core.create_namespaced_pod(DRAIN_NAMESPACE, pod_manifest(p), _preload_content=False)
        except client.ApiException as e:
            if e.status != 409:
                raise

    failed = publish_all(ctx.pool, create, mix)
    ctx.cluster.apply_objects(pdb_objects())
    want = len(mix) + PDB_REPLICAS
    wait_for(lambda: running(core)[0] >= want, timeout=max(120.0, want * 0.05), interval=2.0, what="drain pods Running")
    # The PDB Deployment's replacements may land on the spare node only (the drained ones are tainted then).
    core.patch_node(spare, {"metadata": {"labels": {"bench-pdb": "true"}}}, _content_type=MERGE)
    watch = PodWatch(ctx.admin, sim_kubeconfig_api, ctx.pool).start()
    wait_for(lambda: watch.ready_now() == PDB_REPLICAS, timeout=60, what="the PDB's pods Ready")

    # Every fault drains (XID 74), every node may drain at once, the breaker open.
    pol = custom.get_cluster_custom_object(GROUP, VERSION, "gpuhealthpolicies", ctx.policy)
    overrides = [o for o in pol["spec"]["rules"]["xid"].get("overrides") or [] if o.get("code") != DRAIN_XID]
    custom.patch_cluster_custom_object(
        GROUP,
        VERSION,
        "gpuhealthpolicies",
        ctx.policy,
        {
            "spec": {
                "rules": {"xid": {"overrides": [*overrides, {"code": DRAIN_XID, "action": "drain"}]}},
                "safety": {"maxUnhealthy": "100%", "maxConcurrentDrains": 1000},
            }
        },
    )
    wait_for(
        lambda: (
            (custom.get_cluster_custom_object(GROUP, VERSION, "gpuhealthpolicies", ctx.policy).get("status") or {}).get(
                "observedGeneration"
            )
            == custom.get_cluster_custom_object(GROUP, VERSION, "gpuhealthpolicies", ctx.policy)["metadata"][
                "generation"
            ]
        ),
        timeout=60,
        what="the operator read the drain policy",
    )
    time.sleep(2 * ctx.tick)

    pids = run_processes(ctx.cluster, ctx.operators)
    cpu = CpuWindow(pids).start()
    fleet = list(ctx.sims)
    verdicts = VerdictSampler(lambda: ctx.report_watch.tally(fleet)).start()
    t0 = time.time()
    publish_all(ctx.pool, lambda s: s.fault(xid=DRAIN_XID), [ctx.sims[n] for n in nodes])
    published = time.time() - t0
    completed = ctx.report_watch.wait_drains(nodes, after=t0, timeout=timeout_s)
    done_s = max(completed.values()) - t0 if len(completed) == len(nodes) else None
    cpu_used = cpu.stop()  # from the faults to the last drain Completed (or the timeout)
    swings = verdict_swings(verdicts.stop(), t0)
    stacks = stack_summaries(pids, t0, time.time() + ctx.tick)
    time.sleep(2.0)  # the last requests reach the audit log
    watch.stop.set()

    entries = list(audit_events(ctx.cluster.audit_log, [ctx.operator_user]))
    writes = [w for w in pod_writes(entries, [DRAIN_NAMESPACE]) if w.at.timestamp() >= t0 - 1]
    annotated = {f"{DRAIN_NAMESPACE}/{p.name}" for p in mix if p.mode == "annotation"}
    problems = double_actions(writes, lambda pod: pod in annotated)
    refused = [
        e
        for e in entries
        if (e.get("objectRef") or {}).get("subresource") == "eviction"
        and (e.get("objectRef") or {}).get("namespace") == DRAIN_NAMESPACE
        and int((e.get("responseStatus") or {}).get("code") or 0) == 429
    ]
    pdb_evictions = sum(1 for w in writes if w.kind == "evict" and w.pod.startswith(f"{DRAIN_NAMESPACE}/{PDB_APP}-"))
    low = min_ready(watch.ready_samples, t0)
    res = {
        "nodes": len(nodes),
        "pods_per_node": per_node,
        "pods": want,
        "create_failures": failed,
        "mix": {
            "checkpoint": sum(1 for p in mix if p.mode == "annotation" and not p.gang),
            "sigterm": sum(1 for p in mix if p.mode == "signal"),
            "gang_pods": sum(1 for p in mix if p.gang),
            "gangs": len({p.gang for p in mix if p.gang}),
            "pdb_pods": PDB_REPLICAS,
        },
        "faulted_at": round(t0, 3),
        "publish_s": round(published, 2),
        **eviction_figures(writes, t0),
        "drains_completed": len(completed),
        "all_drains_completed_s": round(done_s, 1) if done_s is not None else None,
        "checkpoint_requests_seen": len(watch.requested),
        "checkpoint_acks": len(watch.acked),
        "ack_failures": watch.ack_failures,
        "request_to_ack_ms_p50": round(
            percentile([(watch.acked[n] - watch.requested[n]) * 1000 for n in watch.acked], 50), 1
        ),
        "double_actions": len(problems),
        "double_action_detail": problems[:5],
        "pdb": {
            "replicas": PDB_REPLICAS,
            "max_unavailable": 1,
            "evictions": pdb_evictions,
            "refused_429": len(refused),
            "min_ready_seen": low,
            "honoured": low is not None and low >= PDB_REPLICAS - 1,
        },
        "cpu": cpu_used,
        **({"operator_stacks": stacks} if stacks else {}),
        # The rest of the fleet meanwhile (drain_fleet.py): the operator's writes to nodes not drained
        # (until the audit log was read), and the fleet's verdicts sampled from the faults to the last drain.
        "elsewhere": writes_elsewhere(entries, nodes, t0),
        "verdicts": swings,
    }
    log(
        f"  {res['evictions']} evictions ({res['evictions_per_s']}/s sustained), {len(completed)}/{len(nodes)} drains "
        f"Completed in {res['all_drains_completed_s']}s; {res['checkpoint_requests']} requests, "
        f"{res['checkpoint_acks']} acks; {len(problems)} double actions; PDB min Ready {low}"
    )
    return res


def measure_drain_floor(
    ctx: ResilienceContext,
    floor_nodes: list[str],
    per_node: int,
    sim_kubeconfig_api: client.ApiClient,
    concurrency: int,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """The drain storm's no-logic floor (hack/bench/floors.py): the storm's pod mix on floor nodes (the
    last one the PDB Deployment's spare), in a namespace of its own, drained by ``PodDrain`` with the
    bench playing the pods' acknowledgements as in the storm; the floor's workload is deleted after."""
    core = client.CoreV1Api(ctx.admin)
    ns = FLOOR_DRAIN_NAMESPACE
    nodes, spare = floor_nodes[:-1], floor_nodes[-1]
    mix = drain_mix(nodes, per_node)
    ctx.phase(f"drain storm floor: {len(nodes)} floor nodes x {per_node} pods, drained with no logic")
    ctx.cluster.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}])
    wait_for(lambda: core.read_namespaced_service_account("default", ns), what="floor namespace ready")
    for n in nodes[:PDB_REPLICAS]:
        core.patch_node(n, {"metadata": {"labels": {FLOOR_PDB_LABEL: "true"}}}, _content_type=MERGE)

    def create(p: WorkloadPod) -> None:
        body = pod_manifest(p)
        body["metadata"]["namespace"] = ns
        try:
            core.create_namespaced_pod(ns, body, _preload_content=False)
        except client.ApiException as e:
            if e.status != 409:
                raise

    failed = publish_all(ctx.pool, create, mix)
    objects = pdb_objects()
    for o in objects:
        o["metadata"]["namespace"] = ns
    objects[0]["spec"]["template"]["spec"]["nodeSelector"] = {FLOOR_PDB_LABEL: "true"}
    ctx.cluster.apply_objects(objects)
    want = len(mix) + PDB_REPLICAS
    wait_for(
        lambda: running(core, ns)[0] >= want,
        timeout=max(120.0, want * 0.05),
        interval=2.0,
        what="floor drain pods Running",
    )
    core.patch_node(spare, {"metadata": {"labels": {FLOOR_PDB_LABEL: "true"}}}, _content_type=MERGE)
    hook: list[Callable[[str], object]] = []
    watch = PodWatch(
        ctx.admin, sim_kubeconfig_api, ctx.pool, namespace=ns, on_acked=lambda pod: [h(pod) for h in hook]
    ).start()
    try:
        wait_for(lambda: watch.ready_now() == PDB_REPLICAS, timeout=60, what="the floor PDB's pods Ready")
        listed = json.loads(core.list_namespaced_pod(ns, label_selector=f"app={PDB_APP}", _preload_content=False).data)
        pdb_pods = [o["metadata"]["name"] for o in listed["items"] if o["spec"].get("nodeName") in set(nodes)]
        pods = [(p.name, p.mode == "annotation") for p in mix] + [(name, False) for name in pdb_pods]
        t0 = time.time()
        publish_all(ctx.pool, lambda s: s.fault(xid=DRAIN_XID), [ctx.sims[n] for n in nodes])
        res = drain_pods(pods, PodDrain(core, ns), concurrency, timeout_s, t0, hook.append)
        res.update(
            {"nodes": len(nodes), "pods_per_node": per_node, "create_failures": failed, "acks": len(watch.acked)}
        )
    finally:
        watch.stop.set()
        core.delete_namespace(ns, propagation_policy="Background", _preload_content=False)
        for n in floor_nodes:
            core.patch_node(n, {"metadata": {"labels": {FLOOR_PDB_LABEL: None}}}, _content_type=MERGE)
        publish_all(ctx.pool, SimNode.reboot, [ctx.sims[n] for n in nodes])
    log_floor("drain storm", res)
    return res
