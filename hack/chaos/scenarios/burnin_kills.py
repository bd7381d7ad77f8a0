"""Scenario: new nodes' burn-in while the operator is SIGKILLed and the API server crashes.

A policy with ``spec.validation.newNodes`` (batchSize 2; the validation Job's pod held until the
scenario, as the diagnostic, lets it pass 1-4 s later). Each round 3 GPU nodes join: each is held by
gpuhealth's ``gpuhealth.dev/burn-in:NoSchedule`` taint and burned in, at most 2 at once. The kill
monkey SIGKILLs the operator every 10-25 s, and each round also at the write-ahead record (the Job's
name recorded, not yet created), at a burn-in Job seen, and at a Job succeeded with its node still
held; the API server is SIGKILLed once a round, as the first Job appears.

Judged (hack/chaos/decisions.py): one Job per node's burn-in (the audit log's successful creates, the
Job objects), no node freed of its burn-in taint without its burn-in Job succeeded since the taint was
first seen (the Jobs' own status, sampled every 0.3 s), never more than batchSize burn-ins unfinished
at once (sampled); every node schedulable at the end of each round.
"""

from __future__ import annotations

import time
from functools import partial

from devkit.k8s import healthy_spec
from gpuhealth.api.names import BURN_IN_TAINT_KEY
from hack.chaos import decisions as dc
from hack.chaos.scenarios import decision_kit as kit
from hack.chaos.scenarios.context import Ctx
from hack.chaos.scenarios.validation_kills import validation_policy

BATCH = 2
PER_ROUND = 3


def burnin_kills(ctx: Ctx) -> None:
    rounds = ctx.n(3, 1)
    kit.remediation_namespace(ctx)
    ctx.policy(validation_policy(newNodes={"enabled": True, "batchSize": BATCH}))
    op = ctx.operator()
    monkey = kit.TimedMonkey(ctx, op, gap=kit.GAP, down=(0.0, 1.5))
    samples: list[dc.HoldSample] = []
    started: dict[str, int] = {}
    joined: list[str] = []
    ctx.extra_cleanup.append(lambda: kit.delete_jobs(ctx, joined))

    def where(names: list[str]) -> str:
        seen, st = kit.nodes(ctx), ctx.statuses(names)
        return "; ".join(
            f"{n}: {kit.node_words(seen.get(n), st.get(n, {}))} nodeValidation={st.get(n, {}).get('nodeValidation')}"
            for n in names
        )

    try:
        for r in range(rounds):
            new = ctx.make_nodes(PER_ROUND)
            joined += new
            for n in new:
                started[n] = 1
                ctx.expect[n] = "healthy"
            kit.validation_sampler(ctx, new, BURN_IN_TAINT_KEY, samples, batch=(BATCH, f"batchSize {BATCH}"))
            kit.unholding(ctx, new, (1.0, 4.0))

            def record_not_created(new: list[str] = new) -> bool:
                return any(
                    (nv := s.get("nodeValidation") or {}).get("job") and not nv.get("created")
                    for s in ctx.statuses(new).values()
                )

            def job_seen(new: list[str] = new) -> bool:
                return bool(kit.node_validations(kit.jobs_of(ctx, new)))

            def passed_still_held(new: list[str] = new) -> bool:
                seen = kit.nodes(ctx)
                return any(
                    any(kit.succeeded(j) for j in js) and kit.taint_value(seen.get(n), BURN_IN_TAINT_KEY) is not None
                    for n, js in kit.node_validations(kit.jobs_of(ctx, new)).items()
                )

            watches = [
                kit.kill_when(ctx, monkey, record_not_created, f"burn-in record written r{r}"),
                kit.kill_when(ctx, monkey, job_seen, f"burn-in job seen r{r}"),
                kit.kill_when(ctx, monkey, passed_still_held, f"burn-in passed, node still held r{r}"),
                kit.crash_when(ctx, job_seen, f"r{r}: burn-in Job seen"),
            ]
            for n in new:
                ctx.put_report(n, healthy_spec())

            def all_passed(new: list[str] = new) -> bool:
                st = ctx.statuses(new)
                return all((st.get(n, {}).get("nodeValidation") or {}).get("result") == "Passed" for n in new)

            kit.settle(ctx, all_passed, 240, f"round {r}: burned in", partial(where, new))
            kit.back_in_service(ctx, new, 60, f"round {r}: in service")
            for w in watches:
                w.set()
            ctx.cycles += 1
    finally:
        kit.finish_monkey(ctx, monkey)
        time.sleep(1.0)  # the sampler's last look
        ctx.stop_background()
        kit.validation_checks(ctx, joined, started, samples)
    held = {s.node for s in samples if s.held}
    ctx.stats["nodes_seen_held"] = len(held)
    if len(held) < len(joined):
        ctx.violate(f"{len(joined) - len(held)} of {len(joined)} new nodes never seen held for their burn-in")
    ctx.note(
        f"{ctx.cycles} rounds of {PER_ROUND} new nodes burned in (batchSize {BATCH}), "
        f"{monkey.kills} SIGKILLs (by moment: {monkey.by_mode}), "
        f"{len(ctx.stats.get('apiserver_crashes', []))} kube-apiserver crashes"
    )
