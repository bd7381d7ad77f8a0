"""What the node state machine decides on once each GPU has its verdict: per-GPU quarantine keeps a
node in service while some of its GPUs are held out. Pure.

- the verdict escalates (too many bad GPUs, a flapping GPU under ``onFlapping: Node``, a GPU that
  cannot be told apart): every finding, device ones included, goes to the node;
- otherwise the placed device findings leave the node's assessment, and the GPUs held out (or held
  back by the breaker's GPU budget) become one observe-level ``DeviceQuarantined`` finding whose
  detail names each GPU, its MIG instances and its DeviceTaintRules (on a device-plugin node, how
  new work is kept off it: the plugin withholds it, or gpuhealth's gpu-out taint): the node stays in service
  (state ``Degraded``), neither tainted nor cordoned.

The controller's device reconciler (``controller/act/device_reconciler.py``) computes the verdict
and hands its records here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from gpuhealth.api.devices import KEPT_OFF_BY_TAINT, KEPT_OFF_WORDS, DeviceRecord
from gpuhealth.api.names import Action, Scope, Signal
from gpuhealth.evaluation.devices import DeviceVerdict
from gpuhealth.evaluation.findings import Assessment, Finding


def _rules_words(r: DeviceRecord) -> str:
    if r.via_plugin and r.out_of_service:
        return f", {KEPT_OFF_WORDS[r.kept_off_by]} (device plugin route)"
    if len(r.taint_rules) == 1:
        return f", DeviceTaintRule {r.taint_rule}"
    if r.taint_rules:
        parts = len([d for d in r.devices if d in r.partitions])
        return f", {len(r.taint_rules)} DeviceTaintRules" + (f" (with its {parts} MIG devices)" if parts else "")
    return ""


def _instance_words(r: DeviceRecord) -> str:
    if not r.instances or not r.out_of_service:
        return ""
    return f" (only its MIG device{'s' if len(r.instances) > 1 else ''} {', '.join(r.instances)})"


def node_view(
    a: Assessment, findings: Sequence[Finding], verdict: DeviceVerdict, out: Iterable[DeviceRecord]
) -> Assessment:
    """The assessment the node state machine decides on (see the module docstring). Pure."""
    if verdict.escalate:
        return replace(a, findings=tuple(findings))
    mine = [f for f in findings if not (f.scope == Scope.DEVICE and f.action.quarantines)]
    held = [r for r in out] + [r for r in verdict.records if r.held_by_breaker and not r.out_of_service]
    if held:
        parts = [
            f"GPU {r.index}"
            + (f" ({r.uuid})" if r.uuid else "")
            + f" {r.state}: {r.reason}"
            + _instance_words(r)
            + _rules_words(r)
            + (" (held back by the GPU budget)" if r.held_by_breaker and not r.out_of_service else "")
            for r in sorted(held, key=lambda r: r.index)
        ]
        detail = "; ".join(parts) + ". The node serves on with its other GPUs"
        if any(r.kept_off_by == KEPT_OFF_BY_TAINT and r.out_of_service for r in held):
            detail += ": their pods keep running, no new pod lands on the node while it is tainted"
        mine.append(Finding(Signal.DEVICE_QUARANTINED, Action.OBSERVE, detail))
    return replace(a, findings=tuple(sorted(mine, key=lambda f: f.key)))
