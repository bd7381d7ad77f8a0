"""Scenario: a node's validation after a repair's release while the operator is SIGKILLed and the API
server crashes.

Nodes under a policy with ``spec.remediation`` and ``spec.validation`` enabled (the validation Job's
pod held until the scenario, as the diagnostic, lets it pass 1-4 s later; KWOK ends it,
devkit/kwok/pod-validation.yaml). Each round a GPU of each node reports a row-remap failure (a
different GPU each round; the policy's action ``repair``): the node is drained and awaits a repair
(AwaitingRepair); the scenario "repairs" it (clean facts) and releases it (``gpuhealth.dev/release``), and, while its
validation runs, releases it again (a second release changes nothing). The kill monkey SIGKILLs the
operator every 10-25 s, and each round also right after the release, at the write-ahead record (the
Job's name recorded, not yet created), at the Job seen, and at the Job succeeded with the node not yet
back; the API server is SIGKILLed once a round, as the Job appears.

Judged (hack/chaos/decisions.py): one Job per validation started (the audit log's successful creates,
the Job objects), and no node freed of gpuhealth's taint without a validation Job of it succeeded
since the taint was first seen (the Jobs' own status, sampled every 0.3 s); every node back in
service at the end of each round.
"""

from __future__ import annotations

import time
from typing import Any

from devkit.k8s import healthy_spec
from devkit.ladder import validation_job_template
from gpuhealth.api.names import RELEASE_ANNOTATION
from hack.chaos import decisions as dc
from hack.chaos import invariants as inv
from hack.chaos.scenarios import decision_kit as kit
from hack.chaos.scenarios.common import drain_policy
from hack.chaos.scenarios.context import Ctx


def validation_policy(**validation: Any) -> dict[str, Any]:
    spec = drain_policy(maxUnhealthy="100%")
    spec["remediation"] = {"enabled": True, "maxConcurrent": 10}
    spec["validation"] = {
        "enabled": True,
        "level": 2,
        "maxConcurrent": 10,
        "jobTemplate": validation_job_template(0, hold=True, image="example.invalid/dcgm:chaos"),
        **validation,
    }
    return spec


def repair_fault(gpu: int) -> dict[str, Any]:
    """A row-remap failure: the policy's action ``repair`` (drained, then AwaitingRepair for a human)."""
    spec = healthy_spec()
    spec["devices"][gpu]["remappedRows"]["failure"] = True
    return spec


def release(ctx: Ctx, node: str, why: str) -> None:
    ctx.retry(ctx.kube.core.patch_node, node, {"metadata": {"annotations": {RELEASE_ANNOTATION: why}}})


def validation_kills(ctx: Ctx) -> None:
    rounds = ctx.n(3, 1)
    members = ctx.make_nodes(2)
    kit.remediation_namespace(ctx)
    ctx.extra_cleanup.append(lambda: kit.delete_jobs(ctx, members))
    ctx.policy(validation_policy())
    for n in members:
        ctx.put_report(n, healthy_spec())
        ctx.expect[n] = "healthy"
    op = ctx.operator()
    ctx.wait_states(members, lambda s: s.get("state") == "Healthy", 60, "all Healthy")
    samples: list[dc.HoldSample] = []
    kit.validation_sampler(ctx, members, inv.TAINT, samples)
    kit.unholding(ctx, members, (1.0, 4.0))
    monkey = kit.TimedMonkey(ctx, op, gap=kit.GAP, down=(0.0, 1.5))
    started: dict[str, int] = dict.fromkeys(members, 0)

    def statuses() -> dict[str, dict[str, Any]]:
        return ctx.statuses(members)

    def where() -> str:
        seen, st = kit.nodes(ctx), statuses()
        return "; ".join(
            f"{n}: {kit.node_words(seen.get(n), st.get(n, {}))} nodeValidation={st.get(n, {}).get('nodeValidation')}"
            for n in members
        )

    def record_not_created() -> bool:
        return any(
            (nv := s.get("nodeValidation") or {}).get("job") and not nv.get("created") for s in statuses().values()
        )

    def job_seen() -> bool:
        return bool(kit.node_validations(kit.jobs_of(ctx, members)))

    def passed_not_back() -> bool:
        jobs = kit.node_validations(kit.jobs_of(ctx, members))
        st = statuses()
        return any(
            st.get(n, {}).get("state") != "Healthy" and any(kit.succeeded(j) for j in js) for n, js in jobs.items()
        )

    try:
        order = list(range(8))
        ctx.rng.shuffle(order)
        for r in range(rounds):
            kit.delete_jobs(ctx, members)  # the last round's: each round's Jobs are its own
            gpu = order[r % 8]
            for n in members:
                ctx.put_report(n, repair_fault(gpu))
                ctx.fault(kind="gpu")

            def awaiting() -> bool:
                st = statuses()
                return all(st.get(n, {}).get("state") == "AwaitingRepair" for n in members)

            kit.settle(ctx, awaiting, 120, f"round {r}: awaiting repair", where)
            watches = [
                kit.kill_when(ctx, monkey, record_not_created, f"validation record written r{r}"),
                kit.kill_when(ctx, monkey, job_seen, f"validation job seen r{r}"),
                kit.kill_when(ctx, monkey, passed_not_back, f"validation passed, node not back r{r}"),
                kit.crash_when(ctx, job_seen, f"r{r}: validation Job seen"),
            ]
            for n in members:  # repaired: clean facts, then a human's release
                ctx.put_report(n, healthy_spec())
                release(ctx, n, f"repaired r{r}")
                started[n] += 1
            time.sleep(ctx.rng.uniform(0.0, 0.5))
            monkey.bounce(f"released r{r}")

            def running() -> bool:
                st = statuses()
                return any((st.get(n, {}).get("nodeValidation") or {}).get("result") == "Running" for n in members)

            kit.settle(ctx, running, 90, f"round {r}: a validation running", where)
            release(ctx, members[0], f"released again r{r}")  # a second release while it runs
            kit.back_in_service(ctx, members, 180, f"round {r}: validated and back")
            for w in watches:
                w.set()
            ctx.cycles += 1
    finally:
        kit.finish_monkey(ctx, monkey)
        time.sleep(1.0)  # the sampler's last look
        ctx.stop_background()
        kit.validation_checks(ctx, members, started, samples)
    ctx.note(
        f"{ctx.cycles} rounds of {len(members)} nodes awaiting repair, released and validated, "
        f"{monkey.kills} SIGKILLs (by moment: {monkey.by_mode}), "
        f"{len(ctx.stats.get('apiserver_crashes', []))} kube-apiserver crashes"
    )
