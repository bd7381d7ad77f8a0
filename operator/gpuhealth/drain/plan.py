"""Pure drain planning: (node's pods, gangs, policy, fault, progress record, time) -> steps; and the
evictions of pods that keep failing on a quarantined node (``crashloop_evictions``), steps outside a drain.

The progress record lives in GPUNodeHealth ``status.drain``; the checkpoint request itself lives on
the pod (annotation), and an eviction is visible on the pod (deletionTimestamp, then gone). So a
restarted operator sees every request and eviction it made and never repeats one.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuhealth.api import pods as P
from gpuhealth.api.policy import DrainSettings, Policy
from gpuhealth.api.status import DrainRecord, PodDrain
from gpuhealth.api.timeutil import format_time, format_time_precise, parse_time

MODES = ("annotation", "signal", "none")


@dataclass(frozen=True)
class Step:
    kind: str  # "request", "evict", "force-delete"
    pod: Mapping[str, Any]
    why: str
    # An eviction outside a drain (a crash-looping pod on a quarantined node) keeps no progress
    # record: it is announced with this reason and message, and a refusal is simply retried later.
    reason: str = ""
    message: str = ""

    @property
    def key(self) -> str:
        return P.key(self.pod)


@dataclass
class DrainPlan:
    steps: list[Step] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    record: DrainRecord = field(default_factory=lambda: DrainRecord())
    complete: bool = False


def pod_mode(pod: Mapping[str, Any], settings: DrainSettings) -> str:
    if settings.checkpoint_mode != "FromPod":
        return settings.checkpoint_mode
    mode = P.pod_annotations(pod).get(P.CHECKPOINT_MODE, "none")
    return mode if mode in MODES else "none"


def drainable(pod: Mapping[str, Any], settings: DrainSettings) -> bool:
    """DaemonSet and mirror pods, system namespaces and finished pods are left alone."""
    return not (
        P.is_daemonset(pod)
        or P.is_mirror(pod)
        or P.is_terminal(pod)
        or pod["metadata"].get("namespace") in settings.system_namespaces
    )


def _requested_at(pod: Mapping[str, Any], started: dt.datetime) -> dt.datetime | None:
    """This drain's request on the pod, if any (a request older than the drain belongs to another)."""
    t = parse_time(P.pod_annotations(pod).get(P.CHECKPOINT_REQUESTED))
    return t if t is not None and t >= started - dt.timedelta(seconds=1) else None


def _acknowledged(pod: Mapping[str, Any], requested: dt.datetime | None) -> bool:
    done = parse_time(P.pod_annotations(pod).get(P.CHECKPOINT_COMPLETED))
    return requested is not None and done is not None and done >= requested.replace(microsecond=0)


def plan_drain(
    node: str,
    node_pods: Sequence[Mapping[str, Any]],
    gang_members: Mapping[str, Sequence[Mapping[str, Any]]],
    settings: DrainSettings,
    fatal: bool,
    record: DrainRecord | None,
    now: dt.datetime,
    other_drains: Mapping[str, dt.datetime] | None = None,
) -> DrainPlan:
    """``other_drains``: when the running drain of each other node started (the nodes a gang spans). A
    gang may have been asked by such a drain before this one started: that request is as current as
    this drain's own, and asking again would ask the gang twice."""
    rec: DrainRecord = DrainRecord(**(record or {}))
    started = parse_time(rec.get("startedAt")) or now
    if not rec.get("startedAt"):
        rec = DrainRecord(phase="Running", startedAt=format_time(now), fatal=fatal, pods={})
    pods_rec: dict[str, PodDrain] = {k: PodDrain(**v) for k, v in (rec.get("pods") or {}).items()}
    plan = DrainPlan()
    elapsed = (now - started).total_seconds()
    drains = other_drains or {}

    def since(members: Sequence[Mapping[str, Any]]) -> dt.datetime:
        """The start of the earliest running drain of the nodes a group spans: any of them may have asked it."""
        return min([started, *(drains[n] for n in {_node_of(m) for m in members} if n in drains)])

    targets = [p for p in node_pods if drainable(p, settings)]
    # Whole gangs move together unless the job survives losing a rank.
    groups: dict[str, list[Mapping[str, Any]]] = {}
    here: dict[str, list[Mapping[str, Any]]] = {}  # each group's pods on this node
    for pod in targets:
        gk = None if settings.gang_survives_rank_loss else P.gang_key(pod)
        if gk is not None:
            members = [m for m in gang_members.get(gk, [pod]) if drainable(m, settings)] or [pod]
            groups[gk] = members
        else:
            gk = P.key(pod)
            groups[gk] = [pod]
        here.setdefault(gk, []).append(pod)

    waiting = 0
    for gk, members in sorted(groups.items()):
        if all(P.is_deleting(p) for p in here[gk]):
            # The gang is leaving this node (evicted, or its Workload moved): only members this drain
            # already dealt with may still need an eviction (one a budget refused); the others are
            # replacements the Job started on healthy nodes, not this drain's to ask or evict.
            members = [m for m in members if m["metadata"]["uid"] in pods_rec]
            if not members:
                continue
        live = [m for m in members if not P.is_deleting(m)]
        modes = {pod_mode(m, settings) for m in live}
        asked_since = since(members)
        ready_to_evict = True
        why = ""
        if "annotation" in modes:
            unacked = []
            for m in live:
                if pod_mode(m, settings) != "annotation":
                    continue
                requested = _requested_at(m, asked_since)
                prec = pods_rec.setdefault(m["metadata"]["uid"], PodDrain(pod=P.key(m), node=_node_of(m)))
                if requested is None:
                    plan.steps.append(Step("request", m, "checkpoint before eviction"))
                    unacked.append(m)
                    continue
                prec.setdefault("requestedAt", format_time_precise(requested))
                if _acknowledged(m, requested):
                    prec.setdefault("acknowledgedAt", P.pod_annotations(m)[P.CHECKPOINT_COMPLETED])
                else:
                    unacked.append(m)
            if unacked:
                waiting += sum(1 for m in unacked if _node_of(m) == node)
                first = min(
                    (_requested_at(m, asked_since) or now for m in unacked),
                    default=now,
                )
                overdue = (now - first).total_seconds() >= settings.checkpoint_timeout_s
                if overdue and settings.on_checkpoint_timeout == "Evict":
                    why = f"checkpoint not acknowledged within {int(settings.checkpoint_timeout_s)}s: evicting anyway"
                    notified = list(rec.get("timedOut") or [])
                    if gk not in notified:
                        rec["timedOut"] = [*notified, gk]
                        plan.events.append(("Warning", "CheckpointTimeout", f"{gk}: {why}"))
                elif overdue:
                    ready_to_evict = False
                    for m in unacked:
                        prec = pods_rec.setdefault(m["metadata"]["uid"], PodDrain(pod=P.key(m), node=_node_of(m)))
                        if not prec.get("overdueNotified"):
                            prec["overdueNotified"] = True
                            plan.events.append(
                                (
                                    "Warning",
                                    "CheckpointOverdue",
                                    f"{P.key(m)} has not acknowledged its checkpoint after "
                                    f"{int(settings.checkpoint_timeout_s)}s; the policy says keep waiting",
                                )
                            )
                else:
                    ready_to_evict = False
            else:
                why = "checkpoint acknowledged"
        elif modes == {"none"} and not fatal:
            if elapsed < settings.max_wait_s:
                ready_to_evict = False
            else:
                why = f"did not finish within maxWait ({int(settings.max_wait_s)}s)"
        else:
            why = "GPU fault is fatal: evicting now" if "none" in modes else "the pod checkpoints on SIGTERM"
        if not why:
            why = "draining"
        for m in members:
            prec = pods_rec.setdefault(m["metadata"]["uid"], PodDrain(pod=P.key(m), node=_node_of(m)))
            if P.is_deleting(m) or prec.get("evictedAt"):
                continue
            if not ready_to_evict:
                continue
            retry = parse_time(prec.get("retryAt"))
            if retry is not None and retry > now:
                continue
            plan.steps.append(Step("evict", m, why))

    if settings.allow_force_delete and elapsed >= settings.force_delete_after_s:
        for pod in targets:
            prec = pods_rec.get(pod["metadata"]["uid"], PodDrain())
            if not prec.get("forceDeletedAt"):
                plan.steps = [s for s in plan.steps if s.key != P.key(pod)]
                plan.steps.append(Step("force-delete", pod, f"still present {int(elapsed)}s into the drain"))

    remaining = [p for p in node_pods if drainable(p, settings)]
    rec["pods"] = pods_rec
    rec["total"] = len(
        {uid for uid, v in pods_rec.items() if v.get("node") == node} | {p["metadata"]["uid"] for p in remaining}
    )
    rec["waitingForCheckpoint"] = waiting
    rec["evicted"] = sum(1 for v in pods_rec.values() if v.get("evictedAt") and v.get("node") == node)
    rec["blockedByBudget"] = sum(1 for v in pods_rec.values() if v.get("blocked") and not v.get("evictedAt"))
    if not remaining:
        rec["phase"] = "Completed"
        rec.setdefault("completedAt", format_time(now))
        plan.complete = True
    plan.record = rec
    return plan


def _node_of(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def crashloop_evictions(policy: Policy, node_pods: Sequence[Mapping[str, Any]], now: dt.datetime) -> list[Step]:
    """Evictions for pods that keep failing on a quarantined node, so their controllers place them
    elsewhere; they go through the drain's one eviction path (Eviction API, budgets respected)."""
    steps = []
    for pod in node_pods:
        if P.is_deleting(pod) or P.is_terminal(pod) or P.is_daemonset(pod):
            continue
        if pod["metadata"].get("namespace") in policy.drain.system_namespaces:
            continue
        f = P.failure(pod, now, policy.restart_loop_window_s)
        if f is None or f[0] < policy.restart_loop_min_restarts:
            continue
        message = (
            f"Evicted {P.key(pod)} (restarted {f[0]}x on this quarantined node) so its controller places it elsewhere"
        )
        steps.append(Step("evict", pod, "crash-looping", reason="EvictedCrashLooping", message=message))
    return steps
