"""Scenario: the repair ladder (#24) while the operator is SIGKILLed at each of its steps.

DRA nodes with ``spec.remediation`` enabled: each round an uncorrected ECC error hits the GPU a pod
holds (the checkpoint handshake declared); the operator holds the GPU out, drains that pod, and
climbs the ladder. On the ``reset`` nodes the reset Job succeeds (KWOK's stage,
devkit/kwok/pod-remediation.yaml) and the scenario plays the GPU: once the ladder waits for
clean facts it rewrites the report clean; probation follows and the GPU returns. On the ``fail``
node the policy's job template labels the reset pods to fail: both GPUReset attempts fail, the
ladder escalates to NodeReboot (the node handed off), and the scenario "reboots" it (clean facts,
then the release annotation).

The kill monkey SIGKILLs the operator at random instants and at each step of the ladder: the
write-ahead record (phase Pending, the Job's name recorded), the Job created, the Job succeeded but
the facts not yet clean (and the node handed off, not yet rebooted), and probation. Each round's
GPU is a different one (one claim template per GPU), so one episode per GPU: never two reset Jobs
for one (GPU, attempt) (audit log and Job objects), the ladder's position never goes back (its
status sampled), and no reset Job is created while a pod holds its GPU (claims and pods sampled
against the audit log's create times).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from kubernetes import client, watch

from devkit import dra
from devkit.audit import audit_events
from devkit.k8s import healthy_spec, wait_for
from devkit.ladder import reset_job_template
from devkit.timeparse import now
from gpuhealth.api.names import RELEASE_ANNOTATION
from hack.chaos import devicerules as dr
from hack.chaos import ladder as ld
from hack.chaos.scenarios import device_kills as dk
from hack.chaos.scenarios.common import drain_policy
from hack.chaos.scenarios.context import Ctx
from hack.chaos.scenarios.monkey import KillMonkey

# -- what the scenario sets up and samples (the invariants in hack/chaos/ladder.py judge the samples) --

NS = "gpuhealth-remediation"  # the policy's default spec.remediation.namespace
STEPS = [
    {"type": "GPUReset", "attempts": 2, "timeout": "2m"},
    {"type": "NodeReboot", "timeout": "10m"},
    {"type": "Replace"},
]


def ladder_policy(fail: bool) -> dict[str, Any]:
    spec = drain_policy(maxUnhealthyGPUs=100)
    spec["remediation"] = {
        "enabled": True,
        "maxConcurrent": 10,
        "ladders": [{"reasons": ["EccUncorrected"], "steps": STEPS}],
        "jobTemplate": reset_job_template(fail, image="example.invalid/reset:chaos"),
    }
    return spec


def ecc(bad: int) -> dict[str, Any]:
    spec = healthy_spec()
    spec["devices"][bad]["ecc"]["volatileUncorrected"] = 1
    return spec


def ladder_of(status: dict[str, Any], index: int) -> dict[str, Any]:
    return dict((status.get("remediation") or {}).get(str(index)) or {})


def setup_namespace(ctx: Ctx) -> None:
    for create, body in (
        (ctx.kube.core.create_namespace, {"metadata": {"name": NS}}),
        (lambda b: ctx.kube.core.create_namespaced_service_account(NS, b), {"metadata": {"name": NS}}),
    ):
        try:
            ctx.retry(create, body)
        except client.ApiException as e:
            if e.status != 409:
                raise


def reset_jobs(ctx: Ctx, nodes: list[str]) -> list[dict[str, Any]]:
    items = ctx.retry(ctx.kube.batch.list_namespaced_job, NS).items
    wanted = set(nodes)
    out = [ctx.kube.api.sanitize_for_serialization(j) for j in items]
    return [j for j in out if ((j.get("metadata") or {}).get("labels") or {}).get("gpuhealth.dev/node") in wanted]


def delete_reset_jobs(ctx: Ctx, nodes: list[str]) -> None:
    for n in nodes:
        ctx.cluster.kubectl(
            "delete",
            "jobs",
            "-n",
            NS,
            "-l",
            f"gpuhealth.dev/node={n}",
            "--wait=false",
            "--ignore-not-found",
            check=False,
        )


def ladder_sampler(
    ctx: Ctx, nodes: list[str], watched: set[tuple[str, int]], out: list[ld.LadderSample], stop: threading.Event
) -> None:
    """Every 0.3 s: each watched GPU's ladder record and device state."""
    while not stop.wait(0.3):
        try:
            st = ctx.statuses(nodes)
        except Exception:
            continue
        t = now()
        for node in nodes:
            s = st.get(node, {})
            for key in s.get("remediation") or {}:
                with contextlib.suppress(ValueError):
                    watched.add((node, int(key)))
            for n, index in sorted(watched):
                if n == node:
                    state = str(dk._device(s, index).get("state") or "")
                    out.append(ld.LadderSample(t, node, index, ladder_of(s, index) or None, state))


def holdings_sampler(ctx: Ctx, ns: str, out: list[ld.Holding], stop: threading.Event) -> None:
    """Every 0.3 s: which pod holds which GPU (its claim allocated and reserved for it, the pod present
    and not ended); the time is when the LISTs were sent."""
    while not stop.wait(0.3):
        t = now()
        try:
            claims = ctx.kube.custom.list_namespaced_custom_object(dra.G, dra.V, ns, "resourceclaims")["items"]
            pods = ctx.kube.core.list_namespaced_pod(ns).items
        except Exception:
            continue
        live = {p.metadata.name for p in pods if p.status.phase not in ("Succeeded", "Failed")}
        for c in claims:
            results = (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
            for ref in (c.get("status") or {}).get("reservedFor") or []:
                if ref.get("resource") != "pods" or ref.get("name") not in live:
                    continue
                for res in results:
                    dev = str(res.get("device") or "")
                    if dev.startswith("gpu-") and dev[4:].isdigit():
                        out.append(ld.Holding(t, str(res.get("pool")), int(dev[4:]), f"{ns}/{ref['name']}"))


def _count(ctx: Ctx, key: str) -> None:
    ctx.stats[key] = ctx.stats.get(key, 0) + 1


def _watch_ladder(ctx: Ctx, monkey: KillMonkey, nodes: list[str], gpus: dict[str, int], why: str, hit: Any) -> None:
    """SIGKILL the first time ``hit(ladder record, device record)`` holds for one of the round's GPUs."""

    def seen() -> bool:
        st = ctx.statuses(nodes)
        return any(hit(ladder_of(st.get(n, {}), gpus[n]), dk._device(st.get(n, {}), gpus[n])) for n in nodes)

    def job_there() -> None:  # killed on the write-ahead record: was its Job created already?
        with contextlib.suppress(Exception):
            st = ctx.statuses(nodes)
            named = {ladder_of(st.get(n, {}), gpus[n]).get("job", "").partition("/")[2] for n in nodes} - {""}
            there = named & {j["metadata"]["name"] for j in reset_jobs(ctx, nodes)}
            _count(ctx, "record_kills_job_there" if there else "record_kills_job_missing")

    dk._watch_once(ctx, monkey, seen, why, after_kill=job_there if why == "reset record written" else None)


def ladder_kills(ctx: Ctx) -> None:
    """Reset ladders round after round, SIGKILLed at each step."""
    rounds = ctx.n(3, 1)
    ok = ctx.make_nodes(ctx.n(2, 1), labels={"ladder": "reset"})
    (failing,) = ctx.make_nodes(1, labels={"ladder": "fail"})
    nodes = [*ok, failing]
    setup_namespace(ctx)
    dra.publish_device_classes(ctx.kube)
    slices = ctx.retry(dra.publish_slices, ctx.kube, nodes, uuid=dra.report_uuid)
    ctx.extra_cleanup.append(lambda: dk._delete_slices(ctx, slices))
    ctx.extra_cleanup.append(lambda: dk._delete_rules(ctx, set(nodes)))
    ctx.extra_cleanup.append(lambda: delete_reset_jobs(ctx, nodes))
    ns = ctx.namespace()
    ctx.checkpoint_namespaces.add(ns)
    for i in range(8):  # one template per GPU: each round's pod lands on the GPU the round picked
        cel = f"device.attributes['{dra.DRIVER}'].uuid == '{dra.report_uuid(i)}'"
        ctx.retry(dra.create_claim_template, ctx.kube, ns, f"gpu-{i}", 1, cel=cel)
    ctx.policy(ladder_policy(False), name=ctx.group, match={"ladder": "reset"}, nodes=ok)
    ctx.policy(ladder_policy(True), name=f"{ctx.group}-fail", match={"ladder": "fail"}, nodes=[failing])
    for n in nodes:
        ctx.put_report(n, healthy_spec())
    op = ctx.operator()
    ctx.wait_states(nodes, lambda s: s.get("state") == "Healthy", 60, "all Healthy")
    ctx.acknowledger([ns])
    samples: list[ld.LadderSample] = []
    holds: list[ld.Holding] = []
    watched: set[tuple[str, int]] = set()
    ctx.background(lambda stop: ladder_sampler(ctx, nodes, watched, samples, stop), "ladder-sampler")
    ctx.background(lambda stop: holdings_sampler(ctx, ns, holds, stop), "holdings-sampler")
    monkey = KillMonkey(ctx, op, gap=(4.0, 10.0), down=(0.0, 1.5))
    order = list(range(8))
    ctx.rng.shuffle(order)
    paths: dict[str, str] = {}  # each round's GPU: the ladder positions sampled, in order
    for r in range(rounds):
        bad = {n: order[(r + k) % 8] for k, n in enumerate(nodes)}
        started = now()
        spare = {n: order[(r + k + 4) % 8] for k, n in enumerate(nodes)}
        watched |= {(n, g) for n, g in bad.items()}
        for n in nodes:
            for pod, gpu in ((f"r{r}-n{nodes.index(n)}-bad", bad[n]), (f"r{r}-n{nodes.index(n)}-spare", spare[n])):
                body = dra.claim_pod(ns, pod, f"gpu-{gpu}", n)
                body["metadata"]["annotations"] = {"gpuhealth.dev/checkpoint": "annotation"}
                ctx.retry(ctx.kube.core.create_namespaced_pod, ns, body)
        for p in ctx.pods(ns):
            dra.wait_allocated(ctx.kube, ns, p.metadata.name, timeout=90)
        _watch_ladder(ctx, monkey, nodes, bad, "reset record written", lambda lad, d: lad.get("phase") == "Pending")
        _watch_job_created(ctx, monkey, nodes)
        _watch_ladder(
            ctx,
            monkey,
            nodes,
            bad,
            "probation",
            lambda lad, d: lad.get("phase") == "Succeeded" and d.get("state") == "Recovering",
        )
        for n in nodes:
            ctx.put_report(n, ecc(bad[n]))
            ctx.fault(kind="gpu")
        _play_the_gpus(ctx, monkey, r, ok, failing, bad)
        _back_in_service(ctx, r, nodes)
        for n in nodes:
            path = _path(samples, n, bad[n], started)
            paths[f"r{r} {n} GPU {bad[n]}"] = " > ".join(path)
            steps = {p.split(" ")[0] for p in path}
            if n == failing and "NodeReboot" not in steps:
                ctx.violate(
                    f"round {r}: {n} GPU {bad[n]}: its resets fail, but its ladder never reached NodeReboot: {path}"
                )
            if n != failing and (steps - {"GPUReset"} or any(" #1 " not in p for p in path)):
                ctx.violate(f"round {r}: {n} GPU {bad[n]}: its reset succeeds, but its ladder went further: {path}")
            if n != failing and not any(p.endswith("Succeeded") for p in path):
                # Returned by the GPU's own probation while the ladder still said Verifying (the operator
                # down when the probation ended): the GPU is right to return; counted, not judged.
                ctx.stats["success_not_recorded"] = ctx.stats.get("success_not_recorded", 0) + 1
        for pod in [p.metadata.name for p in ctx.pods(ns)]:
            with contextlib.suppress(Exception):
                ctx.kube.core.delete_namespaced_pod(pod, ns, grace_period_seconds=0)
        wait_for(lambda: not ctx.kube.core.list_namespaced_pod(ns).items, timeout=90, what=f"round {r}: pods gone")
        ctx.cycles += 1
    monkey.finish()
    time.sleep(1.0)  # the samplers' last look
    ctx.stop_background()
    _final_checks(ctx, nodes, samples, holds)
    ctx.stats["operator_kills"] = monkey.kills
    ctx.stats["targeted_kills"] = monkey.targeted
    ctx.stats["kills_by_moment"] = monkey.by_mode
    ctx.stats["ladder_paths"] = paths
    ctx.stats["ladder_samples"] = len(samples)
    ctx.stats["holding_samples"] = len(holds)
    ctx.note(
        f"{ctx.cycles} repair-ladder rounds on {len(ok)} reset node(s) and 1 failing-reset node, "
        f"{monkey.kills} SIGKILLs (by moment: {monkey.by_mode})"
    )


def _watch_job_created(ctx: Ctx, monkey: KillMonkey, nodes: list[str]) -> None:
    """SIGKILL the instant a watch sees a new reset Job of these nodes (created, its record maybe not
    yet Running: the create and that write are milliseconds apart, too close for polling)."""
    before = {j["metadata"]["name"] for j in reset_jobs(ctx, nodes)}
    wanted = set(nodes)

    def pending() -> None:  # killed on the new Job: does its record still say Pending (step 3 not written)?
        with contextlib.suppress(Exception):
            phases = {str(lad.get("phase")) for s in ctx.statuses(nodes).values() for lad in _all(s)}
            _count(ctx, "job_kills_record_pending" if "Pending" in phases else "job_kills_record_running")

    def run(stop: threading.Event) -> None:
        w = watch.Watch()
        while not stop.is_set():
            try:
                for ev in w.stream(ctx.kube.batch.list_namespaced_job, NS, timeout_seconds=5):
                    job = ev["object"]
                    if ev["type"] != "ADDED" or job.metadata.name in before:
                        continue
                    if (job.metadata.labels or {}).get("gpuhealth.dev/node") not in wanted:
                        continue
                    monkey.bounce("reset job created", after_kill=pending)
                    w.stop()
                    return
            except Exception:
                time.sleep(0.1)

    ctx.background(run, "kill-at-reset-job")


def _all(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(v) for v in (status.get("remediation") or {}).values() if isinstance(v, dict)]


def _play_the_gpus(ctx: Ctx, monkey: KillMonkey, r: int, ok: list[str], failing: str, bad: dict[str, int]) -> None:
    """Be the GPUs: once a reset node's ladder waits for clean facts (the Job succeeded), SIGKILL (the
    first one a round), then report clean; once the failing node is handed off for a reboot and is
    AwaitingRepair (drained), SIGKILL, report clean and release it. Until every bad GPU is back in
    service and its record gone."""
    nodes = [*ok, failing]
    played: set[str] = set()
    killed = False
    deadline = time.monotonic() + 300
    while True:
        st = ctx.statuses(nodes)
        for n in nodes:
            lad = ladder_of(st.get(n, {}), bad[n])
            # The node remediator reboots a node once it is AwaitingRepair (drained), as NodeHealthCheck
            # keys on it; the ladder says HandedOff already while the node's drain runs. (A release sent
            # that early is acknowledged and ends the GPU's ladder, but the node then parks in
            # AwaitingRepair once drained: seen here first, reported, not what this scenario judges.)
            handed_off = lad.get("step") == "NodeReboot" and lad.get("phase") == "HandedOff"
            due = (n in ok and lad.get("phase") == "Verifying") or (
                n == failing and handed_off and st.get(n, {}).get("state") == "AwaitingRepair"
            )
            if n in played or not due:
                continue
            if not killed or n == failing:
                monkey.bounce("handed off, not yet rebooted" if n == failing else "reset succeeded, facts not clean")
                killed = killed or n != failing
            ctx.put_report(n, healthy_spec())
            if n == failing:
                ctx.retry(ctx.kube.core.patch_node, n, {"metadata": {"annotations": {RELEASE_ANNOTATION: "rebooted"}}})
            played.add(n)
        done = all(
            n in played
            and dk._device(st.get(n, {}), bad[n]).get("state") == "InService"
            and not ladder_of(st[n], bad[n])
            for n in nodes
        )
        if done:
            return
        if time.monotonic() > deadline:
            where = {
                n: (ladder_of(st.get(n, {}), bad[n]), dk._device(st.get(n, {}), bad[n]).get("state")) for n in nodes
            }
            raise AssertionError(f"round {r}: the ladders did not finish in 300 s: {where}")
        time.sleep(0.3)


def _back_in_service(ctx: Ctx, r: int, nodes: list[str]) -> None:
    """The round ends with every node Healthy and schedulable again (the failing node was handed off
    for a reboot and released); if not, say where each one stands, and end the scenario."""
    try:
        ctx.wait_states(nodes, lambda s: s.get("state") == "Healthy", 120, f"round {r}: nodes Healthy")
        ctx.wait_schedulable(nodes, 60, f"round {r}: nodes schedulable")
    except AssertionError:
        st = ctx.statuses(nodes)
        for n in nodes:
            spec = ctx.retry(ctx.kube.core.read_node, n).spec
            s = st.get(n, {})
            if s.get("state") == "Healthy" and not spec.unschedulable and not spec.taints:
                continue
            keys = ("state", "reason", "drained", "since", "remediation")
            out = [(d.get("index"), d.get("state")) for d in s.get("devices") or [] if d.get("state") != "InService"]
            ctx.violate(
                f"round {r}: {n} not back in service: status { ({k: s.get(k) for k in keys}) }, devices {out}, "
                f"cordoned {bool(spec.unschedulable)}, taints {[t.key for t in spec.taints or []]}"
            )
        raise


def _path(samples: list[ld.LadderSample], node: str, index: int, since: Any) -> list[str]:
    """The distinct ladder positions of one GPU sampled since ``since``: ``GPUReset #1 Running``, ..."""
    out: list[str] = []
    for s in list(samples):
        if (s.node, s.index) != (node, index) or s.at < since or not s.record:
            continue
        pos = f"{s.record.get('step')} #{s.record.get('attempt')} {s.record.get('phase')}"
        if not out or out[-1] != pos:
            out.append(pos)
    return out


def _final_checks(ctx: Ctx, nodes: list[str], samples: list[ld.LadderSample], holds: list[ld.Holding]) -> None:
    audit = list(audit_events(ctx.cluster.audit_log, ctx.operator_users, ctx.started))
    creates = [c for c in ld.job_creates(audit, NS) if (ld.parse_job_name(c.name) or ("",))[0] in nodes]
    for p in ld.duplicate_reset_jobs(creates, reset_jobs(ctx, nodes)):
        ctx.violate(p)
    for p in ld.ladder_regressions(samples):
        ctx.violate(p)
    for p in ld.resets_while_held(creates, holds):
        ctx.violate(p)
    rules = dk._rules(ctx, set(nodes))
    for p in dr.sample_problems(rules) + dr.final_rule_problems(rules, set(nodes), []):
        ctx.violate(p)
    # The no-reset-while-held check had something to judge: a pod was seen on the GPU before its Job.
    ctx.stats["resets_after_a_pod_was_seen_holding"] = sum(
        1
        for c in creates
        if 200 <= c.code < 300
        and c.at is not None
        and any((h.node, h.index) == (ld.parse_job_name(c.name) or ("", -1))[:2] and h.at < c.at for h in holds)
    )
    ctx.stats["reset_job_creates"] = {
        "created": sum(1 for c in creates if 200 <= c.code < 300),
        "conflict": sum(1 for c in creates if c.code == 409),
    }
