"""Scenario: repair steps waiting for a human's approval while the operator is SIGKILLed and the API
server crashes.

DRA nodes under a policy with ``spec.remediation.approval: Manual`` and ``spec.validation``: each
round an uncorrected ECC error hits one GPU of each node (a different GPU each round, so no repeat
offender); its reset waits in ``PendingApproval``. The scenario approves it, on one node per GPU
(``gpuhealth.dev/approve-gpu``), on the other for the whole node (``gpuhealth.dev/approve``); KWOK
completes the reset Job (devkit/kwok/pod-remediation.yaml); the scenario reports the GPU clean; the
validation then waits for an approval of its own, which it gets the same way, and KWOK passes it. The
kill monkey SIGKILLs the operator every 10-25 s, and each round also 0-0.4 s after each approval is
written and the moment a ladder record is seen approved (its Job's name recorded) while the
approval annotation is still on the Node (consumed, not yet removed); the API server is SIGKILLed
once a round, right after the reset approvals.

Judged (hack/chaos/decisions.py, ladder.py): every successful create of a step's Job (reset,
validation) spends one approval given for that GPU before the create was received, and every approval
is spent (an approved step runs exactly once: not twice, not before its approval, not lost; a Job
seen (sampled every 0.3 s) whose create the API server's crash kept out of the audit log counts, at
its creationTimestamp's one-second resolution); never two
reset Jobs for one (GPU, attempt); no approval annotation left on a Node once its step ran; each GPU
back in service at the end of each round.
"""

from __future__ import annotations

import datetime as dt
import time
from functools import partial
from typing import Any

from devkit import dra
from devkit.k8s import healthy_spec
from devkit.ladder import reset_job_template, validation_job_template
from devkit.timeparse import now
from gpuhealth.api.names import APPROVE_ANNOTATION, APPROVE_GPU_ANNOTATION
from hack.chaos import decisions as dc
from hack.chaos import ladder as ld
from hack.chaos.scenarios import decision_kit as kit
from hack.chaos.scenarios import device_kills as dk
from hack.chaos.scenarios.common import drain_policy
from hack.chaos.scenarios.context import Ctx
from hack.chaos.scenarios.ladder_kills import ecc, ladder_of

STEPS = [{"type": "GPUReset", "attempts": 1, "timeout": "2m"}, {"type": "NodeReboot"}, {"type": "Replace"}]
APPROVALS = (APPROVE_ANNOTATION, APPROVE_GPU_ANNOTATION, "gpuhealth.dev/reject", "gpuhealth.dev/reject-gpu")


def approval_policy(gpu: int) -> dict[str, Any]:
    spec = drain_policy(maxUnhealthyGPUs=100)
    spec["remediation"] = {
        "enabled": True,
        "approval": "Manual",
        "maxConcurrent": 10,
        "ladders": [{"reasons": ["EccUncorrected"], "steps": STEPS}],
        "jobTemplate": reset_job_template(image="example.invalid/reset:chaos"),
    }
    spec["validation"] = {
        "enabled": True,
        "maxConcurrent": 10,
        "jobTemplate": validation_job_template(gpu, image="example.invalid/dcgm:chaos"),
    }
    return spec


def approval_kills(ctx: Ctx) -> None:
    rounds = ctx.n(3, 1)
    members = ctx.make_nodes(2)
    kit.remediation_namespace(ctx)
    dra.publish_device_classes(ctx.kube)
    slices = ctx.retry(dra.publish_slices, ctx.kube, members, uuid=dra.report_uuid)
    ctx.extra_cleanup.append(lambda: dk._delete_slices(ctx, slices))
    ctx.extra_cleanup.append(lambda: dk._delete_rules(ctx, set(members)))
    ctx.extra_cleanup.append(lambda: kit.delete_jobs(ctx, members))
    order = list(range(8))
    ctx.rng.shuffle(order)
    name = ctx.policy(approval_policy(order[0]))
    for n in members:
        ctx.put_report(n, healthy_spec())
        ctx.expect[n] = "healthy"
    op = ctx.operator()
    ctx.wait_states(members, lambda s: s.get("state") == "Healthy", 60, "all Healthy")
    monkey = kit.TimedMonkey(ctx, op, gap=kit.GAP, down=(0.0, 1.5))
    approvals: dict[tuple[str, int], list[dt.datetime]] = {}
    made: dict[str, dt.datetime] = {}  # every step Job seen, by name: its creationTimestamp
    kit.job_sampler(ctx, members, made)
    per_gpu = {members[0]: True, members[1]: False}  # how each node is approved: its GPU, or the whole node

    def annotations(node: str) -> dict[str, str]:
        meta = (kit.nodes(ctx).get(node) or {}).get("metadata") or {}
        return {k: v for k, v in (meta.get("annotations") or {}).items() if k in APPROVALS}

    def where(gpu: int) -> str:
        st = ctx.statuses(members)
        return "; ".join(
            f"{n}: ladder {ladder_of(st.get(n, {}), gpu)} device {dk._device(st.get(n, {}), gpu).get('state')} "
            f"approvals {annotations(n)}"
            for n in members
        )

    def waiting(gpu: int, validation: bool) -> bool:
        st = ctx.statuses(members)
        for n in members:
            lad = ladder_of(st.get(n, {}), gpu)
            if lad.get("phase") != "PendingApproval" or bool(lad.get("validation")) != validation:
                return False
        return True

    def approve(gpu: int, what: str) -> None:
        for n in members:
            key, value = (APPROVE_GPU_ANNOTATION, str(gpu)) if per_gpu[n] else (APPROVE_ANNOTATION, now().isoformat())
            approvals.setdefault((n, gpu), []).append(now())
            ctx.retry(ctx.kube.core.patch_node, n, {"metadata": {"annotations": {key: value}}})
        time.sleep(ctx.rng.uniform(0.0, 0.4))
        monkey.bounce(f"{what} approved")

    try:
        for r in range(rounds):
            gpu = order[r % 8]
            if r:
                ctx.policy(approval_policy(gpu), name=name)

            def consumed(gpu: int = gpu) -> bool:  # approved in the record, the annotation not yet removed
                st = ctx.statuses(members)
                return any(
                    (ladder_of(st.get(n, {}), gpu).get("approved") or ladder_of(st.get(n, {}), gpu).get("job"))
                    and annotations(n)
                    for n in members
                )

            watches = [kit.kill_when(ctx, monkey, consumed, f"approval consumed, annotation on r{r}")]
            for n in members:
                ctx.put_report(n, ecc(gpu))
                ctx.fault(kind="gpu")
            kit.settle(ctx, partial(waiting, gpu, False), 120, f"round {r}: resets wait", partial(where, gpu))
            approve(gpu, f"reset r{r}")
            kit.crash_apiserver(ctx, f"r{r}: resets approved")

            def verifying(gpu: int = gpu) -> bool:
                st = ctx.statuses(members)
                return all(ladder_of(st.get(n, {}), gpu).get("phase") == "Verifying" for n in members)

            kit.settle(ctx, verifying, 120, f"round {r}: resets done", partial(where, gpu))
            for n in members:
                ctx.put_report(n, healthy_spec())  # the reset cleared the volatile counters
            kit.settle(ctx, partial(waiting, gpu, True), 120, f"round {r}: validations wait", partial(where, gpu))
            approve(gpu, f"validation r{r}")

            def back(gpu: int = gpu) -> bool:
                st = ctx.statuses(members)
                return all(
                    dk._device(st.get(n, {}), gpu).get("state") == "InService"
                    and not ladder_of(st.get(n, {}), gpu)
                    and not annotations(n)
                    for n in members
                )

            kit.settle(ctx, back, 120, f"round {r}: GPUs back, approvals removed", partial(where, gpu))
            for w in watches:
                w.set()
            ctx.cycles += 1
    finally:
        kit.finish_monkey(ctx, monkey)
        ctx.stop_background()
        wanted = set(members)
        audited = [c for c in kit.job_creates(ctx) if (dc.step_of(c.name) or ("", "", 0))[1] in wanted]
        kit.note_jobs(ctx, members, made)
        missing = dc.unaudited_creates(audited, {n: at for n, at in made.items() if dc.step_of(n)})
        creates = audited + missing
        for p in dc.approval_problems(creates, approvals, settled=ctx.cycles == rounds):
            ctx.violate(p)
        for p in ld.duplicate_reset_jobs(creates, kit.jobs_of(ctx, members)):
            ctx.violate(p)
        ctx.stats["step_job_creates"] = {
            "created": sum(1 for c in creates if 200 <= c.code < 300),  # the unaudited ones included
            "conflict": sum(1 for c in creates if c.code == 409),
            "unaudited": [c.name for c in missing],
        }
        ctx.stats["approvals_given"] = sum(len(v) for v in approvals.values())
    ctx.note(
        f"{ctx.cycles} rounds of a reset and a validation approved on {len(members)} DRA nodes, "
        f"{monkey.kills} SIGKILLs (by moment: {monkey.by_mode}), "
        f"{len(ctx.stats.get('apiserver_crashes', []))} kube-apiserver crashes"
    )
