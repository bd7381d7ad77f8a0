"""What a failed integration test leaves behind: the state of its own nodes, read when it fails.

A wait that times out says only what it waited for. This reads, for every node whose name starts
with the test's group, what gpuhealth and the cluster made of it (the node's labels and taints, the
report's status, the node's Events, the DeviceTaintRules and ResourceSlices of its pool) and the
operator's watch counters, so that a failure seen once (a full-suite-only flake) can be explained
from its own output instead of by running it again.
"""

from __future__ import annotations

import json
from typing import Any

from devkit import dra
from devkit.k8s import Kube, OperatorProcess


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception as e:  # a diagnosis never hides the test's own failure
        return f"<{type(e).__name__}: {e}>"


def _node(kube: Kube, name: str) -> dict[str, Any]:
    n = kube.node(name)
    meta, spec = n.get("metadata") or {}, n.get("spec") or {}
    return {
        "labels": {k: v for k, v in (meta.get("labels") or {}).items() if "gpuhealth" in k},
        "annotations": {k: v for k, v in (meta.get("annotations") or {}).items() if "gpuhealth" in k},
        "unschedulable": spec.get("unschedulable", False),
        "taints": spec.get("taints") or [],
    }


def _events(kube: Kube, name: str) -> list[str]:
    evs = sorted(kube.node_events(name), key=lambda e: str(e.last_timestamp or e.event_time or ""))
    return [f"{e.last_timestamp or e.event_time} {e.type} {e.reason} x{e.count or 1}: {e.message}" for e in evs]


def _pool(kube: Kube, plural: str, name: str, pool_of: Any) -> list[str]:
    items = kube.custom.list_cluster_custom_object(dra.G, dra.V, plural).get("items") or []
    return [
        f"{m['name']} rv={m.get('resourceVersion')} created={m.get('creationTimestamp')}"
        for o in items
        if (m := o["metadata"])
        if pool_of(o) == name
    ]


def _watch_metrics(operator: OperatorProcess) -> list[str]:
    lines = operator.metrics().splitlines()
    keep = ("gpuhealth_watch_", "gpuhealth_reconcile", "gpuhealth_queue", "gpuhealth_leader")
    return [ln for ln in lines if ln.startswith(keep) and "_created" not in ln]


def _log_tail(operator: OperatorProcess, lines: int = 40) -> list[str]:
    return operator.log.read_text(errors="replace").splitlines()[-lines:]


def diagnose(kube: Kube, group: str, operator: OperatorProcess | None) -> str:
    """Everything above for the group's nodes, as text (errors reading any part are shown, not raised)."""
    nodes = _safe(lambda: [n.metadata.name for n in kube.core.list_node().items if n.metadata.name.startswith(group)])
    out: dict[str, Any] = {"group": group, "nodes": {}}
    for name in nodes if isinstance(nodes, list) else []:
        out["nodes"][name] = {
            "node": _safe(lambda n=name: _node(kube, n)),
            "report status": _safe(lambda n=name: kube.report(n).get("status")),
            "events": _safe(lambda n=name: _events(kube, n)),
            "rules": _safe(
                lambda n=name: _pool(kube, "devicetaintrules", n, lambda o: o["spec"]["deviceSelector"].get("pool"))
            ),
            "slices": _safe(lambda n=name: _pool(kube, "resourceslices", n, lambda o: o["spec"]["pool"]["name"])),
        }
    if operator is not None and operator.popen is not None and operator.popen.poll() is None:
        out["operator"] = _safe(lambda: _watch_metrics(operator))
    if operator is not None:
        out["operator log"] = _safe(lambda: _log_tail(operator))
    out["slices in the cluster"] = _safe(
        lambda: len(kube.custom.list_cluster_custom_object(dra.G, dra.V, "resourceslices").get("items") or [])
    )
    return json.dumps(out, indent=1, default=str)
