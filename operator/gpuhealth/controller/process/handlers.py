"""Kopf handlers: thin. They log in, start and stop the runtime, feed it policies, and tell it
whether this replica acts (peering); all decisions live elsewhere.

Kopf watches only GPUHealthPolicies, with an event handler and a daemon, so it never writes
finalizers or progress annotations on anything. The fleet (GPU Nodes, reports, pods, Leases,
ResourceSlices) comes through the runtime's own slim reflectors (the four watches of
``intake/objectwatch.py``, and ``intake/slicewatch.py``), filtered server-side and cut to the fields
read as they are parsed: Kopf's per-object processing and body copies cost too much at fleet size
(docs/scaling.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import kopf
from kubernetes import client

from gpuhealth.api.names import GROUP, POLICY_PLURAL, VERSION
from gpuhealth.controller.process.runtime import Runtime
from gpuhealth.kube import credentials

log = logging.getLogger(__name__)


class NoDiffBase(kopf.DiffBaseStorage):
    """A diff base that is never built or stored: gpuhealth registers no on.create/update handlers."""

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def connection_info(cfg: client.Configuration, trust_env: bool = False) -> kopf.ConnectionInfo:
    """Kopf's view of a client Configuration (what ``kopf.login_via_client`` extracts, without
    loading the client's global default configuration)."""
    header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        username=cfg.username or None,
        password=cfg.password or None,
        scheme=scheme,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        trust_env=trust_env,
    )


def register(
    registry: kopf.OperatorRegistry,
    runtime: Runtime,
    kubeconfig: str | None = None,
    peering_lifetime_s: int | None = None,
) -> None:
    """Attach the handlers for one runtime to a Kopf registry; ``kubeconfig`` as for ``credentials.load``;
    ``peering_lifetime_s``: how long this replica's peering keep-alive stays valid (None: Kopf's default)."""

    @kopf.on.login(registry=registry)
    def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
        # The same credential chain as the operator's own client (re-read on each login, so a
        # rotated service-account token is picked up when Kopf logs in again after a 401).
        return connection_info(credentials.load(kubeconfig), trust_env=settings.networking.trust_env)

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # our own Events say what happened; no Kopf chatter on Nodes
        settings.scanning.disabled = True  # no cluster-wide namespace/CRD listing: least privilege
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.watching.connect_timeout = 10
        # List in pages, not in one response held whole in memory.
        settings.watching.chunk_size = 500
        # Bound Kopf's per-object workers, and let them end soon after the object goes quiet.
        settings.queueing.worker_limit = 200
        settings.queueing.idle_timeout = 2.0
        # Only event handlers and a daemon here: no handler reads a diff, so skip the deep copy of
        # every watched body Kopf would otherwise take to build one (the largest cost in a storm).
        settings.persistence.diffbase_storage = NoDiffBase()
        settings.networking.request_timeout = 30
        if peering_lifetime_s is not None:
            settings.peering.lifetime = peering_lifetime_s
        await runtime.start()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await runtime.stop()

    @kopf.daemon(GROUP, VERSION, POLICY_PLURAL, registry=registry, cancellation_timeout=5)
    async def acting(stopped: kopf.DaemonStopped, **_: Any) -> None:
        # Kopf stops every daemon while peering pauses this replica and restarts them when it resumes:
        # the runtime acts only while at least one of these runs, so a standby replica never acts.
        runtime.hold()
        try:
            await stopped.wait()
        finally:
            runtime.release()

    @kopf.on.event(GROUP, VERSION, POLICY_PLURAL, registry=registry)
    async def policy_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        await runtime.ready.wait()
        runtime.on_policy(type, body)
