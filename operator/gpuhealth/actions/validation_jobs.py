"""The validation Job (``spec.validation``): its deterministic name, its body, and its verdict. Pure.

By default the Job runs NVIDIA's DCGM diagnostic on exactly the GPU being validated,
``dcgmi diag -r <level> -i <GPU index> --json --host <hostengine>``, against the node-local
hostengine (NVIDIA's GPU Operator serves it as ``nvidia-dcgm.<ns>.svc:5555`` with traffic kept on
the node). It requests no GPU: the scheduler would not see the GPU busy, which is why the remediator
starts it only while gpuhealth's DeviceTaintRule holds the GPU out and no pod holds it. A small
shell wrapper puts the result where Kubernetes hands it back, the termination message (4 KiB): the
whole JSON when it fits, else a compact summary (``api/diag.py``). A policy's ``jobTemplate`` follows
the reset Job's rules (``actions/remediation_jobs.py``): pinned to ``${NODE_NAME}``, naming
``${GPU_UUID}`` or ``${GPU_INDEX}``; it may also use ``${VALIDATION_LEVEL}``.

The verdict comes from evidence: the Job's end, its pod's exit code and termination message. A Job
that vanished, or a pod that ended without a result (deleted, or its node lost), is ``Lost``; a Job
stopped by its deadline is ``TimedOut``; anything else that is not a clean pass is ``Failed`` with
the diagnostic's findings or the reason the result could not be read.

A node's validation (after a release, or a new node's burn-in) is the same Job for all the GPUs of
the agent's report: ``${GPU_INDEX}`` and ``${GPU_UUID}`` are their comma-separated lists (``dcgmi
diag -i 0,1,...`` takes the list as is), labelled ``gpuhealth.dev/validation-scope=node`` instead of
a GPU, and tolerating gpuhealth's burn-in taint as well. A node whose GPUs mix MIG-enabled and
disabled ones gets no node Job (DCGM refuses the mix in one run): the validation waits, saying which
GPUs are in which mode, until the node's GPUs share one mode. A GPU's own Job names only that GPU,
so a MIG-enabled GPU is diagnosed alone, once the remediator found every instance of it free.

The pods carry ``gpuhealth.dev/validation-level`` (not the reset Job's step label), so a KWOK stage
can end them with a DCGM result of its own (``devkit/kwok/pod-validation.yaml``).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from gpuhealth.actions.remediation_jobs import _UNSAFE, _render, gpu_job, pinned_to
from gpuhealth.api.diag import SUMMARY_FORMAT, parse_termination_message
from gpuhealth.api.names import (
    BURN_IN_TAINT_KEY,
    DEVICE_GPU_LABEL,
    DEVICE_NODE_LABEL,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
)
from gpuhealth.api.remediation import INDEX_PLACEHOLDER, NODE_PLACEHOLDER, UUID_PLACEHOLDER, RemediationSettings
from gpuhealth.api.validation import LEVEL_PLACEHOLDER, Outcome, ValidationSettings

LEVEL_LABEL = "gpuhealth.dev/validation-level"
SCOPE_LABEL = "gpuhealth.dev/validation-scope"  # "node" on a node's validation Job
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
HOSTENGINE_ENV = "DCGM_HOSTENGINE"

# The wrapper: the whole JSON when it fits in the termination message, else a summary of it.
# POSIX sh with grep/sed/paste only (the DCGM image has no jq).
WRAPPER = (
    'out=$(dcgmi diag -r "$LEVEL" -i "$GPU" --json --host "$' + HOSTENGINE_ENV + '" 2>&1); rc=$?\n'
    "if [ ${#out} -le 4000 ] && printf '%s' \"$out\" | grep -q '\"Overall Result\"'; then\n"
    "  printf '%s' \"$out\" > /dev/termination-log\n"
    "else\n"
    '  overall=$(printf \'%s\' "$out" | grep -o \'"Overall Result" *: *"[A-Za-z]*"\' | sed \'s/.*: *"//; s/"$//\')\n'
    '  warnings=$(printf \'%s\' "$out" | grep -o \'"warning" *: *"[^"]*"\' | sed \'s/^"warning" *: *//\' '
    "| head -n 20 | cut -c1-150 | sed 's/[^\"]$/&\"/' | paste -sd, -)\n"
    "  ids=$(printf '%s' \"$out\" | grep -o '\"error_id\" *: *[0-9]*' | sed 's/.*: *//' | head -n 20 | paste -sd, -)\n"
    '  printf \'{"format":"' + SUMMARY_FORMAT + '","overall":"%s","exitCode":%d,"warnings":[%s],"errorIds":[%s]}\' '
    '"$overall" "$rc" "$warnings" "$ids" > /dev/termination-log\n'
    "fi\n"
    "exit $rc\n"
)


def job_name(node: str, index: int, uuid: str, episode: str, attempt: int) -> str:
    """``gpuhealth-validate-<node>-<index>-<attempt>-<hash>``: one per ladder attempt, at most 63 characters."""
    digest = hashlib.sha256(f"validate|{node}|{index}|{uuid}|{episode}|{attempt}".encode()).hexdigest()[:8]
    tail = f"-{index}-{attempt}-{digest}"
    head = _UNSAFE.sub("-", f"gpuhealth-validate-{node}".lower())[: 63 - len(tail)].rstrip("-")
    return head + tail


def node_job_name(node: str, trigger: str, episode: str) -> str:
    """``gpuhealth-validate-<node>-node-<hash>``: one per node validation episode, at most 63 characters."""
    digest = hashlib.sha256(f"validate-node|{node}|{trigger}|{episode}".encode()).hexdigest()[:8]
    tail = f"-node-{digest}"
    head = _UNSAFE.sub("-", f"gpuhealth-validate-{node}".lower())[: 63 - len(tail)].rstrip("-")
    return head + tail


def default_pod(settings: ValidationSettings) -> dict[str, Any]:
    return {
        "nodeName": NODE_PLACEHOLDER,
        "containers": [
            {
                "name": "dcgm-diag",
                "image": settings.image,
                "command": ["/bin/sh", "-c", WRAPPER],
                "env": [
                    {"name": "LEVEL", "value": LEVEL_PLACEHOLDER},
                    {"name": "GPU", "value": INDEX_PLACEHOLDER},
                    {"name": "GPU_UUID", "value": UUID_PLACEHOLDER},
                    {"name": HOSTENGINE_ENV, "value": settings.hostengine},
                ],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
            }
        ],
    }


def build_validation_job(
    remediation: RemediationSettings,
    settings: ValidationSettings,
    node: str,
    index: int,
    uuid: str,
    name: str,
) -> tuple[dict[str, Any] | None, str]:
    """The validation Job for one GPU, or None and why not (in words, for the Event)."""
    if not uuid:
        return None, f"GPU {index} has no UUID in the agent's report: a validation could not be confined to it"
    template = copy.deepcopy(dict(settings.job_template or {}))
    spec = template.get("spec") or {}
    pod_tmpl = spec.get("template") or {}
    pod = pod_tmpl.get("spec") or default_pod(settings)
    subs = {
        NODE_PLACEHOLDER: node,
        UUID_PLACEHOLDER: uuid,
        INDEX_PLACEHOLDER: str(index),
        LEVEL_PLACEHOLDER: str(settings.level),
    }
    pod = _render(pod, subs)
    if not pinned_to(pod, node):
        return None, f"the validation Job template is not pinned to node {node} (nodeName or hostname affinity)"
    named = json.dumps(pod.get("containers") or [])
    if uuid not in named and str(index) not in named:
        return None, f"the validation Job template does not name GPU {index} ({uuid}) in its containers"
    labels = {
        MANAGED_BY_LABEL: MANAGED_BY_VALUE,
        DEVICE_NODE_LABEL: node[:63],
        DEVICE_GPU_LABEL: str(index),
        LEVEL_LABEL: str(settings.level),
    }
    body = gpu_job(
        name,
        remediation.namespace,
        remediation.service_account,
        uuid,
        template,
        pod,
        subs,
        labels,
        settings.timeout_s,
    )
    return body, ""


def build_node_validation_job(
    remediation: RemediationSettings,
    settings: ValidationSettings,
    node: str,
    gpus: Sequence[tuple[int, str]],
    name: str,
    mig_enabled: Collection[int] = (),
) -> tuple[dict[str, Any] | None, str]:
    """The validation Job for all of a node's GPUs (``(index, uuid)`` from the report), or None and why not.

    ``mig_enabled``: the indices the report says have MIG enabled. DCGM's diagnostic refuses a mix of
    MIG-enabled and disabled GPUs in one run, so a node with both gets no Job (why not says which are
    which) rather than one that would fail for a reason that is not the GPUs' health."""
    if not gpus:
        return None, "the agent's report lists no GPU: a node validation would test nothing"
    if any(not uuid for _, uuid in gpus):
        return None, "a GPU has no UUID in the agent's report"
    mig = sorted(i for i, _ in gpus if i in mig_enabled)
    if mig and len(mig) < len(gpus):
        whole = sorted(i for i, _ in gpus if i not in mig_enabled)
        return None, (
            f"MIG is enabled on GPU {', '.join(map(str, mig))} and not on GPU {', '.join(map(str, whole))}: "
            "DCGM's diagnostic refuses a mix of MIG modes in one run; set one MIG mode on all of the "
            "node's GPUs, or validate them one by one after a GPU repair (device scope)"
        )
    indices = ",".join(str(i) for i, _ in sorted(gpus))
    uuids = ",".join(u for _, u in sorted(gpus))
    template = copy.deepcopy(dict(settings.job_template or {}))
    pod_tmpl = (template.get("spec") or {}).get("template") or {}
    pod = pod_tmpl.get("spec") or default_pod(settings)
    subs = {
        NODE_PLACEHOLDER: node,
        UUID_PLACEHOLDER: uuids,
        INDEX_PLACEHOLDER: indices,
        LEVEL_PLACEHOLDER: str(settings.level),
    }
    pod = _render(pod, subs)
    if not pinned_to(pod, node):
        return None, f"the validation Job template is not pinned to node {node} (nodeName or hostname affinity)"
    tolerations = list(pod.get("tolerations") or [])
    if not any(t.get("key") == BURN_IN_TAINT_KEY for t in tolerations):
        tolerations.append({"key": BURN_IN_TAINT_KEY, "operator": "Exists"})
    pod["tolerations"] = tolerations
    labels = {
        MANAGED_BY_LABEL: MANAGED_BY_VALUE,
        DEVICE_NODE_LABEL: node[:63],
        SCOPE_LABEL: "node",
        LEVEL_LABEL: str(settings.level),
    }
    body = gpu_job(
        name, remediation.namespace, remediation.service_account, uuids, template, pod, subs, labels, settings.timeout_s
    )
    return body, ""


def pods_of(job: str, pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The pods of ``namespace/name`` among ``pods`` (the Job controller's job-name label)."""
    ns, _, name = job.partition("/")
    return [
        p
        for p in pods
        if (p.get("metadata") or {}).get("namespace") == ns
        and any(((p.get("metadata") or {}).get("labels") or {}).get(k) == name for k in JOB_NAME_LABELS)
    ]


def _terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        t = (cs.get("state") or {}).get("terminated")
        if isinstance(t, Mapping):
            return t
    return None


def verdict(job: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]) -> tuple[Outcome, str]:
    """What a validation Job says: ``Running`` until it ends, then its outcome and findings."""
    if job is None:
        return Outcome.LOST, "the validation Job vanished before its result was read"
    ended, reason = "", ""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("status") == "True" and c.get("type") in ("Complete", "Failed"):
            ended, reason = str(c.get("type")), str(c.get("reason") or "")
    if not ended:
        return Outcome.RUNNING, ""
    if ended == "Failed" and reason == "DeadlineExceeded":
        return Outcome.TIMED_OUT, "the validation Job ran past spec.validation.timeout"
    term = next((t for t in (_terminated(p) for p in pods) if t is not None), None)
    if term is None:
        return Outcome.LOST, "the validation pod ended without a result (deleted, or its node was lost)"
    result = parse_termination_message(term.get("message"))
    code = term.get("exitCode")
    if result.passed and code == 0 and ended == "Complete":
        return Outcome.PASSED, ""
    findings = result.findings()
    if result.passed:
        findings = f"the validation pod exited {code} although its result says Pass"
    elif code not in (0, None):
        findings = f"exit {code}: {findings}"
    return Outcome.FAILED, findings
