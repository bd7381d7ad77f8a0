"""Scenario: a bad GPU held out with all of its partitions while the operator is SIGKILLed (#23).

Two DRA nodes published exactly as NVIDIA's driver shapes them (devkit/dra_shapes.py): one
with static MIG GPUs (a MIG-enabled GPU is published only as its MIG devices, over two slices), one
partitionable (DynamicMIG: each GPU is its full device and every placement, consuming one counter
set). Each round, pods holding one MIG device each (the checkpoint handshake declared) are placed,
and an uncorrected ECC error hits the GPU the first pod of each node sits on: the operator must
write one DeviceTaintRule per device of that GPU (its status record first), ask the pods on that
GPU to checkpoint and evict them, and leave the pods on other GPUs alone; then clean facts give the
GPU back. It is SIGKILLed at random instants and at the moments that matter, two a round in turn:
the write-ahead record naming the GPU's rules lands, then the first checkpoint request; between two
rule creates of one GPU (a watch sees the first of its rules appear), then right after the
acknowledgement.
A foreign writer keeps DeviceTaintRules of its own on the same devices. The last round's fault
stays: the final state has exactly one gpuhealth rule per device of each bad GPU.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from kubernetes import watch

from devkit import dra
from devkit import dra_shapes as S
from devkit.k8s import healthy_spec, wait_for
from gpuhealth.workload import COMPLETED
from hack.chaos import devicerules as dr
from hack.chaos.scenarios import device_kills as dk
from hack.chaos.scenarios.common import drain_policy
from hack.chaos.scenarios.context import Ctx
from hack.chaos.scenarios.monkey import KillMonkey

RULES = dk.RULES
OUT = ("Quarantined", "Draining", "AwaitingRepair", "Recovering")
# Two moments a round, an early one and a later one (the first kill's restart goes on to the second),
# the pairs in turn: in two rounds every moment is hit once.
MOMENTS = (
    ("device record written", "first checkpoint request"),
    ("between rule creates", "checkpoint acknowledged"),
)
CONVERGE_S = 45.0  # a device left without its rule this long while its GPU is recorded out: a violation
# Static MIG: GPU 2 with two 3g.40gb devices, GPU 5 with four 1g.10gb ones; the others full GPUs.
STATIC_MIG = {2: (("3g.40gb", 0), ("3g.40gb", 4)), 5: (("1g.10gb", 0), ("1g.10gb", 1), ("1g.10gb", 2), ("1g.10gb", 3))}
PROFILES = ("1g.10gb", "3g.40gb", "7g.80gb")  # partitionable: 11 devices per GPU
PART_GPUS = 2


def healthy(node: str) -> dict[str, Any]:
    return dra.with_node_uuids(healthy_spec(), node)


def ecc(node: str, bad: int) -> dict[str, Any]:
    spec = healthy(node)
    spec["devices"][bad]["ecc"]["volatileUncorrected"] = 1
    return spec


def gpu_of(device: str) -> int:
    """``gpu-<minor>`` and ``gpu-<minor>-mig-...``: the GPU a device or partition belongs to."""
    return int(device.split("-")[1])


def _published(static: str, part: str) -> dict[str, S.Published]:
    gpus = [S.Gpu(i, dra.node_uuid(static, i), STATIC_MIG.get(i, ())) for i in range(8)]
    return {
        static: S.static_slices(static, gpus, slices=2),
        part: S.partitionable_slices(
            part, [S.Gpu(i, dra.node_uuid(part, i)) for i in range(PART_GPUS)], profiles=PROFILES
        ),
    }


def _devices_of(pub: dict[str, S.Published], node: str, index: int) -> set[dr.Device]:
    return {(dra.DRIVER, node, d) for d in pub[node].devices.get(dra.node_uuid(node, index), set())}


def _held_out(ctx: Ctx, pub: dict[str, S.Published]) -> dict[str, set[dr.Device]]:
    """The GPUs the status records out of service -> every device the scenario published for them."""
    out = {}
    for node, status in ctx.statuses(pub).items():
        for d in status.get("devices") or []:
            if d.get("state") in OUT:
                out[f"{node} GPU {d.get('index')}"] = _devices_of(pub, node, int(d.get("index") or 0))
    return out


def _coverage_sampler(ctx: Ctx, pub: dict[str, S.Published], stop: threading.Event) -> None:
    """Every half second: a device of a held-out GPU without its rule for longer than CONVERGE_S."""
    since: dict[str, float] = {}
    reported: set[str] = set()
    while not stop.wait(0.5):
        try:
            problems = dr.partition_coverage_problems(_held_out(ctx, pub), dk._rules(ctx, set(pub)))
        except Exception:
            continue
        t = time.monotonic()
        current = {p.split(" is recorded")[0]: p for p in problems}
        for gpu in list(since):
            if gpu not in current:
                since.pop(gpu)
        for gpu, p in current.items():
            if t - since.setdefault(gpu, t) > CONVERGE_S and gpu not in reported:
                reported.add(gpu)
                ctx.violate(f"[sampled {ctx.clock()}, for {CONVERGE_S:.0f} s] {p}")


def _count_partial(ctx: Ctx, devices: set[dr.Device]) -> None:
    """Right after the SIGKILL: were some of the bad GPUs' rules still missing (the kill landed between
    two creates) or all there already?"""
    with contextlib.suppress(Exception):
        ours = {dr.selector(r) for r in dk._rules(ctx, {d[1] for d in devices}) if dr.is_ours(r)}
        key = "between_kills_partial" if not devices <= ours else "between_kills_all_there"
        ctx.stats[key] = ctx.stats.get(key, 0) + 1


def _kill_between_creates(ctx: Ctx, monkey: KillMonkey, devices: set[dr.Device], why: str) -> None:
    """SIGKILL the instant a watch sees the first of the bad GPUs' rules appear (the rest are being
    created one by one), and count whether the kill really landed between two creates."""

    def run(stop: threading.Event) -> None:
        w = watch.Watch()
        while not stop.is_set():
            try:
                for ev in w.stream(ctx.kube.custom.list_cluster_custom_object, dra.G, dra.V, RULES, timeout_seconds=5):
                    obj = ev["object"]
                    if ev["type"] != "ADDED" or not dr.is_ours(obj) or dr.selector(obj) not in devices:
                        continue
                    monkey.bounce(why, after_kill=lambda: _count_partial(ctx, devices))
                    w.stop()
                    return
            except Exception:
                time.sleep(0.1)

    ctx.background(run, "kill-between-rule-creates")


def partition_kills(ctx: Ctx) -> None:
    """Partitioned GPUs held out whole, round after round, SIGKILLed at their write-ahead moments."""
    rounds = ctx.n(8, 2)  # each moment 4 times (quick: once)
    static, part = ctx.make_nodes(2)
    nodes = [static, part]
    pools = set(nodes)
    pub = _published(static, part)
    dra.publish_device_classes(ctx.kube)
    slices: list[str] = []
    for p in pub.values():
        slices += ctx.retry(dra.publish, ctx.kube, p)
    ctx.extra_cleanup.append(lambda: dk._delete_slices(ctx, slices))
    ctx.extra_cleanup.append(lambda: dk._delete_rules(ctx, pools))
    ns = ctx.namespace()
    ctx.checkpoint_namespaces.add(ns)
    ctx.retry(dra.create_claim_template, ctx.kube, ns, "mig", 1, cel=dra.MIG_CEL)
    ctx.policy(drain_policy(maxUnhealthyGPUs=100))
    for n in nodes:
        ctx.put_report(n, healthy(n))
    op = ctx.operator()
    ctx.wait_states(nodes, lambda s: s.get("state") == "Healthy", 60, "all Healthy")
    ctx.acknowledger([ns])
    current_bad: list[dr.Device] = []
    writer = dk.ForeignRuleWriter(ctx, nodes, lambda: list(current_bad))
    sampled: dict[str, str] = {}
    ctx.background(lambda stop: dk._sample(ctx, pools, sampled, stop), "device-rule-sampler")
    ctx.background(lambda stop: _coverage_sampler(ctx, pub, stop), "partition-coverage-sampler")
    monkey = KillMonkey(ctx, op, gap=(3.0, 8.0), down=(0.0, 1.5))
    held: dict[str, list[dr.Device]] = {}
    bad_of_pod: dict[str, set[dr.Device]] = {}  # pod -> every device of its round's bad GPUs
    per_node = {static: 3, part: 2}
    for r in range(rounds):
        last = r == rounds - 1
        pods = {node: [f"r{r}-{'s' if node == static else 'p'}-{k}" for k in range(per_node[node])] for node in nodes}
        for node in nodes:
            for pod in pods[node]:
                body = dra.claim_pod(ns, pod, "mig", node)
                body["metadata"]["annotations"] = {"gpuhealth.dev/checkpoint": "annotation"}
                ctx.retry(ctx.kube.core.create_namespaced_pod, ns, body)
        bad: dict[str, int] = {}
        on: dict[str, int] = {}  # pod -> the GPU its MIG device belongs to
        for node in nodes:
            for pod in pods[node]:
                (dev,) = dra.wait_allocated(ctx.kube, ns, pod, timeout=90)
                held[f"{ns}/{pod}"] = [(dra.DRIVER, node, dev)]
                on[pod] = gpu_of(dev)
            bad[node] = on[pods[node][0]]
        round_bad = set().union(*(_devices_of(pub, n, bad[n]) for n in nodes))
        current_bad[:] = sorted(round_bad)
        for node in nodes:
            for pod in pods[node]:
                bad_of_pod[f"{ns}/{pod}"] = round_bad
        early, later = MOMENTS[r % len(MOMENTS)]
        if early == "device record written":

            def recorded(bad: dict[str, int] = bad) -> bool:
                st = ctx.statuses(nodes)
                return any(dk._device(st.get(n, {}), bad[n]).get("taintRules") for n in nodes)

            dk._watch_once(ctx, monkey, recorded, early)
        else:
            _kill_between_creates(ctx, monkey, round_bad, early)
        if later == "first checkpoint request":
            monkey.at_first_checkpoint_request(ns)
        else:

            def acknowledged() -> bool:
                return any((p.metadata.annotations or {}).get(COMPLETED) for p in ctx.pods(ns))

            dk._watch_once(ctx, monkey, acknowledged, later)
        for node in nodes:
            ctx.put_report(node, ecc(node, bad[node]))
            ctx.fault(kind="gpu")

        def drained(bad: dict[str, int] = bad) -> bool:
            st = ctx.statuses(nodes)
            return all(dk._device(st.get(n, {}), bad[n]).get("state") == "Quarantined" for n in nodes)

        wait_for(drained, timeout=180, interval=0.3, what=f"round {r}: the bad GPUs drained")
        _round_checks(ctx, r, nodes, ns, pods, on, bad, pub)
        ctx.cycles += 1
        if last:
            break
        for node in nodes:
            ctx.put_report(node, healthy(node))  # the GPU was reset: clean facts
        ctx.wait_states(nodes, lambda s: s.get("state") == "Healthy", 120, f"round {r}: GPUs back in service")
        wait_for(
            lambda: not [x for x in dk._rules(ctx, pools) if dr.is_ours(x)], timeout=60, what=f"round {r}: rules gone"
        )
        for pod in [p.metadata.name for p in ctx.pods(ns)]:
            with contextlib.suppress(Exception):
                ctx.kube.core.delete_namespaced_pod(pod, ns, grace_period_seconds=0)
        wait_for(lambda: not ctx.kube.core.list_namespaced_pod(ns).items, timeout=90, what=f"round {r}: pods gone")
    monkey.finish()
    writer.finish()
    _final_checks(ctx, nodes, ns, pub, current_bad, held, bad_of_pod, writer)
    for n in nodes:
        ctx.expect[n] = "any"  # Degraded with one GPU held out: judged above, per device
    ctx.stats["operator_kills"] = monkey.kills
    ctx.stats["targeted_kills"] = monkey.targeted
    ctx.stats["kills_by_moment"] = monkey.by_mode
    ctx.stats["foreign_rule_writes"] = writer.writes
    ctx.note(
        f"{ctx.cycles} partitioned-GPU quarantine/drain rounds on a static-MIG and a partitionable DRA node "
        f"({sum(per_node.values())} MIG pods a round), {monkey.kills} SIGKILLs (by moment: {monkey.by_mode}), "
        f"{writer.writes} foreign DeviceTaintRule writes"
    )


def _round_checks(
    ctx: Ctx,
    r: int,
    nodes: list[str],
    ns: str,
    pods: dict[str, list[str]],
    on: dict[str, int],
    bad: dict[str, int],
    pub: dict[str, S.Published],
) -> None:
    """Drained: the pods on the bad GPU are gone, the others stay; once converged, every device of the
    bad GPU has its rule."""
    alive = {p.metadata.name for p in ctx.pods(ns)}
    for node in nodes:
        for pod in pods[node]:
            if on[pod] == bad[node] and pod in alive:
                ctx.violate(f"round {r}: {node}'s GPU {bad[node]} drained, but its pod {pod} remains")
            if on[pod] != bad[node] and pod not in alive:
                ctx.violate(f"round {r}: pod {pod} on {node}'s healthy GPU {on[pod]} is gone")

    def uncovered() -> list[str]:
        return dr.partition_coverage_problems(_held_out(ctx, pub), dk._rules(ctx, set(nodes)))

    with contextlib.suppress(AssertionError):
        wait_for(lambda: not uncovered(), timeout=CONVERGE_S, what="every device of the bad GPUs has its rule")
    for p in uncovered():
        ctx.violate(f"round {r}: {p}")


def _final_checks(
    ctx: Ctx,
    nodes: list[str],
    ns: str,
    pub: dict[str, S.Published],
    bad: list[dr.Device],
    held: dict[str, list[dr.Device]],
    bad_of_pod: dict[str, set[dr.Device]],
    writer: dk.ForeignRuleWriter,
) -> None:
    """device_kills' end checks, plus every device of a held-out GPU having its rule."""
    dk.final_checks(
        ctx,
        nodes,
        ns,
        bad,
        held,
        bad_of_pod,
        writer,
        more=lambda rules: dr.partition_coverage_problems(_held_out(ctx, pub), rules),
    )
    ctx.stats["devices_held_out_at_end"] = len(bad)
