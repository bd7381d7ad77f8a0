"""Every Kubernetes API call `kubectl gpuhealth` makes (plain dicts in and out).

Credentials are found the way kubectl finds them: ``--kubeconfig``, else ``$KUBECONFIG`` (a list of
files, merged), else ``~/.kube/config``, else the pod's service account when running in a cluster.
Every failure becomes an :class:`~gpuhealth.cli.errors.ApiError` with one readable line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from gpuhealth.api.names import (
    COMPONENT,
    DRA_GROUP,
    DRA_VERSION,
    GPU_PRESENT_LABEL,
    GROUP,
    POLICY_PLURAL,
    REPORT_PLURAL,
    VERSION,
)
from gpuhealth.cli.errors import ApiError
from gpuhealth.kube import credentials as kubeconfig_chain
from gpuhealth.kube.paging import PAGE, list_all

MERGE = "application/merge-patch+json"
T = TypeVar("T")


def load_configuration(kubeconfig: str | None = None, context: str | None = None) -> client.Configuration:
    """Client configuration from the kubeconfig chain, then in-cluster; ApiError if neither works."""
    path = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    try:
        return kubeconfig_chain.load(kubeconfig, context, in_cluster_first=False)
    except config.ConfigException as e:
        if not kubeconfig and not os.environ.get("KUBECONFIG") and not os.path.exists(path):
            raise ApiError(
                "no Kubernetes credentials: pass --kubeconfig, set KUBECONFIG or create ~/.kube/config "
                "(or run inside a cluster)"
            ) from None
        raise ApiError(f"cannot load Kubernetes credentials from {path}: {_one_line(str(e))}") from None
    except Exception as e:  # unreadable or malformed kubeconfig: OSError, ValueError, YAML errors
        raise ApiError(f"cannot load Kubernetes credentials from {path}: {_one_line(str(e))}") from None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _api_message(e: ApiException) -> str:
    """The API server's own message (a Status object), else the HTTP reason."""
    reason = e.reason or "error"
    try:
        body = json.loads(e.body) if e.body else {}
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    if message:
        return f"{body.get('reason') or reason} ({e.status}): {_one_line(str(message))}"
    return f"{reason} ({e.status})"


class NotFound(ApiError):
    """The object does not exist (HTTP 404)."""


class Client:
    """Thin, synchronous access to Nodes, Events, pods, DRA slices and claims, and gpuhealth's two resources."""

    def __init__(self, cfg: client.Configuration, timeout: float = 30.0) -> None:
        self.host = cfg.host
        self.api = client.ApiClient(cfg)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.coordination = client.CoordinationV1Api(self.api)
        self.timeout = timeout

    @contextmanager
    def _calling(self, what: str) -> Iterator[None]:
        try:
            yield
        except ApiException as e:
            if e.status == 404:
                raise NotFound(f"{what}: {_api_message(e)}", 404) from None
            if not e.status:
                raise ApiError(f"{what}: {_one_line(str(e.reason))}") from None
            raise ApiError(f"{what}: {_api_message(e)}", int(e.status)) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise ApiError(f"{what}: cannot reach the API server at {self.host}: {_one_line(str(e))}") from None

    def _raw(self, what: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        with self._calling(what):
            resp = fn(*args, _preload_content=False, _request_timeout=self.timeout, **kw)
            return json.loads(resp.data)

    def _read(self, what: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> dict[str, Any] | None:
        """One object, or None when it does not exist."""
        try:
            return self._raw(what, fn, *args, **kw)  # type: ignore[no-any-return]
        except NotFound:
            return None

    def _pages(self, what: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> list[dict[str, Any]]:
        def fetch(cont: str | None) -> dict[str, Any]:
            extra = {"_continue": cont} if cont else {}
            return self._raw(what, fn, *args, limit=PAGE, **kw, **extra)  # type: ignore[no-any-return]

        return list_all(fetch)

    # -- nodes -----------------------------------------------------------------------------------

    def list_gpu_nodes(self, selector: str = "") -> list[dict[str, Any]]:
        """GPU nodes (label ``nvidia.com/gpu.present=true``), further narrowed by ``selector``."""
        full = f"{GPU_PRESENT_LABEL}=true" + (f",{selector}" if selector else "")
        return self._pages("list nodes", self.core.list_node, label_selector=full)

    def get_node(self, name: str) -> dict[str, Any] | None:
        return self._read(f"get node/{name}", self.core.read_node, name)

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return self._raw(  # type: ignore[no-any-return]
            f"patch node/{name}", self.core.patch_node, name, patch, _content_type=MERGE
        )

    def whoami(self) -> str:
        """The user name the API server authenticates this client as (a SelfSubjectReview, which any
        authenticated user may create): what an approval records, and what the admission policy checks."""
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        review = self._raw(
            "create selfsubjectreview (who am I)", client.AuthenticationV1Api(self.api).create_self_subject_review, body
        )
        user = str(((review.get("status") or {}).get("userInfo") or {}).get("username") or "")
        if not user:
            raise ApiError("create selfsubjectreview (who am I): the API server named no user")
        return user

    # -- events ----------------------------------------------------------------------------------

    def node_events(self, name: str, namespace: str) -> list[dict[str, Any]]:
        """gpuhealth's Events about the Node ``name`` (involvedObject.name, source.component)."""
        items = self._pages(
            "list events",
            self.core.list_namespaced_event,
            namespace,
            field_selector=f"involvedObject.kind=Node,involvedObject.name={name}",
        )
        return [
            e
            for e in items
            if (e.get("source") or {}).get("component") == COMPONENT or e.get("reportingComponent") == COMPONENT
        ]

    # -- pods and DRA (for the MIG layout) -------------------------------------------------------------

    def node_pods(self, node: str) -> list[dict[str, Any]]:
        """The pods bound to ``node``."""
        return self._pages("list pods", self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}")

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One pod (its status: the kubelet's device health), or None when it does not exist."""
        return self._read(f"get pod/{name} -n {namespace}", self.core.read_namespaced_pod, name, namespace)

    def node_resource_slices(self, node: str) -> list[dict[str, Any]]:
        """The ResourceSlices of ``node``; none where the API server serves no resource.k8s.io/v1."""
        try:
            return self._pages(
                "list resourceslices",
                self.custom.list_cluster_custom_object,
                DRA_GROUP,
                DRA_VERSION,
                "resourceslices",
                field_selector=f"spec.nodeName={node}",
            )
        except NotFound:
            return []

    def namespace_resource_claims(self, namespace: str) -> list[dict[str, Any]]:
        """The ResourceClaims of ``namespace``: which of its pods hold which devices. A pod's claims are
        always in its own namespace, so a node's holders come from its pods' namespaces, never from a
        list of every claim of the cluster."""
        try:
            return self._pages(
                f"list resourceclaims -n {namespace}",
                self.custom.list_namespaced_custom_object,
                DRA_GROUP,
                DRA_VERSION,
                namespace,
                "resourceclaims",
            )
        except NotFound:
            return []

    # -- gpuhealth resources -----------------------------------------------------------------------

    def list_reports(self) -> list[dict[str, Any]]:
        return self._pages("list gpunodehealths", self.custom.list_cluster_custom_object, GROUP, VERSION, REPORT_PLURAL)

    def get_report(self, name: str) -> dict[str, Any] | None:
        return self._read(
            f"get gpunodehealth/{name}", self.custom.get_cluster_custom_object, GROUP, VERSION, REPORT_PLURAL, name
        )

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The agent's heartbeat Lease for a node, or None when it has none."""
        return self._read(f"get lease/{name} in {namespace}", self.coordination.read_namespaced_lease, name, namespace)

    def list_policies(self) -> list[dict[str, Any]]:
        return self._pages(
            "list gpuhealthpolicies", self.custom.list_cluster_custom_object, GROUP, VERSION, POLICY_PLURAL
        )

    def get_policy(self, name: str) -> dict[str, Any] | None:
        return self._read(
            f"get gpuhealthpolicy/{name}", self.custom.get_cluster_custom_object, GROUP, VERSION, POLICY_PLURAL, name
        )

    def patch_policy(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return self._raw(  # type: ignore[no-any-return]
            f"patch gpuhealthpolicy/{name}",
            self.custom.patch_cluster_custom_object,
            GROUP,
            VERSION,
            POLICY_PLURAL,
            name,
            patch,
            _content_type=MERGE,
        )
