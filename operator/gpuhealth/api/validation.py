"""Proof before return: ``spec.validation`` and the per-GPU validation record.

Silence is not proof: a GPU whose facts stay clean through probation after a reset can still fail
its first real load. With ``spec.validation.enabled`` (off by default; it acts only where
``spec.remediation`` is enabled too), a GPU whose ``GPUReset`` worked (Job succeeded, facts clean)
is not returned on silence: the remediator runs ONE validation Job for exactly that GPU while its
DeviceTaintRule still holds it out, and the GPU returns only when that Job passes. By default the
Job runs NVIDIA's DCGM diagnostic (``dcgmi diag -r <level> -i <GPU> --json``) against the node-local
hostengine NVIDIA's GPU Operator deploys behind the Service ``nvidia-dcgm`` (port 5555, traffic kept
on the node), so it requests no GPU; its verdict is read from the pod's termination message
(``api/diag.py``). A policy's ``jobTemplate`` may run anything else under the reset Job's rules
(pinned to ``${NODE_NAME}``, naming ``${GPU_UUID}`` or ``${GPU_INDEX}``), and leaves the same result.

Node scope: after a human's release of a drained node (a ``NodeReboot`` hand-off, or any repair
release) the node does not return on its probation alone either: ONE validation Job runs for all its
GPUs (``${GPU_INDEX}`` and ``${GPU_UUID}`` are then the comma-separated lists of the report's GPUs,
which ``dcgmi diag -i`` takes as is) while it is still tainted and cordoned. With
``spec.validation.newNodes.enabled`` a GPU node that joins (no verdict yet, or labelled
``gpuhealth.dev/burn-in=requested``) is held by gpuhealth's own NoSchedule taint until the same node
validation passes, at most ``batchSize`` such burn-ins at once. Its record is
:class:`NodeValidation` (``status.nodeValidation``).

The record lives inside the GPU's ladder record (``status.remediation["<index>"].validation``,
:class:`LadderRecord` in ``api/remediation_status.py``), written before the Job is created, so a restarted
operator finds the Job's name and never starts a second one. Pure.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuhealth.api.durations import parse_duration
from gpuhealth.api.timeutil import format_time, parse_time

# NVIDIA's DCGM image (dcgmi included); the policy should pin the one its fleet's hostengine runs.
DEFAULT_IMAGE = "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"
# The GPU Operator's hostengine Service in its default namespace (internalTrafficPolicy: Local).
DEFAULT_HOSTENGINE = "nvidia-dcgm.gpu-operator.svc:5555"
DEFAULT_LEVEL = 2  # software, memory and PCIe: about 2 minutes
DEFAULT_TIMEOUT_S = 900.0
LEVEL_PLACEHOLDER = "${VALIDATION_LEVEL}"
MAX_FINDINGS = 1024


class ValidationError(ValueError):
    """A ``spec.validation`` the operator refuses; the message names the field."""


class Outcome(StrEnum):
    PENDING = "Pending"  # waiting for its preconditions (held out, unheld, limits); no Job yet
    RUNNING = "Running"  # the Job's name is recorded (created, or being created)
    PASSED = "Passed"
    FAILED = "Failed"  # the diagnostic failed, or its result was missing or unreadable
    TIMED_OUT = "TimedOut"
    LOST = "Lost"  # the Job or its pod vanished (the pod lost its node) before a result


DONE = frozenset({Outcome.PASSED, Outcome.FAILED, Outcome.TIMED_OUT, Outcome.LOST})


class Trigger(StrEnum):
    """Why a node (all its GPUs) is validated."""

    RELEASE = "Release"  # a human released the drained node after a repair (a NodeReboot hand-off)
    BURN_IN = "BurnIn"  # a new node, held by gpuhealth's burn-in taint until it passes


DEFAULT_BATCH_SIZE = 4


@dataclass(frozen=True)
class NewNodes:
    """``spec.validation.newNodes``: burn-in of joining GPU nodes, off by default."""

    enabled: bool = False
    batch_size: int = DEFAULT_BATCH_SIZE  # burn-ins running at once across the policy's nodes


@dataclass(frozen=True)
class ValidationSettings:
    enabled: bool = False
    level: int = DEFAULT_LEVEL
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_concurrent: int = 1  # validation Jobs in flight at once across the policy's nodes
    image: str = DEFAULT_IMAGE
    hostengine: str = DEFAULT_HOSTENGINE
    job_template: Mapping[str, Any] | None = None
    new_nodes: NewNodes = NewNodes()


def _new_nodes(raw: Any) -> NewNodes:
    if raw is None:
        return NewNodes()
    if not isinstance(raw, Mapping):
        raise ValidationError("spec.validation.newNodes: must be an object")
    size = raw.get("batchSize", DEFAULT_BATCH_SIZE)
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 1000:
        raise ValidationError(f"spec.validation.newNodes.batchSize: must be an integer in [1, 1000], got {size!r}")
    return NewNodes(enabled=bool(raw.get("enabled", False)), batch_size=size)


def _validate_template(t: Any, path: str) -> Mapping[str, Any]:
    """The reset Job's rules: a Job pinned to ``${NODE_NAME}`` whose containers name the GPU."""
    if not isinstance(t, Mapping) or not isinstance(t.get("spec"), Mapping):
        raise ValidationError(f"{path}: must be a Job's metadata and spec (spec.template.spec.containers)")
    pod = ((t["spec"].get("template") or {}).get("spec")) or {}
    if not isinstance(pod, Mapping) or not pod.get("containers"):
        raise ValidationError(f"{path}.spec.template.spec.containers: the validation Job needs a container")
    pinned = pod.get("nodeName") == "${NODE_NAME}" or "${NODE_NAME}" in json.dumps(pod.get("affinity") or {})
    if not pinned:
        raise ValidationError(
            f"{path}.spec.template.spec: must be pinned to the GPU's node: nodeName ${{NODE_NAME}} or a "
            "required node affinity on kubernetes.io/hostname In [${NODE_NAME}]"
        )
    named = json.dumps(pod.get("containers"))
    if "${GPU_UUID}" not in named and "${GPU_INDEX}" not in named:
        raise ValidationError(
            f"{path}.spec.template.spec.containers: must name the GPU by ${{GPU_UUID}} or ${{GPU_INDEX}}, "
            "so that only the GPU being validated is tested"
        )
    return t


def parse_validation(spec: Mapping[str, Any]) -> ValidationSettings:
    raw = spec.get("validation") if isinstance(spec, Mapping) else None
    if raw is None:
        return ValidationSettings()
    if not isinstance(raw, Mapping):
        raise ValidationError("spec.validation: must be an object")
    level = raw.get("level", DEFAULT_LEVEL)
    if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= 4:
        raise ValidationError(f"spec.validation.level: must be a DCGM diagnostic level 1-4, got {level!r}")
    mc = raw.get("maxConcurrent", 1)
    if isinstance(mc, bool) or not isinstance(mc, int) or not 1 <= mc <= 1000:
        raise ValidationError(f"spec.validation.maxConcurrent: must be an integer in [1, 1000], got {mc!r}")
    try:
        timeout = parse_duration(raw.get("timeout") or "15m")
    except ValueError as e:
        raise ValidationError(f"spec.validation.timeout: {e}") from None
    if timeout < 10:
        raise ValidationError(f"spec.validation.timeout: must be at least 10s, got {raw.get('timeout')!r}")
    template = raw.get("jobTemplate")
    return ValidationSettings(
        enabled=bool(raw.get("enabled", False)),
        level=level,
        timeout_s=timeout,
        max_concurrent=mc,
        image=str(raw.get("image") or DEFAULT_IMAGE),
        hostengine=str(raw.get("hostengine") or DEFAULT_HOSTENGINE),
        job_template=None if template is None else _validate_template(template, "spec.validation.jobTemplate"),
        new_nodes=_new_nodes(raw.get("newNodes")),
    )


@dataclass(frozen=True)
class Validation:
    """One validation of one GPU after one repair attempt (``status.remediation[i].validation``)."""

    level: int
    outcome: Outcome = Outcome.PENDING
    job: str = ""  # namespace/name, recorded before the Job is created
    created: bool = False  # the create was answered (201 or 409): an absent Job now means Lost
    started: dt.datetime | None = None
    finished: dt.datetime | None = None
    findings: str = ""

    @property
    def done(self) -> bool:
        return self.outcome in DONE

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"level": self.level, "result": str(self.outcome)}
        optional: dict[str, Any] = {
            "job": self.job,
            "created": self.created,
            "startedAt": format_time(self.started) if self.started else "",
            "finishedAt": format_time(self.finished) if self.finished else "",
            "findings": self.findings[:MAX_FINDINGS],
        }
        out.update({k: v for k, v in optional.items() if v})
        return out

    @staticmethod
    def from_status(m: Any) -> Validation | None:
        if not isinstance(m, Mapping):
            return None
        try:
            return Validation(
                level=int(m.get("level") or DEFAULT_LEVEL),
                outcome=Outcome(str(m.get("result") or Outcome.PENDING)),
                job=str(m.get("job") or ""),
                created=bool(m.get("created")),
                started=parse_time(m.get("startedAt")),
                finished=parse_time(m.get("finishedAt")),
                findings=str(m.get("findings") or ""),
            )
        except (ValueError, TypeError):
            return None


@dataclass(frozen=True)
class NodeValidation:
    """One validation of a whole node (``status.nodeValidation``): after a release, or a burn-in.

    ``episode`` is when it was asked for (the release, or the node's first sight): part of the Job's
    name, so each episode runs one Job. ``held``: gpuhealth placed its burn-in taint for it (and so
    may lift it); a taint of that key someone else placed is never recorded as gpuhealth's.
    ``dry_run``: DryRun announced what it would run; nothing runs.
    """

    trigger: Trigger
    episode: dt.datetime
    validation: Validation
    held: bool = False
    dry_run: bool = False

    @property
    def done(self) -> bool:
        return self.validation.done

    @property
    def holds(self) -> bool:
        """gpuhealth's burn-in taint holds the node: none of its GPUs takes new work, whatever its state
        says of its facts (``Healthy`` before a burn-in passes: nothing wrong is known yet)."""
        return self.held and not self.dry_run

    @property
    def awaits_release(self) -> bool:
        """A burn-in that did not pass and still holds the node: it stays held until a human releases it
        (``kubectl gpuhealth release NODE``, which lifts the taint)."""
        return (
            self.holds and self.trigger == Trigger.BURN_IN and self.done and self.validation.outcome != Outcome.PASSED
        )

    def to_status(self) -> dict[str, Any]:
        out = {"trigger": str(self.trigger), "episode": format_time(self.episode), **self.validation.to_status()}
        if self.held:
            out["held"] = True
        if self.dry_run:
            out["dryRun"] = True
        return out

    @staticmethod
    def from_status(m: Any) -> NodeValidation | None:
        v = Validation.from_status(m)
        if v is None or not isinstance(m, Mapping):
            return None
        episode = parse_time(m.get("episode"))
        try:
            trigger = Trigger(str(m.get("trigger")))
        except ValueError:
            return None
        if episode is None:
            return None
        return NodeValidation(trigger, episode, v, held=bool(m.get("held")), dry_run=bool(m.get("dryRun")))
