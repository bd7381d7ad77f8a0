"""The context every scenario runs in: what it created (to clean up) and what it found."""

from __future__ import annotations

import contextlib
import datetime as dt
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client

from devkit.agents import AgentFleet
from devkit.cluster import LocalCluster
from devkit.k8s import Kube, OperatorProcess, utcnow, wait_for
from devkit.workloads import indexed_training_job
from gpuhealth.api.durations import parse_duration
from hack.chaos import invariants as inv
from hack.chaos.foreign import ForeignLog
from hack.chaos.scenarios.checkpoints import acknowledging
from hack.chaos.scenarios.cluster import AGENT, IDENTITIES, OPERATOR_USERS

T = TypeVar("T")
# How often the scenarios' stand-in agents (the heartbeater) re-send a report: every scenario's
# agentSilence.after is a few of these, short enough that a stale Healthy verdict is caught.
HEARTBEAT_S = 2.5
# What the report counts apart: processes killed or crashed, writes by another controller, invalid
# or hostile objects sent, reports gone wrong (a clock ahead, a report deleted), and the simulated
# GPU faults the scenarios react to.
FAULT_CLASSES = {
    "operator_kill": "process",
    "agent_kill": "process",
    "apiserver_crash": "process",
    "etcd_crash": "process",
    "foreign_write": "foreign_writes",
    "bad_input": "hostile_objects",
    "gpu": "gpu_faults",
    "agent_clock_ahead": "agent_faults",
    "report_deleted": "agent_faults",
}


def xid(code: int, gpu: int = 0) -> dict[str, Any]:
    return {"xid": code, "gpu": gpu, "time": utcnow(), "source": "simulated"}


def _retryable(e: BaseException) -> bool:
    if isinstance(e, client.ApiException):
        return e.status in (0, 429, 500, 502, 503, 504)
    return isinstance(e, OSError) or type(e).__module__.startswith("urllib3")


# -- the context --------------------------------------------------------------------------------------


@dataclass
class Ctx:
    """Everything a scenario touches, and what it found."""

    name: str
    cluster: LocalCluster
    workdir: Path
    quick: bool = False
    seed: int = 0
    group: str = ""
    kube: Kube = field(init=False)
    rng: random.Random = field(init=False)
    started: dt.datetime = field(default_factory=inv.now)
    cycles: int = 0  # repetitions within this one episode (not independent runs)
    faults: dict[str, int] = field(default_factory=dict)  # by kind
    notes: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    all_nodes: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    policies: list[str] = field(default_factory=list)
    expect: dict[str, str] = field(default_factory=dict)
    foreign: ForeignLog = field(default_factory=ForeignLog)
    # Namespaces whose every pod declares `gpuhealth.dev/checkpoint: annotation` (asked before eviction),
    # and when the workload first saw each pod's request (a second witness next to the audit log).
    checkpoint_namespaces: set[str] = field(default_factory=set)
    workload_saw: dict[str, dt.datetime] = field(default_factory=dict)
    # The last report spec put for each node (the heartbeater re-sends it with a fresh heartbeatTime),
    # and the nodes it leaves silent on purpose.
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    quiet: set[str] = field(default_factory=set)
    _report_locks: dict[str, threading.Lock] = field(default_factory=dict)
    _heartbeating: bool = False
    _beat_stop: threading.Event = field(default_factory=threading.Event)
    silence: dict[str, float] = field(default_factory=dict)
    default_silence: float = 120.0
    breakers: dict[str, tuple[list[str], int]] = field(default_factory=dict)
    allow_lifts: bool = False
    operator_users: tuple[str, ...] = OPERATOR_USERS
    operators: list[OperatorProcess] = field(default_factory=list)
    fleets: list[AgentFleet] = field(default_factory=list)
    extra_cleanup: list[Callable[[], None]] = field(default_factory=list)
    _stops: list[Callable[[], None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.kube = Kube(self.cluster.kubeconfig)
        self.rng = random.Random(self.seed)
        self.group = self.group or f"{self.name.replace('_', '-')[:24]}-{self.seed % 10000:04d}"
        self.workdir.mkdir(parents=True, exist_ok=True)

    # bookkeeping
    def n(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    def fault(self, count: int = 1, kind: str = "gpu") -> None:
        """Count something injected, by kind (FAULT_CLASSES says how the report groups it)."""
        if kind not in FAULT_CLASSES:
            raise ValueError(f"unknown fault kind {kind!r}")
        with self._lock:
            self.faults[kind] = self.faults.get(kind, 0) + count

    def note(self, msg: str) -> None:
        self.notes.append(msg)

    def violate(self, msg: str) -> None:
        with self._lock:
            self.violations.append(msg)

    def silence_after(self, node: str) -> float:
        return self.silence.get(node, self.default_silence)

    # API helpers
    def retry(self, fn: Callable[..., T], *args: Any, timeout: float = 60.0, **kw: Any) -> T:
        """Call ``fn`` until the API answers (it may be throttled or restarting on purpose)."""
        deadline = time.monotonic() + timeout
        delay = 0.2
        while True:
            try:
                return fn(*args, **kw)
            except Exception as e:
                if not _retryable(e) or time.monotonic() > deadline:
                    raise
                time.sleep(delay)
                delay = min(2.0, delay * 2)

    def put_report(self, node: str, spec: Mapping[str, Any]) -> None:
        """Write a report as an agent would; from then on the heartbeater keeps it fresh."""
        with self._lock:
            lock = self._report_locks.setdefault(node, threading.Lock())
        with lock:
            self.reports[node] = dict(spec)
            self.retry(self.kube.put_report, node, spec)
        if not self._heartbeating:  # its own thread, not a background task: it runs until cleanup
            self._heartbeating = True
            threading.Thread(
                target=self._guard, args=(self._heartbeats, self._beat_stop, "heartbeater"), daemon=True
            ).start()

    def _heartbeats(self, stop: threading.Event) -> None:
        """Like an agent, re-send each node's last report with a fresh heartbeatTime every
        HEARTBEAT_S seconds, so a short agentSilence.after holds in every scenario for the right reason."""
        while not stop.wait(HEARTBEAT_S):
            for node in list(self.reports):
                if node in self.quiet:
                    continue
                with self._report_locks[node]:
                    if stop.is_set() or node in self.quiet:
                        return
                    # The API may be down on purpose; the next beat tries again.
                    with contextlib.suppress(Exception):
                        self.kube.put_report(node, {**self.reports[node], "heartbeatTime": utcnow()})

    def go_quiet(self, node: str) -> None:
        """Stop heartbeats for ``node`` (its agent fell silent)."""
        with self._lock:
            lock = self._report_locks.setdefault(node, threading.Lock())
        with lock:
            self.quiet.add(node)

    def foreign_check(self, name: str, node: Mapping[str, Any]) -> list[str]:
        return inv.foreign_problems(self, name, node)

    @staticmethod
    def clock() -> str:
        return f"{inv.now():%H:%M:%S.%f}"[:-3]

    def statuses(self, names: Iterable[str]) -> dict[str, dict[str, Any]]:
        wanted = set(names)
        items = self.retry(self.kube.custom.list_cluster_custom_object, inv.GROUP, inv.VERSION, "gpunodehealths")
        return {r["metadata"]["name"]: r.get("status") or {} for r in items["items"] if r["metadata"]["name"] in wanted}

    def wait_states(
        self,
        names: Iterable[str],
        pred: Callable[[dict[str, Any]], bool],
        timeout: float,
        what: str,
        interval: float = 0.3,
    ) -> float:
        """Wait until ``pred(status)`` holds for every node; returns the seconds it took."""
        names = list(names)
        t0 = time.monotonic()

        def done() -> bool:
            st = self.statuses(names)
            return all(pred(st.get(n, {})) for n in names)

        wait_for(done, timeout=timeout, interval=interval, what=what)
        return time.monotonic() - t0

    def wait_schedulable(self, names: Iterable[str], timeout: float, what: str) -> None:
        """Wait until the Nodes carry neither gpuhealth's taint nor a cordon: a Healthy verdict is
        recorded first and the Node follows it (later still when the operator is killed in between),
        and the node controller lifts its `node.kubernetes.io/unschedulable` taint a moment after the
        cordon goes."""
        names = list(names)

        def clear() -> bool:
            for n in names:
                spec = self.retry(self.kube.core.read_node, n).spec
                keys = [t.key for t in spec.taints or []]
                if spec.unschedulable or any(k == inv.TAINT or k.startswith("node.kubernetes.io/") for k in keys):
                    return False
            return True

        wait_for(clear, timeout=timeout, interval=0.3, what=what)

    def make_nodes(self, count: int, labels: Mapping[str, str] | None = None) -> list[str]:
        names = self.retry(
            self.cluster.add_gpu_nodes,
            count,
            prefix=f"{self.group}-",
            start=len(self.all_nodes),
            labels={"chaos-group": self.group, **(labels or {})},
        )
        self.all_nodes += names
        self.cluster.wait_nodes_ready(len(self.all_nodes), selector=f"chaos-group={self.group}")
        return names

    def policy(
        self,
        spec: Mapping[str, Any],
        name: str | None = None,
        match: Mapping[str, str] | None = None,
        nodes: Iterable[str] | None = None,
    ) -> str:
        """A policy for this scenario's nodes (or those also matching ``match``)."""
        name = name or self.group
        body = {"nodeSelector": {"matchLabels": {"chaos-group": self.group, **(match or {})}}, **spec}
        self.retry(self.kube.apply_policy, name, body)
        self.policies.append(name)
        after = parse_duration(((spec.get("rules") or {}).get("agentSilence") or {}).get("after", "2m"))
        if nodes is None:
            self.default_silence = after
        else:
            for n in nodes:
                self.silence[n] = after
        return name

    def operator(
        self, identity: str = "a", extra_args: Iterable[str] = (), env: dict[str, str] | None = None
    ) -> OperatorProcess:
        token, user = IDENTITIES[identity]
        kc = self.cluster.kubeconfig_with_token(token, self.workdir / f"operator-{identity}.kubeconfig", user)
        op = OperatorProcess(
            self.cluster,
            self.workdir / f"operator-{identity}.log",
            extra_args=[f"--kubeconfig={kc}", *extra_args],
            env=dict(env or {}),
        )
        self.operators.append(op)
        return op.start()

    def agents(self, nodes: list[str], heartbeat: float = 2.0, interval: float = 0.5) -> AgentFleet:
        kc = self.cluster.kubeconfig_with_token(AGENT[0], self.workdir / "agent.kubeconfig", AGENT[1])
        fleet = AgentFleet(kc, self.workdir / "agents", interval=interval, heartbeat=heartbeat)
        self.fleets.append(fleet)
        return fleet.start(nodes)

    def namespace(self, suffix: str = "work") -> str:
        name = f"{self.group}-{suffix}"[:63].strip("-")
        try:
            self.retry(self.kube.core.create_namespace, {"metadata": {"name": name}})
        except client.ApiException as e:
            if e.status != 409:
                raise
        wait_for(lambda: self.kube.core.read_namespaced_service_account("default", name), what="service account")
        self.namespaces.append(name)
        return name

    def pods(self, ns: str) -> list[Any]:
        items = self.retry(self.kube.core.list_namespaced_pod, ns).items
        return [p for p in items if not p.metadata.deletion_timestamp]

    def training_job(self, ns: str, name: str, target: str, ranks: int = 4, gpus: int = 2) -> None:
        """An indexed Job (a gang of ``ranks``) that checkpoints on request, preferring ``target``."""
        self.checkpoint_namespaces.add(ns)  # the job declares `gpuhealth.dev/checkpoint: annotation`
        body = indexed_training_job(
            name, target, ranks=ranks, gpus=gpus, backoff_limit=50, node_selector={"chaos-group": self.group}
        )
        self.retry(self.kube.batch.create_namespaced_job, ns, body)

    def wait_job_on(self, ns: str, name: str, target: str, ranks: int = 4, timeout: float = 90.0) -> None:
        def placed() -> bool:
            ps = [p for p in self.pods(ns) if (p.metadata.labels or {}).get("app") == name]
            running = [p for p in ps if p.status.phase == "Running" and p.spec.node_name == target]
            return len(running) == ranks

        wait_for(placed, timeout=timeout, what=f"job {name} running on {target}")

    def delete_job(self, ns: str, name: str) -> None:
        try:
            self.retry(self.kube.batch.delete_namespaced_job, name, ns, propagation_policy="Background")
        except client.ApiException as e:
            if e.status != 404:
                raise

    def background(self, fn: Callable[[threading.Event], None], name: str) -> threading.Event:
        """Run ``fn(stop)`` in a thread until cleanup (or until the returned event is set)."""
        stop = threading.Event()
        t = threading.Thread(target=self._guard, args=(fn, stop, name), name=name, daemon=True)
        t.start()

        def halt() -> None:
            stop.set()
            t.join(30)

        self._stops.append(halt)
        return stop

    def _guard(self, fn: Callable[[threading.Event], None], stop: threading.Event, name: str) -> None:
        try:
            fn(stop)
        except Exception as e:
            self.violate(f"background task {name} failed: {e!r}")

    def acknowledger(self, namespaces: list[str], max_delay: float = 1.5) -> threading.Event:
        """Workloads that save a checkpoint (taking up to ``max_delay`` s) and acknowledge each request."""
        loop = acknowledging(self.kube, self.rng, namespaces, max_delay, self.workload_saw)
        return self.background(loop, "acknowledger")

    def stop_background(self) -> None:
        for halt in self._stops:
            halt()
        self._stops.clear()

    def cleanup(self) -> None:
        self._beat_stop.set()
        self.stop_background()
        # Policies go first, while an operator still runs: Kopf keeps a finalizer on them.
        for p in self.policies:
            with contextlib.suppress(Exception):
                self.kube.delete_policy(p)
        deadline = time.monotonic() + 10
        while self.policies and time.monotonic() < deadline:
            if not [p for p in self.policies if _exists(self.kube, p)]:
                break
            time.sleep(0.5)
        for op in self.operators:
            with contextlib.suppress(Exception):
                op.kill()
        for p in self.policies:  # no operator left to remove its finalizer: do it for the next scenario
            with contextlib.suppress(Exception):
                self.kube.custom.patch_cluster_custom_object(
                    inv.GROUP,
                    inv.VERSION,
                    "gpuhealthpolicies",
                    p,
                    {"metadata": {"finalizers": None}},
                    _content_type="application/merge-patch+json",
                )
        for fleet in self.fleets:
            fleet.stop()
        for fn in self.extra_cleanup:
            with contextlib.suppress(Exception):
                fn()
        if self.all_nodes:
            self.cluster.kubectl("delete", "node", "-l", f"chaos-group={self.group}", "--wait=false", check=False)
            self.cluster.kubectl(
                "delete", "gpunodehealths", *self.all_nodes, "--ignore-not-found", "--wait=false", check=False
            )
        for ns in self.namespaces:
            self.cluster.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


def _exists(kube: Kube, policy: str) -> bool:
    try:
        kube.get_policy(policy)
        return True
    except client.ApiException as e:
        return bool(e.status != 404)
