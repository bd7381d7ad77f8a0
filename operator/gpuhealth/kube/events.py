"""The Event call of ``Kube``: one core/v1 Event per announcement, posted at most once.

A concern of its own because an Event is not an object anyone reads back: its name is derived from
its content so a retried POST is recognised, and its timestamps come from when it happened, not
from when the background poster got to it. ``Kube`` inherits it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Protocol

from kubernetes import client

from gpuhealth.api.names import COMPONENT
from gpuhealth.api.timeutil import format_time_precise
from gpuhealth.kube.deadline import drained
from gpuhealth.kube.errors import is_conflict


class EventPort(Protocol):
    """The Event part of ``KubePort``."""

    def post_event(
        self,
        kind: str,
        name: str,
        uid: str,
        type_: str,
        reason: str,
        message: str,
        api_version: str = "v1",
        at: dt.datetime | None = None,
        namespace: str = "",
    ) -> None: ...


class EventSink(Protocol):
    """Where the controller announces what it did: ``controller/act/events.py``'s background poster
    (which posts through :class:`EventPort`), or a list in unit tests. Declared here, below the
    controller's rooms, so the watches' feeders and the rooms that act take the same type."""

    def __call__(
        self,
        kind: str,
        name: str,
        uid: str,
        type_: str,
        reason: str,
        message: str,
        api_version: str = "v1",
        namespace: str = "",
    ) -> None: ...


class EventCalls:
    core: client.CoreV1Api
    event_namespace: str
    instance: str

    def post_event(
        self,
        kind: str,
        name: str,
        uid: str,
        type_: str,
        reason: str,
        message: str,
        api_version: str = "v1",
        at: dt.datetime | None = None,
        namespace: str = "",
    ) -> None:
        """A core/v1 Event; for Nodes the uid is the node name, as kubelet does, so `describe` finds it.
        A namespaced object's Event (``namespace``: a Kueue Workload's) goes into its own namespace.

        ``at`` is when it happened (Events are posted in the background, a moment later). The name is
        derived from the Event itself, so a retry after a lost response (the first POST did land)
        finds it already there instead of posting the same announcement twice.
        """
        now = at or dt.datetime.now(dt.UTC)
        ns = namespace or self.event_namespace
        digest = hashlib.sha256(f"{kind}/{name}/{reason}/{message}/{self.instance}".encode()).hexdigest()[:8]
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{name}.{now.strftime('%Y%m%d%H%M%S%f')}{digest}",
                "namespace": ns,
            },
            "involvedObject": {
                "kind": kind,
                "name": name,
                "uid": uid,
                "apiVersion": api_version,
                **({"namespace": namespace} if namespace else {}),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
            "action": reason,
            "firstTimestamp": format_time_precise(now)[:19] + "Z",
            "lastTimestamp": format_time_precise(now)[:19] + "Z",
            "eventTime": format_time_precise(now),
            "count": 1,
        }
        try:
            drained(self.core.create_namespaced_event(ns, body, _preload_content=False))
        except Exception as e:
            if not is_conflict(e):
                raise  # 409: this very Event was posted by an earlier try whose response was lost
