"""Pieces the decision scenarios share (domain_kills, rack_kills, validation_kills, burnin_kills,
approval_kills): kills at a moment, an API server crash, a sampler thread, the remediation
namespace, and the operator's Job creates from the audit log."""

from __future__ import annotations

import contextlib
import datetime as dt
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client

from devkit.audit import audit_events
from devkit.ladder import OUTCOME_LABEL
from devkit.timeparse import parse_time
from hack.chaos import decisions as dc
from hack.chaos import invariants as inv
from hack.chaos import ladder as ld
from hack.chaos.scenarios.context import Ctx
from hack.chaos.scenarios.monkey import KillMonkey

NS = "gpuhealth-remediation"  # the policy's default spec.remediation.namespace
# The kill monkey's gap between random SIGKILLs: longer than a restart takes to list what it watches
# on 2 loaded cores (7-15 s seen, up to 45 s at a load of 14), so the operator makes progress between
# kills; the moments that matter get their own kills (kill_when).
GAP = (10.0, 25.0)


class TimedMonkey(KillMonkey):
    """The kill monkey, keeping when each SIGKILL landed and why (``stats.kill_times``), to read the
    operator's log and the audit log against."""

    def _kill(self, mode: str) -> None:
        super()._kill(mode)
        self.ctx.stats.setdefault("kill_times", []).append(f"{self.ctx.clock()} {mode}")


def count(ctx: Ctx, key: str, by: int = 1) -> None:
    ctx.stats[key] = ctx.stats.get(key, 0) + by


def kill_when(ctx: Ctx, monkey: KillMonkey, seen: Callable[[], bool], why: str, poll: float = 0.03) -> threading.Event:
    """SIGKILL the operator (and restart it) the first time ``seen()`` holds (until the returned event
    is set)."""

    def watch(stop: threading.Event) -> None:
        while not stop.wait(poll):
            hit = False
            with contextlib.suppress(Exception):  # the API may be down on purpose
                hit = seen()
            if hit:
                monkey.bounce(why)
                return

    return ctx.background(watch, f"kill-at-{why.replace(' ', '-')}")


def crash_apiserver(ctx: Ctx, why: str) -> None:
    """SIGKILL kube-apiserver, down 1-3 s, and wait for it to serve again."""
    down = ctx.rng.uniform(1.0, 3.0)
    ctx.cluster.restart("kube-apiserver", down_for=down, sig=signal.SIGKILL)
    ctx.fault(kind="apiserver_crash")
    ctx.stats.setdefault("apiserver_crashes", []).append(f"{why} (down {down:.1f} s)")


def crash_when(ctx: Ctx, seen: Callable[[], bool], why: str, poll: float = 0.05) -> threading.Event:
    """Crash the API server the first time ``seen()`` holds (until the returned event is set)."""

    def watch(stop: threading.Event) -> None:
        while not stop.wait(poll):
            hit = False
            with contextlib.suppress(Exception):
                hit = seen()
            if hit:
                crash_apiserver(ctx, why)
                return

    return ctx.background(watch, f"crash-at-{why.replace(' ', '-')}")


def sampling(ctx: Ctx, look: Callable[[], None], name: str, interval: float = 0.3) -> None:
    """Call ``look()`` every ``interval`` s until cleanup; a failed read (the API down on purpose) is skipped."""

    def loop(stop: threading.Event) -> None:
        while not stop.wait(interval):
            with contextlib.suppress(Exception):
                look()

    ctx.background(loop, name)


def nodes(ctx: Ctx) -> dict[str, dict[str, Any]]:
    """The scenario's Nodes by name (one LIST, as plain dicts)."""
    return inv.snapshot(ctx)[0]


def taint_value(node: Mapping[str, Any] | None, key: str = inv.TAINT) -> str | None:
    """The value of the taint ``key`` on a Node (None: not there)."""
    for t in ((node or {}).get("spec") or {}).get("taints") or []:
        if t.get("key") == key:
            return str(t.get("value") or "")
    return None


def remediation_namespace(ctx: Ctx) -> None:
    for create, body in (
        (ctx.kube.core.create_namespace, {"metadata": {"name": NS}}),
        (lambda b: ctx.kube.core.create_namespaced_service_account(NS, b), {"metadata": {"name": NS}}),
    ):
        try:
            ctx.retry(create, body)
        except client.ApiException as e:
            if e.status != 409:
                raise


def jobs_of(ctx: Ctx, node_names: list[str]) -> list[dict[str, Any]]:
    """gpuhealth's Jobs (reset, validation) for these nodes, as dicts."""
    wanted = set(node_names)
    items = ctx.retry(ctx.kube.batch.list_namespaced_job, NS).items
    out = [ctx.kube.api.sanitize_for_serialization(j) for j in items]
    return [j for j in out if ((j.get("metadata") or {}).get("labels") or {}).get("gpuhealth.dev/node") in wanted]


def note_jobs(ctx: Ctx, node_names: list[str], seen: dict[str, dt.datetime]) -> None:
    """The name and creationTimestamp of each of gpuhealth's Jobs for these nodes now, into ``seen``
    (the first sighting kept): the Jobs that came to exist, whether or not the audit log caught their create."""
    for j in jobs_of(ctx, node_names):
        meta = j.get("metadata") or {}
        at = parse_time(meta.get("creationTimestamp"))
        if at is not None:
            seen.setdefault(str(meta.get("name")), at)


def job_sampler(ctx: Ctx, node_names: list[str], seen: dict[str, dt.datetime]) -> None:
    """``note_jobs`` every 0.3 s, in the background."""
    sampling(ctx, lambda: note_jobs(ctx, node_names, seen), "job-sampler")


def succeeded(job: Mapping[str, Any]) -> bool:
    conds = (job.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Complete" and c.get("status") == "True" for c in conds)


def finished(job: Mapping[str, Any]) -> bool:
    conds = (job.get("status") or {}).get("conditions") or []
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conds)


def delete_jobs(ctx: Ctx, node_names: list[str]) -> None:
    for n in node_names:
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


def job_creates(ctx: Ctx) -> list[ld.JobCreate]:
    """The operator's Job creates in the remediation namespace since the scenario began (audit log)."""
    return ld.job_creates(audit_events(ctx.cluster.audit_log, ctx.operator_users, ctx.started), NS)


def finish_monkey(ctx: Ctx, monkey: KillMonkey) -> None:
    monkey.finish()
    ctx.stats["operator_kills"] = monkey.kills
    ctx.stats["targeted_kills"] = monkey.targeted
    ctx.stats["kills_by_moment"] = monkey.by_mode


class Unsettled(AssertionError):
    """A round did not reach the state it waits for: the scenario ends there (the rest would only wait)."""


def settle(
    ctx: Ctx,
    done: Callable[[], bool],
    timeout: float,
    what: str,
    where: Callable[[], str],
    acting: Callable[[], bool] | None = None,
    cap: float = 4.0,
) -> None:
    """Wait until ``done()``; on a timeout record a violation saying ``where`` things stand, and end the
    scenario (:class:`Unsettled`).

    ``acting``: ``timeout`` counts only the operator's acting time (:class:`decisions.ActingBudget`),
    not its start-ups, within ``cap`` times ``timeout`` of wall time: under the kill monkey on a loaded
    machine a restart takes 25-45 s, and a wall-clock wait can end while the operator is still starting
    (domain_kills, seed 32157: given up before a restart that settled the round in 6 s of acting)."""
    now = time.monotonic()
    budget = dc.ActingBudget(timeout, timeout * cap if acting else timeout, now, acting() if acting else True)
    while True:
        with contextlib.suppress(Exception):
            if done():
                return
        time.sleep(0.3)
        up = True
        if acting is not None:
            with contextlib.suppress(Exception):
                up = False
                up = acting()
        if budget.look(time.monotonic(), up):
            break
    try:
        state = where()
    except Exception as e:
        state = f"(could not read: {e!r})"
    spent = f"{timeout:.0f} s" if acting is None else f"{timeout:.0f} s of acting time ({budget.acting_s:.0f} s)"
    ctx.violate(f"{what}: not settled within {spent}: {state}")
    raise Unsettled(what)


def node_words(node: Mapping[str, Any] | None, status: Mapping[str, Any]) -> str:
    """One node as a failure message shows it: state, reason, taints, cordon, gpuhealth's annotation."""
    spec = (node or {}).get("spec") or {}
    ann = (((node or {}).get("metadata") or {}).get("annotations") or {}).get(inv.QUARANTINE)
    taints = [f"{t.get('key')}={t.get('value') or ''}" for t in spec.get("taints") or []]
    return (
        f"{status.get('state')}/{status.get('reason') or '-'} held={bool(status.get('heldByBreaker'))} "
        f"taints={taints} cordoned={bool(spec.get('unschedulable'))} annotation={ann}"
    )


UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
NUDGE_ANNOTATION = "chaos.gpuhealth.dev/nudge"


def back_in_service(ctx: Ctx, names: list[str], timeout: float, what: str) -> None:
    """Wait until every node is Healthy, untainted by gpuhealth (and by the node controller) and not
    cordoned; else say where each stands and end the scenario."""

    nudged: dict[str, float] = {}

    def done() -> bool:
        seen, st = nodes(ctx), ctx.statuses(names)
        ok = True
        for n in names:
            spec = (seen.get(n) or {}).get("spec") or {}
            keys = [str(t.get("key")) for t in spec.get("taints") or []]
            if st.get(n, {}).get("state") != "Healthy" or spec.get("unschedulable"):
                ok = False
            elif any(k == inv.TAINT or k.startswith("node.kubernetes.io/") for k in keys):
                ok = False
                if UNSCHEDULABLE_TAINT in keys:
                    nudge(n, nudged)
        return ok

    def nudge(n: str, last: dict[str, float]) -> None:
        # Uncordoned, yet the node controller's `unschedulable` taint is still on: its NoSchedule
        # pass failed while the API server was down on purpose, and kube-controller-manager never
        # retries that pass (node_lifecycle_controller.go, v1.37.2: "requeue it", then a TODO to add
        # the node back to the queue); it runs again on the Node's next update, which a real kubelet's
        # status report brings within minutes. An annotation of the harness's own is that update, at
        # most every 5 s; gpuhealth's own taint and cordon are still judged as they are.
        now = time.monotonic()
        if now - last.setdefault(n, now) < 5.0:  # seen stale for 5 s first: the controller may be on it
            return
        last[n] = now
        with contextlib.suppress(Exception):
            ctx.kube.core.patch_node(n, {"metadata": {"annotations": {NUDGE_ANNOTATION: str(time.time())}}})

    def where() -> str:
        seen, st = nodes(ctx), ctx.statuses(names)
        return "; ".join(f"{n}: {node_words(seen.get(n), st.get(n, {}))}" for n in names)

    settle(ctx, done, timeout, what, where)


# -- node validations (validation_kills, burnin_kills) ---------------------------------------------------

SCOPE_LABEL = "gpuhealth.dev/validation-scope"


def node_validations(jobs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """gpuhealth's node validation Jobs (label ``gpuhealth.dev/validation-scope=node``) by node."""
    out: dict[str, list[dict[str, Any]]] = {}
    for j in jobs:
        labels = (j.get("metadata") or {}).get("labels") or {}
        if labels.get(SCOPE_LABEL) == "node":
            out.setdefault(str(labels.get("gpuhealth.dev/node")), []).append(j)
    return out


def unholding(ctx: Ctx, node_names: list[str], delay: tuple[float, float]) -> None:
    """Be the diagnostic: a held validation pod (``gpuhealth-test/outcome=hold``) of these nodes passes
    ``delay`` seconds after it is first seen (its label removed: KWOK's pass stage then ends it)."""
    first: dict[str, float] = {}
    wanted = set(node_names)

    def loop(stop: threading.Event) -> None:
        while not stop.wait(0.3):
            try:
                pods = ctx.kube.core.list_namespaced_pod(NS, label_selector=f"{OUTCOME_LABEL}=hold").items
            except Exception:
                continue
            for p in pods:
                if p.spec.node_name not in wanted or p.metadata.deletion_timestamp:
                    continue
                due = first.setdefault(p.metadata.name, time.monotonic() + ctx.rng.uniform(*delay))
                if time.monotonic() >= due:
                    with contextlib.suppress(Exception):
                        ctx.kube.core.patch_namespaced_pod(
                            p.metadata.name, NS, {"metadata": {"labels": {OUTCOME_LABEL: None}}}
                        )

    ctx.background(loop, "validation-unholder")


def validation_sampler(
    ctx: Ctx, node_names: list[str], held_by: str, samples: list[Any], batch: tuple[int, str] | None = None
) -> None:
    """Every 0.3 s: each node held (the taint ``held_by`` on it) or not, next to its node validation
    Jobs seen succeeded so far (their own status); with ``batch`` (limit, what), the unfinished node
    validations of these nodes over the limit are a violation."""
    passed: dict[str, set[str]] = {n: set() for n in node_names}

    def note(jobs: dict[str, list[dict[str, Any]]]) -> int:
        running = 0
        for n in node_names:
            for j in jobs.get(n, []):
                if succeeded(j):
                    passed[n].add(str(j["metadata"]["name"]))
                elif not finished(j):
                    running += 1
        return running

    def look() -> None:
        # The Jobs are read on both sides of the Nodes: a held node is judged against the Jobs that had
        # passed before it was seen held, a free one against those passed by when it was seen free. Read
        # only before, a Job that succeeded between the two reads (the operator frees a node within
        # ~0.1 s of its Job's Complete) looked like a node freed with no validation passed.
        note(node_validations(jobs_of(ctx, node_names)))
        before = {n: frozenset(passed[n]) for n in node_names}
        seen = nodes(ctx)
        running = note(node_validations(jobs_of(ctx, node_names)))
        t = time.monotonic()
        for n in node_names:
            if n in seen:
                held = taint_value(seen[n], held_by) is not None
                samples.append(dc.HoldSample(t, n, held, before[n] if held else frozenset(passed[n])))
        if batch is not None and running > batch[0]:
            ctx.violate(f"[sampled {ctx.clock()}] {running} node validations running at once, over {batch[1]}")

    sampling(ctx, look, "validation-sampler")


def validation_checks(ctx: Ctx, node_names: list[str], started: Mapping[str, int], samples: list[Any]) -> None:
    """After the scenario: one Job per validation started (audit log and Job objects), no node freed
    unvalidated (the samples)."""
    wanted = set(node_names)
    creates = [c for c in job_creates(ctx) if dc.parse_node_validation(c.name) in wanted]
    seen: dict[str, set[str]] = {n: set() for n in node_names}
    for n, js in node_validations(jobs_of(ctx, node_names)).items():
        seen.setdefault(n, set()).update(str(j["metadata"]["name"]) for j in js)
    for s in samples:
        seen.setdefault(s.node, set()).update(s.passed)
    for p in dc.duplicate_node_validations(creates, started, seen):
        ctx.violate(p)
    for p in dc.returned_unvalidated(samples):
        ctx.violate(p)
    missing = dc.unaudited(creates, seen)
    ctx.stats["validation_job_creates"] = {
        "created": sum(1 for c in creates if 200 <= c.code < 300),
        "conflict": sum(1 for c in creates if c.code == 409),
        # every validation Job that came to exist: the audit's creates and the Jobs seen
        "jobs": len({c.name for c in creates if 200 <= c.code < 300} | {j for js in seen.values() for j in js}),
        "unaudited": missing,
    }
    ctx.stats["hold_samples"] = len(samples)
