"""Scenario: per-GPU quarantine and device drains while the operator is SIGKILLed, beside a foreign
writer of DeviceTaintRules.

DRA-published fake nodes (one ResourceSlice each, as NVIDIA's driver publishes it) run pods whose
single GPU comes from a ResourceClaimTemplate, each declaring the checkpoint handshake
(``gpuhealth.dev/checkpoint: annotation``). Each round an uncorrected ECC error hits the GPU one pod
holds; the operator must hold out that GPU only (one DeviceTaintRule), ask that pod to checkpoint,
evict it, and give the GPU back after probation. Meanwhile it is SIGKILLed at random instants and
at the moments of a device drain that matter most: right as the write-ahead record (the status
with the GPU's rule name) lands, before or while the rule is created; at the first checkpoint
request; right after the workload acknowledges (the eviction is next). A foreign writer creates,
changes and deletes DeviceTaintRules of its own on the same and other GPUs, and logs each write.
The last round's fault stays, so the final state has one rule per bad GPU.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubernetes import client

from devkit import dra
from devkit.audit import audit_events
from devkit.k8s import healthy_spec, wait_for
from devkit.podorder import pod_writes
from gpuhealth.workload import COMPLETED
from hack.chaos import devicerules as dr
from hack.chaos import invariants as inv
from hack.chaos.scenarios.common import drain_policy
from hack.chaos.scenarios.context import Ctx
from hack.chaos.scenarios.monkey import KillMonkey

RULES = "devicetaintrules"
PODS_PER_NODE = 3


def ecc(bad: int) -> dict[str, Any]:
    spec = healthy_spec()
    spec["devices"][bad]["ecc"]["volatileUncorrected"] = 1
    return spec


def _device(status: Mapping[str, Any], index: int) -> dict[str, Any]:
    return next((d for d in status.get("devices") or [] if d.get("index") == index), {})


def _rules(ctx: Ctx, pools: set[str]) -> list[dict[str, Any]]:
    items = ctx.retry(ctx.kube.custom.list_cluster_custom_object, dra.G, dra.V, RULES).get("items") or []
    return [r for r in items if dr.selector(r)[1] in pools]


class ForeignRuleWriter:
    """Another tool (an SRE's script, a vendor's health checker) keeping DeviceTaintRules of its own on
    the scenario's GPUs: creates, replaces (PUT at the resourceVersion it read) and deletes only its
    own, effect ``None`` so it never changes what the scheduler allocates, and logs each write's
    resulting generation and spec (devicerules.ForeignRuleLog)."""

    def __init__(self, ctx: Ctx, nodes: list[str], bad: Callable[[], list[dr.Device]]) -> None:
        self.ctx, self.nodes, self.bad = ctx, nodes, bad
        self.log = dr.ForeignRuleLog()
        self.live: dict[str, dict[str, Any]] = {}  # name -> the spec it wants
        self.writes = 0
        self.idle = threading.Event()
        self.stop = ctx.background(self._loop, "foreign-rule-writer")

    def _spec(self, rng: random.Random) -> dict[str, Any]:
        bad = self.bad()
        if bad and rng.random() < 0.5:
            _, pool, device = rng.choice(bad)  # the GPU gpuhealth is taking out, too
        else:
            pool, device = rng.choice(self.nodes), f"gpu-{rng.randrange(8)}"
        return {
            "deviceSelector": {"driver": dra.DRIVER, "pool": pool, "device": device},
            "taint": {"key": "example.com/suspect", "value": f"v{rng.randrange(100)}", "effect": "None"},
        }

    def _loop(self, stop: threading.Event) -> None:
        rng = random.Random(self.ctx.rng.random())
        custom = self.ctx.kube.custom
        i = 0
        while not stop.wait(rng.uniform(0.2, 0.8)):
            op = rng.choice(["create", "create", "replace", "delete"]) if self.live else "create"
            if op == "create" and len(self.live) >= 6:
                op = "delete"
            name = f"{self.ctx.group}-sre-{i}" if op == "create" else rng.choice(sorted(self.live))
            self.log.begin(name)
            try:
                if op == "create":
                    i += 1
                    spec = self._spec(rng)
                    body = {"apiVersion": f"{dra.G}/{dra.V}", "kind": "DeviceTaintRule", "metadata": {"name": name}}
                    got = custom.create_cluster_custom_object(dra.G, dra.V, RULES, {**body, "spec": spec})
                elif op == "replace":
                    cur = custom.get_cluster_custom_object(dra.G, dra.V, RULES, name)
                    spec = {**cur["spec"], "taint": {**self._spec(rng)["taint"]}}
                    got = custom.replace_cluster_custom_object(dra.G, dra.V, RULES, name, {**cur, "spec": spec})
                else:
                    custom.delete_cluster_custom_object(dra.G, dra.V, RULES, name)
                    self.live.pop(name, None)
                    self.log.record(name, 0, None)
                    self.writes += 1
                    self.ctx.fault(kind="foreign_write")
                    continue
            except client.ApiException as e:
                self.log.abort(name)
                if e.status == 404 and op != "create":  # its own rule, gone: someone else deleted it
                    self.ctx.violate(f"[foreign rule writer {self.ctx.clock()}] its DeviceTaintRule {name} is gone")
                    self.live.pop(name, None)  # the log still wants it: the final check reports it too
                elif e.status not in (409, 429, 500, 503):
                    raise
                continue
            except Exception:
                self.log.abort(name)  # the API may be slow: the write is retried by the next op
                continue
            self.live[name] = spec
            self.log.record(name, dr.generation(got), spec)
            self.writes += 1
            self.ctx.fault(kind="foreign_write")

    def finish(self) -> None:
        self.stop.set()
        wait_for(lambda: not self.log.in_flight(), timeout=30, what="foreign rule writer idle")


def _watch_once(
    ctx: Ctx,
    monkey: KillMonkey,
    seen: Callable[[], bool],
    why: str,
    after_kill: Callable[[], None] | None = None,
) -> None:
    """SIGKILL the operator the first time ``seen()`` holds (polled every 30 ms); ``after_kill`` looks
    at what the dead operator left."""

    def watch(stop: threading.Event) -> None:
        while not stop.wait(0.03):
            with contextlib.suppress(Exception):
                if seen():
                    monkey.bounce(why, after_kill=after_kill)
                    return

    ctx.background(watch, f"kill-at-{why.replace(' ', '-')}")


def _sample(ctx: Ctx, pools: set[str], seen: dict[str, str], stop: threading.Event) -> None:
    """Every half second: gpuhealth's rules one per device under their deterministic names, and no
    node cordoned or tainted for a device-scope fault."""
    sel = f"chaos-group={ctx.group}"
    while not stop.wait(0.5):
        try:
            problems = dr.sample_problems(_rules(ctx, pools))
            for n in ctx.kube.core.list_node(label_selector=sel).items:
                if n.metadata.name not in pools:  # the squat node may rightly be quarantined whole
                    continue
                node = ctx.kube.api.sanitize_for_serialization(n)
                problems += dr.node_mark_problems(n.metadata.name, node, inv.TAINT)
        except Exception:
            continue
        for p in problems:
            if p not in seen:
                seen[p] = p
                ctx.violate(f"[sampled {ctx.clock()}] {p}")


def device_kills(ctx: Ctx) -> None:
    """Device quarantine and drain, round after round, SIGKILLed at its write-ahead moments."""
    width = ctx.n(3, 1)
    rounds = ctx.n(9, 3)
    nodes = ctx.make_nodes(width)
    pools = set(nodes)
    dra.publish_device_classes(ctx.kube)
    slices = ctx.retry(dra.publish_slices, ctx.kube, nodes, uuid=dra.report_uuid)
    ctx.extra_cleanup.append(lambda: _delete_slices(ctx, slices))
    ctx.extra_cleanup.append(lambda: _delete_rules(ctx, pools))
    ns = ctx.namespace()
    ctx.checkpoint_namespaces.add(ns)
    ctx.retry(dra.create_claim_template, ctx.kube, ns, "one-gpu", 1)
    ctx.policy(drain_policy(maxUnhealthyGPUs=100))
    for n in nodes:
        ctx.put_report(n, healthy_spec())
    op = ctx.operator()
    ctx.wait_states(nodes, lambda s: s.get("state") == "Healthy", 60, "all Healthy")
    ctx.acknowledger([ns])
    current_bad: list[dr.Device] = []
    writer = ForeignRuleWriter(ctx, nodes, lambda: list(current_bad))
    squat = _squat(ctx, writer)
    sampled: dict[str, str] = {}
    ctx.background(lambda stop: _sample(ctx, pools, sampled, stop), "device-rule-sampler")
    monkey = KillMonkey(ctx, op, gap=(2.0, 7.0), down=(0.0, 2.0))
    held: dict[str, list[dr.Device]] = {}
    bad_of_pod: dict[str, set[dr.Device]] = {}
    moments = ("device record written", "first checkpoint request", "checkpoint acknowledged")
    for r in range(rounds):
        last = r == rounds - 1
        pods: dict[str, list[str]] = {}
        for n_i, node in enumerate(nodes):
            pods[node] = [f"r{r}-n{n_i}-{k}" for k in range(PODS_PER_NODE)]
            for pod in pods[node]:
                body = dra.claim_pod(ns, pod, "one-gpu", node)
                body["metadata"]["annotations"] = {"gpuhealth.dev/checkpoint": "annotation"}
                ctx.retry(ctx.kube.core.create_namespaced_pod, ns, body)
        bad: dict[str, int] = {}
        for node in nodes:
            for pod in pods[node]:
                (dev,) = dra.wait_allocated(ctx.kube, ns, pod, timeout=90)
                held[f"{ns}/{pod}"] = [(dra.DRIVER, node, dev)]
            bad[node] = int(held[f"{ns}/{pods[node][0]}"][0][2].removeprefix("gpu-"))
        current_bad[:] = [(dra.DRIVER, node, f"gpu-{bad[node]}") for node in nodes]
        for node in nodes:
            for pod in pods[node]:
                bad_of_pod[f"{ns}/{pod}"] = {(dra.DRIVER, node, f"gpu-{bad[node]}")}
        moment = moments[r % len(moments)]
        if moment == "device record written":

            def recorded(bad: dict[str, int] = bad) -> bool:
                st = ctx.statuses(nodes)
                names = {_device(st.get(n, {}), bad[n]).get("taintRule") for n in nodes} - {None, ""}
                if names:  # killed next: was the rule already there (after step 2) or not yet (between)?
                    there = {x["metadata"]["name"] for x in _rules(ctx, pools)}
                    key = "record_kills_rule_there" if names <= there else "record_kills_rule_missing"
                    ctx.stats[key] = ctx.stats.get(key, 0) + 1
                return bool(names)

            _watch_once(ctx, monkey, recorded, moment)
        elif moment == "first checkpoint request":
            monkey.at_first_checkpoint_request(ns)
        else:

            def acknowledged() -> bool:
                return any((p.metadata.annotations or {}).get(COMPLETED) for p in ctx.pods(ns))

            _watch_once(ctx, monkey, acknowledged, moment)
        for node in nodes:
            ctx.put_report(node, ecc(bad[node]))
            ctx.fault(kind="gpu")

        def drained(s: dict[str, Any], node: str, bad: dict[str, int] = bad) -> bool:
            d = _device(s, bad[node])
            return d.get("state") == "Quarantined" and s.get("state") == "Degraded"

        def all_drained(drained: Callable[[dict[str, Any], str], bool] = drained) -> bool:
            st = ctx.statuses(nodes)
            return all(drained(st.get(n, {}), n) for n in nodes)

        wait_for(all_drained, timeout=180, interval=0.3, what=f"round {r}: the bad GPUs drained")
        alive = {p.metadata.name for p in ctx.pods(ns)}
        for node in nodes:
            if pods[node][0] in alive:
                ctx.violate(f"round {r}: {node}'s GPU {bad[node]} drained, but its pod {pods[node][0]} remains")
            gone = [p for p in pods[node][1:] if p not in alive]
            if gone:
                ctx.violate(f"round {r}: pods on {node}'s healthy GPUs are gone: {gone}")
        ctx.cycles += 1
        if last:
            break
        for node in nodes:
            ctx.put_report(node, healthy_spec())  # the GPU was reset: clean facts
        ctx.wait_states(nodes, lambda s: s.get("state") == "Healthy", 120, f"round {r}: GPUs back in service")
        wait_for(
            lambda: not [x for x in _rules(ctx, pools) if dr.is_ours(x)], timeout=60, what=f"round {r}: rules deleted"
        )
        for pod in [p.metadata.name for p in ctx.pods(ns)]:
            with contextlib.suppress(client.ApiException):
                ctx.kube.core.delete_namespaced_pod(pod, ns, grace_period_seconds=0)
        wait_for(lambda: not ctx.kube.core.list_namespaced_pod(ns).items, timeout=90, what=f"round {r}: pods gone")
    monkey.finish()
    writer.finish()
    final_checks(ctx, nodes, ns, current_bad, held, bad_of_pod, writer)
    ctx.stats["foreign_rules_at_end"] = sum(1 for w in writer.log.latest().values() if w.spec is not None)
    _squat_check(ctx, *squat)
    for n in nodes:
        ctx.expect[n] = "any"  # Degraded with one GPU held out: judged above, per GPU
    ctx.stats["operator_kills"] = monkey.kills
    ctx.stats["targeted_kills"] = monkey.targeted
    ctx.stats["kills_by_moment"] = monkey.by_mode
    ctx.stats["foreign_rule_writes"] = writer.writes
    ctx.expect[squat[0]] = "any"  # judged by _squat_check
    ctx.note(
        f"{ctx.cycles} device quarantine/drain rounds on {width} DRA node(s) ({PODS_PER_NODE} one-GPU claim pods "
        f"each), {monkey.kills} SIGKILLs (by moment: {monkey.by_mode}), {writer.writes} foreign DeviceTaintRule writes"
    )


def final_checks(
    ctx: Ctx,
    nodes: list[str],
    ns: str,
    bad: list[dr.Device],
    held: Mapping[str, list[dr.Device]],
    bad_of_pod: Mapping[str, Iterable[dr.Device]],
    writer: ForeignRuleWriter,
    more: Callable[[list[dict[str, Any]]], list[str]] = lambda rules: [],
) -> None:
    """The end of a device scenario (this one's and partition_kills'): one rule per bad device, and
    whatever ``more`` finds in the rules (a partition left allocatable); foreign rules untouched; no
    pod evicted whose devices were all healthy; no node tainted or cordoned; gpuhealth's rule creates."""
    pools = set(nodes)

    def final() -> list[str]:
        rules = _rules(ctx, pools)
        return dr.final_rule_problems(rules, pools, bad) + more(rules)

    with contextlib.suppress(AssertionError):
        wait_for(lambda: not final(), timeout=30, what="final rules")
    for p in final():
        ctx.violate(p)
    live = ctx.retry(ctx.kube.custom.list_cluster_custom_object, dra.G, dra.V, RULES).get("items") or []
    audit = list(audit_events(ctx.cluster.audit_log, ctx.operator_users, ctx.started))
    for p in dr.foreign_rule_problems(writer.log.latest(), live, audit, writer.log.in_flight()):
        ctx.violate(p)
    evicted = {w.pod for w in pod_writes(audit, [ns]) if w.kind == "evict"}
    for pod in sorted(evicted):
        for p in dr.healthy_gpu_evictions([pod], held, bad_of_pod.get(pod, ())):
            ctx.violate(p)
    for node in nodes:
        spec = ctx.retry(ctx.kube.core.read_node, node).spec
        obj = {"spec": {"unschedulable": spec.unschedulable, "taints": [{"key": t.key} for t in spec.taints or []]}}
        for p in dr.node_mark_problems(node, obj, inv.TAINT):
            ctx.violate(p)
    ctx.stats["gpuhealth_rule_creates"] = sum(
        1
        for e in audit
        if (e.get("objectRef") or {}).get("resource") == RULES
        and e.get("verb") == "create"
        and int((e.get("responseStatus") or {}).get("code") or 0) < 300
    )


SQUAT_GPU = 5


def _squat(ctx: Ctx, writer: ForeignRuleWriter) -> tuple[str, str]:
    """One more DRA node whose GPU 5 already has a foreign rule under the very name gpuhealth would give
    its own (``gpuhealth-<pool>-gpu-5``, without gpuhealth's label, effect ``None``), then an
    uncorrected ECC error on that GPU. gpuhealth must still hold the GPU out somehow (a rule of its
    own, or the node) and must not touch the foreign rule."""
    (node,) = ctx.make_nodes(1)
    slices = ctx.retry(dra.publish_slices, ctx.kube, [node], uuid=dra.report_uuid)
    ctx.extra_cleanup.append(lambda: _delete_slices(ctx, slices))
    ctx.extra_cleanup.append(lambda: _delete_rules(ctx, {node}))
    name = f"gpuhealth-{node}-gpu-{SQUAT_GPU}"
    spec = {
        "deviceSelector": {"driver": dra.DRIVER, "pool": node, "device": f"gpu-{SQUAT_GPU}"},
        "taint": {"key": "example.com/suspect", "value": "squat", "effect": "None"},
    }
    body = {"apiVersion": f"{dra.G}/{dra.V}", "kind": "DeviceTaintRule", "metadata": {"name": name}, "spec": spec}
    writer.log.begin(name)
    got = ctx.retry(ctx.kube.custom.create_cluster_custom_object, dra.G, dra.V, RULES, body)
    writer.log.record(name, dr.generation(got), spec)
    ctx.fault(kind="foreign_write")
    ctx.put_report(node, ecc(SQUAT_GPU))
    ctx.fault(kind="gpu")
    return node, name


def _squat_check(ctx: Ctx, node: str, name: str) -> None:
    dev = (dra.DRIVER, node, f"gpu-{SQUAT_GPU}")

    def held_out() -> bool:
        ours = [r for r in _rules(ctx, {node}) if dr.is_ours(r) and dr.selector(r) == dev]
        tainted = any(t.key == inv.TAINT for t in ctx.retry(ctx.kube.core.read_node, node).spec.taints or [])
        return bool(ours) or tainted

    with contextlib.suppress(AssertionError):
        wait_for(held_out, timeout=15, what="the squatted GPU held out")
    status = ctx.statuses([node]).get(node, {})
    record = _device(status, SQUAT_GPU)
    ctx.stats["squatted_gpu"] = {"node_state": status.get("state"), "gpu_state": record.get("state")}
    if held_out():
        return
    audit = list(audit_events(ctx.cluster.audit_log, ctx.operator_users, ctx.started))
    refused = sum(
        1
        for e in audit
        if (e.get("objectRef") or {}).get("name") == name
        and e.get("verb") == "create"
        and (e.get("responseStatus") or {}).get("code") == 409
    )
    ctx.violate(
        f"{node} GPU {SQUAT_GPU}: its DeviceTaintRule name {name} is taken by a foreign rule, and gpuhealth holds "
        f"the GPU out neither by a rule of its own nor by the node's taint (its record: {record.get('state')}, "
        f"taintRule {record.get('taintRule')!r}; {refused} creates of that name answered 409)"
    )


def _delete_rules(ctx: Ctx, pools: set[str]) -> None:
    """gpuhealth's rules outlive the killed operator, and the foreign writer's stay: neither may leak
    into the next scenario."""
    for r in _rules(ctx, pools):
        with contextlib.suppress(client.ApiException):
            ctx.kube.custom.delete_cluster_custom_object(dra.G, dra.V, RULES, r["metadata"]["name"])


def _delete_slices(ctx: Ctx, slices: list[str]) -> None:
    ctx.cluster.kubectl("delete", "resourceslices", *slices, "--ignore-not-found", check=False)
