"""Repeated application XIDs: one GPU's, or one MIG instance's. Pure.

An application XID (the catalog's ``application_error`` codes: 13, 31, 43, 45, 68, 94, ...) is
ignored once: the application caused it. The same code ``applicationRepeat.count`` times within
``applicationRepeat.window`` points at the hardware under it (``RepeatedAppXID``).

On a MIG-enabled GPU each instance runs another tenant's work. NVML attributes an XID to the
instance it hit (``gpuInstanceId`` / ``computeInstanceId``), so an attributed XID counts against
that instance only: three tenants hitting XID 13 once each on their own instances are three
applications, not one failing GPU. An instance reaching the count gives a finding confined to it
(``Finding.instance``, with the MIG device the agent lists for those IDs); placement then holds out
that MIG device alone where the DRA device can be told apart. Unattributed XIDs count per GPU, as
on a GPU without MIG, and never add to an instance's count, nor an instance's to its GPU's.

Only application XIDs are counted per instance. A hardware XID (a GPU reset, a node reboot, ...)
stays its GPU's or its node's even when NVML attributes it to an instance: the catalog's remedy
(a reset of the GPU, a reboot) takes every instance of the GPU with it.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass

from gpuhealth.api.names import Signal
from gpuhealth.api.policy import Policy
from gpuhealth.api.report import Report, XidEvent
from gpuhealth.catalog import xid as catalog
from gpuhealth.evaluation.findings import Finding, Instance


def instance_scoped(code: int) -> bool:
    """Whether an XID attributed to a MIG instance counts against that instance alone (see above)."""
    return catalog.is_application_error(code)


@dataclass(frozen=True)
class _Where:
    gpu: int | None
    uuid: str
    instance: Instance | None


def _gpu_index(report: Report, ev: XidEvent) -> int | None:
    if ev.gpu is not None:
        return ev.gpu
    return next((d.index for d in report.devices if ev.uuid and d.uuid == ev.uuid), None)


def _instance(report: Report, gpu: int | None, ev: XidEvent) -> Instance | None:
    """The instance an XID is attributed to; the agent's MIG device where it lists one for the IDs."""
    if ev.gpu_instance is None:
        return None
    mig = report.mig_device(gpu, ev.gpu_instance, ev.compute_instance)
    if mig is None or mig.gpu_instance is None:
        return Instance(ev.gpu_instance, ev.compute_instance)
    return Instance(mig.gpu_instance, mig.compute_instance, mig.uuid, mig.profile)


def first_repeat(times: list[dt.datetime], window: dt.timedelta, count: int) -> tuple[int, dt.datetime] | None:
    """(how many, when) the first time ``count`` of ``times`` (sorted) fall within ``window``."""
    lo = 0
    for hi, t in enumerate(times):
        while t - times[lo] > window:
            lo += 1
        if hi - lo + 1 >= count:
            return hi - lo + 1, t
    return None


def repeated_app_xids(policy: Policy, report: Report, cleared: dt.datetime | None) -> list[Finding]:
    """One ``RepeatedAppXID`` finding per (GPU or instance, code) whose XIDs repeat (module docstring).

    ``cleared``: XIDs at or before it were acknowledged by a release and do not count. An XID whose
    action the policy overrides is no longer an application XID here."""
    # Keyed by GPU (its index, or its UUID when the agent could not tell the index), instance, code.
    times: dict[tuple[int | str | None, Instance | None, int], list[dt.datetime]] = defaultdict(list)
    where: dict[tuple[int | str | None, Instance | None, int], _Where] = {}
    for ev in report.xids:
        if cleared is not None and ev.time <= cleared:
            continue
        if not catalog.is_application_error(ev.xid) or ev.xid in policy.xid_overrides:
            continue
        device = report.device(ev.gpu)
        uuid = (device.uuid if device else "") or ev.uuid
        instance = _instance(report, _gpu_index(report, ev), ev) if instance_scoped(ev.xid) else None
        key = (ev.gpu if ev.gpu is not None else (uuid or None), instance, ev.xid)
        times[key].append(ev.time)
        where[key] = _Where(ev.gpu, uuid, instance)
    window = dt.timedelta(seconds=policy.app_repeat_window_s)
    out: list[Finding] = []
    for key, ts in times.items():
        hit = first_repeat(sorted(ts), window, policy.app_repeat_count)
        if hit is None:
            continue
        n, t = hit
        w, code = where[key], key[2]
        on = "one GPU" if w.instance is None else f"one MIG instance, {w.instance.words()}"
        detail = (
            f"application XID {code} repeated {n} times within {int(window.total_seconds())}s on {on}: "
            f"{catalog.describe(code)}"
        )
        action = policy.app_repeat_action
        out.append(Finding(Signal.APP_XID_REPEATED, action, detail, w.gpu, w.uuid, code, t, instance=w.instance))
    return out
