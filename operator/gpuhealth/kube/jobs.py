"""The remediation calls of ``Kube``: reset Jobs (batch/v1, one namespace) and the pods of one node.

Kept apart from ``client.py`` only for size; ``Kube`` inherits them. One request per call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes import client

from gpuhealth.kube.deadline import drained


class JobCalls:
    api: client.ApiClient

    def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        resp = client.BatchV1Api(self.api).read_namespaced_job(name, namespace, _preload_content=False)
        return json.loads(resp.data)  # type: ignore[no-any-return]

    def create_job(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create one Job; 409 if its (deterministic) name exists, which callers treat as done."""
        resp = client.BatchV1Api(self.api).create_namespaced_job(namespace, body, _preload_content=False)
        return json.loads(resp.data)  # type: ignore[no-any-return]

    def delete_job(self, namespace: str, name: str) -> None:
        """Delete a Job and its pods (a reset that ran past its timeout)."""
        drained(
            client.BatchV1Api(self.api).delete_namespaced_job(
                name, namespace, body={"propagationPolicy": "Background"}, _preload_content=False
            )
        )

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete one pod, gracefully, only if it is still the one with ``uid`` (the device plugin's
        pod after a repair, its DaemonSet makes a new one): 409 if a pod of that name is another, 404 if
        it is gone, which callers treat as done."""
        drained(
            client.CoreV1Api(self.api).delete_namespaced_pod(
                name, namespace, body={"preconditions": {"uid": uid}}, _preload_content=False
            )
        )

    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        """The pods the API has on ``node`` right now (a reset's last check, not the cache)."""
        resp = client.CoreV1Api(self.api).list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _preload_content=False
        )
        return list(json.loads(resp.data).get("items") or [])
