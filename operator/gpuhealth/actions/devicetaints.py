"""DeviceTaintRules for bad GPUs: the pure builder and the pure planner. No I/O.

One ``resource.k8s.io/v1`` DeviceTaintRule per GPU gpuhealth takes out of service. Its name is a
function of the device alone, so a create after a crash is a 409 (already done), never a duplicate.
It carries the label ``app.kubernetes.io/managed-by=gpuhealth``: the planner only ever deletes or
replaces rules with that label, so a rule someone else wrote (an SRE, NVIDIA's driver tooling) is
never touched, whatever device it selects. The taint is ``gpuhealth.dev/unhealthy=<reason>``,
effect ``NoSchedule`` (the scheduler allocates the device to no new claim; running pods stay, the
drain moves them with the checkpoint handshake), or ``None`` under DryRun, so Kubernetes itself
reports what the rule would affect while changing nothing.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuhealth.actions.slices import DeviceRef
from gpuhealth.api.names import (
    DEFAULT_DRA_DRIVER,
    DEVICE_GPU_LABEL,
    DEVICE_KIND_LABEL,
    DEVICE_NODE_LABEL,
    DEVICE_TAINT_KEY,
    DRA_GROUP,
    DRA_VERSION,
    GROUP,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
)

KIND = "DeviceTaintRule"
UUID_ANNOTATION = f"{GROUP}/uuid"
_NAME_MAX = 253
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def rule_name(ref: DeviceRef) -> str:
    """``gpuhealth-<pool>-<device>``; a hash of the whole triple is appended when the driver is not
    NVIDIA's or the name would be too long, so two devices never share a name."""
    base = f"gpuhealth-{ref.pool}-{ref.device}".lower()
    base = re.sub(r"[^a-z0-9.-]", "-", base)
    if ref.driver == DEFAULT_DRA_DRIVER and len(base) <= _NAME_MAX and base == f"gpuhealth-{ref.pool}-{ref.device}":
        return base
    digest = hashlib.sha256(str(ref).encode()).hexdigest()[:10]
    return f"{base[: _NAME_MAX - 11].rstrip('.-')}-{digest}"


def _label_value(v: str) -> str | None:
    return v if len(v) <= 63 and _LABEL_VALUE.fullmatch(v) else None


def taint_value(reason: str) -> str:
    """A taint value is a label value: reasons are (``EccUncorrected``, ``XID48``); anything else is cut."""
    v = re.sub(r"[^A-Za-z0-9_.-]", "-", reason)[:63].strip("-_.")
    return v or "Unhealthy"


class EmptySelector(ValueError):
    """A rule that would not name driver, pool and device: its selector would match more devices
    than one (an empty ``deviceSelector`` matches every device of the cluster)."""


def build_rule(
    ref: DeviceRef,
    reason: str,
    dry_run: bool = False,
    index: int | None = None,
    uuid: str = "",
    kind: str = "gpu",
) -> dict[str, Any]:
    """The DeviceTaintRule that takes ``ref`` out of allocation (effect ``None`` under DryRun).

    Raises :class:`EmptySelector` unless ``ref`` names a driver, a pool and a device."""
    if not (ref.driver and ref.pool and ref.device):
        raise EmptySelector(f"refusing a DeviceTaintRule that does not name driver, pool and device: {ref!r}")
    labels = {MANAGED_BY_LABEL: MANAGED_BY_VALUE, DEVICE_KIND_LABEL: kind}
    node = _label_value(ref.pool)
    if node:
        labels[DEVICE_NODE_LABEL] = node
    if index is not None:
        labels[DEVICE_GPU_LABEL] = str(index)
    meta: dict[str, Any] = {"name": rule_name(ref), "labels": labels}
    if uuid:
        meta["annotations"] = {UUID_ANNOTATION: uuid}
    return {
        "apiVersion": f"{DRA_GROUP}/{DRA_VERSION}",
        "kind": KIND,
        "metadata": meta,
        "spec": {
            "deviceSelector": {"driver": ref.driver, "pool": ref.pool, "device": ref.device},
            "taint": {
                "key": DEVICE_TAINT_KEY,
                "value": taint_value(reason),
                "effect": "None" if dry_run else "NoSchedule",
            },
        },
    }


def is_ours(rule: Mapping[str, Any]) -> bool:
    labels = (rule.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE)


def _essence(rule: Mapping[str, Any]) -> tuple[Any, ...]:
    spec = rule.get("spec") or {}
    sel = spec.get("deviceSelector") or {}
    taint = spec.get("taint") or {}
    return (
        sel.get("driver"),
        sel.get("pool"),
        sel.get("device"),
        taint.get("key"),
        taint.get("value"),
        taint.get("effect"),
    )


@dataclass(frozen=True)
class RulePlan:
    """Deletes first (name, uid precondition), then creates. A changed rule is deleted and recreated:
    gpuhealth never updates a rule in place (no update verb), and the uid precondition makes sure
    it deletes exactly the object it read."""

    delete: tuple[tuple[str, str], ...] = ()
    create: tuple[dict[str, Any], ...] = field(default=())

    @property
    def empty(self) -> bool:
        return not self.delete and not self.create


def plan_rules(desired: Iterable[Mapping[str, Any]], existing: Iterable[Mapping[str, Any]]) -> RulePlan:
    """What to write so that gpuhealth's rules are exactly ``desired``. Rules without gpuhealth's
    label are left alone whatever they select, even where one has the name gpuhealth wants
    (then the create answers 409 and the device stays as the other owner set it)."""
    want = {r["metadata"]["name"]: r for r in desired}
    for name, rule in want.items():
        sel = (rule.get("spec") or {}).get("deviceSelector") or {}
        if not all(sel.get(k) for k in ("driver", "pool", "device")) or set(sel) - {"driver", "pool", "device"}:
            raise EmptySelector(f"DeviceTaintRule {name} does not select exactly one device: {sel!r}")
    ours = {r["metadata"]["name"]: r for r in existing if is_ours(r)}
    delete: list[tuple[str, str]] = []
    create: list[dict[str, Any]] = []
    for name, rule in sorted(ours.items()):
        if name not in want or _essence(rule) != _essence(want[name]):
            delete.append((name, str((rule.get("metadata") or {}).get("uid") or "")))
    for name, rule in sorted(want.items()):
        if name not in ours or _essence(ours[name]) != _essence(rule):
            create.append(dict(rule))
    return RulePlan(tuple(delete), tuple(create))
