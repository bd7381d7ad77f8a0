"""Kopf handlers: thin. They feed the reconciler's caches and queue; all decisions live elsewhere.

Nodes are watched with event handlers only, so Kopf never writes finalizers or progress annotations
on them; the Node watch is filtered server-side to GPU nodes.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from gpuhealth.api.names import GROUP, POLICY_PLURAL, REPORT_PLURAL, VERSION
from gpuhealth.controller.reconciler import NODE_SELECTOR, Reconciler

log = logging.getLogger(__name__)


def register(registry: kopf.OperatorRegistry, reconciler: Reconciler) -> None:
    """Attach the handlers for one reconciler to a Kopf registry."""

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # In-cluster service account, else the kubeconfig named by KUBECONFIG (read at call time).
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # our own Events say what happened; no Kopf chatter on Nodes
        settings.scanning.disabled = True  # no cluster-wide namespace/CRD listing: least privilege
        settings.watching.label_selectors["v1", "nodes"] = NODE_SELECTOR
        settings.watching.field_selectors["v1", "pods"] = "spec.nodeName!="  # only pods placed on a node
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.watching.connect_timeout = 10
        # Bound Kopf's per-object workers: with thousands of pods the initial listing would otherwise
        # start a task (holding a full pod body) per pod at once.
        settings.batching.worker_limit = 200
        settings.batching.idle_timeout = 2.0
        settings.networking.request_timeout = 30
        await reconciler.start()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await reconciler.stop()

    @kopf.on.event("v1", "nodes", registry=registry)
    async def node_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        await reconciler.ready.wait()
        reconciler.on_node(type, body)

    @kopf.on.event(GROUP, VERSION, REPORT_PLURAL, registry=registry)
    async def report_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        await reconciler.ready.wait()
        reconciler.on_report(type, body)

    @kopf.on.event("v1", "pods", registry=registry)
    async def pod_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        await reconciler.ready.wait()
        reconciler.on_pod(type, body)

    @kopf.daemon(GROUP, VERSION, POLICY_PLURAL, registry=registry, cancellation_timeout=5)
    async def acting(stopped: kopf.DaemonStopped, **_: Any) -> None:
        # Kopf stops every daemon while peering pauses this replica and restarts them when it resumes:
        # the reconciler acts only while at least one of these runs, so a standby replica never acts.
        reconciler.hold()
        try:
            await stopped.wait()
        finally:
            reconciler.release()

    @kopf.on.event(GROUP, VERSION, POLICY_PLURAL, registry=registry)
    async def policy_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        await reconciler.ready.wait()
        reconciler.on_policy(type, body)
