"""How new work is kept off a GPU held out on a device-plugin node. Pure.

A GPU that no DRA ResourceSlice publishes has no device to taint: the kubelet hands it out through
the device plugin's extended resource (``nvidia.com/gpu``), and nothing but the plugin can take one
GPU out of that. NVIDIA's plugin does so by itself on a critical XID (it marks the GPU
``Unhealthy`` and the Node's allocatable drops); for everything it cannot see (ECC counters, row
remapping, heat, NVLink, fabric, PCIe) gpuhealth puts its own NoSchedule taint
``gpuhealth.dev/gpu-out`` on the Node: no new pod lands on the node (the trade-off: none on its
healthy GPUs either), while the pods already on its other GPUs keep running.

``kept_off_by`` decides it for the node's GPUs held out that way, as one:

- the taint is already on the Node and a GPU is still held out: it stays (it is lifted only when no
  GPU of the node is held out any more, so a restarted operator, which reads the taint and the
  records again, never lifts it early);
- the plugin withholds every GPU held out (``api/nodes.py`` ``plugin_withholds``: allocatable at most
  capacity less the GPUs out): nothing more is needed;
- every GPU held out was taken out for an XID the plugin marks ``Unhealthy`` by itself
  (:func:`plugin_sees`), less than :data:`KUBELET_REPORT_GRACE` ago (``awaiting``): the plugin is trusted
  and nothing is written. The agent reports the XID as soon as the plugin sees it, but the kubelet
  lowers allocatable only at its next node status update (every 10 s by default), and the kubelet
  already hands out only the GPUs the plugin calls healthy; a count still short after the grace (the
  plugin's health checks turned off) takes the taint;
- otherwise, and always on a node that serves MIG through the plugin (``nvidia.com/gpu`` does not
  count its MIG devices): the taint.

``still_withheld`` says whether the plugin still withholds a repaired GPU of the ``out`` held out this
way: allocatable is short of capacity less the others (``api/nodes.py`` ``plugin_offers``). Such a GPU
returns only once it is offered again (``evaluation/ladder.py`` ``awaits_plugin``): NVIDIA's plugin
holds a GPU ``Unhealthy`` until it restarts.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from gpuhealth.api.devices import KEPT_OFF_BY_PLUGIN, KEPT_OFF_BY_TAINT, DeviceRecord
from gpuhealth.api.names import GPU_OUT_TAINT_KEY, GPU_RESOURCE
from gpuhealth.api.nodes import plugin_gpus, plugin_offers, plugin_withholds

GPU_OUT_EFFECT = "NoSchedule"
# The XIDs NVIDIA's device plugin does not mark a GPU Unhealthy for (k8s-device-plugin v0.17.4,
# internal/rm/health.go: application errors); it marks it on every other XID, unless its
# DP_DISABLE_HEALTHCHECKS says otherwise.
PLUGIN_SKIPPED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
# How long a GPU held out for an XID the plugin sees is trusted to the plugin before the count decides:
# the kubelet computes its Node status every nodeStatusUpdateFrequency (10 s by default), which is when a
# GPU the plugin marked Unhealthy leaves allocatable.
KUBELET_REPORT_GRACE = dt.timedelta(seconds=30)


def plugin_sees(reason: str) -> bool:
    """Whether NVIDIA's device plugin marks a GPU ``Unhealthy`` by itself for a hold of ``reason``: an
    XID (``XID48``) it does not skip. ECC counters, heat, NVLink, fabric and PCIe it cannot see."""
    code = reason.removeprefix("XID")
    return reason.startswith("XID") and code.isdigit() and int(code) not in PLUGIN_SKIPPED_XIDS


def awaiting_kubelet(records: Iterable[DeviceRecord], now: dt.datetime) -> bool:
    """Whether every one of ``records`` (the GPUs held out on the device-plugin route) was taken out for
    an XID the plugin sees less than :data:`KUBELET_REPORT_GRACE` ago: the kubelet may not have reported
    the plugin's withholding yet."""
    recs = list(records)
    return bool(recs) and all(
        plugin_sees(r.reason) and r.since is not None and now - r.since < KUBELET_REPORT_GRACE for r in recs
    )


def gpu_out_tainted(node: Mapping[str, Any] | None) -> bool:
    """Whether the Node carries gpuhealth's ``gpuhealth.dev/gpu-out`` taint."""
    taints = ((node or {}).get("spec") or {}).get("taints") or []
    return any(isinstance(t, Mapping) and t.get("key") == GPU_OUT_TAINT_KEY for t in taints)


def kept_off_by(node: Mapping[str, Any] | None, out: int, mig: bool = False, awaiting: bool = False) -> str:
    """How new work is kept off the node's ``out`` GPUs held out on the device-plugin route (see the
    module docstring): ``KEPT_OFF_BY_PLUGIN``, ``KEPT_OFF_BY_TAINT``, or "" when none is out.
    ``awaiting``: :func:`awaiting_kubelet` of those GPUs."""
    if out <= 0:
        return ""
    if gpu_out_tainted(node) or mig or not (plugin_withholds(node, out) or awaiting):
        return KEPT_OFF_BY_TAINT
    return KEPT_OFF_BY_PLUGIN


def kept_off_words(node: Mapping[str, Any] | None, how: str) -> str:
    """``how`` in words, with the Node's numbers: for Events and the node's message."""
    gpus = plugin_gpus(node)
    if how == KEPT_OFF_BY_PLUGIN and gpus and gpus[1] >= gpus[0]:  # trusted before the kubelet reports it
        return (
            f"withheld by the device plugin, which marks the GPU Unhealthy on this XID (allocatable "
            f"{GPU_RESOURCE} still {gpus[1]} of {gpus[0]} until the kubelet's next node status)"
        )
    if how == KEPT_OFF_BY_PLUGIN:
        counts = f" (allocatable {GPU_RESOURCE} {gpus[1]} of {gpus[0]})" if gpus else ""
        return f"withheld by the device plugin{counts}"
    if how == KEPT_OFF_BY_TAINT:
        return f"node tainted {GPU_OUT_EFFECT} ({GPU_OUT_TAINT_KEY}): no new pods on the node"
    return ""


def still_withheld(node: Mapping[str, Any] | None, out: int) -> bool:
    """Whether the device plugin still withholds one of the ``out`` GPUs of the node held out on the
    device-plugin route (a repaired one waits for it): allocatable short of capacity less the others."""
    return out > 0 and not plugin_offers(node, out - 1)


def offered_words(node: Mapping[str, Any] | None) -> str:
    """``allocatable nvidia.com/gpu 7 of 8``, or what the Node lacks."""
    gpus = plugin_gpus(node)
    return f"allocatable {GPU_RESOURCE} {gpus[1]} of {gpus[0]}" if gpus else f"no {GPU_RESOURCE} capacity on the node"
