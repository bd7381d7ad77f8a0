"""One operator run through the in-memory Kube, as the process tests drive it: a wall clock moved by hand,
the managedFields the API server keeps for an agent's writes, and the start-up a worker would run."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpuhealth.controller.process.runtime import Runtime
from tests.unit.builders import at, iso
from tests.unit.fake_kube import FakeKube

NS = "gpuhealth-system"


class WallClock:
    """The operator's clock (``Runtime(clock=...)``), moved by setting ``now``."""

    def __init__(self, now: dt.datetime | None = None) -> None:
        self.now = now or at(0)

    def __call__(self) -> dt.datetime:
        return self.now


def managed_field(field: str, seconds: float) -> dict[str, Any]:
    """The managedFields entry the API server keeps for the agent's writes of ``spec.<field>`` (its own
    clock, whole seconds)."""
    return {
        "manager": "gpuhealth-agent",
        "operation": "Update",
        "time": iso(int(seconds)),
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {f"f:{field}": {}}},
    }


async def work(rt: Runtime) -> None:
    """Reconcile whatever is queued, as the workers would, until the queue is empty."""
    while rt.queue._dirty:
        name = await rt.queue.get()
        try:
            await rt.reconciler.reconcile(name)
        finally:
            rt.queue.done(name)
    await rt.events.flush()


async def started(kube: FakeKube, clock: WallClock, lease_namespace: str = NS) -> Runtime:
    """One operator's start: list everything, then work off the start-up queue."""
    rt = Runtime(kube, clock=clock, workers=1, lease_namespace=lease_namespace)
    await rt._load()
    await rt._list_pods()
    await work(rt)
    return rt
