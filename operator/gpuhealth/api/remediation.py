"""Repair, not only quarantine: the escalation ladder's settings.

``spec.remediation`` of a GPUHealthPolicy says whether gpuhealth may try to repair a GPU it holds
out, and how: an ordered ladder of steps per fault (``GPUReset`` -> ``NodeReboot`` -> ``Replace``),
each with a ``timeout`` and a number of ``attempts``. Off by default: without it gpuhealth holds
the GPU out and reports, as before.

Where each GPU stands on its ladder (the per-GPU record in the report's status, the repairs kept by
UUID, the approvals a step waits on) is ``api/remediation_status.py``'s.

Pure: parsing and the default ladders. Which ladder a fault gets when the policy names none (the
catalog's remedy) is decided in ``evaluation/ladder.py``; the Job itself in
``actions/remediation_jobs.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpuhealth.api.durations import parse_duration
from gpuhealth.api.names import (
    Signal,
)
from gpuhealth.api.names import StepKind as StepKind  # declared with the other vocabularies
from gpuhealth.api.recovery import RecoveryAction

DEFAULT_NAMESPACE = "gpuhealth-remediation"
DEFAULT_SERVICE_ACCOUNT = "gpuhealth-remediation"
# NVIDIA's CUDA base image: nvidia-smi itself is mounted in by the NVIDIA Container Toolkit
# (NVIDIA_DRIVER_CAPABILITIES=utility), so any image with a shell-less libc works.
DEFAULT_IMAGE = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"
# Placeholders a policy's jobTemplate uses; replaced in every string of the template.
NODE_PLACEHOLDER = "${NODE_NAME}"
UUID_PLACEHOLDER = "${GPU_UUID}"
INDEX_PLACEHOLDER = "${GPU_INDEX}"
# NVIDIA's NVSentinel holds a node for a human after more than one remediation within 7 days: one
# repair per GPU in 7 days, and the next failure goes straight to Replace.
REPEAT_MAX_REPAIRS = 1
REPEAT_WINDOW_S = 7 * 24 * 3600.0
# NVIDIA's device plugin as the GPU Operator deploys it: namespace gpu-operator, pods labelled
# app=nvidia-device-plugin-daemonset (NVIDIA's static manifest: kube-system, name=nvidia-device-plugin-ds;
# its Helm chart: app.kubernetes.io/name=nvidia-device-plugin in the release's namespace).
DEVICE_PLUGIN_NAMESPACE = "gpu-operator"
DEVICE_PLUGIN_LABELS: Mapping[str, str] = {"app": "nvidia-device-plugin-daemonset"}
DEVICE_PLUGIN_RETURN_TIMEOUT_S = 300.0


class RemediationError(ValueError):
    """A ``spec.remediation`` the operator refuses; the message names the field."""


class Approval(StrEnum):
    """Who lets a repair or validation step run (``spec.remediation.approval``)."""

    AUTOMATIC = "Automatic"  # gpuhealth, once the step's preconditions hold
    MANUAL = "Manual"  # a human: each step waits in PendingApproval for gpuhealth.dev/approve
    # Two people: each step waits as under Manual; those of spec.remediation.twoPersonSteps run only
    # once two distinct identities approved them (gpuhealth.dev/approver*, the API server's identity).
    TWO_PERSON = "TwoPerson"


class ApprovalStep(StrEnum):
    """What waits for approval (``spec.remediation.twoPersonSteps`` names these): a repair step, or
    the validation Job after a reset."""

    GPU_RESET = "GPUReset"
    NODE_REBOOT = "NodeReboot"  # the hand-off to the node remediator (drain, reboot)
    VALIDATION = "Validation"


# approval: TwoPerson without twoPersonSteps: the node reboot hand-off, the disruptive one (it takes
# every GPU of the node and hands the node to the remediator); a reset or a validation needs one person.
TWO_PERSON_STEPS: frozenset[ApprovalStep] = frozenset({ApprovalStep.NODE_REBOOT})


@dataclass(frozen=True)
class Step:
    kind: StepKind
    timeout_s: float = 600.0
    attempts: int = 1


@dataclass(frozen=True)
class Ladder:
    """Steps for faults matched by reason (``EccUncorrected``, ``XID48``, ...) or XID code."""

    steps: tuple[Step, ...]
    reasons: frozenset[str] = frozenset()
    xids: frozenset[int] = frozenset()

    def matches(self, reason: str) -> bool:
        if reason in self.reasons:
            return True
        return reason.startswith("XID") and reason[3:].isdigit() and int(reason[3:]) in self.xids


@dataclass(frozen=True)
class RepeatSettings:
    """Repeat offenders across repairs (``spec.remediation.repeatOffenders``): a GPU that repairs
    fixed ``max_repairs`` times within ``window_s`` and fails again skips its ladder for Replace."""

    enabled: bool = True
    max_repairs: int = REPEAT_MAX_REPAIRS
    window_s: float = REPEAT_WINDOW_S


@dataclass(frozen=True)
class DevicePluginSettings:
    """Where the device plugin's pods run (``spec.remediation.devicePlugin``): a GPU that NVIDIA's
    plugin marked ``Unhealthy`` stays so until the plugin restarts, so after its repair gpuhealth deletes
    the plugin's pod on that node (its DaemonSet recreates it) and waits ``return_timeout_s`` for the
    Node's allocatable ``nvidia.com/gpu`` to show the GPU again. ``restart`` False: it only waits, and says so."""

    namespace: str = DEVICE_PLUGIN_NAMESPACE
    match_labels: Mapping[str, str] = field(default_factory=lambda: dict(DEVICE_PLUGIN_LABELS))
    restart: bool = True
    return_timeout_s: float = DEVICE_PLUGIN_RETURN_TIMEOUT_S

    @property
    def selector(self) -> str:
        """The pods' label selector as ``kubectl -l`` takes it."""
        return ",".join(f"{k}={v}" for k, v in sorted(self.match_labels.items()))


@dataclass(frozen=True)
class RemediationSettings:
    enabled: bool = False
    ladders: tuple[Ladder, ...] = ()  # empty: the catalog's defaults (default_steps below)
    max_concurrent: int = 1  # resets in flight at once, across the policy's nodes
    namespace: str = DEFAULT_NAMESPACE
    service_account: str = DEFAULT_SERVICE_ACCOUNT
    image: str = DEFAULT_IMAGE
    job_template: Mapping[str, Any] | None = None  # a batch/v1 Job (metadata + spec) with placeholders
    approval: Approval = Approval.AUTOMATIC
    two_person_steps: frozenset[ApprovalStep] = TWO_PERSON_STEPS  # approval: TwoPerson; the others need one
    repeat: RepeatSettings = field(default_factory=RepeatSettings)
    device_plugin: DevicePluginSettings = field(default_factory=DevicePluginSettings)

    @property
    def waits_for_people(self) -> bool:
        """Whether each step (and validation) waits in PendingApproval for people (Manual, TwoPerson)."""
        return self.approval in (Approval.MANUAL, Approval.TWO_PERSON)

    @property
    def needs_two(self) -> frozenset[ApprovalStep]:
        """The steps that need two distinct approvers under this policy: ``twoPersonSteps`` under
        TwoPerson, none otherwise."""
        return self.two_person_steps if self.approval == Approval.TWO_PERSON else frozenset()

    def approvals_needed(self, what: ApprovalStep) -> int:
        """Distinct approvers ``what`` needs before it runs: 0 (Automatic), else :func:`approvers_needed`."""
        return approvers_needed(what, self.needs_two) if self.waits_for_people else 0


def approvers_needed(what: ApprovalStep, needs_two: frozenset[ApprovalStep]) -> int:
    """Distinct approvers a waiting step needs once steps wait for people: two for a step of
    ``needs_two`` (``RemediationSettings.needs_two``), one for any other. The one rule the remediator's
    count and the ladder's messages both read."""
    return 2 if what in needs_two else 1


def _dur(v: Any, path: str) -> float:
    try:
        return parse_duration(v)
    except ValueError as e:
        raise RemediationError(f"{path}: {e}") from None


def _int(v: Any, path: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise RemediationError(f"{path}: must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def parse_steps(raw: Any, path: str) -> tuple[Step, ...]:
    if not isinstance(raw, list) or not raw:
        raise RemediationError(f"{path}: must be a non-empty list of steps")
    steps: list[Step] = []
    for i, s in enumerate(raw):
        p = f"{path}[{i}]"
        if not isinstance(s, Mapping):
            raise RemediationError(f"{p}: must be an object")
        try:
            kind = StepKind(str(s.get("type")))
        except ValueError:
            raise RemediationError(
                f"{p}.type: unknown step {s.get('type')!r} (GPUReset, NodeReboot or Replace)"
            ) from None
        if any(x.kind == kind for x in steps):
            raise RemediationError(f"{p}.type: {kind} appears twice (use attempts to repeat a step)")
        if steps and steps[-1].kind == StepKind.REPLACE:
            raise RemediationError(f"{p}: no step can follow Replace")
        if kind == StepKind.GPU_RESET and steps:
            raise RemediationError(f"{p}.type: GPUReset must be the first step (a reboot resets every GPU)")
        steps.append(
            Step(
                kind,
                _dur(s.get("timeout") or "10m", f"{p}.timeout"),
                _int(s.get("attempts") if s.get("attempts") is not None else 1, f"{p}.attempts", 1, 5),
            )
        )
    return tuple(steps)


def _validate_template(t: Any, path: str) -> Mapping[str, Any]:
    """What can be told before a GPU is known: the template pins its pod to the node and names the GPU."""
    if not isinstance(t, Mapping) or not isinstance(t.get("spec"), Mapping):
        raise RemediationError(f"{path}: must be a Job's metadata and spec (spec.template.spec.containers)")
    pod = ((t["spec"].get("template") or {}).get("spec")) or {}
    if not isinstance(pod, Mapping) or not pod.get("containers"):
        raise RemediationError(f"{path}.spec.template.spec.containers: the reset Job needs a container")
    pinned = pod.get("nodeName") == NODE_PLACEHOLDER or NODE_PLACEHOLDER in json.dumps(pod.get("affinity") or {})
    if not pinned:
        raise RemediationError(
            f"{path}.spec.template.spec: must be pinned to the GPU's node: nodeName {NODE_PLACEHOLDER} or a "
            f"required node affinity on kubernetes.io/hostname In [{NODE_PLACEHOLDER}]"
        )
    if UUID_PLACEHOLDER not in json.dumps(pod.get("containers")):
        raise RemediationError(
            f"{path}.spec.template.spec.containers: must name the GPU by {UUID_PLACEHOLDER} (e.g. env "
            f"NVIDIA_VISIBLE_DEVICES and the reset command), so no other GPU is reset"
        )
    return t


def parse_remediation(spec: Mapping[str, Any]) -> RemediationSettings:
    raw = spec.get("remediation") if isinstance(spec, Mapping) else None
    if raw is None:
        return RemediationSettings()
    if not isinstance(raw, Mapping):
        raise RemediationError("spec.remediation: must be an object")
    ladders: list[Ladder] = []
    for i, lad in enumerate(raw.get("ladders") or []):
        p = f"spec.remediation.ladders[{i}]"
        if not isinstance(lad, Mapping):
            raise RemediationError(f"{p}: must be an object")
        reasons = lad.get("reasons") or []
        xids = lad.get("xids") or []
        if not reasons and not xids:
            raise RemediationError(f"{p}: a ladder names the faults it is for (reasons, xids or both)")
        for j, code in enumerate(xids):
            _int(code, f"{p}.xids[{j}]", 1, 1023)
        ladders.append(
            Ladder(parse_steps(lad.get("steps"), f"{p}.steps"), frozenset(map(str, reasons)), frozenset(xids))
        )
    template = raw.get("jobTemplate")
    try:
        approval = Approval(str(raw.get("approval") or Approval.AUTOMATIC))
    except ValueError:
        raise RemediationError(
            f"spec.remediation.approval: must be Automatic, Manual or TwoPerson, got {raw.get('approval')!r}"
        ) from None
    return RemediationSettings(
        enabled=bool(raw.get("enabled", False)),
        ladders=tuple(ladders),
        max_concurrent=_int(raw.get("maxConcurrent", 1), "spec.remediation.maxConcurrent", 1, 1000),
        namespace=str(raw.get("namespace") or DEFAULT_NAMESPACE),
        service_account=str(raw.get("serviceAccountName") or DEFAULT_SERVICE_ACCOUNT),
        image=str(raw.get("image") or DEFAULT_IMAGE),
        job_template=None if template is None else _validate_template(template, "spec.remediation.jobTemplate"),
        approval=approval,
        two_person_steps=_parse_two_person(raw.get("twoPersonSteps")),
        repeat=_parse_repeat(raw.get("repeatOffenders")),
        device_plugin=_parse_device_plugin(raw.get("devicePlugin")),
    )


def _parse_two_person(raw: Any) -> frozenset[ApprovalStep]:
    if raw is None:
        return TWO_PERSON_STEPS
    p = "spec.remediation.twoPersonSteps"
    if not isinstance(raw, list):
        raise RemediationError(f"{p}: must be a list of GPUReset, NodeReboot, Validation")
    out: set[ApprovalStep] = set()
    for i, v in enumerate(raw):
        try:
            out.add(ApprovalStep(str(v)))
        except ValueError:
            raise RemediationError(f"{p}[{i}]: unknown step {v!r} (GPUReset, NodeReboot or Validation)") from None
    return frozenset(out)


def _parse_device_plugin(raw: Any) -> DevicePluginSettings:
    if raw is None:
        return DevicePluginSettings()
    p = "spec.remediation.devicePlugin"
    if not isinstance(raw, Mapping):
        raise RemediationError(f"{p}: must be an object")
    labels = raw.get("matchLabels")
    if labels is None:
        labels = dict(DEVICE_PLUGIN_LABELS)
    if not isinstance(labels, Mapping) or not labels or not all(isinstance(v, str) for v in labels.values()):
        raise RemediationError(f"{p}.matchLabels: must name at least one label of the device plugin's pods")
    timeout = _dur(raw["returnTimeout"], f"{p}.returnTimeout") if raw.get("returnTimeout") else None
    if timeout is not None and timeout <= 0:
        raise RemediationError(f"{p}.returnTimeout: must be positive")
    return DevicePluginSettings(
        namespace=str(raw.get("namespace") or DEVICE_PLUGIN_NAMESPACE),
        match_labels={str(k): str(v) for k, v in labels.items()},
        restart=bool(raw.get("restart", True)),
        return_timeout_s=timeout if timeout is not None else DEVICE_PLUGIN_RETURN_TIMEOUT_S,
    )


def _parse_repeat(raw: Any) -> RepeatSettings:
    if raw is None:
        return RepeatSettings()
    if not isinstance(raw, Mapping):
        raise RemediationError("spec.remediation.repeatOffenders: must be an object")
    p = "spec.remediation.repeatOffenders"
    window = _dur(raw["window"], f"{p}.window") if raw.get("window") else REPEAT_WINDOW_S
    if window <= 0:
        raise RemediationError(f"{p}.window: must be positive")
    return RepeatSettings(
        enabled=bool(raw.get("enabled", True)),
        max_repairs=_int(raw.get("maxRepairs", REPEAT_MAX_REPAIRS), f"{p}.maxRepairs", 1, 10),
        window_s=window,
    )


# -- the default ladders ---------------------------------------------------------------------------

RESET_STEPS = (Step(StepKind.GPU_RESET, 600.0, 2), Step(StepKind.NODE_REBOOT, 3600.0, 1), Step(StepKind.REPLACE))
REBOOT_STEPS = (Step(StepKind.NODE_REBOOT, 3600.0, 1), Step(StepKind.REPLACE))
RESET_REASONS = frozenset({str(Signal.ECC), str(Signal.PENDING_REMAP)})
REBOOT_REASONS = frozenset({str(Signal.GPU_LOST)})
_STEPS_FROM: dict[StepKind, tuple[Step, ...]] = {StepKind.GPU_RESET: RESET_STEPS, StepKind.NODE_REBOOT: REBOOT_STEPS}


def default_steps(
    reason: str, recovery_action: RecoveryAction | None = None, remedy: str | None = None
) -> tuple[Step, ...]:
    """The default ladder for a fault (empty: no ladder; the GPU is held and reported). ``remedy`` is
    NVIDIA's immediate action for an XID reason (``catalog.xid.remedy_of``), passed in so that this
    table stays in the contract, readable by the plugin as by the operator. XID 154 starts where its
    recovery action's row (``api/recovery.py``) says."""
    if reason in RESET_REASONS:
        return RESET_STEPS
    if reason in REBOOT_REASONS:
        return REBOOT_STEPS
    if reason.startswith("XID") and reason[3:].isdigit():
        code = int(reason[3:])
        action = remedy
        if code == 154:
            first = recovery_action.row.first_step if recovery_action is not None else None
            return _STEPS_FROM.get(first, ()) if first is not None else ()
        if action == "RESET_GPU":
            return RESET_STEPS
        if action == "REBOOT_NODE":
            return REBOOT_STEPS
    return ()


def steps_for(
    settings: RemediationSettings,
    reason: str,
    recovery_action: RecoveryAction | None = None,
    remedy: str | None = None,
    peers_known: bool = False,
) -> tuple[Step, ...]:
    """The steps a fault climbs under ``settings``; a recovery action that needs the GPU's NVLink
    peers idle first (``Recovery.drain_peers``) skips the reset unless the report names the peers
    (``peers_known``: ``evaluation/peers.py`` then holds them out, idle, before the reset starts)."""
    steps = next((lad.steps for lad in settings.ladders if lad.matches(reason)), None)
    if steps is None:
        steps = default_steps(reason, recovery_action, remedy)
    if recovery_action is not None and recovery_action.row.drain_peers and not peers_known:
        steps = tuple(s for s in steps if s.kind != StepKind.GPU_RESET)
    return steps
