"""The scenarios' stand-in for training workloads that checkpoint on request: each pod asked to save
(``gpuhealth.dev/checkpoint-requested``) acknowledges after a random delay of its own, as a real job
finishing its save would, and what each saw and when is kept for the invariants (a second witness
next to the audit log: a pod evicted before it acknowledged)."""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
from collections.abc import Callable

from devkit.k8s import Kube
from gpuhealth.workload import COMPLETED, REQUESTED, acknowledge
from hack.chaos import invariants as inv


def acknowledging(
    kube: Kube, rng: random.Random, namespaces: list[str], max_delay: float, saw: dict[str, dt.datetime]
) -> Callable[[threading.Event], None]:
    """A loop (run until ``stop``) that acknowledges every checkpoint request in ``namespaces``, each
    up to ``max_delay`` s after it was first seen; ``saw`` gets when each pod's request was first seen."""
    seen: dict[tuple[str, str], float] = {}
    done: set[tuple[str, str]] = set()

    def loop(stop: threading.Event) -> None:
        while not stop.wait(0.3):
            for ns in namespaces:
                try:
                    pods = kube.core.list_namespaced_pod(ns).items
                except Exception:
                    continue
                for p in pods:
                    ann = p.metadata.annotations or {}
                    req = ann.get(REQUESTED)
                    if not req or p.metadata.deletion_timestamp:
                        continue
                    key = (p.metadata.uid, req)
                    saw.setdefault(f"{ns}/{p.metadata.name}", inv.now())
                    if key in done or (ann.get(COMPLETED) or "") >= req[:19]:
                        continue
                    first = seen.setdefault(key, time.monotonic() + rng.uniform(0, max_delay))
                    if time.monotonic() < first:
                        continue
                    try:
                        acknowledge(ns, p.metadata.name, kube.api)
                        done.add(key)
                    except Exception:
                        pass

    return loop
