"""What the ladder_kills scenario sets up and samples: the remediation policy (a reset Job template
that succeeds, or on the ``fail`` node fails), its namespace, the reset Jobs, and the two samplers
whose histories the invariants in ``hack/chaos/ladder.py`` judge (each GPU's ladder record, and
which pod holds which GPU)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from kubernetes import client

from devkit import dra
from devkit.k8s import healthy_spec
from devkit.ladder import reset_job_template
from devkit.timeparse import now
from hack.chaos import ladder as ld
from hack.chaos.scenarios import device_kills as dk
from hack.chaos.scenarios.common import drain_policy
from hack.chaos.scenarios.context import Ctx

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
