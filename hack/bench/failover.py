"""The failover phase of `make bench` (``--phases failover``, issue #26): two operator replicas under
Kopf peering; how long from a SIGKILL of the acting one until a fault injected right after it is tainted.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from devkit.k8s import OperatorProcess
from hack.bench.resilience import ACTING, ResilienceContext, wait_ready
from hack.bench.support import TAINT, find_log_line, log, percentile

REPO = Path(__file__).resolve().parents[2]
PEERING_CRD = REPO / "manifests" / "crds" / "kopf-peering-crd.yaml"
PEERING_OBJECT = REPO / "manifests" / "base" / "peering.yaml"
PEERING_NAME = "gpuhealth"


def failover_summary(samples_s: Sequence[float | None], timeout_s: float) -> dict[str, Any]:
    """p50/max over the failover samples; a fault never tainted counts as the timeout (a lower bound)."""
    missed = sum(1 for s in samples_s if s is None)
    values = [s for s in samples_s if s is not None] + [timeout_s] * missed
    return {
        "p50_s": round(percentile(values, 50), 2) if values else None,
        "max_s": round(max(values), 2) if values else None,
        "samples": len(values),
        "timeouts": missed,
        "kill_to_taint_s": [None if s is None else round(s, 2) for s in samples_s],
    }


def measure_failover(
    ctx: ResilienceContext, operator: OperatorProcess, samples: int, timeout_s: float = 180.0
) -> tuple[dict[str, Any], list[OperatorProcess]]:
    """Failover under Kopf peering: ``samples`` times SIGKILL the acting replica, fault a fresh node at
    once, and time the kill to its taint (seen by the bench's Node watch); the killed replica comes back
    as the new standby (a lower priority than the survivor, so it never takes over by priority)."""
    ctx.phase(f"failover: two replicas under Kopf peering, {samples} SIGKILLs of the acting one")
    operator.stop()
    ctx.cluster.apply(PEERING_CRD)
    ctx.cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/clusterkopfpeerings.kopf.dev")
    ctx.cluster.apply(PEERING_OBJECT)
    prio = 1000
    live: list[tuple[OperatorProcess, Path, int]] = []
    # One after the other, as a rollout starts them: started at the same instant, the second may act for
    # a moment before the first one's keep-alive reaches it.
    for name in ("a", "b"):
        op, path, _ = ctx.start_operator(f"peer-{name}", [f"--peering={PEERING_NAME}", f"--priority={prio}"])
        live.append((op, path, prio))
        prio -= 1
        wait_ready(op, path)
        if name == "a" and find_log_line(path, ACTING, timeout=120) is None:
            raise RuntimeError(f"replica a never acted; see {path}")
    time.sleep(3.0)  # both keep-alives are in the peering object
    kill_to_taint: list[float | None] = []
    kill_to_acting: list[float | None] = []
    for i in range(samples):
        (node,) = ctx.take(1)
        acting, _, _ = live.pop(0)
        standby_path = live[0][1]
        # A standby may have acted for a moment at its own start, before the leader's keep-alive reached
        # it: only its takeover after this kill counts.
        offset = standby_path.stat().st_size
        t_kill = time.time()
        acting.kill()
        ctx.sims[node].fault()
        tainted = ctx.node_watch.wait_taint(node, TAINT, timeout=timeout_s)
        kill_to_taint.append(None if tainted is None else round(tainted - t_kill, 2))
        took = find_log_line(standby_path, ACTING, timeout=5, offset=offset)
        kill_to_acting.append(round(took[0] - t_kill, 2) if took else None)
        log(f"  sample {i + 1}: kill to taint {kill_to_taint[-1]}")
        op, path, _ = ctx.start_operator(f"peer-{i}", [f"--peering={PEERING_NAME}", f"--priority={prio}"])
        live.append((op, path, prio))
        prio -= 1
        wait_ready(op, path)
        time.sleep(3.0)  # its keep-alive is in, and the survivor has seen it
    res = failover_summary(kill_to_taint, timeout_s)
    res["kill_to_acting_s"] = kill_to_acting
    return res, [op for op, _, _ in live]
