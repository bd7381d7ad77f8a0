"""What must hold after (and, where it can be sampled, during) every chaos scenario.

Everything is read from the API (Nodes, GPUNodeHealth reports, the operator's Events in `default`)
and from the API server's audit log, where the operator runs under its own token so its requests
are told apart from the scenario's own:

- each pod is evicted at most once per drain and, if its checkpoint mode needs a request, asked to
  checkpoint before its eviction, at most once (`Evicted`/`CheckpointRequested` Events, and the
  order of the operator's successful `pods/eviction` creates and pod patches in the audit log;
  podorder.py);
- every gpuhealth taint or cordon has a recorded reason (the Node's `gpuhealth.dev/quarantine`
  annotation and the report's `status.reason`);
- no cordon or taint placed by someone else was lifted, against the foreign writer's own log
  (foreign.py; sampled continuously and checked by the writer before each of its writes);
- while the annotation says gpuhealth's taint is on, the taint is on (sampled continuously);
- the final state of every node is what the policy says for its final facts;
- nothing is Healthy without a fresh report: the heartbeat changed within agentSilence.after by the
  sampler's clock and by the agent's, and no Node says Healthy once its report is gone (freshness.py;
  sampled).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from devkit.audit import audit_events
from devkit.cluster import LocalCluster
from devkit.k8s import Kube
from devkit.podorder import order_problems, pod_writes
from devkit.timeparse import now as now
from devkit.timeparse import parse_time as parse_time
from hack.chaos.foreign import ForeignLog
from hack.chaos.foreign import foreign_problems as foreign_log_problems
from hack.chaos.freshness import Freshness, node_says_healthy


class Ctx(Protocol):
    """What the checks read of a scenario's context (hack/chaos/scenarios/context.py's ``Ctx``). A protocol,
    so the checks never import the scenarios that import them."""

    cluster: LocalCluster
    kube: Kube
    group: str
    started: dt.datetime
    stats: dict[str, Any]
    all_nodes: list[str]
    namespaces: list[str]
    expect: dict[str, str]
    foreign: ForeignLog
    checkpoint_namespaces: set[str]
    workload_saw: dict[str, dt.datetime]
    breakers: dict[str, tuple[list[str], int]]
    allow_lifts: bool
    operator_users: tuple[str, ...]

    def silence_after(self, node: str) -> float: ...


TAINT = "gpuhealth.dev/unhealthy"
QUARANTINE = "gpuhealth.dev/quarantine"
STATE_LABEL = "gpuhealth.dev/state"
COMPONENT = "gpuhealth-operator"
GROUP, VERSION = "gpuhealth.dev", "v1alpha1"
OUT_OF_SERVICE = {"Quarantined", "Draining", "AwaitingRepair", "Recovering"}
FAULTED = {"Quarantined", "Draining", "AwaitingRepair"}
# Sampled checks tolerate the operator's reaction time: one sweep (--tick=1) plus a reconcile.
FRESHNESS_SLACK_S = 5.0

_EVICTED = re.compile(r"^Evicted ([^\s:]+)")
_REQUESTED = re.compile(r"^Asked ([^\s:]+) to checkpoint")


# -- sources ---------------------------------------------------------------------------------------


def operator_events(ctx: Ctx) -> list[dict[str, Any]]:
    """The operator's Events in `default` since the scenario began, as plain dicts."""
    items: list[dict[str, Any]] = []
    cont = None
    while True:
        resp = ctx.kube.core.list_namespaced_event("default", limit=500, _continue=cont, _preload_content=False)
        data = json.loads(resp.data)
        items.extend(data.get("items") or [])
        cont = (data.get("metadata") or {}).get("continue")
        if not cont:
            break
    out = []
    for e in items:
        src = (e.get("source") or {}).get("component") or e.get("reportingComponent")
        if src != COMPONENT:
            continue
        t = parse_time(e.get("eventTime")) or parse_time(e.get("firstTimestamp"))
        if t is not None and t < ctx.started - dt.timedelta(seconds=2):
            continue
        out.append(e)
    return out


def events_on(events: Iterable[Mapping[str, Any]], name: str, reason: str | None = None) -> list[Mapping[str, Any]]:
    return [
        e
        for e in events
        if (e.get("involvedObject") or {}).get("name") == name and (reason is None or e.get("reason") == reason)
    ]


# -- pods: at most one eviction and one checkpoint request per drain ----------------------------------


def event_counts(ctx: Ctx, events: list[dict[str, Any]]) -> tuple[Counter[str], Counter[str]]:
    """(Evicted, CheckpointRequested) Events per pod on this scenario's nodes."""
    evicted: Counter[str] = Counter()
    requested: Counter[str] = Counter()
    nodes = set(ctx.all_nodes)
    for e in events:
        if (e.get("involvedObject") or {}).get("name") not in nodes:
            continue
        msg = e.get("message") or ""
        if e.get("reason") in ("Evicted", "EvictedCrashLooping") and (m := _EVICTED.match(msg)):
            evicted[m.group(1)] += int(e.get("count") or 1)
        elif e.get("reason") == "CheckpointRequested" and (m := _REQUESTED.match(msg)):
            requested[m.group(1)] += int(e.get("count") or 1)
    return evicted, requested


def check_pods(ctx: Ctx, events: list[dict[str, Any]]) -> list[str]:
    """Each pod asked and evicted at most once; a pod whose mode needs a request asked before its
    eviction (the audit log's order; devkit/podorder.py)."""
    out = []
    evicted, requested = event_counts(ctx, events)
    for what, counter in (("Evicted events", evicted), ("CheckpointRequested events", requested)):
        for pod, n in sorted(counter.items()):
            if n > 1:
                out.append(f"pod {pod}: {n} {what} (at most 1 per drain)")
    writes = pod_writes(audit_events(ctx.cluster.audit_log, ctx.operator_users, ctx.started), ctx.namespaces)
    out += order_problems(writes, lambda pod: pod.split("/")[0] in ctx.checkpoint_namespaces, ctx.workload_saw)
    ctx.stats["pods_evicted"] = len({w.pod for w in writes if w.kind == "evict"})
    ctx.stats["checkpoints_requested"] = len({w.pod for w in writes if w.kind == "request"})
    return out


# -- nodes ---------------------------------------------------------------------------------------------


def _annotation(node: Mapping[str, Any]) -> dict[str, Any] | None:
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(QUARANTINE)
    if raw is None:
        return None
    try:
        d = json.loads(raw)
        return d if isinstance(d, dict) else {"reason": ""}
    except ValueError:
        return {"reason": ""}


def _our_taint(node: Mapping[str, Any]) -> dict[str, Any] | None:
    return next((t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") == TAINT), None)


def _condition(node: Mapping[str, Any]) -> dict[str, Any] | None:
    conds = (node.get("status") or {}).get("conditions") or []
    return next((c for c in conds if c.get("type") == "GPUHealthy"), None)


def snapshot(ctx: Ctx) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The scenario's Nodes and reports, by name (one LIST each)."""
    sel = f"chaos-group={ctx.group}"
    nodes = {
        n["metadata"]["name"]: n
        for n in json.loads(ctx.kube.core.list_node(label_selector=sel, _preload_content=False).data)["items"]
    }
    reports = {
        r["metadata"]["name"]: r
        for r in ctx.kube.custom.list_cluster_custom_object(GROUP, VERSION, "gpunodehealths").get("items") or []
        if r["metadata"]["name"] in nodes or r["metadata"]["name"] in ctx.all_nodes
    }
    return nodes, reports


def _heartbeat_age(report: Mapping[str, Any] | None, at: dt.datetime) -> float | None:
    hb = parse_time(((report or {}).get("spec") or {}).get("heartbeatTime"))
    return None if hb is None else (at - hb).total_seconds()


def marks_problems(ctx: Ctx, name: str, node: Mapping[str, Any]) -> list[str]:
    """Atomic facts of one Node object: gpuhealth's marks carry a reason; foreign marks stay."""
    out = []
    ann = _annotation(node)
    taint = _our_taint(node)
    if taint is not None and (ann is None or not ann.get("reason")):
        out.append(f"{name}: gpuhealth taint {taint.get('value')!r} without a recorded reason (annotation {ann})")
    if ann is not None and ann.get("cordon") and not ann.get("reason"):
        out.append(f"{name}: gpuhealth cordon without a recorded reason")
    if ann is not None and ann.get("taint") and taint is None and not ctx.allow_lifts:
        out.append(f"{name}: the annotation says gpuhealth's taint is on, but the taint is gone (lost)")
    return out


def foreign_problems(ctx: Ctx, name: str, node: Mapping[str, Any]) -> list[str]:
    """Foreign taints and cordons, against the foreign writer's own log (hack/chaos/foreign.py)."""
    return foreign_log_problems(ctx.foreign, name, node)


def expectation_problems(
    ctx: Ctx, name: str, node: Mapping[str, Any] | None, report: Mapping[str, Any] | None, at: dt.datetime
) -> list[str]:
    """Whether one node's final state is what the policy says for its final facts."""
    want = ctx.expect.get(name)
    if want is None or want == "any":
        return []
    if node is None:
        return [f"{name}: node is gone"]
    status = (report or {}).get("status") or {}
    state = status.get("state")
    taint = _our_taint(node)
    ann = _annotation(node)
    cond = _condition(node)
    unsched = bool((node.get("spec") or {}).get("unschedulable"))
    label = ((node.get("metadata") or {}).get("labels") or {}).get(STATE_LABEL)
    out = []
    if want == "healthy":
        if state != "Healthy":
            out.append(f"{name}: expected Healthy (clean facts for longer than probation), is {state}")
        if taint is not None or ann is not None:
            out.append(f"{name}: Healthy but gpuhealth's taint/annotation remain ({taint}, {ann})")
        foreign = ctx.foreign.latest(name)
        if unsched and not (foreign and foreign.cordon):
            out.append(f"{name}: Healthy but still cordoned, and nobody else cordoned it")
        if label != "Healthy" or (cond or {}).get("status") != "True":
            out.append(f"{name}: Healthy but label {label!r} / condition {(cond or {}).get('status')!r}")
        age = _heartbeat_age(report, at)
        if age is None or age > ctx.silence_after(name) + FRESHNESS_SLACK_S:
            out.append(f"{name}: Healthy without a fresh report (heartbeat age {age})")
    elif want in ("out", "out_or_held"):
        if want == "out_or_held" and state == "Degraded" and status.get("heldByBreaker"):
            if taint is not None:
                out.append(f"{name}: held back by the breaker but tainted")
        elif state not in FAULTED:
            out.append(f"{name}: faulty facts, expected out of service, is {state}")
        elif taint is None:
            out.append(f"{name}: {state} but without gpuhealth's taint")
        elif taint.get("value") != (status.get("reason") or "")[:63]:
            out.append(f"{name}: taint value {taint.get('value')!r} != recorded reason {status.get('reason')!r}")
        elif ann is not None and ann.get("cordon") and not unsched:
            out.append(f"{name}: gpuhealth owns a cordon that is not there")
    elif want == "out_of_service":  # faulted or on probation: never back in service
        if state not in OUT_OF_SERVICE or taint is None:
            out.append(f"{name}: expected to stay out of service, is {state} (taint {taint})")
    elif want == "held":
        if not (state == "Degraded" and status.get("heldByBreaker")) or taint is not None:
            out.append(f"{name}: expected held back by the breaker, is {state} (taint {taint})")
    elif want == "unknown":
        if state != "Unknown" or (cond or {}).get("status") != "Unknown":
            hb_age = _heartbeat_age(report, at)
            ahead = (
                f"; its heartbeatTime is {-hb_age:.0f}s ahead of this clock"
                if hb_age is not None and hb_age < -60
                else ""
            )
            out.append(f"{name}: expected Unknown (agent silent), is {state} / condition {cond}{ahead}")
        if taint is not None:
            out.append(f"{name}: Unknown under an observe-only silence action, but tainted")
    elif want == "no_report":
        if node_says_healthy(node):
            out.append(f"{name}: its report is gone, but the Node still says Healthy")
    elif want == "untouched":
        if taint is not None or ann is not None or (state in OUT_OF_SERVICE):
            out.append(f"{name}: gpuhealth acted on input it should have refused ({state}, taint {taint})")
    else:
        out.append(f"{name}: unknown expectation {want!r}")
    if taint is not None and not status.get("reason"):
        out.append(f"{name}: gpuhealth taint but the report's status.reason is empty")
    return out


# Expectations that waiting cannot fix: once violated, polling on is pointless.
STABLE = {"untouched"}


def check_nodes(ctx: Ctx, settle: float = 30.0) -> list[str]:
    """Final node state, polled until it holds or ``settle`` seconds pass (the operator converges)."""
    deadline = time.monotonic() + settle
    while True:
        problems: list[str] = []
        converging = False
        try:
            nodes, reports = snapshot(ctx)
            at = now()
            for name in ctx.all_nodes:
                node = nodes.get(name)
                found = expectation_problems(ctx, name, node, reports.get(name), at)
                if node is not None:
                    found = marks_problems(ctx, name, node) + foreign_problems(ctx, name, node) + found
                converging = converging or bool(found and ctx.expect.get(name) not in STABLE)
                problems += found
        except Exception as e:  # the API may still be coming back
            problems, converging = [f"could not read the final state: {e}"], True
        if not converging or time.monotonic() >= deadline:
            return problems
        time.sleep(1.0)


def check_all(ctx: Ctx, settle: float = 30.0) -> list[str]:
    out = check_nodes(ctx, settle)
    try:
        events = operator_events(ctx)
        out += check_pods(ctx, events)
    except Exception as e:
        out.append(f"could not read Events/audit log: {e}")
    return out


# -- continuous sampling ---------------------------------------------------------------------------------


class Sampler:
    """Samples what must hold at every instant, not just at the end (a LIST of nodes and reports
    every ``interval`` seconds, as the admin, so the operator's audit counts stay its own)."""

    def __init__(self, ctx: Ctx, interval: float = 0.5) -> None:
        self.ctx = ctx
        self.interval = interval
        self.violations: dict[str, str] = {}  # dedup key -> first message
        self.samples = 0
        self.max_out: dict[str, int] = {}
        self.fresh = Freshness(slack=FRESHNESS_SLACK_S)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> list[str]:
        self._stop.set()
        self._thread.join(10)
        return list(self.violations.values())

    def _add(self, key: str, msg: str) -> None:
        self.violations.setdefault(key, msg)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                nodes, reports = snapshot(self.ctx)
            except Exception:
                self.fresh.unreadable()
                continue  # the API server may be down on purpose
            self.samples += 1
            at = now()
            mono = time.monotonic()
            for name, node in nodes.items():
                for p in marks_problems(self.ctx, name, node) + foreign_problems(self.ctx, name, node):
                    self._add(f"marks/{name}/{p.split(':', 1)[1][:40]}", f"[sampled {at:%H:%M:%S}] {p}")
                after = self.ctx.silence_after(name)
                for kind, p in self.fresh.observe(mono, at, name, reports.get(name), node, after):
                    self._add(f"{kind}/{name}", f"[sampled {at:%H:%M:%S}] {p}")
            for pname, (members, limit) in self.ctx.breakers.items():
                out = sum(1 for n in members if n in nodes and _our_taint(nodes[n]) is not None)
                self.max_out[pname] = max(self.max_out.get(pname, 0), out)
                if out > limit:
                    self._add(
                        f"breaker/{pname}",
                        f"[sampled {at:%H:%M:%S}] policy {pname}: {out} nodes tainted, over the breaker limit {limit}",
                    )
