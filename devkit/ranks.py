"""A checkpointing gang's pods as the drain tests see them: live, running, asked to checkpoint, and
acknowledging like the trainer's sidecar. Read from the real API server (no mocks)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from devkit.k8s import Kube
from gpuhealth.workload import acknowledge

REQUESTED = "gpuhealth.dev/checkpoint-requested"


def live_pods(kube: Kube, ns: str, app: str) -> list[Any]:
    """The app's pods that are not being deleted."""
    pods = kube.core.list_namespaced_pod(ns, label_selector=f"app={app}").items
    return [p for p in pods if not p.metadata.deletion_timestamp]


def running(kube: Kube, ns: str, app: str, count: int) -> list[Any] | None:
    """The app's running pods when there are exactly ``count`` (a ``wait_for`` predicate), else None."""
    ps = [p for p in live_pods(kube, ns, app) if p.status.phase == "Running"]
    return ps if len(ps) == count else None


def requested(kube: Kube, ns: str, app: str, count: int = 4) -> list[Any] | None:
    """The app's pods gpuhealth asked to checkpoint, when it has asked all ``count``, else None."""
    ps = [p for p in live_pods(kube, ns, app) if (p.metadata.annotations or {}).get(REQUESTED)]
    return ps if len(ps) == count else None


def acknowledge_all(kube: Kube, ns: str, pods: Iterable[Any]) -> None:
    """Each pod's trainer says its checkpoint is saved (``gpuhealth.workload.acknowledge``)."""
    for p in pods:
        acknowledge(ns, p.metadata.name, kube.api)
