"""Which device plugin pod to restart for a repaired GPU, and whether its DaemonSet would start it again. Pure.

NVIDIA's device plugin marks a GPU ``Unhealthy`` on a critical XID and never takes it back: "there is
no way to recover from the Unhealthy state" (``internal/plugin/server.go``, k8s-device-plugin v0.17.4)
until the plugin restarts. After a repair the remediator deletes the plugin's pod on the GPU's node
and its DaemonSet creates a new one, which registers every healthy GPU with the kubelet again.

:func:`plugin_pod` picks that pod from the pods the API has on the node: the one in the policy's
``spec.remediation.devicePlugin.namespace`` whose labels carry its ``matchLabels``, not already being
deleted. None, or more than one: nothing is deleted and the reason says why. The DaemonSet controller
creates a daemon pod only on a node whose NoSchedule and NoExecute taints the pod tolerates (the
tolerations it needs of its own, such as ``node.kubernetes.io/unschedulable``, are already in the
pod's spec): a pod that does not tolerate one of the node's (gpuhealth's ``gpu-out`` taint, held while
another GPU is out) would not come back, and all of the node's GPUs would leave the scheduler with
it, so it is not deleted either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuhealth.api.remediation import DevicePluginSettings

_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' rule (``v1.Toleration.ToleratesTaint``): an empty key with ``Exists`` tolerates every
    taint; otherwise the key must match, then ``Exists`` or an equal value; an empty effect matches all."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if not key:
        return operator == "Exists"
    if key != taint.get("key"):
        return False
    return operator == "Exists" or (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated(pod: Mapping[str, Any], node: Mapping[str, Any] | None) -> list[str]:
    """The keys of the node's NoSchedule and NoExecute taints the pod does not tolerate."""
    tolerations = [t for t in ((pod.get("spec") or {}).get("tolerations") or []) if isinstance(t, Mapping)]
    taints = [t for t in (((node or {}).get("spec") or {}).get("taints") or []) if isinstance(t, Mapping)]
    return [
        str(t.get("key"))
        for t in taints
        if t.get("effect") in _BLOCKING_EFFECTS and not any(tolerates(tol, t) for tol in tolerations)
    ]


def plugin_pod(
    pods: Sequence[Mapping[str, Any]], settings: DevicePluginSettings, node: Mapping[str, Any] | None, node_name: str
) -> tuple[Mapping[str, Any] | None, str]:
    """The device plugin's pod on the node to restart, or None and why not (in words)."""
    mine = [
        p
        for p in pods
        if (p.get("metadata") or {}).get("namespace") == settings.namespace
        and all(((p.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in settings.match_labels.items())
        and not (p.get("metadata") or {}).get("deletionTimestamp")
    ]
    where = f"namespace {settings.namespace}, labels {settings.selector}"
    if not mine:
        return None, f"no pod of the device plugin ({where}) runs on node {node_name}"
    if len(mine) > 1:
        names = ", ".join(sorted(str(p["metadata"].get("name")) for p in mine))
        return None, f"more than one pod of the device plugin ({where}) runs on node {node_name}: {names}"
    pod = mine[0]
    keys = untolerated(pod, node)
    if keys:
        name = f"{settings.namespace}/{pod['metadata'].get('name')}"
        return None, (
            f"its pod {name} does not tolerate the node's taint {', '.join(keys)}, so its DaemonSet would not "
            "start it again on this node (add the toleration to the device plugin's DaemonSet)"
        )
    return pod, ""


def restart_hint(settings: DevicePluginSettings, node_name: str) -> str:
    """What a human runs to restart the plugin on the node, for the Event and the record's message."""
    where = f"-n {settings.namespace} -l {settings.selector}"
    return f"kubectl delete pod {where} --field-selector spec.nodeName={node_name}"
