"""The fleet is never blind (issue #26): three phases of `make bench` that take the operator out of its
steady state, each selectable on its own (``--phases``, see hack/bench/cli.py and docs/bench.md).

- **warm restart**: restart the operator with every node evaluated; its writes during start-up (the
  audit log, the operator's user; target 0), the time to "watching", and from a restart to the first
  taint of a fault injected right after it;
- **failover**: two replicas under Kopf peering; SIGKILL the acting one with the standby running,
  inject a fault right after, time the kill to its taint; the killed one comes back as the new standby;
- **drain storm**: many nodes, each with a mix of workload pods (checkpointing pods whose handshake the
  bench plays, pods that finish on SIGTERM, gangs across node pairs, a small Deployment under a PDB of
  maxUnavailable 1), faulted at once with drains that may all run at once; evictions per second,
  time to every drain Completed, the handshake's requests and acknowledgements, no pod evicted or asked
  twice (the audit log), and the PDB honoured (its Ready pods never below replicas - 1).

The pure parts (the pod mix, the audit-log figures) are unit-tested in tests/unit/bench/test_resilience.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from tests.chaos.podorder import PodWrite, order_problems, pod_writes
from tests.support.k8s import OperatorProcess, wait_for

from hack.bench.cluster import BenchCluster
from hack.bench.fleet import SimNode
from hack.bench.support import (
    GROUP,
    MERGE,
    TAINT,
    VERSION,
    audit_files,
    describe,
    find_log_line,
    log,
    percentile,
    publish_all,
    read_audit,
)
from hack.bench.watch import NodeWatch, ReportWatch, _raw_watch

REPO = Path(__file__).resolve().parents[2]
PEERING_CRD = REPO / "manifests" / "crds" / "kopf-peering-crd.yaml"
PEERING_OBJECT = REPO / "manifests" / "base" / "peering.yaml"
PEERING_NAME = "gpuhealth"

DRAIN_NAMESPACE = "bench-drain"
DRAIN_XID = 74  # NVLink error: a node-scope fault the bench's policy answers with a drain (XID 79 only cordons)
CHECKPOINT = "gpuhealth.dev/checkpoint"
REQUESTED = "gpuhealth.dev/checkpoint-requested"
COMPLETED = "gpuhealth.dev/checkpoint-completed"
GANG_LABEL = "jobset.sigs.k8s.io/jobset-name"  # a gang: checkpointed and evicted together (drain/pods.py)
PDB_APP, PDB_REPLICAS = "pdb-app", 3
WATCHING = r"watching \d+ GPU nodes"
ACTING = r"acting \(this replica leads\)"


# -- the drain storm's workload (pure) ----------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadPod:
    name: str
    node: str
    mode: str  # the pod's checkpoint mode: "annotation" (the handshake) or "signal" (finishes on SIGTERM)
    gang: str | None = None


def drain_mix(nodes: Sequence[str], per_node: int) -> list[WorkloadPod]:
    """The drain storm's bare pods, ``per_node`` on each node: two ranks of a gang spanning a pair of
    nodes (annotation mode: the whole gang checkpoints, then leaves together), then alternately a pod
    that acknowledges a checkpoint request and one that finishes on SIGTERM."""
    out: list[WorkloadPod] = []
    for i, node in enumerate(nodes):
        ranks = min(2, per_node) if len(nodes) > 1 else 0
        gang = f"gang-{i // 2:04d}" if i // 2 * 2 + 1 < len(nodes) else None
        if gang is None:
            ranks = 0  # the odd node out has no partner
        for r in range(ranks):
            out.append(WorkloadPod(f"{gang}-{i % 2}-{r}", node, "annotation", gang))
        for k in range(per_node - ranks):
            mode = "annotation" if k % 2 == 0 else "signal"
            out.append(WorkloadPod(f"{'ckpt' if mode == 'annotation' else 'term'}-{node}-{k}", node, mode))
    return out


def pod_manifest(p: WorkloadPod) -> dict[str, Any]:
    labels = {"bench-drain": "true", **({GANG_LABEL: p.gang} if p.gang else {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": p.name,
            "namespace": DRAIN_NAMESPACE,
            "labels": labels,
            "annotations": {CHECKPOINT: p.mode},
        },
        "spec": {
            "nodeName": p.node,
            "containers": [{"name": "work", "image": "train:latest"}],
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def pdb_objects() -> list[dict[str, Any]]:
    """A small Deployment (pods that finish on SIGTERM) on the nodes labelled bench-pdb, and its PDB."""
    labels = {"app": PDB_APP}
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": PDB_APP, "namespace": DRAIN_NAMESPACE},
            "spec": {
                "replicas": PDB_REPLICAS,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels, "annotations": {CHECKPOINT: "signal"}},
                    "spec": {
                        "nodeSelector": {"bench-pdb": "true"},
                        "containers": [{"name": "serve", "image": "serve:latest"}],
                        "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                        "terminationGracePeriodSeconds": 0,
                    },
                },
            },
        },
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": PDB_APP, "namespace": DRAIN_NAMESPACE},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}},
        },
    ]


# -- the audit log (pure) -------------------------------------------------------------------------------


def raw_audit(path: Path, user: str) -> Iterator[dict[str, Any]]:
    """The user's completed requests as the API server logged them (json), oldest file first."""
    for part in audit_files(path):
        with open(part, errors="replace") as f:
            for line in f:
                if user not in line:
                    continue
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if ev.get("stage") == "ResponseComplete" and (ev.get("user") or {}).get("username") == user:
                    yield ev


def eviction_figures(writes: Sequence[PodWrite], t0: float) -> dict[str, Any]:
    """Evictions and checkpoint requests of one drain storm, from the operator's successful pod writes.

    ``evictions_per_s`` is the sustained rate, first eviction to last ((n - 1) / span: n evictions
    have n - 1 gaps); the time from the faults to the last eviction is beside it.
    """
    evicted = sorted(w.at.timestamp() for w in writes if w.kind == "evict")
    requests = sum(1 for w in writes if w.kind == "request")
    span = evicted[-1] - evicted[0] if len(evicted) > 1 else 0.0
    per_s: list[int] = []
    for t in evicted:
        i = int(t - evicted[0])
        per_s.extend([0] * (i + 1 - len(per_s)))
        per_s[i] += 1
    return {
        "evictions": len(evicted),
        "checkpoint_requests": requests,
        "evictions_per_s": round((len(evicted) - 1) / span, 1) if span > 0 else None,
        "peak_evictions_in_a_second": max(per_s, default=0),
        "first_eviction_s": round(evicted[0] - t0, 2) if evicted else None,
        "last_eviction_s": round(evicted[-1] - t0, 2) if evicted else None,
    }


def double_actions(writes: Sequence[PodWrite], needs_request: Callable[[str], bool]) -> list[str]:
    """Pods evicted or asked more than once, or evicted before being asked (tests/chaos/podorder.py)."""
    return order_problems(writes, needs_request)


def min_ready(samples: Iterable[tuple[float, int]], after: float) -> int | None:
    """The fewest Ready pods of the PDB's Deployment at any sample from ``after`` on."""
    inside = [n for t, n in samples if t >= after]
    return min(inside) if inside else None


def failover_summary(samples_s: Sequence[float | None], timeout_s: float) -> dict[str, Any]:
    """p50/max over the failover samples; a fault never tainted counts as the timeout (a lower bound)."""
    missed = sum(1 for s in samples_s if s is None)
    values = [s for s in samples_s if s is not None] + [timeout_s] * missed
    return {
        "p50_s": round(percentile(values, 50), 2) if values else None,
        "max_s": round(max(values), 2) if values else None,
        "samples": len(values),
        "timeouts": missed,
        "kill_to_taint_s": [None if s is None else round(s, 2) for s in samples_s],
    }


# -- the run -------------------------------------------------------------------------------------------


@dataclass
class ResilienceContext:
    """What the three phases share with the rest of the run."""

    cluster: BenchCluster
    out: Path
    admin: client.ApiClient
    operator_kubeconfig: Path
    operator_user: str
    sims: Mapping[str, SimNode]
    node_watch: NodeWatch
    report_watch: ReportWatch
    pool: ThreadPoolExecutor
    tick: float
    policy: str
    phase: Callable[[str], None]
    # Every operator process started here (the run's finally stops them all).
    operators: list[OperatorProcess] = field(default_factory=list)
    spare: list[str] = field(default_factory=list)  # governed nodes free of faults, taken in turn

    def take(self, n: int) -> list[str]:
        if len(self.spare) < n:
            raise RuntimeError(f"not enough fault-free nodes left: {n} wanted, {len(self.spare)} left")
        out, self.spare = self.spare[:n], self.spare[n:]
        return out

    def start_operator(self, name: str, extra: Sequence[str] = ()) -> tuple[OperatorProcess, Path, float]:
        """An operator process with its own log; (process, log, start time)."""
        path = self.out / f"operator-{name}.log"
        op = OperatorProcess(
            self.cluster,
            path,
            extra_args=[f"--kubeconfig={self.operator_kubeconfig}", f"--tick={self.tick}", *extra],
        )
        t0 = time.time()
        op.start(wait=False)
        self.operators.append(op)
        return op, path, t0

    def writes_between(self, start: float, end: float) -> list[Any]:
        return [e for e in read_audit(self.cluster.audit_log, self.operator_user) if e.write and start <= e.at < end]


def measure_restart(
    ctx: ResilienceContext, operator: OperatorProcess, governed: Sequence[str], first_startup_s: float = 0.0
) -> tuple[dict[str, Any], OperatorProcess]:
    """Warm restart: two restarts of an operator whose fleet is evaluated; returns the figures and the
    operator left running.

    The first has a fault injected the moment the process starts: the restart to that fault's taint
    is the time the fleet was blind. The second is quiet, with that node quarantined beside the
    evaluated rest: its writes from process start until three sweeps after "watching" are the
    start-up's (target 0: nothing changed while it was down); the window is at least as long as the
    run's first start-up took to evaluate every node (``first_startup_s``), so a fleet-sized start-up
    is counted whole.
    """
    ctx.phase("warm restart: the operator restarts with every node evaluated")
    operator.stop()
    (node,) = ctx.take(1)
    op, path, t0 = ctx.start_operator("restart-1")
    ctx.sims[node].fault()
    published = time.time()
    tainted = ctx.node_watch.wait_taint(node, TAINT, timeout=600)
    found1 = find_log_line(path, WATCHING, timeout=60)
    blind = {
        "first_startup_watching_s": round(found1[0] - t0, 2) if found1 else None,
        "fault_published_after_s": round(published - t0, 2),
        "restart_to_first_taint_s": round(tainted - t0, 2) if tainted else None,
        "fault_to_taint_s": round(tainted - published, 2) if tainted else None,
    }
    log(f"  restart 1: a fault published at start was tainted {blind['restart_to_first_taint_s']}s after the restart")
    wait_ready(op, path)
    ctx.report_watch.wait_states([node], "Quarantined", timeout=60)
    time.sleep(3 * ctx.tick)  # its Events and the policy's counts are written before the quiet restart

    states = ("Healthy", "Quarantined", "Draining", "AwaitingRepair", "Degraded")
    evaluated = {s: ctx.report_watch.count(governed, s) for s in states}
    op.stop()
    op, path, t0 = ctx.start_operator("restart-2")
    found = find_log_line(path, WATCHING, timeout=600)
    watching_s = round(found[0] - t0, 2) if found else None
    time.sleep(max(3 * ctx.tick, first_startup_s - (time.time() - t0)))
    t1 = time.time()
    time.sleep(1.0)  # the audit log is written as each request completes
    writes = ctx.writes_between(t0, t1)
    log(f"  restart 2: watching after {watching_s}s; {len(writes)} writes in the {t1 - t0:.0f}s after start")
    res = {
        "evaluated_nodes": sum(evaluated.values()),
        "evaluated_by_state": {s: n for s, n in evaluated.items() if n},
        "startup_watching_s": watching_s,
        "startup_window_s": round(t1 - t0, 1),
        "startup_writes": len(writes),
        "startup_writes_by_kind": describe(writes),
        **blind,
    }
    return res, op


def wait_ready(op: OperatorProcess, path: Path) -> None:
    if find_log_line(path, WATCHING, timeout=600) is None:
        raise RuntimeError(f"operator did not start watching; see {path}")


def measure_failover(
    ctx: ResilienceContext, operator: OperatorProcess, samples: int, timeout_s: float = 180.0
) -> tuple[dict[str, Any], list[OperatorProcess]]:
    """Failover under Kopf peering: ``samples`` times SIGKILL the acting replica, fault a fresh node at
    once, and time the kill to its taint (seen by the bench's Node watch); the killed replica comes back
    as the new standby (a lower priority than the survivor, so it never takes over by priority)."""
    ctx.phase(f"failover: two replicas under Kopf peering, {samples} SIGKILLs of the acting one")
    operator.stop()
    ctx.cluster.apply(PEERING_CRD)
    ctx.cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/clusterkopfpeerings.kopf.dev")
    ctx.cluster.apply(PEERING_OBJECT)
    prio = 1000
    live: list[tuple[OperatorProcess, Path, int]] = []
    # One after the other, as a rollout starts them: started at the same instant, the second may act for
    # a moment before the first one's keep-alive reaches it.
    for name in ("a", "b"):
        op, path, _ = ctx.start_operator(f"peer-{name}", [f"--peering={PEERING_NAME}", f"--priority={prio}"])
        live.append((op, path, prio))
        prio -= 1
        wait_ready(op, path)
        if name == "a" and find_log_line(path, ACTING, timeout=120) is None:
            raise RuntimeError(f"replica a never acted; see {path}")
    time.sleep(3.0)  # both keep-alives are in the peering object
    kill_to_taint: list[float | None] = []
    kill_to_acting: list[float | None] = []
    for i in range(samples):
        (node,) = ctx.take(1)
        acting, _, _ = live.pop(0)
        standby_path = live[0][1]
        # A standby may have acted for a moment at its own start, before the leader's keep-alive reached
        # it: only its takeover after this kill counts.
        offset = standby_path.stat().st_size
        t_kill = time.time()
        acting.kill()
        ctx.sims[node].fault()
        tainted = ctx.node_watch.wait_taint(node, TAINT, timeout=timeout_s)
        kill_to_taint.append(None if tainted is None else round(tainted - t_kill, 2))
        took = find_log_line(standby_path, ACTING, timeout=5, offset=offset)
        kill_to_acting.append(round(took[0] - t_kill, 2) if took else None)
        log(f"  sample {i + 1}: kill to taint {kill_to_taint[-1]}")
        op, path, _ = ctx.start_operator(f"peer-{i}", [f"--peering={PEERING_NAME}", f"--priority={prio}"])
        live.append((op, path, prio))
        prio -= 1
        wait_ready(op, path)
        time.sleep(3.0)  # its keep-alive is in, and the survivor has seen it
    res = failover_summary(kill_to_taint, timeout_s)
    res["kill_to_acting_s"] = kill_to_acting
    return res, [op for op, _, _ in live]


class PodWatch:
    """The drain storm's workload, played by the bench: each checkpointing pod acknowledges a request
    the moment it sees one (as hack/demo.py act_as_trainer does, with no save delay; retried on failure),
    and the PDB Deployment's Ready pods are counted after every event."""

    def __init__(self, api: client.ApiClient, ack_api: client.ApiClient, pool: ThreadPoolExecutor) -> None:
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
            lambda **kw: self.core.list_namespaced_pod(DRAIN_NAMESPACE, **kw),
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
                    name, DRAIN_NAMESPACE, {"metadata": {"annotations": {COMPLETED: stamp}}}, _preload_content=False
                )
            except Exception:
                with self.lock:
                    self.ack_failures += 1
                time.sleep(0.5 * (attempt + 1))
                continue
            with self.lock:
                self.acked[key] = time.time()
            return

    def ready_now(self) -> int:
        with self.lock:
            return sum(self.pdb_ready.values())


def _running(core: client.CoreV1Api) -> tuple[int, int]:
    """(pods Running, pods) in the drain namespace."""
    items = json.loads(core.list_namespaced_pod(DRAIN_NAMESPACE, _preload_content=False).data)["items"]
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
    wait_for(
        lambda: (
            not json.loads(
                core.list_namespaced_pod("bench", label_selector=owned, limit=1, _preload_content=False).data
            )["items"]
        ),
        timeout=120,
        interval=1.0,
        what="the bench's pods off the drained nodes",
    )
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
    wait_for(
        lambda: _running(core)[0] >= want, timeout=max(120.0, want * 0.05), interval=2.0, what="drain pods Running"
    )
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

    t0 = time.time()
    publish_all(ctx.pool, lambda s: s.fault(xid=DRAIN_XID), [ctx.sims[n] for n in nodes])
    published = time.time() - t0
    completed = ctx.report_watch.wait_drains(nodes, after=t0, timeout=timeout_s)
    done_s = max(completed.values()) - t0 if len(completed) == len(nodes) else None
    time.sleep(2.0)  # the last requests reach the audit log
    watch.stop.set()

    entries = list(raw_audit(ctx.cluster.audit_log, ctx.operator_user))
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
    }
    log(
        f"  {res['evictions']} evictions ({res['evictions_per_s']}/s sustained), {len(completed)}/{len(nodes)} drains "
        f"Completed in {res['all_drains_completed_s']}s; {res['checkpoint_requests']} requests, "
        f"{res['checkpoint_acks']} acks; {len(problems)} double actions; PDB min Ready {low}"
    )
    return res
