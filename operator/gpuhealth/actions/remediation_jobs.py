"""The GPU reset Job: its deterministic name, its body, the check that it touches only that GPU on
that node, and what its status says. Pure.

By default the Job runs NVIDIA's own tool, ``nvidia-smi -r -i <GPU UUID>``, with the NVIDIA
Container Toolkit's ``NVIDIA_VISIBLE_DEVICES=<UUID>`` and ``NVIDIA_DRIVER_CAPABILITIES=utility``
(the toolkit mounts nvidia-smi and that one GPU's device node), privileged, pinned to the node by
``nodeName`` and tolerating gpuhealth's taints (the node's, and a device-plugin node's ``gpu-out``).
A policy's ``jobTemplate`` replaces the pod; its
strings may use ``${NODE_NAME}``, ``${GPU_UUID}`` and ``${GPU_INDEX}``. Whatever the template,
the rendered Job must be pinned to the node (``nodeName`` or a required node affinity on
``kubernetes.io/hostname``) and must name the GPU's UUID in a container: otherwise no Job.

The name depends only on the node, the GPU, the ladder's start and the attempt, so a restarted
operator finds the Job it created (a second create answers 409) and never resets twice.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from gpuhealth.api.names import (
    DEVICE_GPU_LABEL,
    DEVICE_NODE_LABEL,
    GPU_OUT_TAINT_KEY,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    TAINT_KEY,
)
from gpuhealth.api.remediation import INDEX_PLACEHOLDER, NODE_PLACEHOLDER, UUID_PLACEHOLDER, RemediationSettings

HOSTNAME_LABEL = "kubernetes.io/hostname"
STEP_LABEL = "gpuhealth.dev/remediation-step"
TTL_AFTER_FINISHED_S = 86400  # the result is read long before; a day leaves it for humans
_UNSAFE = re.compile(r"[^a-z0-9-]")


def job_name(node: str, index: int, uuid: str, episode: str, attempt: int) -> str:
    """``gpuhealth-reset-<node>-<index>-<attempt>-<hash>``, at most 63 characters (a label value)."""
    digest = hashlib.sha256(f"{node}|{index}|{uuid}|{episode}|{attempt}".encode()).hexdigest()[:8]
    tail = f"-{index}-{attempt}-{digest}"
    head = _UNSAFE.sub("-", f"gpuhealth-reset-{node}".lower())[: 63 - len(tail)].rstrip("-")
    return head + tail


def _render(value: Any, subs: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        for k, v in subs.items():
            value = value.replace(k, v)
        return value
    if isinstance(value, list):
        return [_render(v, subs) for v in value]
    if isinstance(value, Mapping):
        return {k: _render(v, subs) for k, v in value.items()}
    return value


def default_pod(settings: RemediationSettings) -> dict[str, Any]:
    return {
        "nodeName": NODE_PLACEHOLDER,
        "containers": [
            {
                "name": "reset",
                "image": settings.image,
                "command": ["nvidia-smi", "-r", "-i", UUID_PLACEHOLDER],
                "env": [
                    {"name": "NVIDIA_VISIBLE_DEVICES", "value": UUID_PLACEHOLDER},
                    {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
                ],
                "securityContext": {"privileged": True},
            }
        ],
    }


def pinned_to(pod: Mapping[str, Any], node: str) -> bool:
    """The pod can run on ``node`` only: nodeName, or every required affinity term names it alone."""
    if pod.get("nodeName"):
        return bool(pod.get("nodeName") == node)
    required = (
        ((pod.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
        or {}
    ).get("nodeSelectorTerms") or []
    if not required:
        return False
    for term in required:
        exprs = [*(term.get("matchExpressions") or []), *(term.get("matchFields") or [])]
        if not any(
            e.get("key") in (HOSTNAME_LABEL, "metadata.name")
            and e.get("operator") == "In"
            and e.get("values") == [node]
            for e in exprs
        ):
            return False
    return True


def build_reset_job(
    settings: RemediationSettings, node: str, index: int, uuid: str, name: str, timeout_s: float
) -> tuple[dict[str, Any] | None, str]:
    """The reset Job for one GPU, or None and why not (in words, for the Event)."""
    if not uuid:
        return None, f"GPU {index} has no UUID in the agent's report: a reset could not be confined to it"
    template = copy.deepcopy(dict(settings.job_template or {}))
    spec = template.get("spec") or {}
    pod_tmpl = spec.get("template") or {}
    pod = pod_tmpl.get("spec") or default_pod(settings)
    subs = {NODE_PLACEHOLDER: node, UUID_PLACEHOLDER: uuid, INDEX_PLACEHOLDER: str(index)}
    pod = _render(pod, subs)
    if not pinned_to(pod, node):
        return None, f"the reset Job template is not pinned to node {node} (nodeName or hostname affinity)"
    if uuid not in json.dumps(pod.get("containers") or []):
        return None, f"the reset Job template does not name GPU {uuid} in its containers"
    labels = {
        MANAGED_BY_LABEL: MANAGED_BY_VALUE,
        DEVICE_NODE_LABEL: node[:63],
        DEVICE_GPU_LABEL: str(index),
        STEP_LABEL: "GPUReset",
    }
    body = gpu_job(
        name,
        settings.namespace,
        settings.service_account,
        uuid,
        template,
        pod,
        subs,
        labels,
        timeout_s,
    )
    return body, ""


def gpu_job(
    name: str,
    namespace: str,
    service_account: str,
    uuid: str,
    template: Mapping[str, Any],
    pod: dict[str, Any],
    subs: Mapping[str, str],
    labels: Mapping[str, str],
    timeout_s: float,
) -> dict[str, Any]:
    """A Job that runs ``pod`` (rendered, pinned to the GPU's node) once for one GPU, as the reset and
    the validation Jobs both are: never retried by the Job controller (a retry is the ladder's
    decision), bounded by ``timeout_s``, tolerating gpuhealth's own taints, labelled so the operator
    finds it again after a restart, kept a day for humans. The template's own Job and pod metadata
    and Job spec fields are kept, gpuhealth's labels over them."""
    spec = template.get("spec") or {}
    pod_tmpl = spec.get("template") or {}
    pod.setdefault("restartPolicy", "Never")
    pod.setdefault("serviceAccountName", service_account)
    pod.setdefault("automountServiceAccountToken", False)
    tolerations = list(pod.get("tolerations") or [])
    for key in (TAINT_KEY, GPU_OUT_TAINT_KEY):  # gpu-out: a device-plugin node's, while one of its GPUs is out
        if not any(t.get("key") == key for t in tolerations):
            tolerations.append({"key": key, "operator": "Exists"})
    pod["tolerations"] = tolerations
    meta_t = _render(pod_tmpl.get("metadata") or {}, subs)
    job_meta = _render(template.get("metadata") or {}, subs)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**(job_meta.get("labels") or {}), **labels},
            "annotations": {**(job_meta.get("annotations") or {}), "gpuhealth.dev/uuid": uuid},
        },
        "spec": {
            **{k: v for k, v in _render(spec, subs).items() if k != "template"},
            "backoffLimit": 0,
            "activeDeadlineSeconds": max(1, int(timeout_s)),
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
            "template": {
                "metadata": {
                    "labels": {**(meta_t.get("labels") or {}), **labels},
                    "annotations": dict(meta_t.get("annotations") or {}),
                },
                "spec": pod,
            },
        },
    }


def job_outcome(job: Mapping[str, Any] | None) -> str:
    """``Absent``, ``Running``, ``Succeeded`` or ``Failed`` from a Job (its conditions)."""
    if job is None:
        return "Absent"
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("status") != "True":
            continue
        if c.get("type") == "Complete":
            return "Succeeded"
        if c.get("type") == "Failed":
            return "Failed"
    return "Running"
