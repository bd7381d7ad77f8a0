"""Scenario: invalid and hostile policies and reports."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from devkit.k8s import healthy_spec
from gpuhealth.api.durations import parse_duration
from hack.chaos import invariants as inv
from hack.chaos.fieldpath import names_field, refused_fields
from hack.chaos.scenarios.bad_input_cases import bad_policies, bad_reports
from hack.chaos.scenarios.common import SILENCE
from hack.chaos.scenarios.context import Ctx, xid


def _refused(ctx: Ctx, what: str, create: Callable[[], Any], path: str, cleanup: Callable[[], Any]) -> None:
    ctx.fault(kind="bad_input")
    try:
        create()
    except client.ApiException as e:
        body = e.body.decode() if isinstance(e.body, bytes) else str(e.body)
        if e.status != 422:
            ctx.violate(f"bad input {what!r}: refused with {e.status}, not 422: {body[:200]}")
        elif not names_field(body, path):
            ctx.violate(
                f"bad input {what!r}: the 422 names {sorted(refused_fields(body))}, not exactly {path}: {body[:300]}"
            )
        else:
            ctx.stats["refused"] = ctx.stats.get("refused", 0) + 1
        return
    ctx.violate(f"bad input {what!r} was accepted by the API server")
    cleanup()


def bad_input(ctx: Ctx) -> None:
    """Invalid and hostile policies and reports: refused by the API server with the field named, or,
    where no schema can refuse them, handled by the operator (Event, metric, no action, no crash)."""
    governed, lonely, clean, ghosty = ctx.make_nodes(4)
    for n in (governed, clean):
        ctx.silence[n] = parse_duration(SILENCE)
    ctx.policy(
        {"rules": {"agentSilence": {"after": SILENCE}}, "safety": {"maxUnhealthy": "100%"}},
        match={"chaos-role": "governed"},
        nodes=[governed, clean],
    )
    for n in (governed, clean):
        ctx.kube.core.patch_node(n, {"metadata": {"labels": {"chaos-role": "governed"}}})
    ctx.put_report(clean, healthy_spec())
    op = ctx.operator()
    ctx.wait_states([clean], lambda s: s.get("state") == "Healthy", 60, "Healthy")
    custom = ctx.kube.custom

    # 1. Refused by the API server, with the field named.
    for i, (what, spec, path) in enumerate(bad_policies()):
        name = f"{ctx.group}-bad-{i}"
        body = {"apiVersion": f"{inv.GROUP}/{inv.VERSION}", "kind": "GPUHealthPolicy", "metadata": {"name": name}}
        body["spec"] = spec
        _refused(
            ctx,
            f"policy: {what}",
            functools.partial(custom.create_cluster_custom_object, inv.GROUP, inv.VERSION, "gpuhealthpolicies", body),
            path,
            functools.partial(ctx.kube.delete_policy, name),
        )
    for what, spec, path in bad_reports(ghosty):
        body = {
            "apiVersion": f"{inv.GROUP}/{inv.VERSION}",
            "kind": "GPUNodeHealth",
            "metadata": {"name": ghosty},
            "spec": spec,
        }
        _refused(
            ctx,
            f"report: {what}",
            functools.partial(custom.create_cluster_custom_object, inv.GROUP, inv.VERSION, "gpunodehealths", body),
            path,
            lambda: custom.delete_cluster_custom_object(inv.GROUP, inv.VERSION, "gpunodehealths", ghosty),
        )

    # 2. Unknown fields: pruned, never stored.
    pname = f"{ctx.group}-pruned"
    ctx.fault(2, kind="bad_input")
    created = custom.create_cluster_custom_object(
        inv.GROUP,
        inv.VERSION,
        "gpuhealthpolicies",
        {
            "apiVersion": f"{inv.GROUP}/{inv.VERSION}",
            "kind": "GPUHealthPolicy",
            "metadata": {"name": pname},
            "spec": {
                "mode": "Paused",
                "nodeSelector": {"matchLabels": {"chaos-group": "nobody"}},
                "bogusField": {"a": 1},
                "rules": {"xid": {"secretSauce": True}},
            },
        },
    )
    ctx.policies.append(pname)
    stored = ctx.kube.get_policy(pname)["spec"]
    if "bogusField" in stored or "secretSauce" in stored.get("rules", {}).get("xid", {}):
        ctx.violate(f"unknown policy fields were stored: {stored}")
    del created
    spec = healthy_spec(gpus=1)
    spec["devices"][0]["secretSauce"] = "x"
    spec["bogus"] = 1
    ctx.put_report(ghosty, spec)
    rep = ctx.kube.report(ghosty)["spec"]
    if "bogus" in rep or "secretSauce" in rep["devices"][0]:
        ctx.violate(f"unknown report fields were stored: {rep}")
    else:
        ctx.stats["pruned"] = 2

    # 3. What no schema can refuse: the operator must handle it.
    before_reports = op.metric("gpuhealth_invalid_input_total", {"kind": "GPUNodeHealth"}) or 0.0
    before_policies = op.metric("gpuhealth_invalid_input_total", {"kind": "GPUHealthPolicy"}) or 0.0
    # (a) an XID on a GPU the report does not list (devices 0..7, XID 79 on GPU 12)
    ctx.put_report(governed, healthy_spec(xids=[xid(79, gpu=12)]))
    ctx.fault(kind="bad_input")
    ctx.expect[governed] = "untouched"
    # (b) a report for a node that does not exist
    ghost = f"{ctx.group}-ghost"
    ctx.fault(kind="bad_input")
    ctx.put_report(ghost, healthy_spec(xids=[xid(79, gpu=1)]))
    ctx.extra_cleanup.append(
        lambda: custom.delete_cluster_custom_object(inv.GROUP, inv.VERSION, "gpunodehealths", ghost)
    )
    # (c) a policy the schema accepts with a duration no clock can hold (99999999999h > 11 million years)
    huge = f"{ctx.group}-huge"
    ctx.fault(kind="bad_input")
    ctx.cluster.kubectl("label", "node", ghosty, "chaos-role=huge", "--overwrite")
    ctx.policy(
        {"rules": {"thermal": {"sustainedFor": "99999999999h"}, "agentSilence": {"after": SILENCE}}},
        name=huge,
        match={"chaos-role": "huge"},
        nodes=[ghosty],
    )
    ctx.put_report(ghosty, healthy_spec())
    # (d) valid but hostile: every GPU node, no breaker, lowest priority. It must still act sanely:
    #     quarantine the faulty node it governs, leave healthy ones alone.
    everything = f"{ctx.group}-everything"
    ctx.retry(
        ctx.kube.apply_policy,
        everything,
        {"priority": -1000, "safety": {"maxUnhealthy": "100%"}, "rules": {"agentSilence": {"after": SILENCE}}},
    )
    ctx.policies.append(everything)
    ctx.silence[lonely] = parse_duration(SILENCE)
    ctx.put_report(lonely, healthy_spec(xids=[xid(79, gpu=2)]))
    ctx.fault(kind="gpu")
    ctx.expect[lonely] = "out"
    ctx.expect[clean] = "healthy"
    ctx.wait_states([lonely], lambda s: s.get("state") in inv.FAULTED, 30, "the 100% policy quarantines")
    time.sleep(4.0)  # several sweeps over the hostile objects

    events = inv.operator_events(ctx)
    if not inv.events_on(events, governed, "InvalidReport"):
        ctx.violate(
            f"report with an XID on GPU 12, which it does not list: no InvalidReport Event on {governed} "
            f"(state {ctx.statuses([governed]).get(governed, {}).get('state')})"
        )
    after_reports = op.metric("gpuhealth_invalid_input_total", {"kind": "GPUNodeHealth"}) or 0.0
    if after_reports <= before_reports:
        ctx.violate("gpuhealth_invalid_input_total{kind=GPUNodeHealth} did not increase for the inconsistent report")
    if not inv.events_on(events, huge, "InvalidPolicy"):
        errors = op.metric("gpuhealth_reconcile_errors_total") or 0.0
        ctx.violate(
            f"policy with thermal.sustainedFor 99999999999h (accepted by the schema): no InvalidPolicy Event; "
            f"gpuhealth_reconcile_errors_total is {errors:.0f} (reconciles of its node fail)"
        )
    if (op.metric("gpuhealth_invalid_input_total", {"kind": "GPUHealthPolicy"}) or 0.0) <= before_policies:
        ctx.violate("gpuhealth_invalid_input_total{kind=GPUHealthPolicy} did not increase for the unusable policy")
    if ctx.retry(ctx.kube.core.list_node, field_selector=f"metadata.name={ghost}").items:
        ctx.violate("a Node was created for a report of a node that does not exist")
    ghost_events = inv.events_on(events, ghost)
    ctx.note(
        f"report for a node that does not exist: ignored, {len(ghost_events)} Events, no Node, no action "
        "(the operator only watches reports of nodes it knows)"
    )
    ctx.expect[ghosty] = "untouched"
    if op.popen is None or op.popen.poll() is not None:
        ctx.violate("the operator process died on bad input")
    try:
        op.metrics()
    except Exception as e:
        ctx.violate(f"the metrics endpoint is down after bad input: {e}")
    ctx.cycles += 1
    n_policies, n_reports = len(bad_policies()), len(bad_reports(ghosty))
    ctx.note(
        f"{n_policies} invalid policies and {n_reports} invalid reports sent: {ctx.stats.get('refused', 0)} refused "
        "with 422 naming the field; unknown fields pruned; plus 4 objects the schema cannot refuse"
    )
